"""The fleet's GPU weight transfers, end to end (run by test_fleet_gpu.py; needs CUDA vLLM).

    python -m tests.gpu.fleet_gpu_check ipc  OUT.json    # 1 GPU: 2 colocated engines
    python -m tests.gpu.fleet_gpu_check nccl OUT.json    # 2 GPUs: trainer on 0, engine on 1

"ipc": this process (the trainer) is started with CUDA_VISIBLE_DEVICES set to the GPU's UUID,
the engines see it as Ray's "0": the handles must be matched by UUID. Two engines share the
GPU (two consumers of every handle); the trainer's allocated memory after 10 syncs must
equal that after the first (every export freed). "nccl": one engine on the second GPU; it
is killed, the next sync rebuilds the group with the restarted engine.
Both check the engines' log-probs against the trainer's weights (transformers, bf16).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch


def _perturbed(ckpt, seed: int) -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [
        (n, (ckpt.get(n) + 0.02 * torch.randn(ckpt.shape(n), generator=g)).cuda().bfloat16())
        for n in ckpt.names()
    ]


def _reference(model_dir: str, weights, ids: list[int]) -> list[float]:
    from transformers import AutoModelForCausalLM

    from megatron_seed.models.logprobs import hf_token_logprobs

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.load_state_dict({n: t.float().cpu() for n, t in weights}, strict=False)
    return hf_token_logprobs(model, torch.tensor([ids]))[0, :-1].tolist()


def _ray_head_on(gpu: str, root: Path) -> tuple[subprocess.Popen, str]:
    """A Ray head whose only GPU is `gpu` (the engines'); this process keeps the others."""
    from megatron_seed.models.parallel import free_port

    port = free_port()
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": gpu}
    head = subprocess.Popen(
        ["ray", "start", "--head", "--block", f"--port={port}", "--num-gpus=1",
         f"--temp-dir={root / 'ray'}", "--disable-usage-stats"],
        env=env,
    )  # fmt: skip
    return head, f"127.0.0.1:{port}"


def main(transport: str, out: str) -> int:
    import ray

    from megatron_seed.models.convert import HFCheckpoint
    from megatron_seed.models.tiny import make_tiny_qwen
    from megatron_seed.rollout.engine import EngineSpec, SamplingSpec
    from megatron_seed.rollout.fleet import Fleet, FleetSpec
    from megatron_seed.rollout.transfer import export_meta

    root = Path(tempfile.mkdtemp())
    model_dir = str(make_tiny_qwen(root / "model", vocab_size=512))
    ckpt = HFCheckpoint(model_dir)
    ipc = transport == "ipc"
    engines, share = (2, 0.5) if ipc else (1, 1.0)
    head = None
    if ipc:  # engines and trainer on the one GPU
        ray.init(num_gpus=1, include_dashboard=False, log_to_driver=False)
    else:  # the trainer keeps GPU 0; the engine gets GPU 1
        head, address = _ray_head_on("1", root)
        ray.init(address=address, log_to_driver=False)
    engine = EngineSpec(
        gpu_memory_utilization=0.3 if ipc else 0.6, max_model_len=256, dtype="bfloat16"
    )
    spec = FleetSpec(
        engines=engines,
        engine=engine,
        gpus_per_engine=share,
        transport=transport,
        sync_timeout_s=60.0,
    )
    fleet = Fleet(model_dir, spec)
    ids = list(range(3, 67))
    result: dict = {"transport": transport, "engines": engines, "syncs": []}
    memory = []
    for k in range(10 if ipc else 3):
        weights = _perturbed(ckpt, k)
        meta = export_meta(ckpt.spec, torch.bfloat16)
        stats = fleet.update_weights(iter(weights), bucket_bytes=1 << 20, meta=meta)
        torch.cuda.synchronize()
        memory.append(torch.cuda.memory_allocated())
        if k in (0, 2):
            ref = _reference(model_dir, weights, ids)
            got = fleet.prompt_logprobs_per_engine([ids])
            gap = max(abs(a - b) for e in got for a, b in zip(e[0], ref, strict=True))
            result["syncs"].append({"sync": k, "max_gap": gap, "restarts": stats.restarts})
        if not ipc and k == 1:
            fleet.kill_engine(0)  # found dead and restarted; the next sync rebuilds the group
            fleet.generate([ids], SamplingSpec(max_tokens=2))
        del weights
    result["memory_first_last"] = [memory[0], memory[-1]]
    result["restarts"] = fleet.restarts
    fleet.close()
    ray.shutdown()
    if head is not None:
        head.terminate()
    Path(out).write_text(json.dumps(result, indent=2))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
