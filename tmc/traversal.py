"""Traversal Verification: leaf-to-root verification of a draft tree, as an exact kernel and a sampler.

Notation (DESIGN.md §3): ``p`` is the target, ``q`` the draft.  Reference:
Y. Weng, Q. Hu, X. Chen, L. Liu, D. Mei, H. Qiu, J. Tian, Z. Shi,
"Traversal Verification for Speculative Tree Decoding", NeurIPS 2025,
arXiv:2505.12398: its traversal algorithm (notation ``p_α`` for the
acceptance value, ``M_b`` = ``p``, ``M_s`` = ``q``), its losslessness
theorem, which this module's tests check by exact enumeration, and its
chain case, Sun et al.'s block verification (:func:`tmc.block_kernel`).
Only the paper's abstract could be read from this project's sources, so its
algorithm and theorem numbers are not quoted here.  The rules below are
stated in full and proved (sketch below), and the exact completion identity
of :func:`tmc.laws.output_law` is what decides whether they are right.

**The algorithm.**  Every node ``X`` of a :class:`~tmc.multidraft.DraftTree`
carries an *acceptance value* ``a_X ∈ [0, 1]`` (the paper's ``p_α``) and a
*residual row* ``r_X`` (the target at ``X``, later residualised).  The root
starts with ``a = 1``, ``r = p(· | prefix)``.  Node ``i`` with token ``y``,
drawn from the proposal law ``q_i`` (:func:`tmc.multidraft.proposal_laws`:
``q`` for ``iid``, ``q`` without the earlier siblings for ``swor``, a point
mass for ``topk``) under parent ``P``, gets

    a_i = min(1, a_P · r_P(y) / q_i(y)),    r_i = p(· | path to i),

which on an untouched path is ``min(1, Π p(y_j)/q_j(y_j))`` clipped at every
step: the sequence-level acceptance of the whole path.  The tree is then
traversed in post order (depth first, siblings in index order: "the first
leaf in DFS order"):

* the current leaf ``X`` is tested — ``u < a_X`` accepts the path to ``X``
  and emits one token from ``r_X`` (``p`` at an original leaf: the bonus
  token; the residual at an inner node whose children were all deleted);
* otherwise ``X`` is deleted and its parent ``P`` updated with the law
  ``q_X`` that ``X`` was drawn from::

      h = Σ (a_P r_P − q_X)_+,      R = Σ (q_X − a_P r_P)_+ = (1 − a_P) + h,
      r_P ← (a_P r_P − q_X)_+ / h,  a_P ← h / R,

  and the next sibling's value is computed from the updated ``(a_P, r_P)``
  with its own proposal law;
* the root always passes its test (``a_root`` stays 1: there ``R = h``), so
  when every child of the root is deleted one token is drawn from ``r_root``.

On a chain this is block verification (the stop probability ``h/(h+1−a)``
of Sun et al.); on a one-level tree it is residual verification
(:func:`tmc.multidraft.multidraft_kernel`), because the root's value is 1.

**Which proposal law, and why it is lossless.**  Write ``μ = a·r`` for a
node's state and ``P(·|y)`` for the target's continuation law.  Claim: the
traversal of a node's subtree, completed with the target, outputs
``Σ_y μ(y) P(· | y)`` in expectation over the draft below the node, and
rejects the node with probability ``1 − a``.  Induction on the remaining
children: a child ``y ~ q_i`` has value ``min(1, μ(y)/q_i(y))``, so by
induction its subtree contributes ``Σ_y min(q_i(y), μ(y)) P(·|y)`` and is
rejected with probability ``R = Σ (q_i − μ)_+``; after a rejection the state
is ``(μ − q_i)_+ / R``, *which does not depend on which token was drawn*, so
the remaining siblings (drawn from whatever law they were actually drawn
from given the earlier ones — hence ``proposal_laws``) contribute
``R · Σ_y (μ − q_i)_+(y)/R · P(·|y)``; the two sum to ``Σ_y μ(y) P(·|y)``.
A leaf emits ``a · r = μ`` directly.  At the root ``μ = p`` and the root
never rejects, so the step's output law completes to the target.  The law
used in every ratio and every update is therefore the law the child was
drawn from, conditioned on its earlier siblings; nothing else about the
siblings enters, which is why i.i.d. trees with repeated tokens need no
special case.

**Complexity.**  The rules are deterministic given the draft: the only
randomness is which test passes first, and the state at a node after a
deletion does not depend on how the deleted subtree was rejected.  The
tests therefore form one fixed post-order sequence, and the exact kernel is
``K[test] = Π_{earlier tests} (1 − a) · a · r`` — ``O(N · V)`` time and
``O(depth · V)`` extra memory, no enumeration of branches.  The sampler
walks the same sequence and stops at the first test that passes.

**Numerics.**  Each node carries ``a`` and its complement ``1 − a``
separately (``1 − a_i = (q_i(y) − a r(y))/q_i(y)`` and ``1 − a ← (1 − a)/R``
after a deletion, both exact in real arithmetic), and ``a r − q`` is formed
as ``(r − q) − (1 − a) r`` when ``a ≥ 1/2``, as :mod:`tmc.chain` does, so
near-equal ``p`` and ``q`` keep full relative accuracy.  The residual is
normalised here rather than by :func:`tmc.residual.residual` because it is
``(a r − q)_+``, not ``(r − q)_+``; when it has no mass (``h = 0``) the row
is never emitted with positive probability (``a ← 0``) except at the root,
where ``a = 1`` and the row is :func:`tmc.residual.residual`'s, degenerate
case included.  ``R = 0`` means the deletion had probability zero
(``a r = q``); the value is then left at 1.

Arrays and kernel indexing follow :mod:`tmc.multidraft` exactly: ``p_rows``
is ``(N + 1, V)`` (row 0 the root, row ``i + 1`` node ``i``); the kernel is
``(N + 1, V)`` with row 0 "nothing accepted" and row ``i + 1`` "the path to
node ``i`` accepted", column the one emitted token.

Noise layout of the sampler (the same as :mod:`tmc.multidraft`'s): ``N + 1``
uniforms; ``u[i]`` is the test of node ``i`` (each node is tested at most
once; the root needs none) and ``u[N]`` draws the emitted token by inverse
CDF from the accepted node's row.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from tmc.multidraft import ROOT, DraftTree, check_tree_p_rows, proposal_laws
from tmc.noise import categorical, check_uniforms
from tmc.residual import acceptance_probability, difference_at, residual, row_difference
from tmc.validate import as_rng

FloatArray = NDArray[np.float64]

#: ``rule(tree, node, p_row) -> (children, laws)``: the order in which a node's
#: children are visited and the proposal law each is verified against (the law
#: of its token given the children visited before it).
ChildrenRule = Callable[[DraftTree, int, FloatArray], tuple[Sequence[int], Sequence[FloatArray]]]


def recorded_children(tree: DraftTree, node: int, p_row: FloatArray) -> tuple[Sequence[int], Sequence[FloatArray]]:
    """The default :data:`ChildrenRule`: draw order and each node's recorded proposal law."""
    return tree.children(node), proposal_laws(tree, node)


