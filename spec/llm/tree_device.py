"""Tree verifiers as fixed-shape device work: no host read inside the walk (DESIGN.md §4, §8).

:func:`spec.llm.verify.verify_tree` copies a tree step's rows to the host in
one transfer and walks the tree there, because which node is tested next
depends on earlier tests.  For two verifiers that dependence is only in
*which* tests are read, not in what they compute, so for a tree whose shape
(parents and draw kinds) is known before the step (:class:`TreePlan`, made
once per shape) the whole verification is a fixed sequence of batched tensor
operations on the rows' device, and the step's result is one small int64
row:

* ``multidraft`` (:func:`tmc.multidraft.residual_walk_step`).  At a node, the
  residual before its ``j``-th child is formed from the node's target row and
  the laws of the children before it, whether or not the walk reaches the
  node.  So every node's child tests and its emission residual are computed
  at once, one batched pass per sibling rank over every node with children;
  the accepted path is then ``depth`` pointer steps from the root.
* ``traversal`` (:func:`tmc.traversal.traversal_tests`).  The walk stops at
  the first test that passes, so every test it computes is one taken after
  every earlier test failed, and a failed subtree changes its parent only
  through the parent's own state and the deleted child's law and token
  (:func:`tmc.traversal._delete_child`), never through the subtree's states.
  So the state ``(a, 1 - a, r)`` of every test is computed top-down, level by
  level and rank by rank, whatever the uniforms; the output is the first test
  in post order whose uniform passes (the root's always does).
* ``ordered_traversal`` (:mod:`tmc.ordered_traversal`).  Traversal with
  each node's children visited in decreasing ``p / q`` of their tokens under
  the node's own rows, each with the law of its place in the sorted tuple.
  The order and the laws depend on the rows only, not on any test, so they
  are fixed-shape work too, done once for every node of the tree (not level
  by level): one stable sort of each node's ratios gives every
  token's rank and the draft mass ranked after it (a suffix sum), a sort of
  each node's few children by rank gives the visiting order, and the
  order-statistic laws (:func:`tmc.ordered_traversal.iid_sorted_law`, and
  :func:`~tmc.ordered_traversal.swor_sorted_law` for a pair) are formed for
  every rank at once.  Then the states are Traversal's, top-down; since the
  post order now depends on the rows, each test's position in it is found
  from the subtree sizes (a subtree starts after those of the siblings
  visited before it).  At a node with 3 or more children drawn ``swor`` the
  sorted laws enumerate ordered tuples of the support, a host rule
  (refused beyond :data:`~tmc.ordered_traversal.MAX_SWOR_TUPLES` anyway):
  :func:`walks_on_device` says no and ``generate`` walks such trees on the
  host.  Integer powers are torch's (``x ** 3`` is ``x * x * x``) where tmc
  calls the C library's ``pow``, so for nodes of 3 or more i.i.d. children
  the laws differ from numpy's in the last bits (within 4e-15, tested);
  the visiting order is exact.  569 operations eagerly for a fixed 2-wide
  tree of 7 nodes at V = 4096 (Traversal 390), so ``generate`` fuses these
  steps only when asked too.
* ``kseq`` (:func:`tmc.kseq.kseq_sample_from_uniforms`).  At a node whose
  children were drawn i.i.d. every child is tested against the same row,
  ``min(1, p(x) / (ρ* q(x)))``, so the walk is ``multidraft``'s with other
  tests and another residual (its own residual walk at the other nodes).
  Each node's ``ρ*`` is :func:`tmc.kseq._rho`'s bisection as fixed-shape
  work: one stable sort and prefix and suffix sums per row give ``β(ρ)`` by a
  ``searchsorted`` (under ``torch.compile`` a count of the ratios below
  ``ρ``: :func:`_count_below`), and the bisection runs a fixed number of rounds (enough
  for the widest node's bracket), a row that numpy's loop would have left
  keeping its bracket.  Some 55 rounds of small operations: about 2000
  kernels eagerly (2058 for a fixed 2-wide tree of 7 nodes at V = 4096),
  which is why ``generate`` fuses K-SEQ steps only when asked (best with
  ``compile_step``).  ``c(β)`` uses torch's ``expm1`` and
  ``log1p``, which differ from the C library's that :mod:`tmc` calls in the
  last bit for some arguments, so a late bisection step may turn the other
  way: ``ρ*`` agrees with numpy's to about ``2 RHO_RTOL`` relative (within the
  bisection's own tolerance of the true root), not bit for bit.

The cost is every node's tests, ``O(N V)`` whatever is accepted (K-SEQ and
ordered Traversal add a sort of each row, ``O(V log V)``); the host walk does
at most that.  The operations are those of the host walk
(:mod:`spec.llm.verify`) in the same order, row by row, so the tokens are
the same (``tests/spec/llm/test_tree_device.py``: equal to the numpy
references of :mod:`tmc` on identical noise, under the rounding caveat of
:mod:`spec.llm.verify` for ``V >= 8`` and those of K-SEQ and ordered
Traversal above), and nothing in the walk reads a device value on the host (tested on the ``meta`` device), so a
tree step can be captured in a CUDA graph and read back once.

Batch rows are the nodes with children, sorted by their number of children
(most first), so the nodes with a ``j``-th child are a prefix of the batch
and rank ``j`` works on a slice: no masks, no scratch rows (ordered
Traversal's sort of the children reads a table padded with each node's first
child, the padding sorted last).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch

from spec.llm.verify import (
    Verified,
    _check_method,
    _float_tensor,
    _long_tensor,
    _mass_after_rows,
    _normalised_rows,
    _one_minus_rows,
    _parse_draws,
    _prepare_tree,
    _prob_tensor,
    _residual_rows,
    _row_difference,
    _rows_bad,
    _total,
    DrawsLike,
    TensorLike,
)
from spec.llm.sampling import categorical_draw, point_rows
from tmc.kseq import RHO_RTOL, SEARCH_RTOL
from tmc.multidraft import ROOT, Draw

__all__ = ["DEVICE_TREE_METHODS", "TreePlan", "tree_head", "verify_tree_on_device", "walks_on_device"]

Tensor = torch.Tensor
F64 = torch.float64

#: Tree verifiers with a device walk here; the others walk on the host (module doc).
DEVICE_TREE_METHODS: tuple[str, ...] = ("multidraft", "traversal", "ordered_traversal", "kseq")


def walks_on_device(method: str, parents: Sequence[int], draws: DrawsLike) -> bool:
    """Whether ``method`` has a device walk for trees of this shape (``draws``: one kind for every node, or one
    per node): one of :data:`DEVICE_TREE_METHODS`, and not ordered Traversal at a node with 3 or more children
    drawn ``swor`` (whose sorted laws enumerate tuples: a host rule, :func:`spec.llm.verify.check_swor_enumeration`)."""
    par = _parent_list(parents)  # a list that is no tree has no answer (ValueError)
    if method not in DEVICE_TREE_METHODS:
        return False
    kinds = _parse_draws(draws, len(par))
    return not (method == "ordered_traversal" and _wide_swor_node(par, kinds) is not None)


def _parent_list(parents: Sequence[int]) -> list[int]:
    """``parents`` as a list of ints, each ``-1`` (the root) or an earlier node; ``ValueError`` naming the
    entry otherwise, or for a value that is no sequence of integers."""
    if isinstance(parents, Tensor):
        given: object = parents
    elif isinstance(parents, str | bytes) or not hasattr(parents, "__iter__"):
        raise ValueError(f"parents must be a sequence of parent indices, got {parents!r}")
    else:
        given = list(parents)
    par = [int(p) for p in _long_tensor("parents", given, torch.device("cpu")).tolist()]
    for i, p in enumerate(par):
        if not ROOT <= p < i:
            raise ValueError(f"parents[{i}] = {p}; a parent must be -1 (root) or an earlier node")
    return par


def _wide_swor_node(parents: Sequence[int], kinds: Sequence[Draw]) -> int | None:
    """The lowest node (``-1``: the root) with 3 or more children drawn ``swor``, or ``None``: where ordered
    Traversal has no device walk (:func:`walks_on_device`, :class:`TreePlan`)."""
    counts = Counter(p for p, kind in zip(parents, kinds) if kind == Draw.SWOR)
    return min((v for v, k in counts.items() if k >= 3), default=None)


class _Batch(NamedTuple):
    """Nodes with children, most children first, and their children rank by rank (device tensors)."""

    rows: Tensor  # (B,) int64: row of each node in the (N + 1, V) layout (node + 1)
    kids: tuple[Tensor, ...]  # kids[j] (c_j,) int64: the j-th child of the first c_j batch nodes
    kid_rows: tuple[Tensor, ...]  # kids[j] + 1
    topk: Tensor  # (B, 1) bool: the node's children are ranked tokens (point-mass laws)
    iid: Tensor  # (B, 1) bool: drawn i.i.d. from the node's draft row (else without replacement)
    kinds: frozenset[Draw]  # the draw kinds present: a law no node uses is not formed
    width: Tensor  # (B, 1) float64: the node's number of children (K-SEQ's k)
    table: Tensor  # (B, W) int64: each node's children in draw order, padded with its first child
    present: Tensor  # (B, W) bool: which entries of ``table`` are children
    ordered: Tensor  # (B, 1) bool: ordered Traversal sorts the node's children (2 or more, drawn iid / swor)
    any_ordered: bool  # some node of the batch has ``ordered`` set


@dataclass(frozen=True)
class TreePlan:
    """One tree shape's index tables on one device, made once and used by every step of that shape.

    ``parents`` ``(N,)``: ``-1`` for the root, else an earlier node;
    ``draws``: one :class:`~tmc.multidraft.Draw` per node, the same for
    siblings.  ``ValueError`` for a malformed shape (the checks of
    :func:`spec.llm.verify.verify_tree`).
    """

    parents: tuple[int, ...]
    draws: tuple[Draw, ...]
    device: torch.device
    depth: int  # longest root-to-leaf path, in nodes
    every: _Batch  # every node with children (multidraft)
    levels: tuple[_Batch, ...]  # the nodes with children at depth 0 (the root), 1, ... (traversal)
    post: Tensor  # (N + 1,) int64: the rows of the traversal's tests in order, the root's (0) last
    paths: Tensor  # (N + 1, depth) int64: the nodes from the root's child down to row i's node, -1 after
    lengths: Tensor  # (N + 1,) int64: depth of row i's node (0 for the root)
    sampled_nodes: tuple[int, ...]  # the nodes whose children were drawn iid / swor (ROOT = -1)
    sampled: Tensor  # (S,) int64: their rows
    sampled_kids: Tensor  # (K,) int64: the children of those nodes
    sampled_parent_rows: Tensor  # (K,) int64: their parents' rows
    distinct: Tensor  # (P, 2) int64: sibling pairs drawn swor / topk, whose tokens must differ
    sizes: Tensor  # (N + 1,) int64: nodes in row i's subtree, its own included (the root's: N + 1)
    binomial: Tensor  # (W + 1, W + 1) float64: C(m, j) for m, j up to the widest node's children
    swor_wide: int | None  # a node with 3 or more children drawn swor (ordered Traversal's host rule), if any
    level_pos: tuple[Tensor, ...]  # level_pos[d] (B_d,) int64: where levels[d]'s nodes stand in ``every``

    @classmethod
    def of(cls, parents: Sequence[int], draws: DrawsLike, device: torch.device | str = "cpu") -> TreePlan:
        par = _parent_list(parents)
        n = len(par)
        kinds = _parse_draws(draws, n)
        kids: list[list[int]] = [[] for _ in range(n + 1)]
        depth_of = [0] * (n + 1)
        for i, p in enumerate(par):
            kids[p + 1].append(i)
            depth_of[i + 1] = depth_of[p + 1] + 1
        for node, group in enumerate(kids, start=ROOT):
            if len({kinds[k] for k in group}) > 1:
                raise ValueError(f"children of node {node} mix draw kinds {sorted({kinds[k].value for k in group})}")
        try:
            dev = torch.device(device)
        except (RuntimeError, TypeError) as err:
            raise ValueError(f"device must be a torch device or its name, got {device!r} ({err})") from None
        depth = max(depth_of)

        def long(values: Sequence[int] | Sequence[Sequence[int]]) -> Tensor:
            return torch.tensor(values, dtype=torch.int64, device=dev)

        def with_kids(nodes: Sequence[int]) -> list[int]:
            return sorted((v for v in nodes if kids[v + 1]), key=lambda v: -len(kids[v + 1]))

        def batch(nodes: Sequence[int]) -> _Batch:
            order = with_kids(nodes)
            width = len(kids[order[0] + 1]) if order else 0
            ranks = [[kids[v + 1][j] for v in order if len(kids[v + 1]) > j] for j in range(width)]
            kind = [kinds[kids[v + 1][0]] for v in order]
            table = [[kids[v + 1][min(j, len(kids[v + 1]) - 1)] for j in range(width)] for v in order]
            sorts = [len(kids[v + 1]) >= 2 and kinds[kids[v + 1][0]] != Draw.TOPK for v in order]
            return _Batch(long([v + 1 for v in order]), tuple(long(r) for r in ranks),
                          tuple(long([k + 1 for k in r]) for r in ranks),
                          long([k == Draw.TOPK for k in kind]).bool()[:, None],
                          long([k == Draw.IID for k in kind]).bool()[:, None], frozenset(kind),
                          torch.tensor([float(len(kids[v + 1])) for v in order], dtype=F64, device=dev)[:, None],
                          long(table).reshape(len(order), width),
                          long([[j < len(kids[v + 1]) for j in range(width)] for v in order]).bool()
                          .reshape(len(order), width),
                          long(sorts).bool()[:, None], any(sorts))

        by_depth: list[list[int]] = [[] for _ in range(depth + 1)]
        for v in range(ROOT, n):
            by_depth[depth_of[v + 1]].append(v)
        paths = []
        for v in range(ROOT, n):
            path: list[int] = []
            while v != ROOT:
                path.append(v)
                v = par[v]
            paths.append(path[::-1] + [-1] * (depth - len(path)))
        sampled = [v for v in range(ROOT, n) if kids[v + 1] and kinds[kids[v + 1][0]] != Draw.TOPK]
        s_kids = [k for v in sampled for k in kids[v + 1]]
        distinct = [(a, b) for group in kids if group and kinds[group[0]] != Draw.IID
                    for i, a in enumerate(group) for b in group[i + 1:]]
        sizes = [1] * (n + 1)
        for i in range(n - 1, -1, -1):  # children after their parents: each subtree is complete when reached
            sizes[par[i] + 1] += sizes[i + 1]
        widest = max(map(len, kids))
        binomial = [[float(math.comb(m, j)) for j in range(widest + 1)] for m in range(widest + 1)]
        in_every = {v: i for i, v in enumerate(with_kids(range(ROOT, n)))}
        return cls(tuple(par), kinds, dev, depth, batch(range(ROOT, n)), tuple(batch(level) for level in by_depth),
                   long([r + 1 for r in _post_order(kids)] + [0]), long(paths).reshape(n + 1, depth),
                   long(depth_of), tuple(sampled), long([v + 1 for v in sampled]), long(s_kids),
                   long([par[k] + 1 for k in s_kids]), long(distinct).reshape(len(distinct), 2), long(sizes),
                   torch.tensor(binomial, dtype=F64, device=dev), _wide_swor_node(par, kinds),
                   tuple(long([in_every[v] for v in with_kids(level)]) for level in by_depth))

    @property
    def size(self) -> int:
        return len(self.parents)


def _post_order(kids: list[list[int]]) -> list[int]:
    """Non-root nodes in the order Traversal tests them: each subtree after its children, siblings in draw order."""
    out: list[int] = []
    stack = [(ROOT, 0)]
    while stack:
        node, j = stack.pop()
        group = kids[node + 1]
        if j < len(group):
            stack.append((node, j + 1))
            stack.append((group[j], 0))
        elif node != ROOT:
            out.append(node)
    return out


# ------------------------------------------------------------------ shared rules, row by row


def _laws(b: _Batch, q_b: Tensor, removed: Tensor, tok: Tensor, first: bool) -> Tensor:
    """The law each rank's child was drawn from (:func:`spec.llm.verify._proposal_laws`), ``(c, V)``;
    marks ``tok`` removed from the without-replacement rows (``removed`` ``(c, V)`` bool, in place).
    ``first``: rank 0, whose without-replacement children come from the stored rows (none removed yet).
    Only the kinds the batch holds are formed (each is a handful of kernels on a GPU)."""
    c = tok.shape[0]
    law = q_b  # iid, and the first swor rank: the node's draft row
    if Draw.SWOR in b.kinds:
        if not first:
            rest = torch.where(removed, 0.0, q_b)
            swor = rest / _total(rest)
            law = swor if b.kinds == {Draw.SWOR} else torch.where(b.iid[:c], q_b, swor)
        removed.scatter_(1, tok[:, None], True)
    if Draw.TOPK in b.kinds:
        point = point_rows(tok[:, None], q_b.shape[1])
        law = point if b.kinds == {Draw.TOPK} else torch.where(b.topk[:c], point, law)
    return law


def _at(rows: Tensor, tok: Tensor) -> Tensor:
    """``rows[i, tok[i]]``: ``(c,)``."""
    return rows.gather(1, tok[:, None])[:, 0]


def _acceptance(r_x: Tensor, law_x: Tensor) -> Tensor:
    """``min(1, r(x) / law(x))`` elementwise, edge cases as :func:`tmc.residual.acceptance_probability`."""
    return torch.where(r_x <= 0.0, 0.0, torch.where(law_x <= 0.0, 1.0, torch.clamp_max(r_x / law_x, 1.0)))


def _acceptance_at(r: Tensor, law: Tensor, tok: Tensor, diff: Tensor) -> Tensor:
    """:func:`tmc.residual.acceptance_at` row by row ``(c,)``: the ratio test of each row's ``tok``, 1 where both
    rows hold it above 1/2 and their difference there (``diff`` = :func:`_row_difference`'s, the rests') is not
    negative."""
    r_t, law_t = _at(r, tok), _at(law, tok)
    agree = (r_t > 0.5) & (law_t > 0.5) & (_at(diff, tok) >= 0.0)
    return torch.where(agree, 1.0, _acceptance(r_t, law_t))


def _child_state(value: Tensor, miss: Tensor, row: Tensor, law: Tensor, tok: Tensor) -> tuple[Tensor, Tensor]:
    """``(a_i, 1 − a_i)`` of each child: :func:`tmc.traversal._child_state` row by row."""
    q_t, r_t = _at(law, tok), _at(row, tok)
    diff = _at(_row_difference(row, law), tok)  # r(tok) − q(tok) as tmc.residual.difference_at forms it
    gap = torch.where(value >= 0.5, diff - miss * r_t, value * r_t - q_t)
    never = r_t <= 0.0  # never accepted, whatever law(tok) is (an underflowed sorted law)
    passed = (gap >= 0.0) & ~never
    child_miss = torch.where(never, 1.0, torch.clamp_max(-gap / q_t, 1.0))
    child_value = torch.where(never, 0.0, torch.where(child_miss <= 0.5, 1.0 - child_miss, _acceptance(value * r_t, q_t)))
    return torch.where(passed, 1.0, child_value), torch.where(passed, 0.0, child_miss)


def _delete_child(value: Tensor, miss: Tensor, row: Tensor, law: Tensor, tok: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """``(a, 1 − a, r)`` after deleting each row's child: :func:`tmc.traversal._delete_child` row by row."""
    near = (value >= 0.5)[:, None]
    excess = torch.clamp_min(torch.where(near, _row_difference(row, law) - miss[:, None] * row,
                                         value[:, None] * row - law), 0.0)
    h = _total(excess)
    new_row = torch.where(h > 0.0, excess / h, _residual_rows(row, law, tok))
    total = miss + h[:, 0]
    empty = total <= 0.0
    new_value = torch.where(empty, 1.0, torch.clamp_max(h[:, 0] / total, 1.0))
    new_miss = torch.where(empty, 0.0, torch.clamp_max(miss / total, 1.0))
    return new_value, new_miss, new_row


