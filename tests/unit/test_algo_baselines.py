"""The baselines' math (Skill-SD, RLSD, original OPSD) against hand computations, and its
wiring into seed_loss: each option changes exactly its own term, the defaults nothing."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import pytest
import torch

from megatron_seed.algo import (
    count_tokens,
    iw_reverse_kl,
    kl_penalty,
    opd_loss,
    policy_loss,
    reverse_kl_pg,
    rlsd_lambda,
    rlsd_token_advantages,
    rlsd_weights,
    seed_loss,
)
from megatron_seed.config import AlgoConfig, ConfigError, SeedConfig
from tests.fixtures import random_loss_inputs

F64 = torch.float64


def _t(rows: list[list[float]], grad: bool = False) -> torch.Tensor:
    return torch.tensor(rows, dtype=F64, requires_grad=grad)


# ---------------------------------------------------------------- Skill-SD: iw_reverse_kl


def test_iw_reverse_kl_hand_values_and_gradient() -> None:
    # token 0: l = -1, l_old = -1.2, l_T = -0.5 -> u = -0.5, rho = e^0.2 = 1.2214028,
    #          k3' = e^0.5 - 1 - 0.5 = 0.1487213, rho k3' = 0.1816486, grad rho u = -0.6107014
    # token 1: l = -2, l_old = -2, l_T = -3 -> u = 1, rho = 1, k3' = e^-1 = 0.3678794, grad 1
    # token 2: masked
    logp = _t([[-1.0, -2.0, -7.0]], grad=True)
    old = _t([[-1.2, -2.0, 0.0]])
    teacher = _t([[-0.5, -3.0, 0.0]])
    mask = torch.tensor([[True, True, False]])
    loss = iw_reverse_kl(logp, old, teacher, mask)
    assert loss.item() == pytest.approx((0.1816486 + 0.3678794) / 2, abs=1e-7)
    loss.backward()
    expected = torch.tensor([[-0.6107014 / 2, 1.0 / 2, 0.0]], dtype=F64)
    torch.testing.assert_close(logp.grad, expected, rtol=0, atol=1e-7)


def test_iw_reverse_kl_gradient_is_rho_times_the_gap_inside_the_caps() -> None:
    g = torch.Generator().manual_seed(0)
    old = -torch.rand(4, 6, generator=g, dtype=F64) * 3
    logp = (old + 0.5 * torch.randn(4, 6, generator=g, dtype=F64)).requires_grad_()
    teacher = old + torch.randn(4, 6, generator=g, dtype=F64)
    mask = torch.rand(4, 6, generator=g) > 0.3
    (grad,) = torch.autograd.grad(iw_reverse_kl(logp, old, teacher, mask), logp)
    rho = (logp.detach() - old).exp()
    expected = torch.where(mask, rho * (logp.detach() - teacher), 0.0) / mask.sum()
    torch.testing.assert_close(grad, expected, rtol=1e-12, atol=1e-14)
    # the same gradient as reverse_kl_pg's, importance-weighted by rho
    (pg,) = torch.autograd.grad(reverse_kl_pg(logp, teacher, mask), logp)
    torch.testing.assert_close(grad, rho * pg, rtol=1e-12, atol=1e-14)


def test_iw_reverse_kl_sign_follows_the_teacher_not_the_advantage() -> None:
    """l_T > l_theta: the gradient is negative, so a descent step raises l_theta (toward the
    teacher); l_T < l_theta lowers it. No advantage enters."""
    logp = _t([[-2.0, -0.5, -1.0]], grad=True)
    teacher = _t([[-0.5, -2.0, -1.0]])  # above, below, equal
    iw_reverse_kl(logp, logp.detach() + 0.1, teacher, torch.ones(1, 3)).backward()
    assert logp.grad[0, 0] < 0 and logp.grad[0, 1] > 0 and logp.grad[0, 2] == 0
    stepped = logp.detach() - 0.1 * logp.grad
    assert ((stepped - teacher).abs() <= (logp.detach() - teacher).abs()).all()
    assert stepped[0, 0] > logp[0, 0] and stepped[0, 1] < logp[0, 1]


def test_iw_reverse_kl_exact_gradient_where_the_caps_bind() -> None:
    """The reference stack's caps, kept: the general derivative
    rho (k3' [l - l_old <= 10] + 1 - e^-u [-u <= 20]) in both capped regimes."""
    # token 0: l - l_old = 11 > 10 -> rho frozen at e^10; u = 0.5: grad e^10 (1 - e^-0.5)
    #          = 22026.466 * 0.3934693 = 8666.739, value e^10 (e^-0.5 - 0.5) = 2346.5
    # token 1: -u = 21 > 20 -> k3' = e^20 - 1 - 21 with slope 1; rho = 1:
    #          grad = k3' + 1 = e^20 - 21 > 0, i.e. l_theta is pushed *down*, away from a
    #          teacher 21 nats above it
    logp = _t([[-1.0, -22.0]], grad=True)
    old = _t([[-12.0, -22.0]])
    teacher = _t([[-1.5, -1.0]])
    loss = iw_reverse_kl(logp, old, teacher, torch.ones(1, 2))
    e10, e20 = math.exp(10.0), math.exp(20.0)
    value = (e10 * (math.exp(-0.5) - 0.5) + (e20 - 22.0)) / 2
    assert loss.item() == pytest.approx(value, rel=1e-12)
    loss.backward()
    expected = torch.tensor([[e10 * (1 - math.exp(-0.5)) / 2, (e20 - 21.0) / 2]], dtype=F64)
    torch.testing.assert_close(logp.grad, expected, rtol=1e-12, atol=0)
    assert logp.grad[0, 1] > 0 and teacher[0, 1] > logp[0, 1]


# ---------------------------------------------------------------- original OPSD: reverse_kl_pg


def test_reverse_kl_pg_hand_values_and_gradient() -> None:
    # Delta = l_T - l = [0.5, -1]; value -(0.5 * -1 + -1 * -2) / 2 = -0.75;
    # grad -Delta / 2 = (l - l_T) / 2 = [-0.25, 0.5]; the masked third token: 0
    logp = _t([[-1.0, -2.0, -4.0]], grad=True)
    teacher = _t([[-0.5, -3.0, 9.0]], grad=True)
    mask = torch.tensor([[True, True, False]])
    loss = reverse_kl_pg(logp, teacher, mask)
    assert loss.item() == pytest.approx(-0.75, abs=1e-12)
    loss.backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[-0.25, 0.5, 0.0]], dtype=F64))
    assert teacher.grad is None


