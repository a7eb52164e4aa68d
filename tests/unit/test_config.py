"""The config: every numeric field range-checked at the door, every field read by some code,
unknown keys rejected, recipes that differ from the defaults only where they say so."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import re
import typing
from pathlib import Path

import pytest

from megatron_seed import cli, recipes
from megatron_seed.config import SECTIONS, ConfigError, SeedConfig

REPO = Path(__file__).resolve().parents[2]


def _fields() -> list[tuple[str, dataclasses.Field, type]]:
    """(dotted name, field, type) of every leaf field of `SeedConfig`."""
    out = []
    for cls, prefix in [(SeedConfig, "")] + [(c, f"{n}.") for n, c in SECTIONS.items()]:
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if f.name not in SECTIONS or cls is not SeedConfig:
                out.append((prefix + f.name, f, hints[f.name]))
    return out


NUMERIC = [(name, f) for name, f, hint in _fields() if hint in (int, float)]


def _out_of_range(f: dataclasses.Field) -> int | float:
    lo, hi, open_lo = f.metadata["range"]
    if hi != math.inf:
        return hi + 1
    return lo if open_lo else lo - 1


def _as_changes(name: str, value: object) -> dict:
    head, _, leaf = name.rpartition(".")
    return {head: {leaf: value}} if head else {leaf: value}


def test_every_numeric_field_has_a_range() -> None:
    assert len(NUMERIC) > 40
    for name, f in NUMERIC:
        lo, hi, _ = f.metadata.get("range", (-math.inf, math.inf, False))
        assert (lo, hi) != (-math.inf, math.inf), f"{name} has no range"


@pytest.mark.parametrize(("name", "field"), NUMERIC, ids=[n for n, _ in NUMERIC])
def test_out_of_range_value_is_a_one_line_error_before_any_compute(
    name: str, field: dataclasses.Field, capsys, monkeypatch
) -> None:
    import megatron_seed.models.parallel as parallel

    def no_compute(*args, **kwargs):
        raise AssertionError("a trainer process was started")

    monkeypatch.setattr(parallel, "spawn", no_compute)
    value = _out_of_range(field)
    changes = json.dumps(_as_changes(name, value))
    argv = ["train", "--model", "m", "--games", "g", "--config-json", changes]
    assert cli.main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1, err
    assert f"{name} must be" in err and repr(value) in err
    # the config itself refuses it too (as `from_dict`, `replace` and `load` do)
    with pytest.raises(ConfigError, match=re.escape(f"{name} must be")):
        SeedConfig().with_changes(_as_changes(name, value))


def test_in_range_edges_are_accepted_and_replace_rechecks() -> None:
    cfg = SeedConfig().with_changes({"algo": {"clip_eps": 1.0}, "rollout": {"temperature": 0}})
    assert cfg.algo.clip_eps == 1.0 and cfg.rollout.temperature == 0
    with pytest.raises(ConfigError, match=r"optim.lr must be > 0, got 0"):
        dataclasses.replace(cfg.optim, lr=0)
    with pytest.raises(ConfigError, match=r"fleet.transport must be one of"):
        SeedConfig().with_changes({"fleet": {"transport": "carrier-pigeon"}})
    with pytest.raises(ConfigError, match=r"rollout.group_size must be an int, got 2.5"):
        SeedConfig().with_changes({"rollout": {"group_size": 2.5}})
    with pytest.raises(ConfigError, match=r"unknown keys in 'algo': \['beta'\]"):
        SeedConfig.from_dict({"algo": {"beta": 1}})


def test_save_and_load_round_trip(tmp_path: Path) -> None:
    cfg = recipes.get("default-quick").config
    cfg.save(tmp_path / "c.json")
    assert SeedConfig.load(tmp_path / "c.json") == cfg
    (tmp_path / "bad.json").write_text('{"updates": ')
    with pytest.raises(ConfigError, match="cannot read config"):
        SeedConfig.load(tmp_path / "bad.json")


def _library_source() -> str:
    texts = []
    for package in ("megatron_seed", "envs", "launch"):
        for path in (REPO / package).rglob("*.py"):
            if path.name != "config.py":
                texts.append(path.read_text())
    return "\n".join(texts)


def test_every_config_field_is_read_by_some_code() -> None:
    source = _library_source()
    unread = [
        name for name, _, _ in _fields() if not re.search(rf"\.{name.rpartition('.')[2]}\b", source)
    ]
    assert unread == []
    # the check itself sees a field nobody reads
    assert not re.search(r"\.no_such_field_anywhere\b", source)


def test_recipes_resolve_for_train_and_run() -> None:
    assert {"tiny", "default", "default-quick", "qwen2.5-7b"} <= set(recipes.RECIPES)
    quick, full = recipes.get("default-quick").config, recipes.get("default").config
    assert (quick.updates, quick.rollout.tasks_per_update) == (12, 2)
    assert (full.updates, full.rollout.tasks_per_update) == (48, 4)
    # the two sizes differ only in their budget
    budget = {"updates": 0, "collect_rollouts_per_task": 1, "rollout": {"tasks_per_update": 1}}
    assert quick.with_changes(budget) == full.with_changes(budget)
    from megatron_seed.testbed.default_job import QUICK, job_config

    assert job_config(QUICK, "grpo", seed=3) == quick.with_changes(
        {"algo": {"use_opd": False}, "seed": 3}
    )


def _train_config(*argv: str) -> SeedConfig:
    """The config `seed train ARGV` would run with (nothing is started)."""
    from megatron_seed.pipeline import commands_train

    parser = argparse.ArgumentParser()
    commands_train.add_arguments(parser)
    return commands_train.build_config(parser.parse_args(list(argv)))


def test_each_environment_brings_its_budgets_under_the_recipe_and_the_user() -> None:
    search = _train_config("--env", "search")
    assert (search.env.name, search.rollout.max_steps, search.rollout.max_response_tokens) == (
        "search",
        4,
        500,
    )
    alfworld = _train_config()  # the default environment
    assert (alfworld.env.name, alfworld.rollout.max_steps) == ("alfworld", 30)
    # an environment named in --config-json brings its budgets too
    assert _train_config("--config-json", '{"env": {"name": "sokoban"}}').rollout.max_steps == 15
    # a recipe's budget stays (tiny: 4 steps on any environment); the user's wins over both
    assert _train_config("--recipe", "tiny", "--env", "alfworld").rollout.max_steps == 4
    user = '{"rollout": {"max_steps": 30, "history_window": 1}}'
    explicit = _train_config("--env", "search", "--config-json", user).rollout
    assert (explicit.max_steps, explicit.history_window, explicit.max_response_tokens) == (
        30,
        1,
        500,
    )
    from megatron_seed.pipeline.commands_eval import eval_config

    args = argparse.Namespace(recipe=None, config_json=None, max_steps=None)
    assert eval_config(args, "search").rollout.max_steps == 4  # `seed eval` plays the same


def test_one_step_off_refuses_colocated_engines():
    from megatron_seed.config import ConfigError, SeedConfig

    changes = {"rollout": {"one_step_off": True}, "fleet": {"colocate": True, "transport": "ipc"}}
    with pytest.raises(ConfigError, match="one_step_off"):
        SeedConfig().with_changes(changes)
    assert SeedConfig().with_changes({"rollout": {"one_step_off": True}}).rollout.one_step_off


def test_routing_replay_refuses_one_step_off_and_models_without_experts(tmp_path: Path):
    from megatron_seed.config import ConfigError, SeedConfig
    from megatron_seed.pipeline.job import Stage2Job, check_job

    with pytest.raises(ConfigError, match="routing_replay reads the routes back"):
        SeedConfig().with_changes(
            {"algo": {"routing_replay": True}, "rollout": {"one_step_off": True}}
        )
    dense = tmp_path / "dense"
    dense.mkdir()
    (dense / "config.json").write_text(json.dumps({
        "model_type": "qwen2", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 64,
        "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 2,
    }))  # fmt: skip
    cfg = SeedConfig().with_changes({"algo": {"routing_replay": True}})
    with pytest.raises(ValueError, match="routing_replay is for mixture-of-experts models"):
        check_job(Stage2Job(str(dense), ["g1"], "o", cfg))
    check_job(Stage2Job(str(dense), ["g1"], "o", SeedConfig()))