@dataclass(frozen=True)
class NodeTest:
    """One test of the traversal: node ``node`` passes with probability ``value``."""

    node: int  # tested node (ROOT = -1 for the root, which always passes)
    value: float  # acceptance value a (the paper's p_α)
    miss: float  # 1 − a, carried separately for accuracy
    row: FloatArray  # (V,) law of the token emitted if the test passes


@dataclass
class _Frame:
    """A node on the traversal stack: its current state and the next child to visit."""

    node: int  # node index (ROOT for the root)
    value: float  # current acceptance value a
    miss: float  # 1 − a
    row: FloatArray  # (V,) current residual row r
    kids: Sequence[int]  # children in visiting order
    laws: Sequence[FloatArray]  # proposal law of each child, in visiting order
    next_kid: int = 0  # index into kids of the next child to visit


def _excess(value: float, miss: float, row: FloatArray, law: FloatArray) -> FloatArray:
    """``a · r − q`` elementwise, accurate when ``a`` is near 1 (as :mod:`tmc.chain` forms it)."""
    if value >= 0.5:
        return row_difference(row, law) - miss * row
    out: FloatArray = value * row - law
    return out


def _child_state(value: float, miss: float, row: FloatArray, law: FloatArray, tok: int) -> tuple[float, float]:
    """``(a_i, 1 − a_i)`` of a child with token ``tok`` drawn from ``law``: ``a_i = min(1, a r(tok)/law(tok))``."""
    q_tok = float(law[tok])
    r_tok = float(row[tok])
    if r_tok <= 0.0:
        # never accepted, whatever law(tok) is: an ordered child's sorted law can underflow to 0 at a drawn
        # token (a gap of 0 - 0 passed it at value 1, with target probability 0)
        return 0.0, 1.0
    gap = difference_at(row, law, tok) - miss * r_tok if value >= 0.5 else value * r_tok - q_tok
    if gap >= 0.0:
        return 1.0, 0.0
    child_miss = min(1.0, -gap / q_tok)
    if child_miss <= 0.5:
        return 1.0 - child_miss, child_miss
    return acceptance_probability(value * r_tok, q_tok), child_miss


def _delete_child(
    frame: _Frame, law: FloatArray, tok: int, *, update_value: bool = True
) -> tuple[float, float, FloatArray]:
    """``(a, 1 − a, r)`` of ``frame``'s node after deleting its child ``tok`` drawn from ``law``.

    ``r ← norm((a r − q)_+)`` and ``a ← h / R`` (module doc).  ``update_value``
    is a hook for the audit's BIASED variant
    (:mod:`verification.broken_traversal`), which leaves ``a`` unchanged; the
    algorithm always updates it.
    """
    excess = np.maximum(_excess(frame.value, frame.miss, frame.row, law), 0.0)
    h = float(excess.sum())
    # r with the rejected mass removed; tmc.residual's rule where nothing is left.
    row = excess / h if h > 0.0 else residual(frame.row, law, tok)
    if not update_value:
        return frame.value, frame.miss, row
    total = frame.miss + h  # R = Σ (q − a r)_+ = (1 − a) + h for normalised rows
    if total <= 0.0:
        return 1.0, 0.0, row  # a r = q: the deletion had probability zero
    return min(1.0, h / total), min(1.0, frame.miss / total), row


