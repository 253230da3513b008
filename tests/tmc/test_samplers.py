"""Samplers: replay with chosen noise, edge cases, and calibrated agreement with kernels."""

from __future__ import annotations

import numpy as np
import pytest

from tmc import (
    asps_kernel,
    asps_sample,
    asps_sample_from_uniforms,
    block_kernel,
    block_sample,
    block_sample_from_uniforms,
    paper_toy_model,
    sps_kernel,
    sps_sample,
    sps_sample_from_uniforms,
)
from tmc.toy import ToyModel
from verification.calibrated import chi_square_check, detectable_tv, required_samples

Q = np.array([[0.5, 0.5, 0.0], [0.2, 0.3, 0.5]])
P = np.array([[0.0, 0.5, 0.5], [0.1, 0.1, 0.8], [0.25, 0.25, 0.5]])


# ------------------------------------------------------------ chosen noise


def test_sps_never_accepts_a_zero_target_token_even_with_u_zero():
    # p(ref[0]) = 0 and u = 0: the strict test u < p/q rejects.
    out = sps_sample_from_uniforms([0, 2], Q, P, [0.0, 0.0, 0.0])
    assert out == [2]  # the residual (p - q)_+ = (0, 0, 0.5) has only token 2


def test_sps_all_accepted_emits_bonus_from_last_target_row():
    q = np.array([[0.5, 0.5, 0.0], [0.2, 0.3, 0.5]])
    p = np.array([[0.5, 0.5, 0.0], [0.2, 0.3, 0.5], [0.0, 0.0, 1.0]])
    assert sps_sample_from_uniforms([1, 2], q, p, [0.99, 0.99, 0.0]) == [1, 2, 2]


def test_sps_accept_test_and_resample_use_independent_noise():
    # Changing the resample uniform never changes how many drafts are accepted.
    for u_last in np.linspace(0.0, 0.999, 7):
        out = sps_sample_from_uniforms([1, 0], Q, P, [0.5, 0.6, u_last])
        assert out[0] == 1 and len(out) == 2  # ref[0] accepted (p/q = 1), ref[1] rejected (0.6 >= 0.5)


def test_block_scan_stops_at_the_last_position_that_fires():
    # a_1 = 1, a_2 = min(1, 0.2 / 0.5) = 0.4; at position 1 the residual
    # (a_1 p_1 - q_1)_+ = (0.3, 0) has h_1 = 0.3 and stop probability
    # h_1 / (h_1 + 1 - a_1) = 1.  Position 2 (the end) stops w.p. a_2 = 0.4.
    q = np.array([[0.5, 0.5], [0.5, 0.5]])
    p = np.array([[0.5, 0.5], [0.8, 0.2], [1.0, 0.0]])
    assert block_sample_from_uniforms([0, 1], q, p, [0.0, 0.0, 0.3]) == [0, 1, 0]  # tau = 2, bonus
    assert block_sample_from_uniforms([0, 1], q, p, [0.0, 0.5, 0.3]) == [0, 0]  # tau = 1, residual
    assert block_sample_from_uniforms([0, 1], q, p, [0.9, 0.39, 0.3]) == [0, 1, 0]


def test_asps_uniform_zero_takes_first_positive_cell():
    kern = asps_kernel([0, 2], Q, P)
    first = int(np.flatnonzero(kern.reshape(-1) > 0)[0])
    k, b = divmod(first, 3)
    assert asps_sample_from_uniforms([0, 2], Q, P, [0.0]) == [0, 2][:k] + [b]


@pytest.mark.parametrize(
    ("sample", "replay", "width"),
    [
        (sps_sample, sps_sample_from_uniforms, 3),
        (block_sample, block_sample_from_uniforms, 3),
        (asps_sample, asps_sample_from_uniforms, 1),
    ],
)
def test_rng_entry_point_is_replay_of_its_uniforms(sample, replay, width):
    for seed in range(20):
        got = sample([1, 2], Q, P, np.random.default_rng(seed))
        want = replay([1, 2], Q, P, np.random.default_rng(seed).random(width))
        assert got == want


# ------------------------------------------------------- calibrated tests

