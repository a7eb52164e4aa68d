"""SEED loss math against hand computations, the review's worked trace and the paper's claims."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from megatron_seed.algo import (
    count_tokens,
    group_advantages,
    kl_penalty,
    opd_gate,
    opd_loss,
    policy_loss,
    seed_loss,
    sequence_weights,
)
from megatron_seed.config import AlgoConfig
from tests.fixtures import random_loss_inputs


def sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


# ---------------------------------------------------------------- group advantages


def test_group_advantages_hand_values() -> None:
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0])
    groups = torch.tensor([7, 7, 7, 7, 3, 3])
    adv = group_advantages(rewards, groups, eps=1e-6)
    # group 7: mu = 0.25, population sigma = sqrt(0.1875) = 0.4330127
    sigma = math.sqrt(0.1875)
    expected = [0.75 / (sigma + 1e-6)] + [-0.25 / (sigma + 1e-6)] * 3 + [0.0, 0.0]
    torch.testing.assert_close(adv, torch.tensor(expected), rtol=0, atol=1e-6)
    # population (not sample) std: sample std would give 0.75 / 0.5 = 1.5 for the winner
    assert adv[0].item() == pytest.approx(1.7320508, abs=1e-5)


def test_group_advantages_string_ids_and_exact_zero_for_ties() -> None:
    rewards = torch.tensor([0.1, 0.1, 0.1, 0.7, 0.2])
    adv = group_advantages(rewards, ["g0", "g0", "g0", "g1", "g1"])
    assert adv[:3].tolist() == [0.0, 0.0, 0.0]  # exactly, despite 0.1 not being representable
    torch.testing.assert_close(adv[3:], torch.tensor([1.0, -1.0]), rtol=0, atol=1e-5)
    assert group_advantages(torch.tensor([2.0]), [0]).tolist() == [0.0]  # singleton group


def test_group_advantages_rejects_bad_shapes() -> None:
    with pytest.raises(ValueError):
        group_advantages(torch.zeros(3), torch.zeros(4, dtype=torch.long))


# ---------------------------------------------------------------- policy loss


def test_policy_loss_hand_values() -> None:
    logp = torch.log(torch.tensor([[1.5, 0.5, 1.0]]))
    old = torch.zeros(1, 3)
    mask = torch.ones(1, 3, dtype=torch.bool)
    # A = +1: min(1.5, 1.2) + min(0.5, 0.8) + 1.0 = 2.7 -> loss -0.9, clipped token 0 only
    loss, clip = policy_loss(logp, old, torch.tensor([1.0]), mask, clip_eps=0.2)
    assert loss.item() == pytest.approx(-0.9, abs=1e-6)
    assert clip.item() == pytest.approx(1 / 3, abs=1e-6)
    # A = -1: min(-1.5, -1.2) + min(-0.5, -0.8) + -1 = -3.3 -> loss 1.1, clipped token 1 only
    loss, clip = policy_loss(logp, old, torch.full((1, 3), -1.0), mask, clip_eps=0.2)
    assert loss.item() == pytest.approx(1.1, abs=1e-6)
    assert clip.item() == pytest.approx(1 / 3, abs=1e-6)


def test_policy_loss_gradient_zero_on_clipped_tokens() -> None:
    logp = torch.log(torch.tensor([[1.5, 0.5, 1.0]])).requires_grad_()
    loss, _ = policy_loss(logp, torch.zeros(1, 3), torch.tensor([1.0]), torch.ones(1, 3), 0.2)
    loss.backward()
    # d/dlogp of -(rho * A) / 3 is -rho / 3 on unclipped tokens, 0 on the clipped one
    torch.testing.assert_close(logp.grad, torch.tensor([[0.0, -0.5 / 3, -1.0 / 3]]))


# ---------------------------------------------------------------- KL


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        ("k1", (0.5 - 1.0) / 2),
        ("k2", (0.5 * 0.25 + 0.5 * 1.0) / 2),
        ("k3", ((math.exp(-0.5) + 0.5 - 1) + (math.exp(1.0) - 2.0)) / 2),
    ],
)
def test_kl_penalty_hand_values(kind: str, expected: float) -> None:
    logp = torch.tensor([[-1.0, -2.0, -9.0]])
    ref = torch.tensor([[-1.5, -1.0, 0.0]])
    mask = torch.tensor([[True, True, False]])  # third token is masked: ignored
    assert kl_penalty(logp, ref, mask, kind).item() == pytest.approx(expected, abs=1e-6)


def test_kl_k3_gradient_and_unknown_kind() -> None:
    logp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    ref = torch.tensor([[-1.5, -1.0]])
    kl_penalty(logp, ref, torch.ones(1, 2)).backward()
    # d/dlogp [exp(r - l) - (r - l) - 1] = 1 - exp(r - l), then / 2 tokens
    expected = (1 - torch.exp(ref - logp.detach())) / 2
    torch.testing.assert_close(logp.grad, expected)
    with pytest.raises(ValueError, match="unknown KL kind"):
        kl_penalty(logp, ref, torch.ones(1, 2), kind="k4")  # type: ignore[arg-type]


# ---------------------------------------------------------------- OPD gate and loss

STUDENT = [-0.350, -0.900, -1.100]  # the review's worked trace, trajectory 2
TEACHER = [-0.330, -1.400, -2.600]


def test_opd_gate_matches_review_trace() -> None:
    gate = opd_gate(torch.tensor([STUDENT]), torch.tensor([TEACHER]), beta=5.0)
    torch.testing.assert_close(gate, torch.tensor([[0.5250, 0.0759, 0.0006]]), rtol=0, atol=5e-5)
    assert not gate.requires_grad


def test_opd_loss_value_and_gradient_go_to_student_only() -> None:
    student = torch.tensor([[*STUDENT, -3.0]], requires_grad=True)
    teacher = torch.tensor([[*TEACHER, -0.1]], requires_grad=True)
    mask = torch.tensor([[True, True, True, False]])
    loss = opd_loss(student, teacher, mask, beta=5.0)
    gates = [sigmoid(5 * (t - s)) for s, t in zip(STUDENT, TEACHER, strict=True)]
    expected = sum(g * (t - s) for g, s, t in zip(gates, STUDENT, TEACHER, strict=True)) / 3
    assert loss.item() == pytest.approx(expected, abs=1e-7)
    loss.backward()
    # -gate * mask / sum(mask); the masked 4th token gets exactly 0
    torch.testing.assert_close(student.grad, torch.tensor([[-g / 3 for g in gates] + [0.0]]))
    assert teacher.grad is None


def test_seed_loss_matches_review_trace_per_token_pull() -> None:
    """GRPO pushes all three tokens of the failed trajectory down equally; OPD pulls token 1
    (gate 0.525) up ~875x harder than token 3 (gate 0.0006)."""
    cfg = AlgoConfig(beta_kl=0.0)
    logp = torch.tensor([STUDENT], requires_grad=True)
    loss, m = seed_loss(
        cfg,
        logp,
        logp.detach(),
        torch.tensor([-1.0]),
        torch.ones(1, 3),
        teacher_logp=torch.tensor([TEACHER]),
    )
    loss.backward()
    gates = torch.tensor([sigmoid(5 * (t - s)) for s, t in zip(STUDENT, TEACHER, strict=True)])
    expected = (1.0 - cfg.lambda_opd * gates) / 3  # d/dlogp: -(A=-1)/3 - lambda g / 3
    torch.testing.assert_close(logp.grad[0], expected)
    assert m["opd/gate_mean"].item() == pytest.approx(gates.mean().item(), abs=1e-7)
    assert m["opd/frac_delta_pos"].item() == pytest.approx(1 / 3)


# ---------------------------------------------------------------- Proposition 2


def test_tied_rewards_zero_policy_gradient_nonzero_opd_gradient() -> None:
    adv = group_advantages(torch.tensor([1.0, 1.0]), [0, 0])
    assert adv.tolist() == [0.0, 0.0]
    torch.manual_seed(0)
    old = -torch.rand(2, 5) * 3
    logp = (old + 0.05 * torch.randn(2, 5)).requires_grad_()  # theta moved a little
    teacher = logp.detach() + torch.tensor([[0.4, -0.3, 0.0, 1.0, -2.0]] * 2)
    mask = torch.ones(2, 5, dtype=torch.bool)
    rl, _ = policy_loss(logp, old, adv, mask, 0.2)
    (g_rl,) = torch.autograd.grad(rl, logp)
    assert torch.count_nonzero(g_rl) == 0
    loss, _ = seed_loss(AlgoConfig(beta_kl=0.0), logp, old, adv, mask, teacher_logp=teacher)
    (g,) = torch.autograd.grad(loss, logp)
    gates = opd_gate(logp, teacher, 5.0)
    torch.testing.assert_close(g, -0.01 * gates / 10)
    assert g[0].unique().numel() == 5  # different gates -> different per-token pull


# ---------------------------------------------------------------- masking


def test_masked_positions_carry_no_loss_or_gradient_even_with_garbage() -> None:
    nan, inf = float("nan"), float("inf")
    mask = torch.tensor([[True, False, True, False]])
    logp = torch.tensor([[-1.0, nan, -2.0, -inf]], requires_grad=True)
    old = torch.tensor([[-1.1, inf, -2.0, nan]])
    ref = torch.tensor([[-0.9, -inf, -2.5, 50.0]])
    teacher = torch.tensor([[-0.5, 100.0, -3.0, nan]])
    loss, metrics = seed_loss(AlgoConfig(), logp, old, torch.tensor([0.7]), mask, ref, teacher)
    loss.backward()
    assert torch.isfinite(loss)
    assert all(torch.isfinite(v) for v in metrics.values())
    assert logp.grad[0, 1].item() == 0.0 and logp.grad[0, 3].item() == 0.0
    assert torch.all(logp.grad[0, [0, 2]] != 0)
    # value equals the loss of the two valid tokens alone
    sub = seed_loss(
        AlgoConfig(),
        logp.detach()[:, [0, 2]],
        old[:, [0, 2]],
        torch.tensor([0.7]),
        torch.ones(1, 2),
        ref[:, [0, 2]],
        teacher[:, [0, 2]],
    )[0]
    assert loss.item() == pytest.approx(sub.item(), abs=1e-7)


def test_opd_mask_skips_rows_and_normalises_by_opd_tokens() -> None:
    cfg = AlgoConfig(beta_kl=0.0, lambda_opd=1.0)
    logp = torch.tensor([[-1.0, -1.0], [-2.0, -2.0]], requires_grad=True)
    teacher = torch.tensor([[0.0, 0.0], [-1.0, -1.0]])
    mask = torch.tensor([[True, True], [True, False]])
    loss, m = seed_loss(
        cfg, logp, logp.detach(), torch.zeros(2), mask, teacher_logp=teacher,
        opd_mask=torch.tensor([False, True]),
    )  # fmt: skip
    g = sigmoid(5.0)
    assert m["loss/opd"].item() == pytest.approx(g * 1.0 / 1, abs=1e-6)  # 1 OPD token
    assert m["opd/token_frac"].item() == pytest.approx(1 / 3)
    loss.backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[0.0, 0.0], [-g, 0.0]]))


def test_use_opd_false_is_plain_grpo() -> None:
    torch.manual_seed(1)
    logp = -torch.rand(3, 4, requires_grad=True)
    old, ref = logp.detach() - 0.1, logp.detach() + 0.2
    adv, mask = torch.tensor([1.0, -0.5, 0.0]), torch.rand(3, 4) > 0.3
    cfg = AlgoConfig(use_opd=False)
    loss, metrics = seed_loss(cfg, logp, old, adv, mask, ref_logp=ref)
    rl, _ = policy_loss(logp, old, adv, mask, cfg.clip_eps)
    kl = kl_penalty(logp, ref, mask, "k3")
    assert loss.item() == pytest.approx((rl + cfg.beta_kl * kl).item(), abs=1e-7)
    assert "loss/opd" not in metrics
    with pytest.raises(ValueError, match="teacher_logp"):
        seed_loss(AlgoConfig(), logp, old, adv, mask, ref_logp=ref)
    with pytest.raises(ValueError, match="ref_logp"):
        seed_loss(cfg, logp, old, adv, mask)


# ---------------------------------------------------------------- micro-batch invariance


@pytest.mark.parametrize("splits", [[8], [3, 5], [1, 1, 2, 4], [2, 2, 2, 2]])
def test_micro_batch_sums_reproduce_full_batch(splits: list[int]) -> None:
    cfg = dataclasses.replace(AlgoConfig(), lambda_opd=0.5, beta_kl=0.1)
    data = random_loss_inputs(0)
    full_logp = data["logp"].clone().requires_grad_()
    full, full_m = seed_loss(cfg, **{**data, "logp": full_logp})
    full.backward()

    num_tokens, num_opd = count_tokens(data["mask"], data["opd_mask"])
    micro_logp = data["logp"].clone().requires_grad_()
    total, start, summed = torch.zeros(()), 0, dict.fromkeys(full_m, 0.0)
    for size in splits:  # micro-batches (and, equally, DP ranks): rows [start, start+size)
        part = {k: v[start : start + size] for k, v in data.items()}
        part["logp"] = micro_logp[start : start + size]
        loss, m = seed_loss(cfg, **part, num_tokens=num_tokens, num_opd_tokens=num_opd)
        loss.backward()
        total = total + loss.detach()
        summed = {k: summed[k] + m[k].item() for k in summed}
        start += size
    assert total.item() == pytest.approx(full.item(), abs=1e-6)
    torch.testing.assert_close(micro_logp.grad, full_logp.grad, rtol=0, atol=1e-7)
    for key, value in full_m.items():
        assert summed[key] == pytest.approx(value.item(), abs=1e-6), key
    assert 0 < full_m["clip_frac"].item() < 1  # the test exercises clipping


def test_empty_micro_batch_gives_zero_not_nan() -> None:
    logp = torch.zeros(1, 3, requires_grad=True)
    loss, metrics = seed_loss(
        AlgoConfig(), logp, logp.detach(), torch.ones(1), torch.zeros(1, 3, dtype=torch.bool),
        torch.zeros(1, 3), torch.zeros(1, 3), num_tokens=10.0, num_opd_tokens=4.0,
    )  # fmt: skip
    loss.backward()
    assert loss.item() == 0.0 and torch.count_nonzero(logp.grad) == 0
    assert all(v.item() == 0.0 for v in metrics.values())


def test_sequence_weights_give_the_mean_of_per_sequence_token_means() -> None:
    """Scaled advantages reproduce (1/R) sum_r (1/n_r) sum_t min(rho A, clip(rho) A), in
    value and gradient, with clipping active and an empty row."""
    torch.manual_seed(0)
    mask = torch.tensor([[1, 1, 1, 1, 0], [1, 0, 0, 0, 0], [0, 0, 0, 0, 0], [1, 1, 0, 0, 0]])
    mask = mask.bool()
    old = torch.randn(4, 5)
    logp = (old + 0.4 * torch.randn(4, 5)).requires_grad_()
    adv = torch.tensor([1.5, -0.5, 2.0, -1.0])
    n = mask.sum()
    w = sequence_weights(mask, n)
    assert w[2] == 0 and torch.allclose(w[:2], torch.tensor([7 / (3 * 4), 7 / (3 * 1)]))
    loss, clip = policy_loss(logp, old, adv * w, mask, 0.2, n)
    (grad,) = torch.autograd.grad(loss, logp)
    rho = (logp - old).exp()
    a = adv[:, None].expand_as(logp)
    term = torch.minimum(rho * a, rho.clamp(0.8, 1.2) * a)
    rows = [r for r in range(4) if mask[r].any()]
    ref = -sum(term[r][mask[r]].mean() for r in rows) / len(rows)
    (ref_grad,) = torch.autograd.grad(ref, logp)
    assert clip > 0  # the clipped branch is exercised
    assert torch.allclose(loss, ref, atol=1e-6)
    assert torch.allclose(grad, ref_grad, atol=1e-6)


# ---------------------------------------------------------------- OPD condition diagnostics


def _condition_batch() -> dict[str, torch.Tensor]:
    """Five rows, four trajectories (20 spans two rows, as in window mode), Delta = l_T - l_old
    written per token; row 3 has no teacher, -9 marks tokens outside the OPD mask."""
    delta = torch.tensor(
        [
            [1.0, 0.5, -9.0],  # trajectory 10, won, A = 1
            [-1.0, -9.0, -9.0],  # trajectory 20, failed, A = -0.5
            [0.4, -0.2, 0.0],  # trajectory 20
            [2.0, 2.0, -9.0],  # trajectory 30, failed, no teacher: left out
            [0.2, -0.3, -9.0],  # trajectory 40, won, A = 0.25
        ]
    )
    opd = delta != -9.0
    opd[3] = False
    old = torch.linspace(-3.0, -0.5, 15).reshape(5, 3)
    teacher = torch.where(opd, old + delta, torch.tensor(float("nan")))  # garbage off-mask
    return {
        "old_logp": old,
        "teacher_logp": teacher,
        "opd_tokens": opd,
        "advantages": torch.tensor([1.0, -0.5, -0.5, -0.5, 0.25]),
        "trajectory": torch.tensor([10, 20, 20, 30, 40]),
        "won": torch.tensor([True, False, False, False, True]),
    }


def test_opd_condition_metrics_hand_values() -> None:
    import numpy as np

    from megatron_seed.algo.diagnostics import opd_condition_metrics, opd_condition_sums

    batch = _condition_batch()
    m = opd_condition_metrics(opd_condition_sums(**batch, beta=5.0))
    # per trajectory mean Delta over its OPD tokens: 10 -> 0.75, 20 -> (-1 + 0.4 - 0.2 + 0) / 4
    # = -0.2, 40 -> -0.05; advantages 1, -0.5, 0.25
    x, y = [0.75, -0.2, -0.05], [1.0, -0.5, 0.25]
    # (Delta is rebuilt from float32 log-probs: exact to ~1e-7)
    assert m["opd/delta_adv_corr"] == pytest.approx(np.corrcoef(x, y)[0, 1], abs=1e-6)
    # by hand: centred x = (7/12, -11/30, -13/60), y = (3/4, -3/4, 0); sum dx dy = 0.7125,
    # sum dx^2 = 0.5216667, sum dy^2 = 1.125: r = 0.7125 / sqrt(0.5216667 * 1.125)
    assert m["opd/delta_adv_corr"] == pytest.approx(0.9300623, abs=1e-6)
    # gate > 1/2 iff Delta > 0: won tokens 1.0, 0.5, 0.2 of 4; failed 0.4 of 4 (0 is not > 0)
    assert m["opd/gated_frac_success"] == 0.75
    assert m["opd/gated_frac_failure"] == 0.25


def test_opd_condition_sums_add_over_whole_trajectory_splits() -> None:
    from megatron_seed.algo.diagnostics import opd_condition_metrics, opd_condition_sums

    batch = _condition_batch()
    whole = opd_condition_sums(**batch, beta=5.0)
    parts = [torch.tensor([0, 3]), torch.tensor([1, 2, 4])]  # trajectory 20 stays together
    split = sum(opd_condition_sums(**{k: v[p] for k, v in batch.items()}, beta=5.0) for p in parts)
    torch.testing.assert_close(split, whole, rtol=1e-12, atol=1e-12)
    assert opd_condition_metrics(split) == pytest.approx(opd_condition_metrics(whole))


def test_opd_condition_metrics_are_omitted_when_undefined() -> None:
    from megatron_seed.algo.diagnostics import (
        opd_condition_metrics,
        opd_condition_sums,
        pearson_from_sums,
    )

    batch = _condition_batch()
    tied = {**batch, "advantages": torch.zeros(5)}  # every group tied: y has no variance
    assert set(opd_condition_metrics(opd_condition_sums(**tied, beta=5.0))) == {
        "opd/gated_frac_success",
        "opd/gated_frac_failure",
    }
    no_outcome = {k: v for k, v in batch.items() if k != "won"}
    assert set(opd_condition_metrics(opd_condition_sums(**no_outcome, beta=5.0))) == {
        "opd/delta_adv_corr"
    }
    one = {k: v[:1] for k, v in batch.items()}  # one trajectory, won only
    assert opd_condition_metrics(opd_condition_sums(**one, beta=5.0)) == {
        "opd/gated_frac_success": 1.0
    }
    empty = {**batch, "opd_tokens": torch.zeros(5, 3, dtype=torch.bool)}
    assert opd_condition_metrics(opd_condition_sums(**empty, beta=5.0)) == {}
    # beta_opd = 0: the gate is exactly 1/2 everywhere, never above it
    flat = opd_condition_metrics(opd_condition_sums(**batch, beta=0.0))
    assert flat["opd/gated_frac_success"] == 0.0 and flat["opd/gated_frac_failure"] == 0.0
    # a constant x is rounding, not spread: 3 * 0.1 summed in float has var ~ 1e-17
    assert pearson_from_sums(3, 0.3, 1.0, 0.03, 2.0, 0.1) is None


def test_pearson_from_sums_matches_numpy() -> None:
    import numpy as np

    from megatron_seed.algo.diagnostics import pearson_from_sums

    rng = np.random.default_rng(0)
    for n in (2, 5, 64):
        x = rng.normal(size=n)
        y = 0.3 * x + rng.normal(size=n)
        r = pearson_from_sums(n, x.sum(), y.sum(), (x * x).sum(), (y * y).sum(), (x * y).sum())
        assert r == pytest.approx(np.corrcoef(x, y)[0, 1], abs=1e-10), n


def test_staleness_metrics_match_proposition_3_by_hand():
    """The review's worked example: log pi(v|c) = -1.2, with the stale skill -0.9, with the
    fresh one -0.4, beta 5: Delta 0.3 vs 0.8, gates sigmoid(1.5) vs sigmoid(4)."""
    from megatron_seed.algo.staleness import staleness_metrics

    student = torch.tensor([-1.2, -2.0])
    stale = torch.tensor([-0.9, -2.5])
    fresh = torch.tensor([-0.4, -2.5])  # token 2: the same skill effect, no staleness
    m = staleness_metrics(student, stale, fresh, beta=5.0)
    assert m["staleness/delta_abs_mean"] == pytest.approx(0.5 / 2)
    gate = 1 / (1 + math.exp(-4.0)) - 1 / (1 + math.exp(-1.5))  # 0.16443931
    assert m["staleness/gate_abs_mean"] == pytest.approx(gate / 2)
    assert m["staleness/bound"] == pytest.approx(5.0 / 4 * 0.25)
    assert m["staleness/gate_abs_mean"] <= m["staleness/bound"]
    assert m["staleness/tokens"] == 2.0
    same = staleness_metrics(student, stale, stale.clone(), beta=5.0)
    assert same["staleness/delta_abs_mean"] == 0.0 and same["staleness/gate_abs_mean"] == 0.0
    with pytest.raises(ValueError):
        staleness_metrics(student, stale, fresh[:1], beta=5.0)
