"""The calibrated statistics themselves: false-fail rate, power, merging, multiple tests."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from verification.calibrated import (
    bonferroni,
    chi_square_check,
    chi_square_detectable_tv,
    chi_square_samples,
    detectable_tv,
    holm,
    kl_check,
    kl_detectable_tv,
    kl_required_samples,
    kl_threshold,
    merge_bins,
    required_samples,
)
from verification.calibrated import MAX_CHECK_SAMPLES

LAW = np.array([0.4, 0.25, 0.15, 0.1, 0.06, 0.03, 0.01])


def _shift(law, tv, src, dst):
    out = law.copy()
    out[src] -= tv
    out[dst] += tv
    return out


@pytest.mark.parametrize("statistic", ["pearson", "g"])
def test_measured_false_fail_rate_is_at_most_alpha(statistic):
    # A correct sampler (multinomial from the exact law) over 4000 seeds at
    # alpha = 0.05 must fail at most about 5% of the time.  The assertion uses
    # the binomial upper 1e-9 quantile, so this test itself fails with
    # probability < 1e-9 when the check is exactly calibrated; with the checks'
    # true rates at n = 2000 (0.0502 Pearson, 0.0504 G: asymptotic tests) it is
    # 1.1e-9 and 1.6e-9 (a statistics audit of 2026-11-28).
    alpha, runs, n = 0.05, 4000, 2000
    rng = np.random.default_rng(123)
    fails = sum(
        not chi_square_check(rng.multinomial(n, LAW), LAW, alpha, statistic=statistic).passed for _ in range(runs)
    )
    bound = stats.binom.isf(1e-9, runs, alpha)
    assert fails <= bound, (fails, bound)
    assert fails >= stats.binom.ppf(1e-9, runs, alpha * 0.5), "suspiciously conservative"


@pytest.mark.parametrize("statistic", ["pearson", "g"])
@pytest.mark.parametrize(("src", "dst"), [(0, 6), (1, 2), (3, 5)])
def test_negative_control_off_by_detectable_tv_fails(statistic, src, dst):
    # Sampler off by exactly TV = 0.05; the computed sample size guarantees
    # detection with probability >= 1 - 1e-3 per seed; all 10 fixed seeds fail.
    tv, alpha = 0.05, 1e-9
    bad = _shift(LAW, tv, src, dst)
    n = required_samples(len(LAW), tv, alpha)
    for seed in range(10):
        counts = np.random.default_rng(seed).multinomial(n, bad)
        assert not chi_square_check(counts, LAW, alpha, statistic=statistic).passed


@pytest.mark.parametrize("statistic", ["pearson", "g"])
@pytest.mark.parametrize("tv", [0.1, 0.05, 0.02])
def test_power_claim_holds_at_its_worst_case_alternative(statistic, tv):
    """The sample size rests on ``Σ (p'_i − p_i)² / p_i ≥ 4 tv²`` (Cauchy–Schwarz), which is an equality
    when ``|p'_i − p_i| ∝ p_i``: the cells split into two halves of mass 1/2 (here {0.4, 0.1} and the rest),
    one scaled by ``1 + 2 tv`` and the other by ``1 − 2 tv``.  That sampler is the hardest to catch at that
    tv, and its measured miss rate over 4000 seeds must be about ``beta``: at most ``1.1 beta`` (the claim
    is asymptotic: 40,000 seeds measured 0.095–0.103 at beta = 0.1) and at least ``0.8 beta`` (the bound is
    attained, so the worst case is the one tested).  Each side is a binomial 1e-9 quantile, so the test
    fails a claim that holds with probability < 2e-9; a true miss rate of 1.5 beta fails it with
    probability ≈ 0.95.  The fixed-shift controls above are far from this worst case."""
    alpha, beta, runs = 1e-3, 0.1, 4000
    up = np.isin(np.arange(len(LAW)), [0, 3])
    assert LAW[up].sum() == pytest.approx(0.5, abs=1e-15)
    worst = np.where(up, LAW * (1 + 2 * tv), LAW * (1 - 2 * tv))
    assert 0.5 * np.abs(worst - LAW).sum() == pytest.approx(tv, rel=1e-12)
    n = required_samples(len(LAW), tv, alpha, beta)
    rng = np.random.default_rng(2024)
    misses = sum(chi_square_check(rng.multinomial(n, worst), LAW, alpha, statistic=statistic).passed
                 for _ in range(runs))
    assert stats.binom.ppf(1e-9, runs, 0.8 * beta) <= misses <= stats.binom.isf(1e-9, runs, 1.1 * beta), (n, misses)


def test_zero_probability_sample_is_a_hard_failure():
    law = np.array([0.5, 0.5, 0.0])
    result = chi_square_check(np.array([500, 499, 1]), law, 1e-9)
    assert not result.passed and result.impossible == 1
    assert result.p_value > 0.5  # the statistic alone would have passed


def test_small_cells_are_merged():
    labels = merge_bins(np.array([0.5, 0.3, 0.1, 0.05, 0.03, 0.02]), 100, 5.0)
    assert labels.tolist() == [0, 1, 2, 3, 4, 4]  # 3 + 2 expected merge into one bin of 5
    labels = merge_bins(np.array([0.9, 0.06, 0.04]), 100, 5.0)
    assert labels.tolist() == [0, 1, 1]  # 4 alone is too small: folded into the smallest regular bin


def test_required_samples_grows_as_tv_shrinks_and_alpha_tightens():
    assert required_samples(5, 0.05, 1e-9) < required_samples(5, 0.025, 1e-9)
    assert required_samples(5, 0.05, 1e-3) < required_samples(5, 0.05, 1e-9)
    n = required_samples(8, 0.04, 1e-9)
    assert detectable_tv(8, n, 1e-9) <= 0.04 * 1.01


def test_required_samples_is_bounded_and_needs_a_critical_value():
    """A rate that rounds to 0 left the search for the non-centrality looping for ever; a tiny tv asked for
    more samples than memory holds (824 TiB at 1e-6).  Both are refused; detectable_tv still answers."""
    for alpha in (0.0, 5e-324 / 273):
        with pytest.raises(ValueError, match="has no chi-square critical value"):
            required_samples(10, 0.05, alpha)
    with pytest.raises(ValueError, match="more than 10,000,000 samples per check; raise tv"):
        required_samples(10, 1e-3, 1e-9 / 273)
    assert required_samples(10, 0.01, 1e-9 / 273) <= MAX_CHECK_SAMPLES
    assert detectable_tv(10, 100, 1e-9) > 0.1


def test_holm_rejects_step_down_and_dominates_bonferroni():
    p = [0.001, 0.013, 0.02, 0.9]
    # alpha = 0.05: 0.001 < 0.05/4; 0.013 < 0.05/3; 0.02 < 0.05/2; 0.9 >= 0.05.
    assert holm(p, 0.05) == [True, True, True, False]
    bonf = [pv < bonferroni(0.05, len(p)) for pv in p]
    assert bonf == [True, False, False, False]
    assert all(h or not b for h, b in zip(holm(p, 0.05), bonf))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(counts=np.array([1, 2]), probs=np.array([0.5, 0.3, 0.2]), alpha=0.01), "shape"),
        (dict(counts=np.array([1, 2]), probs=np.array([0.5, 0.5]), alpha=0.0), "alpha"),
        (dict(counts=np.array([1, -2]), probs=np.array([0.5, 0.5]), alpha=0.1), "non-negative"),
        (dict(counts=np.array([1, 2]), probs=np.array([0.5, 0.5]), alpha=0.1, statistic="x"), "statistic"),
        (dict(counts=np.array([1, 2]), probs=np.array([0.5, 0.5]), alpha=0.1, simulate=-1), "simulate"),
        (dict(counts=np.array([1, 2]), probs=np.array([0.5, 0.5]), alpha=0.1, simulate=2.5), "simulate"),
        (dict(counts=np.array([1, 2]), probs=np.array([0.5, 0.5]), alpha=0.1, simulate=True), "simulate"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        chi_square_check(**kwargs)
    with pytest.raises(ValueError, match="tv"):
        required_samples(3, 0.0, 0.1)


def _binomial_miss(law: np.ndarray, truth: np.ndarray, n: int, alpha: float) -> float:
    """Exact probability that ``chi_square_check`` passes ``n`` samples of ``truth`` against ``law``, for a law of
    two positive cells and one cell of probability 0 (``truth`` may put mass there), by enumerating the
    ``(n + 1)(n + 2) / 2`` count vectors."""
    counts = _compositions(n, 3)
    pmf = stats.multinomial.pmf(counts, n, truth)
    return float(sum(p for c, p in zip(counts, pmf) if p > 0.0 and chi_square_check(c, law, alpha).passed))


@pytest.mark.parametrize(
    ("law", "truth", "tv"),
    [
        # sized by its 2 bins alone, 114 samples folded the 0.01 cell into the other: one bin, never failing
        (np.array([0.99, 0.01, 0.0]), np.array([0.69, 0.31, 0.0]), 0.3),
        (np.array([0.99, 0.01, 0.0]), np.array([0.69, 0.01, 0.3]), 0.3),  # the discrepancy off the cells
        # the suite's greedy-match law on p = q at tv 0.5 (103 samples by bins: one bin)
        (np.array([0.019, 0.981, 0.0]), np.array([0.519, 0.481, 0.0]), 0.5),
        (np.array([0.3, 0.7, 0.0]), np.array([0.6, 0.4, 0.0]), 0.3),  # no merging at either size: unchanged
    ],
)
def test_chi_square_samples_detect_the_tv_on_the_cells_exactly(law, truth, tv):
    """``chi_square_samples`` sizes the check for the law, merging as the check does, so that a sampler at
    ``tv`` on the cells is caught with probability at least ``1 - beta`` (exact enumeration of the outcomes;
    the chi-square power is asymptotic, and here it holds exactly).  Sized from the bins alone
    (``required_samples``), the first and third cases merged every cell into one bin: the check now refuses
    such a sample rather than passing it."""
    alpha, beta = 1e-3, 1e-3
    assert 0.5 * np.abs(law - truth).sum() == pytest.approx(tv)
    by_bins = required_samples(2, tv, alpha, beta)
    n = chi_square_samples(law, tv, alpha, beta)
    assert _binomial_miss(law, truth, n, alpha) <= beta, n
    merged_at_bins_size = law[1] * by_bins < 5.0 or law[0] * by_bins < 5.0
    if merged_at_bins_size:
        assert n > by_bins
        with pytest.raises(ValueError, match="into one bin .* could not fail; size it with chi_square_samples"):
            chi_square_check(np.array([by_bins, 0, 0]), law, alpha)
    else:
        assert n == by_bins


def test_chi_square_samples_covers_the_mass_of_merged_bins():
    """A uniform law on 16 cells at tv 0.5: 68 samples (sized by 16 bins) leave 4.25 expected per cell, all
    merged into one bin; the size is the least at which no cell is merged (80).  A law with 100 cells of
    0.001 (mass 0.1, all merged at the bins' size): the size is one at which the merged mass ``m`` is below
    ``tv`` and the bins' power covers ``tv - m``, and no smaller size is (every size checked)."""
    uniform = np.full(16, 1 / 16)
    assert required_samples(16, 0.5, 1e-3) == 68 and chi_square_samples(uniform, 0.5, 1e-3) == 80
    law = np.array([0.5, 0.3, 0.1] + [0.001] * 100)
    tv, alpha, beta = 0.1, 1e-3, 1e-3
    need: dict[tuple[int, float], float] = {}

    def covered(n: int) -> bool:
        labels = merge_bins(law, n)
        sizes, mass = np.bincount(labels), np.bincount(labels, weights=law)
        key = (int(labels.max()) + 1, float(mass[sizes > 1].sum()))
        if key not in need:
            try:
                need[key] = required_samples(key[0], tv - key[1], alpha, beta) if key[1] < tv else np.inf
            except ValueError:  # tv - m too small for any size within the limit
                need[key] = np.inf
        return need[key] <= n

    n = chi_square_samples(law, tv, alpha, beta)
    assert covered(n) and not any(covered(k) for k in range(1, n))
    assert n == 5000 > required_samples(len(law), tv, alpha, beta)  # 5 expected per small cell; by bins: 3097


def test_chi_square_detectable_tv_counts_the_merged_mass():
    """At a fixed size: no merging, the bins' figure; a law whose small cells merge, that plus their mass, and a
    sampler that moves that much plus the bins' figure within and across the cells is still caught: exact
    enumeration on (0.9, 0.06, 0.04) at 60 samples (the last two cells merge, mass 0.1)."""
    law = np.array([0.2, 0.3, 0.5])
    assert chi_square_detectable_tv(law, 700, 1e-3) == detectable_tv(3, 700, 1e-3)
    skewed = np.array([0.9, 0.06, 0.04, 0.0])
    bins_only = chi_square_detectable_tv(skewed, 60, 1e-3, cover="bins")
    on_cells = chi_square_detectable_tv(skewed, 60, 1e-3)
    assert bins_only == detectable_tv(2, 60, 1e-3) and on_cells == pytest.approx(bins_only + 0.1)
    with pytest.raises(ValueError, match="into one bin"):
        chi_square_detectable_tv(skewed, 20, 1e-3)
    # the hardest sampler at on_cells: all of the merged bin's mass moved within it costs 0.06 (invisible), the
    # rest, on_cells - 0.06, moved from the first cell off the cells (seen)
    shift = on_cells - 0.06
    truth = np.array([0.9 - shift, 0.0, 0.10, shift])  # the merged bin's mass all on its smaller cell
    assert 0.5 * np.abs(truth - skewed).sum() == pytest.approx(on_cells)
    counts = _compositions(60, 4)
    pmf = stats.multinomial.pmf(counts, 60, truth)
    miss = float(sum(p for c, p in zip(counts, pmf) if p > 0.0 and chi_square_check(c, skewed, 1e-3).passed))
    assert miss <= 1e-3, miss


def test_chi_square_samples_for_one_cell_is_the_chance_of_never_leaving_it():
    n = chi_square_samples(np.array([1.0, 0.0]), 0.05, 1e-6, 1e-3)
    assert 0.95**n <= 1e-3 < 0.95 ** (n - 1)


@pytest.mark.parametrize(
    ("call", "match"),
    [
        # a NaN cell kept bin 0 and passed counts that never saw the 0.5 cell
        (lambda: chi_square_check(np.array([0, 100]), np.array([0.5, np.nan]), 0.01), r"probs must be finite .* cell 1"),
        (lambda: chi_square_check(np.array([50, 50]), np.array([1.2, -0.2]), 0.01), r"non-negative, got -0.2 at cell 1"),
        (lambda: chi_square_check(np.array([50, 50]), np.array([1.0, 1.0]), 0.01), "must sum to 1"),
        (lambda: chi_square_check(np.array([50.0, 2.7]), np.array([0.5, 0.5]), 0.01), "whole numbers"),
        (lambda: chi_square_check(np.array([[50, 50]]), np.array([[0.5, 0.5]]), 0.01), "1-D array"),
        (lambda: chi_square_check(np.array([80, 34]), np.array([0.99, 0.01]), 1e-3), "into one bin"),
        (lambda: kl_check(np.array([50, 50]), np.array([1.0, 1.0]), 0.01), "must sum to 1"),
        (lambda: kl_check(np.array([50.5, 50]), np.array([0.5, 0.5]), 0.01), "whole numbers"),
        (lambda: holm([0.001, float("nan")], 0.05), r"p_values must lie in \[0, 1\], got nan at index 1"),
        (lambda: holm([1.5, 0.2], 0.05), r"lie in \[0, 1\], got 1.5 at index 0"),
        (lambda: holm([0.2, 0.3], 5.0), "alpha must be in"),
        (lambda: bonferroni(2.0, 4), "alpha must be in"),
        (lambda: bonferroni(1e-3, 2.5), "checks must be an integer"),
        (lambda: bonferroni(1e-3, True), "checks must be an integer"),
        (lambda: bonferroni(1e-3, 0), "checks must be >= 1"),
        (lambda: required_samples(0, 0.1, 0.01), "n_bins must be >= 1"),
        (lambda: required_samples(2.5, 0.1, 0.01), "n_bins must be an integer"),
        (lambda: detectable_tv(16, -3, 0.01), "samples must be >= 1"),
        (lambda: chi_square_samples(np.array([0.5, 0.5]), 0.0, 0.01), "tv must be in"),
        (lambda: chi_square_samples(np.array([0.5, 0.6]), 0.1, 0.01), "must sum to 1"),
        (lambda: chi_square_samples(np.array([0.5, 0.5]), 1e-4, 1e-9), "more than 10,000,000 samples"),
        (lambda: chi_square_samples(np.array([0.5, 0.5]), 0.1, 0.01, cover="all"), "cover must be one of cells, bins"),
        (lambda: chi_square_samples(np.array([0.5, 0.5]), 0.1, 0.01, beta=1.0), "beta must be in"),
        (lambda: chi_square_detectable_tv(np.array([0.5, 0.5]), 0, 0.01), "samples must be >= 1"),
        (lambda: chi_square_detectable_tv(np.array([0.5, 0.5]), 2.5, 0.01), "samples must be an integer"),
        (lambda: chi_square_detectable_tv(np.array([0.5, 0.5]), 100, 0.01, cover="x"), "cover must be one of"),
        (lambda: chi_square_detectable_tv(np.array([0.5, np.nan]), 100, 0.01), "probs must be finite"),
    ],
)
def test_calibrated_functions_refuse_bad_arguments(call, match):
    """Each of these was accepted before and answered (a vacuous pass, a NaN counted as a rejection, a
    negative rate, a sample size for 0 bins) or raised numpy's own error."""
    with pytest.raises(ValueError, match=match):
        call()


# ------------------------------------------------- the finite-sample KL-bound test


def _compositions(n: int, k: int) -> np.ndarray:
    """Every count vector of ``n`` samples on ``k`` cells (one per row)."""
    if k == 1:
        return np.array([[n]])
    rows = [np.column_stack([np.full(len(rest), first), rest])
            for first in range(n + 1) for rest in [_compositions(n - first, k - 1)]]
    return np.vstack(rows)


def _exact_fail_rate(check, law: np.ndarray, truth: np.ndarray, n: int) -> float:
    """Probability, computed by enumerating every outcome of ``n`` samples of ``truth``, that ``check`` fails."""
    counts = _compositions(n, len(truth))
    pmf = stats.multinomial.pmf(counts, n, truth)
    return float(sum(p for c, p in zip(counts, pmf) if p > 0.0 and not check(c, law).passed))


@pytest.mark.parametrize(
    "law",
    [np.array([0.5, 0.5]), np.array([0.06, 0.94]), np.array([0.003, 0.997]),
     np.array([0.2, 0.3, 0.5]), np.array([0.01, 0.04, 0.95]), np.array([1 / 3, 1 / 3, 1 / 3])],
    ids=lambda law: "/".join(f"{x:.3g}" for x in law),
)
@pytest.mark.parametrize("n", [5, 30, 70])
@pytest.mark.parametrize("alpha", [0.2, 1e-2, 1e-4, 1e-9])
def test_kl_check_false_fail_rate_is_at_most_alpha_exactly(law, n, alpha):
    """Exact (enumerated) false-fail rate of the KL-bound test, for small and skewed laws and few samples,
    where the chi-square approximation is at its worst: never above ``alpha``."""
    rate = _exact_fail_rate(lambda c, p: kl_check(c, p, alpha), law, law, n)
    assert rate <= alpha, (rate, alpha)


def test_chi_square_rate_at_a_tiny_alpha_is_an_approximation_and_kl_bound_is_not():
    """Why the suite uses the KL-bound test: a cell of 6 expected samples at alpha = 1e-9 (the suite's
    rates are 3.7e-12) fails the chi-square far more often than alpha; the KL-bound test stays below it."""
    law, n, alpha = np.array([0.06, 0.94]), 100, 1e-9
    chi2 = _exact_fail_rate(lambda c, p: chi_square_check(c, p, alpha), law, law, n)
    kl = _exact_fail_rate(lambda c, p: kl_check(c, p, alpha), law, law, n)
    assert chi2 > 100 * alpha and kl <= alpha, (chi2, kl)


@pytest.mark.parametrize("statistic", ["pearson", "g"])
@pytest.mark.parametrize("observed", [[6, 9, 15], [2, 9, 19], [11, 4, 15], [0, 3, 27]])
def test_simulated_chi_square_p_value_is_the_exact_tail(statistic, observed):
    """``simulate = M``: the Monte Carlo p-value against the exact one, enumerated over every count vector of
    30 samples of ``[0.2, 0.3, 0.5]`` (expected 6 / 9 / 15: no bins merged).  Within 5 standard errors of
    the simulation plus 1 / M (false-fail rate ~6e-7 per case for a fresh simulation seed; it is fixed)."""
    law, n, m = np.array([0.2, 0.3, 0.5]), 30, 100_000
    counts = _compositions(n, 3)
    pmf = stats.multinomial.pmf(counts, n, law)

    def stat(c):
        obs, exp = np.asarray(c, dtype=np.float64), n * law
        if statistic == "pearson":
            return float(((obs - exp) ** 2 / exp).sum())
        seen = obs > 0
        return float(2 * (obs[seen] * np.log(obs[seen] / exp[seen])).sum())

    t = stat(observed)
    exact = float(sum(p for c, p in zip(counts, pmf) if stat(c) >= t * (1 - 1e-12)))
    got = chi_square_check(np.array(observed), law, 1e-3, statistic=statistic, simulate=m)
    assert got.statistic == pytest.approx(t, rel=1e-12)
    assert abs(got.p_value - exact) <= 5 * np.sqrt(exact * (1 - exact) / m) + 1 / m, (got.p_value, exact)
    asymptotic = chi_square_check(np.array(observed), law, 1e-3, statistic=statistic)
    assert asymptotic.p_value == pytest.approx(stats.chi2.sf(t, 2), rel=1e-9)  # the default is unchanged


@pytest.mark.parametrize(
    ("law", "truth"),
    [
        (np.array([0.5, 0.5]), np.array([0.8, 0.2])),  # tv 0.3 between the cells
        (np.array([0.2, 0.3, 0.5]), np.array([0.5, 0.3, 0.2])),  # tv 0.3 across three cells
        (np.array([0.5, 0.5, 0.0]), np.array([0.5, 0.2, 0.3])),  # tv 0.3 on an impossible cell
        (np.array([0.9, 0.1]), np.array([0.6, 0.4])),  # tv 0.3 from a skewed law
    ],
)
def test_kl_required_samples_detects_the_tv_with_the_stated_power_exactly(law, truth):
    """At ``kl_required_samples`` draws, a sampler at total variation 0.3 passes with probability at most
    ``beta`` (exact enumeration)."""
    tv, alpha, beta = 0.3, 1e-3, 1e-3
    assert np.isclose(0.5 * np.abs(law - truth).sum(), tv)
    n = kl_required_samples(int((law > 0).sum()), tv, alpha, beta)
    miss = 1.0 - _exact_fail_rate(lambda c, p: kl_check(c, p, alpha), law, truth, n)
    assert miss <= beta, (n, miss)


def test_kl_required_samples_for_one_cell_is_the_chance_of_never_leaving_it():
    """One positive cell: only a sample off it fails, so N is the least with (1 - tv)^N <= beta."""
    n = kl_required_samples(1, 0.05, 1e-6, 1e-3)
    assert 0.95**n <= 1e-3 < 0.95 ** (n - 1)
    assert kl_check(np.array([n, 0]), np.array([1.0 - 1e-16, 0.0]), 1e-6).passed  # rounding of the law is not bias
    assert not kl_check(np.array([n - 1, 1]), np.array([1.0, 0.0]), 1e-6).passed
    assert kl_detectable_tv(1, n, 1e-6, 1e-3) <= 0.05


def test_kl_threshold_is_where_the_bound_reaches_alpha():
    """exp(-t) (e t / (k - 1))^(k - 1) = alpha at the threshold, for t > k - 1 (independent evaluation)."""
    for k in (2, 3, 8, 40):
        for alpha in (0.5, 1e-3, 1e-12, 5e-324):
            t = kl_threshold(k, alpha)
            assert t > k - 1
            log_bound = -t + (k - 1) * (1 + np.log(t / (k - 1)))
            assert log_bound == pytest.approx(np.log(alpha), rel=1e-9, abs=1e-9)
    assert kl_threshold(1, 0.1) == 0.0


def test_kl_sample_size_and_detectable_tv_are_inverse():
    for k, tv, alpha in ((2, 0.05, 1e-9), (12, 0.1, 1e-3), (33, 0.05, 1e-9 / 273), (1, 0.05, 1e-6)):
        n = kl_required_samples(k, tv, alpha)
        assert kl_detectable_tv(k, n, alpha) <= tv < kl_detectable_tv(k, n - 1, alpha)
    assert kl_required_samples(5, 0.05, 1e-9) > required_samples(5, 0.05, 1e-9)  # the price of an exact rate


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: kl_check(np.array([1, 2]), np.array([0.5, 0.3, 0.2]), 0.01), "shape"),
        (lambda: kl_check(np.array([1, 2]), np.array([0.5, 0.5]), 0.0), "alpha must be in"),
        (lambda: kl_check(np.array([1, 2]), np.array([0.5, 0.5]), float("nan")), "alpha must be in"),
        (lambda: kl_check(np.array([1, -2]), np.array([0.5, 0.5]), 0.1), "counts must be non-negative"),
        (lambda: kl_check(np.array([1, 2]), np.array([0.5, np.nan]), 0.1), "probs must be finite"),
        (lambda: kl_check(np.array([1, 2]), np.array([0.0, 0.0]), 0.1), "no positive cell"),
        (lambda: kl_required_samples(0, 0.1, 0.1), "cells must be >= 1"),
        (lambda: kl_required_samples(True, 0.1, 0.1), "cells must be an integer"),
        (lambda: kl_required_samples(3, 0.0, 0.1), "tv must be in"),
        (lambda: kl_required_samples(3, 0.1, 0.1, beta=1.0), "beta must be in"),
        (lambda: kl_required_samples(10, 1e-3, 1e-9 / 273), "more than 10,000,000 per check; raise tv"),
        (lambda: kl_detectable_tv(3, 0, 0.1), "samples must be >= 1"),
        (lambda: kl_threshold(3, 1.0), "alpha must be in"),
    ],
)
def test_kl_bad_arguments(call, match):
    with pytest.raises(ValueError, match=match):
        call()


