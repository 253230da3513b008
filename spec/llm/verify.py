"""Torch ports of the lossless verifiers, for the LLM decode loop (DESIGN.md §4, §8).

Notation (DESIGN.md §3): ``p`` is the **target** model, ``q`` the **draft**.
Each verifier here is a port, operation for operation in float64, of one numpy
reference sampler of :mod:`tmc`, driven by the same explicit uniforms, and it
emits the same tokens (STYLE.md rule 11; ``tests/spec/llm/test_verify_torch.py``
checks equality on identical noise).  The algorithms, their papers and the
proofs that they are lossless are stated in those modules and not repeated:

=====================  =====  =====================================================  ===============
method                 kind   numpy reference (noise layout in its module doc)        uniforms
=====================  =====  =====================================================  ===============
``sps``                chain  :func:`tmc.chain.sps_sample_from_uniforms`              ``n + 1``
``asps``               chain  :func:`tmc.chain.asps_sample_from_uniforms`             ``1`` (or ``n + 1``)
``block``              chain  :func:`tmc.chain.block_sample_from_uniforms`            ``n + 1``
``multidraft``         tree   :func:`tmc.multidraft.multidraft_sample_from_uniforms`  ``N + 1``
``traversal``          tree   :func:`tmc.traversal.traversal_sample_from_uniforms`    ``N + 1``
``ordered_traversal``  tree   :func:`tmc.ordered_traversal.ordered_traversal_sample_from_uniforms`  ``N + 1``
``kseq``               tree   :func:`tmc.kseq.kseq_sample_from_uniforms`              ``N + 1``
=====================  =====  =====================================================  ===============

ASpS draws its whole output with one uniform; it also takes the ``n + 1``
uniforms of the other chain methods and then uses ``uniforms[0]`` only, so a
decode loop can draw ``n + 1`` for every chain method (:func:`noise_size` gives
the minimum).

**API.**  :func:`verify_chain` and :func:`verify_tree` take a method name;
:data:`TORCH_VERIFIERS` maps every name to its function (chain methods, in
:data:`CHAIN_METHODS`, take ``(draft_tokens, draft_probs, target_probs,
uniforms)``; tree methods, in :data:`TREE_METHODS`, take ``(draft_tokens,
parents, draws, draft_probs, target_probs, uniforms)``).  Every verifier
returns a :class:`Verified`: the emitted tokens (accepted drafts plus one
corrected or bonus token), how many drafts were accepted and *which* draft
nodes — a tree with i.i.d. siblings can repeat a token, so the KV-cache gather
needs node indices, not tokens.

Arrays (shapes as in DESIGN.md §3; any float dtype, upcast to float64):

* chain: ``draft_tokens`` ``(n,)`` int; ``draft_probs`` ``(n, V)`` with row
  ``i`` the law ``draft_tokens[i]`` was drawn from, or ``None`` for a
  deterministic (greedy / top-1) draft, i.e. point masses at the drafted
  tokens; ``target_probs`` ``(n + 1, V)``; ``uniforms`` in ``[0, 1)``.
* tree with ``N`` nodes in topological order: ``draft_tokens`` ``(N,)``,
  ``parents`` ``(N,)`` (``-1`` = the root, else an earlier node), ``draws``
  one of ``"iid"`` / ``"swor"`` / ``"topk"`` (:class:`tmc.multidraft.Draw`)
  for all nodes or one per node; ``draft_probs`` ``(N + 1, V)``: row 0 is
  ``q`` at the root, row ``i + 1`` is ``q`` after node ``i`` — only the rows of
  nodes with ``iid`` or ``swor`` children are read and validated, the others
  may hold anything — or ``None`` when every node is ``topk``;
  ``target_probs`` ``(N + 1, V)`` in the same row layout.

Validation (DESIGN.md §3): ``ValueError`` naming the argument (and row) for a
wrong shape, a non-integer id, NaN / ±inf, a negative entry, a row that does
not sum to 1 within the tolerance of the precision it came in
(:func:`tmc.validate.row_sum_tol`: 1e-6 for float64, 1e-4 for float32, more
for float16 / bfloat16; rows are summed in float64), a token outside
``[0, V)``, a drafted token with ``q = 0`` under the law it was drawn from, a
uniform outside ``[0, 1)``, a malformed tree or an unknown method.  Rows are
then renormalised, as :mod:`tmc` does.

**Devices and host synchronisation.**  The chain verifiers run entirely on
the tensors' device (that of ``target_probs``), vectorised over positions:
the running weight ``log a_i = min(0, log a_{i-1} + log(p/q))`` is the closed
form ``S_i − max_{j≤i} S_j`` of the cumulative log ratios ``S``, and the one
host transfer at the end carries the validation flag together with the
accepted count and the emitted token.  A tree walk is sequential and
data-dependent (which child is tested next depends on earlier tests), so the
tree verifiers copy their inputs to the CPU in **one** device-to-host
transfer — the one host synchronisation of a tree step — and walk the tree
there in torch float64 (scalars as Python floats, which are float64).

**Equality with numpy.**  The operations are those of the numpy code in the
same order.  Row sums are taken strictly left to right (:func:`_total`):
that depends on the values only, so equal rows normalise to equal rows, and
for ``V < 8`` it is numpy's own order.  What can still differ is the last bit
of a sum for ``V ≥ 8`` (numpy sums pairwise; a CUDA scan differs from a CPU
loop), of ``exp`` / ``log`` / ``pow``, and of the chain's running weight,
computed in closed form rather than by the numpy loop.  Such a difference
changes an output only when a uniform falls within rounding distance of a
threshold.  (K-SEQ had one amplifier: at a node whose target row *equals* its
draft row, the feasibility test for ``ρ = 1`` turned on the last bit of
``β(1) = Σ q`` and the bisection stopped at ``ρ ≈ 1 + 2^-27``; since
:func:`tmc.kseq._feasible` decides that case as ``(1 − β)^k ≥ 1 − ρβ``, with
both sides 0 there, ``ρ = 1`` exactly for every ``V``.)  K-SEQ's bisection
itself is :mod:`tmc.kseq`'s, on host floats.  One deliberate
difference: ordered Traversal at a node with ``k ≥ 3`` children drawn
``swor`` enumerates the ``k``-tuples of the draft's support (as
:mod:`tmc.ordered_traversal` does); here a tree with a node that would
enumerate more than :data:`MAX_SWOR_TUPLES` tuples is refused with a
``ValueError`` before the walk (:func:`check_swor_enumeration`, which
:func:`spec.llm.host_verify.verify_tree_numpy` calls before the numpy
reference too) instead of running for hours.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, NamedTuple, Protocol

import numpy as np
import torch
from numpy.typing import ArrayLike

from spec.llm.sampling import categorical_draw as _categorical, point_rows
from tmc.kseq import RHO_RTOL, _bisect_rho, _geometric
from tmc.multidraft import ROOT, Draw
from tmc.ordered_traversal import MAX_SWOR_TUPLES, _binom_terms, swor_next_weights
from tmc.validate import ROW_SUM_TOL, ROW_SUM_TOLS, as_real_array, check_int

__all__ = [
    "CHAIN_METHODS",
    "MAX_SWOR_TUPLES",
    "SiblingTree",
    "TORCH_VERIFIERS",
    "TREE_METHODS",
    "Verified",
    "check_swor_enumeration",
    "noise_size",
    "verify_asps",
    "verify_block",
    "verify_chain",
    "verify_chain_on_device",
    "verify_kseq",
    "verify_multidraft",
    "verify_ordered_traversal",
    "verify_sps",
    "verify_traversal",
    "verify_tree",
]

Tensor = torch.Tensor
TensorLike = torch.Tensor | ArrayLike
DrawsLike = str | Draw | Sequence[str | Draw]
F64 = torch.float64
_LOG_HALF = math.log(0.5)

#: Chain verifiers: ``(draft_tokens, draft_probs, target_probs, uniforms)``.
CHAIN_METHODS: tuple[str, ...] = ("sps", "asps", "block")
#: Tree verifiers: ``(draft_tokens, parents, draws, draft_probs, target_probs, uniforms)``.
TREE_METHODS: tuple[str, ...] = ("multidraft", "traversal", "ordered_traversal", "kseq")


class SiblingTree(Protocol):
    """What :func:`check_swor_enumeration` reads of a tree: :class:`tmc.DraftTree` and this module's own."""

    @property
    def size(self) -> int: ...
    @property
    def draws(self) -> Sequence[Draw]: ...
    @property
    def q_rows(self) -> Mapping[int, Any]: ...  # (V,) draft row of each node with sampled children
    def children(self, node: int) -> Sequence[int]: ...


