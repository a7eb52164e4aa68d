"""Environments for SEED, each one package behind one protocol.

- ``envs.base``: one episode at a time (``reset``/``step``), ``StepResult``, ``BatchedEnv``.
- ``envs.spec``: ``EnvSpec`` (everything the library needs from an environment) and the
  registry (``get_env(name)``; ``module:ATTR`` plugs in a new one).
- ``envs.workers``: Ray env workers (prefetched resets, failure recovery).
- ``envs.alfworld``: ALFWorld on the real engine, with its game generator, prompts,
  experts and oracle analyzer.
- ``envs.commands``: ``seed games --env NAME``.
"""
