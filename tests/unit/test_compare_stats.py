"""The comparison's intervals (`compare.stats`) against hand-computed values, and the cells
and difference lines of `seed compare` built from them."""

from __future__ import annotations

import math

import pytest

from megatron_seed.compare.report import cell, compare_table, difference_lines
from megatron_seed.compare.stats import paired_difference, t95, t_interval, wilson


def test_t_quantiles_are_the_tables():
    assert t95(1) == 12.706 and t95(2) == 4.303 and t95(9) == 2.262
    assert t95(22) == t95(20) == 2.086  # between entries: the next smaller df (conservative)
    assert t95(500) == pytest.approx(1.96, abs=1e-3)
    with pytest.raises(ValueError):
        t95(0)


def test_t_interval_by_hand():
    mean, half = t_interval([0.2, 0.4, 0.6])  # s = 0.2, n = 3
    assert mean == pytest.approx(0.4)
    assert half == pytest.approx(4.303 * 0.2 / math.sqrt(3))  # 0.4969
    assert math.isnan(t_interval([0.5])[1])


def test_wilson_by_hand():
    # 8/10: p = 0.8, z^2 = 3.8415; centre = (0.8 + 0.19207) / 1.38415 = 0.71673;
    # half = 1.96 * sqrt(0.016 + 0.0096037) / 1.38415 = 0.22658
    low, high = wilson(8, 10)
    assert low == pytest.approx(0.4902, abs=1e-4) and high == pytest.approx(0.9433, abs=1e-4)
    low, high = wilson(0, 20)
    assert low == 0.0 and high == pytest.approx(0.1611, abs=1e-4)
    with pytest.raises(ValueError):
        wilson(3, 2)


def test_paired_difference_marks_noise():
    # diffs 0.1, 0.2, 0.3: mean 0.2, s 0.1, half 4.303 * 0.1 / sqrt(3) = 0.248 > 0.2
    mean, half, real = paired_difference([0.5, 0.6, 0.7], [0.4, 0.4, 0.4])
    assert mean == pytest.approx(0.2) and half == pytest.approx(0.24844, abs=1e-5)
    assert not real
    mean, half, real = paired_difference([0.5, 0.6, 0.7], [0.3, 0.4, 0.5])  # diffs all 0.2
    assert real and half == pytest.approx(0.0)
    assert not paired_difference([0.9], [0.1])[2]  # one seed: no interval
    with pytest.raises(ValueError):
        paired_difference([0.1, 0.2], [0.1])


def _result(rate: float, episodes: int) -> dict:
    split = {
        "per_family": {"pick": rate},
        "per_family_episodes": {"pick": episodes},
        "macro_avg": rate,
        "episodes": episodes,
    }
    return {"train": split}


def test_compare_cells_and_differences():
    assert cell([0.8], [10]) == "80.0 [49, 94] (10)"
    assert cell([0.2, 0.4, 0.6], [8, 8, 8]) == "40.0 ± 49.7 (24)"
    assert cell([0.0, 0.0, 0.0], [7, 7, 7]) == "0.0 [0, 15] (21)"  # Wilson of 0/21
    assert cell([0.5, 0.5], [8, 8]) == "50.0 [28, 72] (16)"
    assert cell([0.5], [0]) == "50.0"  # one seed without an episode count: no interval
    results = {
        "SEED": [_result(0.5, 8), _result(0.6, 8), _result(0.7, 8)],
        "GRPO": [_result(0.4, 8), _result(0.4, 8), _result(0.4, 8)],
    }
    table = compare_table(results, "train")
    assert "| SEED | 60.0 ± 24.8 (24) | –" in table and "| GRPO | 40.0 [24, 61] (24)" in table
    (line,) = difference_lines(results, "train")
    assert line == (
        "- SEED − GRPO: +20.0 ± 24.8 points ~ (not distinguishable from noise; TOST: not "
        "shown within ±10 (90 % [+3.1, +36.9]))"
    )


