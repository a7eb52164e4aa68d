"""Stage 2 on a tiny Qwen3-MoE (2 layers, 8 experts, top-2): `seed train` for 3 updates with
the vLLM fleet, the Megatron MoE trainer and ALFWorld env workers (the session's
`tiny_world` games and tokenizer). Every sync re-packs the engine's MoE layers (without it
the refit probe would be off by ~0.1-4 nats: test_fleet_moe.py), so the probe gap stays at
float32 size after each of the 3 syncs while the weights move (opsd-paper: the expert plan
as teacher, a gradient on every token even when no episode succeeds). With routing replay
on: after the rollouts the engine reports its routes of every student and teacher sequence,
and the trainer's theta_old, reference, teacher and training passes route every token as
the engine did (`moe/routes_replayed`: 1.0 of the scored tokens). ~70 s."""

from __future__ import annotations

import json
import subprocess

from megatron_seed.testbed.tiny_world import train_command

CONFIG = {
    "rollout": {"tasks_per_update": 2, "group_size": 2},
    "fleet": {"engines": 1},
    "algo": {"routing_replay": True},
}


def test_seed_train_updates_a_moe_model_and_its_engines_follow(tiny_world, tmp_path):
    from transformers import AutoTokenizer

    from megatron_seed.models.tiny import make_tiny_policy

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_world / "model"))
    model = make_tiny_policy(tmp_path / "moe", tokenizer, model_type="qwen3_moe")
    out = tmp_path / "out"
    cmd = train_command(tiny_world, out, CONFIG, "--updates", "3", "--method", "opsd-paper",
                        model=model)  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    for r in rows:
        assert r["train/grad_norm"] > 0  # the weights move, so each sync carries new ones
        assert r["sync/probe_gap_max"] <= 1e-5  # the refit guard after each sync
        assert r["train/mismatch/max"] <= 1e-5  # the engine sampled with the trainer's theta
        assert r["train/moe/routes_replayed"] == 1.0  # every scored token, every MoE layer
        # float32 on both sides: the routers' own choices agree but for near ties
        assert r["train/moe/route_agreement"] >= 0.95
        assert r["time/routes"] > 0
    assert rows[-1]["train/kl"] > 0
    assert (out / "final_hf" / "config.json").is_file()
    final = json.loads((out / "final_hf" / "config.json").read_text())
    assert final["model_type"] == "qwen3_moe" and final["num_local_experts"] == 8