# ------------------------------------------------------------------ the walks


def _residual_tests(b: _Batch, tok: Tensor, q: Tensor, p: Tensor, u: Tensor) -> tuple[Tensor, Tensor]:
    """Every batch node's residual walk (:func:`tmc.multidraft.residual_walk_step`): the row of its accepted child
    ``(B,)`` (``-1``: none) and the residual it emits from when none is ``(B, V)``."""
    r = p.index_select(0, b.rows)
    q_b = q.index_select(0, b.rows)
    removed = torch.zeros_like(r, dtype=torch.bool)
    chosen = torch.full((r.shape[0],), -1, dtype=torch.int64, device=p.device)  # accepted child's row, -1: none yet
    for j, (kids, kid_rows) in enumerate(zip(b.kids, b.kid_rows)):
        c = kids.shape[0]
        t = tok.index_select(0, kids)
        law = _laws(b, q_b[:c], removed[:c], t, j == 0)
        open_ = chosen[:c] < 0
        diff = _row_difference(r[:c], law)  # one difference for the test and the residual
        passed = open_ & (u.index_select(0, kids) < _acceptance_at(r[:c], law, t, diff))
        chosen[:c] = torch.where(passed, kid_rows, chosen[:c])
        r[:c] = torch.where((open_ & ~passed)[:, None], _residual_rows(r[:c], law, t, diff), r[:c])
    return chosen, r


