"""SEED's loss math: group advantages, clipped policy loss, KL penalty, OPD gate and loss.

Pure torch: no Megatron, no engine. Every token tensor is ``[b, s]`` (b sequences, s
positions, already aligned so that position i holds the log-prob of target token i; see
`megatron_seed.data.collate`). Per action token (q, n, t, l):

    l_theta  = logp           log pi_theta(a | h)            current weights, carries grad
    l_old    = old_logp       log pi_theta_old(a | h)        rollout snapshot, no grad
    l_ref    = ref_logp       log pi_ref(a | h)              fixed reference, no grad
    l_skill  = teacher_logp   log pi_theta(a | H(h, s))      skill in context, no grad
    m        = mask           1 on sampled action tokens, 0 on prompt/observation/skill/pad
    o        = opd_mask       1 where the trajectory's skill passed validation

    A_qn   = (R_qn - mu_q) / (sigma_q + eps)              sigma_q: population std of group q
    rho    = exp(l_theta - l_old)
    L_rl   = - sum m * min(rho A, clip(rho, 1-eps_c, 1+eps_c) A) / sum m
    KL     = sum m * k3(l_theta, l_ref) / sum m           k3 = exp(x) - x - 1, x = l_ref - l_theta
    Delta  = sg[l_skill - l_theta],   g = sigmoid(beta_opd * Delta)
    L_opd  = sum m o g (sg[l_skill] - l_theta) / sum m o  grad: -sum m o g d(l_theta) / sum m o
    L      = L_rl + beta_kl * KL + lambda_opd * L_opd     (paper Eq. for L_SEED; KL inside L_rl)

Global token mean. Every sum above runs over the whole global batch (all micro-batches,
all DP ranks, all PP micro-batches). Each function therefore takes an optional
``num_tokens`` (and ``num_opd_tokens``): the *global* denominator. A micro-batch returns
its partial sum divided by that global count, so summing the per-micro-batch values (and
all-reducing over DP) gives exactly the global masked mean, in value and in gradient,
whatever the split. With the default (``None``) the denominator is the count in the given
tensors, i.e. a plain masked mean. The logging statistics follow the same rule, so they
too can be summed over micro-batches. Caller's duty under Megatron: its schedule divides
each micro-batch loss by the number of micro-batches and DDP averages gradients over DP;
with these global denominators both must be undone (scale the returned loss by
num_microbatches * dp_size), or the sums fed to ``calculate_per_token_loss`` instead.

Where this departs from the paper (SEED, Sec. 3.3, Algorithm 1):
  1. L_opd is normalised by the number of tokens that carry OPD (m * o), not by all valid
     tokens: a trajectory whose skill failed validation gets no teacher signal (the
     reference code's rule) and does not dilute the others. Identical to the paper when
     every skill is valid.
  2. A group whose rewards are all equal gets an advantage of exactly 0 (float rounding in
     R - mu could otherwise leave ~1e-16 / eps). This is the paper's value, made exact.
  3. The k3 estimator is not clamped (verl clamps it to [-10, 10]); the paper states none.
  4. Positions with m = 0 are replaced by zeros before any exp/sigmoid, so padding garbage
     (inf, nan) can neither leak into the value nor produce NaN gradients.
  5. Clip fraction counts tokens whose clipped branch is strictly active (the min picks the
     clipped term, so the token's gradient is zero), as verl's ``pg_clipfrac``.
  6. A step whose rows carry no outcome signal (every A = 0) is not taken at all by the
     trainer under ``AlgoConfig.no_signal = "skip"`` (the default; "step" is the paper's):
     Adam normalises the gradient, so the KL and OPD terms alone would make an lr-sized
     step whatever beta_kl and lambda_opd are. The loss itself is unchanged.

Option (default off): ``AlgoConfig.loss_agg = "seq_mean_token_mean"`` averages L_rl over
sequences, each the mean of its own tokens (verl's loss_agg_mode of that name), by scaling
each row's advantage (`sequence_weights`); KL and L_opd keep the token mean.

Options for the paper's baselines (default off; equations in `megatron_seed.algo.baselines`):
``policy_weight`` scales L_rl (0, OPSD: L_rl leaves the loss), ``distill`` swaps
lambda_opd * L_opd for Skill-SD's lambda_iw * L_iw or original OPSD's lambda_opd * L_pg, and
``advantage_reweight = "rlsd"`` swaps A for RLSD's per-token A_hat. With the defaults
`seed_loss` runs exactly the operations above in the same order, so its loss and gradients
are bitwise those of the formula (the default job's results depend on float rounding).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import TYPE_CHECKING, Literal

import torch

from megatron_seed.algo._tokens import Count, _denominator, _masked
from megatron_seed.algo.baselines import (
    iw_reverse_kl,
    reverse_kl_pg,
    rlsd_lambda,
    rlsd_token_advantages,
    rlsd_weights,
)

if TYPE_CHECKING:
    from megatron_seed.config import AlgoConfig

KLKind = Literal["k1", "k2", "k3"]


def _row_mask(opd_mask: torch.Tensor | None, mask: torch.Tensor) -> torch.Tensor:
    """Tokens that carry OPD: mask & opd_mask, where opd_mask is [b] (per row) or [b, s]."""
    if opd_mask is None:
        return mask
    opd_mask = opd_mask.to(device=mask.device, dtype=torch.bool)
    if opd_mask.dim() == 1:  # [b] -> [b, 1]
        opd_mask = opd_mask.unsqueeze(-1)
    return mask & opd_mask


def count_tokens(
    mask: torch.Tensor, opd_mask: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(action tokens, OPD tokens) in these tensors; sum these over micro-batches and DP
    ranks to get the global ``num_tokens`` / ``num_opd_tokens`` for the loss functions."""
    mask = mask.to(torch.bool)
    return mask.sum().float(), _row_mask(opd_mask, mask).sum().float()


