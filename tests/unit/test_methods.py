"""Methods by name (`megatron_seed.methods`) and the fixed skill sources they read
(`megatron_seed.skills.library`): family libraries, the Stage-1 library, expert plans."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

import pytest

from megatron_seed.benchmarks.synthetic import annotated_record
from megatron_seed.config import AlgoConfig, SeedConfig, SkillConfig
from megatron_seed.data import write_jsonl
from megatron_seed.errors import CommandError
from megatron_seed.methods import METHODS, get_method
from megatron_seed.pipeline.stage2 import Stage2Job, check_job
from megatron_seed.skills.library import (
    LibraryError,
    SkillLibrary,
    expert_plan_skills,
    fixed_source,
    game_skills,
    load_library,
    per_game_library,
    plan_text,
)

TABLE_1 = [
    "vanilla", "skill-prompt", "grpo", "skill-grpo", "opsd", "grpo-opsd", "skill-sd", "rlsd",
    "sdar", "seed",
]  # fmt: skip
ABLATIONS = ["no-sft", "no-opd", "static-skills"]


def test_every_table_row_and_ablation_has_a_name():
    assert set(TABLE_1 + ABLATIONS + ["opsd-paper", "seed-replay", "grpo-shuffled"]) == set(METHODS)
    assert [m for m in METHODS if not METHODS[m].trains] == ["vanilla", "skill-prompt"]
    with pytest.raises(CommandError, match="unknown method 'ppo'; choose one of vanilla"):
        get_method("ppo")
    with pytest.raises(CommandError, match="trains nothing"):
        METHODS["vanilla"].config(SeedConfig())


def test_each_method_is_its_table_settings():
    base = SeedConfig()

    def settings(name):
        cfg = METHODS[name].config(base)
        changed = {
            f.name: getattr(cfg.algo, f.name)
            for f in dataclasses.fields(AlgoConfig)
            if getattr(cfg.algo, f.name) != getattr(base.algo, f.name)
        }
        return changed, cfg.skill.teacher_source, cfg.skill.rollout_skill

    snap = {"teacher_mode": "snapshot"}
    assert settings("seed") == ({}, "analyzer", False)  # SEED is the defaults, exactly
    assert METHODS["seed"].config(base) == base
    assert settings("grpo") == ({"use_opd": False}, "analyzer", False)
    assert settings("skill-grpo") == ({"use_opd": False}, "analyzer", True)
    assert settings("opsd") == ({**snap, "policy_weight": 0.0}, "library", False)
    assert settings("opsd-paper") == (
        {**snap, "policy_weight": 0.0, "distill": "reverse_kl_pg"},
        "expert_plan",
        False,
    )
    assert settings("grpo-opsd") == ({**snap, "beta_opd": 0.0}, "library", False)
    assert settings("skill-sd") == ({**snap, "distill": "iw_reverse_kl"}, "library", False)
    assert settings("rlsd") == (
        {**snap, "advantage_reweight": "rlsd", "lambda_opd": 0.0},
        "library",
        False,
    )
    assert settings("sdar") == (snap, "library", False)
    assert settings("seed-replay") == ({"replay_weight": 0.1}, "analyzer", False)
    assert settings("no-sft") == ({}, "analyzer", False)
    assert settings("no-opd") == ({"use_opd": False}, "analyzer", False)
    assert settings("static-skills") == ({}, "stage1_library", False)
    stage1 = {m for m, v in METHODS.items() if v.stage1}
    assert stage1 == {"seed", "seed-replay", "no-opd", "static-skills"}
    starred = {m: v.eval_skill_label for m, v in METHODS.items() if v.eval_skill_label}
    assert starred == {"skill-prompt": "Skill-Prompt*", "skill-grpo": "Skill-GRPO*"}
    assert {m for m, v in METHODS.items() if v.needs_library} == {
        "skill-prompt", "skill-grpo", "opsd", "grpo-opsd", "skill-sd", "rlsd", "sdar",
    }  # fmt: skip


def test_method_keeps_the_recipe_it_is_applied_to():
    from megatron_seed import recipes

    quick = recipes.get("default-quick").config
    cfg = METHODS["skill-sd"].config(quick)
    assert cfg.optim == quick.optim and cfg.rollout == quick.rollout
    assert cfg.algo.loss_agg == quick.algo.loss_agg == "seq_mean_token_mean"
    assert cfg.skill.max_tokens == quick.skill.max_tokens


def test_fixed_source_of_a_config():
    def cfg(use_opd=True, source="analyzer", rollout=False):
        return SeedConfig(
            algo=AlgoConfig(use_opd=use_opd),
            skill=SkillConfig(teacher_source=source, rollout_skill=rollout),
        )

    assert fixed_source(cfg()) is None
    assert fixed_source(cfg(source="expert_plan")) == "expert_plan"
    assert fixed_source(cfg(use_opd=False, source="library")) is None  # no teacher pass
    assert fixed_source(cfg(use_opd=False, rollout=True)) == "library"


def test_family_library_folder_round_trip_and_coverage(tmp_path):
    lib = SkillLibrary("Check the receptacles one by one.", {"pick": "Take it, then put it."})
    lib.save(tmp_path / "lib")
    assert sorted(p.name for p in (tmp_path / "lib").iterdir()) == ["general.md", "pick.md"]
    loaded = SkillLibrary.load(tmp_path / "lib")
    assert loaded == lib
    assert loaded.skill_for("pick") == "Check the receptacles one by one.\n\nTake it, then put it."
    assert loaded.skill_for("heat") == "Check the receptacles one by one."  # general only
    family = {"g1": "pick", "g2": "heat"}.get
    assert loaded.for_games(["g1", "g2"], family) == {
        "g1": loaded.skill_for("pick"),
        "g2": "Check the receptacles one by one.",
    }
    no_general = SkillLibrary("", {"pick": "Take it, then put it."})
    with pytest.raises(LibraryError, match=r"no text for the families \['heat'\]"):
        no_general.for_games(["g1", "g2"], family)
    assert no_general.for_games(["g1", "g2"], family, strict=False) == {
        "g1": "Take it, then put it."
    }
    (tmp_path / "empty").mkdir()
    with pytest.raises(LibraryError, match="holds no text"):
        SkillLibrary.load(tmp_path / "empty")
    with pytest.raises(LibraryError, match="not a folder"):
        SkillLibrary.load(tmp_path / "nope")


def test_library_from_annotations_takes_a_success_and_a_failure_per_family():
    records = [
        annotated_record("g1", False, "Avoid opening the same drawer twice in a row."),
        annotated_record("g2", True, "Workflow: go to the shelf, take the mug, move it."),
        annotated_record("g3", True, "Workflow: a second success is not taken at all."),
        annotated_record("g4", True, "broken", valid=False, family="heat"),
        annotated_record(
            "g5", False, "Avoid heating before you hold the object first.", family="heat"
        ),
    ]
    lib = SkillLibrary.from_annotations(records)
    assert lib.general == ""
    assert lib.families == {
        "pick": "Workflow: go to the shelf, take the mug, move it.\n\n"
        "Avoid opening the same drawer twice in a row.",
        "heat": "Avoid heating before you hold the object first.",
    }
    with pytest.raises(LibraryError, match="no valid skill"):
        SkillLibrary.from_annotations([records[3]])


def test_per_game_library_and_expert_plans():
    records = [
        annotated_record("g1", False, "Avoid going back to the same drawer twice."),
        annotated_record("g1", True, "Workflow: go to drawer 2, take the mug, then move it."),
        annotated_record("g2", True, "broken", valid=False),
    ]
    assert per_game_library(records) == {
        "g1": "Workflow: go to drawer 2, take the mug, then move it."
    }
    assert plan_text(["go to shelf 1", "take mug 1 from shelf 1"]) == (
        "An expert solves this task with these actions, in order:\n"
        "1. go to shelf 1\n2. take mug 1 from shelf 1"
    )
    plans = {"g1": ["look"], "g2": None}
    assert expert_plan_skills(["g1"], plans.get) == {"g1": plan_text(["look"])}
    with pytest.raises(LibraryError, match="no expert plan for task g2"):
        expert_plan_skills(["g1", "g2"], plans.get)


class _Env:
    """The two things `game_skills` asks of an environment."""

    @staticmethod
    def family(game: str) -> str:
        return "pick"

    @staticmethod
    def expert_plan(game: str) -> list[str]:
        return [f"solve {game}"]


def test_game_skills_resolves_each_source(tmp_path):
    games = ["g1", "g2"]
    SkillLibrary("", {"pick": "Take it, then put it down."}).save(tmp_path / "lib")
    write_jsonl(
        [annotated_record("g1", True, "Workflow: take the mug, then move it.")],
        tmp_path / "a.jsonl",
    )

    def cfg(method):
        return METHODS[method].config(SeedConfig())

    assert game_skills(cfg("seed"), _Env, games, None) is None
    assert game_skills(cfg("sdar"), _Env, games, tmp_path / "lib") == {
        "g1": "Take it, then put it down.",
        "g2": "Take it, then put it down.",
    }
    assert game_skills(cfg("skill-grpo"), _Env, games, tmp_path / "lib")["g2"]
    # a family library built from annotations (what `seed annotate` writes)
    assert game_skills(cfg("sdar"), _Env, games, tmp_path / "a.jsonl") == {
        "g1": "Workflow: take the mug, then move it.",
        "g2": "Workflow: take the mug, then move it.",
    }
    (tmp_path / "bad.jsonl").write_text('{"not": "a record"}\n')
    with pytest.raises(LibraryError, match="not Stage-1 annotations"):
        load_library(tmp_path / "bad.jsonl")
    assert game_skills(cfg("opsd-paper"), _Env, games, None)["g2"] == plan_text(["solve g2"])
    assert game_skills(cfg("static-skills"), _Env, games, tmp_path / "a.jsonl") == {
        "g1": "Workflow: take the mug, then move it."
    }
    with pytest.raises(LibraryError, match="needs --skill-library"):
        game_skills(cfg("rlsd"), _Env, games, None)
    with pytest.raises(LibraryError, match="reads a JSONL file"):
        game_skills(cfg("static-skills"), _Env, games, tmp_path / "lib")
    with pytest.raises(LibraryError, match="none of the games"):
        game_skills(cfg("static-skills"), _Env, ["g9"], tmp_path / "a.jsonl")


def test_stage2_job_checks_its_skills_and_replay_data():
    def job(method, library=None, replay=None):
        cfg = METHODS[method].config(SeedConfig())
        return Stage2Job("m", ["g1", "g2"], "o", cfg, skill_library=library, replay_data=replay)

    check_job(job("seed"))
    check_job(job("sdar", {"g1": "a", "g2": "b"}))
    with pytest.raises(ValueError, match="teacher_source='library' needs a skill library"):
        check_job(job("sdar"))
    with pytest.raises(ValueError, match=r"no skill for 1 games, e\.g\. g2"):
        check_job(job("skill-grpo", {"g1": "a"}))
    check_job(job("static-skills", {"g1": "a"}))  # a game whose Stage-1 skills all failed
    with pytest.raises(ValueError, match="needs Stage-1 annotations"):
        check_job(job("seed-replay"))
    check_job(job("seed-replay", replay="annotated.jsonl"))


def test_rlsd_decays_over_two_thirds_of_the_test_bed_run():
    from megatron_seed.testbed.default_job import QUICK, job_config

    cfg = job_config(QUICK, "rlsd")
    assert cfg.updates == 12 and cfg.algo.rlsd_decay_updates == 8
    assert job_config(QUICK, "seed").algo == job_config(QUICK, "no-sft").algo


def test_compare_help_lists_every_method():
    proc = subprocess.run(
        [sys.executable, "-m", "megatron_seed.cli", "compare", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "1000"},  # argparse wraps at hyphens otherwise
    )
    assert proc.returncode == 0, proc.stderr
    text = " ".join(proc.stdout.split())
    for name in METHODS:
        assert name in text, name
