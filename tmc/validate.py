"""Input validation at the public boundary (DESIGN.md §3).

Every public kernel and sampler in :mod:`tmc` takes probabilities from the
caller: ``q`` rows from the draft model and ``p`` rows from the target model.
A wrong input must fail loudly with a ``ValueError`` that names the argument
and the row, never produce a silently wrong sample.  The checks here are the
single place those rules live.

Rules (``ROW_SUM_TOL`` is the stated tolerance):

* arrays are 2-D, finite (no NaN or ±inf) and non-negative;
* each row sums to 1 within ``ROW_SUM_TOL`` (rows given in float32, float16
  or bfloat16: within ``ROW_SUM_TOLS`` of that precision, :func:`row_sum_tol`);
  rows are then renormalised in float64 so the exact algebra of the kernels
  holds to rounding;
* ``q_rows`` has shape ``(n, V)`` and ``p_rows`` ``(n + 1, V)``;
* draft tokens are integers in ``[0, V)`` and were possible under the law they
  were drawn from: ``q_rows[i, ref[i]] > 0``;
* ids (tokens, parents, vocabulary sizes) are integers: numpy integer types and
  integral floats such as ``1.0`` are accepted, ``1.7``, ``True``, strings and
  ``None`` are not;
* probabilities are real numbers: complex, string, object and ``None`` rows are
  rejected rather than silently converted;
* ``rng`` is a :class:`numpy.random.Generator` or an integer seed.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

#: Largest allowed |row sum - 1| for a probability row given in float64 (or as integers or Python numbers).
ROW_SUM_TOL = 1e-6
#: The same for rows given in a lower precision, by dtype name.  A softmax row computed in that precision,
#: or a float64 one rounded to it, sums to 1 only within that precision's rounding: the worst |sum - 1|
#: (summed in float64) over 64 rows each of logit scales 0.5-30 and V = 4096-256000, both ways, was
#: 2.1e-5 for float32 (growing with V: 1.0e-6 at 4096, 1.3e-5 at 128256), 7.0e-4 for float16 and 3.0e-3
#: for bfloat16 (torch 2.13 CPU).  Each tolerance leaves a margin of 5x or more over that, and an
#: unnormalised row (logits, weights, a top-p cut not renormalised) is still off by far more.
ROW_SUM_TOLS = {"float32": 1e-4, "float16": 1e-2, "bfloat16": 2e-2}


def row_sum_tol(dtype: object) -> float:
    """The row-sum tolerance for rows given in ``dtype`` (a numpy or torch dtype, or its name):
    ``ROW_SUM_TOLS``' entry for float32 / float16 / bfloat16, else ``ROW_SUM_TOL``."""
    try:
        name = np.dtype(dtype).name  # type: ignore[call-overload]  # numpy dtypes, scalar types, names (None: float64)
    except TypeError:
        name = str(dtype).removeprefix("torch.")  # torch dtypes, and "bfloat16", which numpy lacks
    return ROW_SUM_TOLS.get(name, ROW_SUM_TOL)

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]


def given_dtype(values: object) -> object:
    """The precision ``values`` came in: its own ``dtype`` (numpy arrays and scalars, torch tensors), else
    that of the array numpy builds from it (a list of float32 rows is float32), else ``None``."""
    dtype = getattr(values, "dtype", None)
    if dtype is not None or values is None or isinstance(values, str | bytes):
        return dtype
    try:
        return np.asarray(values).dtype
    except (ValueError, TypeError):  # ragged or odd input: as_real_array names the fault
        return None


def _bool_at(values: object) -> tuple[int, ...] | None:
    """Where a (nested) list or tuple holds a boolean (``True``, ``np.True_`` or a boolean array), else
    ``None``: numpy reads ``[0.5, True]`` as ``[0.5, 1.0]`` and ``[1, True]`` as ``[1, 1]``."""
    if isinstance(values, bool | np.bool_) or (isinstance(values, np.ndarray) and values.dtype == np.bool_):
        return ()
    if isinstance(values, list | tuple):
        # the types present, read in C: a row of plain numbers is passed without a Python-level call per entry
        kinds = set(map(type, values))
        if not any(k is bool or k is np.bool_ or issubclass(k, list | tuple | np.ndarray) for k in kinds):
            return None
        for i, v in enumerate(values):
            inner = _bool_at(v)
            if inner is not None:
                return (i, *inner)
    return None


def _refuse_bools(name: str, values: object, what: str) -> None:
    """``ValueError`` naming ``name`` and the place when a list or tuple holds a boolean among numbers."""
    if isinstance(values, list | tuple):
        at = _bool_at(values)
        if at is not None:
            place = "".join(f"[{i}]" for i in at)
            raise ValueError(f"{name}{place} is a boolean; expected {what}")


def as_real_array(name: str, values: object) -> FloatArray:
    """``values`` as a float64 array; ``ValueError`` for complex, text, booleans, objects or ``None``."""
    return as_real_array_with_dtype(name, values)[0]