# --- exact values the statistics must give (a mutation audit: each of these could change unnoticed before) -------


@pytest.mark.parametrize(("cells", "tv", "alpha", "beta"), [(2, 0.1, 1e-3, 1e-3), (5, 0.05, 1e-6, 1e-3),
                                                            (16, 0.2, 0.01, 0.1), (60, 0.1, 1e-9, 1e-3)])
def test_kl_required_samples_is_the_least_size_of_the_module_docs_power_proof(cells, tv, alpha, beta):
    """From the module doc, recomputed here: ``s`` solves Agrawal's ``exp(−s) (e s / (k − 1))^(k − 1) = alpha``
    (scipy's brentq on the log form), and ``N`` is the least size with ``√N tv > √(s/2) + (√k + √(2 ln(1/β))) / 2``
    (Pinsker, then the Cauchy–Schwarz and McDiarmid bounds on ``‖p̂ − p'‖₁``)."""
    import math

    from scipy import optimize

    k = cells
    s = optimize.brentq(lambda x: -x + (k - 1) * (1 + math.log(x / (k - 1))) - math.log(alpha), k - 1 + 1e-9, 1e4)

    def powered(n: int) -> bool:
        return math.sqrt(n) * tv > math.sqrt(s / 2) + (math.sqrt(k) + math.sqrt(2 * math.log(1 / beta))) / 2

    n = kl_required_samples(cells, tv, alpha, beta)
    assert powered(n) and not powered(n - 1)