# ---------------------------------------------------------------- RLSD


def _rlsd_case() -> tuple[torch.Tensor, ...]:
    # Delta_old = l_T - l_old = [0.1, 0.5, -1.0] on both rows; A = [1, -2, 0]
    old = _t([[-1.0, -1.0, -1.0], [-2.0, -2.0, -2.0], [-1.0, -1.0, -1.0]])
    teacher = old + _t([[0.1, 0.5, -1.0]])
    return torch.tensor([1.0, -2.0, 0.0], dtype=F64), old, teacher, torch.ones(3, 3).bool()


def test_rlsd_token_advantages_hand_values() -> None:
    adv, old, teacher, mask = _rlsd_case()
    # A > 0: w = clip(e^Delta, 0.8, 1.2) = [e^0.1 = 1.1051709, 1.2 (e^0.5), 0.8 (e^-1)]
    #        A_hat = 1 * (0.5 + 0.5 w) = [1.0525855, 1.1, 0.9]
    # A < 0: w = clip(e^-Delta) = [e^-0.1 = 0.9048374, 0.8 (e^-0.5), 1.2 (e^1)]
    #        A_hat = -2 * (0.5 + 0.5 w) = -(1 + w) = [-1.9048374, -1.8, -2.2]
    # A = 0: sign 0 -> w = 1, A_hat = 0
    out = rlsd_token_advantages(adv, old, teacher, mask, lam=0.5, eps_w=0.2)
    expected = [[1.0525855, 1.1, 0.9], [-1.9048374, -1.8, -2.2], [0.0, 0.0, 0.0]]
    torch.testing.assert_close(out, torch.tensor(expected, dtype=F64), rtol=0, atol=1e-7)
    w = rlsd_weights(adv, old, teacher, mask, eps_w=0.2)
    expected_w = [[1.1051709, 1.2, 0.8], [0.9048374, 0.8, 1.2], [1.0, 1.0, 1.0]]
    torch.testing.assert_close(w, torch.tensor(expected_w, dtype=F64), rtol=0, atol=1e-7)
    # [b, s] advantages give the same as [b] broadcast
    per_token = rlsd_token_advantages(adv[:, None].expand(3, 3), old, teacher, mask, 0.5, 0.2)
    assert torch.equal(per_token, out)


