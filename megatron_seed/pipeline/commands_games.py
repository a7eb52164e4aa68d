"""``seed games [--env NAME] ...``: write an environment's tasks offline.

The environment's own task command (``EnvSpec.command``) defines the remaining flags; for
the default environment see ``envs.alfworld.commands``. ``--out`` is checked before it runs,
and the ValueError it raises for bad input is a one-line error (exit code 2).
"""

from __future__ import annotations

import argparse

from envs.api import TaskCommand
from envs.spec import DEFAULT_ENV, ENV_HELP, EnvSpecError, get_env
from megatron_seed.errors import CommandError, output_dir


def _env_name(argv: list[str]) -> str:
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--env", default=DEFAULT_ENV, help=ENV_HELP)
    return pre.parse_known_args(argv)[0].env


def _command(name: str) -> TaskCommand:
    try:
        spec = get_env(name)
    except EnvSpecError as err:
        raise CommandError(str(err)) from None
    if spec.command is None:
        raise CommandError(f"environment {name!r} has no task generator")
    return spec.command


def add_arguments(parser: argparse.ArgumentParser, argv: list[str]) -> None:
    """``--env`` plus the chosen environment's own flags."""
    parser.add_argument("--env", default=DEFAULT_ENV, help=ENV_HELP)
    command = _command(_env_name(argv))  # CommandError: a one-line error, exit code 2
    command.add_arguments(parser)
    parser.set_defaults(_env_command=command)


def run(args: argparse.Namespace) -> int:
    """Delegate to the environment's generator."""
    output_dir(args.out)
    try:
        return args._env_command.run(args)
    except ValueError as err:
        raise CommandError(str(err)) from None
