"""Uncertainty of comparisons: 95 % intervals and "is it distinguishable?".

- ``t_interval(values)``: mean over seeds and the half-width of Student's t interval,
  ``t_{0.975, n-1} * s / sqrt(n)`` with ``s`` the sample (n - 1) standard deviation.
- ``wilson(k, n)``: Wilson's score interval of one rate (a single seed: the episodes are the
  samples), ``(p + z^2/2n +- z sqrt(p(1-p)/n + z^2/4n^2)) / (1 + z^2/n)``.
- ``paired_difference(a, b)``: the t interval of the per-seed differences ``a_i - b_i``.
  Methods of one comparison share each seed's base policy, games and evaluation draws, so a
  paired interval is the honest one; a difference whose interval holds 0 is marked as not
  distinguishable from noise.

- ``tost(diffs, margin)``: two one-sided tests at 5 % each: the paired mean difference
  lies within +-margin when its 90 % t interval does (Schuirmann's TOST); what a "no
  difference" claim needs besides an interval that holds 0.
- ``seeds_for_power(sd, delta)``: the fewest seeds for which a two-sided 5 % paired t test
  has 80 % power against a true difference delta, by the usual approximation
  ``n >= ((t_{0.975, n-1} + t_{0.80, n-1}) sd / delta)^2``.

The t quantiles are tabulated (from the standard tables) so that comparisons need no
statistics package.
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


_T90 = {  # degrees of freedom -> t_{0.95} (one-sided 5 %: the 90 % two-sided interval)
    1: 6.314, 2: 2.920, 3: 2.353, 4: 2.132, 5: 2.015, 6: 1.943, 7: 1.895, 8: 1.860,
    9: 1.833, 10: 1.812, 11: 1.796, 12: 1.782, 13: 1.771, 14: 1.761, 15: 1.753, 16: 1.746,
    17: 1.740, 18: 1.734, 19: 1.729, 20: 1.725, 25: 1.708, 30: 1.697, 40: 1.684, 60: 1.671,
    120: 1.658,
}  # fmt: skip
_T80 = {  # degrees of freedom -> t_{0.80} (80 % power)
    1: 1.376, 2: 1.061, 3: 0.978, 4: 0.941, 5: 0.920, 6: 0.906, 7: 0.896, 8: 0.889,
    9: 0.883, 10: 0.879, 11: 0.876, 12: 0.873, 13: 0.870, 14: 0.868, 15: 0.866, 16: 0.865,
    17: 0.863, 18: 0.862, 19: 0.861, 20: 0.860, 25: 0.856, 30: 0.854, 40: 0.851, 60: 0.848,
    120: 0.845,
}  # fmt: skip
_LIMITS = {id(_T95): Z95, id(_T90): 1.6448536269514722, id(_T80): 0.8416212335729143}


def _quantile(table: dict[int, float], df: int) -> float:
    """A tabulated quantile: the next smaller tabulated df (conservative), the normal's
    beyond 120."""
    if df < 1:
        raise ValueError(f"need at least one degree of freedom, got {df}")
    if df > 120:
        return _LIMITS[id(table)]
    return table[max(k for k in table if k <= df)]


def tost(diffs: Sequence[float], margin: float) -> tuple[float, float, float, bool]:
    """(mean, low, high, equivalent): the 90 % t interval of the paired differences and
    whether it lies inside (-margin, +margin) (both one-sided 5 % tests reject)."""
    if len(diffs) < 2:
        raise ValueError("a TOST needs at least two paired differences")
    mean = statistics.fmean(diffs)
    half = _quantile(_T90, len(diffs) - 1) * statistics.stdev(diffs) / math.sqrt(len(diffs))
    low, high = mean - half, mean + half
    return mean, low, high, -margin < low and high < margin


def seeds_for_power(sd: float, delta: float, max_seeds: int = 200) -> int:
    """The fewest seeds (>= 2) at which a paired two-sided 5 % t test detects a true mean
    difference ``delta`` with 80 % power, paired differences of standard deviation ``sd``."""
    if sd < 0 or delta <= 0:
        raise ValueError(f"need sd >= 0 and delta > 0, got {sd} and {delta}")
    for n in range(2, max_seeds + 1):
        df = n - 1
        if (_quantile(_T95, df) + _quantile(_T80, df)) * sd / delta <= math.sqrt(n):
            return n
    raise ValueError(f"more than {max_seeds} seeds for sd {sd} and delta {delta}")


def t95(df: int) -> float:
    """Student's two-sided 95 % quantile for ``df`` degrees of freedom (the table's next
    smaller entry between tabulated values: conservative; the normal's beyond 120)."""
    return _quantile(_T95, df)


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
