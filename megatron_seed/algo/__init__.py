"""Pure tensor math of SEED: advantages, clipped policy loss, KL, OPD gate and loss.

See `megatron_seed.algo.losses` for the equations and where the code departs from the paper.
"""

from megatron_seed.algo.losses import (
    count_tokens,
    group_advantages,
    kl_penalty,
    opd_gate,
    opd_loss,
    policy_loss,
    seed_loss,
    sequence_weights,
)

__all__ = [
    "count_tokens",
    "group_advantages",
    "kl_penalty",
    "opd_gate",
    "opd_loss",
    "policy_loss",
    "seed_loss",
    "sequence_weights",
]
