"""Vectorised batch samplers: many independent verification steps from one noise array.

Notation (DESIGN.md §3): ``p`` is the target, ``q`` the draft.  A statistical
suite (DESIGN.md §5) needs ~10^5–10^6 steps of a verifier on the *same* draft;
the scalar samplers of :mod:`tmc.chain` and :mod:`tmc.multidraft` cost tens of
microseconds a step in Python.  The functions here take a ``(trials, width)``
array of uniforms, one row per step, and give **trial for trial the same
output** as the scalar ``*_sample_from_uniforms`` on that row — bit for bit,
not approximately.  That is why they:

* validate the probabilities with the very same functions
  (:func:`tmc.validate.check_chain`, :func:`tmc.multidraft.check_tree_p_rows`),
  so both see the same renormalised float64 rows;
* build every deterministic quantity with the functions the scalar samplers
  call: the residual rule :func:`tmc.residual.residual` and its acceptance
  test :func:`tmc.residual.acceptance_probability`, block verification's
  :func:`tmc.chain.block_forward`, the proposal laws of the tree
  (:func:`tmc.multidraft.proposal_laws` or any other ``proposals`` rule) and
  :func:`tmc.chain.asps_kernel` — once per draft instead of once per step;
* draw tokens with the arithmetic of :func:`tmc.noise.categorical`: the
  cumulative sum of one 1-D row by ``np.cumsum``, the target ``u * total`` as
  one float64 product, ``searchsorted(..., side="right")`` — or, for a small
  vocabulary, the equivalent count of CDF entries ``<= u * total`` (equal
  because a cumulative sum of non-negative floats is non-decreasing) — and the
  same clip to the last positive index when ``u * total`` rounds up to the
  total;
* compare ``u < ratio`` strictly, against the same float64 ratio (IEEE
  division and multiplication are correctly rounded, so numpy's vectorised
  ``p / q`` equals the scalar's element by element).  Where the scalar code
  uses :func:`math.exp` (block verification's stop probabilities) the
  thresholds are computed with :func:`math.exp` too, never ``np.exp``, whose
  SIMD implementation may differ in the last bit.

Noise layouts are those of the scalar samplers (see :mod:`tmc.chain`,
:mod:`tmc.multidraft`): SpS and block ``(trials, n + 1)``, ASpS
``(trials, 1)``, multi-draft trees ``(trials, N + 1)``.  A full speculative
step (draft + verify) on a :class:`tmc.toy.ToyModel` is simulated by
:func:`draft_chain_batch` and :func:`speculative_step_batch`; the draft token
``i`` is ``categorical(q(prefix + ref[:i]), noise[i])``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

from tmc.chain import asps_kernel, block_forward
from tmc.kseq import RhoRule, kseq_node_rule
from tmc.multidraft import ROOT, DraftTree, ProposalFn, check_tree_p_rows, proposal_laws, residual_node_rule
from tmc.residual import residual
from tmc.toy import Path, ToyModel
from tmc.traversal import ChildrenRule, recorded_children, traversal_tests
from tmc.validate import FloatArray, IntArray, as_real_array, check_chain, check_int, check_prob_rows

BoolArray = NDArray[np.bool_]

ChainMethod = Literal["sps", "asps", "block"]

#: How a table of ``R`` rows over ``V`` tokens draws one token per trial:
#: ``R <= FEW_ROWS`` one ``searchsorted`` per row (a boolean mask each);
#: otherwise, for ``V <= COMPARE_MAX_VOCAB``, counting the CDF entries
#: ``<= u * total`` column by column; otherwise one ``searchsorted`` per
#: distinct row after sorting the trials.  All give ``categorical``'s index.
FEW_ROWS = 16
COMPARE_MAX_VOCAB = 64


# ---------------------------------------------------------------- results


@dataclass(frozen=True)
class ChainBatch:
    """Outputs of many chain-verification steps on one draft ``ref``."""

    lengths: IntArray  # (trials,) tokens emitted per step: accepted drafts + 1
    last: IntArray  # (trials,) final emitted token; the accepted ones are ref[:length - 1]

    def cells(self, vocab: int) -> IntArray:
        """Flat kernel-cell index ``(length − 1) · V + last`` of each step (``(trials,)``)."""
        out: IntArray = (self.lengths - 1) * vocab + self.last
        return out

    def counts(self, n: int, vocab: int) -> IntArray:
        """Histogram ``(n + 1, V)`` of the steps over the kernel's cells."""
        n, vocab = check_int("n", n, minimum=0), check_int("vocab", vocab, minimum=1)
        out: IntArray = np.bincount(self.cells(vocab), minlength=(n + 1) * vocab).reshape(n + 1, vocab)
        return out

    def tokens(self, ref: ArrayLike | Sequence[int]) -> list[list[int]]:
        """Emitted token list of each step, as the scalar samplers return it."""
        toks = [int(t) for t in np.asarray(ref).reshape(-1)]
        return [toks[: k - 1] + [b] for k, b in zip(self.lengths.tolist(), self.last.tolist())]