def as_real_array_with_dtype(name: str, values: object) -> tuple[FloatArray, object]:
    """:func:`as_real_array` and :func:`given_dtype` from one conversion: ``(float64 array, precision given)``.

    A list of rows is converted once, not a second time to read its precision (the array numpy builds from
    it has that precision: float32 only if every entry is).
    """
    own = getattr(values, "dtype", None)
    arr, raw_dtype = _as_real(name, values)
    return arr, (own if own is not None else raw_dtype)


def host_array(name: str, values: object) -> NDArray[Any]:
    """``np.asarray(values)``, or a ``ValueError`` naming ``name`` where numpy cannot read it.

    A tensor numpy cannot take as it is (a torch tensor in bfloat16, on a GPU, or one that requires grad) is
    read through its own ``detach().cpu()`` and, for bfloat16, ``float()`` (exact: bfloat16 is float32 with
    fewer mantissa bits); the caller reads the precision it came in from ``values.dtype``.  Duck-typed: this
    module imports nothing but numpy."""
    try:
        return np.asarray(values)
    except ValueError:  # numpy's "inhomogeneous shape" message names no argument
        raise ValueError(f"{name} is ragged: its rows differ in length") from None
    except (TypeError, RuntimeError) as err:
        detach = getattr(values, "detach", None)
        if callable(detach):
            try:
                host = detach().cpu()
                if str(getattr(host, "dtype", "")) == "torch.bfloat16":
                    host = host.float()
                return np.asarray(host)
            except (TypeError, RuntimeError, ValueError, AttributeError):
                pass
        raise ValueError(f"{name} cannot be read as an array ({type(values).__name__}: {err})") from None


def _as_real(name: str, values: object) -> tuple[FloatArray, object]:
    if values is None:
        raise ValueError(f"{name} is None; expected an array of probabilities")
    raw = host_array(name, values)
    if raw.dtype.kind in "fiu":
        _refuse_bools(name, values, "real numbers")
    if raw.dtype == np.bool_ or raw.dtype.kind not in "fiu":
        if raw.dtype.kind == "c":
            raise ValueError(f"{name} has complex entries; expected real numbers")
        if raw.dtype.kind != "O" or raw.size == 0:
            if raw.size == 0 and raw.dtype.kind in "OU":
                return np.asarray(raw, dtype=np.float64), np.dtype(np.float64)
            raise ValueError(f"{name} must hold real numbers, got dtype {raw.dtype}")
        try:
            out: FloatArray = np.array(
                [real_scalar(name, x) for x in raw.reshape(-1)], dtype=np.float64
            ).reshape(raw.shape)
        except TypeError:
            raise ValueError(f"{name} must hold real numbers (a ragged or nested row?)") from None
        return out, out.dtype
    return np.asarray(raw, dtype=np.float64), raw.dtype


def real_scalar(name: str, x: object) -> float:
    """``x`` as a ``float``: ``ValueError`` naming ``name`` for ``bool``, text, complex or ``None``."""
    if isinstance(x, bool | np.bool_) or not isinstance(x, numbers.Real):
        raise ValueError(f"{name} has a non-numeric entry {x!r}")
    return float(x)


def check_int(name: str, value: object, *, minimum: int | None = None) -> int:
    """``value`` as an ``int``: integers and integral floats (``1.0``), not ``1.7``, ``True`` or text."""
    if type(value) is int:  # the common case, without the abstract-class checks below (bool is not int here)
        if minimum is not None and value < minimum:
            raise ValueError(f"{name} must be >= {minimum}, got {value}")
        return value
    if isinstance(value, bool | np.bool_) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if isinstance(value, numbers.Integral):
        out = int(value)
    else:
        f = float(value)
        if not np.isfinite(f) or f != round(f):
            raise ValueError(f"{name} must be an integer, got {value!r}")
        out = int(f)
    if minimum is not None and out < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {out}")
    return out


def as_rng(rng: object, name: str = "rng") -> np.random.Generator:
    """A :class:`numpy.random.Generator` from a ``Generator`` or an integer seed (``>= 0``)."""
    if isinstance(rng, np.random.Generator):
        return rng
    if isinstance(rng, bool | np.bool_) or not isinstance(rng, numbers.Integral):
        raise ValueError(f"{name} must be a numpy.random.Generator or an integer seed, got {type(rng).__name__}")
    return np.random.default_rng(check_int(name, rng, minimum=0))


def _row_precisions(rows: object, given: object) -> list[object] | None:
    """Each row's precision for a list or tuple of rows, else ``None``: a row's own dtype (arrays and tensors
    carry one), else ``given``, that of the array numpy built from all the rows (float32 only if every entry
    is).  Read off the rows, not by converting each one a second time."""
    if not isinstance(rows, list | tuple):
        return None
    return [own if (own := getattr(row, "dtype", None)) is not None else given for row in rows]