def test_a_simulated_p_value_counts_the_observed_sample_among_the_simulated():
    """``(1 + #{simulated >= observed}) / (M + 1)``: a sample no simulation reaches (all 100 draws of a fair coin
    on one side; probability 2^-99 a draw) gets exactly ``1 / (M + 1)``, not 0; the expected counts (statistic 0,
    which every simulation reaches) get exactly 1."""
    half = np.array([0.5, 0.5])
    for statistic in ("pearson", "g"):
        far = chi_square_check(np.array([100, 0]), half, 0.01, statistic=statistic, simulate=999)
        assert far.p_value == 1 / 1000 and not far.passed
        even = chi_square_check(np.array([50, 50]), half, 0.01, statistic=statistic, simulate=999)
        assert even.p_value == 1.0 and even.passed


def _least_size_by_scan(probs, tv, alpha, beta, cover, top=5000):
    """:func:`chi_square_samples` by brute force: the first ``N`` at which the check's merged bins (two at least)
    have the power of ``required_samples`` for ``tv`` (``cover="bins"``) or for ``tv − m``, ``m`` the mass of the
    bins holding several cells (``"cells"``)."""
    pos = np.asarray(probs, dtype=np.float64)
    pos = pos[pos > 0]
    for n in range(1, top):
        labels = merge_bins(pos, n)
        bins = int(labels.max()) + 1
        if bins < 2:
            continue
        sizes = np.bincount(labels)
        merged = float(sum(pos[labels == b].sum() for b in range(bins) if sizes[b] > 1))
        want = tv if cover == "bins" else tv - merged
        if want > 0 and required_samples(bins, want, alpha, beta) <= n:
            return n
    raise AssertionError("no size found")