# Each check below states its false-fail rate: the CI budget of 1e-9 split
# (Bonferroni) over every sampler-vs-kernel check in this file.  Each detects,
# with probability >= 1 - 1e-3, a total variation of DETECT_TV between the
# sampler's law and its kernel on the merged cells.
DETECT_TV = 0.05


def _cases():
    toy = paper_toy_model()
    rng = np.random.default_rng(11)
    rand = ToyModel.random(4, 3, rng, zero_prob=0.25)
    uniform3 = np.full(3, 1 / 3)
    greedy = ToyModel(3, {}, {(): np.array([0.0, 1.0, 0.0])}, uniform3, np.array([0.0, 0.0, 1.0]))
    same = ToyModel(3, {}, {}, np.array([0.2, 0.3, 0.5]), np.array([0.2, 0.3, 0.5]))
    return [
        ("paper aa", toy, (0, 0)),
        ("paper ac", toy, (0, 2)),
        ("random V4 n3", rand, None),  # a draft chain drawn from the model itself
        ("greedy target", greedy, (2, 1)),
        ("p == q", same, (2, 2)),
        ("no drafts", toy, ()),
    ]


def _resolve(model, ref, rng):
    """The case's draft chain; ``None`` means: draw three tokens from the draft model."""
    if ref is not None:
        return tuple(ref)
    drawn: tuple[int, ...] = ()
    for _ in range(3):
        drawn += (int(rng.choice(model.vocab, p=model.q(drawn))),)
    return drawn


CASES = _cases()
SAMPLERS = [(sps_sample, sps_kernel), (asps_sample, asps_kernel), (block_sample, block_kernel)]
N_CHECKS = len(CASES) * len(SAMPLERS)
ALPHA = 1e-9 / N_CHECKS


@pytest.mark.parametrize(("sample", "kernel"), SAMPLERS, ids=["sps", "asps", "block"])
@pytest.mark.parametrize(("name", "model", "ref"), CASES, ids=[c[0] for c in CASES])
def test_sampler_matches_kernel(sample, kernel, name, model, ref):
    rng = np.random.default_rng(2024)
    ref = _resolve(model, ref, rng)
    q_rows, p_rows = model.chain_rows(ref)
    probs = kernel(ref, q_rows, p_rows).reshape(-1)
    n_samples = required_samples(int((probs > 0).sum()), DETECT_TV, ALPHA)
    assert n_samples <= 40_000, "sample size must stay affordable"
    counts = np.zeros(probs.shape[0], dtype=np.int64)
    vocab = model.vocab
    for _ in range(n_samples):
        out = sample(ref, q_rows, p_rows, rng)
        assert list(out[:-1]) == list(ref[: len(out) - 1]), "output must extend an accepted prefix"
        counts[(len(out) - 1) * vocab + out[-1]] += 1
    result = chi_square_check(counts, probs, ALPHA)
    assert result.impossible == 0
    assert result.passed, result


def test_chi_square_check_catches_a_biased_sampler():
    # Negative control: SpS that resamples from p (not the residual) on
    # rejection is off by a known TV on the paper's toy draft "aa".
    toy = paper_toy_model()
    ref = (0, 0)
    q_rows, p_rows = toy.chain_rows(ref)
    probs = sps_kernel(ref, q_rows, p_rows).reshape(-1)

    def biased_kernel():
        k = sps_kernel(ref, q_rows, p_rows)
        k[0] = k[0].sum() * p_rows[0]
        return k.reshape(-1)

    bad = biased_kernel()
    tv = 0.5 * np.abs(bad - probs).sum()
    assert tv >= DETECT_TV
    rng = np.random.default_rng(5)
    n_samples = required_samples(int((probs > 0).sum()), DETECT_TV, ALPHA)
    counts = rng.multinomial(n_samples, bad)
    assert not chi_square_check(counts, probs, ALPHA).passed


def test_sample_size_and_detectable_tv_are_inverse():
    n = required_samples(10, 0.05, 1e-9)
    assert detectable_tv(10, n, 1e-9) <= 0.05 * 1.01
    assert detectable_tv(10, n // 2, 1e-9) > 0.05
