"""The default job's methods (`megatron_seed.methods` applied to its recipe) and sizes, the
fixed-skill analyze phase, the evaluation's draws and `seed compare`'s time table."""

from __future__ import annotations

import dataclasses

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
    quick = BasePolicySettings.for_run("quick", seed=4)
    assert (quick.env, quick.n_train_games, quick.families, quick.train_steps) == (
        "alfworld", 6, ("pick",), 200,
    )  # fmt: skip
    full = BasePolicySettings.for_run("full", seed=4)  # ALFWorld's: its 16 games, every family
    assert (full.n_train_games, full.families, full.train_steps) == (16, (), 450)
    assert BasePolicySettings.for_run("full", seed=4, env="search") == BasePolicySettings(
        seed=4, env="search"
    )
    assert BasePolicySettings.for_run("quick", seed=1, env="sokoban").env == "sokoban"
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
    from megatron_seed.data import Analysis, Status, TrajectoryRecord, Turn, write_jsonl

    def _episode(won, analysis):
        turn = Turn("Your task is to: put a mug in desk.", "look", [5], [-0.1])
        return TrajectoryRecord(task_id="t", group_id="u0/t", game="t", family="pick",
                                turns=[turn], won=won, reward=float(won), analysis=analysis,
                                status=Status.OK if won else Status.MAX_STEPS)  # fmt: skip

    def run(name, valid, degenerate=None, opd=None, outcomes=None):
        """One run's metrics.jsonl; ``outcomes``: per update, (won, valid) per analysed
        episode, written as the run's trajectories."""
        path = tmp_path / name / "metrics.jsonl"
        path.parent.mkdir()
        rows = [
            {"step": i + 1, "analyze/valid_rate": v}
            | ({} if degenerate is None else {"analyze/degenerate_rate": degenerate[i]})
            | ({} if opd is None else {"train/opd/token_frac": opd[i]})
            for i, v in enumerate(valid)
        ]
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        (path.parent / "trajectories").mkdir()
        for update, episodes in enumerate(outcomes or []):
            records = [_episode(w, Analysis("t", v)) for w, v in episodes]
            records.append(_episode(False, None))  # not analysed: not counted
            write_jsonl(records, path.parent / "trajectories" / f"update_{update:05d}.jsonl")
        return skill_rows(path)

    assert run("library", [1.0, 1.0]) == []  # a fixed library: no analyzer to erode
    outcomes_a = [
        [(True, True), (True, True), (False, False), (False, True)],
        [(True, False), (False, False), (False, False), (False, False)],
        [(True, True)],
    ]
    outcomes_b = [[(True, True), (False, False)], [(False, True)]]  # update 2: no win
    seeds = [
        run("a", [0.5, 0.25, 0.1], [0.0, 0.5, 0.0], [0.4, 0.2, 0.1], outcomes_a),
        run("b", [0.25, 0.75], [0.0, 0.0], [0.2, 0.6], outcomes_b),
    ]
    table = skill_table({"SEED": seeds, "GRPO": []})
    assert table.splitlines()[0] == "| method | skill metric | 1 | 2 |"  # the shortest run
    assert "| SEED | valid % | 38 | 50 |" in table
    assert "| SEED | degenerate % | 0 | 25 |" in table
    assert "| SEED | OPD token share % | 30 | 40 |" in table
    assert "| SEED | valid % (won) | 100 | 0 |" in table  # update 2: seed a's only
    assert "| SEED | valid % (lost) | 25 | 50 |" in table  # (1/2 + 0/1) / 2, (0/3 + 1/1) / 2
    assert "| SEED | lost share % | 50 | 88 |" in table  # (2/4 + 1/2) / 2, (3/4 + 1) / 2
    assert "GRPO" not in table
    no_traj = [run("c", [0.5], [0.0]), run("d", [0.5], [0.0])]
    assert "(won)" not in skill_table({"SEED": no_traj})  # no trajectories: rows left out
    assert "OPD token share" not in skill_table({"SEED": no_traj})  # not logged: left out


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


