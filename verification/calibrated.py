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
approximation, which ``min_expected`` keeps sound at ordinary rates.)

That bound is on the merged bins: a discrepancy inside a bin of several cells
is invisible to the statistic.  For a bin ``b`` of exact mass ``P_b``,
``Σ_{i∈b} |p'_i − p_i| ≤ |P'_b − P_b| + 2 P_b``, so a law at total variation
``ε`` on the cells is at least ``ε − m`` from the exact law on the bins, ``m``
the exact mass of the bins that hold more than one cell.
:func:`required_samples` sizes a check of ``n_bins`` unmerged bins;
:func:`chi_square_samples` sizes one for a given law, merging as the check
will at that size, so that the guarantee is on the cells.  (Sized by bins
alone, 68 samples of a uniform law on 16 cells, for ``ε = 0.5``, merged every
cell into one bin: the check could not fail.)  Cells far below the others
(``1e-12`` beside ``0.5``) are folded into a bin of a larger cell at every size
within reach, and mass moved between them is never seen; there the guarantee
can only be on the bins (``cover="bins"``), and :func:`kl_check`, which merges
nothing, is the test that covers every cell.  A sample that merges every
positive cell into one bin is refused by :func:`chi_square_check`.

That approximation is not a bound: at rates like ``1e-12`` a bin of a few
expected samples has a binomial tail thousands of times the chi-square's.
:func:`kl_check` is the finite-sample alternative, with no approximation in
either direction:

* **Level.** For ``N`` samples of a law ``p`` on ``k`` cells, Agrawal
  ("Finite-sample concentration of the multinomial in relative entropy",
  IEEE Trans. Inf. Theory 2020) bounds the moment generating
  function of ``D = KL(p̂ ‖ p)`` by a gamma law's, shape ``k − 1``, rate ``N``;
  Chernoff's bound then gives, for ``N·D``'s value ``s > k − 1``,
  ``P(N·D ≥ s) ≤ exp(−s) · (e·s / (k − 1))^(k − 1)``, for every ``p`` and ``N``.
  The check fails when that bound at the observed ``N·D`` is below ``alpha``,
  so its false-fail rate is at most ``alpha`` (:func:`kl_threshold`).
