"""Collation (shift convention, padding), teacher alignment, and an engine-to-loss check:
the log-probs an "engine" records while sampling are exactly what the trainer recomputes."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from megatron_seed.algo import opd_gate, seed_loss
from megatron_seed.config import AlgoConfig
from megatron_seed.data import (
    IM_END,
    Analysis,
    ChatBuilder,
    TokenSequence,
    TrajectoryRecord,
    Turn,
    align_teacher,
    build_sequences,
    collate,
)


def test_collate_shift_convention_hand_values() -> None:
    a = TokenSequence(
        [10, 11, 12, 13], [False, False, True, True], [0, 0, -0.5, -0.6], [-1, 0, 0, 0]
    )
    b = TokenSequence([20, 21, 22], [False, True, False], [0, -0.7, 0], [0, 1, 1])
    batch = collate([a, b], pad_id=0)
    assert batch.input_ids.tolist() == [[10, 11, 12, 13], [20, 21, 22, 0]]
    assert batch.labels.tolist() == [[11, 12, 13, 0], [21, 22, 0, 0]]
    assert batch.loss_mask.tolist() == [[False, True, True, False], [True, False, False, False]]
    torch.testing.assert_close(
        batch.rollout_logprobs, torch.tensor([[0, -0.5, -0.6, 0], [-0.7, 0, 0, 0]])
    )
    assert batch.turn_index.tolist() == [[0, 0, 0, -1], [1, 1, -1, -1]]
    assert batch.attention_mask.tolist() == [[True] * 4, [True, True, True, False]]
    assert batch.position_ids.tolist() == [[0, 1, 2, 3]] * 2
    assert batch.lengths.tolist() == [4, 3] and batch.num_tokens == 3
    padded = collate([a, b], pad_id=7, pad_to_multiple_of=3)
    assert padded.input_ids.shape == (2, 6) and padded.labels[1].tolist() == [21, 22, 7, 7, 7, 7]
    assert not padded.loss_mask[:, 3:].any()


def test_collate_rejects_unpredictable_first_token_and_nan_stays_out() -> None:
    with pytest.raises(ValueError, match="token 0"):
        collate([TokenSequence([1, 2], [True, False], [-0.1, 0], [0, 0])], pad_id=0)
    nan = float("nan")
    seq = TokenSequence([1, 2, 3], [False, True, False], [nan, -0.2, nan], [0, 0, 0])
    assert collate([seq], pad_id=0).rollout_logprobs.tolist() == [[pytest.approx(-0.2), 0, 0]]


def test_align_teacher_hand_values() -> None:
    student_mask = torch.tensor(
        [[0, 1, 1, 0, 0], [0, 0, 1, 0, 0], [0, 0, 0, 1, 1]], dtype=torch.bool
    )
    has_teacher = torch.tensor([True, False, True])
    teacher_mask = torch.tensor([[0, 0, 0, 1, 1, 0], [0, 0, 0, 0, 1, 1]], dtype=torch.bool)
    teacher_values = torch.arange(12, dtype=torch.float32).view(2, 6)
    out = align_teacher(teacher_values, teacher_mask, student_mask, has_teacher)
    assert out.tolist() == [[0, 3, 4, 0, 0], [0, 0, 0, 0, 0], [0, 0, 0, 10, 11]]
    with pytest.raises(ValueError, match="numbers of action tokens"):
        align_teacher(teacher_values, teacher_mask, student_mask.roll(1, 0), has_teacher)
    with pytest.raises(ValueError, match="rows have a teacher"):
        align_teacher(teacher_values, teacher_mask, student_mask, torch.ones(3, dtype=torch.bool))


# ---------------------------------------------------------------- engine -> trainer


class ToyCausalLM(torch.nn.Module):
    """Causal, context-dependent toy LM: logits_i = head(tanh(mean(emb(x_0..x_i))))."""

    def __init__(self, vocab: int, bigram: bool = False) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, 16)
        self.head = torch.nn.Linear(16, vocab)
        self.bigram = bigram  # logits_i depend on x_i only

    def forward(self, ids: torch.Tensor) -> torch.Tensor:  # [b, s] -> [b, s, V]
        e = self.emb(ids)  # [b, s, d]
        if not self.bigram:
            e = e.cumsum(1) / torch.arange(1, ids.shape[1] + 1).view(1, -1, 1)
        return self.head(torch.tanh(e))


def token_logp(model: ToyCausalLM, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The trainer's convention: logp[i] = log p(labels[i] | input_ids[:i+1]).  [b, s]"""
    logits = model(input_ids)  # [b, s, V]
    return torch.log_softmax(logits, -1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)