def group_advantages(
    rewards: torch.Tensor,
    group_ids: torch.Tensor | Sequence[Hashable],
    eps: float = 1e-6,
) -> torch.Tensor:
    """GRPO advantage per trajectory: (R - mu_q) / (sigma_q + eps), population std.

    rewards: [n]; group_ids: [n] ints, or any n hashables (e.g. group-id strings).
    Returns [n], same dtype as rewards. A group with tied rewards gets exactly 0.
    """
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be [n], got shape {tuple(rewards.shape)}")
    if not isinstance(group_ids, torch.Tensor):
        index: dict[Hashable, int] = {}
        group_ids = torch.tensor([index.setdefault(g, len(index)) for g in group_ids])
    if group_ids.shape != rewards.shape:
        raise ValueError(f"group_ids {tuple(group_ids.shape)} != rewards {tuple(rewards.shape)}")
    _, inverse = torch.unique(group_ids.to(rewards.device), return_inverse=True)  # [n]
    num_groups = int(inverse.max()) + 1 if inverse.numel() else 0
    r = rewards.double()  # [n]
    zeros = torch.zeros(num_groups, dtype=torch.float64, device=r.device)  # [g]
    count = zeros.index_add(0, inverse, torch.ones_like(r))  # [g]
    mean = zeros.index_add(0, inverse, r) / count  # [g]
    centered = r - mean[inverse]  # [n]
    std = (zeros.index_add(0, inverse, centered**2) / count).sqrt()  # [g]
    r_max = zeros.scatter_reduce(0, inverse, r, "amax", include_self=False)  # [g]
    r_min = zeros.scatter_reduce(0, inverse, r, "amin", include_self=False)  # [g]
    tied = (r_max == r_min)[inverse]  # [n]
    adv = torch.where(tied, torch.zeros_like(r), centered / (std[inverse] + eps))  # [n]
    return adv.to(rewards.dtype)


def policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_eps: float,
    num_tokens: Count | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Clipped surrogate: -sum m min(rho A, clip(rho) A) / num_tokens, rho = exp(logp - old).

    logp, old_logp, mask: [b, s]; advantages: [b, s] (broadcast to tokens) or [b].
    Returns (loss, clip_fraction); clip_fraction = sum m [clipped branch active] / num_tokens,
    detached. old_logp is treated as a constant.
    """
    mask = mask.to(torch.bool)
    if advantages.dim() == 1:  # [b] -> [b, 1]
        advantages = advantages.unsqueeze(-1)
    advantages = advantages.expand_as(logp).detach()  # [b, s]
    denom = _denominator(num_tokens, mask)
    log_ratio = _masked(logp, mask) - _masked(old_logp.detach(), mask)  # [b, s]
    ratio = torch.exp(log_ratio)  # [b, s]; 1 at masked positions
    unclipped = ratio * advantages  # [b, s]
    clipped = ratio.clamp(1.0 - clip_eps, 1.0 + clip_eps) * advantages  # [b, s]
    objective = torch.minimum(unclipped, clipped)  # [b, s]
    loss = -_masked(objective, mask).sum() / denom
    clip_active = (clipped < unclipped) & mask  # [b, s]
    clip_frac = clip_active.sum().float().detach() / denom
    return loss, clip_frac


def kl_penalty(
    logp: torch.Tensor,
    ref_logp: torch.Tensor,
    mask: torch.Tensor,
    kind: KLKind = "k3",
    num_tokens: Count | None = None,
) -> torch.Tensor:
    """Per-token KL(pi_theta || pi_ref) estimate, masked token mean over num_tokens.

    With x = ref_logp - logp: k1 = -x, k2 = x^2 / 2, k3 = exp(x) - x - 1 (>= 0, unbiased).
    logp, ref_logp, mask: [b, s]; ref_logp is treated as a constant.
    """
    mask = mask.to(torch.bool)
    x = _masked(ref_logp.detach(), mask) - _masked(logp, mask)  # [b, s]; 0 where masked
    if kind == "k1":
        per_token = -x
    elif kind == "k2":
        per_token = 0.5 * x**2
    elif kind == "k3":
        per_token = torch.exp(x) - x - 1.0
    else:
        raise ValueError(f"unknown KL kind {kind!r}; expected 'k1', 'k2' or 'k3'")
    return _masked(per_token, mask).sum() / _denominator(num_tokens, mask)


def opd_gate(student_logp: torch.Tensor, teacher_logp: torch.Tensor, beta: float) -> torch.Tensor:
    """g = sigmoid(beta * (teacher - student)), detached. Shapes: [b, s] -> [b, s]."""
    return torch.sigmoid(beta * (teacher_logp.detach() - student_logp.detach()))


def opd_loss(
    student_logp: torch.Tensor,
    teacher_logp: torch.Tensor,
    mask: torch.Tensor,
    beta: float,
    num_tokens: Count | None = None,
) -> torch.Tensor:
    """Gated sampled-token distillation: sum m g (sg[teacher] - student) / num_tokens.

    student_logp, teacher_logp, mask: [b, s]. `mask` must already be the OPD token mask
    (action mask & opd_mask); num_tokens is the global count of those tokens. The gradient
    reaches the student only: d/d(student) = -g * m / num_tokens.
    """
    mask = mask.to(torch.bool)
    student = _masked(student_logp, mask)  # [b, s]
    teacher = _masked(teacher_logp.detach(), mask)  # [b, s]
    gate = opd_gate(student, teacher, beta)  # [b, s]
    return _masked(gate * (teacher - student), mask).sum() / _denominator(num_tokens, mask)


def _opd_stats(
    logp: torch.Tensor,
    teacher_logp: torch.Tensor,
    opd_tokens: torch.Tensor,
    beta: float,
    denom: torch.Tensor,
    gate: bool = True,
) -> dict[str, torch.Tensor]:
    """Teacher-student gap (and, with `gate`, OPD gate) statistics over OPD tokens, each a
    partial sum / global OPD token count."""
    delta = _masked(teacher_logp.detach(), opd_tokens) - _masked(logp.detach(), opd_tokens)
    stats = {}
    if gate:
        stats["opd/gate_mean"] = _masked(torch.sigmoid(beta * delta), opd_tokens).sum() / denom
    stats["opd/delta_mean"] = _masked(delta, opd_tokens).sum() / denom
    stats["opd/frac_delta_pos"] = ((delta > 0) & opd_tokens).sum().float() / denom
    return stats


def sequence_weights(mask: torch.Tensor, num_tokens: torch.Tensor) -> torch.Tensor:
    """Per-row factors that turn L_rl's token mean into a mean over sequences of each
    sequence's token mean. The clipped term is positively homogeneous in A, so scaling row
    r's advantage by N / (R n_r) (N tokens and R non-empty rows in the mini-batch, n_r in
    row r) gives exactly (1/R) sum_r (1/n_r) sum_t min(rho A, clip(rho) A)."""
    per_row = mask.sum(-1).float()  # [m]
    rows = (per_row > 0).sum().float()
    return torch.where(per_row > 0, num_tokens / (rows * per_row.clamp(min=1.0)), 0.0)


def _plus(total: torch.Tensor | None, term: torch.Tensor) -> torch.Tensor:
    """total + term, where None is the empty sum (so no term is ever added as 0.0 + term)."""
    return term if total is None else total + term


def _rlsd_advantages(
    cfg: AlgoConfig,
    advantages: torch.Tensor,
    old_logp: torch.Tensor,
    teacher_logp: torch.Tensor | None,
    mask: torch.Tensor,
    opd_mask: torch.Tensor | None,
    denom: torch.Tensor,
    num_opd_tokens: Count | None,
    update: int | None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """RLSD's [b, s] advantages for this micro-batch, and their metrics (`baselines`)."""
    if update is None:
        raise ValueError(
            "advantage_reweight='rlsd' needs seed_loss(update=k), the 0-based index of this "
            "update, for its lambda schedule"
        )
    if teacher_logp is None:
        raise ValueError("advantage_reweight='rlsd' needs teacher_logp")
    lam = rlsd_lambda(update, cfg.rlsd_lambda0, cfg.rlsd_decay_updates)
    teacher_tokens = _row_mask(opd_mask, mask)  # [b, s]
    # a row without a teacher gets Delta_old = 0, so w = 1 and A_hat = A
    teacher = torch.where(teacher_tokens, teacher_logp, old_logp)  # [b, s]
    adv = rlsd_token_advantages(advantages, old_logp, teacher, mask, lam, cfg.rlsd_eps_w)
    w = rlsd_weights(advantages, old_logp, teacher, teacher_tokens, cfg.rlsd_eps_w)  # [b, s]
    metrics = {
        "rlsd/lambda": lam * mask.sum().float() / denom,  # sums to lam over micro-batches
        "rlsd/weight_mean": _masked(w, teacher_tokens).sum()
        / _denominator(num_opd_tokens, teacher_tokens),
    }
    return adv, metrics


