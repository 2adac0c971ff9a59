"""The one home of the statistics a result is reported with: 95% intervals and the
paired t-test. Plain NumPy and ``math``, no metalearn import.

* :func:`mean_and_interval`: over evaluation episodes (hundreds of them): the normal
  approximation, ``1.96 * sample std / sqrt(n)``, as few-shot papers report.
* :func:`seed_interval`: across seeds (a few): Student's t,
  ``t(n-1) * sample std / sqrt(n)``.
* :func:`paired_difference`: two methods on the same episodes: the per-episode
  differences' mean, its t interval and the paired t-test's two-sided p-value.
"""

from __future__ import annotations

import math
from typing import Dict, Sequence

import numpy as np

Z_95 = 1.959963984540054
"""The two-sided 95% quantile of the normal distribution."""

# Two-sided 95% quantiles of Student's t with 1..30 degrees of freedom.
_T_975 = (12.706204736, 4.302652730, 3.182446305, 2.776445105, 2.570581836, 2.446911851,
          2.364624252, 2.306004135, 2.262157163, 2.228138852, 2.200985160, 2.178812830,
          2.160368656, 2.144786688, 2.131449546, 2.119905299, 2.109815578, 2.100922040,
          2.093024054, 2.085963447, 2.079613845, 2.073873068, 2.068657610, 2.063898562,
          2.059538553, 2.055529439, 2.051830516, 2.048407142, 2.045229642, 2.042272456)


def t_quantile_975(dof: int) -> float:
    """The 97.5% quantile of Student's t with ``dof`` degrees of freedom."""
    if dof < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {dof}")
    if dof <= len(_T_975):
        return _T_975[dof - 1]
    z = Z_95  # Cornish-Fisher expansion; error < 1e-4 beyond 30 degrees of freedom
    return z + (z**3 + z) / (4 * dof) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * dof**2)


def half_width(std: float, n: int, quantile: float) -> float:
    """A 95% interval's half-width, ``quantile * std / sqrt(n)``: the one formula both
    intervals use (``quantile``: :data:`Z_95` or ``t_quantile_975(n - 1)``)."""
    return quantile * std / math.sqrt(n)


def mean_and_interval(values: Sequence[float]) -> Dict[str, float]:
    """Mean and half-width of its 95% confidence interval (normal approximation,
    ``1.96 * sample std / sqrt(n)``, as few-shot papers report over >= 600 episodes).

    Returns:
      ``{"mean", "ci95", "std"}`` (``std``: the sample standard deviation).

    Raises:
      ValueError: fewer than 2 values.
    """
    values = np.asarray(values, dtype=np.float64)
    if values.size < 2:
        raise ValueError(f"need at least 2 values for an interval, got {values.size}")
    std = values.std(ddof=1)
    return {"mean": float(values.mean()),
            "ci95": float(half_width(std, values.size, Z_95)),
            "std": float(std)}


def seed_interval(values: Sequence[float]) -> Dict[str, float]:
    """Mean and 95% interval half-width across seeds: Student's t, since seeds are few
    (``t(n-1) * sample std / sqrt(n)``); ``ci95`` is NaN for a single value.

    Returns:
      ``{"mean", "ci95", "n"}``.

    Raises:
      ValueError: no values.
    """
    values = np.asarray(values, dtype=np.float64)
    if values.size == 0:
        raise ValueError("no values")
    if values.size == 1:
        return {"mean": float(values[0]), "ci95": math.nan, "n": 1}
    std = float(values.std(ddof=1))
    return {"mean": float(values.mean()), "n": int(values.size),
            "ci95": half_width(std, values.size, t_quantile_975(values.size - 1))}


# --- the paired t-test -----------------------------------------------------------------


def _beta_continued_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of the incomplete beta function (modified Lentz)."""
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 500):
        for numerator in (m * (b - m) * x / ((a - 1.0 + 2 * m) * (a + 2 * m)),
                          -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 1.0 + 2 * m))):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def _incomplete_beta(a: float, b: float, x: float) -> float:
    """The regularised incomplete beta function I_x(a, b) (Numerical Recipes' ``betai``)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
                     + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _beta_continued_fraction(a, b, x) / a
    return 1.0 - front * _beta_continued_fraction(b, a, 1.0 - x) / b


def t_two_sided_p(t: float, dof: int) -> float:
    """Two-sided p-value of Student's t statistic ``t`` with ``dof`` degrees of freedom."""
    if dof < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {dof}")
    if math.isinf(t):
        return 0.0
    return _incomplete_beta(dof / 2.0, 0.5, dof / (dof + t * t))


def paired_difference(a: Sequence[float], b: Sequence[float]) -> Dict[str, float]:
    """Paired comparison of two methods measured on the same episodes, in order.

    The per-episode differences ``a - b`` are averaged; their 95% interval is Student's
    t (``t(n-1) * sd / sqrt(n)``) and the p-value is the paired t-test's, two-sided
    (null: the same mean). Pairing removes the episodes' own difficulty from the
    comparison, so it resolves differences that two separate intervals cannot.

    Returns:
      ``{"mean_a", "mean_b", "difference", "ci95", "low", "high", "p_value", "n",
      "wins_a", "wins_b", "ties"}``.
    """
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"paired values must be two equally long lists, got {a.shape} and "
                         f"{b.shape}")
    if a.size < 2:
        raise ValueError(f"need at least 2 paired episodes, got {a.size}")
    d = a - b
    mean, sd, n = float(d.mean()), float(d.std(ddof=1)), int(d.size)
    half = half_width(sd, n, t_quantile_975(n - 1))
    if sd == 0.0:
        p = 1.0 if mean == 0.0 else 0.0
    else:
        p = t_two_sided_p(mean / (sd / math.sqrt(n)), n - 1)
    return {"mean_a": float(a.mean()), "mean_b": float(b.mean()), "difference": mean,
            "ci95": half, "low": mean - half, "high": mean + half, "p_value": p, "n": n,
            "wins_a": int((d > 0).sum()), "wins_b": int((d < 0).sum()),
            "ties": int((d == 0).sum())}