def check_swor_enumeration(method: str, tree: SiblingTree) -> None:
    """``ValueError`` before ordered Traversal starts on a tree it would take hours to verify.

    A node whose ``k ≥ 3`` children were drawn ``swor`` makes the verifier
    sum over every ordered ``k``-tuple of the tokens its draft row gives
    ``q > 0`` when it visits the node; more than :data:`MAX_SWOR_TUPLES` of
    them is refused for the whole tree, visited or not, so the same tree
    fails on every draw and on both backends (this module and
    :func:`spec.llm.host_verify.verify_tree_numpy`).  Other methods never
    enumerate: nothing is checked.
    """
    if method != "ordered_traversal":
        return
    for node in range(ROOT, tree.size):
        kids = tree.children(node)
        if len(kids) < 3 or tree.draws[kids[0]] != Draw.SWOR:
            continue
        k, support = len(kids), int((tree.q_rows[node] > 0.0).sum())
        if math.perm(support, k) > MAX_SWOR_TUPLES:
            raise ValueError(
                f"ordered_traversal: node {node} has {k} children drawn 'swor' from a draft row with {support} "
                f"possible tokens, which would enumerate {math.perm(support, k)} tuples (limit MAX_SWOR_TUPLES = "
                f"{MAX_SWOR_TUPLES}); use fewer children per node or another tree verifier"
            )


class Verified(NamedTuple):
    """What one verification step emits."""

    tokens: Tensor  # (n_accepted + 1,) int64 on the target's device: accepted drafts, then one corrected/bonus token
    n_accepted: int  # number of draft tokens accepted
    nodes: tuple[int, ...]  # accepted draft nodes, root side first (a chain: 0..n_accepted-1); for the KV gather


def noise_size(method: str, n: int) -> int:
    """Number of uniforms ``method`` needs for ``n`` draft tokens / nodes (1 for ASpS, else ``n + 1``)."""
    _check_method(method, CHAIN_METHODS + TREE_METHODS)
    n = check_int("n", n, minimum=0)
    return 1 if method == "asps" else n + 1


# ------------------------------------------------------------ conversions


def _check_method(method: object, known: tuple[str, ...]) -> str:
    if not isinstance(method, str) or method not in known:
        raise ValueError(f"method must be one of {', '.join(map(repr, known))}, got {method!r}")
    return method


def _device_of(x: object) -> torch.device:
    return x.device if isinstance(x, Tensor) else torch.device("cpu")


def _float_tensor(name: str, x: object, device: torch.device) -> Tensor:
    """``x`` as a float64 tensor on ``device``; ``ValueError`` for non-real data (bool and complex included)."""
    return _prob_tensor(name, x, device).to(F64)


#: Floating dtypes probability rows keep until they are checked: their precision sets the row-sum tolerance.
_KEPT = (torch.float32, torch.float16, torch.bfloat16, F64)
#: :data:`tmc.validate.ROW_SUM_TOLS` by torch dtype: a dict lookup, which traces under ``torch.compile``
#: (:func:`tmc.validate.row_sum_tol` asks numpy first).
_ROW_SUM_TOLS = {getattr(torch, name): tol for name, tol in ROW_SUM_TOLS.items()}


def _row_sum_tol(dtype: torch.dtype) -> float:
    return _ROW_SUM_TOLS.get(dtype, ROW_SUM_TOL)


def _prob_tensor(name: str, x: object, device: torch.device) -> Tensor:
    """``x`` as a tensor on ``device``, in its own precision if float32 / float16 / bfloat16 (a tensor's or a
    numpy array's: :data:`tmc.validate.ROW_SUM_TOLS` then checks the rows at that precision's tolerance),
    else float64; ``ValueError`` for non-real data (bool and complex included)."""
    if x is None:
        raise ValueError(f"{name} is None; expected a tensor of real numbers")
    if isinstance(x, Tensor):
        if x.dtype == torch.bool or x.is_complex():
            raise ValueError(f"{name} must hold real numbers, got dtype {x.dtype}")
        return x.to(device=device, dtype=x.dtype if x.dtype in _KEPT else F64)
    try:
        raw = np.asarray(x)
        if raw.dtype in (np.float32, np.float16):
            return torch.as_tensor(raw, device=device)
        return torch.as_tensor(as_real_array(name, raw), device=device)
    except (TypeError, RuntimeError) as err:
        raise ValueError(f"{name} must hold real numbers ({err})") from None
    except ValueError as err:
        if str(err).startswith(name):  # as_real_array's own message
            raise
        raise ValueError(f"{name} must hold real numbers ({err})") from None


def _long_tensor(name: str, x: object, device: torch.device) -> Tensor:
    """``x`` as a 1-D int64 tensor on ``device``; ``ValueError`` for non-integer ids."""
    if x is None:
        raise ValueError(f"{name} is None; expected a 1-D sequence of integer ids")
    if isinstance(x, Tensor):
        t = x
    else:
        try:
            t = torch.as_tensor(x)
        except (TypeError, ValueError, RuntimeError) as err:
            raise ValueError(f"{name} must be a 1-D sequence of integer ids ({err})") from None
    if t.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {tuple(t.shape)}")
    if t.numel() and (t.dtype == torch.bool or t.is_floating_point() or t.is_complex()):
        raise ValueError(f"{name} must hold integer ids, got dtype {t.dtype}")
    if t.dtype == getattr(torch, "uint64", None) and t.numel():  # past 2**63 - 1 it would read as negative in int64
        wrapped = torch.nonzero(t.cpu().view(torch.int64) < 0).flatten()
        if wrapped.numel():
            i = int(wrapped[0])
            raise ValueError(f"{name}[{i}] = {t.cpu().tolist()[i]} is outside the int64 range of token ids")
    return t.to(device=device, dtype=torch.int64)


def _check_matrix(name: str, x: Tensor, shape: tuple[int, int], what: str) -> None:
    if tuple(x.shape) != shape:
        raise ValueError(f"{name} has shape {tuple(x.shape)}; expected {what} = {shape}")


def _check_vector(name: str, x: Tensor, sizes: tuple[int, ...]) -> None:
    if x.ndim != 1 or x.shape[0] not in sizes:
        want = " or ".join(f"({s},)" for s in sizes)
        raise ValueError(f"{name} must have shape {want}, got {tuple(x.shape)}")


# ------------------------------------------------------------ validation


def _rows_bad(rows: Tensor) -> Tensor:
    """Device-side flag (0-d bool): some row is non-finite, negative or does not sum to 1 (within its
    precision's tolerance, :data:`tmc.validate.ROW_SUM_TOLS`)."""
    if rows.numel() == 0:
        return torch.zeros((), dtype=torch.bool, device=rows.device)
    return ~_rows_ok(rows)


def _rows_ok(rows: Tensor) -> Tensor:
    """0-d bool: every row finite, non-negative and summing to 1, from two reductions.

    A row's sum is NaN or infinite if the row holds NaN or ``±inf``, and its
    minimum is negative if it holds a negative entry (``-inf`` included), so
    ``sum`` and ``amin`` decide what three full passes would.
    """
    sums, mins = rows.sum(dim=1, dtype=F64), rows.amin(dim=1)
    return (torch.isfinite(sums) & ((sums - 1.0).abs() <= _row_sum_tol(rows.dtype)) & (mins >= 0.0)).all()