* **Power.** If the sampler's law ``p'`` (on the cells and any other outcome)
  is at total variation ``ε`` from ``p``: Pinsker gives ``D ≥ 2·TV(p̂, p)²``;
  ``TV(p̂, p) ≥ ε − TV(p̂, p')``; ``E‖p̂ − p'‖₁ ≤ √(k / N)`` (Cauchy–Schwarz on
  ``k + 1`` outcomes) and McDiarmid (one sample moves ``‖p̂ − p'‖₁`` by at
  most ``2/N``) bound ``‖p̂ − p'‖₁ ≤ √(k/N) + √(2 ln(1/β) / N)`` with
  probability ``≥ 1 − β``.  :func:`kl_required_samples` is the least ``N``
  for which ``2N·(ε − that/2)² > s``, a closed form.  It asks for 2–3 times
  the chi-square's :func:`required_samples` on a few cells and more on many
  (at ``alpha = 1e-3``: 2.3× for 2 cells, 3.2× for 10, 6.1× for 60), the price
  of a rate that holds exactly.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy import optimize, stats

from tmc.validate import check_int


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


def _merged_mass(probs: NDArray[np.float64], labels: NDArray[np.int64]) -> tuple[int, float]:
    """``(bins, m)``: how many bins ``labels`` forms and the exact mass of those holding more than one cell."""
    bins = int(labels.max()) + 1 if labels.size else 0
    cells = np.bincount(labels, minlength=bins)
    mass = np.bincount(labels, weights=probs, minlength=bins)
    return bins, float(mass[cells > 1].sum())


def _critical(dof: int, alpha: float) -> float:
    return float(stats.chi2.isf(alpha, dof))


#: The most samples one check may ask for: past it (a tiny ``tv``) the samples would not fit in memory
#: or time (``tv = 0.001`` at the suite's rate asked for 37.7 M samples, ``1e-6`` for 824 TiB).
MAX_CHECK_SAMPLES = 10**7


#: How far from 1 a law's sum may be (its own rounding); further is an unnormalised law, refused.
LAW_SUM_ATOL = 1e-6


def _check_law(name: str, probs: ArrayLike) -> NDArray[np.float64]:
    """``probs`` as a 1-D float law: finite, non-negative, summing to 1 within :data:`LAW_SUM_ATOL`."""
    try:
        law = np.asarray(probs, dtype=np.float64)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{name} must be a 1-D array of probabilities: {err}") from None
    if law.ndim != 1 or law.size == 0:
        raise ValueError(f"{name} must be a non-empty 1-D array of probabilities, got shape {law.shape}")
    if not np.isfinite(law).all() or (law < 0.0).any():
        bad = int(np.flatnonzero(~np.isfinite(law) | (law < 0.0))[0])
        raise ValueError(f"{name} must be finite and non-negative, got {float(law[bad])!r} at cell {bad}")
    total = math.fsum(law.tolist())
    if total <= 0.0:
        raise ValueError(f"{name} has no positive cell")
    if abs(total - 1.0) > LAW_SUM_ATOL:
        raise ValueError(f"{name} must sum to 1 (an exact law), got {total!r}")
    return law


def _check_counts(counts: ArrayLike, shape: tuple[int, ...]) -> NDArray[np.int64]:
    """``counts`` as integers, one per cell of a law of ``shape``: whole, non-negative numbers."""
    raw = np.asarray(counts)
    if raw.shape != shape:
        raise ValueError(f"counts shape {raw.shape} differs from probs shape {shape} (both 1-D, one entry a cell)")
    if raw.dtype == np.bool_ or not (np.issubdtype(raw.dtype, np.integer) or np.issubdtype(raw.dtype, np.floating)):
        raise ValueError(f"counts must be whole numbers, got dtype {raw.dtype}")
    if np.issubdtype(raw.dtype, np.floating) and not (np.isfinite(raw).all() and (raw == np.round(raw)).all()):
        raise ValueError("counts must be whole numbers (sample counts), got a fraction or a non-finite value")
    if (raw < 0).any():
        raise ValueError("counts must be non-negative")
    return raw.astype(np.int64)


def _check_rates(alpha: float | None, beta: float | None = None) -> None:
    """``ValueError`` unless the false-fail rate ``alpha`` and the miss rate ``beta`` (each where given) are in (0, 1)."""
    if alpha is not None and not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    if beta is not None and not 0.0 < beta < 1.0:
        raise ValueError(f"beta must be in (0, 1), got {beta}")


def required_samples(n_bins: int, tv: float, alpha: float, beta: float = 1e-3) -> int:
    """Least N that detects total variation ``tv`` on ``n_bins`` bins with power ``1 − beta`` at level ``alpha``;
    ``ValueError`` when that is more than :data:`MAX_CHECK_SAMPLES` or ``alpha`` has no critical value.

    The bins are those the check tests: where :func:`chi_square_check` will merge small cells, a
    discrepancy inside a merged bin is not covered; :func:`chi_square_samples` sizes a check for a law.
    """
    check_int("n_bins", n_bins, minimum=1)
    n = _required(n_bins, tv, alpha, beta, MAX_CHECK_SAMPLES)
    if n is None:
        raise ValueError(f"detecting tv = {tv:g} at a false-fail rate of {alpha:.3g} per check needs more than "
                         f"{MAX_CHECK_SAMPLES:,} samples per check; raise tv (--tv)")
    return n


def _required(n_bins: int, tv: float, alpha: float, beta: float, limit: int) -> int | None:
    """:func:`required_samples`, or ``None`` above ``limit`` samples."""
    if not 0.0 < tv <= 1.0:
        raise ValueError(f"tv must be in (0, 1], got {tv}")
    _check_rates(None, beta)
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


def _one_cell_samples(tv: float, beta: float) -> int:
    """One positive cell: only a sample off it fails a check, so the least ``N`` with ``(1 − tv)^N ≤ beta``."""
    return 1 if tv >= 1.0 else math.ceil(math.log(beta) / math.log1p(-tv))


def _one_cell_tv(samples: int, beta: float) -> float:
    """One positive cell: the least total variation that ``samples`` draws leave with probability ``≤ beta``."""
    return float(min(1.0, -math.expm1(math.log(beta) / samples)))


#: What :func:`chi_square_samples` sizes a check to cover: total variation on the law's cells, or on the bins
#: the check merges them into at that size.
COVERS: tuple[str, ...] = ("cells", "bins")


def chi_square_samples(probs: ArrayLike, tv: float, alpha: float, beta: float = 1e-3,
                       min_expected: float = 5.0, cover: str = "cells") -> int:
    """The least sample size ``N`` at which :func:`chi_square_check` detects, with power ``1 − beta`` at
    level ``alpha``, every sampler whose law is at total variation ``tv`` or more from ``probs``, on its
    cells (``cover="cells"``) or on the bins the check merges them into at ``N`` (``cover="bins"``).

    The check merges the cells of fewer than ``min_expected`` expected samples, and a discrepancy inside a
    merged bin is invisible (module doc).  ``"cells"``: ``N`` is the least at which the merged bins' power
    covers ``tv − m``, ``m`` the exact mass of the bins of several cells there; a law with cells far below
    ``min_expected / MAX_CHECK_SAMPLES`` beside a larger one may have no such ``N`` (``ValueError``).
    ``"bins"``: the least ``N`` at which the check has at least two bins and their power covers ``tv``.
    Either way the least such ``N`` within each range of sizes that merge alike, searched from small to
    large.  One positive cell: only a sample off it can fail the check, so ``N`` is the least with
    ``(1 − tv)^N ≤ beta``.  ``ValueError`` above :data:`MAX_CHECK_SAMPLES`.
    """
    if cover not in COVERS:
        raise ValueError(f"cover must be one of {', '.join(COVERS)}, got {cover!r}")
    law = _check_law("probs", probs)
    if not 0.0 < tv <= 1.0:
        raise ValueError(f"tv must be in (0, 1], got {tv}")
    _check_rates(alpha, beta)
    pos = law[law > 0.0]
    if pos.size == 1:
        n = _one_cell_samples(tv, beta)
        if n > MAX_CHECK_SAMPLES:
            raise ValueError(f"detecting tv = {tv:g} needs {n:,} samples, more than {MAX_CHECK_SAMPLES:,}; raise tv")
        return n
    # no size below the two-bin one can do (a check of one bin, or of several cells merged into one, has
    # nothing to test: in "cells" that bin's mass m is 1), and the need grows with the bins and with tv − m
    first = _required(2, tv, alpha, beta, MAX_CHECK_SAMPLES)
    n = MAX_CHECK_SAMPLES + 1 if first is None else first
    while n <= MAX_CHECK_SAMPLES:
        labels = merge_bins(pos, n, min_expected)
        bins, merged = _merged_mass(pos, labels)
        if cover == "bins":
            merged = 0.0 if bins >= 2 else 1.0
        need = _required_cached(bins, tv - merged, alpha, beta) if merged < tv else None
        if need is not None and need <= n:
            return n
        step = _next_merge_change(pos, n, min_expected)
        if need is not None and (step is None or need < step):
            n = need  # the same merging up to the next change: rechecked there
        elif step is None:  # no merging left (m = 0) and still too few: more than the limit
            break
        else:
            n = step
    hint = " (or cover the merged bins)" if cover == "cells" else ""
    raise ValueError(f"detecting tv = {tv:g} on the {cover} at a false-fail rate of {alpha:.3g} per check on this law "
                     f"needs more than {MAX_CHECK_SAMPLES:,} samples per check; raise tv (--tv){hint}")


@functools.lru_cache(maxsize=4096)
def _required_cached(n_bins: int, tv: float, alpha: float, beta: float) -> int | None:
    """:func:`_required` up to :data:`MAX_CHECK_SAMPLES` (the sizing of a suite asks for the same few many times)."""
    return _required(n_bins, tv, alpha, beta, MAX_CHECK_SAMPLES)


def _next_merge_change(pos: NDArray[np.float64], n: int, min_expected: float) -> int | None:
    """The least size above ``n`` at which :func:`merge_bins` may merge ``pos`` differently (``None``: never)."""
    small = pos * n < min_expected
    if not small.any():
        return None
    sizes = [min_expected / float(x) for x in pos[small]] + [min_expected / float(pos[small].sum())]
    out = []
    for size in sizes:
        m = int(math.ceil(size)) if size < 4.0 * MAX_CHECK_SAMPLES else 4 * MAX_CHECK_SAMPLES
        out.append(max(m, n + 1))
    return min(out)


def chi_square_detectable_tv(probs: ArrayLike, samples: int, alpha: float, beta: float = 1e-3,
                             min_expected: float = 5.0, cover: str = "cells") -> float:
    """Smallest total variation from ``probs`` that :func:`chi_square_check` on ``samples`` draws detects with
    probability ``1 − beta``, merging as the check does at that size: on the bins, :func:`detectable_tv` of
    their number; on the cells, that plus ``m``, the exact mass of the bins of several cells (at most 1).
    ``ValueError`` where the sample merges every positive cell into one bin (the check refuses it)."""
    if cover not in COVERS:
        raise ValueError(f"cover must be one of {', '.join(COVERS)}, got {cover!r}")
    law = _check_law("probs", probs)
    n = check_int("samples", samples, minimum=1)
    _check_rates(alpha, beta)
    pos = law[law > 0.0]
    if pos.size == 1:  # only a sample off the cell fails
        return _one_cell_tv(n, beta)
    bins, merged = _merged_mass(pos, merge_bins(pos, n, min_expected))
    if bins < 2:
        raise ValueError(f"{n} samples merge all {pos.size} positive cells into one bin: the check could not fail")
    return float(min(1.0, detectable_tv(bins, n, alpha, beta) + (merged if cover == "cells" else 0.0)))


def detectable_tv(n_bins: int, samples: int, alpha: float, beta: float = 1e-3) -> float:
    """Smallest total variation detected on ``n_bins`` unmerged bins with power ``1 − beta`` by ``samples`` draws."""
    check_int("n_bins", n_bins, minimum=1)
    check_int("samples", samples, minimum=1)
    _check_rates(alpha, beta)
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
    simulate: int = 0,
) -> GofResult:
    """Goodness of fit of ``counts`` against the exact law ``probs`` (same cells).

    ``statistic`` is ``"pearson"`` (chi-square) or ``"g"`` (G-test); both are
    asymptotically chi-square with (merged bins − 1) degrees of freedom.  With
    ``simulate = M > 0`` the p-value is instead the Monte Carlo one from ``M``
    samples of the same size drawn from ``probs`` itself,
    ``(1 + #{simulated statistic ≥ observed}) / (M + 1)``: no asymptotic
    approximation (at expected counts near 5 the chi-square tail gave twice
    the stated false-fail rate at 1e-4), so the rate is ``alpha`` up to the
    Monte Carlo error of the simulated tail (relative ``≈ 1/√(M α)``: 10% at
    ``M = 10^6``, ``alpha = 1e-4``).  The simulation is seeded, so the check
    is a fixed function of ``counts``.
    """
    if statistic not in ("pearson", "g"):
        raise ValueError(f"statistic must be 'pearson' or 'g', got {statistic!r}")
    simulate = check_int("simulate", simulate, minimum=0)
    _check_rates(alpha)
    probs = _check_law("probs", probs)
    counts = _check_counts(counts, probs.shape)
    samples = int(counts.sum())
    zero = probs <= 0.0
    impossible = int(counts[zero].sum())
    pos = np.flatnonzero(~zero)
    labels = merge_bins(probs[pos], samples, min_expected)
    n_bins = int(labels.max()) + 1 if pos.size else 0
    if n_bins <= 1 and pos.size > 1:
        raise ValueError(f"{samples} samples merge all {pos.size} positive cells into one bin (expected counts "
                         f"below {min_expected:g}): the check could not fail; size it with chi_square_samples")
    obs = np.bincount(labels, weights=counts[pos], minlength=n_bins).astype(np.float64)
    exp = np.bincount(labels, weights=probs[pos], minlength=n_bins).astype(np.float64) * samples
    if n_bins <= 1:  # one positive cell: only a sample off it fails
        stat, dof, p_value = 0.0, 0, 1.0
    else:
        stat = float(_gof_statistic(obs[None, :], exp, statistic)[0])
        dof = n_bins - 1
        if simulate:
            p_value = _simulated_p_value(stat, exp, samples, statistic, simulate)
        else:
            p_value = float(stats.chi2.sf(stat, dof))
    passed = impossible == 0 and p_value >= alpha
    return GofResult(passed, stat, dof, p_value, alpha, samples, impossible, statistic)