@pytest.mark.parametrize(("lam", "eps_w"), [(0.5, 0.2), (1.0, 0.2), (0.3, 0.9), (1.0, 0.9)])
def test_rlsd_keeps_the_sign_and_stays_inside_the_clip(lam: float, eps_w: float) -> None:
    g = torch.Generator().manual_seed(1)
    adv = torch.randn(6, 9, generator=g)
    adv[0] = 0.0
    old = -torch.rand(6, 9, generator=g) * 4
    teacher = old + 3 * torch.randn(6, 9, generator=g)  # many weights hit the clip
    mask = torch.rand(6, 9, generator=g) > 0.2
    out = rlsd_token_advantages(adv, old, teacher, mask, lam, eps_w)
    a = torch.where(mask, adv, 0.0)
    assert torch.equal(torch.sign(out), torch.sign(a))
    factor = out[a != 0] / a[a != 0]  # (1 - lam) + lam w
    assert factor.min() >= 1 - lam * eps_w - 1e-6 and factor.max() <= 1 + lam * eps_w + 1e-6
    w = rlsd_weights(adv, old, teacher, mask, eps_w)
    assert w.min() == pytest.approx(1 - eps_w) and w.max() == pytest.approx(1 + eps_w)


def test_rlsd_lambda_zero_gives_a_exactly_detached_and_zero_off_the_mask() -> None:
    g = torch.Generator().manual_seed(2)
    adv = torch.randn(3, 5, generator=g, requires_grad=True)
    old = -torch.rand(3, 5, generator=g)
    teacher = (old + torch.randn(3, 5, generator=g)).requires_grad_()
    mask = torch.rand(3, 5, generator=g) > 0.4
    out = rlsd_token_advantages(adv, old, teacher, mask, lam=0.0, eps_w=0.2)
    assert torch.equal(out, torch.where(mask, adv.detach(), 0.0))
    assert not out.requires_grad
    out = rlsd_token_advantages(adv, old, teacher, mask, lam=0.5, eps_w=0.2)
    assert torch.count_nonzero(out[~mask]) == 0
    with pytest.raises(ValueError, match="lam and eps_w"):
        rlsd_token_advantages(adv, old, teacher, mask, lam=1.5, eps_w=0.2)


def test_rlsd_lambda_schedule() -> None:
    assert rlsd_lambda(0) == 0.5  # lam0 at the first update
    assert rlsd_lambda(50) == 0.25  # midpoint of K = 100
    assert rlsd_lambda(99) == pytest.approx(0.005)
    assert rlsd_lambda(100) == 0.0 and rlsd_lambda(1000) == 0.0
    assert rlsd_lambda(25, lam0=1.0, decay_updates=50) == 0.5
    with pytest.raises(ValueError):
        rlsd_lambda(-1)
    with pytest.raises(ValueError):
        rlsd_lambda(0, decay_updates=0)


# ---------------------------------------------------------------- contracts of the new terms


def _iw(logp, old, teacher, mask, n=None):
    return iw_reverse_kl(logp, old, teacher, mask, n)


def _pg(logp, old, teacher, mask, n=None):
    return reverse_kl_pg(logp, teacher, mask, n)


TERMS = {"iw_reverse_kl": _iw, "reverse_kl_pg": _pg}


