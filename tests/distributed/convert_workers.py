"""Worker for the grouped-GEMM conversion test (run under `models.parallel.spawn`)."""

from __future__ import annotations

import re
from typing import Any

import torch

# the local spec's expert weight -> TE's grouped GEMM (`TEGroupedMLP`): one GroupedLinear per
# projection, whose parameters are weight0 .. weight{local experts - 1}
_LOCAL_EXPERT = re.compile(r"^(.+\.mlp\.experts\.)local_experts\.(\d+)\.(linear_fc[12])\.weight$")


class StateDictOnly:
    """A model stand-in whose `state_dict()` is the given name -> tensor map, as
    `load_hf_weights` and `export_hf_weights` read a model (copies go into its tensors)."""

    def __init__(self, tensors: dict[str, torch.Tensor]) -> None:
        self.tensors = tensors

    def state_dict(self) -> dict[str, torch.Tensor]:
        return dict(self.tensors)


def te_name(name: str) -> str:
    """The name a TE layer spec with grouped GEMM gives the local spec's parameter `name`:
    `...experts.linear_fc1.weight{j}` for `...experts.local_experts.{j}.linear_fc1.weight`,
    the input norm fused into the QKV projection, the rest as they are."""
    match = _LOCAL_EXPERT.match(name)
    if match:
        prefix, j, linear = match.groups()
        return f"{prefix}{linear}.weight{j}"
    return re.sub(r"input_layernorm\.weight$", "self_attention.linear_qkv.layer_norm_weight", name)


def te_names(local: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`local`'s parameters under `te_name`, as fresh zero tensors of the same shapes, with
    the `_extra_state` of each TE grouped linear (which conversion must skip)."""
    out: dict[str, torch.Tensor] = {}
    for name, tensor in local.items():
        new = te_name(name)
        if _LOCAL_EXPERT.match(name):
            out[new.rsplit(".", 1)[0] + "._extra_state"] = torch.empty(0, dtype=torch.uint8)
        out[new] = torch.zeros_like(tensor)
    return out


def grouped_gemm_roundtrip(hf_dir: str, tp: int, ep: int) -> dict[str, Any]:
    """One rank at TP x EP (expert TP = TP): the HF checkpoint loaded into the local spec's
    model and into its TE grouped-GEMM names; what each name got, and each export to HF."""
    from megatron.core import parallel_state as ps

    from megatron_seed.models.convert import HFCheckpoint, export_hf_weights, load_hf_weights
    from megatron_seed.models.parallel import init_parallel
    from megatron_seed.models.qwen import build_gpt_model

    init_parallel(tp, 1, ep=ep)
    ckpt = HFCheckpoint(hf_dir)
    model = build_gpt_model(ckpt.spec, use_te=False, initialize=False)
    load_hf_weights(model, ckpt)
    local = {k: v for k, v in model.state_dict().items() if not k.endswith("_extra_state")}
    grouped = te_names(local)
    load_hf_weights(StateDictOnly(grouped), ckpt)  # HF -> Megatron through TE's names
    exported = {
        "local": dict(export_hf_weights(model, ckpt.spec)),
        "grouped": dict(export_hf_weights(StateDictOnly(grouped), ckpt.spec)),
    }
    return {
        "ep_rank": ps.get_expert_model_parallel_rank(),
        "etp_rank": ps.get_expert_tensor_parallel_rank(),
        "etp": ps.get_expert_tensor_parallel_world_size(),
        "local": {k: v.clone() for k, v in local.items()},
        "grouped": {k: v for k, v in grouped.items() if not k.endswith("_extra_state")},
        "exported": exported,
    }
