"""Transformer Engine's grouped-GEMM expert names through the HF <-> Megatron conversion
(issue #54): with `moe_grouped_gemm` the experts of a rank are one GroupedLinear per
projection, `...mlp.experts.linear_fc1.weight{j}` for local expert j, where the local spec
has `...mlp.experts.local_experts.{j}.linear_fc1.weight`. No TE is needed: the TE names are
made from the local spec's (`convert_workers.te_name`), on a tiny Qwen3-MoE (8 experts,
2 layers) at EP 2 x TP 2 (expert TP = TP: each expert split over 2 ranks)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from megatron_seed.models.convert import HFCheckpoint
from megatron_seed.models.parallel import spawn
from megatron_seed.models.tiny import make_tiny_qwen
from tests.distributed.convert_workers import grouped_gemm_roundtrip, te_name

TP, EP = 2, 2
_GROUPED = re.compile(r"^decoder\.layers\.(\d+)\.mlp\.experts\.(linear_fc[12])\.weight(\d+)$")


@pytest.fixture(scope="module")
def moe_ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("grouped")
    return make_tiny_qwen(root / "hf", seed=3, model_type="qwen3_moe", num_hidden_layers=2)


def _expert_shard(
    ckpt: HFCheckpoint, layer: int, expert: int, linear: str, part: int
) -> torch.Tensor:
    """Expert `expert`'s weight of `linear` as expert-TP rank `part` of `TP` holds it, by
    hand: fc1 `[2f/TP, h]` is that rank's rows of gate then of up, fc2 `[h, f/TP]` its
    columns of down."""
    hf = f"model.layers.{layer}.mlp.experts.{expert}."
    if linear == "linear_fc2":
        return ckpt.get(hf + "down_proj.weight").chunk(TP, dim=1)[part]
    gate, up = (ckpt.get(hf + f"{p}_proj.weight").chunk(TP, dim=0)[part] for p in ("gate", "up"))
    return torch.cat([gate, up])


def test_grouped_gemm_names_convert_both_ways_at_ep2_expert_tp2(moe_ckpt: Path) -> None:
    """HF -> Megatron: on EP rank r, `linear_fc{1,2}.weight{j}` gets global expert
    r * E/EP + j, split over expert TP, the tensor the local spec's `local_experts.{j}` gets.
    Megatron -> HF: every rank's export from TE's names, as from the local spec's, is the
    checkpoint bit for bit."""
    ckpt = HFCheckpoint(moe_ckpt)
    per_rank = ckpt.spec.num_experts // EP  # 4
    first = ckpt.get("model.layers.0.mlp.experts.0.down_proj.weight")
    assert not torch.equal(
        first, ckpt.get(f"model.layers.0.mlp.experts.{per_rank}.down_proj.weight")
    )
    ranks = spawn(grouped_gemm_roundtrip, TP * EP, str(moe_ckpt), TP, EP)
    assert sorted((r["ep_rank"], r["etp_rank"], r["etp"]) for r in ranks) == [
        (0, 0, TP), (0, 1, TP), (1, 0, TP), (1, 1, TP)
    ]  # fmt: skip
    hf_names = set(ckpt.names())
    for r in ranks:
        grouped, where = r["grouped"], (r["ep_rank"], r["etp_rank"])
        assert grouped.keys() == {te_name(n) for n in r["local"]}, where
        experts = [(n, _GROUPED.match(n)) for n in grouped if _GROUPED.match(n)]
        assert len(experts) == ckpt.spec.num_layers * 2 * per_rank, where
        for name, m in experts:
            layer, linear, j = int(m.group(1)), m.group(2), int(m.group(3))
            want = _expert_shard(ckpt, layer, r["ep_rank"] * per_rank + j, linear, r["etp_rank"])
            assert torch.equal(grouped[name], want), (where, name)
        for name, tensor in r["local"].items():
            assert torch.equal(grouped[te_name(name)], tensor), (where, name)
        for path, exported in r["exported"].items():
            assert exported.keys() == hf_names, (where, path)
            wrong = [n for n in sorted(hf_names) if not torch.equal(exported[n], ckpt.get(n))]
            assert wrong == [], (where, path)