def _check_rows(name: str, rows: Tensor, labels: Sequence[int] | None = None) -> None:
    """Host check of probability rows ``(m, V)``; ``labels[i]`` is row ``i``'s index in the caller's array."""
    if rows.numel() == 0:
        return
    rows = rows.cpu()
    if bool(_rows_ok(rows)):
        return
    label = list(range(rows.shape[0])) if labels is None else list(labels)
    finite = torch.isfinite(rows)
    if not bool(finite.all()):
        row = int(torch.nonzero(~finite)[0, 0])
        raise ValueError(f"{name} row {label[row]} contains NaN or infinite entries")
    if bool((rows < 0).any()):
        row, col = (int(i) for i in torch.nonzero(rows < 0)[0])
        raise ValueError(f"{name} row {label[row]} has a negative entry {float(rows[row, col])!r} at token {col}")
    sums, tol = rows.sum(dim=1, dtype=F64), _row_sum_tol(rows.dtype)
    off = (sums - 1.0).abs() > tol
    if bool(off.any()):
        row = int(torch.nonzero(off)[0, 0])
        raise ValueError(f"{name} row {label[row]} sums to {float(sums[row])!r}, not 1 (tolerance {tol} for "
                         f"{str(rows.dtype).removeprefix('torch.')} rows)")


def _check_token_range(name: str, tok: Tensor, vocab: int) -> None:
    tok = tok.cpu()
    outside = (tok < 0) | (tok >= vocab)
    if bool(outside.any()):
        i = int(torch.nonzero(outside)[0, 0])
        raise ValueError(f"{name}[{i}] = {int(tok[i])} is outside the vocabulary [0, {vocab})")


def _check_uniforms(u: Tensor) -> None:
    u = u.cpu()
    ok = (u >= 0.0) & (u < 1.0)  # False for NaN
    if not bool(ok.all()):
        i = int(torch.nonzero(~ok)[0, 0])
        raise ValueError(f"uniforms[{i}] = {float(u[i])!r} is not a uniform draw in [0, 1)")


def _drafted_zero(q_tok: float, node: int, row: int, tok: int) -> ValueError:
    return ValueError(
        f"draft_tokens[{node}] = {tok} has draft_probs[{row}, {tok}] = {q_tok!r}: "
        "a draft token must have positive probability under the law it was drawn from"
    )


def _total(x: Tensor) -> Tensor:
    """Sum over the last axis, kept as a length-1 axis, added strictly left to right.

    ``Tensor.sum`` vectorises, and its last bit can depend on the data's
    memory alignment; a sequential sum depends on the values only, so two
    equal rows always get equal totals (``p == q`` must give ``p / q == 1``
    exactly, or ties in a ratio order break differently).  For ``V < 8`` it
    is also numpy's order (pairwise summation is sequential below 8 terms).

    Inside ``torch.compile`` (a fused step's verifier head) it is a sum reduction instead: inductor's
    scans are not sequential on a GPU either, and there a scan per total cost the SpS head about 20 of its
    47 µs on an H200 (torch 2.11, four ``4096``-token rows).  Inductor's kernel sums every row of a tensor
    in the same order, so equal rows of one tensor still get equal totals; rows of two tensors (``p`` and
    ``q``) may not, as with its scans before.
    """
    if torch.compiler.is_compiling():
        return x.sum(dim=-1, keepdim=True)
    return torch.cumsum(x, dim=-1)[..., -1:]


def _normalised_rows(rows: Tensor) -> Tensor:
    """Rows divided by their sums (validated rows sum to 1 within the tolerance; :mod:`tmc` does the same)."""
    return rows / _total(rows)


# ------------------------------------------------- shared numerical rules


def _row_difference(r: Tensor, law: Tensor) -> Tensor:
    """:func:`tmc.residual.row_difference` row by row ``(..., V)``: ``r − law``, and at a token where both
    exceed 1/2 the difference of the rests (``Σ_{t ≠ m} (law_t − r_t)``)."""
    diff = r - law
    m = r.argmax(dim=-1, keepdim=True)
    both = (r.gather(-1, m) > 0.5) & (law.gather(-1, m) > 0.5)
    rest = -diff.scatter(-1, m, 0.0).sum(dim=-1, keepdim=True)
    return torch.where(both, diff.scatter(-1, m, rest), diff)


def _residual_rows(r: Tensor, law: Tensor, rejected: Tensor, diff: Tensor | None = None) -> Tensor:
    """:func:`tmc.residual.residual` row by row: ``norm((r − law)_+)``, degenerate case included.

    ``r`` and ``law`` ``(m, V)``, ``rejected`` ``(m,)`` int64; returns ``(m, V)``.  ``diff``: their
    :func:`_row_difference` when the caller has it already.
    """
    res = torch.clamp_min(_row_difference(r, law) if diff is None else diff, 0.0)
    total = _total(res)
    rest = r.scatter(1, rejected[:, None], 0.0)
    left = _total(rest)
    return torch.where(total > 0.0, res / total, torch.where(left > 0.0, rest / left, r))


def _residual(r: Tensor, law: Tensor, rejected: int) -> Tensor:
    """:func:`_residual_rows` for one ``(V,)`` row."""
    return _residual_rows(r[None], law[None], torch.tensor([rejected], device=r.device))[0]


def _difference_at(r: Tensor, law: Tensor, tok: int) -> float:
    """``r(tok) − law(tok)``: :func:`tmc.residual.difference_at` (the rests' difference where both exceed 1/2)."""
    r_x, law_x = float(r[tok]), float(law[tok])
    if r_x > 0.5 and law_x > 0.5:
        return float(_row_difference(r, law)[tok])
    return r_x - law_x


def _acceptance_at(r: Tensor, law: Tensor, tok: int) -> float:
    """:func:`tmc.residual.acceptance_at`: the ratio test of ``tok``, 1 where both rows hold it above 1/2 and
    :func:`_difference_at` is not negative there."""
    r_x, law_x = float(r[tok]), float(law[tok])
    if r_x > 0.5 and law_x > 0.5 and _difference_at(r, law, tok) >= 0.0:
        return 1.0
    return _acceptance(r_x, law_x)


def _acceptance(r_x: float, law_x: float) -> float:
    """``min(1, r(x) / law(x))``: :func:`tmc.residual.acceptance_probability`."""
    if r_x <= 0.0:
        return 0.0
    if law_x <= 0.0:
        return 1.0
    return min(1.0, r_x / law_x)


# ------------------------------------------------------------------ chains


@dataclass(frozen=True)
class _Chain:
    """A chain step's inputs on the device: normalised float64 rows and a validation flag."""

    tok: Tensor  # (n,) int64 draft tokens, clamped into [0, V) so a bad id cannot index out of range
    q: Tensor  # (n, V) draft rows (point masses for a deterministic draft)
    p: Tensor  # (n + 1, V) target rows
    u: Tensor  # uniforms
    bad: Tensor  # 0-d bool: some input is invalid (then the host checks say which)
    raw: tuple[Tensor, Tensor | None, Tensor, Tensor]  # (draft_tokens, draft_probs, target_probs, uniforms) as given

    @property
    def n(self) -> int:
        return int(self.tok.shape[0])

    @property
    def vocab(self) -> int:
        return int(self.p.shape[1])


def _prepare_chain(
    method: str, draft_tokens: TensorLike, draft_probs: TensorLike | None, target_probs: TensorLike, uniforms: TensorLike,
    trusted: bool = False,
) -> _Chain:
    """Shapes checked on the host (no sync); values flagged on the device, unless ``trusted``
    (:func:`verify_chain_on_device`): then ``bad`` is a constant False and no value is checked."""
    device = _device_of(target_probs)
    p_raw = _prob_tensor("target_probs", target_probs, device)
    tok_raw = _long_tensor("draft_tokens", draft_tokens, device)
    n = int(tok_raw.shape[0])
    if p_raw.ndim != 2 or p_raw.shape[1] == 0:
        raise ValueError(f"target_probs must be a 2-D (n + 1, V) array with V >= 1, got shape {tuple(p_raw.shape)}")
    vocab = int(p_raw.shape[1])
    _check_matrix("target_probs", p_raw, (n + 1, vocab), "(n + 1, V)")
    u = _float_tensor("uniforms", uniforms, device)
    _check_vector("uniforms", u, (1, n + 1) if method == "asps" else (n + 1,))
    if trusted:  # ids in range by the caller's word: no clamp, no flag
        tok, bad = tok_raw, torch.zeros((), dtype=torch.bool, device=device)
    else:
        tok = tok_raw.clamp(0, vocab - 1)
        bad = _rows_bad(p_raw) | ((tok_raw < 0) | (tok_raw >= vocab)).any() | ~((u >= 0.0) & (u < 1.0)).all()
    q_raw: Tensor | None = None
    if draft_probs is None:
        q = point_rows(tok[:, None], vocab)
    else:
        q_raw = _prob_tensor("draft_probs", draft_probs, device)
        _check_matrix("draft_probs", q_raw, (n, vocab), "(n, V)")
        if not trusted:
            bad = bad | _rows_bad(q_raw) | (q_raw.gather(1, tok[:, None]) <= 0.0).any()
        q = _normalised_rows(q_raw.to(F64))
    return _Chain(tok, q, _normalised_rows(p_raw.to(F64)), u, bad, (tok_raw, q_raw, p_raw, u))