def check_prob_rows(
    name: str, rows: ArrayLike, *, dtype: object = None, row_dtypes: Sequence[object] | None = None
) -> FloatArray:
    """Return ``rows`` as a renormalised float64 ``(m, V)`` array or raise.

    ``name`` is the argument name used in error messages.  ``dtype``: the precision the caller gave the
    rows in, which sets the row-sum tolerance (:func:`row_sum_tol`); ``row_dtypes``: one per row, for rows
    given in different precisions; by default ``rows``' own (:func:`given_dtype`), row by row for a list or
    tuple of rows.
    """
    arr, given = as_real_array_with_dtype(name, rows)
    if row_dtypes is None and dtype is None:
        row_dtypes = _row_precisions(rows, given)
    if arr.ndim != 2:
        raise ValueError(f"{name} must be a 2-D array of probability rows, got shape {arr.shape}")
    if row_dtypes is not None:
        if len(row_dtypes) != arr.shape[0]:
            raise ValueError(f"{name}: {len(row_dtypes)} row precisions for {arr.shape[0]} rows")
        tol: float | FloatArray = np.array([row_sum_tol(d) for d in row_dtypes])
    else:
        tol = row_sum_tol(given if dtype is None else dtype)
    if arr.shape[1] == 0:
        raise ValueError(f"{name} has vocabulary size 0; need at least one token")
    # two reductions decide: a row's sum is NaN or infinite if the row holds NaN or ±inf, and its
    # minimum is negative (or NaN) if it holds a negative entry; the checks below only name the fault
    with np.errstate(invalid="ignore", over="ignore"):  # inf - inf is NaN here on purpose
        sums = arr.sum(axis=1)
        ok = np.isfinite(sums) & (np.abs(sums - 1.0) <= tol) & (arr.min(axis=1) >= 0.0)
    if ok.all():
        good: FloatArray = arr / sums[:, None]
        return good
    finite = np.isfinite(arr)
    if not finite.all():
        row = int(np.argwhere(~finite)[0, 0])
        raise ValueError(f"{name} row {row} contains NaN or infinite entries")
    if (arr < 0).any():
        row, col = (int(i) for i in np.argwhere(arr < 0)[0])
        raise ValueError(f"{name} row {row} has a negative entry {float(arr[row, col])!r} at token {col}")
    tols = np.broadcast_to(tol, sums.shape)
    row = int(np.argmax(np.abs(sums - 1.0) > tols))
    raise ValueError(f"{name} row {row} sums to {float(sums[row])!r}, not 1 (tolerance {float(tols[row]):g})")


def check_prob_row(name: str, row: ArrayLike) -> FloatArray:
    """One probability row as a renormalised float64 ``(V,)`` array or ``ValueError``: converted once, checked
    at the precision it came in (:func:`check_prob_rows` on it as a one-row table)."""
    arr, given = as_real_array_with_dtype(name, row)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be a 1-D probability row, got shape {arr.shape}")
    out: FloatArray = check_prob_rows(name, arr[None, :], dtype=given)[0]
    return out


def check_tokens(name: str, tokens: ArrayLike | Sequence[int], vocab: int) -> IntArray:
    """Return ``tokens`` as a 1-D int64 array with every id in ``[0, vocab)``."""
    if tokens is None:
        raise ValueError(f"{name} is None; expected a sequence of integer token ids")
    arr = host_array(name, tokens)
    if arr.dtype.kind in "fiu":
        _refuse_bools(name, tokens, "an integer token id")
    if arr.ndim != 1:
        raise ValueError(f"{name} must be a 1-D sequence of token ids, got shape {arr.shape}")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        if arr.dtype == np.bool_ or arr.dtype.kind not in "fO":
            raise ValueError(f"{name} must contain integer token ids, got dtype {arr.dtype}")
        try:
            ids = [check_int(f"{name}[{i}]", x) for i, x in enumerate(arr.tolist())]
        except ValueError as err:
            raise ValueError(f"{name} must contain integer token ids: {err}") from None
        arr = np.array(ids, dtype=object)  # Python ints until checked: 2**70 or 1e30 overflowed int64
    # the range is checked on the ids as given, before int64 (a uint64 2**64 - 1 would read as -1 there)
    outside = np.flatnonzero(((arr < 0) | (arr >= vocab)).astype(bool))
    if outside.size:
        i = int(outside[0])
        raise ValueError(f"{name}[{i}] = {int(arr[i])} is outside the vocabulary [0, {vocab})")
    return arr.astype(np.int64)


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
    q_arr, q_given = as_real_array_with_dtype("q_rows", q_rows)
    if q_arr.ndim == 2 and q_arr.shape[0] == 0:
        q: FloatArray = np.zeros((0, q_arr.shape[1]), dtype=np.float64)
    else:  # converted once (above); the rows as given set the tolerance
        q = check_prob_rows("q_rows", q_arr, dtype=q_given, row_dtypes=_row_precisions(q_rows, q_given))
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
