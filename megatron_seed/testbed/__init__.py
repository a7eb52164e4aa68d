"""The CPU test bed: everything that lets the whole system run on one CPU machine.

A tiny world to train in, apart from the library (which never imports this package; `seed
compare` and the Slurm rehearsal name it, by module path, as their default world). Its
tokenizers and checkpoints come from `megatron_seed.models.tiny` and `.tiny_tokenizer`.

- ``tiny_world``: generated games + tokenizer + tiny model for end-to-end tests.
- ``base_policy``: the tiny base policy, cloned from the environment's demonstrations.
- ``profiles``: how the default job sizes each environment.
- ``fake_engine``: an engine without a model that speaks the engine interface.
- ``default_job`` (``seed run``): one `megatron_seed.compare.job` on the tiny world; the only
  command that lives here (``seed compare`` uses it as its default world).
"""

ENV = "alfworld"  # the environment of the default job and its base policy