def _raise_chain_errors(chain: _Chain) -> None:
    """The host checks, run only when the device flag is set: raise the first ``ValueError``."""
    tok, q_raw, p_raw, u = chain.raw
    _check_rows("target_probs", p_raw)
    _check_token_range("draft_tokens", tok, chain.vocab)
    if q_raw is not None:
        _check_rows("draft_probs", q_raw)
        q_tok = q_raw.cpu().gather(1, tok.cpu()[:, None])[:, 0]
        for i, (t, qt) in enumerate(zip(tok.tolist(), q_tok.tolist())):
            if qt <= 0.0:
                raise _drafted_zero(qt, i, i, t)
    _check_uniforms(u)


def _log_weights(p_tok: Tensor, q_tok: Tensor, diff_tok: Tensor) -> Tensor:
    """``(n + 1,)`` log running weights ``L_0 = 0``, ``L_i = min(0, L_{i-1} + log(p(y)/q(y)))``.

    The log ratio is :func:`tmc.chain._log_ratio` (``log1p`` where ``q/2 ≤ p ≤ 2q``,
    exact for near-equal probabilities; never +inf, so no ``inf − inf`` below).  The recursion is evaluated without a
    loop: with ``S`` the cumulative sums of the log ratios (``S_0 = 0``),
    ``L_i = S_i − max_{j ≤ i} S_j``.  ``diff_tok`` is ``p(y) − q(y)`` as :func:`_row_difference` forms it.
    """
    close = (p_tok > 0.0) & (p_tok >= 0.5 * q_tok) & (p_tok <= 2.0 * q_tok)
    log_ratio = torch.where(close, torch.log1p(diff_tok / q_tok), torch.log(p_tok) - torch.log(q_tok))
    s = torch.cat([torch.zeros(1, dtype=F64, device=p_tok.device), torch.cumsum(log_ratio, dim=0)])
    return s - torch.cummax(s, dim=0).values


def _drafted(rows: Tensor, tok: Tensor) -> Tensor:
    """``rows[i, tok[i]]`` for ``i < n``: ``(n,)``."""
    return rows[: tok.shape[0]].gather(1, tok[:, None])[:, 0]


def _scaled_excess(log_w: Tensor, p: Tensor, q: Tensor, diff: Tensor) -> Tensor:
    """``w p − q`` row by row (``log_w`` ``(n,)``; ``diff``: ``_row_difference(p, q)``), as
    :func:`tmc.chain._scaled_excess` forms it."""
    miss = -torch.expm1(log_w)[:, None]  # 1 − w
    near_one = diff - miss * p
    return torch.where((log_w >= _LOG_HALF)[:, None], near_one, torch.exp(log_w)[:, None] * p - q)


def _sps_step(c: _Chain) -> tuple[Tensor, Tensor]:
    """SpS (:func:`tmc.chain.sps_sample_from_uniforms`): ``(k, b)`` as 0-d device tensors.

    ``k``, the drafts accepted before the first rejection, is the sum of the running product of the
    acceptances; the rejected draft's row is read at ``min(k, n - 1)`` (no padded copy of ``q``), and
    when every draft was accepted (``k == n``) that row's residual is computed but not used."""
    n = c.n
    if n == 0:  # no draft: the token comes from the root's row
        return torch.zeros((), dtype=torch.int64, device=c.p.device), _categorical(c.p[0], c.u[0])
    accept = c.u[:n] < _drafted(c.p, c.tok) / _drafted(c.q, c.tok)
    k = accept.to(torch.int64).cumprod(0).sum()
    pick = k.reshape(1)
    rejected = pick.clamp_max(n - 1)
    p_k = c.p.index_select(0, pick)
    corrected = _residual_rows(p_k, c.q.index_select(0, rejected), c.tok.index_select(0, rejected))
    final = torch.where(k == n, p_k, corrected)[0]
    return k, _categorical(final, c.u[n])


def _asps_step(c: _Chain) -> tuple[Tensor, Tensor]:
    """ASpS (:func:`tmc.chain.asps_sample_from_uniforms`): the kernel, then one inverse-CDF draw."""
    n, p, q = c.n, c.p, c.q
    diff = _row_difference(p[:n], q)
    log_w = _log_weights(_drafted(p, c.tok), _drafted(q, c.tok), _drafted(diff, c.tok))  # (n + 1,)
    miss = -torch.expm1(log_w)  # 1 − w
    emitted = torch.clamp_min(_scaled_excess(log_w[:n], p[:n], q, diff), 0.0)  # (n, V)
    mass_d = miss[:n] + _total(emitted)[:, 0]  # D_j = Σ (q − w p)_+
    emitted = emitted.scatter(1, c.tok[:, None], 0.0)
    # a rejection at full weight whose residual rounded away: the residual rule, as tmc.chain._asps_kernel
    lost = (log_w[:n] == 0.0) & (log_w[1:] < 0.0) & (_total(emitted)[:, 0] == 0.0)
    emitted = torch.where(lost[:, None], _residual_rows(p[:n], q, c.tok), emitted)
    mass_d = torch.where(lost, 1.0, mass_d)
    positive = mass_d > 0.0
    log_keep = torch.where(positive, torch.log(miss[1:]), 0.0)  # log(1 − w_{j+1})
    log_factor = torch.where(positive, log_keep - torch.log(mass_d), 0.0)
    emitted = torch.where(positive[:, None], emitted / mass_d[:, None], emitted)  # row j's own D_j (tmc.chain)
    later = torch.flip(torch.cumsum(torch.flip(log_factor[1:], [0]), dim=0), [0])  # Σ_{i>j} log factor_i
    suffix = log_keep + torch.cat([later, torch.zeros(1, dtype=F64, device=later.device)])
    scale = torch.exp(suffix)
    big = torch.isinf(scale)[:, None]  # a factor past the float range: in log space (tmc.chain._asps_kernel)
    scaled = torch.where(big, torch.exp(torch.log(emitted) + suffix[:, None]), emitted * torch.where(big, 1.0, scale[:, None]))
    kernel = torch.cat([scaled, (torch.exp(log_w[n]) * p[n])[None]])
    cell = _categorical(kernel.reshape(-1), c.u[0])
    return cell // c.vocab, cell % c.vocab


def _block_step(c: _Chain) -> tuple[Tensor, Tensor]:
    """Block verification (:func:`tmc.chain.block_sample_from_uniforms`)."""
    n, p, q, dev = c.n, c.p, c.q, c.p.device
    diff = _row_difference(p[:n], q)
    log_a = _log_weights(_drafted(p, c.tok), _drafted(q, c.tok), _drafted(diff, c.tok))  # (n + 1,)
    res = torch.clamp_min(_scaled_excess(log_a[:n], p[:n], q, diff), 0.0)  # (a_i p_i − q_i)_+
    h = _total(res)[:, 0]
    denom = h - torch.expm1(log_a[:n])  # h_i + 1 − a_i
    # no residual mass left by rounding: the one residual rule of tmc.residual
    residuals = torch.where((h > 0.0)[:, None], res, _residual_rows(p[:n], q, c.tok))
    # denom == 0 (a_i = 1, h_i rounded to 0) where p(y_i) < q(y_i): stop_i = 1, as tmc.chain.block_forward
    lost = torch.where(log_a[1:] < 0.0, 0.0, -math.inf)
    log_stop = torch.where(denom > 0.0, torch.log(h) - torch.log(denom), lost)
    stop = torch.exp(torch.cat([log_stop[1:], log_a[n:]]))  # positions 1..n
    fires = c.u[:n] < stop  # u[i − 1] tests position i
    positions = torch.arange(1, n + 1, device=dev)
    tau = torch.cat([torch.where(fires, positions, 0), torch.zeros(1, dtype=torch.int64, device=dev)]).max()
    final = torch.cat([residuals, p[n:]]).index_select(0, tau.reshape(1))[0]
    return tau, _categorical(final, c.u[n])