def test_merged_comparisons_pool_each_methods_seeds(tmp_path):
    """`seed compare --merge`: two one-seed comparisons become one two-seed table."""
    import json

    from megatron_seed.cli import main
    from megatron_seed.compare.report import merge_summaries

    def result(avg: float) -> dict:
        split = {"macro_avg": avg, "episodes": 48, "per_family": {"pick": avg}}
        split["per_family_episodes"] = {"pick": 48}
        return {s: split for s in ("seen", "unseen", "train")}

    for seed, (seed_avg, grpo_avg) in enumerate([(0.5, 0.25), (0.75, 0.5)]):
        folder = tmp_path / f"s{seed}"
        folder.mkdir()
        summary = {"results": {"SEED": [result(seed_avg)], "GRPO": [result(grpo_avg)]}}
        curves = {"SEED": [[0.25, seed_avg]], "GRPO": [[0.25, grpo_avg]]}  # success per update
        summary.update(seconds={}, skills={}, curves=curves, seeds=[seed])
        (folder / "compare.json").write_text(json.dumps(summary))
    merged = merge_summaries([tmp_path / "s0", tmp_path / "s1"])
    assert merged["seeds"] == [0, 1] and len(merged["results"]["SEED"]) == 2
    out = tmp_path / "merged"
    code = main(
        ["compare", "--merge", str(tmp_path / "s0"), str(tmp_path / "s1"), "--out", str(out)]
    )
    assert code == 0
    text = (out / "compare.md").read_text()
    assert "seeds [0, 1]" in text
    assert "| SEED | 62.5 ± 158.8 (96) |" in text  # sd 0.177 / sqrt(2) * t(1) 12.71
    assert "- SEED − GRPO: +25.0 ± 0.0 points" in text  # the same gain on both seeds
    # the learning curves: each method's per-update success over both seeds, drawn
    assert merged["curves"]["SEED"] == [[0.25, 0.5], [0.25, 0.75]]
    assert "![learning curves](curves.png)" in text and (out / "curves.png").stat().st_size
    assert json.loads((out / "compare.json").read_text())["curves"] == merged["curves"]
    with pytest.raises(FileNotFoundError):
        merge_summaries([tmp_path / "nothing"])


def test_compare_runs_a_named_model_recipe_and_environment(
    tmp_path, monkeypatch, tiny_tokenizer, capsys
):
    """`seed compare --model DIR --games DIR --recipe R --env E`: every (method, seed) job
    starts from that model on those tasks with the recipe's config and the method's changes,
    the seed's base evaluation and library shared; the table comes from their evaluations."""
    import megatron_seed.compare.commands as commands
    from envs.spec import get_env
    from megatron_seed.cli import main

    games = tmp_path / "games"
    for split in ("train", "seen", "unseen"):
        get_env("sokoban").generate_tasks(games, split, 2, 0)
    from megatron_seed.models.tiny import make_tiny_qwen
    from megatron_seed.models.tiny_tokenizer import save_tokenizer

    model = make_tiny_qwen(tmp_path / "model", vocab_size=512)
    save_tokenizer(tiny_tokenizer, model)
    calls = []

    def fake_job(out, base, tasks, cfg, algo, **kw):
        calls.append((out, base, tasks, cfg, algo, kw))
        rate = {"grpo": 0.5, "vanilla": 0.25}[algo]
        split = {"macro_avg": rate, "episodes": 2, "per_family": {"medium": rate}}
        split["per_family_episodes"] = {"medium": 2}
        evals = {"Base (Vanilla)": {s: split for s in ("seen", "unseen", "train")}}
        if algo == "grpo":
            evals["GRPO"] = evals["Base (Vanilla)"]
        return {"evaluations": evals, "facts": {}}

    monkeypatch.setattr(commands, "run_method_job", fake_job)
    out = tmp_path / "cmp"
    argv = ["compare", "--model", str(model), "--games", str(games), "--env", "sokoban"]
    argv += ["--recipe", "default-quick", "--methods", "grpo", "vanilla", "--seeds", "3"]
    assert main([*argv, "--updates", "2", "--out", str(out)]) == 0
    assert [c[4] for c in calls] == ["grpo", "vanilla"]
    (o, base, tasks, cfg, _, kw), vanilla = calls[0], calls[1]
    assert o == out / "grpo-seed3" and base == model and len(tasks["seen"]) == 2
    assert cfg.env.name == "sokoban" and cfg.seed == 3 and cfg.updates == 2
    assert not cfg.algo.use_opd and vanilla[3].algo.use_opd  # GRPO's change, not the base's
    assert kw["base_root"] == out / "base-seed3" and kw["stage1_tasks"] == 2
    assert (
        "# Base (Vanilla) vs GRPO on sokoban (recipe default-quick"
        in (out / "compare.md").read_text()
    )
    assert main(["compare", "--model", str(model), "--games", str(tmp_path / "none")]) == 2
    (tmp_path / "no-model").mkdir()
    (tmp_path / "no-model" / "config.json").write_text("{}")  # checked before any job
    argv[2] = str(tmp_path / "no-model")
    assert main([*argv, "--out", str(tmp_path / "cmp2")]) == 2
    assert "unsupported architecture" in capsys.readouterr().err


