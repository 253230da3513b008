"""Check of DySpec's greedy-optimality theorem (DySpec Appendix D.1) and its Algorithm 1.

The search space is the ``V``-ary token tree of the draft ``q``; node ``u``
has weight ``w_u = prod q(u_{m+1} | u_{0:m})`` along its path (the root has
weight 1).  Theorem D.1: growing a tree from the root by repeatedly adding
the heaviest neighbour (a child of a chosen node) gives, at every size N, a
connected rooted subtree (A) of maximum total weight among all connected
rooted subtrees with N nodes (B).

* :func:`greedy_subtree` is that greedy, kept with a heap of candidates as
  in DySpec's Algorithm 1 (pop the best, push its children).
* :func:`brute_force_best` enumerates every connected rooted subtree of size
  N once (each subtree is grown from the root by adding frontier nodes in a
  fixed order, with skipped frontier nodes excluded for good).
* :func:`dp_best` is a third, independent tree-knapsack optimum, used for
  sizes too large to enumerate.

A second family runs Algorithm 1 as written (sampling without replacement):
a *position* is one sampling slot; popping a position with value ``v`` draws
``y`` from the residual row ``R`` and creates two positions, the first child
of ``y`` (value ``v R[y]``, row ``q(. | path + y)``) and the next sibling
(value ``v (1 - R[y])``, ``R`` without ``y``).  With the draws fixed in
advance (one uniform per position), the positions form a tree whose values
never increase along a path, so Thm D.1 applies to it as well.

The proof needs exactly that monotonicity (``w_{u_q} >= w_{u_p}`` for an
ancestor ``u_q`` of ``u_p``); a control with non-monotone weights shows the
greedy then fails.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from types import MappingProxyType
from typing import TypeVar

import numpy as np

from hypothesis import strategies as st

from proofs_check.cases import SEEDS, WEIGHTS, draw_cases, normalised, rng_for
from proofs_check.exact import ONE, ZERO, Path
from proofs_check.registry import Budget, Check, CheckResult, Tally, control, theorem

N = TypeVar("N", bound=Hashable)
Children = Callable[[N], Sequence[N]]
Weight = Callable[[N], Fraction]
ENUMERATION_CAP = 200_000  # subtrees enumerated at most per (case, size)


def greedy_subtree(
    root: N, children: Children[N], weight: Weight[N], size: int, *, key: Weight[N] | None = None
) -> list[N]:
    """Thm D.1's greedy: from {root}, add the best candidate (a child of a chosen node) ``size - 1`` times.

    ``key`` ranks candidates (default: their weight); the negative controls
    pass a wrong key.  Ties go to the earliest pushed candidate.
    """
    if size < 1:
        raise ValueError(f"size must be >= 1, got {size}")
    rank = weight if key is None else key
    chosen = [root]
    heap: list[tuple[Fraction, int, N]] = []
    counter = 0
    for c in children(root):
        heapq.heappush(heap, (-rank(c), counter, c))
        counter += 1
    while len(chosen) < size and heap:
        _, _, node = heapq.heappop(heap)
        chosen.append(node)
        for c in children(node):
            heapq.heappush(heap, (-rank(c), counter, c))
            counter += 1
    return chosen


def rooted_subtrees(root: N, children: Children[N], size: int) -> Iterator[tuple[N, ...]]:
    """Every connected subtree containing ``root`` with ``size`` nodes, each exactly once."""

    def grow(chosen: tuple[N, ...], frontier: tuple[N, ...]) -> Iterator[tuple[N, ...]]:
        if len(chosen) == size:
            yield chosen
            return
        for i, node in enumerate(frontier):
            # frontier[:i] are excluded from here on, so no subtree is produced twice
            yield from grow(chosen + (node,), frontier[i + 1 :] + tuple(children(node)))

    yield from grow((root,), tuple(children(root)))


def brute_force_best(root: N, children: Children[N], weight: Weight[N], size: int) -> tuple[Fraction, int]:
    """(maximum total weight, number of subtrees enumerated) over connected rooted subtrees of ``size``."""
    best, count = None, 0
    for tree in rooted_subtrees(root, children, size):
        count += 1
        total = sum((weight(u) for u in tree), ZERO)
        best = total if best is None or total > best else best
        if count > ENUMERATION_CAP:
            raise ValueError(f"more than {ENUMERATION_CAP} subtrees of size {size}; use dp_best")
    return (ZERO if best is None else best), count


def dp_best(root: N, children: Children[N], weight: Weight[N], size: int) -> Fraction:
    """Maximum weight of a connected rooted subtree with exactly ``size`` nodes (tree knapsack)."""

    def table(u: N) -> dict[int, Fraction]:
        best = {1: weight(u)}  # best[k]: heaviest subtree rooted at u with k nodes
        for c in children(u):
            sub = table(c)
            merged = dict(best)
            for i, bi in best.items():
                for j, sj in sub.items():
                    k = i + j
                    if k <= size and (k not in merged or bi + sj > merged[k]):
                        merged[k] = bi + sj
            best = merged
        return best

    return table(root).get(size, ZERO)


def is_rooted_subtree(nodes: Sequence[Path]) -> bool:
    """(A): the chosen nodes contain the root and each one's parent."""
    chosen = set(nodes)
    return () in chosen and all(s[:-1] in chosen for s in chosen if s)