@pytest.mark.parametrize("name", list(TERMS))
def test_micro_batches_with_the_global_count_sum_to_the_whole_batch(name: str) -> None:
    term: Callable = TERMS[name]
    g = torch.Generator().manual_seed(3)
    old = -torch.rand(8, 7, generator=g) * 3
    logp0 = old + 0.4 * torch.randn(8, 7, generator=g)
    teacher = old + torch.randn(8, 7, generator=g)
    mask = torch.rand(8, 7, generator=g) > 0.4
    full_logp = logp0.clone().requires_grad_()
    full = term(full_logp, old, teacher, mask)
    full.backward()
    n = mask.sum().float()
    micro_logp = logp0.clone().requires_grad_()
    total = 0.0
    for rows in (slice(0, 3), slice(3, 4), slice(4, 8)):
        part = term(micro_logp[rows], old[rows], teacher[rows], mask[rows], n)
        part.backward()
        total += part.item()
    assert total == pytest.approx(full.item(), abs=1e-6)
    torch.testing.assert_close(micro_logp.grad, full_logp.grad, rtol=0, atol=1e-7)


def _garbage() -> dict[str, torch.Tensor]:
    nan, inf = float("nan"), float("inf")
    return {
        "mask": torch.tensor([[True, False, True, False]]),
        "logp": torch.tensor([[-1.0, nan, -2.0, -inf]]),
        "old": torch.tensor([[-1.1, inf, -2.0, nan]]),
        "teacher": torch.tensor([[-0.5, 100.0, -3.0, nan]]),
        "adv": torch.tensor([[0.7, nan, 0.7, inf]]),
    }


@pytest.mark.parametrize("name", list(TERMS))
def test_masked_garbage_gives_finite_values_and_zero_gradient(name: str) -> None:
    d = _garbage()
    logp = d["logp"].clone().requires_grad_()
    loss = TERMS[name](logp, d["old"], d["teacher"], d["mask"])
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(logp.grad).all()
    assert logp.grad[0, 1] == 0 and logp.grad[0, 3] == 0 and (logp.grad[0, [0, 2]] != 0).all()
    valid = [0, 2]
    sub = TERMS[name](logp.detach()[:, valid], d["old"][:, valid], d["teacher"][:, valid],
                      torch.ones(1, 2).bool())  # fmt: skip
    assert loss.item() == pytest.approx(sub.item(), abs=1e-7)
    out = rlsd_token_advantages(d["adv"], d["old"], d["teacher"], d["mask"], 0.5, 0.2)
    assert torch.isfinite(out).all() and out[0, 1] == 0 and out[0, 3] == 0


# ---------------------------------------------------------------- seed_loss wiring


def _run(cfg: AlgoConfig, data: dict, **kw) -> tuple[torch.Tensor, torch.Tensor, dict]:
    logp = data["logp"].clone().requires_grad_()
    loss, metrics = seed_loss(cfg, **{**data, "logp": logp}, **kw)
    (grad,) = torch.autograd.grad(loss, logp)
    return loss.detach(), grad, metrics


def _terms(cfg: AlgoConfig, data: dict, logp: torch.Tensor, global_counts: bool) -> dict:
    """Today's formula, term by term, from the public functions, built in seed_loss's order
    (autograd sums a tensor's gradient paths in graph order, so the order is part of the bits)."""
    mask, opd = data["mask"], data["mask"] & data["opd_mask"][:, None]
    n, n_opd = count_tokens(data["mask"], data["opd_mask"]) if global_counts else (None, None)
    adv, old, teacher = data["advantages"], data["old_logp"], data["teacher_logp"]
    return {
        "rl": policy_loss(logp, old, adv, mask, cfg.clip_eps, n)[0],
        "kl": kl_penalty(logp, data["ref_logp"], mask, cfg.kl_kind, n),
        "opd": opd_loss(logp, teacher, opd, cfg.beta_opd, n_opd),
        "iw": iw_reverse_kl(logp, old, teacher, opd, n_opd),
        "pg": reverse_kl_pg(logp, teacher, opd, n_opd),
    }


