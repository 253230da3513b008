"""Tree spaces and tree distributions (TMC paper, Appendix A.1-A.3 and B.1).

In the rest of the toolkit ``p`` is the target and ``q`` the draft (the
paper's ``P`` and ``P_ref``); this module is agnostic and calls any tree
distribution ``P``.

Implements:

* Def A.1  paths: ``Path = tuple[int, ...]``; ``s <= t`` means ``t[:len(s)] == s``.
* Def A.2  tree space ``(S, Sigma)``: :class:`TreeSpace`, a children function
  plus an optional depth cut that turns an infinite (LLM-like) tree into a
  finite one.
* Def A.3-A.5  tree distribution, path probability ``P(s)``, point mass
  ``P^({s})``, support, child probability ``P(a|s)`` and termination
  ``P(tau|s)``: :class:`TreeDistribution`.  By Thm A.6 a distribution is fixed
  by its path probabilities, so one is stored as its (finite) table of point
  masses and everything else is derived from it.
* Def A.7  conditioning on a prefix: :meth:`TreeDistribution.condition`.
* Def A.17 cut-off tail probability ``P^[len>d]``:
  :meth:`TreeDistribution.tail_mass`, and :func:`tail_mass_beyond` for the
  mass an infinite tree sends past a depth cut.
* Def A.20 leaf-only and Def B.1 pseudo leaf-only predicates.

Infinite trees.  Building a distribution from child conditionals on a space
with ``max_depth = d`` stops the walk at depth ``d``: a node at depth ``d`` is
a leaf of the truncated space, so it keeps all the mass that reaches it,
including the mass the untruncated distribution would have sent deeper.  A
leaf-only distribution therefore stays leaf-only after truncation, and
:func:`tail_mass_beyond` reports how much mass was folded back (the
truncation error, at most ``P^[len>d]`` in total variation).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from tmc.validate import check_int, real_scalar

#: A path sigma = (sigma_1, ..., sigma_n) of token ids (Def A.1); () is the root.
Path = tuple[int, ...]
#: Sigma: the allowed child tokens of a node (finite).
ChildrenFn = Callable[[Path], Sequence[int]]
#: Child conditionals: node -> {child: P(child | node)}; omitted children have
#: probability 0 and the termination probability is 1 - sum.
Conditionals = Callable[[Path], Mapping[int, float]]

#: Largest allowed excess of a probability total above 1 (conditionals of one
#: node, or point masses of a whole distribution).
PROB_TOL = 1e-9

_EPS = float(2.0**-52)


def is_prefix(prefix: Path, path: Path) -> bool:
    """Return True when ``prefix <= path`` in the order of Def A.1."""
    return len(prefix) <= len(path) and path[: len(prefix)] == prefix


def _as_path(name: str, path: Sequence[int]) -> Path:
    """``path`` as a tuple of Python ints, or ValueError naming ``name`` (``0.9``, ``True`` and text are not
    tokens: :func:`tmc.validate.check_int`)."""
    if isinstance(path, str | bytes):
        raise ValueError(f"{name} must be a sequence of int tokens, got {path!r}")
    try:
        return tuple(check_int(f"{name}[{i}]", t) for i, t in enumerate(path))
    except TypeError as exc:
        raise ValueError(f"{name} must be a sequence of int tokens, got {path!r}") from exc


@dataclass(frozen=True)
class _FullChildren:
    """Children function of a complete tree: every token in ``[0, vocab)``."""

    vocab: int  # number of tokens V; every node has children 0..V-1

    def __call__(self, path: Path) -> Sequence[int]:
        return range(self.vocab)


@dataclass(frozen=True)
class TreeSpace:
    """A tree space ``(S, Sigma)`` (Def A.2) with an optional depth cut.

    Two spaces are equal when their children functions compare equal and they
    share ``max_depth``; :meth:`full` builds value-comparable spaces.
    """

    children_fn: ChildrenFn  # Sigma(sigma): allowed child tokens of a node, a finite sequence
    max_depth: int | None = None  # nodes of this length have no children; None: no cut

    def __post_init__(self) -> None:
        if not callable(self.children_fn):
            raise ValueError(f"children_fn must be a function of a path, got {type(self.children_fn).__name__}")
        if self.max_depth is not None:  # 1.5 would cut at depth 2, silently
            object.__setattr__(self, "max_depth", check_int("max_depth", self.max_depth, minimum=0))

    @classmethod
    def full(cls, vocab: int, depth: int | None) -> TreeSpace:
        """Complete ``vocab``-ary tree cut at ``depth`` (None: infinite)."""
        return cls(_FullChildren(check_int("vocab", vocab, minimum=1)), depth)

    def truncated(self, depth: int) -> TreeSpace:
        """The same space cut at ``min(depth, max_depth)``."""
        depth = check_int("depth", depth, minimum=0)
        cut = depth if self.max_depth is None else min(depth, self.max_depth)
        return TreeSpace(self.children_fn, cut)

    def children(self, path: Path) -> tuple[int, ...]:
        """Sigma(path): the child tokens of ``path`` (empty at the depth cut)."""
        if self.max_depth is not None and len(path) >= self.max_depth:
            return ()
        return tuple(int(a) for a in self.children_fn(path))

    def is_leaf(self, path: Path) -> bool:
        """True when ``Sigma(path)`` is empty."""
        return not self.children(path)

    def contains(self, path: Path) -> bool:
        """True when ``path`` is in S: every token is a child of its prefix."""
        return all(path[i] in self.children(path[:i]) for i in range(len(path)))

    def paths(self, max_len: int | None = None) -> Iterator[Path]:
        """Every path of S of length <= ``max_len``, in BFS order.

        Lazy, so an infinite space may be iterated partially; to exhaust an
        infinite space give ``max_len`` (or build it with ``max_depth``).
        """
        frontier: list[Path] = [()]
        while frontier:
            yield from frontier
            if max_len is not None and len(frontier[0]) >= max_len:
                return
            frontier = [s + (a,) for s in frontier for a in self.children(s)]


def _rounding_slack(n_children: int) -> float:
    # Conditionals normalised in float64 sum to 1 only within a few ulps per
    # term; a termination probability that small is rounding, not mass.
    return 8.0 * _EPS * max(1, n_children)


def _checked_row(cond: Conditionals, node: Path, kids: tuple[int, ...]) -> dict[int, float]:
    """Validated nonzero child conditionals of ``node``; sum <= 1 guaranteed."""
    allowed = set(kids)
    row: dict[int, float] = {}
    got = cond(node)
    if not isinstance(got, Mapping):
        raise ValueError(f"cond({node}) must return a mapping {{child: probability}}, got {type(got).__name__}")
    for key, v in got.items():
        a = check_int(f"cond({node}) key", key)  # 1.7 is no child (int() read it as 1)
        if a not in allowed:
            raise ValueError(f"cond({node}) gives mass to child {a}, not in Sigma({node}) = {kids}")
        p = real_scalar(f"cond({node})[{a}]", v)  # text and complex are not probabilities
        if not (0.0 <= p <= 1.0 + PROB_TOL):  # also rejects NaN
            raise ValueError(f"cond({node})[{a}] = {p!r} is not a probability in [0, 1]")
        if p > 0.0:
            row[a] = p
    total = math.fsum(row.values())
    if total > 1.0 + PROB_TOL:
        raise ValueError(
            f"cond({node}) sums to {total!r} > 1 (tolerance {PROB_TOL}): "
            "the termination probability 1 - sum would be negative"
        )
    if total > 1.0:
        row = {a: p / total for a, p in row.items()}
    return row


def _termination(row: Mapping[int, float]) -> float:
    """P(tau|node) = 1 - sum(row), with rounding residue snapped to 0."""
    term = 1.0 - math.fsum(row.values())
    return 0.0 if term <= _rounding_slack(len(row)) else term


def _prefix_sums(masses: Mapping[Path, float]) -> dict[Path, float]:
    """Path probabilities P(s) = sum of point masses at or below s (Def A.4)."""
    probs: dict[Path, float] = {}
    for path, m in masses.items():
        for i in range(len(path) + 1):
            probs[path[:i]] = probs.get(path[:i], 0.0) + m
    return probs


@dataclass(frozen=True, eq=False)
class TreeDistribution:
    """A tree distribution (Def A.3) with finitely many point masses.

    Built with :meth:`from_conditionals` or :meth:`from_point_masses` (or the
    constructor, which validates like :meth:`from_point_masses`).  Compare two
    distributions with :func:`tmc.order.total_variation`, not ``==``.

    Precision: path probabilities are float64 sums of point masses, so the
    derived conditionals ``P(a|s)`` are accurate to a few ulps while ``P(s)``
    is a normal float; below ~1e-308 (subnormal) relative precision is lost.
    """

    space: TreeSpace  # the tree space (S, Sigma) the distribution lives on
    masses: Mapping[Path, float]  # point masses P^({s}) > 0 (read-only; zeros dropped)
    _path_probs: Mapping[Path, float] = field(init=False, repr=False)  # P(s) for s in supp

    def __post_init__(self) -> None:
        clean = _checked_masses(self.space, self.masses)
        object.__setattr__(self, "masses", MappingProxyType(clean))
        object.__setattr__(self, "_path_probs", MappingProxyType(_prefix_sums(clean)))

    # -- construction ------------------------------------------------------

    @classmethod
    def from_point_masses(
        cls, space: TreeSpace, masses: Mapping[Path, float]
    ) -> TreeDistribution:
        """Distribution with the given point masses ``P^({s})`` (sum 1 within PROB_TOL)."""
        return cls(space, masses)

    @classmethod
    def from_conditionals(
        cls, space: TreeSpace, cond: Conditionals, *, max_nodes: int = 1_000_000
    ) -> TreeDistribution:
        """Distribution given by child conditionals ``cond(s) = {a: P(a|s)}`` (Thm A.6).

        ``cond`` is called only at nodes with positive probability and with
        children; termination is ``1 - sum`` (>= -PROB_TOL).  Nodes at the
        space's depth cut are leaves and keep all mass reaching them (module
        docstring).  ``max_nodes`` bounds the walk so a space whose support is
        infinite fails with ValueError instead of running forever.
        """
        masses: dict[Path, float] = {}
        stack: list[tuple[Path, float]] = [((), 1.0)]
        visited = 0
        while stack:
            node, weight = stack.pop()
            visited += 1
            if visited > max_nodes:
                raise ValueError(
                    f"space: more than max_nodes={max_nodes} nodes with positive probability; "
                    "give the space a max_depth"
                )
            kids = space.children(node)
            row = _checked_row(cond, node, kids) if kids else {}
            term = _termination(row)
            if term > 0.0:
                masses[node] = weight * term
            stack.extend((node + (a,), weight * p) for a, p in row.items() if weight * p > 0.0)
        return cls(space, masses)

    # -- Def A.4 / A.5 -----------------------------------------------------

    def path_prob(self, path: Sequence[int]) -> float:
        """P(s) = P^(S_{>=s}): probability that a draw starts with ``path``."""
        s = _as_path("path", path)
        prob = self._path_probs.get(s)
        if prob is not None:
            return prob
        if not self.space.contains(s):
            raise ValueError(f"path {s} is not in the tree space")
        return 0.0

    def point_mass(self, path: Sequence[int]) -> float:
        """P^({s}): probability that a draw is exactly ``path``."""
        s = _as_path("path", path)
        if s not in self.masses and not self.space.contains(s):
            raise ValueError(f"path {s} is not in the tree space")
        return self.masses.get(s, 0.0)

    def _support_node(self, path: Sequence[int]) -> tuple[Path, float]:
        s = _as_path("path", path)
        prob = self.path_prob(s)
        if prob == 0.0:
            raise ValueError(
                f"path {s} is outside the support: P(path) = 0, so P(.|path) is undefined"
            )
        return s, prob

    def child_prob(self, child: int, path: Sequence[int]) -> float:
        """P(a|s) = P(s + a) / P(s) (Def A.5).

        Raises ValueError when ``path`` is outside the support (the
        conditional is undefined there) or ``child`` is not in Sigma(path).
        """
        s, prob = self._support_node(path)
        a = int(child)
        if a not in self.space.children(s):
            raise ValueError(f"child {a} is not in Sigma({s}) = {self.space.children(s)}")
        return self._path_probs.get(s + (a,), 0.0) / prob

    def child_probs(self, path: Sequence[int]) -> dict[int, float]:
        """``{a: P(a|s)}`` for the children with P(a|s) > 0 (ValueError outside support)."""
        s, prob = self._support_node(path)
        out: dict[int, float] = {}
        for a in self.space.children(s):
            pa = self._path_probs.get(s + (a,), 0.0)
            if pa > 0.0:
                out[a] = pa / prob
        return out

    def termination(self, path: Sequence[int]) -> float:
        """P(tau|s) = P^({s}) / P(s) (Def A.5; ValueError outside support)."""
        s, prob = self._support_node(path)
        return self.masses.get(s, 0.0) / prob

    def support(self) -> tuple[Path, ...]:
        """supp(P) = {s : P(s) > 0}, shortest paths first then lexicographic."""
        return tuple(sorted(self._path_probs, key=lambda s: (len(s), s)))

    def point_masses(self) -> dict[Path, float]:
        """A copy of the nonzero point masses ``{s: P^({s})}``."""
        return dict(self.masses)

    # -- Def A.7 -----------------------------------------------------------

    def condition(self, prefix: Sequence[int]) -> TreeDistribution:
        """P|s: the distribution conditioned on starting with ``prefix`` (Def A.7)."""
        s = _as_path("prefix", prefix)
        prob = self._path_probs.get(s, 0.0)
        if prob == 0.0:
            raise ValueError(f"prefix {s} is outside the support (P(prefix) = 0); cannot condition")
        kept = {t: m / prob for t, m in self.masses.items() if is_prefix(s, t)}
        return TreeDistribution(self.space, kept)

    # -- Def A.17 / A.20 / B.1 ---------------------------------------------

    def tail_mass(self, depth: int) -> float:
        """P^[len>d]: total point mass on paths longer than ``depth`` (Def A.17)."""
        if depth < 0:
            raise ValueError(f"depth must be >= 0, got {depth}")
        return math.fsum(m for s, m in self.masses.items() if len(s) > depth)

    def is_leaf_only(self, tol: float = 1e-12) -> bool:
        """Def A.20: P(tau|s) <= tol at every support node that has children."""
        return all(
            self.space.is_leaf(s) or m / self._path_probs[s] <= tol for s, m in self.masses.items()
        )

    def is_pseudo_leaf_only(self, tol: float = 1e-12) -> bool:
        """Def B.1: P(tau|s) is 0 or 1 (within ``tol``) at every support node."""
        for s, prob in self._path_probs.items():
            term = self.masses.get(s, 0.0) / prob
            if tol < term < 1.0 - tol:
                return False
        return True

    def expected_length(self) -> float:
        """E[len(s)] under P^."""
        return math.fsum(len(s) * m for s, m in self.masses.items())


def _checked_masses(space: TreeSpace, masses: Mapping[Path, float]) -> dict[Path, float]:
    """Validated nonzero point masses keyed by tuple-of-int paths.

    Keys that name the same path (``(0, 1)`` and ``range(2)``) add their masses.
    """
    clean: dict[Path, float] = {}
    for key, value in masses.items():
        s = _as_path("masses key", key)
        m = float(value)
        if not (0.0 <= m <= 1.0 + PROB_TOL):  # also rejects NaN
            raise ValueError(f"masses[{s}] = {m!r} is not a probability in [0, 1]")
        if m == 0.0:
            continue
        if not space.contains(s):
            raise ValueError(f"masses has path {s}, which is not in the tree space")
        clean[s] = clean.get(s, 0.0) + m
    total = math.fsum(clean.values())
    if abs(total - 1.0) > PROB_TOL:
        raise ValueError(f"masses sum to {total!r}, not 1 (tolerance {PROB_TOL})")
    return clean


def tail_mass_beyond(space: TreeSpace, cond: Conditionals, depth: int) -> float:
    """Mass the distribution ``cond`` on ``space`` puts on paths longer than ``depth``.

    This is ``P^[len>depth]`` of the untruncated distribution (Def A.17): the
    mass that :meth:`TreeDistribution.from_conditionals` on
    ``space.truncated(depth)`` folds into the depth-``depth`` leaves, i.e.
    the truncation error in total variation.  Only the tree up to ``depth``
    is enumerated: each depth-``depth`` node contributes ``P(s) (1 - P(tau|s))``.
    """
    cut = TreeDistribution.from_conditionals(space.truncated(depth), cond)
    beyond: list[float] = []
    for s, mass in cut.masses.items():
        kids = space.children(s) if len(s) == depth else ()
        if kids:
            beyond.append(mass * (1.0 - _termination(_checked_row(cond, s, kids))))
    return math.fsum(beyond)
