"""The environment API: specs load and check their typed plug-ins at registration, each
built-in environment carries its own budgets, and one renderer picks every user message."""

from __future__ import annotations

from pathlib import Path

import pytest

from envs.api import Prompts, user_message
from envs.spec import EnvSpecError, get_env

SPEC_MODULE = """
from envs.api import EnvSpec, Prompts

class NoRun:  # a task command without run()
    def add_arguments(self, parser): ...

class Prompt:
    TASK_MARKER = None

    def prompt_style(self, name):
        return Prompts(None, lambda g, o, a: g, lambda s, o, a: o, lambda *a: "")

    def parse_action(self, text):
        return text, True

def _spec(**plugins):
    return EnvSpec("t", dict, lambda root, split: [], str, Prompt(), **plugins)

def good():
    return _spec(plan=lambda task: int(task) and ["look"])

def broken():
    return _spec(command=NoRun())
"""


def test_a_plug_in_is_checked_when_its_spec_loads(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "toy_spec.py").write_text(SPEC_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(EnvSpecError, match=r"'toy_spec:broken': command lacks \['run'\]"):
        get_env("toy_spec:broken")
    spec = get_env("toy_spec:good")
    assert spec.name == "toy_spec:good" and spec.rollout is None
    # a task without a plan (the plan raises ValueError) has none
    assert spec.expert_plan("1") == ["look"] and spec.expert_plan("x") is None
    with pytest.raises(EnvSpecError, match="unknown environment 'nope'"):
        get_env("nope")


def test_each_environment_carries_its_budgets() -> None:
    budgets = {n: get_env(n).rollout for n in ("alfworld", "search", "sokoban", "webshop")}
    assert {n: b.max_steps for n, b in budgets.items()} == {
        "alfworld": 30,  # the paper's Table 5
        "search": 4,  # Search-R1
        "sokoban": 15,  # verl-agent
        "webshop": 15,  # verl-agent
    }


def test_one_renderer_for_every_user_message() -> None:
    style = Prompts(
        None,
        lambda goal, obs, adm: f"first {goal} {obs}",
        lambda step, obs, adm: f"step {step} {obs}",
        lambda goal, hist, obs, step, adm: f"window {step} {hist} {obs}",
    )
    history = [("o0", "a0"), ("o1", "a1"), ("o2", "a2")]
    assert user_message(style, "g", [], "o0", None, "window", 2) == "first g o0"
    assert user_message(style, "g", history, "o3", None, "full", 2) == "step 3 o3"
    window = user_message(style, "g", history, "o3", None, "window", 2)
    assert window == "window 3 [('o1', 'a1'), ('o2', 'a2')] o3"  # the last 2 pairs
    assert user_message(style, "g", history, "o3", None, "window", 0) == "window 3 [] o3"


def test_a_spec_loads_from_a_file_and_a_broken_module_is_named(tmp_path, monkeypatch) -> None:
    (tmp_path / "toy_spec.py").write_text(SPEC_MODULE)
    spec = get_env(f"{tmp_path / 'toy_spec.py'}:good")  # a file, not on the import path
    assert spec.name == f"{tmp_path / 'toy_spec.py'}:good" and spec.expert_plan("1") == ["look"]
    # a module whose own code fails while it is imported: its file and line, in one line
    (tmp_path / "toy_syntax.py").write_text("x = 1\ndef broken(:\n")
    (tmp_path / "toy_raises.py").write_text("x = 1\nraise RuntimeError('not today')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(EnvSpecError, match=r"toy_syntax.py:2: SyntaxError"):
        get_env("toy_syntax:spec")
    with pytest.raises(EnvSpecError, match=r"toy_raises.py:2: RuntimeError: not today"):
        get_env("toy_raises:spec")
    with pytest.raises(EnvSpecError, match=r"toy_spec.py has no nothing"):
        get_env("toy_spec:nothing")
    with pytest.raises(EnvSpecError, match=r"no module named 'toy_absent'"):
        get_env("toy_absent:spec")
    # a module whose own import is missing is named with that import's line, not as absent
    (tmp_path / "toy_imports.py").write_text("import toy_absent_dependency\n")
    with pytest.raises(EnvSpecError, match=r"toy_imports.py:1: ModuleNotFoundError"):
        get_env("toy_imports:spec")
    # a file of NUL bytes (no line of its own to blame): the file itself is named
    (tmp_path / "toy_binary.py").write_bytes(b"PAR1\x00\x15\x04")
    with pytest.raises(EnvSpecError, match=rf"{tmp_path / 'toy_binary.py'}: SyntaxError"):
        get_env(f"{tmp_path / 'toy_binary.py'}:spec")


def test_a_relative_spec_file_means_the_same_file_from_any_folder(tmp_path, monkeypatch) -> None:
    from megatron_seed.config import SeedConfig

    monkeypatch.chdir(tmp_path)
    cfg = SeedConfig().with_changes({"env": {"name": "envs/toy.py:spec"}})
    assert cfg.env.name == f"{tmp_path / 'envs' / 'toy.py'}:spec"
    assert SeedConfig().with_changes({"env": {"name": "toy_spec:good"}}).env.name == "toy_spec:good"