# -- token-tree cases ------------------------------------------------------------------


@dataclass(frozen=True)
class TokenTree:
    """A draft's token tree: rows q(. | path) up to a depth."""

    vocab: int  # number of tokens V
    depth: int  # deepest node
    rows: Mapping[Path, tuple[Fraction, ...]]  # q(. | path) for every path shorter than depth

    def children(self, path: Path) -> tuple[Path, ...]:
        if len(path) >= self.depth:
            return ()
        return tuple(path + (a,) for a in range(self.vocab))

    def weight(self, path: Path) -> Fraction:
        """w_u = product of q along the path (D.1, eq. 12)."""
        w = ONE
        for i, a in enumerate(path):
            w *= self.rows[path[:i]][a]
        return w

    def local(self, path: Path) -> Fraction:
        """q(last token | parent): a wrong greedy key used by a negative control."""
        return self.rows[path[:-1]][path[-1]] if path else ONE

    def nodes(self) -> int:
        return sum(self.vocab**k for k in range(self.depth + 1))


@st.composite
def token_trees(draw: st.DrawFn, *, min_vocab: int = 1, min_depth: int = 1) -> TokenTree:
    """A draft token tree, V <= 3 and depth <= 4 (<= 3 when V = 3)."""
    vocab = draw(st.integers(min_vocab, 3))
    depth = draw(st.integers(min_depth, 3 if vocab > 2 else 4))
    rows: dict[Path, tuple[Fraction, ...]] = {}
    frontier: list[Path] = [()]
    for _ in range(depth):
        for s in frontier:
            rows[s] = normalised(draw(st.lists(WEIGHTS, min_size=vocab, max_size=vocab)))
        frontier = [s + (a,) for s in frontier for a in range(vocab)]
    return TokenTree(vocab, depth, rows)


ROOT: Path = ()  # the root of a token tree
BRUTE_MAX = 7  # largest size enumerated by brute force
DP_MAX = 16  # largest size checked against the knapsack optimum


def _d1(
    tally: Tally,
    root: N,
    children: Children[N],
    weight: Weight[N],
    sizes: range,
    *,
    key: Weight[N] | None = None,
    connected: Callable[[list[N]], bool] | None = None,
) -> None:
    for size in sizes:
        chosen = greedy_subtree(root, children, weight, size, key=key)
        if len(chosen) < size:
            return
        if connected is not None:
            tally.truth(connected(chosen), f"greedy set of size {size} is not a rooted subtree")
        got = sum((weight(u) for u in chosen), ZERO)
        if size <= BRUTE_MAX:
            best, count = brute_force_best(root, children, weight, size)
            tally.count("subtrees enumerated")
            tally.counts["subtrees enumerated"] += count - 1
        else:
            best = dp_best(root, children, weight, size)
            tally.count("knapsack sizes")
        if not tally.equal(got, best, f"greedy weight at N = {size} (best {float(best):.6g})"):
            return


def check_d1(budget: Budget) -> CheckResult:
    tally = Tally()
    for i, tree in enumerate(draw_cases(token_trees(), budget.n(150), budget.seed + 100)):
        tally.case(f"case {i}: V = {tree.vocab}, depth {tree.depth}, rows {dict(tree.rows)}"[:200])
        sizes = range(1, min(tree.nodes(), DP_MAX) + 1)
        _d1(tally, ROOT, tree.children, tree.weight, sizes, connected=is_rooted_subtree)
    for i, (tree, case_seed) in enumerate(
        draw_cases(st.tuples(token_trees(), SEEDS), budget.n(90), budget.seed + 101)
    ):
        tally.case(f"Alg. 1 case {i}: V = {tree.vocab}, depth {tree.depth}, seed {case_seed}")
        tally.count("Alg. 1 cases")
        positions = SamplingPositions(tree, case_seed)
        _d1(tally, positions.root, positions.children, positions.value, range(1, BRUTE_MAX + 1))
    return tally.result()


def control_d1_local(budget: Budget) -> CheckResult:
    """A greedy ranking candidates by q(token | parent) instead of the path product."""
    tally = Tally()
    for i, tree in enumerate(
        draw_cases(token_trees(min_vocab=2, min_depth=2), budget.n(120), budget.seed + 102)
    ):
        tally.case(f"case {i}: V = {tree.vocab}, depth {tree.depth}")
        _d1(
            tally,
            ROOT,
            tree.children,
            tree.weight,
            range(1, min(tree.nodes(), BRUTE_MAX) + 1),
            key=tree.local,
        )
    return tally.result()


