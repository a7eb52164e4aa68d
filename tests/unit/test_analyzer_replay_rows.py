"""Analyzer replay's rows (`pipeline.replay`) are Stage 1's SFT rows of the same records, and
each teaches the Stage-2 analyzer exactly the reply that its parser accepts, to exactly the
prompt it is asked with: a replay row built in another layout, with another mask or another
answer format would keep an analyzer valid for requests Stage 2 never makes."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch

from megatron_seed.benchmarks.synthetic import synthetic_records
from megatron_seed.config import AlgoConfig, SeedConfig, SkillConfig
from megatron_seed.data import Analysis, collate, write_jsonl
from megatron_seed.models.tiny_tokenizer import build_tokenizer
from megatron_seed.pipeline.replay import replay_batch, replay_pool
from megatron_seed.pipeline.stage1 import answer_text, sft_sequence
from megatron_seed.rollout.analyzer import analyze_records
from megatron_seed.skills.prompt import record_prompt


@pytest.fixture(scope="module")
def tok_and_records():
    seed_tok = build_tokenizer(["hello world"], 300)
    draft = synthetic_records(seed_tok, groups=3, group_size=2, turns=2, seed=1)
    corpus = [record_prompt(r) for r in draft] + [answer_text("s", r.skill) for r in draft]
    tok = build_tokenizer(corpus * 2, 1024)
    records = synthetic_records(tok, groups=3, group_size=2, turns=2, seed=1)
    for i, r in enumerate(records):
        r.analysis = Analysis(f"{r.task_id}:{i}", valid=True, summary=f"episode {i} went so")
    return tok, records


class _EchoFleet:
    """Records the analyzer's prompts and answers each with the reply a replay row teaches
    for it (none: an empty reply)."""

    def __init__(self, replies: dict[tuple[int, ...], str]):
        self.replies, self.prompts = replies, []

    def generate(self, prompts, spec):
        self.prompts += [tuple(p) for p in prompts]
        texts = [self.replies.get(tuple(p), "") for p in prompts]
        return [SimpleNamespace(text=t, token_ids=[0] * 8, finish_reason="stop") for t in texts]


@pytest.mark.parametrize("layout", ["record", "continuation"])
def test_replay_rows_are_stage1_rows_and_answer_what_stage2_asks(tok_and_records, tmp_path, layout):
    tok, records = tok_and_records
    rejected = copy.deepcopy(records[0])
    rejected.skill, rejected.analysis = None, Analysis("rejected", valid=False, error="too short")
    annotated = tmp_path / "annotated.jsonl"
    write_jsonl([*records, rejected], annotated)
    cfg = SeedConfig(
        algo=AlgoConfig(replay_weight=0.5, replay_examples=4),
        skill=SkillConfig(analyzer_layout=layout, max_retries=0),
    )
    pool = replay_pool(SimpleNamespace(cfg=cfg, replay_data=str(annotated)))
    assert [r.analysis.trajectory_id for r in pool] == [r.analysis.trajectory_id for r in records]
    batch = replay_batch(cfg, 3, pool, tok, 4)  # [4, s]

    # the rows, mask and padding included, are Stage 1's SFT rows of the same records
    prompts = {}  # a row's prompt tokens -> its answer text
    for row in range(batch.input_ids.shape[0]):
        n = int(batch.lengths[row])
        first = int(batch.loss_mask[row].nonzero()[0])  # labels[first] = the answer's 1st token
        ids = batch.input_ids[row, :n].tolist()
        prompts[tuple(ids[: first + 1])] = tok.decode(ids[first + 1 :], skip_special_tokens=True)
        assert batch.loss_mask[row, first : n - 1].all() and not batch.loss_mask[row, n - 1 :].any()
    stage1 = {tuple(s.input_ids): s for s in (sft_sequence(tok, r, layout) for r in records)}
    replayed = [tuple(batch.input_ids[i, : int(batch.lengths[i])].tolist()) for i in range(4)]
    assert set(replayed) <= set(stage1) and len(set(replayed)) == 4  # 4 distinct records
    again = collate([stage1[key] for key in replayed], tok.pad_token_id or 0, 4)
    for field in ("input_ids", "labels", "loss_mask", "attention_mask", "position_ids"):
        assert torch.equal(getattr(again, field), getattr(batch, field)), field

    # each row's prompt is the very request Stage 2's analyzer makes of that episode, and
    # its answer, given as the reply, is accepted with the record's own skill
    fresh = [copy.deepcopy(r) for r in records]
    for r in fresh:
        r.skill, r.analysis = None, None
    fleet = _EchoFleet(prompts)
    analyze_records(fleet, tok, fresh, cfg.skill)
    assert set(prompts) <= set(fleet.prompts)
    accepted = [(r, original) for r, original in zip(fresh, records, strict=True) if r.skill]
    assert len(accepted) == 4
    for r, original in accepted:
        assert r.analysis.valid and r.skill == original.skill
        assert r.analysis.summary == original.analysis.summary