def _descend(plan: TreePlan, p: Tensor, chosen: Tensor, r: Tensor) -> tuple[Tensor, Tensor]:
    """From each batch node's accepted child (``chosen``, ``-1``: none) and residual ``r``: the row of the node
    the walk stops at ``()`` (``depth`` pointer steps from the root) and the row it emits from ``(V,)`` (its
    residual, or its target row at a leaf)."""
    b = plan.every
    emit = p.index_copy(0, b.rows, r)  # a leaf emits from its target row
    step = torch.full((p.shape[0],), -1, dtype=torch.int64, device=p.device).index_copy(0, b.rows, chosen)
    at = torch.zeros(1, dtype=torch.int64, device=p.device)
    for _ in range(plan.depth):
        nxt = step.index_select(0, at)
        at = torch.where(nxt >= 0, nxt, at)
    return at[0], emit.index_select(0, at)[0]


def _multidraft(plan: TreePlan, tok: Tensor, q: Tensor, p: Tensor, u: Tensor) -> tuple[Tensor, Tensor]:
    """Recursive residual verification: the accepted node's row ``()`` and the row emitted from ``(V,)``."""
    return _descend(plan, p, *_residual_tests(plan.every, tok, q, p, u))


def _geometric(beta: Tensor, k: Tensor) -> Tensor:
    """``c = (1 − (1 − β)^k) / β`` elementwise, edge cases as :func:`tmc.kseq._geometric` (``k`` float64)."""
    inner = -torch.expm1(k * torch.log1p(-beta)) / beta  # NaN / inf where an edge case below replaces it
    return torch.where((k == 1.0) | (beta >= 1.0), 1.0, torch.where(beta <= 0.0, k, inner))


