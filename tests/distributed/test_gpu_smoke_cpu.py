"""The GPU smoke script's code path on the CPU (`tools/gpu_smoke.py --cpu-tiny`)."""

from __future__ import annotations

from tests.gpu.test_gpu_smoke import _run


def test_cpu_dry_run(tmp_path):
    """The whole script on a tiny model: parity with transformers, a finite SEED update, an
    exact resume, and the trainer's memory equal to the launcher's static model."""
    result = _run(tmp_path, "--cpu-tiny")
    (mode,) = result["modes"].values()
    assert mode["parity"]["max_abs_diff"] < 1e-4
    assert mode["packing"]["max_abs_diff"] < 1e-5  # packed rows score as the padded ones
    assert mode["finite"] and mode["train_tokens_per_s"] > 0
    assert mode["resume"]["abs_diff"] == 0.0
    # float32 on the CPU: 4 (weights) + 4 (grads) + 8 (Adam) + 4 (reference) bytes per
    # parameter, the model's 2 + 4 + 12 + 2 of mixed precision
    assert abs(mode["memory"]["held_over_model_static"] - 1.0) < 0.01
    assert mode["batch"]["seq"] >= 128  # about --seq tokens per sequence