@pytest.mark.parametrize("global_counts", [False, True])
@pytest.mark.parametrize("variant", ["default", "no_kl", "grpo", "beta_opd_0"])
def test_default_fields_are_bitwise_todays_formula(variant: str, global_counts: bool) -> None:
    changes = {
        "default": {},
        "no_kl": {"beta_kl": 0.0},
        "grpo": {"use_opd": False},
        "beta_opd_0": {"beta_opd": 0.0, "lambda_opd": 0.5},
    }[variant]
    cfg = dataclasses.replace(AlgoConfig(), **changes)
    for seed in range(3):
        data = random_loss_inputs(seed)
        kw = dict(zip(("num_tokens", "num_opd_tokens"), count_tokens(data["mask"],
                  data["opd_mask"]), strict=True)) if global_counts else {}  # fmt: skip
        loss, grad, metrics = _run(cfg, data, **kw)  # no update= on the default path
        logp = data["logp"].clone().requires_grad_()
        t = _terms(cfg, data, logp, global_counts)
        today = t["rl"]
        if cfg.beta_kl != 0.0:
            today = today + cfg.beta_kl * t["kl"]
        if cfg.use_opd:
            today = today + cfg.lambda_opd * t["opd"]
        (today_grad,) = torch.autograd.grad(today, logp)
        assert torch.equal(loss, today.detach()) and torch.equal(grad, today_grad)
        assert torch.equal(metrics["loss/policy"], t["rl"].detach())
        assert "loss/distill" not in metrics and not any(k.startswith("rlsd/") for k in metrics)


def test_new_fields_default_to_seed() -> None:
    cfg = AlgoConfig()
    assert (cfg.policy_weight, cfg.distill, cfg.lambda_iw) == (1.0, "opd", 0.001)
    assert (cfg.advantage_reweight, cfg.rlsd_lambda0) == ("none", 0.5)
    assert (cfg.rlsd_decay_updates, cfg.rlsd_eps_w) == (100, 0.2)


@pytest.mark.parametrize("beta_kl", [0.0, 0.1])
def test_policy_weight_zero_gives_the_pure_distillation_gradient(beta_kl: float) -> None:
    cfg = AlgoConfig(policy_weight=0.0, beta_kl=beta_kl, lambda_opd=0.5)
    data = random_loss_inputs(4)
    loss, grad, metrics = _run(cfg, data)
    logp = data["logp"].clone().requires_grad_()
    t = _terms(cfg, data, logp, global_counts=False)
    distill = cfg.lambda_opd * t["opd"]
    expected = cfg.beta_kl * t["kl"] + distill if beta_kl else distill  # seed_loss's order
    (expected_grad,) = torch.autograd.grad(expected, logp, retain_graph=True)
    assert torch.equal(loss, expected.detach()) and torch.equal(grad, expected_grad)
    # = lambda_opd grad(L_opd) + beta_kl grad(KL), each term's own gradient
    (g_opd,) = torch.autograd.grad(t["opd"], logp, retain_graph=True)
    (g_kl,) = torch.autograd.grad(t["kl"], logp)
    torch.testing.assert_close(grad, cfg.lambda_opd * g_opd + beta_kl * g_kl, rtol=0, atol=1e-9)
    # L_rl is still reported, and it would have had a gradient of its own
    assert torch.equal(metrics["loss/policy"], t["rl"].detach()) and t["rl"].item() != 0
    assert not torch.equal(grad, _run(AlgoConfig(beta_kl=beta_kl, lambda_opd=0.5), data)[1])


def test_policy_weight_scales_the_policy_term_only() -> None:
    cfg = AlgoConfig(policy_weight=0.5)
    data = random_loss_inputs(5)
    loss, grad, _ = _run(cfg, data)
    logp = data["logp"].clone().requires_grad_()
    t = _terms(cfg, data, logp, global_counts=False)
    expected = 0.5 * t["rl"] + cfg.beta_kl * t["kl"] + cfg.lambda_opd * t["opd"]
    (expected_grad,) = torch.autograd.grad(expected, logp)
    assert torch.equal(loss, expected.detach()) and torch.equal(grad, expected_grad)


