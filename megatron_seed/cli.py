"""The `seed` command: SEED (self-evolving on-policy distillation) for LLM agents, from the
default job on this machine to multi-node Slurm runs.

Each subcommand lives in its own module, imported only when that subcommand runs (so
`seed games` never imports Megatron and `seed convert` never imports alfworld). A module
listed here provides `add_arguments(parser)` (or `add_arguments(parser, argv)` when its flags
depend on the command line, as `seed games --env NAME` does) and `run(args) -> int`.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import sys
from pathlib import Path
from typing import Any

from megatron_seed.errors import CommandError
from megatron_seed.startup import quiet_third_party

# name -> (module, one-line help); only the default job's module is in the test bed
DEFAULT_JOB = "run"
COMMANDS: dict[str, tuple[str, str]] = {
    "convert": ("megatron_seed.models.commands_convert", "convert HF <-> Megatron checkpoints"),
    "init-model": (
        "megatron_seed.models.commands_init",
        "write a random-weight checkpoint of a real Qwen shape (tokenizer, chat template)",
    ),
    "check-parity": (
        "megatron_seed.models.commands_parity",
        "compare per-token log-probs of a HF checkpoint: transformers vs megatron-seed",
    ),
    "run": (
        "megatron_seed.testbed.commands_run",
        "the default job: SEED end to end on this machine",
    ),
    "compare": ("megatron_seed.compare.commands", "methods side by side at matched budgets"),
    "smoke": (
        "megatron_seed.models.commands_smoke",
        "tiny real Megatron forward/backward/log-probs",
    ),
    "games": (
        "megatron_seed.pipeline.commands_games",
        "write an environment's tasks offline (--env NAME)",
    ),
    "eval": (
        "megatron_seed.pipeline.commands_eval",
        "play a policy (expert, random or a model) on an environment's tasks, no training",
    ),
    "sft": ("megatron_seed.pipeline.commands_sft", "Stage 1: hindsight-skill SFT"),
    "annotate": (
        "megatron_seed.skills.commands_annotate",
        "Stage 1: annotate trajectories with skills",
    ),
    "train": (
        "megatron_seed.pipeline.commands_train",
        "Stage 2: SEED with the fleet and the trainer",
    ),
    "bench": ("megatron_seed.benchmarks.commands", "benchmarks (results written to a file)"),
    "launch": ("launch.commands", "launch a recipe locally or on Slurm with NeMo-Run"),
}


class HelpFormatter(argparse.HelpFormatter):
    """argparse's help, with each flag's default where it has one and its help does not
    already say it."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if "default" in text or default in (None, False, argparse.SUPPRESS) or default == []:
            return text
        if not action.option_strings and action.nargs is None:
            return text  # a positional argument: required, no default
        return f"{text} (default: %(default)s)"


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser; subcommand modules are imported only to fill their parser."""
    description = " ".join(__doc__.split("\n\n")[0].split())
    parser = argparse.ArgumentParser(prog="seed", description=description)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (_module, help_text) in COMMANDS.items():
        sub.add_parser(name, help=help_text, add_help=False)
    return parser


class CommandParser(argparse.ArgumentParser):
    """A command's parser whose usage errors are one line (`CommandError`), not a usage
    block."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise CommandError(f"{message} (see {self.prog} --help)")


def command_parser(name: str, argv: list[str]) -> tuple[Any, argparse.ArgumentParser]:
    """The module of command ``name`` and its parser (``argv``: the command's arguments,
    for commands whose flags depend on them, as `seed games --env NAME`)."""
    module_name, help_text = COMMANDS[name]
    module = importlib.import_module(module_name)
    parser = CommandParser(
        prog=f"seed {name}", description=help_text, formatter_class=HelpFormatter
    )
    if "argv" in inspect.signature(module.add_arguments).parameters:
        module.add_arguments(parser, argv=argv)  # its flags depend on what is given
    else:
        module.add_arguments(parser)
    return module, parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `seed` console script."""
    argv = list(sys.argv[1:] if argv is None else argv)
    quiet_third_party()
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        parser = build_parser()
        if argv and argv[0] not in ("-h", "--help"):
            parser.error(f"unknown command {argv[0]!r}; choose from {', '.join(COMMANDS)}")
        parser.print_help()
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    try:
        module, parser = command_parser(name, rest)
        args = parser.parse_args(rest)
        return int(module.run(args) or 0)
    except CommandError as err:
        print(f"seed {name}: error: {err}", file=sys.stderr)
        return 2
    except OSError as err:  # unreadable input, an output path that cannot be written
        print(f"seed {name}: error: {err}", file=sys.stderr)
        return 2
    except Exception as err:  # an input no check caught first, or a defect
        first = (str(err).splitlines() or [""])[0]
        if input_error(err):
            print(f"seed {name}: error: {first}", file=sys.stderr)
            return 2
        log = crash_log(name, argv)
        print(
            f"seed {name}: error: {type(err).__name__}: {first} (traceback: {log})",
            file=sys.stderr,
        )
        return 1


# packages whose ValueError subclasses are input errors (`input_error`)
PROJECT_PACKAGES = ("envs", "megatron_seed", "launch")


def input_error(err: BaseException) -> bool:
    """Whether ``err`` is one of the project's own input errors: a `ValueError` subclass
    defined in its packages (`RetrieverError`, `GGUFError`, `LibraryError`, `ModelConfigError`,
    ...), raised with a one-line message that names the file and what is wrong in it."""
    defined_in = type(err).__module__.split(".")[0]
    return isinstance(err, ValueError) and defined_in in PROJECT_PACKAGES


def crash_log(name: str, argv: list[str]) -> Path:
    """Write the exception being handled, with its traceback, to a new file; its path. The
    folder is $SEED_ERROR_DIR, else the temporary folder's megatron-seed-errors/."""
    import os
    import tempfile
    import time
    import traceback

    given = os.environ.get("SEED_ERROR_DIR")
    folder = Path(given) if given else Path(tempfile.gettempdir()) / "megatron-seed-errors"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"seed-{name}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"
    path.write_text(f"seed {' '.join(argv)}\n\n{traceback.format_exc()}")
    return path


if __name__ == "__main__":
    sys.exit(main())
