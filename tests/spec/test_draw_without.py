"""``spec.builders.base.draw_without``: DySpec's draws without replacement from a cached cumulative row.

The token of an ``RngSampler`` is checked against ``tmc.noise.categorical`` of the law made the plain way
(``without``: a copy with the removed tokens set to 0), on the same uniform (a second computation);
other samplers must be handed that law itself, so exact enumeration is unchanged.
"""

from __future__ import annotations

import numpy as np
import pytest

from spec.builders.base import draw_without, without
from spec.randomness import RngSampler, ScriptedSampler
from tmc.noise import categorical


def test_rng_draws_equal_categorical_of_the_law_on_the_same_uniform() -> None:
    rng = np.random.default_rng(0)
    checked = 0
    for trial in range(3000):
        vocab = int(rng.integers(1, 40))
        row = rng.choice([0.0, 0.0, 1e-300, 1.0, 2.0, 7.0], size=vocab) if trial % 3 else rng.dirichlet(np.ones(vocab))
        if not row.any():
            row[-1] = 1.0
        row = row / row.sum()
        removed = [int(t) for t in rng.choice(vocab, size=int(rng.integers(0, vocab)), replace=False)]
        law = without(row, removed)
        seed = int(rng.integers(2**32))
        got = draw_without(RngSampler(np.random.default_rng(seed)), row, removed, np.cumsum(row))
        if law.sum() <= 0.0:
            assert got is None, trial
            continue
        assert got is not None, trial
        u = float(np.random.default_rng(seed).random())  # the one uniform the draw used
        tok, mass = got
        assert tok == categorical(law, u), (trial, removed, u)
        assert row[tok] > 0.0 and tok not in removed
        assert mass == pytest.approx(law.sum(), rel=1e-12, abs=0.0)
        checked += 1
    assert checked > 2000


def test_edge_uniforms_and_rounding_never_give_a_removed_or_zero_token() -> None:
    """u = 0 and u just below 1, zeros next to removed tokens (where the segment search is in doubt and
    categorical decides), a single token left, and nothing left."""
    row = np.array([0.0, 0.25, 0.0, 0.25, 0.0, 0.5, 0.0])
    cdf = np.cumsum(row)

    class Uniform:  # a generator that hands out one chosen uniform
        def __init__(self, u: float) -> None:
            self.u = u

        def random(self) -> float:
            return self.u

    def Fixed(u: float) -> RngSampler:  # noqa: N802
        return RngSampler(Uniform(u))  # type: ignore[arg-type]

    for removed in ([], [1], [3], [5], [1, 3], [1, 5], [3, 5]):
        law = without(row, removed)
        for u in (0.0, 1e-300, 0.5, 0.999999999, np.nextafter(1.0, 0.0)):
            got = draw_without(Fixed(u), row, removed, cdf)
            assert got is not None
            assert got[0] == categorical(law, u) and row[got[0]] > 0.0 and got[0] not in removed, (removed, u)
    assert draw_without(Fixed(0.7), row, [1, 3, 5], cdf) is None  # every token with q > 0 is gone
    # found by search: the segment after removed token 3 starts at a zero (token 4) whose cumulative value,
    # less the mass removed before it, rounds above u · mass while the segment before ended at or below it
    doubt = np.array([0.0, 0.25974025974025977, 0.1168831168831169, 0.1168831168831169, 0.0, 0.2337662337662338,
                      0.27272727272727276])
    for u in (0.1875, 0.18749999999999997):
        got = draw_without(Fixed(u), doubt, [0, 1, 3], np.cumsum(doubt))
        assert got is not None and got[0] == categorical(without(doubt, [0, 1, 3]), u) == 2
    tiny = np.array([1.0 - 2.0**-40, 2.0**-40])  # 1 − q[0] cancels: the mass left is summed, not subtracted
    got = draw_without(Fixed(0.3), tiny, [0], np.cumsum(tiny))
    assert got == (1, 2.0**-40)


def test_other_samplers_get_the_law_itself() -> None:
    row = np.array([0.5, 0.25, 0.25])
    sampler = ScriptedSampler((2,))
    got = draw_without(sampler, row, [0], np.cumsum(row))
    assert got == (2, 0.5)
    (law, tok), = sampler.draws
    np.testing.assert_allclose(law / law.sum(), [0.0, 0.5, 0.5])  # that law (the sampler keeps it normalised)
    assert tok == 2