@dataclass(frozen=True)
class TreeBatch:
    """Outputs of many multi-draft verification steps on one draft tree."""

    nodes: IntArray  # (trials,) deepest accepted node; -1 = the root (nothing accepted)
    last: IntArray  # (trials,) final emitted token (corrected or bonus)

    def cells(self, vocab: int) -> IntArray:
        """Flat index ``(node + 1) · V + last`` into the ``(N + 1, V)`` multi-draft kernel."""
        out: IntArray = (self.nodes + 1) * vocab + self.last
        return out

    def counts(self, tree: DraftTree) -> IntArray:
        """Histogram ``(N + 1, V)`` of the steps over the kernel's cells."""
        size = (tree.size + 1) * tree.vocab
        out: IntArray = np.bincount(self.cells(tree.vocab), minlength=size).reshape(tree.size + 1, tree.vocab)
        return out

    def tokens(self, tree: DraftTree) -> list[list[int]]:
        """Emitted token list of each step: the accepted path plus the final token."""
        paths = {node: list(tree.path(node)) for node in range(ROOT, tree.size)}
        return [paths[v] + [b] for v, b in zip(self.nodes.tolist(), self.last.tolist())]


@dataclass(frozen=True)
class StepBatch:
    """Outputs of many full speculative steps (draft chain + chain verification)."""

    drafts: IntArray  # (trials, n) draft chain of each step
    lengths: IntArray  # (trials,) tokens emitted per step
    tokens: IntArray  # (trials, n + 1) emitted tokens, padded with -1 after lengths[t]

    def outputs(self) -> list[tuple[int, ...]]:
        """Emitted string of each step as a tuple."""
        return [tuple(row[:k]) for row, k in zip(self.tokens.tolist(), self.lengths.tolist())]


# ------------------------------------------------------------- the noise


def check_uniform_batch(name: str, u: ArrayLike, width: int) -> FloatArray:
    """Return ``u`` as a float64 ``(trials, width)`` array of values in ``[0, 1)`` or raise.

    The batch form of :func:`tmc.noise.check_uniforms`: one row of uniforms
    per trial; NaN and ±inf fail the range test; text, booleans, complex
    numbers and other objects are refused as there (``np.asarray(u, float)``
    had read ``"0.3"`` and ``True`` as numbers and dropped ``0.5j``).
    """
    arr = as_real_array(name, u)
    if arr.ndim != 2 or arr.shape[1] != width:
        raise ValueError(f"{name} must have shape (trials, {width}), got {arr.shape}")
    ok = (arr >= 0.0) & (arr < 1.0)
    if not ok.all():
        t, j = (int(i) for i in np.argwhere(~ok)[0])
        raise ValueError(f"{name}[{t}, {j}] = {float(arr[t, j])!r} is not a uniform draw in [0, 1)")
    return arr


