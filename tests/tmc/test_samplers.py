"""Samplers: replay with chosen noise, edge cases, and agreement with exact laws.

Sampler laws are checked against their own float kernels and, so that no
check compares the code with itself only, against independent laws: the
literal exact-rational references of ``tests/tmc/reference.py`` and, for
ASpS, the block-verification sampler (a different algorithm with the same
law).  Statistical checks are calibrated (false-fail rate, detectable TV,
sample size fixed before sampling); cases with certain accept tests are
checked exactly instead.
"""

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
from tmc.chain import chain_sample_trusted
from tmc.toy import ToyModel
from verification.calibrated import chi_square_check, detectable_tv, required_samples

from .reference import asps_literal, block_literal, rational_rows, sps_literal, to_float

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
    # ref[0] = 1 passes (p/q = 0.5/0.5 = 1 > 0.5); ref[1] = 0 fails
    # (0.6 >= 0.2/0.6); the residual (p_1 − q_1)_+ = (0, 0.2, 0.2) then
    # gives token 1 for u_last < 1/2 and token 2 above.
    q = np.array([[0.5, 0.5, 0.0], [0.6, 0.2, 0.2]])
    p = np.array([[0.0, 0.5, 0.5], [0.2, 0.4, 0.4], [0.25, 0.25, 0.5]])
    for u_last in np.linspace(0.0, 0.999, 7):
        want = [1, 1] if u_last < 0.5 else [1, 2]
        assert sps_sample_from_uniforms([1, 0], q, p, [0.5, 0.6, u_last]) == want


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
    # By hand (Algorithm 1): p(ref[0] = 0) = 0, so ASpS's weight drops to
    # P_N_s = 0 at step 0 and it emits norm((p_0 − q_0)_+) = (0, 0, 1) there;
    # step 1 then rescales by (q(2)/Σq)/q(2) = 1 and emits nothing.  The law
    # is the point mass on [2]: cells (0, 0) and (0, 1) before it are zero.
    assert to_float(asps_literal([0, 2], rational_rows(Q), rational_rows(P)))[0] == [0.0, 0.0, 1.0]
    assert asps_sample_from_uniforms([0, 2], Q, P, [0.0]) == [2]
    assert asps_sample_from_uniforms([0, 2], Q, P, [0.999]) == [2]


def test_asps_inverse_cdf_decodes_each_cell_of_the_literal_law():
    # The flattened law in row-major (k, b) order, from the literal exact-
    # rational Algorithm 1 (tests/tmc/reference.py, not tmc.asps_kernel): a
    # uniform at the middle of cell c's CDF interval must come out as
    # ref[:k] + [b].  Checks the inverse CDF and the index decoding exactly.
    # Cells below 1e-9 are skipped: their exact mass may be 0 while float
    # rows leave ~1e-17 of rounding there, too narrow to aim a uniform at.
    toy, rand = TOY, RAND  # module-level models, defined with the case tables below
    cases = [(ref, *toy.chain_rows(ref)) for ref in [(0, 0), (2, 1)]]
    drafted = [ref for ref in [(0, 1, 2), (3, 3, 0), (1, 0, 3)] if all(rand.q(ref[:i])[a] > 0 for i, a in enumerate(ref))]
    cases += [(ref, *rand.chain_rows(ref)) for ref in drafted]
    cases.append(((1, 2), Q, P))
    checked = 0
    for ref, q_rows, p_rows in cases:
        law = asps_literal(ref, rational_rows(q_rows), rational_rows(p_rows))
        vocab = len(law[0])
        flat = [m for row in law for m in row]
        cdf = 0 * flat[0]
        for cell, mass in enumerate(flat):
            if mass > 1e-9:
                k, b = divmod(cell, vocab)
                u = float(cdf + mass / 2)
                assert asps_sample_from_uniforms(ref, q_rows, p_rows, [u]) == list(ref[:k]) + [b], (ref, cell)
                checked += 1
            cdf += mass
    assert checked >= 15  # the cases cover many cells (16 here), not one point mass


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


# ------------------------------------------------- the unchecked entry point

CHECKED = {"sps": sps_sample_from_uniforms, "asps": asps_sample_from_uniforms, "block": block_sample_from_uniforms}


def _random_chain(rng, n, vocab):
    """A chain whose rows sum to 1 only within ROW_SUM_TOL (so renormalising matters), with exact zeros."""
    q = rng.dirichlet(np.full(vocab, 0.5), size=n) * (1 + rng.uniform(-5e-7, 5e-7, size=(n, 1)))
    p = rng.dirichlet(np.full(vocab, 0.5), size=n + 1)
    p[p < 0.05] = 0.0
    p = p / p.sum(axis=1, keepdims=True) * (1 + rng.uniform(-5e-7, 5e-7, size=(n + 1, 1)))
    ref = np.array([rng.choice(vocab, p=row / row.sum()) for row in q], dtype=np.int64)
    return ref, q, p