_CHAIN_STEPS: Mapping[str, Callable[[_Chain], tuple[Tensor, Tensor]]] = MappingProxyType(
    {"sps": _sps_step, "asps": _asps_step, "block": _block_step}
)


def verify_chain(
    method: str,
    draft_tokens: TensorLike,
    draft_probs: TensorLike | None,
    target_probs: TensorLike,
    uniforms: TensorLike,
) -> Verified:
    """One chain verification step on the device of ``target_probs`` (module doc: arrays, noise).

    ``method`` is ``"sps"``, ``"asps"`` or ``"block"``.  One host transfer:
    the validation flag, the accepted count and the emitted token together.
    """
    chain, head = _chain_head(method, draft_tokens, draft_probs, target_probs, uniforms)
    bad, n_acc, _ = head.tolist()
    if bad:
        _raise_chain_errors(chain)
    tokens = torch.cat([chain.tok[:n_acc], head[2:]])
    return Verified(tokens, n_acc, tuple(range(n_acc)))


def _chain_head(
    method: str, draft_tokens: TensorLike, draft_probs: TensorLike | None, target_probs: TensorLike, uniforms: TensorLike,
    trusted: bool = False,
) -> tuple[_Chain, Tensor]:
    """The prepared chain and ``(bad, k, b)`` as one int64 ``(3,)`` device tensor (not synchronised yet)."""
    step = _CHAIN_STEPS[_check_method(method, CHAIN_METHODS)]
    chain = _prepare_chain(method, draft_tokens, draft_probs, target_probs, uniforms, trusted)
    k, b = step(chain)
    return chain, torch.stack([chain.bad.to(torch.int64), k, b])


def verify_chain_on_device(
    method: str, draft_tokens: Tensor, draft_probs: Tensor | None, target_probs: Tensor, uniforms: Tensor,
    fault: Tensor, *, trusted: bool = False,
) -> tuple[Verified | None, list[int]]:
    """:func:`verify_chain` for a chain drafted on the device, with ONE host transfer for the step.

    ``fault`` is a 0-d bool device flag the caller raised on the way (logits
    that :func:`~spec.llm.sampling.process_logits` would refuse).  The
    transfer carries it, the verifier's validation flag, the accepted count,
    the emitted token and every draft token.  Returns the :class:`Verified`
    result (its tokens a host tensor) and the draft tokens as host ints, or
    ``(None, [])`` when ``fault`` is set: the caller then names the fault.
    The verifier's own faults raise as in :func:`verify_chain`.

    ``trusted``: skip the value checks (the flag of :func:`verify_chain` is
    then always clear), the torch twin of
    :func:`tmc.chain.chain_sample_trusted`: the rows are still renormalised,
    so valid input gives the same tokens, and bad rows or uniforms give
    garbage, not an error.  Token ids must then lie in ``[0, V)``: they are
    not clamped (an id outside indexes out of range).  For the decode loop
    (:func:`spec.llm.generate._chain_step`), whose rows are softmax rows of
    logits that ``fault`` vouches for, whose tokens were drawn from
    ``draft_probs`` (never at ``q = 0``) and clamped by the draft, and whose
    uniforms come from ``numpy``'s ``random()``: the checks are 45 of the
    verifier's 110–155 dispatched operations (``tests/spec/llm/test_opcount.py``),
    and on a GPU each costs a kernel launch.
    """
    chain, head = _chain_head(method, draft_tokens, draft_probs, target_probs, uniforms, trusted)
    got = torch.cat([fault.to(torch.int64).reshape(1), head, chain.tok]).tolist()
    if got[0]:
        return None, []
    bad, n_acc, b, drafted = got[1], got[2], got[3], got[4:]
    if bad:
        _raise_chain_errors(chain)
    return Verified(torch.tensor(drafted[:n_acc] + [b], dtype=torch.int64), n_acc, tuple(range(n_acc))), drafted


def verify_sps(
    draft_tokens: TensorLike, draft_probs: TensorLike | None, target_probs: TensorLike, uniforms: TensorLike
) -> Verified:
    """Standard speculative sampling: :func:`verify_chain` with ``"sps"``."""
    return verify_chain("sps", draft_tokens, draft_probs, target_probs, uniforms)


def verify_asps(
    draft_tokens: TensorLike, draft_probs: TensorLike | None, target_probs: TensorLike, uniforms: TensorLike
) -> Verified:
    """Accelerated speculative sampling (TMC paper Algorithm 1): :func:`verify_chain` with ``"asps"``."""
    return verify_chain("asps", draft_tokens, draft_probs, target_probs, uniforms)


def verify_block(
    draft_tokens: TensorLike, draft_probs: TensorLike | None, target_probs: TensorLike, uniforms: TensorLike
) -> Verified:
    """Block verification (Sun et al. 2024): :func:`verify_chain` with ``"block"``."""
    return verify_chain("block", draft_tokens, draft_probs, target_probs, uniforms)


# ------------------------------------------------------------------- trees


@dataclass(frozen=True)
class _Tree:
    """A validated draft tree on the CPU: structure, normalised float64 rows and uniforms."""

    parents: tuple[int, ...]  # parent of node i; ROOT = -1
    tokens: tuple[int, ...]  # token of node i
    draws: tuple[Draw, ...]  # how node i was drawn
    kids: tuple[tuple[int, ...], ...]  # children of node i at [i + 1], in draw order
    q_rows: Mapping[int, Tensor]  # (V,) draft row of every node with iid / swor children (ROOT: row 0)
    p: Tensor  # (N + 1, V) target rows: row 0 the root, row i + 1 after node i
    u: tuple[float, ...]  # N + 1 uniforms

    @property
    def size(self) -> int:
        return len(self.tokens)

    @property
    def vocab(self) -> int:
        return int(self.p.shape[1])

    def children(self, node: int) -> tuple[int, ...]:
        return self.kids[node + 1]

    def path(self, node: int) -> list[int]:
        """Nodes from the root's child down to ``node`` (empty for the root)."""
        out: list[int] = []
        while node != ROOT:
            out.append(node)
            node = self.parents[node]
        return out[::-1]


def _parse_draws(draws: object, n: int) -> tuple[Draw, ...]:
    if isinstance(draws, (str, Draw)):
        return (Draw.parse(draws, "draws"),) * n
    if draws is None or not hasattr(draws, "__len__") or not hasattr(draws, "__iter__"):
        raise ValueError(f"draws must be 'iid', 'swor', 'topk' or one of them per node, got {draws!r}")
    kinds = tuple(Draw.parse(d, f"draws[{i}]") for i, d in enumerate(draws))
    if len(kinds) != n:
        raise ValueError(f"draws has {len(kinds)} entries; expected one per node ({n})")
    return kinds


def _to_host(parts: Sequence[Tensor]) -> list[Tensor]:
    """Every part on the CPU in its own dtype, in one device-to-host copy (the tree step's one synchronisation;
    packed as float64, which holds float32 / float16 / bfloat16 values and ids below 2**53 exactly)."""
    on_device = [t for t in parts if t.device.type != "cpu"]
    if not on_device:
        return list(parts)
    packed = torch.cat([t.reshape(-1).to(F64) for t in on_device]).cpu()
    out: list[Tensor] = []
    offset = 0
    for t in parts:
        if t.device.type == "cpu":
            out.append(t)
            continue
        out.append(packed[offset : offset + t.numel()].reshape(t.shape).to(t.dtype))
        offset += t.numel()
    return out