@dataclass(frozen=True)
class _CdfTable:
    """Rows to draw from by inverse CDF, prepared as :func:`tmc.noise.categorical` does."""

    cdf: FloatArray  # (R, V) np.cumsum of each weight row (computed one 1-D row at a time)
    total: FloatArray  # (R,) cdf[:, -1]
    last: IntArray  # (R,) last index with positive weight, -1 for an all-zero row

    @classmethod
    def from_rows(cls, rows: Sequence[FloatArray]) -> _CdfTable:
        cdf = np.array([np.cumsum(r) for r in rows], dtype=np.float64)  # (R, V)
        last = np.array([_last_positive(r) for r in rows], dtype=np.int64)
        return cls(cdf, cdf[:, -1].copy(), last)

    def draw(self, rows: IntArray, u: FloatArray) -> IntArray:
        """``categorical(weights[rows[t]], u[t])`` for every trial ``t``."""
        total = self.total[rows]  # (T,)
        assert bool(np.all(total > 0.0)), "categorical() needs positive total weight"
        x = u * total  # (T,) the same float64 product as categorical's u * total
        n_rows, vocab = self.cdf.shape
        if n_rows <= FEW_ROWS or vocab > COMPARE_MAX_VOCAB:
            idx = _search(self.cdf, rows, x)
        else:
            idx = _count_at_most(self.cdf, rows, x)
        over = idx >= vocab
        # u * total rounded up to total: the last index with positive weight.
        idx[over] = self.last[rows[over]]
        return idx


def _last_positive(row: FloatArray) -> int:
    pos = np.flatnonzero(row > 0.0)
    return int(pos[-1]) if pos.size else -1


def _count_at_most(cdf: FloatArray, rows: IntArray, x: FloatArray) -> IntArray:
    """Number of CDF entries ``<= x``: ``searchsorted(side="right")`` on a sorted row."""
    idx = np.zeros(rows.shape[0], dtype=np.int64)
    for col in range(cdf.shape[1]):
        idx += cdf[rows, col] <= x
    return idx


def _search(cdf: FloatArray, rows: IntArray, x: FloatArray) -> IntArray:
    """``searchsorted(cdf[rows[t]], x[t], side="right")``, one call per distinct row."""
    if cdf.shape[0] == 1:
        out: IntArray = np.searchsorted(cdf[0], x, side="right").astype(np.int64)
        return out
    idx = np.empty(rows.shape[0], dtype=np.int64)
    groups = _masks(rows, cdf.shape[0]) if cdf.shape[0] <= FEW_ROWS else _segments(rows)
    for row, sel in groups:
        idx[sel] = np.searchsorted(cdf[row], x[sel], side="right")
    return idx


def _masks(keys: IntArray, n_keys: int) -> Iterator[tuple[int, BoolArray]]:
    """``(key, mask)`` for each key in ``range(n_keys)``: cheaper than sorting for few keys."""
    for key in range(n_keys):
        yield key, keys == key


def _segments(keys: IntArray) -> Iterator[tuple[int, IntArray]]:
    """``(key, trial indices)`` for each distinct key, keys ascending."""
    order = np.argsort(keys, kind="stable")
    sorted_keys = keys[order]
    cuts = np.flatnonzero(np.diff(sorted_keys)) + 1
    for sel in np.split(order, cuts):
        if sel.size:
            yield int(keys[sel[0]]), sel


def _first_rejection(accepted: BoolArray) -> IntArray:
    """Index of the first ``False`` in each row of a ``(T, n)`` bool array, ``n`` if none."""
    trials, n = accepted.shape
    if n == 0:
        return np.zeros(trials, dtype=np.int64)
    rejected = ~accepted
    out: IntArray = np.where(rejected.any(axis=1), rejected.argmax(axis=1), n).astype(np.int64)
    return out


# ------------------------------------------------------- chain verifiers