def _frame(tree: DraftTree, p: FloatArray, node: int, value: float, miss: float, rule: ChildrenRule) -> _Frame:
    kids, laws = rule(tree, node, p[node + 1])
    return _Frame(node, value, miss, p[node + 1], kids, laws)


def traversal_tests(
    tree: DraftTree, p: FloatArray, *, update_value: bool = True, children: ChildrenRule = recorded_children
) -> Iterator[NodeTest]:
    """The tests of Traversal Verification in order, computed lazily; the root's comes last.

    ``p`` must already be validated (:func:`tmc.multidraft.check_tree_p_rows`).
    The state after a deletion is computed only when the consumer asks for the
    next test, so a sampler that stops at the first pass does no extra work.
    ``update_value=False`` is the hook of the BIASED variant (see
    :func:`_delete_child`).
    """
    stack = [_frame(tree, p, ROOT, 1.0, 0.0, children)]
    while stack:
        top = stack[-1]
        if top.next_kid < len(top.kids):
            kid = top.kids[top.next_kid]
            value, miss = _child_state(top.value, top.miss, top.row, top.laws[top.next_kid], tree.tokens[kid])
            stack.append(_frame(tree, p, kid, value, miss, children))
            continue
        stack.pop()
        if not stack:
            yield NodeTest(ROOT, 1.0, 0.0, top.row)
            return
        yield NodeTest(top.node, top.value, top.miss, top.row)
        parent = stack[-1]
        law = parent.laws[parent.next_kid]
        parent.value, parent.miss, parent.row = _delete_child(
            parent, law, tree.tokens[top.node], update_value=update_value
        )
        parent.next_kid += 1


def _traversal_kernel(
    tree: DraftTree, p: FloatArray, *, update_value: bool = True, children: ChildrenRule = recorded_children
) -> FloatArray:
    """Exact ``(N + 1, V)`` kernel on validated rows: ``K[test] = Π (1 − a_earlier) · a · r``."""
    kernel = np.zeros_like(p)
    reach = 1.0  # probability that every earlier test failed
    for test in traversal_tests(tree, p, update_value=update_value, children=children):
        if test.node == ROOT:
            kernel[0] += reach * test.row
            break
        if test.value > 0.0:
            kernel[test.node + 1] += (reach * test.value) * test.row
        reach *= test.miss
        if reach == 0.0:
            break
    return kernel


def _traversal_step(
    tree: DraftTree, p: FloatArray, uu: FloatArray, *, update_value: bool = True, children: ChildrenRule = recorded_children
) -> list[int]:
    """One step on validated rows and ``N + 1`` validated uniforms (layout in the module doc)."""
    for test in traversal_tests(tree, p, update_value=update_value, children=children):
        if test.node == ROOT or uu[test.node] < test.value:
            return list(tree.path(test.node)) + [categorical(test.row, float(uu[tree.size]))]
    raise AssertionError("the root's test always passes")  # pragma: no cover


def traversal_kernel(
    tree: DraftTree, p_rows: ArrayLike, *, update_value: bool = True, children: ChildrenRule = recorded_children
) -> FloatArray:
    """Exact output law ``(N + 1, V)`` of Traversal Verification (indexing of :mod:`tmc`).

    ``children`` sets the visiting order of each node's children and the law
    each is verified against (default: draw order, recorded laws; another
    lossless rule is :mod:`tmc.ordered_traversal`'s).  ``update_value=False``
    leaves a parent's acceptance value unchanged after a child is deleted:
    that variant is BIASED and exists only as the audit's negative example
    (``verification.broken_traversal``).
    """
    p = check_tree_p_rows(tree, p_rows)
    return _traversal_kernel(tree, p, update_value=update_value, children=children)


def traversal_sample_from_uniforms(
    tree: DraftTree,
    p_rows: ArrayLike,
    u: ArrayLike,
    *,
    update_value: bool = True,
    children: ChildrenRule = recorded_children,
) -> list[int]:
    """One Traversal Verification step driven by ``N + 1`` uniforms: the emitted tokens."""
    p = check_tree_p_rows(tree, p_rows)
    uu = check_uniforms("u", u, tree.size + 1)
    return _traversal_step(tree, p, uu, update_value=update_value, children=children)


def traversal_sample(
    tree: DraftTree,
    p_rows: ArrayLike,
    rng: np.random.Generator | int,
    *,
    update_value: bool = True,
    children: ChildrenRule = recorded_children,
) -> list[int]:
    """One Traversal Verification step: the accepted path plus one token.

    ``rng`` is a ``numpy.random.Generator`` or an integer seed.
    """
    p = check_tree_p_rows(tree, p_rows)
    uu = as_rng(rng).random(tree.size + 1)
    return _traversal_step(tree, p, uu, update_value=update_value, children=children)
