"""The calibrated statistics themselves: false-fail rate, power, merging, multiple tests."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from verification.calibrated import (
    bonferroni,
    chi_square_check,
    detectable_tv,
    holm,
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
    # probability < 1e-9 when the check is calibrated.
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
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        chi_square_check(**kwargs)
    with pytest.raises(ValueError, match="tv"):
        required_samples(3, 0.0, 0.1)