def _distill(
    cfg: AlgoConfig,
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    teacher_logp: torch.Tensor,
    opd_tokens: torch.Tensor,
    opd_denom: torch.Tensor,
) -> tuple[float, torch.Tensor, dict[str, torch.Tensor]]:
    """(weight, term, metrics) of the configured teacher term over the OPD tokens."""
    if cfg.distill == "opd":
        opd = opd_loss(logp, teacher_logp, opd_tokens, cfg.beta_opd, opd_denom)
        return cfg.lambda_opd, opd, {"loss/opd": opd.detach()}
    if cfg.distill == "iw_reverse_kl":
        weight = cfg.lambda_iw
        term = iw_reverse_kl(logp, old_logp, teacher_logp, opd_tokens, opd_denom)
    elif cfg.distill == "reverse_kl_pg":
        weight = cfg.lambda_opd
        term = reverse_kl_pg(logp, teacher_logp, opd_tokens, opd_denom)
    else:
        raise ValueError(f"unknown distill {cfg.distill!r}")
    return weight, term, {"loss/distill": term.detach()}


def seed_loss(
    cfg: AlgoConfig,
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    ref_logp: torch.Tensor | None = None,
    teacher_logp: torch.Tensor | None = None,
    opd_mask: torch.Tensor | None = None,
    num_tokens: Count | None = None,
    num_opd_tokens: Count | None = None,
    update: int | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The joint objective L_rl + beta_kl * KL + lambda_opd * L_opd for one micro-batch.

    logp (grad), old_logp, ref_logp, teacher_logp, mask: [b, s]; advantages: [b] or [b, s];
    opd_mask: [b] or [b, s] (None: every row carries OPD). ref_logp may be None only when
    cfg.beta_kl == 0; teacher_logp may be None only when cfg.use_opd is False (plain GRPO).
    num_tokens / num_opd_tokens: global counts (see module docstring; `count_tokens`).
    update: the 0-based update index, needed only by advantage_reweight="rlsd".

    The baselines' options (`megatron_seed.algo.baselines`) change it to
    policy_weight * L_rl' + beta_kl * KL + D, where L_rl' uses RLSD's advantages when
    advantage_reweight="rlsd", D is the `distill` term (lambda_opd * L_opd,
    lambda_iw * L_iw or lambda_opd * L_pg), and policy_weight 0 leaves L_rl out of the
    loss (still reported, detached). With the defaults none of these branches runs.

    Returns (loss, metrics). Every metric is a detached 0-dim tensor normalised by the
    global count, so summing metrics over micro-batches and DP ranks gives global values.
    """
    mask = mask.to(torch.bool)
    denom = _denominator(num_tokens, mask)
    extra: dict[str, torch.Tensor] = {}
    if cfg.advantage_reweight == "rlsd":
        advantages, extra = _rlsd_advantages(
            cfg, advantages, old_logp, teacher_logp, mask, opd_mask, denom, num_opd_tokens, update
        )
    total: torch.Tensor | None = None
    if cfg.policy_weight != 0.0:
        rl, clip_frac = policy_loss(logp, old_logp, advantages, mask, cfg.clip_eps, denom)
        total = rl if cfg.policy_weight == 1.0 else cfg.policy_weight * rl
    else:  # OPSD: L_rl is reported but takes no part in the loss or its graph
        with torch.no_grad():
            rl, clip_frac = policy_loss(logp, old_logp, advantages, mask, cfg.clip_eps, denom)
    metrics = {"loss/policy": rl.detach(), "clip_frac": clip_frac, **extra}
    if cfg.beta_kl != 0.0:
        if ref_logp is None:
            raise ValueError("beta_kl != 0 needs ref_logp")
        kl = kl_penalty(logp, ref_logp, mask, cfg.kl_kind, denom)
        total = _plus(total, cfg.beta_kl * kl)
        metrics["kl"] = kl.detach()
    if cfg.use_opd:
        if teacher_logp is None:
            raise ValueError("use_opd=True needs teacher_logp (set use_opd=False for GRPO)")
        opd_tokens = _row_mask(opd_mask, mask)  # [b, s]
        opd_denom = _denominator(num_opd_tokens, opd_tokens)
        weight, term, distill_metrics = _distill(
            cfg, logp, old_logp, teacher_logp, opd_tokens, opd_denom
        )
        total = _plus(total, weight * term)
        metrics.update(distill_metrics)
        gate = cfg.distill == "opd"
        metrics.update(_opd_stats(logp, teacher_logp, opd_tokens, cfg.beta_opd, opd_denom, gate))
        metrics["opd/token_frac"] = opd_tokens.sum().float() / denom
    if total is None:
        raise ValueError("policy_weight=0 with beta_kl=0 and use_opd=False leaves no loss term")
    metrics["loss/total"] = total.detach()
    return total, metrics


def term_gradients(
    cfg: AlgoConfig,
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    ref_logp: torch.Tensor | None = None,
    teacher_logp: torch.Tensor | None = None,
    opd_mask: torch.Tensor | None = None,
    num_tokens: Count | None = None,
    num_opd_tokens: Count | None = None,
    update: int | None = None,
) -> dict[str, torch.Tensor]:
    """Each weighted term's gradient with respect to the sampled-token log-probs l_theta
    (what every parameter gradient flows through), ``[b, s]`` each: ``rl`` (policy_weight *
    L_rl, RLSD's advantages when set), ``kl`` (beta_kl * KL) and ``distill`` (the teacher
    term D); a term not in the loss is zeros. They add up to `seed_loss`'s gradient.
    Arguments as `seed_loss`'s; nothing here reaches the caller's graph."""
    x = logp.detach().requires_grad_(True)  # [b, s]
    mask = mask.to(torch.bool)
    denom = _denominator(num_tokens, mask)

    def grad(loss: torch.Tensor) -> torch.Tensor | None:  # [b, s]
        return torch.autograd.grad(loss, x)[0] if loss.requires_grad else None

    out: dict[str, torch.Tensor | None] = {"rl": None, "kl": None, "distill": None}
    with torch.enable_grad():
        if cfg.policy_weight != 0.0:
            adv = advantages
            if cfg.advantage_reweight == "rlsd":
                adv, _ = _rlsd_advantages(
                    cfg, advantages, old_logp, teacher_logp, mask, opd_mask, denom,
                    num_opd_tokens, update,
                )  # fmt: skip
            rl, _ = policy_loss(x, old_logp, adv, mask, cfg.clip_eps, denom)
            out["rl"] = grad(cfg.policy_weight * rl)
        if cfg.beta_kl != 0.0 and ref_logp is not None:
            out["kl"] = grad(cfg.beta_kl * kl_penalty(x, ref_logp, mask, cfg.kl_kind, denom))
        if cfg.use_opd and teacher_logp is not None:
            opd_tokens = _row_mask(opd_mask, mask)  # [b, s]
            opd_denom = _denominator(num_opd_tokens, opd_tokens)
            weight, term, _ = _distill(cfg, x, old_logp, teacher_logp, opd_tokens, opd_denom)
            out["distill"] = grad(weight * term)
    return {k: torch.zeros_like(x) if g is None else g for k, g in out.items()}


def term_grad_sq(*args, **kwargs) -> dict[str, torch.Tensor]:
    """How one step splits between the loss's terms: the squared L2 norms of
    `term_gradients` (same arguments), as ``grad_sq/rl``, ``grad_sq/kl`` and
    ``grad_sq/distill``. Squared norms over disjoint tokens add, so these sum over
    micro-batches and DP ranks like the other metrics (take the root of the total)."""
    return {f"grad_sq/{k}": g.pow(2).sum() for k, g in term_gradients(*args, **kwargs).items()}