def test_compare_and_run_pick_the_tiny_worlds_size(tmp_path, monkeypatch):
    """`--size full|quick|evidence` (`--quick` = `--size quick`, full without either) reaches
    every job of `seed compare` and `seed run` (whose default folder names it); a size the
    environment lacks or two size flags are one-line errors before anything runs."""
    from megatron_seed.cli import main
    from megatron_seed.testbed import default_job

    sizes = []

    def fake_job(out, size="full", **kw):
        sizes.append((size, out.name))
        split = {"macro_avg": 0.5, "episodes": 8, "per_family": {"pick": 0.5}}
        split["per_family_episodes"] = {"pick": 8}
        evals = {"Base (Vanilla)": {s: split for s in ("seen", "unseen", "train")}}
        return {"evaluations": {**evals, "GRPO": evals["Base (Vanilla)"]}, "facts": {}}

    monkeypatch.setattr(default_job, "run_default_job", fake_job)
    monkeypatch.chdir(tmp_path)
    compare = ["compare", "--methods", "grpo", "--seeds", "0", "--out", "cmp"]
    assert main([*compare, "--size", "evidence"]) == 0
    assert "(evidence size, seeds [0])" in (tmp_path / "cmp" / "compare.md").read_text()
    assert main([*compare, "--quick"]) == main(compare) == 0
    assert main(["run", "--size", "evidence", "--algo", "grpo"]) == 0
    assert main(["run", "--quick"]) == main(["run"]) == 0
    assert sizes == [
        ("evidence", "grpo-seed0"), ("quick", "grpo-seed0"), ("full", "grpo-seed0"),
        ("evidence", "default-evidence"), ("quick", "default-quick"), ("full", "default"),
    ]  # fmt: skip
    assert main([*compare, "--quick", "--size", "full"]) == 2
    assert main([*compare, "--env", "sokoban", "--size", "evidence"]) == 2
    assert main(["run", "--env", "search", "--size", "evidence"]) == 2
    assert main(["compare", "--model", "m", "--games", "g", "--size", "quick"]) == 2
    assert len(sizes) == 6


def test_a_runs_success_curve_is_its_rollout_success_per_update(tmp_path):
    import json

    from megatron_seed.compare.report import plot_learning_curves, success_curve

    metrics = tmp_path / "metrics.jsonl"
    rows = [{"step": 1, "rollout/success": 0.125}, {"step": 2}, {"step": 3, "rollout/success": 1}]
    metrics.write_text("".join(json.dumps(r) + "\n" for r in rows))
    curve = success_curve(metrics)
    assert curve[0] == 0.125 and math.isnan(curve[1]) and curve[2] == 1.0
    assert plot_learning_curves({"GRPO": [[]]}, tmp_path / "none.png") is None  # nothing
    assert plot_learning_curves({"GRPO": [curve, [0.5, 0.5]]}, tmp_path / "c.png").is_file()


def test_tost_and_seeds_for_power_hand_computed():
    from megatron_seed.compare.stats import seeds_for_power, tost

    # mean 0.01, sd sqrt(0.0052 / 3) = 0.041633, t_{0.95, 3} = 2.353: half-width 0.048982
    mean, low, high, within = tost([0.02, -0.04, 0.06, 0.0], 0.10)
    assert (mean, low, high) == pytest.approx((0.01, -0.038982, 0.058982), abs=1e-6)
    assert within
    assert not tost([0.02, -0.04, 0.06, 0.0], 0.05)[3]  # 0.059 reaches past 0.05
    with pytest.raises(ValueError, match="at least two"):
        tost([0.1], 0.1)
    # d = 1: 10 seeds ((t_{.975,9} + t_{.80,9}) = 3.145 <= sqrt(10); n = 9: 3.195 > 3)
    assert seeds_for_power(10.0, 10.0) == 10
    # the realised paired sd 13.5 of docs/results.md: 17 (n = 16: 2.997 x 1.35 = 4.05 > 4)
    assert seeds_for_power(13.5, 10.0) == 17
    assert seeds_for_power(0.0, 10.0) == 2