def test_the_evidence_size_is_quick_with_four_times_the_games_all_sampled():
    """`--size evidence` (docs/results.md, "Power"): QUICK's recipe, world and updates with
    24 training games evaluated 8 times each, 24 seen and 24 unseen games sampled 4 times
    each; its base policy clones all 24 training games (QUICK's clones its 6)."""
    from megatron_seed.compare.commands import TINY_WORLD_SIZES
    from megatron_seed.testbed.base_policy import BasePolicySettings
    from megatron_seed.testbed.profiles import ALFWORLD, PROFILES, SIZES, JobSize, profile

    evidence = ALFWORLD.size("evidence")
    assert evidence == JobSize(
        "evidence", "default-quick", n_train=24, n_eval=24, stage1_tasks=24,
        train_eval_episodes=8, families=("pick",), heldout_episodes=4,
    )  # fmt: skip
    assert QUICK.heldout_episodes == 0 and ALFWORLD.size("full").heldout_episodes == 0
    assert job_config(evidence, "seed", seed=1) == job_config(QUICK, "seed", seed=1)
    base = BasePolicySettings.for_run("evidence", seed=1)
    quick_base = BasePolicySettings.for_run("quick", seed=1)
    assert base.n_train_games == evidence.n_train and base.families == evidence.families
    assert quick_base.n_train_games == QUICK.n_train
    # the same passes over each game's demonstrations as QUICK's clone; nothing else differs
    assert base.train_steps == 4 * quick_base.train_steps
    assert base == dataclasses.replace(quick_base, n_train_games=24, train_steps=800)
    assert SIZES == TINY_WORLD_SIZES == ALFWORLD.sizes  # `--size`'s choices are the sizes
    assert all(PROFILES[e].sizes == ("full", "quick") for e in ("search", "sokoban", "webshop"))
    with pytest.raises(ValueError, match="Sokoban has no 'evidence' size; choose from full"):
        profile("sokoban").size("evidence")
    with pytest.raises(ValueError, match="no 'tiny' size"):
        BasePolicySettings.for_run("tiny", seed=0)


def test_the_job_passes_its_size_to_the_base_policy_and_the_evaluation(tmp_path, monkeypatch):
    """`run_default_job(size=...)`: the base policy of that size, the size's games, Stage-1
    tasks and sampled episodes per training and held-out game reach the method's job."""
    import megatron_seed.testbed.base_policy as base_policy
    from megatron_seed.testbed import default_job

    seen: dict = {}
    monkeypatch.setattr(default_job, "_games", lambda root, size, seed, env: seen.update(
        games=size) or {"train": ["t"], "seen": ["s"], "unseen": ["u"]})  # fmt: skip
    monkeypatch.setattr(base_policy, "build_base_policy", lambda root, **kw: seen.update(
        base=kw) or tmp_path / "model")  # fmt: skip
    monkeypatch.setattr(base_policy, "read_manifest", lambda root: {})
    monkeypatch.setattr(default_job, "run_method_job", lambda *a, **kw: seen.update(job=kw))
    default_job.run_default_job(tmp_path / "out", size="evidence", algo="grpo", seed=2)
    assert seen["games"].n_train == 24 and seen["base"]["size"] == "evidence"
    job = seen["job"]
    assert (job["stage1_tasks"], job["train_eval_episodes"], job["heldout_episodes"]) == (24, 8, 4)
    assert job["facts"]["size"] == "evidence"
    default_job.run_default_job(tmp_path / "out", size="quick", eval_episodes=3)
    assert seen["base"]["size"] == "quick" and seen["job"]["heldout_episodes"] == 0
    assert seen["job"]["train_eval_episodes"] == 3
    with pytest.raises(ValueError, match="WebShop has no 'evidence' size"):
        default_job.run_default_job(tmp_path / "w", size="evidence", env="webshop")


def test_held_out_games_are_sampled_like_training_games_when_the_size_says_so(
    tmp_path, monkeypatch
):
    """`evaluate_models`: with held-out episodes every split plays at the rollout
    temperature with the same evaluation seed (greedy seen/unseen otherwise), and the base's
    cached evaluation is keyed by them (a greedy evaluation is never reused for a sampled
    one)."""
    import megatron_seed.pipeline.evaluate as evaluate
    from megatron_seed.compare.job import EVAL_SEED, _games_key, evaluate_models, evaluation_draws

    t = job_config(QUICK).rollout.temperature
    assert evaluation_draws(t, 8) == {"train": (t, 8, EVAL_SEED)}
    assert evaluation_draws(t, 8, 4) == {
        "train": (t, 8, EVAL_SEED), "seen": (t, 4, EVAL_SEED), "unseen": (t, 4, EVAL_SEED),
    }  # fmt: skip
    with pytest.raises(ValueError, match="heldout_episodes >= 0"):
        evaluation_draws(t, 8, -1)
    calls = []

    def fake_evaluate(models, splits, cfg, sampled=None, fleet=None, skills=None):
        calls.append(sampled)
        return [{s: {"macro_avg": 0.5} for s in splits} for _ in models]

    monkeypatch.setattr(evaluate, "evaluate_policies", fake_evaluate)

    class Fleet:
        def get(self):
            return None

    games = {"train": ["a", "b"], "seen": ["c"], "unseen": ["d"]}
    models = {"Base (Vanilla)": (tmp_path, False)}
    for heldout, out in ((4, tmp_path / "sampled"), (0, tmp_path / "greedy")):
        out.mkdir()
        evaluate_models(out, models, games, 8, job_config(QUICK), Fleet(), None, tmp_path, heldout)
    assert calls == [evaluation_draws(t, 8, 4), evaluation_draws(t, 8)]
    assert _games_key(games, 8, 4) != _games_key(games, 8) == _games_key(games, 8, 0)
    assert len(list(tmp_path.glob("eval-*.json"))) == 2  # one cached base evaluation each