def _feasible(beta: Tensor, miss: Tensor, gap: Tensor, scale: Tensor, k: Tensor, rho: Tensor) -> Tensor:
    """SpecTr's condition in whichever form holds the small numbers (:func:`tmc.kseq._feasible`)."""
    small = (beta <= 0.0) | (_geometric(beta, k) <= rho * (1.0 + SEARCH_RTOL))
    reach = torch.where(miss > 0.0, torch.exp(k * torch.log(miss)), 0.0)
    return torch.where(rho * beta <= 0.5, small, reach >= gap - SEARCH_RTOL * scale)


def _count_below(ratios: Tensor, rho: Tensor) -> Tensor:
    """How many entries of each sorted row of ``ratios`` ``(m, V)`` lie strictly below ``rho`` ``(m, 1)``, as
    ``(m, 1)`` int64: ``searchsorted``'s left insertion point eagerly (one kernel); under ``torch.compile`` the
    same count as a comparison and a sum, since torch 2.11's triton backend failed to build inductor's fused
    ``searchsorted`` kernel for these rows on an H100 (a loop-carried index whose shape changed in the loop), so
    ``compile_step=True`` with K-SEQ stopped on CUDA.  The two agree for any non-decreasing row without NaN
    (``+inf`` entries included; ``rho`` is finite): the rows ``_kseq_rho`` makes (ratios ``p / q`` of checked
    rows where ``q > 0``, else ``+inf``; ``rho`` within ``[1, widest]``)."""
    if torch.compiler.is_compiling():
        return (ratios < rho).sum(dim=-1, keepdim=True)
    return torch.searchsorted(ratios, rho)


