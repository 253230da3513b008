"""Chain verifiers: SpS, ASpS and block verification, as exact kernels and samplers.

Notation (DESIGN.md §3): ``p`` is the target model, ``q`` the draft.  A step
verifies ``n`` draft tokens ``ref`` with ``q_rows[i] = q(· | prefix + ref[:i])``
(shape ``(n, V)``) and ``p_rows[i] = p(· | prefix + ref[:i])`` (shape
``(n + 1, V)``).  Kernels follow the one indexing convention stated in the
:mod:`tmc` package docstring (``K[k, b]``: emit ``ref[:k] + [b]``); for every
lossless verifier here ``K[k, ref[k]] == 0`` for ``k < n`` as well: exactly for
SpS and ASpS, and up to rounding for block verification (a few 1e-16 per
drafted position: up to 1.2e-15 in 200,000 random chains of up to 4 tokens), whose
``(a p − q)_+`` can keep mass at the drafted token when the renormalised rows
sum to 1 only within rounding (``p`` above ``q`` at every token of a row).

References:

* SpS — Leviathan et al. 2023 / Chen et al. 2023; TMC paper eq. (1).
* ASpS — Accelerated Speculative Sampling, TMC paper §5.1 (the recursive
  neighbour distributions) and Algorithm 1.  With ``w_k`` the continuing
  mass after ``k`` accepted tokens (``P_N_s`` in Algorithm 1) the algorithm
  emits ``E_k = (w_k p_k − q_k)_+`` at step ``k`` and rescales everything
  emitted so far by ``r(a)/q(a) = (1 − w_{k+1}) / D_k`` with
  ``D_k = Σ (q_k − w_k p_k)_+``.  The degenerate step ``D_k = 0`` (then
  ``q_k = p_k`` and ``w_k = 1``) uses ``r = q`` as DESIGN.md §4 prescribes,
  i.e. a factor of 1.
* Block verification — Sun et al. 2024, "Block verification accelerates
  speculative decoding": running weight ``a_i = min(1, a_{i−1} p(y_i)/q(y_i))``,
  residual ``(a_i p_i − q_i)_+`` with mass ``h_i``, stop at ``i`` with
  probability ``h_i / (h_i + 1 − a_i)`` (``a_n`` at the end of the block),
  scanning backwards from ``i = n``; ``τ = 0`` when no stop fires.

Numerics: long chains multiply many ratios, so the running weights are kept
as logarithms and the products of rescaling factors are summed in log space
(the paper works in log space too).  ``w p − q`` is formed as
``(p − q) − (1 − w) p`` when ``w ≥ 1/2``, so nearly equal draft and target
rows (where the interesting mass is a tiny difference) keep full relative
accuracy; ``p − q`` at a token both rows hold above 1/2 is the difference of
the rests (:func:`tmc.residual.row_difference`), and so is the ratio test's
``p(y) − q(y)`` there.  ASpS divides each emitted row by its own ``D_j``
before the later steps' factors apply (a tiny ``D_j`` made ``exp``
overflow).  The kernels stay non-negative and normalised to ~1e-12 for
``n = 64``, ``V = 32000`` with probabilities down to 1e-30.

Noise layout of the samplers (each is a pure function of its uniforms):

* ``sps``: ``n + 1`` uniforms; ``u[i]`` is the accept test of ``ref[i]``,
  ``u[n]`` draws the corrected or bonus token.
* ``block``: ``n + 1`` uniforms; ``u[i − 1]`` is the stop test ``η_i`` of
  position ``i``, ``u[n]`` draws the final token.
* ``asps``: 1 uniform, an inverse-CDF draw from the flattened kernel (as in
  Algorithm 1, which samples ``(gen_len, last_token)`` from ``P_N``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from numpy.typing import ArrayLike, NDArray

from tmc.noise import categorical, check_uniforms
from tmc.residual import difference_at, residual, row_difference
from tmc.validate import as_rng, check_chain

FloatArray = NDArray[np.float64]
_LOG_HALF = math.log(0.5)


def _log(x: float) -> float:
    return math.log(x) if x > 0.0 else -math.inf


def _one_minus_exp(log_x: float) -> float:
    """``1 − exp(log_x)`` without cancellation for ``log_x`` near 0."""
    return -math.expm1(log_x)


def _scaled_excess(log_w: float, p_row: FloatArray, q_row: FloatArray) -> FloatArray:
    """``w · p − q`` elementwise, accurate for ``w`` near 1 and for tiny ``w``."""
    if log_w >= _LOG_HALF:
        # p − q is exact for close values (Sterbenz), and at a token both rows hold above 1/2 it is the
        # difference of the rests (tmc.residual.row_difference); (1 − w) p carries the rest.
        return row_difference(p_row, q_row) - _one_minus_exp(log_w) * p_row
    return math.exp(log_w) * p_row - q_row


def _log_ratio(p_row: FloatArray, q_row: FloatArray, tok: int) -> float:
    """``log(p / q)`` with full relative accuracy when ``p`` and ``q`` are close.

    ``log1p((p − q) / q)`` only for ``q/2 ≤ p ≤ 2q`` (and ``p > 0``), where ``p − q`` is exact (Sterbenz) and
    the quotient lies in ``[−1/2, 1]``; elsewhere ``log p − log q``, which is finite for every positive pair.
    (The quotient overflowed to +inf beside a subnormal ``q``, and ``−inf + inf`` after a draft of ``p = 0``
    made the running weight NaN, which ``min(0, NaN)`` turned into a weight of 1; ``q = 5e-324`` rounds
    ``q/2`` to 0, so ``p = 0`` took ``log1p(−1)``, a domain error.)"""
    p_tok, q_tok = float(p_row[tok]), float(q_row[tok])
    if 0.0 < p_tok and 0.5 * q_tok <= p_tok <= 2.0 * q_tok:
        # p − q as tmc.residual.difference_at forms it: at a token both rows hold above 1/2, the
        # difference of the rests (1.0 − 1.0 lost a ratio of 1 − 1e-17)
        return math.log1p(difference_at(p_row, q_row, tok) / q_tok)
    return _log(p_tok) - math.log(q_tok)


def _next_log_weight(log_w: float, p_row: FloatArray, q_row: FloatArray, tok: int) -> float:
    """``log min(1, w · p(y) / q(y))`` for ``y = tok``: the weight after accepting ``y``."""
    return min(0.0, log_w + _log_ratio(p_row, q_row, tok))


# --------------------------------------------------------------------- SpS


def sps_kernel(ref: ArrayLike | Sequence[int], q_rows: ArrayLike, p_rows: ArrayLike) -> FloatArray:
    """Exact output law ``(n + 1, V)`` of standard speculative sampling.

    ``K[k] = Π_{j<k} α_j · (1 − α_k) · (p_k − q_k)_+ / Σ (p_k − q_k)_+`` with
    ``α_j = min(1, p_j(ref[j]) / q_j(ref[j]))`` and ``K[n] = Π α_j · p_n``.
    """
    toks, q, p = check_chain(ref, q_rows, p_rows)
    n = toks.shape[0]
    kernel = np.zeros_like(p)
    log_reach = 0.0  # log P(ref[:k] all accepted)
    for k in range(n):
        a = int(toks[k])
        log_acc = _next_log_weight(0.0, p[k], q[k], a)
        reject = _one_minus_exp(log_acc)
        if reject > 0.0:
            kernel[k] = math.exp(log_reach) * reject * residual(p[k], q[k], a)
        log_reach += log_acc
    kernel[n] = math.exp(log_reach) * p[n]
    return kernel


def sps_sample_from_uniforms(
    ref: ArrayLike | Sequence[int], q_rows: ArrayLike, p_rows: ArrayLike, u: ArrayLike
) -> list[int]:
    """One SpS step driven by ``n + 1`` explicit uniforms (layout in the module doc)."""
    toks, q, p = check_chain(ref, q_rows, p_rows)
    return _sps_step(toks, q, p, check_uniforms("u", u, toks.shape[0] + 1))


def _sps_step(toks: NDArray[np.int64], q: FloatArray, p: FloatArray, uu: FloatArray) -> list[int]:
    n = toks.shape[0]
    for k in range(n):
        a = int(toks[k])
        if uu[k] < float(p[k, a]) / float(q[k, a]):  # Python floats: no overflow warning (_log_ratio)
            continue
        return [int(t) for t in toks[:k]] + [categorical(residual(p[k], q[k], a), float(uu[n]))]
    return [int(t) for t in toks] + [categorical(p[n], float(uu[n]))]


def sps_sample(
    ref: ArrayLike | Sequence[int], q_rows: ArrayLike, p_rows: ArrayLike, rng: np.random.Generator | int
) -> list[int]:
    """One SpS step: the emitted tokens (accepted drafts plus one corrected or bonus token).

    ``rng`` is a ``numpy.random.Generator`` or an integer seed.
    """
    toks, q, p = check_chain(ref, q_rows, p_rows)
    return _sps_step(toks, q, p, as_rng(rng).random(toks.shape[0] + 1))


# -------------------------------------------------------------------- ASpS


def asps_kernel(ref: ArrayLike | Sequence[int], q_rows: ArrayLike, p_rows: ArrayLike) -> FloatArray:
    """Exact output law ``(n + 1, V)`` of ASpS (TMC paper Algorithm 1).

    Algorithm 1 rescales the whole of ``P_N`` at every step; here the
    per-step factors are accumulated as log suffix sums instead, which gives
    the same array in ``O(n V)`` time without underflow of intermediate
    products.
    """
    return _asps_kernel(*check_chain(ref, q_rows, p_rows))


def _asps_kernel(toks: NDArray[np.int64], q: FloatArray, p: FloatArray) -> FloatArray:
    """:func:`asps_kernel` on inputs already validated by :func:`check_chain`."""
    n = toks.shape[0]
    kernel = np.zeros_like(p)
    log_factor = np.zeros(n)  # log of the rescaling applied at step j: log((1 − w_{j+1}) / D_j)
    log_keep = np.zeros(n)  # its numerator, log(1 − w_{j+1}): row j is divided by D_j itself
    log_w = 0.0  # log P_N_s
    for j in range(n):
        a = int(toks[j])
        emitted = np.maximum(_scaled_excess(log_w, p[j], q[j]), 0.0)
        # D_j = Σ(q − w p)_+ = (1 − w) + Σ(w p − q)_+ for normalised rows.
        mass_d = _one_minus_exp(log_w) + float(emitted.sum())
        # Whenever the step is not degenerate and its factor is positive,
        # q(a) > w p(a), so nothing is emitted at the drafted token itself.
        emitted[a] = 0.0
        log_w_next = _next_log_weight(log_w, p[j], q[j], a)
        if log_w == 0.0 and log_w_next < 0.0 and float(emitted.sum()) == 0.0:
            # a rejection at full weight with no residual mass left by rounding (q = [1e-300, 1.0] sums
            # to 1 in floats, and (p − q)_+ lost q's tiny entry): the kernel summed to 0 and the samplers
            # raised.  At full weight this step's row is SpS's residual, so take the one residual rule
            # (tmc.residual, as SpS and block do); every earlier row is 0 at full weight.
            emitted, mass_d = residual(p[j], q[j], a), 1.0
        if mass_d > 0.0:
            log_keep[j] = _log(_one_minus_exp(log_w_next))
            log_factor[j] = log_keep[j] - math.log(mass_d)
            emitted = emitted / mass_d  # row j's own D_j divided here: a tiny D_j (1e-300) made exp(690)
        kernel[j] = emitted
        log_w = log_w_next
    if n:
        # row j: (E_j / D_j) (1 − w_{j+1}) Π_{i>j} (1 − w_{i+1}) / D_i
        suffix = log_keep + np.append(np.cumsum(log_factor[:0:-1])[::-1], 0.0)
        with np.errstate(over="ignore"):
            scale = np.exp(suffix)
        big = np.isinf(scale)  # a factor past the float range (tiny D_i beside subnormal q's): in log space
        kernel[:n] *= np.where(big, 1.0, scale)[:, None]
        if big.any():
            with np.errstate(divide="ignore"):  # log 0 = -inf: an entry of 0 stays 0
                kernel[:n][big] = np.exp(np.log(kernel[:n][big]) + suffix[big][:, None])
    kernel[n] = math.exp(log_w) * p[n]
    return kernel


def asps_sample_from_uniforms(
    ref: ArrayLike | Sequence[int], q_rows: ArrayLike, p_rows: ArrayLike, u: ArrayLike
) -> list[int]:
    """One ASpS step driven by a single uniform (``u`` of shape ``(1,)``)."""
    toks, q, p = check_chain(ref, q_rows, p_rows)
    return _asps_step(toks, q, p, check_uniforms("u", u, 1))


def _asps_step(toks: NDArray[np.int64], q: FloatArray, p: FloatArray, uu: FloatArray) -> list[int]:
    kernel = _asps_kernel(toks, q, p)
    flat = categorical(kernel.reshape(-1), float(uu[0]))
    k, b = divmod(flat, kernel.shape[1])
    return [int(t) for t in toks[:k]] + [int(b)]


def asps_sample(
    ref: ArrayLike | Sequence[int], q_rows: ArrayLike, p_rows: ArrayLike, rng: np.random.Generator | int
) -> list[int]:
    """One ASpS step: the emitted tokens (accepted drafts plus one corrected or bonus token).

    ``rng`` is a ``numpy.random.Generator`` or an integer seed.
    """
    toks, q, p = check_chain(ref, q_rows, p_rows)
    return _asps_step(toks, q, p, as_rng(rng).random(1))


# ------------------------------------------------------------------- block


def block_forward(
    toks: NDArray[np.int64], q: FloatArray, p: FloatArray
) -> tuple[FloatArray, FloatArray, FloatArray]:
    """Forward pass of block verification on validated inputs (see :func:`check_chain`).

    Returns ``(residuals, log_stop, log_keep)``: ``residuals[i]`` is
    ``(a_i p_i − q_i)_+`` (shape ``(n, V)``), ``log_stop[i]`` the log
    probability that the backward scan stops at position ``i`` (index ``n``
    is the end of the block, stop probability ``a_n``) and ``log_keep[i]``
    the log probability that it passes position ``i`` (``1 −`` stop).
    Position 0 never needs a test: it is where the scan ends by default.
    """
    n = toks.shape[0]
    residuals = np.zeros_like(q)
    log_stop = np.full(n + 1, -math.inf)
    log_keep = np.zeros(n + 1)
    log_a = 0.0  # a_0 = 1
    for i in range(n):
        res = np.maximum(_scaled_excess(log_a, p[i], q[i]), 0.0)
        h = float(res.sum())
        denom = h + _one_minus_exp(log_a)  # h_i + 1 − a_i
        # Rounding can leave no residual mass where τ = i still has ~1e-16
        # probability (p ≈ q): fall back to the one residual rule.
        residuals[i] = res if h > 0.0 else residual(p[i], q[i], int(toks[i]))
        y = int(toks[i])
        log_a_next = _next_log_weight(log_a, p[i], q[i], y)
        if i > 0 and denom > 0.0:
            log_stop[i] = _log(h) - math.log(denom)
            log_keep[i] = _log(_one_minus_exp(log_a)) - math.log(denom)
        elif i > 0 and log_a_next < 0.0:
            # a_i = 1 and no residual mass although p(y) < q(y): rows equal but for an entry a few ulps lower
            # in p (renormalised, p ≤ q everywhere; tests' ULP_DEFICIT_P).  Exactly (the float rows as
            # rationals renormalised) the scan stops here, as ASpS emits its residual at full weight
            # (_asps_kernel); passing on put that mass on an earlier draft, whose p may equal its q.
            log_stop[i], log_keep[i] = 0.0, -math.inf
        log_a = log_a_next
    log_stop[n] = log_a
    log_keep[n] = _log(_one_minus_exp(log_a))
    log_stop[0] = 0.0
    return residuals, log_stop, log_keep


def block_kernel(ref: ArrayLike | Sequence[int], q_rows: ArrayLike, p_rows: ArrayLike) -> FloatArray:
    """Exact output law ``(n + 1, V)`` of block verification (Sun et al. 2024).

    ``P(τ = k) = stop_k · Π_{j>k} (1 − stop_j)`` with ``stop_0 = 1``; the
    step emits ``ref[:k]`` then a token from ``(a_k p_k − q_k)_+`` (or from
    ``p_n`` when ``k = n``).
    """
    toks, q, p = check_chain(ref, q_rows, p_rows)
    n = toks.shape[0]
    residuals, log_stop, log_keep = block_forward(toks, q, p)
    # log Π_{j>k} (1 − stop_j) for k = 0..n
    keep_after = np.append(np.cumsum(log_keep[:0:-1])[::-1], 0.0)
    log_tau = log_stop + keep_after
    kernel = np.zeros_like(p)
    for k in range(n):
        h = float(residuals[k].sum())
        if h > 0.0 and log_tau[k] > -math.inf:
            kernel[k] = residuals[k] * math.exp(log_tau[k]) / h
    kernel[n] = math.exp(log_tau[n]) * p[n]
    return kernel


def block_sample_from_uniforms(
    ref: ArrayLike | Sequence[int], q_rows: ArrayLike, p_rows: ArrayLike, u: ArrayLike
) -> list[int]:
    """One block-verification step driven by ``n + 1`` uniforms (layout in the module doc)."""
    toks, q, p = check_chain(ref, q_rows, p_rows)
    return _block_step(toks, q, p, check_uniforms("u", u, toks.shape[0] + 1))


def _block_step(toks: NDArray[np.int64], q: FloatArray, p: FloatArray, uu: FloatArray) -> list[int]:
    n = toks.shape[0]
    residuals, log_stop, _ = block_forward(toks, q, p)
    tau = 0
    for i in range(n, 0, -1):
        if uu[i - 1] < math.exp(log_stop[i]):
            tau = i
            break
    final = p[n] if tau == n else residuals[tau]
    return [int(t) for t in toks[:tau]] + [categorical(final, float(uu[n]))]


_STEPS = {"sps": _sps_step, "asps": _asps_step, "block": _block_step}


def chain_sample_trusted(
    method: str, ref: NDArray[np.int64], q_rows: FloatArray | None, p_rows: FloatArray, u: FloatArray
) -> list[int]:
    """``{method}_sample_from_uniforms`` without its checks, for callers whose inputs are valid by construction.

    ``method`` is ``"sps"``, ``"asps"`` or ``"block"`` (else ``ValueError``).  The caller vouches
    for what :func:`~tmc.validate.check_chain` and
    :func:`~tmc.noise.check_uniforms` would check: ``ref`` int64 ids in
    ``[0, V)``, ``q_rows`` ``(n, V)`` and ``p_rows`` ``(n + 1, V)`` float64
    rows that are finite, non-negative and sum to 1 within
    :data:`~tmc.validate.ROW_SUM_TOL`, ``q > 0`` at every drafted token, and
    ``u`` float64 uniforms in ``[0, 1)`` of the method's count.  ``q_rows = None``
    stands for point masses at ``ref`` (a deterministic draft).  The rows are
    renormalised as ``check_chain`` renormalises them, so the tokens are
    those of the checked sampler (tested); bad input gives garbage, not an
    error.  SpS divides by the row sums only the entries and rows it reads
    (the same quotients, so the same tokens).  The LLM decode loop calls it
    on softmax rows whose logits it checked, where the checks cost more than
    the step.
    """
    step = _STEPS.get(method)
    if step is None:
        raise ValueError(f"method must be one of {', '.join(_STEPS)}, got {method!r}")
    if method == "sps":
        return _sps_trusted(ref, q_rows, p_rows, u)
    if q_rows is None:
        q_rows = _point_masses(ref, p_rows.shape[1])
    return step(ref, q_rows / q_rows.sum(axis=1)[:, None], p_rows / p_rows.sum(axis=1)[:, None], u)


def _point_masses(ref: NDArray[np.int64], vocab: int) -> FloatArray:
    rows = np.zeros((ref.shape[0], vocab))
    rows[np.arange(ref.shape[0]), ref] = 1.0
    return rows


def _sps_trusted(toks: NDArray[np.int64], q: FloatArray | None, p: FloatArray, uu: FloatArray) -> list[int]:
    """:func:`_sps_step` on rows renormalised lazily: each entry or row the step reads is divided by
    its row's sum, the quotient the full renormalisation gives there.  ``q = None``: point masses."""
    n = toks.shape[0]
    p_sum = p.sum(axis=1)
    q_sum = None if q is None else q.sum(axis=1)
    for k in range(n):
        a = int(toks[k])
        q_a = 1.0 if q is None or q_sum is None else float(q[k, a]) / float(q_sum[k])
        if uu[k] < float(p[k, a]) / float(p_sum[k]) / q_a:  # Python floats: no overflow warning (_log_ratio)
            continue
        q_row = _point_masses(toks[k : k + 1], p.shape[1])[0] if q is None or q_sum is None else q[k] / q_sum[k]
        return [int(t) for t in toks[:k]] + [categorical(residual(p[k] / p_sum[k], q_row, a), float(uu[n]))]
    return [int(t) for t in toks] + [categorical(p[n] / p_sum[n], float(uu[n]))]


def block_sample(
    ref: ArrayLike | Sequence[int], q_rows: ArrayLike, p_rows: ArrayLike, rng: np.random.Generator | int
) -> list[int]:
    """One block-verification step: the emitted tokens.

    ``rng`` is a ``numpy.random.Generator`` or an integer seed.
    """
    toks, q, p = check_chain(ref, q_rows, p_rows)
    return _block_step(toks, q, p, as_rng(rng).random(toks.shape[0] + 1))
