"""The GPU smoke script's code path on the CPU (`tools/gpu_smoke.py --cpu-tiny`)."""

from __future__ import annotations

import json
import math
from pathlib import Path

from tests.gpu.test_gpu_smoke import _run, smoke_module

PHASES = ["build", "parity", "packing", "train", "memory", "resume"]


def test_cpu_dry_run(tmp_path):
    """The whole script on a tiny model, in its plain, recipe, moe and moe-recipe modes:
    parity with transformers, a finite SEED update, an exact resume, the trainer's memory
    equal to the launcher's static model (experts included), the colocated hand-over
    (nothing to give back on the CPU), training on replayed routes under full recompute,
    every phase saved; FP8 recorded as skipped without TE; the script's own checks
    (`problems`, what the GPU test asserts) pass on what each mode has."""
    result = _run(tmp_path, "--cpu-tiny")
    assert result["done"] and set(result["modes"]) == {
        "plain",
        "recipe",
        "fp8",
        "moe",
        "moe-recipe",
    }
    assert "Transformer Engine" in result["modes"]["fp8"]["skipped"]
    assert result["problems"] == [] == smoke_module().problems(result)
    for name in ("plain", "recipe"):
        mode = result["modes"][name]
        assert mode["phases_done"] == PHASES, name
        assert mode["parity"]["max_abs_diff"] < 1e-4
        assert mode["packing"]["max_abs_diff"] < 1e-5  # packed rows score as the padded ones
        assert mode["finite"] and mode["train_tokens_per_s"] > 0
        assert mode["resume"]["abs_diff"] == 0.0
        # float32 on the CPU: 4 (weights) + 4 (grads) + 8 (Adam) + 4 (reference) bytes per
        # parameter, the model's 2 + 4 + 12 + 2 of mixed precision
        assert abs(mode["memory"]["held_over_model_static"] - 1.0) < 0.01
        assert mode["batch"]["seq"] >= 128  # about --seq tokens per sequence
    recipe = result["modes"]["recipe"]
    assert recipe["recompute"] == "full" and not recipe["distributed_optimizer"]  # GPU only
    assert recipe["handover"]["given_back_gib"] == 0.0  # release_memory is GPU-only
    assert math.isfinite(recipe["handover"]["loss_after"])
    # full recompute changes memory, not numbers: the two modes take the same first step
    assert recipe["losses"][0] == result["modes"]["plain"]["losses"][0]
    # the mixture of experts: the same checks, and every expert's weights, gradients and
    # Adam moments held (float32: 4 + 4 + 8 bytes per parameter, and the reference's 4)
    moe = result["modes"]["moe"]
    assert moe["phases_done"] == [*PHASES[:3], "routing_replay", *PHASES[3:]]
    replay = moe["routing_replay"]  # random routes followed on every scored token and layer
    assert replay["routes_replayed"] == 1.0 and replay["route_agreement"] < 0.2
    assert replay["finite"] and replay["moved_mean_abs"] > 1e-3
    assert moe["model"]["experts"] == 8 and moe["model"]["top_k"] == 2
    assert moe["parity"]["max_abs_diff"] < 1e-4 and moe["packing"]["max_abs_diff"] < 1e-5
    assert moe["finite"] and moe["resume"]["abs_diff"] == 0.0
    held = {k: v * 2**30 for k, v in moe["memory"]["held_gib"].items()}
    params = moe["model"]["params"]
    assert held == {"weights": 4 * params, "grads": 4 * params, "optimizer": 8 * params,
                    "reference": 4 * params}  # fmt: skip
    assert abs(moe["memory"]["held_over_model_static"] - 1.0) < 0.01  # the launcher's experts
    # the MoE slice with the recipe's settings: every token of theta_old's pass in each
    # training step routed as the batch's routes say, under full recompute; the host's
    # resident memory is recorded around the checkpoint save
    moe_recipe = result["modes"]["moe-recipe"]
    assert moe_recipe["recompute"] == "full" and moe_recipe["training_replay"] == [1.0, 1.0]
    assert moe_recipe["finite"] and moe_recipe["resume"]["abs_diff"] == 0.0
    assert moe_recipe["handover"]["given_back_gib"] == 0.0
    rss = moe_recipe["host_rss_gib"]
    assert 0.1 < rss["before_save"] <= rss["peak_during_save"] < 16


def test_problems_reads_only_what_a_mode_has():
    """The checks skip skipped modes and the GPU-only numbers a CPU run leaves None, and name
    a mode that stopped early or measured something wrong (the first GPU run's JSON had a
    skipped mode and an MoE mode without a memory estimate: the old test died on a KeyError)."""
    problems = smoke_module().problems
    good = {
        "phases_done": [*PHASES[:3], *PHASES[3:]], "finite": True, "losses": [1.0],
        "parity": {"mean_abs_diff": 0.01}, "packing": {"mean_abs_diff": 0.0}, "mfu": None,
        "memory": {"held_over_model_static": 1.0, "peak_over_model_total": None},
        "resume": {"abs_diff": 0.0, "loss_continued": 1.0},
    }  # fmt: skip
    moe = {
        **good, "phases_done": [*PHASES[:3], "routing_replay", *PHASES[3:]],
        "routing_replay": {"routes_replayed": 1.0, "finite": True, "moved_mean_abs": 0.1},
    }  # fmt: skip
    modes = {"plain": good, "recipe": {"skipped": "budget"}, "moe": moe}
    assert problems({"modes": modes}) == []
    cut = {**good, "phases_done": ["build", "parity"]}
    over = {**good, "memory": {"held_over_model_static": 1.0, "peak_over_model_total": 1.2}}
    free = {**moe, "training_replay": [1.0, 0.5]}
    found = problems({"modes": {"plain": cut, "fp8": over, "moe": free}})
    assert [line.split(":")[0] for line in found] == ["plain", "fp8", "moe"], found
    assert "1.200 x the launcher's estimate" in found[1]
    # the first H200 run's third JSON: a skipped recipe mode, an MoE mode from before the
    # routing-replay phase (and without a memory estimate): one line, no KeyError
    run3 = Path(__file__).resolve().parents[2] / "docs" / "runs" / "gpu-smoke-h200" / "run3.json"
    found = problems(json.loads(run3.read_text()))
    assert len(found) == 1 and found[0].startswith("moe: phases"), found
