"""Analyzer staleness (the paper's Proposition 3), measured: how much the teacher signal
changes when the skill comes from an analyzer one or more updates old.

For an action token v in context c of a trajectory, the current policy pi_k scores it under
the ordinary history and under the history with a skill inserted by H:

    Delta_{k,r}   = log pi_k(v | H(c, s_r)) - log pi_k(v | c)     s_r: the analyzer of update r
    g_{k,r}       = sigmoid(beta_opd * Delta_{k,r})                 the OPD gate

With one-step-off updates the skill of a trajectory trained at update k comes from the
analyzer of update j = k - 1 (the weights that played it); the synchronized analyzer would
have used the weights of update k. Over a sample of action tokens:

    delta_abs_mean = E |Delta_{k,k} - Delta_{k,j}|
    gate_abs_mean  = E |g_{k,k} - g_{k,j}|
    bound          = beta_opd / 4 * delta_abs_mean      (Eq. 14: gate_abs_mean <= bound,
                                                        sigmoid(beta z) is beta/4-Lipschitz)

G * gate_abs_mean bounds the change of the expected OPD gradient (G: a bound on the score
function's norm), so these numbers say how far a stale analyzer moves the auxiliary
gradient. With no lag (j = k) the synchronized analyzer is the one that made the skill and
every quantity is 0.
"""

from __future__ import annotations

import torch


def staleness_metrics(
    student: torch.Tensor, teacher_stale: torch.Tensor, teacher_fresh: torch.Tensor, beta: float
) -> dict[str, float]:
    """Proposition 3's quantities over n action tokens.

    student, teacher_stale, teacher_fresh: [n] log-probs of the same tokens under pi_k
    without a skill, with the stale analyzer's skill and with the synchronized one's.
    Returns ``staleness/delta_abs_mean``, ``staleness/gate_abs_mean``, ``staleness/bound``
    and ``staleness/tokens``.
    """
    if not (student.shape == teacher_stale.shape == teacher_fresh.shape) or student.dim() != 1:
        raise ValueError("staleness_metrics needs three [n] tensors of the same tokens")
    n = student.numel()
    if n == 0:
        return {"staleness/tokens": 0.0}
    d_stale = teacher_stale.double() - student.double()  # [n]
    d_fresh = teacher_fresh.double() - student.double()  # [n]
    delta = (d_fresh - d_stale).abs().mean().item()
    gate = (torch.sigmoid(beta * d_fresh) - torch.sigmoid(beta * d_stale)).abs().mean().item()
    return {
        "staleness/delta_abs_mean": delta,
        "staleness/gate_abs_mean": gate,
        "staleness/bound": beta / 4 * delta,
        "staleness/tokens": float(n),
    }
