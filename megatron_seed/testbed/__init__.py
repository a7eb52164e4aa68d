"""The CPU test bed: everything that lets the whole system run on one CPU machine.

A tiny world to train in, apart from the library (which never imports this package):

- ``tokenizer``, ``tiny``: tiny byte-level BPE tokenizers and random tiny Qwen checkpoints.
- ``tiny_world``: generated games + tokenizer + tiny model for end-to-end tests.
- ``synthetic``: synthetic trajectory records; ``scripted``: scripted engines (expert,
  random) that speak the engine interface.
- ``base_policy``: the tiny base policy, cloned from the environment's demonstrations.
- ``default_job`` (``seed run``), ``commands_compare`` (``seed compare``), ``report``.
- ``bench`` (``seed bench``), ``commands_smoke`` (``seed smoke``).
"""

ENV = "alfworld"  # the environment of the default job and its base policy
