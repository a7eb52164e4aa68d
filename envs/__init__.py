"""Environments for SEED, each one package behind one API; none imports the library.

- ``envs.api``: what environments and the library share (imports nothing of the project):
  ``Env``, ``StepResult``, ``BatchedEnv``, prompt styles and the one user-message renderer,
  ``EnvSpec`` with its typed plug-ins and rollout budgets, the readers oracles use.
- ``envs.spec``: the registry (``get_env(name)``; ``module:ATTR`` plugs in a new one) and
  ``DEFAULT_ENV``.
- ``envs.workers``: Ray env workers (prefetched resets, failure recovery).
- ``envs.demos``: the demonstration-player API the CPU test bed clones a base policy from.
- ``envs.alfworld``, ``envs.search``, ``envs.sokoban``: the environments.
"""