@pytest.mark.parametrize(("distill", "term", "weight"), [
    ("iw_reverse_kl", "iw", "lambda_iw"), ("reverse_kl_pg", "pg", "lambda_opd"),
])  # fmt: skip
def test_distill_swaps_only_the_teacher_term(distill: str, term: str, weight: str) -> None:
    cfg = AlgoConfig(distill=distill, lambda_iw=0.3, lambda_opd=0.2)  # type: ignore[arg-type]
    data = random_loss_inputs(6)
    loss, grad, metrics = _run(cfg, data)
    logp = data["logp"].clone().requires_grad_()
    t = _terms(cfg, data, logp, global_counts=False)
    expected = t["rl"] + cfg.beta_kl * t["kl"] + getattr(cfg, weight) * t[term]
    (expected_grad,) = torch.autograd.grad(expected, logp)
    assert torch.equal(loss, expected.detach()) and torch.equal(grad, expected_grad)
    assert torch.equal(metrics["loss/distill"], t[term].detach())
    assert "loss/opd" not in metrics and "opd/gate_mean" not in metrics
    assert {"opd/delta_mean", "opd/frac_delta_pos", "opd/token_frac"} <= set(metrics)
    # the other weight is not read
    other = {"lambda_iw": "lambda_opd", "lambda_opd": "lambda_iw"}[weight]
    changed = dataclasses.replace(cfg, **{other: 7.0})
    assert torch.equal(_run(changed, data)[0], loss)


def test_rlsd_reweights_the_policy_term_only_and_needs_update() -> None:
    cfg = AlgoConfig(advantage_reweight="rlsd", rlsd_decay_updates=40)
    data = random_loss_inputs(7)
    with pytest.raises(ValueError, match="update"):
        seed_loss(cfg, **data)
    loss, grad, metrics = _run(cfg, data, update=10)  # lam = 0.5 (1 - 10/40) = 0.375
    mask, has = data["mask"], data["opd_mask"][:, None]
    teacher = torch.where(mask & has, data["teacher_logp"], data["old_logp"])
    adv = rlsd_token_advantages(data["advantages"], data["old_logp"], teacher, mask, 0.375, 0.2)
    logp = data["logp"].clone().requires_grad_()
    rl = policy_loss(logp, data["old_logp"], adv, mask, cfg.clip_eps)[0]  # built first, as
    t = _terms(cfg, data, logp, global_counts=False)  # seed_loss does (same grad sum order)
    expected = rl + cfg.beta_kl * t["kl"] + cfg.lambda_opd * t["opd"]
    (expected_grad,) = torch.autograd.grad(expected, logp)
    assert torch.equal(loss, expected.detach()) and torch.equal(grad, expected_grad)
    assert metrics["rlsd/lambda"].item() == pytest.approx(0.375)
    assert not torch.equal(loss, _run(AlgoConfig(), data)[0])
    # rows without a teacher keep A: their factor is exactly 1 at any lam
    rows = ~data["opd_mask"]
    assert rows.any()
    a = torch.where(mask, data["advantages"][:, None], 0.0)
    assert torch.equal(adv[rows], a.expand_as(adv)[rows])
    # past the schedule (lam = 0) it is the default loss, bit for bit
    late, late_grad, _ = _run(cfg, data, update=40)
    base, base_grad, _ = _run(AlgoConfig(), data)
    assert torch.equal(late, base) and torch.equal(late_grad, base_grad)


def test_rlsd_metrics_hand_values() -> None:
    adv, old, teacher, mask = _rlsd_case()
    cfg = AlgoConfig(advantage_reweight="rlsd", beta_kl=0.0)
    data = {"old_logp": old, "teacher_logp": teacher, "advantages": adv, "mask": mask}
    _, metrics = seed_loss(cfg, old.clone(), **data, update=0)
    # weights from test_rlsd_token_advantages_hand_values: (1.1051709 + 1.2 + 0.8
    # + 0.9048374 + 0.8 + 1.2 + 3 * 1) / 9
    w_mean = (1.1051709 + 1.2 + 0.8 + 0.9048374 + 0.8 + 1.2 + 3.0) / 9
    assert metrics["rlsd/weight_mean"].item() == pytest.approx(w_mean, abs=1e-7)
    assert metrics["rlsd/lambda"].item() == 0.5