def _gof_statistic(obs: NDArray[np.float64], exp: NDArray[np.float64], statistic: str) -> NDArray[np.float64]:
    """Pearson's or the G statistic of each row of ``obs`` against the expected counts ``exp``."""
    if statistic == "pearson":
        out: NDArray[np.float64] = ((obs - exp) ** 2 / exp).sum(axis=1)
        return out
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(obs > 0, obs * np.log(obs / exp), 0.0)
    g: NDArray[np.float64] = 2.0 * terms.sum(axis=1)
    return g


#: Samples drawn at a time by :func:`_simulated_p_value` (bounds its memory: rows × bins integers).
SIMULATION_CHUNK = 200_000


def _simulated_p_value(stat: float, exp: NDArray[np.float64], samples: int, statistic: str, simulate: int) -> float:
    """Monte Carlo p-value of ``stat`` under the multinomial law ``exp / samples`` (seeded: reproducible)."""
    null = _null_statistics(exp.tobytes(), samples, statistic, simulate)
    tie = stat * (1.0 - 1e-12)  # a simulated statistic equal to the observed one in exact terms counts as above
    above = simulate - int(np.searchsorted(null, tie, side="left"))
    return (1 + above) / (simulate + 1)


@functools.lru_cache(maxsize=8)
def _null_statistics(exp_bytes: bytes, samples: int, statistic: str, simulate: int) -> NDArray[np.float64]:
    """``simulate`` statistics of samples drawn from the law itself, sorted (one simulation per law: the checks
    of one test module share their law)."""
    exp = np.frombuffer(exp_bytes, dtype=np.float64)
    rng = np.random.default_rng(0)
    law = exp / exp.sum()
    parts = []
    for start in range(0, simulate, SIMULATION_CHUNK):
        m = min(SIMULATION_CHUNK, simulate - start)
        parts.append(_gof_statistic(rng.multinomial(samples, law, size=m).astype(np.float64), exp, statistic))
    out: NDArray[np.float64] = np.sort(np.concatenate(parts))
    return out