def _tree_structure(parents: list[int], tokens: list[int], draws: tuple[Draw, ...], vocab: int) -> tuple[tuple[int, ...], ...]:
    """Children of every node, after checking parents, token range and sibling draw kinds."""
    kids: list[list[int]] = [[] for _ in range(len(tokens) + 1)]
    for i, (par, tok) in enumerate(zip(parents, tokens)):
        if not ROOT <= par < i:
            raise ValueError(f"parents[{i}] = {par}; a parent must be -1 (root) or an earlier node")
        if not 0 <= tok < vocab:
            raise ValueError(f"draft_tokens[{i}] = {tok} is outside the vocabulary [0, {vocab})")
        kids[par + 1].append(i)
    for node, group in enumerate(kids, start=ROOT):
        kinds = {draws[k] for k in group}
        if len(kinds) > 1:
            raise ValueError(f"children of node {node} mix draw kinds {sorted(k.value for k in kinds)}")
        toks = [tokens[k] for k in group]
        if kinds and kinds != {Draw.IID} and len(set(toks)) != len(toks):
            raise ValueError(f"children of node {node} repeat a token ({toks}) but were drawn '{kinds.pop().value}'")
    return tuple(tuple(k) for k in kids)


def _prepare_tree(
    draft_tokens: TensorLike,
    parents: TensorLike,
    draws: DrawsLike,
    draft_probs: TensorLike | None,
    target_probs: TensorLike,
    uniforms: TensorLike,
) -> _Tree:
    """Shapes checked, everything copied to the host at once, then rows, tree and uniforms validated there."""
    # each input stays where it is: _to_host copies what is on a device in one transfer
    device = _device_of(target_probs)
    p_dev = _prob_tensor("target_probs", target_probs, device)
    tok_dev = _long_tensor("draft_tokens", draft_tokens, _device_of(draft_tokens))
    par_dev = _long_tensor("parents", parents, _device_of(parents))
    u_dev = _float_tensor("uniforms", uniforms, _device_of(uniforms))
    n = int(tok_dev.shape[0])
    if p_dev.ndim != 2 or p_dev.shape[1] == 0:
        raise ValueError(f"target_probs must be a 2-D (N + 1, V) array with V >= 1, got shape {tuple(p_dev.shape)}")
    vocab = int(p_dev.shape[1])
    _check_matrix("target_probs", p_dev, (n + 1, vocab), "(N + 1, V)")
    _check_vector("parents", par_dev, (n,))
    _check_vector("uniforms", u_dev, (n + 1,))
    kinds = _parse_draws(draws, n)
    parts = [p_dev, tok_dev, par_dev, u_dev]
    if draft_probs is not None:
        q_dev = _prob_tensor("draft_probs", draft_probs, device)
        _check_matrix("draft_probs", q_dev, (n + 1, vocab), "(N + 1, V)")
        parts.append(q_dev)
    host = _to_host(parts)
    p_raw, tok, par, u = host[:4]
    tokens, parent_list = [int(t) for t in tok.tolist()], [int(t) for t in par.tolist()]
    _check_rows("target_probs", p_raw)
    kids = _tree_structure(parent_list, tokens, kinds, vocab)
    _check_uniforms(u)
    q_rows = _sampled_rows(host[4] if draft_probs is not None else None, kids, kinds, tokens)
    return _Tree(tuple(parent_list), tuple(tokens), kinds, kids, q_rows, _normalised_rows(p_raw.to(F64)),
                 tuple(u.tolist()))


def _sampled_rows(
    q_raw: Tensor | None, kids: tuple[tuple[int, ...], ...], kinds: tuple[Draw, ...], tokens: list[int]
) -> Mapping[int, Tensor]:
    """Normalised draft rows of the nodes whose children were drawn ``iid`` / ``swor``: the only rows read."""
    sampled = [node for node in range(ROOT, len(tokens)) if kids[node + 1] and kinds[kids[node + 1][0]] != Draw.TOPK]
    if not sampled:
        return MappingProxyType({})
    if q_raw is None:
        kind = kinds[kids[sampled[0] + 1][0]].value
        raise ValueError(f"draft_probs is None but node {sampled[0]} has children drawn '{kind}'")
    rows = [node + 1 for node in sampled]
    _check_rows("draft_probs", q_raw[rows], rows)
    q_rows = dict(zip(sampled, _normalised_rows(q_raw[rows].to(F64))))
    for node in sampled:
        for kid in kids[node + 1]:
            if float(q_rows[node][tokens[kid]]) <= 0.0:
                raise _drafted_zero(float(q_raw[node + 1, tokens[kid]]), kid, node + 1, tokens[kid])
    return MappingProxyType(q_rows)


def _point_mass(vocab: int, tok: int) -> Tensor:
    law = torch.zeros(vocab, dtype=F64)
    law[tok] = 1.0
    return law


def _proposal_laws(tree: _Tree, node: int) -> list[Tensor]:
    """The law each child of ``node`` was drawn from: :func:`tmc.multidraft.proposal_laws`."""
    laws: list[Tensor] = []
    removed = torch.zeros(tree.vocab, dtype=torch.bool)
    for i, kid in enumerate(tree.children(node)):
        kind, tok = tree.draws[kid], tree.tokens[kid]
        if kind == Draw.TOPK:
            laws.append(_point_mass(tree.vocab, tok))
        elif kind == Draw.IID:
            laws.append(tree.q_rows[node])
        else:  # swor: the first child from the stored row, none removed (tmc.multidraft.proposal_laws)
            if i == 0:
                laws.append(tree.q_rows[node])
            else:
                rest = torch.where(removed, 0.0, tree.q_rows[node])
                laws.append(rest / _total(rest))
            removed[tok] = True
    return laws


def _draw(row: Tensor, u: float) -> int:
    return int(_categorical(row, torch.tensor(u, dtype=F64)))


def _descend(tree: _Tree, step: Callable[[_Tree, int], int | Tensor]) -> tuple[int, int]:
    """From the root, move to the child ``step`` accepts until it returns a row instead:
    ``(last accepted node, token drawn from that row with the last uniform)``."""
    node = ROOT
    while True:
        got = step(tree, node)
        if not isinstance(got, int):
            return node, _draw(got, tree.u[tree.size])
        node = got


def _multidraft_walk(tree: _Tree) -> tuple[int, int]:
    """Recursive residual verification (:func:`tmc.multidraft.multidraft_sample_from_uniforms`): ``(node, token)``."""
    return _descend(tree, _residual_walk_step)


def _residual_walk_step(tree: _Tree, node: int) -> int | Tensor:
    """:func:`tmc.multidraft.residual_walk_step`: the child whose test passes, or the residual to emit from."""
    r = tree.p[node + 1]
    for kid, law in zip(tree.children(node), _proposal_laws(tree, node)):
        tok = tree.tokens[kid]
        if tree.u[kid] < _acceptance_at(r, law, tok):
            return kid
        r = _residual(r, law, tok)
    return r


# --- Traversal (tmc.traversal) and its ratio-ordered variant (tmc.ordered_traversal)

#: ``rule(tree, node, p_row) -> (children, laws)``: visiting order and proposal laws.
_ChildrenRule = Callable[[_Tree, int, Tensor], tuple[Sequence[int], Sequence[Tensor]]]


def _recorded_children(tree: _Tree, node: int, p_row: Tensor) -> tuple[Sequence[int], Sequence[Tensor]]:
    return tree.children(node), _proposal_laws(tree, node)


@dataclass
class _Frame:
    """A node on the traversal stack (:class:`tmc.traversal._Frame`)."""

    node: int  # node index (ROOT for the root)
    value: float  # acceptance value a
    miss: float  # 1 − a, carried separately
    row: Tensor  # (V,) residual row r
    kids: Sequence[int]  # children in visiting order
    laws: Sequence[Tensor]  # proposal law of each child
    next_kid: int = 0  # index into kids of the next child to visit


def _excess(value: float, miss: float, row: Tensor, law: Tensor) -> Tensor:
    """``a r − q``, formed as :func:`tmc.traversal._excess` does."""
    if value >= 0.5:
        return _row_difference(row, law) - miss * row
    return value * row - law


