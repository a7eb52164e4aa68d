"""The default job's methods (`megatron_seed.methods` applied to its recipe), the fixed-skill
analyze phase, and `seed compare`'s time table."""

from __future__ import annotations

import pytest

from megatron_seed.benchmarks.synthetic import annotated_record as _record
from megatron_seed.compare.report import time_table
from megatron_seed.pipeline.roles import library_skills
from megatron_seed.testbed.default_job import QUICK, job_config, method_of


def test_methods_decide_stage1_and_opd():
    assert job_config(QUICK, "no-opd").algo.use_opd is False
    assert job_config(QUICK, "no-sft").algo.use_opd is True
    assert job_config(QUICK, "static-skills").skill.teacher_source == "stage1_library"
    # SEED's job config is the recipe's, exactly (the methods change nothing of it)
    from megatron_seed import recipes

    seed_cfg = job_config(QUICK, "seed")
    assert seed_cfg.algo == recipes.get("default-quick").config.algo
    assert seed_cfg.skill == recipes.get("default-quick").config.skill
    with pytest.raises(ValueError, match="unknown algorithm 'ppo'"):
        method_of("ppo")


def test_library_skills_replace_the_analyzer():
    records = [_record("g1", True, None, False), _record("g9", False, "stale", True)]
    metrics = library_skills(
        records, {"g1": "Workflow: take the mug to the table first."}, "expert_plan"
    )
    assert records[0].skill.startswith("Workflow") and records[0].has_teacher
    assert records[1].skill is None and not records[1].has_teacher  # no entry: no teacher
    assert records[0].analysis.source == records[1].analysis.source == "expert_plan"
    assert metrics == {"analyze/n": 2.0, "analyze/valid_rate": 0.5}


def test_time_table_divides_by_grpo_whatever_the_order():
    run = {"sync": 0.0, "rollout": 5.0, "analyze": 0.0, "train": 3.0, "update": 8.0}
    seconds = {
        "SEED": [{**run, "analyze": 2.0, "update": 10.0}],
        "GRPO": [run],
        "w/o Self-Evolving OPD": [{**run, "update": 6.0}],
    }
    table = time_table(seconds)
    assert "SEED update time / GRPO update time: **1.25x**" in table
    assert "w/o Self-Evolving OPD update time / GRPO update time: **0.75x**" in table


def test_each_environment_brings_its_sizes_and_limits():
    """`seed run --env NAME`: the environment's profile decides the config's env and its
    rollout limits; ALFWorld's job and base policy are exactly the ones measured before."""
    from megatron_seed.testbed.base_policy import BasePolicySettings
    from megatron_seed.testbed.profiles import PROFILES, profile

    alf = job_config(QUICK, "seed", seed=2)
    assert alf.env.name == "alfworld" and alf.rollout.max_steps == 15
    assert alf.rollout.max_response_tokens == 24
    search = job_config(profile("search").quick, "grpo", seed=2, env="search")
    assert search.env.name == "search" and search.rollout.max_steps == 4
    assert search.rollout.max_response_tokens == 32 and not search.algo.use_opd
    assert search.rollout.history_window == 4  # the environment's own (verl-agent's)
    assert search.with_changes({"env": {"name": "alfworld"}, "rollout": {
        "max_steps": 15, "max_response_tokens": 24, "history_window": 2}}
    ) == job_config(QUICK, "grpo", seed=2)  # fmt: skip
    assert job_config(profile("sokoban").quick, env="sokoban").rollout.max_steps == 15
    quick = BasePolicySettings.for_run(quick=True, seed=4)
    assert (quick.env, quick.n_train_games, quick.families, quick.train_steps) == (
        "alfworld", 6, ("pick",), 200,
    )  # fmt: skip
    assert BasePolicySettings.for_run(quick=False, seed=4) == BasePolicySettings(seed=4)
    assert BasePolicySettings.for_run(quick=True, seed=1, env="sokoban").env == "sokoban"
    assert profile("alfworld").generate_options(("pick",)) == {
        "room": (4, 1), "handcoded": False, "workers": 2, "families": ["pick"],
    }  # fmt: skip
    assert set(PROFILES) == {"alfworld", "search", "sokoban", "webshop"}
    assert job_config(profile("webshop").quick, env="webshop").rollout.max_steps == 15
    with pytest.raises(ValueError, match="no job for environment 'chess'"):
        profile("chess")


def test_skill_table_averages_each_update_over_seeds(tmp_path):
    import json

    from megatron_seed.compare.report import skill_rows, skill_table

    def run(name, valid, degenerate=None):
        path = tmp_path / f"{name}.jsonl"
        rows = [
            {"step": i + 1, "analyze/valid_rate": v}
            | ({} if degenerate is None else {"analyze/degenerate_rate": degenerate[i]})
            for i, v in enumerate(valid)
        ]
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        return skill_rows(path)

    assert run("library", [1.0, 1.0]) == []  # a fixed library: no analyzer to erode
    seeds = [run("a", [0.5, 0.25, 0.1], [0.0, 0.5, 0.0]), run("b", [0.25, 0.75], [0.0, 0.0])]
    table = skill_table({"SEED": seeds, "GRPO": []})
    assert table.splitlines()[0] == "| method | skill metric | 1 | 2 |"  # the shortest run
    assert "| SEED | valid % | 38 | 50 |" in table
    assert "| SEED | degenerate % | 0 | 25 |" in table
    assert "GRPO" not in table


def test_updates_override_reaches_the_config_and_rlsd_schedule():
    """`seed run --updates N`: Stage 2 runs N updates, and RLSD's lambda decays over 2/3 of
    them (not of the recipe's 12)."""
    assert job_config(QUICK, "seed").updates == 12
    assert job_config(QUICK, "seed", updates=3).updates == 3
    assert job_config(QUICK, "rlsd", updates=3).algo.rlsd_decay_updates == 2
    assert job_config(QUICK, "rlsd").algo.rlsd_decay_updates == 8


def test_the_job_announces_each_phase_out_of_its_total(capsys):
    from megatron_seed.compare.job import Phases, method_phases

    assert method_phases(method_of("seed")) == ["stage 1", "stage 2", "evaluation", "report"]
    assert method_phases(method_of("vanilla")) == ["evaluation", "report"]
    assert method_phases(method_of("skill-prompt"))[0] == "skill library"
    assert method_phases(method_of("skill-prompt"), user_library=True)[0] == "evaluation"
    phases = Phases(["games", *method_phases(method_of("grpo"))], started=0.0)
    phases.start("games")
    phases.start("evaluation")  # stage 2 resumed as done: skipped, the count still right
    lines = capsys.readouterr().out.splitlines()
    assert [ln.split(" (")[0] for ln in lines] == ["[phase 1/4] games", "[phase 3/4] evaluation"]
    with pytest.raises(ValueError):
        phases.start("games")  # phases run in order
