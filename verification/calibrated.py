"""Calibrated goodness-of-fit checks of a sampler against its exact law.

In the spirit of TensorFlow Probability's statistical testing: a check states
its false-fail rate ``alpha`` (probability of failing a correct sampler) and
the smallest discrepancy it is guaranteed, up to ``beta``, to detect; the
sample size is computed from those *before* sampling.

The test is Pearson's chi-square (or the G-test, its likelihood-ratio twin)
on the exact law's cells, with cells of expected count below
``min_expected`` merged into one bin.  Any sample that lands on a cell of
exact probability 0 fails the check outright.  One false-fail budget is
split over many checks with :func:`bonferroni` or :func:`holm`.

Power: if the sampler's true law ``p'`` is at total variation ``ε`` from the
exact law ``p`` on the (merged) bins, Cauchy–Schwarz gives
``Σ (p'_i − p_i)² / p_i ≥ (Σ |p'_i − p_i|)² = 4 ε²``, so the statistic is
asymptotically non-central chi-square with non-centrality at least
``λ = 4 N ε²``.  The sample size is the least ``N`` for which that
distribution exceeds the ``1 − alpha`` critical value with probability at
least ``1 − beta``.  (This relies on the usual asymptotic chi-square
approximation, which ``min_expected`` keeps sound.)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray
from scipy import optimize, stats


@dataclass(frozen=True)
class GofResult:
    """Outcome of one calibrated goodness-of-fit check."""

    passed: bool  # p_value >= alpha and no sample on a zero-probability cell
    statistic: float  # Pearson chi-square statistic on the merged bins
    dof: int  # degrees of freedom (merged bins - 1)
    p_value: float  # upper tail probability of the statistic under the exact law
    alpha: float  # false-fail rate the check was run at
    samples: int  # number of samples
    impossible: int  # samples that fell on exact-probability-0 cells
    statistic_kind: str = "pearson"  # "pearson" or "g"


def merge_bins(probs: NDArray[np.float64], samples: int, min_expected: float = 5.0) -> NDArray[np.int64]:
    """Bin label per positive cell: cells with expected count < ``min_expected`` share one bin.

    If the merged small bin is itself below ``min_expected`` it is folded into
    the smallest regular bin.  Returns labels ``0..B-1`` for each positive cell.
    """
    expected = probs * samples
    labels = np.zeros(probs.shape[0], dtype=np.int64)
    big = np.flatnonzero(expected >= min_expected)
    labels[big] = np.arange(big.shape[0])
    small = expected < min_expected
    if small.any():
        if expected[small].sum() >= min_expected or big.shape[0] == 0:
            labels[small] = big.shape[0]
        else:
            labels[small] = labels[big[np.argmin(expected[big])]]
    return labels


def _critical(dof: int, alpha: float) -> float:
    return float(stats.chi2.isf(alpha, dof))


#: The most samples one check may ask for: past it (a tiny ``tv``) the samples would not fit in memory
#: or time (``tv = 0.001`` at the suite's rate asked for 37.7 M samples, ``1e-6`` for 824 TiB).
MAX_CHECK_SAMPLES = 10**7


def required_samples(n_bins: int, tv: float, alpha: float, beta: float = 1e-3) -> int:
    """Least N that detects total variation ``tv`` with power ``1 − beta`` at level ``alpha``;
    ``ValueError`` when that is more than :data:`MAX_CHECK_SAMPLES` or ``alpha`` has no critical value."""
    n = _required(n_bins, tv, alpha, beta, MAX_CHECK_SAMPLES)
    if n is None:
        raise ValueError(f"detecting tv = {tv:g} at a false-fail rate of {alpha:.3g} per check needs more than "
                         f"{MAX_CHECK_SAMPLES:,} samples per check; raise tv (--tv)")
    return n


def _required(n_bins: int, tv: float, alpha: float, beta: float, limit: int) -> int | None:
    """:func:`required_samples`, or ``None`` above ``limit`` samples."""
    if not 0.0 < tv <= 1.0:
        raise ValueError(f"tv must be in (0, 1], got {tv}")
    if not 0.0 < beta < 1.0:
        raise ValueError(f"beta must be in (0, 1), got {beta}")
    dof = max(n_bins - 1, 1)
    crit = _critical(dof, alpha) if 0.0 < alpha < 1.0 else math.nan
    if not math.isfinite(crit):  # a rate that rounds to 0 (5e-324 split over the checks): the search never ended
        raise ValueError(f"the false-fail rate per check, {alpha!r}, has no chi-square critical value: give a larger "
                         f"rate (at least about 1e-300)")

    def miss(lam: float) -> float:
        return float(stats.ncx2.cdf(crit, dof, lam)) - beta

    top = 4.0 * tv * tv * (limit + 1)  # the non-centrality of limit + 1 samples
    hi = 1.0
    while miss(hi) > 0.0:
        if hi >= top:
            return None
        hi = min(2.0 * hi, top)
    lam = float(optimize.brentq(miss, 0.0, hi, xtol=1e-6))
    n = int(math.ceil(lam / (4.0 * tv * tv)))
    return n if n <= limit else None


def detectable_tv(n_bins: int, samples: int, alpha: float, beta: float = 1e-3) -> float:
    """Smallest total variation detected with power ``1 − beta`` by ``samples`` draws."""
    lo, hi = 1e-6, 1.0
    for _ in range(60):
        mid = math.sqrt(lo * hi)
        need = _required(n_bins, mid, alpha, beta, max(samples, 1))
        if need is not None and need <= samples:
            hi = mid
        else:
            lo = mid
    return hi


def chi_square_check(
    counts: NDArray[np.int64],
    probs: NDArray[np.float64],
    alpha: float,
    min_expected: float = 5.0,
    statistic: str = "pearson",
) -> GofResult:
    """Goodness of fit of ``counts`` against the exact law ``probs`` (same cells).

    ``statistic`` is ``"pearson"`` (chi-square) or ``"g"`` (G-test); both are
    asymptotically chi-square with (merged bins − 1) degrees of freedom.
    """
    if statistic not in ("pearson", "g"):
        raise ValueError(f"statistic must be 'pearson' or 'g', got {statistic!r}")
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    counts = np.asarray(counts, dtype=np.int64)
    probs = np.asarray(probs, dtype=np.float64)
    if counts.shape != probs.shape:
        raise ValueError(f"counts shape {counts.shape} differs from probs shape {probs.shape}")
    if (counts < 0).any():
        raise ValueError("counts must be non-negative")
    samples = int(counts.sum())
    zero = probs <= 0.0
    impossible = int(counts[zero].sum())
    pos = np.flatnonzero(~zero)
    labels = merge_bins(probs[pos], samples, min_expected)
    n_bins = int(labels.max()) + 1 if pos.size else 0
    obs = np.bincount(labels, weights=counts[pos], minlength=n_bins)
    exp = np.bincount(labels, weights=probs[pos], minlength=n_bins) * samples
    if n_bins <= 1 or samples == 0:
        stat, dof, p_value = 0.0, 0, 1.0
    else:
        if statistic == "pearson":
            stat = float(((obs - exp) ** 2 / exp).sum())
        else:
            seen = obs > 0
            stat = float(2.0 * (obs[seen] * np.log(obs[seen] / exp[seen])).sum())
        dof = n_bins - 1
        p_value = float(stats.chi2.sf(stat, dof))
    passed = impossible == 0 and p_value >= alpha
    return GofResult(passed, stat, dof, p_value, alpha, samples, impossible, statistic)


def bonferroni(alpha: float, checks: int) -> float:
    """Per-check false-fail rate that keeps the family's at most ``alpha``."""
    if checks < 1:
        raise ValueError(f"checks must be >= 1, got {checks}")
    return alpha / checks


def holm(p_values: Sequence[float], alpha: float) -> list[bool]:
    """Holm's step-down procedure: which hypotheses are rejected (family rate ``alpha``).

    Sort the p-values; reject while ``p_(i) < alpha / (m − i)``, stop at the
    first that is not.  Uniformly more powerful than Bonferroni at the same
    family-wise false-fail rate.
    """
    m = len(p_values)
    order = np.argsort(np.asarray(p_values, dtype=np.float64), kind="stable")
    rejected = [False] * m
    for rank, idx in enumerate(order):
        if p_values[idx] >= alpha / (m - rank):
            break
        rejected[int(idx)] = True
    return rejected
