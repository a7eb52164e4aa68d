"""Stage-1 SFT on a tiny model: the skill-token NLL falls, prompt tokens carry no loss, and
greedy analyses of held-out trajectories pass validation more often afterwards."""

from __future__ import annotations

import os

import pytest

from megatron_seed.benchmarks.synthetic import synthetic_records
from megatron_seed.config import OptimConfig, SeedConfig, SkillConfig
from megatron_seed.data import Analysis
from megatron_seed.models.tiny import make_tiny_policy
from megatron_seed.models.tiny_tokenizer import build_tokenizer
from megatron_seed.pipeline.stage1 import answer_text, run_sft, sft_sequence
from megatron_seed.skills.prompt import record_prompt


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("sft")
    seed_tok = build_tokenizer(["hello world"], 300)
    draft = synthetic_records(seed_tok, groups=8, group_size=2, turns=2, seed=1)
    corpus = [record_prompt(r) for r in draft] + [answer_text("s", r.skill) for r in draft]
    tok = build_tokenizer(corpus * 2, 1024, root / "model")
    records = synthetic_records(tok, groups=8, group_size=2, turns=2, seed=1)
    for r in records:
        r.analysis = Analysis(r.task_id, valid=True)
    make_tiny_policy(root / "model", tok)
    return root, tok, records


def test_prompt_tokens_carry_no_loss(setup):
    _, tok, records = setup
    seq = sft_sequence(tok, records[0], "record")
    first = seq.action_mask.index(True)
    assert not any(seq.action_mask[:first]) and all(seq.action_mask[first:])
    assert tok.decode(seq.input_ids[first:], skip_special_tokens=True) == answer_text(
        None, records[0].skill
    )


def test_sft_lowers_nll_and_raises_validity(setup):
    root, tok, records = setup
    cfg = SeedConfig(
        sft_lr=2e-3, sft_epochs=20, sft_batch_size=4, optim=OptimConfig(micro_batch_size=2)
    )
    result = run_sft(root / "model", records[:12], root / "out", cfg)
    nll = [c["nll"] for c in result["curve"]]
    assert sum(nll[-4:]) / 4 < 0.5 * sum(nll[:4]) / 4, nll
    assert (root / "out" / "hf" / "model.safetensors").is_file()
    assert (root / "out" / "megatron" / "latest").is_file()

    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from transformers import AutoTokenizer

    from megatron_seed.rollout.analyzer import analyze_records
    from megatron_seed.rollout.engine import VLLMEngine

    rates = {}
    for name, path in (("before", root / "model"), ("after", root / "out" / "hf")):
        engine = VLLMEngine(str(path), max_model_len=2048, kv_cache_bytes=256 << 20)
        held_out = synthetic_records(
            AutoTokenizer.from_pretrained(path), groups=8, group_size=2, turns=2, seed=1
        )[12:]
        rates[name] = analyze_records(
            engine, tok, held_out, SkillConfig(max_tokens=96, max_retries=0)
        )["analyze/valid_rate"]
        del engine
    assert rates["after"] > rates["before"], rates
