"""Input validation at the public boundary (DESIGN.md §3).

Every public kernel and sampler in :mod:`tmc` takes probabilities from the
caller: ``q`` rows from the draft model and ``p`` rows from the target model.
A wrong input must fail loudly with a ``ValueError`` that names the argument
and the row, never produce a silently wrong sample.  The checks here are the
single place those rules live.

Rules (``ROW_SUM_TOL`` is the stated tolerance):

* arrays are 2-D, finite (no NaN or ±inf) and non-negative;
* each row sums to 1 within ``ROW_SUM_TOL``; rows are then renormalised in
  float64 so the exact algebra of the kernels holds to rounding;
* ``q_rows`` has shape ``(n, V)`` and ``p_rows`` ``(n + 1, V)``;
* draft tokens are integers in ``[0, V)`` and were possible under the law they
  were drawn from: ``q_rows[i, ref[i]] > 0``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import ArrayLike, NDArray

#: Largest allowed |row sum - 1| for a probability row.  Rows from a float32
#: softmax over a 32k vocabulary sum to 1 within ~1e-6 once cast to float64.
ROW_SUM_TOL = 1e-6

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]


def check_prob_rows(name: str, rows: ArrayLike) -> FloatArray:
    """Return ``rows`` as a renormalised float64 ``(m, V)`` array or raise.

    ``name`` is the argument name used in error messages.
    """
    arr = np.asarray(rows, dtype=np.float64)
    if arr.ndim != 2:
        raise ValueError(f"{name} must be a 2-D array of probability rows, got shape {arr.shape}")
    if arr.shape[1] == 0:
        raise ValueError(f"{name} has vocabulary size 0; need at least one token")
    finite = np.isfinite(arr)
    if not finite.all():
        row = int(np.argwhere(~finite)[0, 0])
        raise ValueError(f"{name} row {row} contains NaN or infinite entries")
    if (arr < 0).any():
        row, col = (int(i) for i in np.argwhere(arr < 0)[0])
        raise ValueError(f"{name} row {row} has a negative entry {arr[row, col]!r} at token {col}")
    sums = arr.sum(axis=1)
    bad = np.abs(sums - 1.0) > ROW_SUM_TOL
    if bad.any():
        row = int(np.argmax(bad))
        raise ValueError(
            f"{name} row {row} sums to {sums[row]!r}, not 1 (tolerance {ROW_SUM_TOL})"
        )
    out: FloatArray = arr / sums[:, None]
    return out


def check_tokens(name: str, tokens: ArrayLike | Sequence[int], vocab: int) -> IntArray:
    """Return ``tokens`` as a 1-D int64 array with every id in ``[0, vocab)``."""
    arr = np.asarray(tokens)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be a 1-D sequence of token ids, got shape {arr.shape}")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        if not np.all(np.isfinite(arr)) or not np.all(arr == np.round(arr)):
            raise ValueError(f"{name} must contain integer token ids, got dtype {arr.dtype}")
    out = arr.astype(np.int64)
    outside = (out < 0) | (out >= vocab)
    if outside.any():
        i = int(np.argmax(outside))
        raise ValueError(f"{name}[{i}] = {int(out[i])} is outside the vocabulary [0, {vocab})")
    return out


def check_chain(
    ref: ArrayLike | Sequence[int], q_rows: ArrayLike, p_rows: ArrayLike
) -> tuple[IntArray, FloatArray, FloatArray]:
    """Validate a chain verification input (DESIGN.md §3 array contract).

    Returns ``(ref, q_rows, p_rows)`` as int64 ``(n,)``, float64 ``(n, V)`` and
    float64 ``(n + 1, V)`` arrays with rows renormalised.  ``n = 0`` (no draft
    tokens) is allowed: ``q_rows`` may then be an empty ``(0, V)`` array.
    """
    p = check_prob_rows("p_rows", p_rows)
    vocab = p.shape[1]
    q_arr = np.asarray(q_rows, dtype=np.float64)
    if q_arr.ndim == 2 and q_arr.shape[0] == 0:
        q: FloatArray = np.zeros((0, q_arr.shape[1]), dtype=np.float64)
    else:
        q = check_prob_rows("q_rows", q_arr)
    toks = check_tokens("ref", ref, vocab)
    n = toks.shape[0]
    if q.shape != (n, vocab):
        raise ValueError(
            f"q_rows has shape {q.shape}; expected (n, V) = ({n}, {vocab}) for {n} draft tokens"
        )
    if p.shape != (n + 1, vocab):
        raise ValueError(
            f"p_rows has shape {p.shape}; expected (n + 1, V) = ({n + 1}, {vocab})"
        )
    if n:
        q_draft = q[np.arange(n), toks]
        zero = q_draft <= 0
        if zero.any():
            i = int(np.argmax(zero))
            raise ValueError(
                f"ref[{i}] = {int(toks[i])} has q_rows[{i}, {int(toks[i])}] = 0: "
                "a draft token must have positive probability under the law it was drawn from"
            )
    return toks, q, p