def sps_batch(
    ref: ArrayLike | Sequence[int], q_rows: ArrayLike, p_rows: ArrayLike, u: ArrayLike
) -> ChainBatch:
    """SpS on one draft for many trials; ``u`` is ``(trials, n + 1)`` (row ``t`` = one step).

    Equal, trial for trial, to :func:`tmc.chain.sps_sample_from_uniforms`.
    """
    toks, q, p = check_chain(ref, q_rows, p_rows)
    n = toks.shape[0]
    uu = check_uniform_batch("u", u, n + 1)  # (T, n + 1)
    ratio = p[np.arange(n), toks] / q[np.arange(n), toks]  # (n,) the scalar's p[k, a] / q[k, a]
    k = _first_rejection(uu[:, :n] < ratio)  # (T,) accepted drafts
    rows = [residual(p[i], q[i], int(toks[i])) for i in range(n)] + [p[n]]  # the scalar's rows
    last = _CdfTable.from_rows(rows).draw(k, uu[:, n])
    return ChainBatch(k + 1, last)


def asps_batch(
    ref: ArrayLike | Sequence[int], q_rows: ArrayLike, p_rows: ArrayLike, u: ArrayLike
) -> ChainBatch:
    """ASpS on one draft for many trials; ``u`` is ``(trials, 1)``.

    Equal, trial for trial, to :func:`tmc.chain.asps_sample_from_uniforms`
    (one inverse-CDF draw over the flattened kernel, TMC paper Algorithm 1).
    """
    kernel = asps_kernel(ref, q_rows, p_rows)  # (n + 1, V): validates once, as the scalar does
    uu = check_uniform_batch("u", u, 1)
    vocab = kernel.shape[1]
    flat = _CdfTable.from_rows([kernel.reshape(-1)]).draw(np.zeros(uu.shape[0], dtype=np.int64), uu[:, 0])
    return ChainBatch(flat // vocab + 1, flat % vocab)


def block_batch(
    ref: ArrayLike | Sequence[int], q_rows: ArrayLike, p_rows: ArrayLike, u: ArrayLike
) -> ChainBatch:
    """Block verification on one draft for many trials; ``u`` is ``(trials, n + 1)``.

    Equal, trial for trial, to :func:`tmc.chain.block_sample_from_uniforms`:
    the backward scan stops at the largest ``i`` with ``u[i − 1] < stop_i``.
    """
    toks, q, p = check_chain(ref, q_rows, p_rows)
    n = toks.shape[0]
    uu = check_uniform_batch("u", u, n + 1)  # (T, n + 1)
    residuals, log_stop, _ = block_forward(toks, q, p)
    # math.exp as in the scalar scan (np.exp may differ in the last bit).
    stop_prob = np.array([math.exp(log_stop[i]) for i in range(1, n + 1)], dtype=np.float64)  # (n,)
    fired = (uu[:, :n] < stop_prob)[:, ::-1]  # (T, n) position n first
    tau = n - _first_rejection(~fired)  # (T,) largest firing position, 0 if none
    rows = [residuals[i] for i in range(n)] + [p[n]]
    last = _CdfTable.from_rows(rows).draw(tau, uu[:, n])
    return ChainBatch(tau + 1, last)


CHAIN_BATCH: dict[str, Callable[[ArrayLike | Sequence[int], ArrayLike, ArrayLike, ArrayLike], ChainBatch]] = {
    "sps": sps_batch,
    "asps": asps_batch,
    "block": block_batch,
}


def chain_noise_width(method: str, n: int) -> int:
    """Uniforms per step of a chain verifier: ``n + 1`` (SpS, block) or 1 (ASpS)."""
    if not isinstance(method, str) or method not in CHAIN_BATCH:
        raise ValueError(f"method must be one of {sorted(CHAIN_BATCH)}, got {method!r}")
    return 1 if method == "asps" else check_int("n", n, minimum=0) + 1


# ---------------------------------------------------- multi-draft trees


@dataclass(frozen=True)
class _TreePlan:
    """Everything about one tree that does not depend on the noise."""

    kids: IntArray  # (N + 1, W) children of node j - 1 in order, padded with 0
    ratios: FloatArray  # (N + 1, W) r(x_i) / q_i(x_i) at each child's test, -inf padding
    final: _CdfTable  # row j: the residual after rejecting every child of node j - 1 (p at a leaf)


#: ``rule(tree, node, p_row) -> (accept, final)``: the test of each child of
#: ``node`` and the law emitted when every child is rejected.
NodeRuleFn = Callable[[DraftTree, int, FloatArray], tuple[Sequence[float], FloatArray]]


def _residual_walk(proposals: ProposalFn) -> NodeRuleFn:
    """The scalar residual verifier's plan at each node (:func:`tmc.multidraft.residual_node_rule`)."""

    def rule(tree: DraftTree, node: int, p_row: FloatArray) -> tuple[Sequence[float], FloatArray]:
        return residual_node_rule(tree, node, p_row, proposals)

    return rule


def _tree_plan(tree: DraftTree, p: FloatArray, rule: NodeRuleFn) -> _TreePlan:
    width = max((len(tree.children(v)) for v in range(ROOT, tree.size)), default=0)
    kids = np.zeros((tree.size + 1, width), dtype=np.int64)
    ratios = np.full((tree.size + 1, width), -np.inf)  # u < -inf never holds: padding never accepts
    finals: list[FloatArray] = []
    for node in range(ROOT, tree.size):
        accept, final = rule(tree, node, p[node + 1])
        for i, (kid, a) in enumerate(zip(tree.children(node), accept)):
            kids[node + 1, i] = kid
            ratios[node + 1, i] = a
        finals.append(final)
    return _TreePlan(kids, ratios, _CdfTable.from_rows(finals))


def multidraft_batch(
    tree: DraftTree, p_rows: ArrayLike, u: ArrayLike, proposals: ProposalFn = proposal_laws
) -> TreeBatch:
    """Multi-draft residual verification of one tree for many trials; ``u`` is ``(trials, N + 1)``.

    Equal, trial for trial, to :func:`tmc.multidraft.multidraft_sample_from_uniforms`
    with the same ``proposals`` rule (default: each node's recorded draw kind).
    The residual at a node after ``i`` rejected children does not depend on
    the noise, so it is computed once per (node, i); the trials then walk the
    tree together, one level per iteration.
    """
    return _walk_tree(tree, check_tree_p_rows(tree, p_rows), u, _residual_walk(proposals))


def kseq_batch(tree: DraftTree, p_rows: ArrayLike, u: ArrayLike, *, rho_rule: RhoRule | None = None) -> TreeBatch:
    """K-SEQ tree verification of one tree for many trials; ``u`` is ``(trials, N + 1)``.

    Equal, trial for trial, to :func:`tmc.kseq.kseq_sample_from_uniforms`:
    each node's rule (:func:`tmc.kseq.kseq_node_rule`) does not depend on the
    noise, so the trials walk one plan, as in :func:`multidraft_batch`.
    """

    def rule(tree: DraftTree, node: int, p_row: FloatArray) -> tuple[Sequence[float], FloatArray]:
        r = kseq_node_rule(tree, node, p_row) if rho_rule is None else kseq_node_rule(tree, node, p_row, rho_rule=rho_rule)
        return r.accept, r.final

    return _walk_tree(tree, check_tree_p_rows(tree, p_rows), u, rule)


def _walk_tree(tree: DraftTree, p: FloatArray, u: ArrayLike, rule: NodeRuleFn) -> TreeBatch:
    """The trials walk the tree together, one level per iteration, on the plan of ``rule``."""
    uu = check_uniform_batch("u", u, tree.size + 1)  # (T, N + 1)
    plan = _tree_plan(tree, p, rule)
    trials = uu.shape[0]
    node = np.full(trials, ROOT, dtype=np.int64)  # (T,) current accepted node
    active = np.arange(trials)  # trials still testing children
    while active.size and plan.kids.shape[1]:
        kids = plan.kids[node[active] + 1]  # (A, W)
        accepted = uu[active[:, None], kids] < plan.ratios[node[active] + 1]  # (A, W)
        first = _first_rejection(~accepted)  # (A,) first accepted child, W if none
        moved = first < kids.shape[1]
        node[active[moved]] = kids[moved, first[moved]]
        active = active[moved]
    last = plan.final.draw(node + 1, uu[:, tree.size])
    return TreeBatch(node, last)


def traversal_batch(
    tree: DraftTree,
    p_rows: ArrayLike,
    u: ArrayLike,
    *,
    update_value: bool = True,
    children: ChildrenRule = recorded_children,
) -> TreeBatch:
    """Traversal Verification of one tree for many trials; ``u`` is ``(trials, N + 1)``.

    Equal, trial for trial, to :func:`tmc.traversal.traversal_sample_from_uniforms`.
    The sequence of tests (node, acceptance value, emitted row) does not depend
    on the noise (:func:`tmc.traversal.traversal_tests`), so it is computed once;
    each trial stops at its first test with ``u[node] < value`` (the root's
    test, last, always passes) and draws its token from that test's row.
    """
    p = check_tree_p_rows(tree, p_rows)
    uu = check_uniform_batch("u", u, tree.size + 1)  # (T, N + 1)
    tests = list(traversal_tests(tree, p, update_value=update_value, children=children))
    nodes = np.array([t.node for t in tests], dtype=np.int64)  # (S,) the root last
    values = np.array([t.value for t in tests], dtype=np.float64)  # (S,)
    cols = np.where(nodes == ROOT, tree.size, nodes)  # the root has no test of its own
    passed = uu[:, cols] < values  # (T, S)
    passed[:, nodes == ROOT] = True
    first = _first_rejection(~passed)  # (T,) index of the first passing test
    last = _CdfTable.from_rows([t.row for t in tests]).draw(first, uu[:, tree.size])
    return TreeBatch(nodes[first], last)


def categorical_batch(weights: ArrayLike, u: ArrayLike) -> IntArray:
    """``tmc.noise.categorical(weights, u[t])`` for every ``t``: ``(trials,)`` indices.

    One inverse-CDF table for many draws from the same weights (e.g. picking
    one of the enumerated drafts of :mod:`tmc.drafts` by its weight).  Like
    ``categorical``, the weights need not sum to 1 and are not renormalised
    (which would move CDF steps by an ulp); they must be finite,
    non-negative and not all zero.
    """
    w = as_real_array("weights", weights)
    if w.ndim != 1 or w.size == 0:
        raise ValueError(f"weights must be a non-empty 1-D array, got shape {w.shape}")
    if not np.all(np.isfinite(w)) or bool(np.any(w < 0.0)) or not float(w.sum()) > 0.0:
        raise ValueError("weights must be finite and non-negative with a positive sum")
    uu = check_uniform_batch("u", as_real_array("u", u).reshape(-1, 1), 1)[:, 0]
    return _CdfTable.from_rows([w]).draw(np.zeros(uu.shape[0], dtype=np.int64), uu)


# ------------------------------------------------ draft + verify on a toy


def draft_chain_batch(model: ToyModel, n: int, noise: ArrayLike, prefix: Path = ()) -> IntArray:
    """Draft chains ``(trials, n)`` from the toy draft ``q``; ``noise`` is ``(trials, n)``.

    Token ``i`` of trial ``t`` is ``categorical(q(prefix + ref[:i]), noise[t, i])``.
    """
    drafts, _, _ = _draft_chains(model, n, noise, prefix)
    return drafts


def _draft_chains(
    model: ToyModel, n: int, noise: ArrayLike, prefix: Path
) -> tuple[IntArray, IntArray, list[Path]]:
    """Draft chains, each trial's chain id, and the distinct chains (by id).

    A vectorised *sampler* of drafts from explicit noise, not an enumeration:
    only the chains some trial draws are ever built, with the arithmetic of
    :func:`tmc.noise.categorical`, so trial ``t`` is the chain a scalar drafter
    draws from ``noise[t]``.  Every draft with its probability is enumerated
    by :mod:`tmc.drafts` (the one enumeration), which this does not repeat.
    Trials sharing a prefix share one row lookup and one CDF.
    """
    n = check_int("n", n, minimum=0)
    prefix = tuple(check_int(f"prefix[{i}]", t) for i, t in enumerate(prefix))
    uu = check_uniform_batch("noise", noise, n)  # (T, n)
    trials, vocab = uu.shape[0], model.vocab
    drafts = np.empty((trials, n), dtype=np.int64)
    group = np.zeros(trials, dtype=np.int64)  # (T,) id of the trial's prefix so far
    paths: list[Path] = [()]  # id -> distinct prefix
    for i in range(n):
        table = _CdfTable.from_rows([_draft_row(model, tuple(prefix) + path) for path in paths])
        tok = table.draw(group, uu[:, i])
        drafts[:, i] = tok
        group, codes = _regroup(group * vocab + tok, len(paths) * vocab)
        paths = [paths[c // vocab] + (c % vocab,) for c in codes]
    return drafts, group, paths


def _draft_row(model: ToyModel, path: Path) -> FloatArray:
    row = model.q(path)
    check_prob_rows(f"draft row q(. | {path!r})", np.asarray(row, dtype=np.float64)[None, :])
    if row.shape != (model.vocab,):
        raise ValueError(f"draft row q(. | {path!r}) has shape {row.shape}; vocab is {model.vocab}")
    return row


def _regroup(codes: IntArray, n_codes: int) -> tuple[IntArray, list[int]]:
    """Dense ids ``0..G-1`` for the distinct ``codes`` (ascending), and those codes."""
    if n_codes <= max(codes.shape[0], 1 << 20):
        present = np.zeros(n_codes, dtype=bool)
        present[codes] = True
        ids = np.cumsum(present) - 1  # code -> dense id, without sorting the trials
        return ids[codes].astype(np.int64), np.flatnonzero(present).tolist()
    uniq, inverse = np.unique(codes, return_inverse=True)
    return inverse.reshape(-1).astype(np.int64), uniq.tolist()


def speculative_step_batch(
    model: ToyModel,
    n: int,
    method: ChainMethod | str,
    noise_draft: ArrayLike,
    noise_verify: ArrayLike,
    prefix: Path = (),
) -> StepBatch:
    """Full speculative steps: draft ``n`` tokens from ``q``, verify against ``p``.

    ``noise_draft`` is ``(trials, n)`` (see :func:`draft_chain_batch`),
    ``noise_verify`` is ``(trials, n + 1)`` for SpS and block and
    ``(trials, 1)`` for ASpS.  Trials with the same draft chain are verified
    together.  Trial ``t`` equals the scalar step
    ``*_sample_from_uniforms(ref_t, *model.chain_rows(ref_t, prefix), noise_verify[t])``.
    """
    n = check_int("n", n, minimum=0)
    width = chain_noise_width(method, n)
    drafts, chain_id, chains = _draft_chains(model, n, noise_draft, prefix)
    uu = check_uniform_batch("noise_verify", noise_verify, width)
    trials = drafts.shape[0]
    if uu.shape[0] != trials:
        raise ValueError(f"noise_verify has {uu.shape[0]} trials but noise_draft has {trials}")
    verify = CHAIN_BATCH[method]
    lengths = np.empty(trials, dtype=np.int64)
    last = np.empty(trials, dtype=np.int64)
    for cid, sel in _segments(chain_id):
        q_rows, p_rows = model.chain_rows(chains[cid], prefix)
        out = verify(chains[cid], q_rows, p_rows, uu[sel])
        lengths[sel], last[sel] = out.lengths, out.last
    tokens = np.where(np.arange(n + 1) < (lengths - 1)[:, None], np.pad(drafts, ((0, 0), (0, 1))), -1)
    tokens[np.arange(trials), lengths - 1] = last
    return StepBatch(drafts, lengths, tokens.astype(np.int64))
