"""Turning explicit uniforms into draws (DESIGN.md §3: randomness is an argument).

Every sampler in :mod:`tmc` is a pure function of (probabilities, uniforms).
The ``rng`` entry points only draw the uniforms with ``rng.random`` (values in
``[0, 1)``) and hand them on, so a test can replay any step with chosen noise.
Accept tests compare ``u < ratio`` strictly: a draft token with target
probability 0 is never accepted, even for ``u == 0``.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray

from tmc.validate import as_real_array


def check_uniforms(name: str, u: ArrayLike, size: int) -> NDArray[np.float64]:
    """Return ``u`` as a float64 ``(size,)`` array of values in ``[0, 1)`` or raise (also for complex, bool
    or text entries: :func:`tmc.validate.as_real_array`)."""
    if (type(u) is np.ndarray and u.dtype == np.float64 and u.shape == (size,) and size > 0
            and 0.0 <= u.min() and u.max() < 1.0):  # the common case: two reductions (a NaN fails them both
        return u  # and takes the path below, which names it)
    arr = as_real_array(name, u)
    if arr.shape != (size,):
        raise ValueError(f"{name} must have shape ({size},), got {arr.shape}")
    if not np.all((arr >= 0.0) & (arr < 1.0)):
        i = int(np.argmax(~((arr >= 0.0) & (arr < 1.0))))
        raise ValueError(f"{name}[{i}] = {float(arr[i])!r} is not a uniform draw in [0, 1)")
    return arr


def categorical(weights: NDArray[np.float64], u: float) -> int:
    """Inverse-CDF draw: index ``i`` with probability ``weights[i] / weights.sum()``.

    A zero weight is never chosen, whatever ``u`` is (``u == 0`` included).  ``ValueError`` when the total is
    not finite and positive (the one check this hot path pays for: callers pass rows they validated).
    """
    cdf = np.cumsum(weights)
    total = float(cdf[-1])
    if not (total > 0.0 and total < np.inf):  # NaN fails both
        raise ValueError(f"categorical() needs a finite positive total weight, got {total!r}")
    i = int(np.searchsorted(cdf, u * total, side="right"))
    if i >= weights.shape[0]:
        # u * total rounded up to total: the last index with positive weight.
        i = int(np.flatnonzero(weights > 0.0)[-1])
    return i