def _kl_log_bound(s: float, k: int) -> float:
    """``log`` of Agrawal's bound on ``P(N·KL(p̂ ‖ p) ≥ s)`` for ``k`` cells; ``0`` (the bound 1) where ``s ≤ k − 1``."""
    if k <= 1:
        return -math.inf if s > 0.0 else 0.0  # one cell: KL is 0 for every sample
    if s <= k - 1:
        return 0.0
    return -s + (k - 1) * (1.0 + math.log(s / (k - 1)))


def kl_threshold(cells: int, alpha: float) -> float:
    """The value of ``N·KL(p̂ ‖ p)`` at which :func:`kl_check` fails, for ``cells`` positive cells.

    The ``s > k − 1`` that solves ``exp(−s) (e s / (k − 1))^(k − 1) = alpha``
    (``0`` for one cell, whose KL is always 0).  It does not depend on ``N``.
    """
    k = check_int("cells", cells, minimum=1)
    _check_rates(alpha)
    if k == 1:
        return 0.0
    log_alpha = math.log(alpha)
    lo, hi = float(k - 1), float(k - 1) + 1.0
    while _kl_log_bound(hi, k) > log_alpha:  # the bound falls for s > k - 1
        hi *= 2.0
    return float(optimize.brentq(lambda s: _kl_log_bound(s, k) - log_alpha, lo, hi, xtol=1e-12, rtol=1e-14))