def _child_state(value: float, miss: float, row: Tensor, law: Tensor, tok: int) -> tuple[float, float]:
    """``(a_i, 1 − a_i)`` with ``a_i = min(1, a r(tok) / law(tok))``: :func:`tmc.traversal._child_state`."""
    q_tok, r_tok = float(law[tok]), float(row[tok])
    if r_tok <= 0.0:  # never accepted (tmc.traversal._child_state)
        return 0.0, 1.0
    diff = _difference_at(row, law, tok)
    gap = diff - miss * r_tok if value >= 0.5 else value * r_tok - q_tok
    if gap >= 0.0:
        return 1.0, 0.0
    child_miss = min(1.0, -gap / q_tok)
    if child_miss <= 0.5:
        return 1.0 - child_miss, child_miss
    return _acceptance(value * r_tok, q_tok), child_miss


def _delete_child(frame: _Frame, law: Tensor, tok: int) -> tuple[float, float, Tensor]:
    """``(a, 1 − a, r)`` after deleting a child: :func:`tmc.traversal._delete_child`."""
    excess = torch.clamp_min(_excess(frame.value, frame.miss, frame.row, law), 0.0)
    h = float(_total(excess))
    row = excess / h if h > 0.0 else _residual(frame.row, law, tok)
    total = frame.miss + h
    if total <= 0.0:
        return 1.0, 0.0, row
    return min(1.0, h / total), min(1.0, frame.miss / total), row


def _frame(tree: _Tree, node: int, value: float, miss: float, rule: _ChildrenRule) -> _Frame:
    kids, laws = rule(tree, node, tree.p[node + 1])
    return _Frame(node, value, miss, tree.p[node + 1], kids, laws)


def _traversal_tests(tree: _Tree, rule: _ChildrenRule) -> Iterator[tuple[int, float, Tensor]]:
    """``(node, a, row)`` of each test in post order, lazily; the root's (always passing) last."""
    stack = [_frame(tree, ROOT, 1.0, 0.0, rule)]
    while stack:
        top = stack[-1]
        if top.next_kid < len(top.kids):
            kid = top.kids[top.next_kid]
            value, miss = _child_state(top.value, top.miss, top.row, top.laws[top.next_kid], tree.tokens[kid])
            stack.append(_frame(tree, kid, value, miss, rule))
            continue
        stack.pop()
        if not stack:
            yield ROOT, 1.0, top.row
            return
        yield top.node, top.value, top.row
        parent = stack[-1]
        parent.value, parent.miss, parent.row = _delete_child(
            parent, parent.laws[parent.next_kid], tree.tokens[top.node]
        )
        parent.next_kid += 1


def _traversal_walk(tree: _Tree, rule: _ChildrenRule = _recorded_children) -> tuple[int, int]:
    """Traversal Verification (:func:`tmc.traversal.traversal_sample_from_uniforms`): ``(node, token)``."""
    for node, value, row in _traversal_tests(tree, rule):
        if node == ROOT or tree.u[node] < value:
            return node, _draw(row, tree.u[tree.size])
    raise AssertionError("the root's test always passes")  # pragma: no cover


def _ratio_order(p_row: Tensor, q_row: Tensor) -> list[int]:
    """Token ids by decreasing ``p / q`` (``q = 0`` last), ties to the lower id: :func:`tmc.ordered_traversal.ratio_order`."""
    keys = torch.where(q_row > 0.0, -(p_row / q_row), math.inf)
    return [int(t) for t in torch.argsort(keys, stable=True).tolist()]


def _mass_after_rows(x: Tensor, order: Tensor) -> Tensor:
    """``B(y)`` row by row: the mass of ``x`` ``(B, V)`` ranked after ``y`` in ``order`` ``(B, V)``, summed from
    the last rank up, as the numpy loop does (also the device walk's, :mod:`spec.llm.tree_device`)."""
    tail = torch.cumsum(x.gather(1, order).flip(-1), dim=-1).flip(-1)  # mass of rank >= i
    return torch.zeros_like(x).scatter(1, order, torch.cat([tail[:, 1:], torch.zeros_like(tail[:, :1])], dim=1))


def _one_minus_rows(q: Tensor) -> Tensor:
    """``1 − q(t)`` row by row ``(B, V)``, as the other tokens' mass where ``q(t) > 1/2``
    (:func:`tmc.ordered_traversal._one_minus`: ``1.0 − q`` loses a mass of 1e-17 beside ``q = 1.0``)."""
    big = q.argmax(dim=-1, keepdim=True)
    others = q.scatter(-1, big, 0.0).sum(dim=-1, keepdim=True)
    return torch.where(q > 0.5, others, 1.0 - q)


def _one_minus(q_row: Tensor) -> Tensor:
    """:func:`_one_minus_rows` of one row."""
    return _one_minus_rows(q_row[None])[0]


def _mass_after(q_row: Tensor, order: list[int]) -> Tensor:
    """``B(y)`` of one row."""
    return _mass_after_rows(q_row[None], torch.tensor([order], dtype=torch.int64))[0]


def _best_of(a: Tensor, b: Tensor, m: int) -> Tensor:
    """``(a + b)^m − b^m`` as ``a Σ_j (a + b)^j b^{m−1−j}``."""
    total = torch.zeros_like(a)
    for j in range(m):
        total += (a + b) ** j * b ** (m - 1 - j)
    return a * total


def _normalised(row: Tensor) -> Tensor:
    return row / _total(row)


def _iid_sorted_law(q_row: Tensor, order: list[int], k: int, prefix: list[int]) -> Tensor:
    """:func:`tmc.ordered_traversal.iid_sorted_law`: next of ``k`` sorted i.i.d. draws given the sorted ``prefix``."""
    after = _mass_after(q_row, order)
    if not prefix:
        return _normalised(_best_of(q_row, after, k))
    w = prefix[-1]
    c = prefix.count(w)
    m = k - (len(prefix) - c)
    q_w, rest = float(q_row[w]), float(after[w])
    pi, rest_pi = q_w / (q_w + rest), rest / (q_w + rest)  # shares, not 1 − π (tmc.ordered_traversal)
    terms = _binom_terms(m, pi, rest_pi, c)
    at_least = float(sum(terms))
    out = torch.zeros_like(q_row)
    out[w] = float(sum(terms[1:])) / at_least
    if rest > 0.0:
        below = torch.tensor(order[order.index(w) + 1 :], dtype=torch.int64)
        exact = terms[0] / at_least
        out[below] = exact * _best_of(q_row[below] / rest, after[below] / rest, m - c)
    return _normalised(out)


def _swor_sorted_law(q_row: Tensor, order: list[int], k: int, prefix: list[int]) -> Tensor:
    """:func:`tmc.ordered_traversal.swor_sorted_law`: next of ``k`` sorted draws without replacement."""
    vocab = q_row.shape[0]
    if k == 2:
        second = _one_minus(q_row)  # mass left for the second draw
        inv = torch.where(second > 0.0, 1.0 / torch.clamp_min(second, 1e-300), 0.0)
        if not prefix:
            out = q_row * (_mass_after(q_row, order) * inv + _mass_after(q_row * inv, order))
        else:
            y = prefix[0]
            below = torch.tensor(order[order.index(y) + 1 :], dtype=torch.int64)
            out = torch.zeros_like(q_row)
            out[below] = q_row[below] * (inv[y] + inv[below])
        return _normalised(out)
    q = q_row.tolist()
    support = [t for t in range(vocab) if q[t] > 0.0]  # at most MAX_SWOR_TUPLES tuples: check_swor_enumeration
    # the host enumeration itself, on the row's floats (a Python loop in either port)
    return _normalised(torch.tensor(swor_next_weights(q, support, order, k, prefix), dtype=F64))


def _ratio_ordered_children(tree: _Tree, node: int, p_row: Tensor) -> tuple[Sequence[int], Sequence[Tensor]]:
    """:func:`tmc.ordered_traversal.ratio_ordered_children`: children by decreasing ``p/q``, order-statistic laws."""
    kids = list(tree.children(node))
    if len(kids) < 2 or tree.draws[kids[0]] == Draw.TOPK:
        return _recorded_children(tree, node, p_row)
    q_row = tree.q_rows[node]
    order = _ratio_order(p_row, q_row)
    rank = {t: i for i, t in enumerate(order)}
    kids.sort(key=lambda c: rank[tree.tokens[c]])
    toks = [tree.tokens[c] for c in kids]
    sorted_law = _iid_sorted_law if tree.draws[kids[0]] == Draw.IID else _swor_sorted_law
    return kids, [sorted_law(q_row, order, len(kids), toks[:i]) for i in range(len(kids))]