def control_d1_monotone(budget: Budget) -> CheckResult:
    """Weights that can grow along a path (not products of probabilities)."""
    tally = Tally()
    for i, (tree, case_seed) in enumerate(
        draw_cases(st.tuples(token_trees(min_vocab=2, min_depth=2), SEEDS), budget.n(120), budget.seed + 103)
    ):
        rng = rng_for(case_seed)
        bumped = {s: Fraction(int(rng.integers(1, 8))) for s in _all_paths(tree)}
        tally.case(f"case {i}: V = {tree.vocab}, depth {tree.depth}, random positive weights")
        _d1(tally, ROOT, tree.children, lambda s: bumped[s], range(1, min(tree.nodes(), BRUTE_MAX) + 1))
    return tally.result()


def _all_paths(tree: TokenTree) -> list[Path]:
    out: list[Path] = [ROOT]
    frontier: list[Path] = [ROOT]
    for _ in range(tree.depth):
        frontier = [s + (a,) for s in frontier for a in range(tree.vocab)]
        out.extend(frontier)
    return out


# -- Algorithm 1's sampling positions ---------------------------------------------------

Position = tuple[Path, tuple[int, ...]]  # (node whose child is sampled, tokens already drawn there)


@dataclass(frozen=True)
class SamplingPositions:
    """The tree of Algorithm 1's sampling slots, with the draws fixed by a seed.

    A slot ``(u, drawn)`` samples a child of token node ``u`` from the
    residual ``R = q(. | u)`` without the tokens ``drawn``.  Its value is
    built by Alg. 1's updates from the root slot (value 1): ``v0 = v R[y]``
    for the first child slot of ``u + y``, ``v1 = v (1 - R[y])`` for the next
    sibling slot.  Slots deeper than ``max_depth`` in this tree are not built
    (a rooted subtree of N slots never reaches depth N).
    """

    tree: TokenTree  # the draft's rows
    seed: int  # fixes the uniform of every slot
    max_depth: int = BRUTE_MAX  # depth of the slot tree that is built
    _table: Mapping[Position, tuple[Fraction, tuple[Position, ...]]] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        table: dict[Position, tuple[Fraction, tuple[Position, ...]]] = {}
        stack: list[tuple[Position, Fraction, int]] = [(self.root, ONE, 0)]
        while stack:
            pos, v, d = stack.pop()
            kids: list[tuple[Position, Fraction]] = []
            y = self.draw(pos)
            if d < self.max_depth and y is not None:
                node, drawn = pos
                r_y = self.residual(pos)[y]
                if node + (y,) in self.tree.rows:  # the new token can have children
                    kids.append(((node + (y,), ()), v * r_y))
                if any(self.residual((node, drawn + (y,)))):
                    kids.append(((node, drawn + (y,)), v * (1 - r_y)))
            table[pos] = (v, tuple(k for k, _ in kids))
            stack.extend((k, kv, d + 1) for k, kv in kids)
        object.__setattr__(self, "_table", MappingProxyType(table))

    @property
    def root(self) -> Position:
        return ((), ())

    def residual(self, pos: Position) -> tuple[Fraction, ...]:
        """R: q(. | node) without the drawn tokens, renormalised (all zero when nothing is left)."""
        node, drawn = pos
        row = [ZERO if a in drawn else q for a, q in enumerate(self.tree.rows[node])]
        total = sum(row, ZERO)
        return tuple(x / total for x in row) if total else tuple(row)

    def draw(self, pos: Position) -> int | None:
        """The token this slot samples: inverse CDF of R at the slot's own uniform."""
        row = self.residual(pos)
        if not any(row):
            return None
        node, drawn = pos
        rng = np.random.default_rng([self.seed, len(node), *node, len(drawn), *drawn])
        u = Fraction(int(rng.integers(0, 2**20)), 2**20)
        cum = ZERO
        for a, q in enumerate(row):
            cum += q
            if u < cum:
                return a
        raise AssertionError("a probability row that sums to 1 was not exhausted")

    def value(self, pos: Position) -> Fraction:
        """Alg. 1's estimated value of the slot."""
        return self._table[pos][0]

    def children(self, pos: Position) -> tuple[Position, ...]:
        """The slots Alg. 1 pushes after popping ``pos``: first child, then next sibling."""
        return self._table[pos][1]


CHECKS: tuple[Check, ...] = (
    theorem(
        "D.1",
        "greedy max-weight growth is a rooted subtree (A) of maximum weight at every size N (B)",
        f"heap greedy vs brute force over all rooted subtrees (N <= {BRUTE_MAX}) and a knapsack DP "
        f"(N <= {DP_MAX}); weights = products of draft probs; also Alg. 1's sampling slots (exact rationals)",
        check_d1,
    ),
    control(
        "ctl D.1",
        "D.1",
        "a greedy ranking by q(token | parent) instead of the path product",
        control_d1_local,
    ),
    control(
        "ctl D.1b",
        "D.1",
        "weights that grow along a path",
        control_d1_monotone,
        label="detected (monotone weights needed)",
    ),
)