def kl_required_samples(cells: int, tv: float, alpha: float, beta: float = 1e-3) -> int:
    """Least ``N`` with which :func:`kl_check` at level ``alpha`` fails, with probability at least
    ``1 − beta``, any sampler whose law is at total variation ``tv`` or more from the exact law on
    ``cells`` positive cells (mass off them counts).  ``ValueError`` above :data:`MAX_CHECK_SAMPLES`."""
    k = check_int("cells", cells, minimum=1)
    if not 0.0 < tv <= 1.0:
        raise ValueError(f"tv must be in (0, 1], got {tv}")
    _check_rates(alpha, beta)
    if k == 1:  # any sample off the one cell fails: miss only if all N land on it
        n = _one_cell_samples(tv, beta)
    else:
        n = math.floor((_kl_margin(k, alpha, beta) / tv) ** 2) + 1  # sqrt(N) tv strictly above the margin
    if n > MAX_CHECK_SAMPLES:
        raise ValueError(f"detecting tv = {tv:g} at a false-fail rate of {alpha:.3g} per check needs {n:,} samples, "
                         f"more than {MAX_CHECK_SAMPLES:,} per check; raise tv (--tv)")
    return n


def kl_detectable_tv(cells: int, samples: int, alpha: float, beta: float = 1e-3) -> float:
    """Smallest total variation that :func:`kl_check` on ``samples`` draws detects with probability ``1 − beta``."""
    k = check_int("cells", cells, minimum=1)
    n = check_int("samples", samples, minimum=1)
    _check_rates(alpha, beta)
    if k == 1:
        return _one_cell_tv(n, beta)
    return float(min(1.0, _kl_margin(k, alpha, beta) / math.sqrt(n)))