def _ordered_traversal_walk(tree: _Tree) -> tuple[int, int]:
    return _traversal_walk(tree, _ratio_ordered_children)


# --- K-SEQ (tmc.kseq)



def _kseq_beta(p: Tensor, q: Tensor, rho: float) -> float:
    """``β(ρ) = Σ min(q, p/ρ)``."""
    return float(_total(torch.minimum(q, p / rho)))


def _condition_curve(p: Tensor, q: Tensor) -> Callable[[float], tuple[float, float, float, float]]:
    """``ρ ↦ (β, 1 − β, 1 − ρβ, scale)`` as sums of positive parts, ``O(log V)`` after one sort
    (:func:`tmc.kseq._condition_curve`)."""
    on = q > 0.0
    ratio = p[on] / q[on]
    order = torch.argsort(ratio, stable=True)
    ratios = ratio[order].tolist()
    p_on, q_on = p[on][order], q[on][order]
    zero = torch.zeros(1, dtype=F64)
    p_below = torch.cat([zero, torch.cumsum(p_on, dim=0)]).tolist()
    q_below = torch.cat([zero, torch.cumsum(q_on, dim=0)]).tolist()
    p_above = torch.cat([torch.flip(torch.cumsum(torch.flip(p_on, [0]), dim=0), [0]), zero]).tolist()
    q_above = torch.cat([torch.flip(torch.cumsum(torch.flip(q_on, [0]), dim=0), [0]), zero]).tolist()
    p_zero = float(torch.cumsum(torch.where(on, 0.0, p), dim=0)[-1])  # left to right, as tmc.kseq adds it

    def curve(rho: float) -> tuple[float, float, float, float]:
        j = bisect.bisect_left(ratios, rho)
        miss = max(0.0, q_below[j] - p_below[j] / rho)
        gap = max(0.0, p_above[j] - rho * q_above[j] + p_zero)
        return q_above[j] + p_below[j] / rho, miss, gap, p_above[j] + rho * q_above[j] + p_zero

    return curve


def _kseq_rho(p: Tensor, q: Tensor, k: int) -> float:
    """SpecTr's ``ρ*``: :func:`tmc.kseq._rho`'s bisection (host floats) on this port's prefix sums."""
    if k == 1:  # c = 1: ρ = 1 is feasible whatever β is
        return 1.0
    return _bisect_rho(_condition_curve(p, q), k)


def _kseq_residual(p: Tensor, q: Tensor, k: int, rho: float) -> Tensor:
    """Normalised K-SEQ residual ``p − min(q, p/ρ) c``, ``p`` when it has no mass (:func:`tmc.kseq._residual`)."""
    c = _geometric(_kseq_beta(p, q, rho), k)
    factor = 1.0 - c / rho
    if factor <= (k * k + 8) * RHO_RTOL:
        factor = 0.0
    res = torch.clamp_min(torch.where(q * rho >= p, p * factor, p - q * c), 0.0)
    total = float(_total(res))
    return res / total if total > 0.0 else p.clone()


def _kseq_accepted_child(tree: _Tree, node: int) -> int | Tensor:
    """The walk at one accepted node: the child whose test passes, or the law to emit from
    (:func:`tmc.kseq._accepted_child`: K-SEQ over i.i.d. children, else the residual walk;
    a residual only when a later test or the emission reads it)."""
    p_row = tree.p[node + 1]
    kids = tree.children(node)
    if not kids or tree.draws[kids[0]] != Draw.IID:
        return _residual_walk_step(tree, node)
    q_row = tree.q_rows[node]
    rho = _kseq_rho(p_row, q_row, len(kids))
    for kid in kids:
        tok = tree.tokens[kid]
        if tree.u[kid] < _acceptance(float(p_row[tok]), rho * float(q_row[tok])):
            return kid
    return _kseq_residual(p_row, q_row, len(kids), rho)


def _kseq_walk(tree: _Tree) -> tuple[int, int]:
    """K-SEQ tree verification (:func:`tmc.kseq.kseq_sample_from_uniforms`): ``(node, token)``."""
    return _descend(tree, _kseq_accepted_child)


_TREE_WALKS: Mapping[str, Callable[[_Tree], tuple[int, int]]] = MappingProxyType(
    {
        "multidraft": _multidraft_walk,
        "traversal": _traversal_walk,
        "ordered_traversal": _ordered_traversal_walk,
        "kseq": _kseq_walk,
    }
)


def verify_tree(
    method: str,
    draft_tokens: TensorLike,
    parents: TensorLike,
    draws: DrawsLike,
    draft_probs: TensorLike | None,
    target_probs: TensorLike,
    uniforms: TensorLike,
) -> Verified:
    """One tree verification step (module doc: arrays, noise, the one host synchronisation).

    ``method`` is ``"multidraft"``, ``"traversal"``, ``"ordered_traversal"``
    or ``"kseq"``.  The tokens come back on the device of ``target_probs``.
    """
    walk = _TREE_WALKS[_check_method(method, TREE_METHODS)]
    tree = _prepare_tree(draft_tokens, parents, draws, draft_probs, target_probs, uniforms)
    check_swor_enumeration(method, tree)
    node, token = walk(tree)
    nodes = tree.path(node)
    emitted = [tree.tokens[i] for i in nodes] + [token]
    return Verified(torch.tensor(emitted, dtype=torch.int64, device=_device_of(target_probs)), len(nodes), tuple(nodes))


def verify_multidraft(
    draft_tokens: TensorLike,
    parents: TensorLike,
    draws: DrawsLike,
    draft_probs: TensorLike | None,
    target_probs: TensorLike,
    uniforms: TensorLike,
) -> Verified:
    """Recursive multi-draft residual verification: :func:`verify_tree` with ``"multidraft"``."""
    return verify_tree("multidraft", draft_tokens, parents, draws, draft_probs, target_probs, uniforms)


def verify_traversal(
    draft_tokens: TensorLike,
    parents: TensorLike,
    draws: DrawsLike,
    draft_probs: TensorLike | None,
    target_probs: TensorLike,
    uniforms: TensorLike,
) -> Verified:
    """Traversal Verification (Weng et al. 2025): :func:`verify_tree` with ``"traversal"``."""
    return verify_tree("traversal", draft_tokens, parents, draws, draft_probs, target_probs, uniforms)


def verify_ordered_traversal(
    draft_tokens: TensorLike,
    parents: TensorLike,
    draws: DrawsLike,
    draft_probs: TensorLike | None,
    target_probs: TensorLike,
    uniforms: TensorLike,
) -> Verified:
    """Ratio-ordered Traversal Verification: :func:`verify_tree` with ``"ordered_traversal"``."""
    return verify_tree("ordered_traversal", draft_tokens, parents, draws, draft_probs, target_probs, uniforms)


def verify_kseq(
    draft_tokens: TensorLike,
    parents: TensorLike,
    draws: DrawsLike,
    draft_probs: TensorLike | None,
    target_probs: TensorLike,
    uniforms: TensorLike,
) -> Verified:
    """SpecTr K-SEQ at i.i.d. nodes, residual verification elsewhere: :func:`verify_tree` with ``"kseq"``."""
    return verify_tree("kseq", draft_tokens, parents, draws, draft_probs, target_probs, uniforms)


#: Every verifier by method name.  Chain verifiers (:data:`CHAIN_METHODS`) take
#: ``(draft_tokens, draft_probs, target_probs, uniforms)``; tree verifiers
#: (:data:`TREE_METHODS`) take ``(draft_tokens, parents, draws, draft_probs,
#: target_probs, uniforms)``.  All return a :class:`Verified`.
TORCH_VERIFIERS: Mapping[str, Callable[..., Verified]] = MappingProxyType(
    {
        "sps": verify_sps,
        "asps": verify_asps,
        "block": verify_block,
        "multidraft": verify_multidraft,
        "traversal": verify_traversal,
        "ordered_traversal": verify_ordered_traversal,
        "kseq": verify_kseq,
    }
)
