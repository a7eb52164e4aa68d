"""`python -m tests.distributed.moe_engine_worker REQUEST.json`: one in-process vLLM engine
serving a MoE checkpoint takes the syncs a request plans and prints, as one JSON line, the
log-probs after each (test_fleet_moe.py).

A sync reaches the engine as the fleet's do: "transfer" through vLLM's weight-transfer API
with the objstore backend (start, one update per bucket of `iter_buckets`, finish), "reload"
through `seed_reload_weights`. A step with the re-pack off replaces
`cpu_moe.repack_cpu_moe` for that step (the engine runs in this process).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine's worker in this process


def main(path: str) -> None:
    from safetensors.torch import load_file

    from megatron_seed.models.convert import hf_names
    from megatron_seed.models.qwen import QwenSpec
    from megatron_seed.rollout import cpu_moe
    from megatron_seed.rollout.engine import VLLMEngine
    from megatron_seed.rollout.transfer import ObjectStoreUpdateInfo
    from megatron_seed.rollout.weight_sync import flatten_bucket, iter_buckets

    request = json.loads(Path(path).read_text())
    engine = VLLMEngine(request["served"], max_model_len=512, kv_cache_bytes=64 << 20)
    engine.init_transfer({})
    names = hf_names(QwenSpec.from_pretrained(request["served"]))
    repack = cpu_moe.repack_cpu_moe
    counts: dict[str, int] = {}
    logprobs = {"fresh": engine.prompt_logprobs(request["ids"])}
    expert_buckets = []
    for label, folder, how, repack_on in request["plan"]:
        weights = load_file(os.path.join(folder, "model.safetensors"))
        stream = [(n, weights[n]) for n in names]  # the trainer's export order

        def counted(model, loaded, label=label, on=repack_on):
            counts[label] = repack(model, loaded) if on else 0
            return counts[label]

        cpu_moe.repack_cpu_moe = counted
        if how == "transfer":
            engine.start_weight_update()
            for bucket in iter_buckets(stream, request["bucket_bytes"]):
                if any(".mlp.experts." in n for n, _ in bucket):
                    expert_buckets.append([sum(".mlp.experts." in n for n, _ in bucket)])
                flat = flatten_bucket(bucket)
                info = ObjectStoreUpdateInfo(
                    names=flat.names, dtype_names=flat.dtypes, offsets=flat.offsets,
                    shapes=[list(s) for s in flat.shapes], data=flat,
                )  # fmt: skip
                engine.receive(info.__dict__)
            engine.finish_weight_update()
        else:
            engine.update_weights(stream)
        cpu_moe.repack_cpu_moe = repack
        logprobs[label] = engine.prompt_logprobs(request["ids"])
    # the experts the engine's routers pick for each token of each sequence (last weights)
    routes = [r.tolist() for r in engine.routes(request["ids"])]
    result = {
        "logprobs": logprobs, "repacked": counts, "expert_buckets": expert_buckets,
        "routes": routes,
    }  # fmt: skip
    print(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1])