def _kl_margin(k: int, alpha: float, beta: float) -> float:
    """``sqrt(N)·tv`` must exceed this for power ``1 − beta`` (module doc): ``sqrt(t/2)`` for the threshold
    ``t``, plus half of ``sqrt(k) + sqrt(2 ln(1/beta))``, the bound on ``sqrt(N)·‖p̂ − p'‖₁``."""
    return math.sqrt(kl_threshold(k, alpha) / 2.0) + (math.sqrt(k) + math.sqrt(2.0 * math.log(1.0 / beta))) / 2.0


def kl_check(counts: NDArray[np.int64], probs: NDArray[np.float64], alpha: float) -> GofResult:
    """Finite-sample goodness of fit of ``counts`` against the exact law ``probs`` (same cells).

    Statistic ``N·KL(p̂ ‖ p)`` over the positive cells (no merging: the bound
    holds for any cell probabilities); ``p_value`` is Agrawal's upper bound on
    its tail at the observed value (a conservative p-value), and the check
    fails when it is below ``alpha`` or any sample is on a cell of probability
    0.  The false-fail rate is at most ``alpha`` for every ``N``.
    """
    _check_rates(alpha)
    probs = _check_law("probs", probs)
    counts = _check_counts(counts, probs.shape)
    samples = int(counts.sum())
    zero = probs <= 0.0
    impossible = int(counts[zero].sum())
    k = int((~zero).sum())
    seen = (counts > 0) & ~zero
    if samples == 0:
        stat = 0.0
    else:
        law = probs / probs[~zero].sum()  # the exact law's own rounding is not a discrepancy
        freq = counts[seen] / samples
        stat = float(max(0.0, samples * (freq * np.log(freq / law[seen])).sum()))
    p_value = float(math.exp(_kl_log_bound(stat, k)))
    passed = impossible == 0 and p_value >= alpha
    return GofResult(passed, stat, k - 1, p_value, alpha, samples, impossible, "kl-bound")


def bonferroni(alpha: float, checks: int) -> float:
    """Per-check false-fail rate that keeps the family's at most ``alpha``."""
    _check_rates(alpha)
    return alpha / check_int("checks", checks, minimum=1)


def holm(p_values: Sequence[float], alpha: float) -> list[bool]:
    """Holm's step-down procedure: which hypotheses are rejected (family rate ``alpha``).

    Sort the p-values; reject while ``p_(i) < alpha / (m − i)``, stop at the
    first that is not.  Uniformly more powerful than Bonferroni at the same
    family-wise false-fail rate.
    """
    _check_rates(alpha)
    values = np.asarray(p_values, dtype=np.float64)
    if values.ndim != 1:
        raise ValueError(f"p_values must be a sequence of numbers, got shape {values.shape}")
    outside = np.flatnonzero(~((values >= 0.0) & (values <= 1.0)))
    if outside.size:
        raise ValueError(f"p_values must lie in [0, 1], got {float(values[outside[0]])!r} at index {int(outside[0])}")
    m = len(values)
    order = np.argsort(values, kind="stable")
    rejected = [False] * m
    for rank, idx in enumerate(order):
        if values[idx] >= alpha / (m - rank):
            break
        rejected[int(idx)] = True
    return rejected