@pytest.mark.parametrize("method", ["sps", "asps", "block"])
def test_trusted_entry_point_gives_the_checked_samplers_tokens(method):
    """``chain_sample_trusted`` on valid input is the checked sampler, uniform by uniform; among the
    uniforms are the accept thresholds of the renormalised rows, where rows used as given would flip."""
    rng = np.random.default_rng(7)
    for _ in range(300):
        n, vocab = int(rng.integers(0, 5)), int(rng.integers(1, 6))
        ref, q, p = _random_chain(rng, n, vocab)
        width = 1 if method == "asps" else n + 1
        u = rng.random(width)
        if n and method == "sps":  # the first accept test exactly at its threshold p(ref) / q(ref)
            u[0] = min((p[0, ref[0]] / p[0].sum()) / (q[0, ref[0]] / q[0].sum()), 0.999)
        for uu in (u, np.zeros(width), np.full(width, np.nextafter(1.0, 0.0))):
            want = CHECKED[method](ref, q, p, uu)
            assert chain_sample_trusted(method, ref, q, p, uu) == want, (method, ref.tolist(), uu.tolist())


@pytest.mark.parametrize("method", ["sps", "asps", "block"])
def test_trusted_entry_point_reads_none_as_point_masses(method):
    """``q_rows=None`` (a deterministic draft) gives the checked sampler's tokens on one-hot rows at
    ``ref``, the accept threshold ``p(ref)`` itself among the uniforms."""
    rng = np.random.default_rng(8)
    for _ in range(300):
        n, vocab = int(rng.integers(0, 5)), int(rng.integers(1, 6))
        ref, _, p = _random_chain(rng, n, vocab)
        one_hot = np.zeros((n, vocab))
        one_hot[np.arange(n), ref] = 1.0
        width = 1 if method == "asps" else n + 1
        u = rng.random(width)
        if n and method == "sps":
            u[0] = min(p[0, ref[0]] / p[0].sum(), 0.999)
        for uu in (u, np.zeros(width), np.full(width, np.nextafter(1.0, 0.0))):
            want = CHECKED[method](ref, one_hot, p, uu)
            assert chain_sample_trusted(method, ref, None, p, uu) == want, (method, ref.tolist(), uu.tolist())


def test_trusted_entry_point_refuses_an_unknown_method():
    with pytest.raises(ValueError, match="method must be one of sps, asps, block, got 'kseq'"):
        chain_sample_trusted("kseq", np.array([1]), Q[:1], P[:2], np.zeros(2))


# ------------------------------------------------------- calibrated tests

# Each check below states its false-fail rate: the CI budget of 1e-9 split
# (Bonferroni) over every sampler-vs-law check in this file (N_CHECKS).  Each
# detects, with probability >= 1 - 1e-3, a total variation of DETECT_TV
# between the sampler's law and the reference law on the merged cells.
DETECT_TV = 0.05


def _models():
    toy = paper_toy_model()
    rand = ToyModel.random(4, 3, np.random.default_rng(11), zero_prob=0.25)
    uniform3 = np.full(3, 1 / 3)
    greedy = ToyModel(3, {}, {(): np.array([0.0, 1.0, 0.0])}, uniform3, np.array([0.0, 0.0, 1.0]))
    same = ToyModel(3, {}, {}, np.array([0.2, 0.3, 0.5]), np.array([0.2, 0.3, 0.5]))
    return toy, rand, greedy, same


TOY, RAND, GREEDY, SAME = _models()
# Cases whose accept tests are random: checked statistically below.
CASES = [
    ("paper aa", TOY, (0, 0)),
    ("paper ac", TOY, (0, 2)),
    ("random V4 n3", RAND, None),  # a draft chain drawn from the model itself
]
# Cases whose accept / stop tests are all certain (probability 0 or 1), so
# only the final uniform matters and the law is checked exactly instead.
CERTAIN_CASES = [
    ("greedy target", GREEDY, (2, 1)),  # p_0(2) = 0: rejected surely, residual (0, 1, 0)
    ("p == q", SAME, (2, 2)),  # every ratio is 1: accepted surely, bonus from p_2
    ("no drafts", TOY, ()),  # n = 0: one token from p_0
]


def _resolve(model, ref, rng):
    """The case's draft chain; ``None`` means: draw three tokens from the draft model."""
    if ref is not None:
        return tuple(ref)
    drawn: tuple[int, ...] = ()
    for _ in range(3):
        drawn += (int(rng.choice(model.vocab, p=model.q(drawn))),)
    return drawn


def _literal_law(literal):
    """A reference law from tests/tmc/reference.py, in exact rationals, as a float kernel."""

    def law(ref, q_rows, p_rows):
        return np.array(to_float(literal(ref, rational_rows(q_rows), rational_rows(p_rows))))

    law.__name__ = literal.__name__
    return law