def sample_action(model, prompt: list[int], eos: int, max_tokens: int, gen: torch.Generator):
    """The 'engine': sample token by token from the prompt ids, recording log-probs."""
    ids, lps = [], []
    with torch.no_grad():
        for _ in range(max_tokens):
            logits = model(torch.tensor([prompt + ids]))[0, -1]  # [V]
            logp = torch.log_softmax(logits, -1)
            token = int(torch.multinomial(logp.exp(), 1, generator=gen))
            ids.append(token)
            lps.append(float(logp[token]))
            if token == eos:
                break
    return ids, lps


def play(model, tok, n_turns: int, seed: int, max_tokens: int = 6) -> TrajectoryRecord:
    gen = torch.Generator().manual_seed(seed)
    eos = tok.convert_tokens_to_ids(IM_END)
    observations = [f"Your task is to: put a mug {seed}.\nYou see a desk."] + [
        f"Observation {k}: nothing happens." for k in range(1, n_turns)
    ]
    chat, turns = ChatBuilder(tok, "Be an agent."), []
    for k, obs in enumerate(observations):
        prompt = chat.prompt_ids(obs) if k == 0 else chat.append_user(obs)
        ids, lps = sample_action(model, prompt, eos, max_tokens, gen)
        chat.append_action(ids)
        turns.append(Turn(obs, tok.decode(ids), ids, lps))
    return TrajectoryRecord(
        "t", "g", "game", "pick", turns, 0.0, False, system_prompt="Be an agent.",
        task_marker="Your task is to:", skill="Look in the cabinet first." if seed % 2 == 0 else None,
        analysis=Analysis("t", valid=seed % 2 == 0),
    )  # fmt: skip


def test_engine_logprobs_equal_trainer_logprobs_and_teacher_aligns(tiny_tokenizer) -> None:
    tok = tiny_tokenizer
    torch.manual_seed(0)
    model = ToyCausalLM(len(tok))
    eos = tok.convert_tokens_to_ids(IM_END)
    with torch.no_grad():
        model.head.bias[eos] += 4.0  # some actions stop on <|im_end|>, others hit the limit
    records = [play(model, tok, n_turns=n, seed=s) for s, n in [(0, 3), (1, 2), (2, 4)]]
    ends = {t.action_ids[-1] == eos for r in records for t in r.turns}
    assert ends == {True, False}, "both EOS conventions must be exercised"
    pairs = [p for r in records for p in build_sequences(r, tok, skill_insert_at="task_line")]
    students = collate([p.student for p in pairs], pad_id=tok.pad_token_id)
    with torch.no_grad():
        logp = token_logp(model, students.input_ids, students.labels)  # [b, s]
    m = students.loss_mask
    assert m.sum() == sum(len(t.action_ids) for r in records for t in r.turns)
    torch.testing.assert_close(logp[m], students.rollout_logprobs[m], rtol=0, atol=1e-5)

    has_teacher = torch.tensor([p.teacher is not None for p in pairs])
    assert has_teacher.tolist() == [True, False, True]
    teachers = collate([p.teacher for p in pairs if p.teacher], pad_id=tok.pad_token_id)
    bigram = ToyCausalLM(len(tok), bigram=True)
    with torch.no_grad():  # bigram model: the skill changes no action token's log-prob
        s_bi = token_logp(bigram, students.input_ids, students.labels)
        t_bi = token_logp(bigram, teachers.input_ids, teachers.labels)
    aligned = align_teacher(t_bi, teachers.loss_mask, m, has_teacher)  # [b, s]
    opd_rows = has_teacher.unsqueeze(1) & m
    torch.testing.assert_close(aligned[opd_rows], s_bi[opd_rows], rtol=0, atol=1e-6)
    assert torch.all(opd_gate(s_bi, aligned, 5.0)[opd_rows] == 0.5)
    with torch.no_grad():  # the causal model: the skill in context does move them
        t_causal = token_logp(model, teachers.input_ids, teachers.labels)
    aligned = align_teacher(t_causal, teachers.loss_mask, m, has_teacher)
    assert not torch.allclose(aligned[opd_rows], logp[opd_rows])

    # the whole path into the loss: at theta = theta_old the ratio is 1 and the loss finite
    logp_live = token_logp(model, students.input_ids, students.labels)
    loss, metrics = seed_loss(
        AlgoConfig(), logp_live, students.rollout_logprobs, torch.tensor([1.0, -1.0, 0.5]), m,
        ref_logp=students.rollout_logprobs, teacher_logp=aligned, opd_mask=has_teacher,
    )  # fmt: skip
    loss.backward()
    assert metrics["clip_frac"].item() == 0.0 and metrics["kl"].abs().item() < 1e-6
    assert model.head.weight.grad is not None and torch.isfinite(model.head.weight.grad).all()