OPTIONS = {
    "iw_reverse_kl": {"distill": "iw_reverse_kl", "lambda_iw": 0.5},
    "reverse_kl_pg": {"distill": "reverse_kl_pg"},
    "rlsd": {"advantage_reweight": "rlsd"},
    "policy_weight_0": {"policy_weight": 0.0, "lambda_opd": 0.5},
}


@pytest.mark.parametrize("option", list(OPTIONS))
def test_each_option_keeps_the_micro_batch_contract(option: str) -> None:
    cfg = dataclasses.replace(AlgoConfig(beta_kl=0.1), **OPTIONS[option])
    data = random_loss_inputs(8)
    full, full_grad, full_m = _run(cfg, data, update=20)
    n, n_opd = count_tokens(data["mask"], data["opd_mask"])
    micro_logp = data["logp"].clone().requires_grad_()
    total, summed = 0.0, dict.fromkeys(full_m, 0.0)
    for rows in (slice(0, 1), slice(1, 4), slice(4, 8)):
        part = {k: v[rows] for k, v in data.items()}
        part["logp"] = micro_logp[rows]
        loss, m = seed_loss(cfg, **part, num_tokens=n, num_opd_tokens=n_opd, update=20)
        loss.backward()
        total += loss.item()
        summed = {k: summed[k] + m[k].item() for k in summed}
    assert total == pytest.approx(full.item(), abs=1e-6)
    torch.testing.assert_close(micro_logp.grad, full_grad, rtol=0, atol=1e-7)
    for key, value in full_m.items():
        assert summed[key] == pytest.approx(value.item(), abs=1e-6), key


@pytest.mark.parametrize("option", list(OPTIONS))
def test_each_option_ignores_masked_garbage(option: str) -> None:
    d = _garbage()
    cfg = dataclasses.replace(AlgoConfig(), **OPTIONS[option])
    logp = d["logp"].clone().requires_grad_()
    ref = torch.tensor([[-0.9, -float("inf"), -2.5, 50.0]])
    loss, metrics = seed_loss(cfg, logp, d["old"], d["adv"], d["mask"], ref, d["teacher"],
                              update=3)  # fmt: skip
    loss.backward()
    assert torch.isfinite(loss) and all(torch.isfinite(v) for v in metrics.values())
    assert logp.grad[0, 1] == 0 and logp.grad[0, 3] == 0 and torch.isfinite(logp.grad).all()


# ---------------------------------------------------------------- config


def test_config_accepts_checks_and_round_trips_the_new_fields() -> None:
    changes = {
        "policy_weight": 0.0,
        "distill": "iw_reverse_kl",
        "lambda_iw": 0.002,
        "advantage_reweight": "rlsd",
        "rlsd_lambda0": 1.0,
        "rlsd_decay_updates": 50,
        "rlsd_eps_w": 0.1,
    }
    cfg = SeedConfig().with_changes({"algo": changes})
    assert {k: getattr(cfg.algo, k) for k in changes} == changes
    assert SeedConfig.from_dict(cfg.to_dict()) == cfg
    bad = [
        ({"distill": "jsd"}, "algo.distill must be one of"),
        ({"advantage_reweight": "gigpo"}, "algo.advantage_reweight must be one of"),
        ({"policy_weight": -1.0}, "algo.policy_weight must be >= 0"),
        ({"rlsd_eps_w": 1.5}, r"algo.rlsd_eps_w must be in \[0, 1\]"),
        ({"rlsd_decay_updates": 0}, "algo.rlsd_decay_updates must be >= 1"),
        ({"use_opd": False, "distill": "reverse_kl_pg"}, "need algo.use_opd = true"),
        ({"use_opd": False, "advantage_reweight": "rlsd"}, "need algo.use_opd = true"),
        ({"use_opd": False, "policy_weight": 0.0, "beta_kl": 0.0}, "no loss term"),
    ]
    for change, message in bad:
        with pytest.raises(ConfigError, match=message):
            SeedConfig().with_changes({"algo": change})
