"""Every `seed` command's flags say what they do, with their default, and the README's
command table names only flags that exist."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from megatron_seed.cli import COMMANDS, command_parser

README = Path(__file__).resolve().parents[2] / "README.md"


def _actions(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions if not isinstance(a, argparse._HelpAction)]


@pytest.mark.parametrize("name", list(COMMANDS))
def test_every_flag_has_help_and_its_default(name: str) -> None:
    _, parser = command_parser(name, [])
    actions = _actions(parser)
    assert actions
    assert [a.dest for a in actions if not (a.help or "").strip()] == []
    assert "(default: " in parser.format_help()
    formatter = parser._get_formatter()
    for action in actions:  # a flag with a default shows it (or its help names it)
        if action.option_strings and action.default not in (None, False, [], argparse.SUPPRESS):
            assert "default" in formatter._get_help_string(action), (name, action.dest)


def test_the_readmes_command_table_names_real_flags() -> None:
    rows = [ln for ln in README.read_text().splitlines() if ln.startswith("| `seed ")]
    assert len(rows) >= len(COMMANDS)
    for row in rows:
        usage = row.split("`")[1]
        name = usage.split()[1]
        _, parser = command_parser(name, [])
        known = {s for a in parser._actions for s in a.option_strings}
        named = set(re.findall(r"(?<![\w-])--[a-z][a-z-]*", usage))
        assert named <= known, (name, sorted(named - known))


def test_the_checker_sees_a_flag_without_help() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quiet-one", type=int, default=3)
    assert [a.dest for a in _actions(parser) if not (a.help or "").strip()] == ["quiet_one"]
