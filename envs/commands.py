"""``seed games [--env NAME] ...``: write an environment's tasks offline.

The environment's own subcommand (``EnvSpec.commands``) defines the remaining flags; for
``alfworld`` (the default) see ``envs.alfworld.commands``.
"""

from __future__ import annotations

import argparse
import importlib


def _env_name(argv: list[str]) -> str:
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--env", default="alfworld")
    return pre.parse_known_args(argv)[0].env


def _commands(name: str):
    from envs.spec import EnvSpecError, get_env
    from megatron_seed.errors import CommandError

    try:
        spec = get_env(name)
    except EnvSpecError as err:
        raise CommandError(str(err)) from None
    if spec.commands is None:
        raise CommandError(f"environment {name!r} has no task generator")
    return importlib.import_module(spec.commands)


def add_arguments(parser: argparse.ArgumentParser, argv: list[str]) -> None:
    """``--env`` plus the chosen environment's own flags."""
    parser.add_argument("--env", default="alfworld", help="environment (envs.spec names)")
    module = _commands(_env_name(argv))  # CommandError: a one-line error, exit code 2
    module.add_arguments(parser)
    parser.set_defaults(_env_module=module)


def run(args: argparse.Namespace) -> int:
    """Delegate to the environment's generator."""
    return args._env_module.run(args)
