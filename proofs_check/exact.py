"""Exact rational tree distributions, the sub-distribution order and prefix kernels.

An implementation of the TMC paper's Appendix A objects in
``fractions.Fraction`` arithmetic, written independently of :mod:`tmc` so
that the theorem checks compare two implementations and need no tolerance:

* Def A.1-A.2  paths and finite tree spaces: :class:`Shape` (a table of
  children; also usable as the children function of a :class:`tmc.tree.TreeSpace`);
* Def A.3-A.7  tree distributions stored as point masses, path probability
  ``P(s)``, child and termination probabilities, support, ``P|s``:
  :class:`ExactTree`;
* Def A.11  the sub-distribution relation, as a *defect* that is 0 exactly
  when ``P1 <= P2`` (:func:`sub_defect`), and Thm A.16's product form as a
  second defect (:func:`product_defect`);
* Defs A.23-A.26  prefix kernels (prefix -> exact output law), walks,
  composition and self-composition, and the limit of a self-composition by
  absorption (:func:`limit_kernel`, used for Thm A.31-A.32).

Distributions here are plain tree distributions ``P``; in the speculative
checks ``P`` is the target ``p`` and ``P_ref`` the draft ``q``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from types import MappingProxyType

from tmc.tree import TreeDistribution, TreeSpace

Path = tuple[int, ...]
ZERO = Fraction(0)
ONE = Fraction(1)


def is_prefix(s: Path, t: Path) -> bool:
    """``s <= t`` in the order of Def A.1."""
    return len(s) <= len(t) and t[: len(s)] == s


def comparable(s: Path, t: Path) -> bool:
    """True when ``s <= t`` or ``t <= s``."""
    return is_prefix(s, t) or is_prefix(t, s)


def common_prefix_len(s: Path, t: Path) -> int:
    """``len(cp(s, t))`` (Def B.2)."""
    n = 0
    for a, b in zip(s, t):
        if a != b:
            break
        n += 1
    return n


# -- tree spaces ---------------------------------------------------------------


@dataclass(frozen=True)
class Shape:
    """A finite tree space ``(S, Sigma)`` (Def A.2) given by its table of children.

    Nodes that are not keys of the table are leaves.  Shapes compare by
    value, so ``TreeSpace(shape)`` spaces built from equal shapes are equal.
    """

    table: tuple[tuple[Path, tuple[int, ...]], ...]  # (node, its children) for every inner node
    _kids: Mapping[Path, tuple[int, ...]] = field(init=False, repr=False, compare=False)
    _nodes: tuple[Path, ...] = field(init=False, repr=False, compare=False)
    _node_set: frozenset[Path] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        kids = {tuple(node): tuple(children) for node, children in self.table}
        for node, children in kids.items():
            if not children or len(set(children)) != len(children):
                raise ValueError(f"table: node {node} needs distinct children, got {children}")
        nodes: list[Path] = []
        frontier: list[Path] = [()]
        while frontier:
            nodes.extend(frontier)
            frontier = [s + (a,) for s in frontier for a in kids.get(s, ())]
        unreachable = set(kids) - set(nodes)
        if unreachable:
            raise ValueError(f"table: nodes {sorted(unreachable)} are not reachable from the root")
        object.__setattr__(self, "_kids", MappingProxyType(kids))
        object.__setattr__(self, "_nodes", tuple(nodes))
        object.__setattr__(self, "_node_set", frozenset(nodes))

    @classmethod
    def full(cls, vocab: int, depth: int) -> Shape:
        """The complete ``vocab``-ary tree of the given depth."""
        if vocab < 1 or depth < 0:
            raise ValueError(f"need vocab >= 1 and depth >= 0, got {vocab}, {depth}")
        table: list[tuple[Path, tuple[int, ...]]] = []
        frontier: list[Path] = [()]
        for _ in range(depth):
            table.extend((s, tuple(range(vocab))) for s in frontier)
            frontier = [s + (a,) for s in frontier for a in range(vocab)]
        return cls(tuple(table))

    @classmethod
    def from_children(cls, kids: Mapping[Path, Sequence[int]]) -> Shape:
        """Shape from ``{node: children}`` (nodes with no children may be omitted)."""
        return cls(tuple(sorted((tuple(s), tuple(c)) for s, c in kids.items() if c)))

    def __call__(self, path: Path) -> tuple[int, ...]:
        return self._kids.get(tuple(path), ())

    def children(self, path: Path) -> tuple[int, ...]:
        """Sigma(path)."""
        return self._kids.get(path, ())

    def is_leaf(self, path: Path) -> bool:
        """True when Sigma(path) is empty."""
        return path not in self._kids

    def nodes(self) -> tuple[Path, ...]:
        """Every node, breadth first."""
        return self._nodes

    def has(self, path: Path) -> bool:
        """True when ``path`` is a node (a path of S)."""
        return path in self._node_set

    def inner(self) -> tuple[Path, ...]:
        """Every node with children, breadth first."""
        return tuple(s for s in self._nodes if s in self._kids)

    def depth(self) -> int:
        """Length of the longest path."""
        return max(len(s) for s in self._nodes)

    def subtree(self, prefix: Path) -> tuple[Path, ...]:
        """Every node ``>= prefix``."""
        return tuple(s for s in self._nodes if is_prefix(prefix, s))

    def space(self) -> TreeSpace:
        """This shape as a :class:`tmc.tree.TreeSpace`."""
        return TreeSpace(self)


# -- tree distributions --------------------------------------------------------

Row = Sequence[Fraction]  # (P(a_1|s), ..., P(a_k|s), P(tau|s)) in children order


@dataclass(frozen=True, eq=False)
class ExactTree:
    """A tree distribution on a :class:`Shape` with exact point masses (Def A.3)."""

    shape: Shape  # the tree space
    masses: Mapping[Path, Fraction]  # point masses P^({s}) > 0, summing to exactly 1
    _probs: Mapping[Path, Fraction] = field(init=False, repr=False)  # P(s) for s in supp

    def __post_init__(self) -> None:
        clean: dict[Path, Fraction] = {}
        for s, m in self.masses.items():
            s, m = tuple(s), Fraction(m)
            if m < 0 or not self.shape.has(s):
                raise ValueError(f"masses[{s}] = {m} must be >= 0 on a node of the shape")
            if m:
                clean[s] = m
        if sum(clean.values(), ZERO) != 1:
            raise ValueError(f"masses sum to {sum(clean.values(), ZERO)}, not exactly 1")
        probs: dict[Path, Fraction] = {}
        for s, m in clean.items():
            for i in range(len(s) + 1):
                probs[s[:i]] = probs.get(s[:i], ZERO) + m
        object.__setattr__(self, "masses", MappingProxyType(clean))
        object.__setattr__(self, "_probs", MappingProxyType(probs))

    @classmethod
    def from_rows(cls, shape: Shape, rows: Mapping[Path, Row]) -> ExactTree:
        """Distribution with child conditionals ``rows[s]`` at every inner node reached.

        Leaves keep all the mass that reaches them.
        """
        masses: dict[Path, Fraction] = {}
        stack: list[tuple[Path, Fraction]] = [((), ONE)]
        while stack:
            node, weight = stack.pop()
            kids = shape.children(node)
            if not kids:
                masses[node] = masses.get(node, ZERO) + weight
                continue
            row = [Fraction(x) for x in rows[node]]
            if len(row) != len(kids) + 1 or min(row) < 0 or sum(row) != 1:
                raise ValueError(f"rows[{node}] must be {len(kids) + 1} probabilities summing to 1")
            if row[-1]:
                masses[node] = masses.get(node, ZERO) + weight * row[-1]
            stack.extend((node + (a,), weight * p) for a, p in zip(kids, row) if p)
        return cls(shape, masses)

    def _node(self, s: Sequence[int]) -> Path:
        path = tuple(int(t) for t in s)
        if not self.shape.has(path):
            raise ValueError(f"path {path} is not a node of the shape")
        return path

    def prob(self, s: Sequence[int]) -> Fraction:
        """P(s) (Def A.4)."""
        return self._probs.get(self._node(s), ZERO)

    def mass(self, s: Sequence[int]) -> Fraction:
        """P^({s})."""
        return self.masses.get(self._node(s), ZERO)

    def _support_prob(self, s: Path) -> Fraction:
        prob = self.prob(s)
        if prob == 0:
            raise ValueError(f"{s} is outside the support; its conditionals are undefined")
        return prob

    def cond(self, s: Path) -> dict[int, Fraction]:
        """``{a: P(a|s)}`` for every child a of s (Def A.5; s in the support)."""
        prob = self._support_prob(s)
        return {a: self._probs.get(s + (a,), ZERO) / prob for a in self.shape.children(s)}

    def term(self, s: Path) -> Fraction:
        """P(tau|s) (Def A.5; s in the support)."""
        return self.masses.get(s, ZERO) / self._support_prob(s)

    def support(self) -> tuple[Path, ...]:
        """supp(P), breadth first."""
        return tuple(s for s in self.shape.nodes() if s in self._probs)

    def condition(self, s: Path) -> ExactTree:
        """P|s (Def A.7)."""
        prob = self._support_prob(s)
        return ExactTree(self.shape, {t: m / prob for t, m in self.masses.items() if is_prefix(s, t)})

    def event(self, nodes: Iterable[Path]) -> Fraction:
        """P^(U) for a set of nodes U."""
        return sum((self.masses.get(s, ZERO) for s in set(nodes)), ZERO)

    def is_leaf_only(self) -> bool:
        """Def A.20: no point mass on a node with children."""
        return all(self.shape.is_leaf(s) for s in self.masses)

    def is_pseudo_leaf_only(self) -> bool:
        """Def B.1: P(tau|s) in {0, 1} on the support."""
        return all(self.term(s) in (ZERO, ONE) for s in self.support())

    def expected_length(self) -> Fraction:
        """E[len(s)] under P^."""
        return sum((len(s) * m for s, m in self.masses.items()), ZERO)

    def same_as(self, other: ExactTree) -> bool:
        """Equal point masses (hence equal on every event)."""
        return dict(self.masses) == dict(other.masses)

    def to_tmc(self) -> TreeDistribution:
        """The same distribution as a float :class:`tmc.tree.TreeDistribution`."""
        return TreeDistribution.from_point_masses(
            self.shape.space(), {s: float(m) for s, m in self.masses.items()}
        )


def tv(p1: ExactTree, p2: ExactTree) -> Fraction:
    """Total variation max_U |P1^(U) - P2^(U)| = half the L1 distance of point masses."""
    keys = set(p1.masses) | set(p2.masses)
    return sum((abs(p1.masses.get(s, ZERO) - p2.masses.get(s, ZERO)) for s in keys), ZERO) / 2


# -- the sub-distribution order ------------------------------------------------


def node_sub_defect(r1: Mapping[int, Fraction], r2: Mapping[int, Fraction]) -> Fraction:
    """0 exactly when ``r1 = c r2`` for some c in [0, 1]; else a positive size of failure.

    Only ``c = sum r1 / sum r2`` can work (sum both sides), so the defect is
    ``max(max_a |r1(a) - c r2(a)|, c - 1)`` (``sum r1`` when ``r2`` is all 0).
    """
    s1, s2 = sum(r1.values(), ZERO), sum(r2.values(), ZERO)
    if s2 == 0:
        return s1
    c = s1 / s2
    spread = max((abs(r1.get(a, ZERO) - c * r2.get(a, ZERO)) for a in set(r1) | set(r2)), default=ZERO)
    return max(spread, c - 1, ZERO)


def sub_defect(p1: ExactTree, p2: ExactTree) -> Fraction:
    """Def A.11: 0 exactly when ``P1 <= P2``; else the worst node defect."""
    if p1.shape != p2.shape:
        raise ValueError("p1 and p2 must live on the same shape")
    worst = ZERO
    for s in p1.support():
        if p2.prob(s) and not p1.shape.is_leaf(s):
            worst = max(worst, node_sub_defect(p1.cond(s), p2.cond(s)))
    return worst


def product_defect(p1: ExactTree, p2: ExactTree, *, termination: bool = True) -> Fraction:
    """Thm A.16's condition: 0 exactly when it holds.

    Clause 1, over every node s and children a, b:
    ``P1(s+a) P2(s+b) = P1(s+b) P2(s+a)``; clause 2 (``termination``), on
    common support: ``P1(tau|s) >= P2(tau|s)``.  Uses path probabilities and
    point masses only.
    """
    if p1.shape != p2.shape:
        raise ValueError("p1 and p2 must live on the same shape")
    worst = ZERO
    for s in p1.shape.inner():
        kids = p1.shape.children(s)
        for a in kids:
            for b in kids:
                gap = p1.prob(s + (a,)) * p2.prob(s + (b,)) - p1.prob(s + (b,)) * p2.prob(s + (a,))
                worst = max(worst, abs(gap))
        if termination and p1.prob(s) and p2.prob(s):
            worst = max(worst, p2.term(s) - p1.term(s))
    return worst


# -- prefix kernels ------------------------------------------------------------

#: Exact prefix kernel (Def A.23): prefix -> {output path: probability}.
Kernel = Callable[[Path], Mapping[Path, Fraction]]
#: Walk rule: (prefix, node) -> {child: probability of stepping there}; stop otherwise.
StepRule = Callable[[Path, Path], Mapping[int, Fraction]]


def memoised(kernel: Kernel) -> Kernel:
    """``kernel`` with its laws cached per prefix (kernels are pure)."""
    cache: dict[Path, Mapping[Path, Fraction]] = {}

    def cached(prefix: Path) -> Mapping[Path, Fraction]:
        if prefix not in cache:
            cache[prefix] = MappingProxyType(dict(kernel(prefix)))
        return cache[prefix]

    return cached


def walk_kernel(rule: StepRule) -> Kernel:
    """Exact output law of the walk that, at each node, steps by ``rule`` or stops."""

    def kernel(prefix: Path) -> dict[Path, Fraction]:
        law: dict[Path, Fraction] = {}
        stack: list[tuple[Path, Fraction]] = [(prefix, ONE)]
        while stack:
            node, weight = stack.pop()
            row = {a: Fraction(p) for a, p in rule(prefix, node).items() if p}
            stop = 1 - sum(row.values(), ZERO)
            if stop < 0:
                raise ValueError(f"rule({prefix}, {node}) sums to more than 1")
            if stop:
                law[node] = law.get(node, ZERO) + weight * stop
            stack.extend((node + (a,), weight * p) for a, p in row.items())
        return law

    return memoised(kernel)


def push(kernel: Kernel, law: Mapping[Path, Fraction]) -> dict[Path, Fraction]:
    """Law of ``kernel(t)`` for t drawn from ``law``."""
    out: dict[Path, Fraction] = {}
    for mid, weight in law.items():
        for path, prob in kernel(mid).items():
            out[path] = out.get(path, ZERO) + weight * prob
    return {s: m for s, m in out.items() if m}


def compose(outer: Kernel, inner: Kernel) -> Kernel:
    """``outer o inner`` (Def A.26): run ``inner`` from the prefix, then ``outer``."""
    return memoised(lambda prefix: push(outer, inner(prefix)))


def identity_kernel(prefix: Path) -> Mapping[Path, Fraction]:
    """``P^0``: return the prefix unchanged (Def A.26, n = 0)."""
    return {prefix: ONE}


def power(kernel: Kernel, n: int) -> Kernel:
    """``P_s^n``: ``kernel`` composed with itself ``n`` times."""
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")

    def composed(prefix: Path) -> dict[Path, Fraction]:
        law: dict[Path, Fraction] = {prefix: ONE}
        for _ in range(n):
            law = push(kernel, law)
        return law

    return memoised(composed)


def limit_kernel(kernel: Kernel) -> Kernel:
    """``lim_n P_s^n`` on a finite shape, by absorption.

    Outputs extend the input, so repeated application only moves down the
    tree: from t the chain stays with probability ``k = K(t)({t})`` and
    otherwise jumps to a strictly longer path, so the absorbed law is
    ``L(t) = sum_{u != t} K(t)(u) L(u) / (1 - k)``, or the point mass at t
    when ``k = 1``.
    """

    def limit(prefix: Path) -> dict[Path, Fraction]:
        law = kernel(prefix)
        stay = law.get(prefix, ZERO)
        if stay == 1:
            return {prefix: ONE}
        out: dict[Path, Fraction] = {}
        for mid, weight in law.items():
            if mid == prefix:
                continue
            if not is_prefix(prefix, mid):
                raise ValueError(f"kernel({prefix}) outputs {mid}, which does not extend it")
            for path, prob in cached(mid).items():
                out[path] = out.get(path, ZERO) + weight * prob / (1 - stay)
        return out

    cached = memoised(limit)
    return cached


def induced(kernel: Kernel, shape: Shape, prefix: Path) -> ExactTree:
    """The tree distribution ``P_s(.; prefix)`` of the kernel's output (Def A.23)."""
    return ExactTree(shape, kernel(prefix))
