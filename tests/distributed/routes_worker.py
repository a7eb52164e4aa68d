"""`python -m tests.distributed.routes_worker REQUEST.json`: one in-process vLLM engine,
compiled (`enforce_eager=False`: torch.compile, as a GPU engine runs), reads the routes of the
request's sequences and prints them as one JSON line (test_compiled_routes.py)."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine's worker in this process


def main(path: str) -> None:
    from megatron_seed.rollout.engine import VLLMEngine

    request = json.loads(Path(path).read_text())
    start = time.perf_counter()
    engine = VLLMEngine(
        request["model"], max_model_len=256, kv_cache_bytes=64 << 20, enforce_eager=False,
        max_num_batched_tokens=request["step_tokens"], max_num_seqs=4,
    )  # fmt: skip
    started = time.perf_counter() - start
    routes = [r.tolist() for r in engine.routes(request["ids"])]  # [len, layers, k] each
    print(json.dumps({"routes": routes, "start_s": started}))


if __name__ == "__main__":
    main(sys.argv[1])