# Each sampler is drawn once per case; its counts are then checked against
# every law listed with it.  The laws that are not the sampler's own kernel
# come from an independent computation:
# * block_sample vs asps_kernel — Sun et al.'s block verification is a
#   different sequential algorithm (backward scan of stop tests, n + 1
#   uniforms) with provably the same law as ASpS's Algorithm 1, so this
#   tests asps_kernel against a sampler that never calls it;
# * asps_sample vs asps_literal — asps_sample draws by inverse CDF from
#   asps_kernel, so comparing it with asps_kernel would test the kernel
#   against itself; the literal exact-rational Algorithm 1 (rescaling the
#   whole P_N each step) checks the kernel and the sampler path (inverse
#   CDF, (k, b) index decoding) together;
# * sps_sample and block_sample are also checked against their literal
#   references (eq. (1) couplings; block verification by enumerating all
#   2^n stop-test outcomes).
SAMPLERS = [
    (sps_sample, (sps_kernel, _literal_law(sps_literal))),
    (block_sample, (block_kernel, asps_kernel, _literal_law(block_literal))),
    (asps_sample, (_literal_law(asps_literal),)),
]
N_CHECKS = len(CASES) * sum(len(laws) for _, laws in SAMPLERS)
ALPHA = 1e-9 / N_CHECKS


def _draw_counts(sample, model, ref, q_rows, p_rows, n_samples, rng):
    """Counts over the flattened (k, b) cells of ``n_samples`` steps of ``sample``."""
    counts = np.zeros((len(ref) + 1) * model.vocab, dtype=np.int64)
    for _ in range(n_samples):
        out = sample(ref, q_rows, p_rows, rng)
        assert list(out[:-1]) == list(ref[: len(out) - 1]), "output must extend an accepted prefix"
        counts[(len(out) - 1) * model.vocab + out[-1]] += 1
    return counts


@pytest.mark.parametrize(("sample", "laws"), SAMPLERS, ids=["sps", "block", "asps"])
@pytest.mark.parametrize(("name", "model", "ref"), CASES, ids=[c[0] for c in CASES])
def test_sampler_matches_reference_laws(sample, laws, name, model, ref):
    """Sampler frequencies against its kernel and independent reference laws.

    Independent algorithms used (table SAMPLERS): ``asps_kernel`` is checked
    against ``block_sample`` — Sun et al.'s block verification, a backward
    scan of stop tests that never calls ``asps_kernel`` — and ``asps_sample``
    (inverse CDF + (k, b) decoding) against ``asps_literal``, the literal
    exact-rational Algorithm 1; ``sps_sample`` / ``block_sample`` also
    against ``sps_literal`` / ``block_literal``.  False-fail rate ``ALPHA``
    per check (1e-9 Bonferroni-split over ``N_CHECKS``); each check detects
    a TV of ``DETECT_TV`` with probability ≥ 1 − 1e-3.
    """
    rng = np.random.default_rng(2024)
    ref = _resolve(model, ref, rng)
    q_rows, p_rows = model.chain_rows(ref)
    probs = [law(ref, q_rows, p_rows).reshape(-1) for law in laws]
    # Fixed before sampling: enough for the check with the most positive cells.
    n_samples = max(required_samples(int((pr > 0).sum()), DETECT_TV, ALPHA) for pr in probs)
    assert n_samples <= 40_000, "sample size must stay affordable"
    counts = _draw_counts(sample, model, ref, q_rows, p_rows, n_samples, rng)
    for law, pr in zip(laws, probs):
        result = chi_square_check(counts, pr, ALPHA)
        assert result.impossible == 0, (law.__name__, result)
        assert result.passed, (law.__name__, result)


@pytest.mark.parametrize(
    ("replay", "literal"),
    [
        (sps_sample_from_uniforms, sps_literal),
        (block_sample_from_uniforms, block_literal),
        (asps_sample_from_uniforms, asps_literal),
    ],
    ids=["sps", "block", "asps"],
)
@pytest.mark.parametrize(("name", "model", "ref"), CERTAIN_CASES, ids=[c[0] for c in CERTAIN_CASES])
def test_sampler_with_certain_tests_matches_literal_law_exactly(replay, literal, name, model, ref):
    """Exact law of the sampler as a function of its noise, against the literal reference.

    The literal law (tests/tmc/reference.py, exact rationals) has one row
    ``k``: the step surely emits ``ref[:k]`` then one token.  Whatever the
    accept / stop uniforms are, the final uniform at the middle of token
    ``b``'s CDF interval in that row must give ``ref[:k] + [b]`` (ASpS's
    single uniform indexes the flattened law, whose earlier rows are 0).
    """
    q_rows, p_rows = model.chain_rows(ref)
    law = literal(ref, rational_rows(q_rows), rational_rows(p_rows))
    rows = [k for k, row in enumerate(law) if any(m > 0 for m in row)]
    assert len(rows) == 1, "the case must have certain accept tests"
    k = rows[0]
    assert sum(law[k]) == 1
    width = 1 if replay is asps_sample_from_uniforms else len(ref) + 1
    for u_test in (0.0, 0.5, 0.999):
        cdf = 0 * law[k][0]
        for b, mass in enumerate(law[k]):
            if mass > 0:
                u = [u_test] * (width - 1) + [float(cdf + mass / 2)]
                assert replay(ref, q_rows, p_rows, u) == list(ref[:k]) + [b], (u, b)
            cdf += mass


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
