"""Uncertainty of comparisons: 95 % intervals and "is it distinguishable?".

- ``t_interval(values)``: mean over seeds and the half-width of Student's t interval,
  ``t_{0.975, n-1} * s / sqrt(n)`` with ``s`` the sample (n - 1) standard deviation.
- ``wilson(k, n)``: Wilson's score interval of one rate (a single seed: the episodes are the
  samples), ``(p + z^2/2n +- z sqrt(p(1-p)/n + z^2/4n^2)) / (1 + z^2/n)``.
- ``paired_difference(a, b)``: the t interval of the per-seed differences ``a_i - b_i``.
  Methods of one comparison share each seed's base policy, games and evaluation draws, so a
  paired interval is the honest one; a difference whose interval holds 0 is marked as not
  distinguishable from noise.

The t quantiles are tabulated (two-sided 95 %, from the standard tables) so that comparisons
need no statistics package.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

Z95 = 1.959963984540054  # the normal distribution's 0.975 quantile
_T95 = {  # degrees of freedom -> t_{0.975}
    1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306,
    9: 2.262, 10: 2.228, 11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120,
    17: 2.110, 18: 2.101, 19: 2.093, 20: 2.086, 25: 2.060, 30: 2.042, 40: 2.021, 60: 2.000,
    120: 1.980,
}  # fmt: skip


def t95(df: int) -> float:
    """Student's two-sided 95 % quantile for ``df`` degrees of freedom (the table's next
    smaller entry between tabulated values: conservative; the normal's beyond 120)."""
    if df < 1:
        raise ValueError(f"need at least one degree of freedom, got {df}")
    if df > 120:
        return Z95
    return _T95[max(k for k in _T95 if k <= df)]


def t_interval(values: Sequence[float]) -> tuple[float, float]:
    """(mean, half-width of the 95 % t interval); the half-width is nan for one value."""
    if not values:
        raise ValueError("no values")
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, math.nan
    return mean, t95(len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))


def wilson(k: int, n: int) -> tuple[float, float]:
    """Wilson's 95 % score interval (low, high) of ``k`` successes in ``n`` trials."""
    if n < 1 or not 0 <= k <= n:
        raise ValueError(f"need 0 <= k <= n and n >= 1, got k={k}, n={n}")
    p, z2 = k / n, Z95 * Z95
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = Z95 * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def paired_difference(a: Sequence[float], b: Sequence[float]) -> tuple[float, float, bool]:
    """(mean difference, 95 % half-width, distinguishable) of ``a - b`` paired by seed.

    Distinguishable: the interval excludes 0 (needs at least two seeds)."""
    if len(a) != len(b):
        raise ValueError(f"paired values need the same seeds: {len(a)} vs {len(b)}")
    diffs = [x - y for x, y in zip(a, b, strict=True)]
    mean, half = t_interval(diffs)
    if math.isnan(half):
        return mean, half, False
    return mean, half, abs(mean) > half