def test_routes_join_a_batch_row_by_row_and_follow_its_rows() -> None:
    from megatron_seed.data.collate import NO_ROUTE
    from megatron_seed.train.batch import select_rows, with_routes

    a = TokenSequence([10, 11, 12], [False, True, True], [0, -0.5, -0.6], [-1, 0, 0])
    b = TokenSequence([20, 21], [False, True], [0, -0.7], [0, 0])
    batch = collate([a, b], pad_id=0)
    ra = torch.arange(12).reshape(3, 2, 2)  # [n=3, layers=2, k=2]
    rb = torch.arange(8).reshape(2, 2, 2) + 100
    routed = with_routes(batch, [ra.numpy(), rb])
    assert routed.routes.shape == (2, 3, 2, 2) and routed.routes.dtype == torch.int16
    assert routed.routes[0].tolist() == ra.tolist()
    assert routed.routes[1, :2].tolist() == rb.tolist()
    assert (routed.routes[1, 2] == NO_ROUTE).all()  # padding: routed freely
    assert batch.routes is None  # a new batch; the old one is unchanged
    assert select_rows(routed, torch.tensor([1])).routes[0, :2].tolist() == rb.tolist()
    assert select_rows(batch, torch.tensor([1])).routes is None
    with pytest.raises(ValueError, match=r"row 1: routes of shape \(3, 2, 2\) for a 2-token"):
        with_routes(batch, [ra, ra])
    with pytest.raises(ValueError, match="1 routes for a batch of 2 rows"):
        with_routes(batch, [ra])


def test_the_leader_reads_routes_of_every_row_or_of_the_first_students(tmp_path) -> None:
    """With routing replay the routes of every student and teacher row (each its real
    tokens); without, of the first N students only (the others None, no teachers); an engine
    failure comes back as one line for every rank to raise."""
    from types import SimpleNamespace

    from megatron_seed.pipeline.job import Stage2Job
    from megatron_seed.train.batch import PolicyBatch, with_routes

    asked: list[list[list[int]]] = []

    class Fleet:
        def routes(self, sequences):
            asked.append(sequences)
            if any(s == [0] for s in sequences):
                raise ValueError("the engine died")
            return [torch.zeros(len(s), 2, 2, dtype=torch.int16) for s in sequences]

    from megatron_seed.pipeline.roles import Leader

    leader = Leader(Stage2Job("m", ["g"], str(tmp_path)), SimpleNamespace(fleet=Fleet()))
    seqs = [TokenSequence([5, 6, 7], [False, True, True], [0, -1, -1], [-1, 0, 0]),
            TokenSequence([8, 9], [False, True], [0, -1], [-1, 0])]  # fmt: skip
    students = collate([*seqs, seqs[0]], pad_id=0)
    pb = PolicyBatch(students, collate(seqs[:1], 0), torch.tensor([True, False, False]),
                     torch.zeros(3), torch.arange(3))  # fmt: skip
    student, teacher = leader.routes(pb, None)
    assert asked == [[[5, 6, 7], [8, 9], [5, 6, 7]], [[5, 6, 7]]]
    assert [r.shape[0] for r in student] == [3, 2, 3] and len(teacher) == 1
    asked.clear()
    student, teacher = leader.routes(pb, 1)
    assert asked == [[[5, 6, 7]]] and teacher == []
    assert student[1:] == [None, None]
    routed = with_routes(pb.student, student)  # rows without routes route freely
    assert (routed.routes[1:] == -1).all() and (routed.routes[0] == 0).all()
    failing = dataclasses.replace(pb, student=collate([TokenSequence([0], [False], [0], [-1])], 0))
    assert leader.routes(failing, None) == "ValueError: the engine died"
