"""``tmc.noise.check_uniforms``: its fast path (a float64 array of the right shape, two reductions) agrees with
the element-by-element rule ``0 <= u < 1`` and the full conversion on every input, and names the entry it
refuses."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tmc.noise import check_uniforms

BAD = [1.0, -1e-300, -0.5, math.nan, math.inf, -math.inf, 1.0 + 2.0**-52]


def test_a_float64_array_in_range_comes_back_as_itself() -> None:
    u = np.random.default_rng(0).random(5)
    assert check_uniforms("u", u, 5) is u
    assert check_uniforms("u", np.array([0.0, -0.0, np.nextafter(1.0, 0.0)]), 3).tolist() == [0.0, 0.0, 1 - 2**-53]
    assert check_uniforms("u", np.zeros(0), 0).shape == (0,)  # empty: no reduction over nothing


@pytest.mark.parametrize("bad", BAD)
@pytest.mark.parametrize("at", [0, 2, 4])
def test_each_bad_entry_is_named_by_its_index(bad: float, at: int) -> None:
    """Float64 arrays (the fast path's inputs), lists and float32 arrays alike."""
    u = np.full(5, 0.25)
    u[at] = bad
    for given in (u, u.tolist(), u.astype(np.float32)):
        if isinstance(given, np.ndarray) and given.dtype == np.float32 and float(given[at]) != bad:
            continue  # 1 + 2**-52 and -1e-300 have no float32 twin
        with pytest.raises(ValueError, match=rf"u\[{at}\] = .* is not a uniform draw in \[0, 1\)"):
            check_uniforms("u", given, 5)


def test_random_arrays_agree_with_the_rule_entry_by_entry() -> None:
    """Arrays with a bad entry now and then: accepted exactly when every entry satisfies ``0 <= x < 1`` in
    plain Python, and the refusal names the first entry that does not."""
    rng = np.random.default_rng(1)
    for _ in range(400):
        u = rng.random(int(rng.integers(1, 6)))
        for i in np.flatnonzero(rng.random(u.size) < 0.15):
            u[i] = BAD[int(rng.integers(len(BAD)))]
        first_bad = next((i for i, x in enumerate(u.tolist()) if not 0.0 <= x < 1.0), None)
        if first_bad is None:
            assert check_uniforms("u", u, u.size) is u
        else:
            with pytest.raises(ValueError, match=rf"^u\[{first_bad}\] = "):
                check_uniforms("u", u, u.size)


def test_other_shapes_and_types_are_refused() -> None:
    u = np.full(4, 0.5)
    with pytest.raises(ValueError, match=r"u must have shape \(3,\), got \(4,\)"):
        check_uniforms("u", u, 3)
    with pytest.raises(ValueError, match=r"u must have shape \(4,\), got \(2, 2\)"):
        check_uniforms("u", u.reshape(2, 2), 4)
    with pytest.raises(ValueError, match="u must hold real numbers"):
        check_uniforms("u", np.zeros(4, dtype=bool), 4)
    with pytest.raises(ValueError, match="complex"):
        check_uniforms("u", u.astype(complex), 4)
    with pytest.raises(ValueError, match=r"u must have shape \(0,\), got \(4,\)"):
        check_uniforms("u", u, 0)