@pytest.mark.parametrize("probs", [[0.75, 0.125, 0.125], [0.5, 0.25, 0.125, 0.125], [0.875, 0.0625, 0.0625],
                                   [0.6, 0.2, 0.1, 0.05, 0.05]])
@pytest.mark.parametrize("cover", ["bins", "cells"])
def test_chi_square_samples_is_the_least_size_a_scan_finds(probs, cover):
    """The search jumps between the sizes at which the merging changes; a scan of every size agrees (the audit's
    case: (0.75, 0.125, 0.125) at tv 0.4 is 20 on the bins, the first size with two bins and enough power)."""
    for tv, alpha, beta in ((0.4, 0.1, 0.1), (0.3, 0.05, 0.05), (0.5, 0.01, 0.1)):
        try:
            got = chi_square_samples(probs, tv, alpha, beta, cover=cover)
        except ValueError:
            with pytest.raises(AssertionError):
                _least_size_by_scan(probs, tv, alpha, beta, cover)
            continue
        assert got == _least_size_by_scan(probs, tv, alpha, beta, cover), (tv, alpha, beta)
    assert chi_square_samples([0.75, 0.125, 0.125], 0.4, 0.1, 0.1, cover="bins") == 20


def test_bonferroni_and_holm_on_their_cut_offs():
    """Bonferroni splits the rate evenly (0.05 over 4: 0.0125); Holm rejects ``p_(i) < alpha / (m − i)``, strictly:
    0.025 against 0.05 / 2 is kept (and everything after it), 0.0249 is rejected, then 0.04 < 0.05 / 1 too."""
    assert bonferroni(0.05, 4) == 0.0125 and bonferroni(1e-3, 1) == 1e-3
    assert holm([0.025, 0.5], 0.05) == [False, False]
    assert holm([0.5, 0.0249], 0.05) == [False, True]
    assert holm([0.04, 0.0249], 0.05) == [True, True]