def _kseq_rho(p: Tensor, q: Tensor, k: Tensor, widest: int) -> Tensor:
    """``ρ*`` of each row ``(m, 1)``: :func:`tmc.kseq._rho` for ``(m, V)`` rows and children counts ``k``
    ``(m, 1)`` (at most ``widest``), as fixed-shape work.

    SpecTr's condition is read as :func:`tmc.kseq._condition_curve` forms it: ``1 − β = Q_below(j) −
    P_below(j) / ρ`` and ``1 − ρβ = P_above(j) − ρ Q_above(j) + P_zero`` with ``j`` the number of ratios
    ``p/q`` below ``ρ``, from one stable sort and prefix sums per row (tokens with ``q = 0`` sort last, as
    ``+inf``, and add nothing but ``P_zero``).
    The bisection runs a fixed number of rounds, enough for the widest bracket ``[1, widest]`` to shrink to
    ``RHO_RTOL``; a row whose numpy loop would have stopped (the bracket narrow enough, or its midpoint no
    longer strictly inside) keeps its bracket from then on, so each row ends where numpy's loop ends on the
    same feasibility answers (which may differ in the last bit of ``c``: module doc)."""
    on = q > 0.0
    ratios, order = torch.sort(torch.where(on, p / q, torch.inf), dim=-1, stable=True)
    zero = torch.zeros_like(p[:, :1])
    p_on, q_on = torch.where(on, p, 0.0).gather(1, order), torch.where(on, q, 0.0).gather(1, order)
    p_below = torch.cat([zero, torch.cumsum(p_on, dim=-1)], dim=-1)
    q_below = torch.cat([zero, torch.cumsum(q_on, dim=-1)], dim=-1)
    p_above = torch.cat([torch.cumsum(p_on.flip(-1), dim=-1).flip(-1), zero], dim=-1)
    q_above = torch.cat([torch.cumsum(q_on.flip(-1), dim=-1).flip(-1), zero], dim=-1)
    p_zero = torch.cumsum(torch.where(on, 0.0, p), dim=-1)[:, -1:]  # left to right, as tmc.kseq adds it

    def condition(rho: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        j = _count_below(ratios, rho)  # bisect_left: the ratios strictly below rho
        above, q_up, p_down = p_above.gather(1, j), q_above.gather(1, j), p_below.gather(1, j)
        miss = torch.clamp_min(q_below.gather(1, j) - p_down / rho, 0.0)
        gap = torch.clamp_min(above - rho * q_up + p_zero, 0.0)
        return q_up + p_down / rho, miss, gap, above + rho * q_up + p_zero

    lo = torch.ones_like(k)
    hi = k.clone()
    running = (k > 1.0) & ~_feasible(*condition(lo), k, lo)  # else rho = 1 (one child: K-SEQ is SpS)
    bisecting = running
    for _ in range(52 + (widest - 1).bit_length() if widest > 1 else 0):  # (widest - 1) / 2^rounds <= RHO_RTOL
        mid = 0.5 * (lo + hi)
        bisecting = bisecting & (hi - lo > RHO_RTOL * hi) & (lo < mid) & (mid < hi)
        ok = _feasible(*condition(mid), k, mid)
        hi = torch.where(bisecting & ok, mid, hi)
        lo = torch.where(bisecting & ~ok, mid, lo)
    return torch.where(running, hi, 1.0)


def _kseq_residual_rows(p: Tensor, q: Tensor, k: Tensor, rho: Tensor) -> Tensor:
    """K-SEQ's normalised residual of each row (:func:`spec.llm.verify._kseq_residual` row by row), ``(m, V)``."""
    c = _geometric(_total(torch.minimum(q, p / rho)), k)
    factor = 1.0 - c / rho
    factor = torch.where(factor <= (k * k + 8.0) * RHO_RTOL, 0.0, factor)
    res = torch.clamp_min(torch.where(q * rho >= p, p * factor, p - q * c), 0.0)
    total = _total(res)
    return torch.where(total > 0.0, res / total, p)


def _kseq(plan: TreePlan, tok: Tensor, q: Tensor, p: Tensor, u: Tensor) -> tuple[Tensor, Tensor]:
    """K-SEQ at the nodes whose children were drawn i.i.d., the residual walk at the others
    (:func:`tmc.kseq.kseq_sample_from_uniforms`): the accepted node's row ``()`` and the row emitted from.

    At an i.i.d. node every child is tested against the same target row, ``min(1, p(x) / (ρ q(x)))`` with the
    node's ``ρ*``, and the first that passes is accepted; none: the node emits from K-SEQ's residual."""
    b = plan.every
    if Draw.IID not in b.kinds:  # no i.i.d. node (or no node with children): the residual walk everywhere
        return _multidraft(plan, tok, q, p, u)
    p_b, q_b = p.index_select(0, b.rows), q.index_select(0, b.rows)
    rho = _kseq_rho(p_b, q_b, b.width, len(b.kids))
    chosen = torch.full((p_b.shape[0],), -1, dtype=torch.int64, device=p.device)
    for kids, kid_rows in zip(b.kids, b.kid_rows):
        c = kids.shape[0]
        t = tok.index_select(0, kids)
        accept = _acceptance(_at(p_b[:c], t), rho[:c, 0] * _at(q_b[:c], t))
        passed = (chosen[:c] < 0) & (u.index_select(0, kids) < accept)
        chosen[:c] = torch.where(passed, kid_rows, chosen[:c])
    r = _kseq_residual_rows(p_b, q_b, b.width, rho)
    if b.kinds != {Draw.IID}:  # swor / top-k nodes too: theirs from the residual walk
        walked, walked_r = _residual_tests(b, tok, q, p, u)
        chosen, r = torch.where(b.iid[:, 0], chosen, walked), torch.where(b.iid, r, walked_r)
    return _descend(plan, p, chosen, r)


def _powers(x: Tensor, e: Tensor, top: int) -> Tensor:
    """``x ** e`` for integer exponents ``e`` in ``[0, top]`` (broadcast), each taken as ``x ** n`` with a Python
    ``n``: the rounding of the host walk's ``tensor ** int`` (torch's fast paths for small ``n``)."""
    out = torch.ones_like(x)
    for n in range(1, top + 1):
        out = torch.where(e == n, x**n, out)
    return out


def _best_of_rows(a: Tensor, b: Tensor, m: Tensor, top: int) -> Tensor:
    """``(a + b)^m − b^m`` as ``a Σ_{j<m} (a + b)^j b^{m−1−j}`` (:func:`spec.llm.verify._best_of`) with a
    per-row ``m`` ``(B, 1)`` of at most ``top``: the same terms added in the same order."""
    total = torch.zeros_like(a)
    for j in range(top):
        term = (a + b) ** j * _powers(b, m - 1 - j, top - 1)
        total = torch.where(j < m, total + term, total)
    return a * total


def _binomial_terms(binomial: Tensor, m: Tensor, c: Tensor, pi: Tensor, rest: Tensor, top: int) -> Tensor:
    """``C(m, j) π^(j − c) (1 − π)^(m − j)`` for ``j = 0 .. top`` ``(B, top + 1)``, per-row ``m``, ``c``, ``π`` and
    ``rest = 1 − π`` (formed by the caller, not by subtraction) ``(B, 1)`` (entries outside ``c .. m`` are not
    used): :func:`tmc.ordered_traversal._binom_terms`, formed in its order (no ``π^c``, which underflowed)."""
    powers_pi = torch.cat([pi**j for j in range(top + 1)], dim=1)
    powers_rest = torch.cat([rest**j for j in range(top + 1)], dim=1)
    j = torch.arange(top + 1, device=pi.device)
    choose = binomial[: top + 1, : top + 1].index_select(0, m[:, 0])
    return choose * powers_pi.gather(1, (j - c).clamp(0, top)) * powers_rest.gather(1, (m - j).clamp(0, top))


def _tail(terms: Tensor, m: Tensor, c: Tensor) -> Tensor:
    """``P(Bin(m, π) ≥ c) / π^c0`` (the terms' scale): the terms ``j = c .. m`` added left to right."""
    j = torch.arange(terms.shape[1], device=terms.device)
    return _total(torch.where((c <= j) & (j <= m), terms, 0.0))


def _iid_sorted_laws(plan: TreePlan, q: Tensor, rank: Tensor, after: Tensor, tok: Tensor, k: Tensor) -> list[Tensor]:
    """Law of each position of ``k`` sorted i.i.d. draws given the sorted tokens before it ``tok`` ``(B, W)``
    (:func:`tmc.ordered_traversal.iid_sorted_law` row by row)."""
    top = tok.shape[1]
    laws = [_normalised_rows(_best_of_rows(q, after, k, top))]
    for i in range(1, top):
        w = tok[:, i - 1 : i]
        c = (tok[:, :i] == w).sum(dim=1, keepdim=True)  # w's copies in the prefix (equal tokens sort together)
        m = (k - (i - c)).clamp(0, top)  # draws not pinned before w (clamped in rows with fewer than i + 1 children)
        q_w, rest = q.gather(1, w), after.gather(1, w)
        pi, rest_pi = q_w / (q_w + rest), rest / (q_w + rest)  # as tmc.ordered_traversal.iid_sorted_law
        terms = _binomial_terms(plan.binomial, m, c, pi, rest_pi, top)
        at_least = _tail(terms, m, c)
        exact = terms.gather(1, c) / at_least  # P(Bin(m, π) = c) / P(Bin(m, π) ≥ c)
        below = (rank > rank.gather(1, w)) & (rest > 0.0)
        out = torch.where(below, exact * _best_of_rows(q / rest, after / rest, m - c, top), 0.0)
        laws.append(_normalised_rows(out.scatter(1, w, _tail(terms, m, c + 1) / at_least)))
    return laws


def _swor_sorted_laws(q: Tensor, order: Tensor, rank: Tensor, after: Tensor, tok: Tensor) -> list[Tensor]:
    """The two laws of a pair drawn without replacement, sorted: the first, and the second given the first
    ``tok[:, 0]`` (:func:`tmc.ordered_traversal.swor_sorted_law` with ``k = 2``, row by row)."""
    left = _one_minus_rows(q)  # mass left for the second draw
    inv = torch.where(left > 0.0, 1.0 / torch.clamp_min(left, 1e-300), 0.0)
    first = q * (after * inv + _mass_after_rows(q * inv, order))
    y = tok[:, :1]
    second = torch.where(rank > rank.gather(1, y), q * (inv.gather(1, y) + inv), 0.0)
    return [_normalised_rows(first), _normalised_rows(second)]


def _visiting(plan: TreePlan, b: _Batch, p_b: Tensor, q_b: Tensor, tok: Tensor) -> tuple[Tensor, list[Tensor]]:
    """Ordered Traversal's visiting order at each batch node and the law of each visiting rank
    (:func:`tmc.ordered_traversal.ratio_ordered_children`): ``(B, W)`` children, ``W`` laws ``(B, V)``.

    At a node with ``b.ordered`` its children sorted stably by the rank of their tokens in decreasing
    ``p / q`` of the node's own rows (``q = 0`` last), with the order-statistic laws; elsewhere the draw
    order (their laws are :func:`_laws`'; the rows returned for them are not used)."""
    rows, width = b.table.shape
    vocab = q_b.shape[1]
    keys = torch.where(q_b > 0.0, -(p_b / q_b), torch.inf)
    order = torch.argsort(keys, dim=-1, stable=True)
    rank = torch.empty_like(order).scatter_(1, order, torch.arange(vocab, device=q_b.device).expand(rows, vocab))
    toks = tok.index_select(0, b.table.reshape(-1)).reshape(rows, width)
    draw_order = torch.arange(width, device=q_b.device).expand(rows, width)
    key = torch.where(b.ordered, torch.where(b.present, rank.gather(1, toks), vocab), draw_order)
    perm = torch.argsort(key, dim=1, stable=True)
    toks = toks.gather(1, perm)
    after = _mass_after_rows(q_b, order)
    laws = [q_b] * width  # ranks no ordered node has are not used
    if Draw.IID in b.kinds:
        laws = _iid_sorted_laws(plan, q_b, rank, after, toks, b.width.to(torch.int64))
    if Draw.SWOR in b.kinds:  # two children (one: not sorted; three or more: no device walk, _wide_swor_node)
        pair = _swor_sorted_laws(q_b, order, rank, after, toks)
        laws[:2] = pair if Draw.IID not in b.kinds else [torch.where(b.iid, a, s) for a, s in zip(laws, pair)]
    return b.table.gather(1, perm), laws


def _traversal(plan: TreePlan, tok: Tensor, q: Tensor, p: Tensor, u: Tensor,
               ordered: bool = False) -> tuple[Tensor, Tensor]:
    """Traversal Verification, or with ``ordered`` its ratio-ordered variant: the passing test's row ``()`` and
    the row emitted from ``(V,)``.

    Ordered, a node's children are visited in an order the rows choose, so the tests' post order is found on
    the device too: a node's subtree starts after those of the siblings visited before it, and the walk stops
    at the passing test with the smallest position (``start + size − 1``)."""
    value = torch.ones(p.shape[0], dtype=F64, device=p.device)  # each node's a: set on entry, final after its level
    miss = torch.zeros_like(value)
    final = p.clone()  # each node's residual row after all its children were deleted
    start = torch.zeros(p.shape[0], dtype=torch.int64, device=p.device) if ordered else None  # post-order starts
    if ordered and plan.every.any_ordered:  # every node's visiting order and laws at once (its own rows only)
        e = plan.every
        visit_all, laws_all = _visiting(plan, e, p.index_select(0, e.rows), q.index_select(0, e.rows), tok)
    for b, pos in zip(plan.levels, plan.level_pos):
        if not b.kids:
            continue
        v, m, row = value.index_select(0, b.rows), miss.index_select(0, b.rows), p.index_select(0, b.rows)
        q_b = q.index_select(0, b.rows)
        removed = torch.zeros_like(row, dtype=torch.bool)
        visit = visit_all.index_select(0, pos) if ordered and b.any_ordered else None
        offset = None if start is None else start.index_select(0, b.rows)
        for j, (kids, kid_rows) in enumerate(zip(b.kids, b.kid_rows)):
            c = kids.shape[0]
            if visit is not None:  # this rank's child of each node in its visiting order
                kids = visit[:c, j]
                kid_rows = kids + 1
            t = tok.index_select(0, kids)
            law = _laws(b, q_b[:c], removed[:c], t, j == 0)
            if visit is not None:
                law = torch.where(b.ordered[:c], laws_all[j].index_select(0, pos[:c]), law)
            kid_value, kid_miss = _child_state(v[:c], m[:c], row[:c], law, t)
            value.index_copy_(0, kid_rows, kid_value)
            miss.index_copy_(0, kid_rows, kid_miss)
            v[:c], m[:c], row[:c] = _delete_child(v[:c], m[:c], row[:c], law, t)
            if start is not None and offset is not None:
                start.index_copy_(0, kid_rows, offset[:c])
                offset[:c] += plan.sizes.index_select(0, kid_rows)
        value.index_copy_(0, b.rows, v)
        final.index_copy_(0, b.rows, row)
    if start is not None:
        rows = torch.arange(p.shape[0], device=p.device)
        passes = u.index_select(0, (rows - 1).clamp_min(0)) < value
        passes[:1].fill_(True)  # the root's test
        position = torch.where(passes, start + plan.sizes - 1, p.shape[0])
        at = position.argmin().reshape(1)
        return at[0], final.index_select(0, at)[0]
    tests = plan.post
    passes = u.index_select(0, (tests - 1).clamp_min(0)) < value.index_select(0, tests)
    passes[-1:].fill_(True)  # the root's test (not ``passes[-1] = True``: on CUDA that copies a host scalar in)
    at = tests.index_select(0, passes.to(torch.int64).argmax().reshape(1))  # argmax: the first pass
    return at[0], final.index_select(0, at)[0]


def _ordered_traversal(plan: TreePlan, tok: Tensor, q: Tensor, p: Tensor, u: Tensor) -> tuple[Tensor, Tensor]:
    """Ratio-ordered Traversal Verification (:mod:`tmc.ordered_traversal`): :func:`_traversal`, ordered."""
    if plan.swor_wide is not None:
        raise ValueError(f"ordered_traversal: node {plan.swor_wide} has 3 or more children drawn 'swor', whose sorted "
                         "laws enumerate tuples on the host; verify it with the host walk (verify_backend 'torch')")
    return _traversal(plan, tok, q, p, u, ordered=True)


_WALKS = {"multidraft": _multidraft, "traversal": _traversal, "ordered_traversal": _ordered_traversal, "kseq": _kseq}


# ------------------------------------------------------------------ entry points


def _flags(plan: TreePlan, tok_raw: Tensor, q_raw: Tensor | None, p_raw: Tensor, u: Tensor) -> Tensor:
    """0-d bool: some value is invalid (the host checks of :func:`spec.llm.verify._prepare_tree` then say which)."""
    vocab = p_raw.shape[1]
    bad = _rows_bad(p_raw) | ((tok_raw < 0) | (tok_raw >= vocab)).any() | ~((u >= 0.0) & (u < 1.0)).all()
    tok = tok_raw.clamp(0, vocab - 1)
    pairs = plan.distinct
    if pairs.numel():
        bad = bad | (tok.index_select(0, pairs[:, 0]) == tok.index_select(0, pairs[:, 1])).any()
    if q_raw is not None and plan.sampled_nodes:
        drafted = q_raw.index_select(0, plan.sampled_parent_rows).gather(1, tok.index_select(0, plan.sampled_kids)[:, None])
        bad = bad | _rows_bad(q_raw.index_select(0, plan.sampled)) | (drafted <= 0.0).any()
    return bad


def tree_head(method: str, plan: TreePlan, draft_tokens: Tensor, draft_probs: Tensor | None, target_probs: Tensor,
              uniforms: Tensor, *, trusted: bool = False) -> Tensor:
    """One tree step on the device, not synchronised: int64 ``(3 + depth,)`` = ``(bad, n, y, nodes…)``, the
    validation flag (0 when ``trusted``), the accepted count, the emitted token and the accepted nodes from
    the root's child down (``-1`` after the ``n``-th).

    Arrays as :func:`spec.llm.verify.verify_tree` takes them, all on ``plan.device``: ``draft_tokens`` ``(N,)``,
    ``draft_probs`` ``(N + 1, V)`` (``None`` when every node is ``topk``), ``target_probs`` ``(N + 1, V)``,
    ``uniforms`` ``(N + 1,)``.  Shapes are checked on the host (no sync); values are flagged on the device,
    unless ``trusted`` (then token ids must lie in ``[0, V)``: an id outside indexes out of range).
    """
    walk = _WALKS[_check_method(method, DEVICE_TREE_METHODS)]
    n = plan.size
    p_raw = _prob_tensor("target_probs", target_probs, plan.device)
    tok_raw = _long_tensor("draft_tokens", draft_tokens, plan.device)
    u = _float_tensor("uniforms", uniforms, plan.device)
    if p_raw.ndim != 2 or p_raw.shape[1] == 0:
        raise ValueError(f"target_probs must be a 2-D (N + 1, V) array with V >= 1, got shape {tuple(p_raw.shape)}")
    vocab = int(p_raw.shape[1])
    for name, got, want in (("draft_tokens", tuple(tok_raw.shape), (n,)),
                            ("target_probs", tuple(p_raw.shape), (n + 1, vocab)), ("uniforms", tuple(u.shape), (n + 1,))):
        if got != want:
            raise ValueError(f"{name} has shape {got}; expected {want} for a tree of {n} nodes")
    q_raw = None
    if draft_probs is None:
        if plan.sampled_nodes:
            node = plan.sampled_nodes[0]
            kind = plan.draws[plan.parents.index(node)].value
            raise ValueError(f"draft_probs is None but node {node} has children drawn '{kind}'")
        q = torch.zeros_like(p_raw, dtype=F64)
    else:
        q_raw = _prob_tensor("draft_probs", draft_probs, plan.device)
        if tuple(q_raw.shape) != (n + 1, vocab):
            raise ValueError(f"draft_probs has shape {tuple(q_raw.shape)}; expected (N + 1, V) = {(n + 1, vocab)}")
        q = _normalised_rows(q_raw.to(F64))
    if trusted:
        bad, tok = torch.zeros((), dtype=torch.bool, device=plan.device), tok_raw
    else:
        bad, tok = _flags(plan, tok_raw, q_raw, p_raw, u), tok_raw.clamp(0, vocab - 1)
    at, row = walk(plan, tok, q, _normalised_rows(p_raw.to(F64)), u)
    y = categorical_draw(row, u[n])
    return torch.cat([bad.to(torch.int64).reshape(1), plan.lengths.index_select(0, at.reshape(1)), y.reshape(1),
                      plan.paths.index_select(0, at.reshape(1))[0]])


def read_head(got: Sequence[int], tokens: Sequence[int]) -> Verified:
    """The :class:`Verified` of a host copy of :func:`tree_head`'s row after its flag (``(n, y, nodes…)``)."""
    n, y, nodes = got[0], got[1], tuple(got[2 : 2 + got[0]])
    return Verified(torch.tensor([tokens[i] for i in nodes] + [y], dtype=torch.int64), n, nodes)


def verify_tree_on_device(method: str, plan: TreePlan, draft_tokens: TensorLike, draft_probs: TensorLike | None,
                          target_probs: TensorLike, uniforms: TensorLike, *, trusted: bool = False) -> Verified:
    """:func:`spec.llm.verify.verify_tree` for a :data:`DEVICE_TREE_METHODS` verifier on a planned shape, with ONE host
    transfer: the flag, the result and the draft tokens.  Same tokens as the host walk on the same uniforms;
    the same ``ValueError`` for bad values (found by the host checks once the flag is read).  The tokens come
    back as a host tensor.  Inputs off ``plan.device`` are moved there first."""
    if not isinstance(plan, TreePlan):
        raise ValueError(f"plan must be a TreePlan (TreePlan.of(parents, draws, device)), got {type(plan).__name__}")
    dev = plan.device
    args = (_long_tensor("draft_tokens", draft_tokens, dev),
            None if draft_probs is None else _prob_tensor("draft_probs", draft_probs, dev),
            _prob_tensor("target_probs", target_probs, dev), _float_tensor("uniforms", uniforms, dev))
    head = tree_head(method, plan, *args, trusted=trusted)
    got = torch.cat([head, args[0].to(torch.int64)]).tolist()
    if got[0]:
        _prepare_tree(args[0], list(plan.parents), plan.draws, args[1], args[2], args[3])  # raises the first ValueError
        raise AssertionError("the device flagged a value the host checks accept")  # pragma: no cover
    return read_head(got[1 : len(head)], got[len(head) :])
