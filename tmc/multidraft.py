"""Draft trees and recursive multi-draft residual verification (DESIGN.md §4).

Notation: ``p`` is the target, ``q`` the draft.  A draft tree hangs below the
current prefix (the *root*, node index ``-1``); non-root nodes are numbered
``0..N-1`` in a topological order (a parent before its children) and siblings
are verified in index order.  Every node records how it was drawn:

* ``iid`` — i.i.d. from its parent's draft row ``q`` (SpecInfer);
* ``swor`` — without replacement: from ``q`` with the earlier siblings
  removed and renormalised (Sequoia, DySpec Alg. 3); the first child from
  ``q`` as stored (nothing removed, so no renormalising rounding);
* ``topk`` — deterministically (top-k or greedy): a point mass.

Verification at an accepted node starts from the residual target ``r = p``
and walks the children in order: child ``x_i`` drawn from ``q_i`` is
accepted with probability ``min(1, r(x_i) / q_i(x_i))``; on rejection
``r ← norm((r − q_i)_+)`` (:mod:`tmc.residual`).  For a point mass this is "accept with
probability ``r(x_i)``, else remove ``x_i`` from ``r``".  If every child is
rejected one token is drawn from ``r``; at an accepted leaf a bonus token is
drawn from ``p``.  Because the proposal law comes from each node's recorded
draw kind, a tree cannot be verified with the wrong rule.

Arrays: ``p_rows`` has shape ``(N + 1, V)`` — row 0 is ``p(· | prefix)`` at
the root, row ``i + 1`` is ``p`` after node ``i``'s path.  Kernels have the
same shape and follow the one indexing convention stated in the :mod:`tmc`
package docstring.  A width-1 tree is a chain and its kernel is
:func:`tmc.sps_kernel`'s.  The residual update is :func:`tmc.residual.residual`.

Noise layout of the sampler: ``N + 1`` uniforms; ``u[i]`` is the accept test
of node ``i`` (each node is tested at most once) and ``u[N]`` draws the final
corrected or bonus token.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from types import MappingProxyType
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from tmc.noise import categorical, check_uniforms
from tmc.residual import acceptance_at, residual
from tmc.validate import as_real_array_with_dtype, as_rng, check_int, check_prob_rows

Path = tuple[int, ...]
FloatArray = NDArray[np.float64]
ROOT = -1


class Draw(str, Enum):
    """How a draft node was drawn from its parent's draft row."""

    IID = "iid"
    SWOR = "swor"
    TOPK = "topk"

    @classmethod
    def parse(cls, value: object, name: str = "draw") -> Draw:
        """``value`` (a ``Draw`` or its string) as a ``Draw``; ``ValueError`` naming the kinds."""
        if isinstance(value, Draw):
            return value
        try:
            return cls(value)
        except ValueError:
            kinds = ", ".join(repr(d.value) for d in cls)
            raise ValueError(f"{name} must be one of {kinds}, got {value!r}") from None


#: Every draw kind, in a fixed order (reports and searches iterate over it).
ALL_DRAWS: tuple[Draw, ...] = (Draw.IID, Draw.SWOR, Draw.TOPK)


@dataclass(frozen=True, eq=False)  # == and hash below: the generated ones compared numpy rows (and raised)
class DraftTree:
    """A token tree proposed by the draft model, with how each node was drawn.

    Construction validates and normalises every field (DESIGN.md §3): a
    ``DraftTree`` that exists is well formed.  ``parents``, ``tokens`` and
    ``vocab`` must be integers (numpy integers and ``1.0`` are fine, ``1.7`` is
    not), ``draws`` one :class:`Draw` (or its string) per node, ``q_rows`` real
    probability rows.  The children of every node are computed once, so
    verification is linear in the number of nodes.
    """

    parents: tuple[int, ...]  # parent index of each node; -1 = the root (current prefix)
    tokens: tuple[int, ...]  # token id of each node
    draws: tuple[Draw, ...]  # draw kind of each node
    q_rows: Mapping[int, FloatArray]  # draft row q(.|node) of every node with sampled children (-1 = root)
    vocab: int  # vocabulary size V
    _kids: tuple[tuple[int, ...], ...] = field(init=False, repr=False, compare=False)  # children of node i at [i + 1]
    _depths: tuple[int, ...] = field(init=False, repr=False, compare=False)  # depth of node i (root's children: 1)

    def __eq__(self, other: object) -> bool:
        """Same nodes (parents, tokens, draws), vocabulary and draft rows (as stored: renormalised)."""
        if not isinstance(other, DraftTree):
            return NotImplemented
        return (
            (self.parents, self.tokens, self.draws, self.vocab) == (other.parents, other.tokens, other.draws, other.vocab)
            and self.q_rows.keys() == other.q_rows.keys()
            and all(np.array_equal(row, other.q_rows[k]) for k, row in self.q_rows.items())
        )

    def __hash__(self) -> int:
        return hash((self.parents, self.tokens, self.draws, self.vocab, tuple(sorted(self.q_rows))))

    def __post_init__(self) -> None:
        vocab = check_int("vocab", self.vocab, minimum=1)
        parents = _int_tuple("parents", self.parents)
        tokens = _int_tuple("tokens", self.tokens)
        n = len(tokens)
        if isinstance(self.draws, (str, Draw)):
            raise ValueError("draws must have one entry per node (use DraftTree.build for one kind for all)")
        draws = tuple(Draw.parse(d, f"draws[{i}]") for i, d in enumerate(_sequence("draws", self.draws)))
        if not isinstance(self.q_rows, Mapping):
            raise ValueError(f"q_rows must be a mapping from node index to a draft row, got {type(self.q_rows).__name__}")
        rows = _check_rows(self.q_rows, vocab)
        object.__setattr__(self, "vocab", vocab)
        object.__setattr__(self, "parents", parents)
        object.__setattr__(self, "tokens", tokens)
        object.__setattr__(self, "draws", draws)
        object.__setattr__(self, "q_rows", MappingProxyType(rows))
        if len(parents) != n or len(draws) != n:
            raise ValueError(
                f"parents ({len(parents)}), tokens ({n}) and draws ({len(draws)}) must have one entry per node"
            )
        kids: list[list[int]] = [[] for _ in range(n + 1)]
        depths: list[int] = []
        for i, (par, tok) in enumerate(zip(parents, tokens)):
            if not ROOT <= par < i:
                raise ValueError(
                    f"node {i} has parent {par}; parents must be -1 (root) or an earlier node (no cycles)"
                )
            if not 0 <= tok < vocab:
                raise ValueError(f"node {i} has token {tok} outside the vocabulary [0, {vocab})")
            kids[par + 1].append(i)
            depths.append(1 if par == ROOT else depths[par] + 1)
        object.__setattr__(self, "_kids", tuple(tuple(k) for k in kids))
        object.__setattr__(self, "_depths", tuple(depths))
        for key in rows:
            if not ROOT <= key < n:
                raise ValueError(f"q_rows key {key} is not a node of the tree")
        for node in range(ROOT, n):
            _validate_siblings(self, node, self._kids[node + 1])

    @property
    def size(self) -> int:
        return len(self.tokens)

    def _node(self, node: object) -> int:
        """``node`` as an int; ``ValueError`` for a node the tree does not have (a negative index would otherwise
        wrap around to another node) or a value that is not an integer."""
        got = node if type(node) is int else check_int("node", node)
        if not ROOT <= got < len(self.tokens):
            raise ValueError(f"node {node!r} is not a node of this tree of {len(self.tokens)} nodes (or -1, the root)")
        return got

    def children(self, node: int) -> tuple[int, ...]:
        """Children of ``node`` (``-1`` for the root) in verification order; ``ValueError`` for a node the tree
        does not have."""
        return self._kids[self._node(node) + 1]

    def node_depth(self, node: int) -> int:
        """Number of tokens on the path to ``node`` (0 for the root); ``ValueError`` for a node the tree does
        not have."""
        node = self._node(node)
        return 0 if node == ROOT else self._depths[node]

    def path(self, node: int) -> Path:
        """Tokens from the root down to ``node`` (``()`` for the root); ``ValueError`` for a node the tree
        does not have."""
        node = self._node(node)
        out: list[int] = []
        while node != ROOT:
            out.append(self.tokens[node])
            node = self.parents[node]
        return tuple(reversed(out))

    def paths(self) -> tuple[Path, ...]:
        """``paths()[j]`` is the path to node ``j − 1`` (``j = 0``: the root); the kernel's row order."""
        out: list[Path] = [()]
        for par, tok in zip(self.parents, self.tokens):
            out.append(out[par + 1] + (tok,))
        return tuple(out)

    def depth(self) -> int:
        return max(self._depths, default=0)

    @classmethod
    def build(
        cls,
        parents: Sequence[int],
        tokens: Sequence[int],
        draws: Sequence[str | Draw] | str | Draw,
        q_rows: Mapping[int, ArrayLike],
        vocab: int,
    ) -> DraftTree:
        """Constructor that also takes one draw kind for every node."""
        n = len(_sequence("tokens", tokens))
        kinds = (Draw.parse(draws),) * n if isinstance(draws, (str, Draw)) else tuple(_sequence("draws", draws))
        return cls(tuple(parents), tuple(tokens), kinds, q_rows, vocab)  # type: ignore[arg-type]

    @classmethod
    def chain(cls, ref: Sequence[int], q_rows: ArrayLike, draw: str | Draw = Draw.IID) -> DraftTree:
        """A width-1 tree: ``ref[i]`` drawn from ``q_rows[i]``."""
        q = check_prob_rows("q_rows", q_rows)
        n = len(_sequence("ref", ref))
        if q.shape[0] != n:
            raise ValueError(f"q_rows has {q.shape[0]} rows; expected one per draft token ({n})")
        return cls.build(list(range(-1, n - 1)), ref, draw, {i - 1: q[i] for i in range(n)}, q.shape[1])


def _sequence(name: str, value: object) -> Sequence[object]:
    if value is None or isinstance(value, (str, bytes)) or not hasattr(value, "__len__"):
        raise ValueError(f"{name} must be a sequence, got {value!r}")
    return list(value)  # type: ignore[call-overload, no-any-return]


def _int_tuple(name: str, values: object) -> tuple[int, ...]:
    return tuple(check_int(f"{name}[{i}]", x) for i, x in enumerate(_sequence(name, values)))


def _check_rows(q_rows: Mapping[Any, Any], vocab: int) -> dict[int, FloatArray]:
    """Validated, renormalised, read-only draft rows by node (one vectorised check for all rows)."""
    keys = [check_int("q_rows key", k) for k in q_rows]
    converted = [as_real_array_with_dtype(f"q_rows[{k}]", v) for k, v in zip(keys, q_rows.values())]
    arrs = [arr for arr, _ in converted]
    for k, arr in zip(keys, arrs):
        if arr.shape != (vocab,):
            raise ValueError(f"q_rows[{k}] has shape {arr.shape}; expected ({vocab},)")
    if not arrs:
        return {}
    dtypes = [given for _, given in converted]
    try:  # rows given in mixed precisions: each row at its own precision's tolerance
        table = check_prob_rows("q_rows", np.stack(arrs), row_dtypes=dtypes)
    except ValueError:
        for k, arr, dtype in zip(keys, arrs, dtypes):  # name the offending node's row
            check_prob_rows(f"q_rows[{k}]", arr[None, :], dtype=dtype)
        raise
    table.setflags(write=False)
    return dict(zip(keys, table))


def validate_tree(tree: DraftTree) -> None:
    """Kept for compatibility: a :class:`DraftTree` is validated when it is constructed."""
    if not isinstance(tree, DraftTree):
        raise ValueError(f"expected a DraftTree, got {type(tree).__name__}")


def _validate_siblings(tree: DraftTree, node: int, kids: Sequence[int]) -> None:
    if not kids:
        return
    kinds = {tree.draws[k] for k in kids}
    if len(kinds) > 1:
        raise ValueError(f"children of node {node} mix draw kinds {sorted(k.value for k in kinds)}")
    kind = kinds.pop()
    toks = [tree.tokens[k] for k in kids]
    if kind != Draw.IID and len(set(toks)) != len(toks):
        raise ValueError(f"children of node {node} repeat a token ({toks}) but were drawn '{kind.value}'")
    if kind == Draw.TOPK:
        return
    row = tree.q_rows.get(node)
    if row is None:
        raise ValueError(f"node {node} has '{kind.value}'-drawn children but no q_rows[{node}]")
    for k, tok in zip(kids, toks):
        if row[tok] <= 0.0:
            raise ValueError(
                f"node {k} (token {tok}) was drawn '{kind.value}' from q_rows[{node}] where q = 0"
            )


def swor_sequence_prob(q_row: FloatArray, tokens: Sequence[int]) -> float:
    """Probability of drawing ``tokens`` in this order without replacement from ``q_row``.

    Each draw is from ``q`` renormalised over the tokens not yet drawn.  The
    remaining mass is summed from the unused entries rather than obtained by
    subtracting from 1, which would cancel catastrophically when what is left
    is tiny (e.g. 1e-12 after the likely tokens are drawn).
    """
    unused = np.ones(q_row.shape[0], dtype=bool)
    prob = 1.0
    for tok in tokens:
        left = float(q_row[unused].sum())
        prob *= float(q_row[tok]) / left
        unused[tok] = False
    return prob


def proposal_laws(tree: DraftTree, node: int) -> list[FloatArray]:
    """The law each child of ``node`` was actually drawn from, in order (DESIGN.md §4).

    A ``swor`` node's first child comes from the stored row itself: nothing is removed yet, and dividing
    by the row's sum (``1 - 1.1e-16`` for some stored rows) would move ``q`` by an ulp, so ``p = q``
    would no longer accept with probability exactly 1."""
    kids = tree.children(node)
    laws: list[FloatArray] = []
    removed = np.zeros(tree.vocab, dtype=bool)
    for i, k in enumerate(kids):
        kind, tok = tree.draws[k], tree.tokens[k]
        if kind == Draw.TOPK:
            law = np.zeros(tree.vocab)
            law[tok] = 1.0
        elif kind == Draw.IID:
            law = tree.q_rows[node]
        else:  # swor (siblings share one kind): the first child is drawn from the stored row, none removed
            if i == 0:
                law = tree.q_rows[node]
            else:
                rest = np.where(removed, 0.0, tree.q_rows[node])
                law = rest / rest.sum()
            removed[tok] = True
        laws.append(law)
    return laws


#: ``proposals(tree, node)``: the proposal law of each child of ``node``, in order.
ProposalFn = Callable[[DraftTree, int], list[FloatArray]]


def residual_node_rule(
    tree: DraftTree, node: int, p_row: FloatArray, proposals: ProposalFn = proposal_laws
) -> tuple[tuple[float, ...], FloatArray]:
    """Residual verification at one accepted node, all at once: ``(accept, final)``.

    ``accept[i]`` is the probability of accepting child ``i`` given children
    ``< i`` were rejected; ``final`` the law emitted when every child is
    rejected (``p_row`` at a leaf).  Deterministic given the tree and the
    validated row, so vectorised samplers and K-SEQ's fallback plan with it.
    """
    r = p_row
    accept: list[float] = []
    for kid, law in zip(tree.children(node), proposals(tree, node)):
        tok = tree.tokens[kid]
        accept.append(acceptance_at(r, law, tok))
        r = residual(r, law, tok)
    return tuple(accept), r


def check_tree_p_rows(tree: DraftTree, p_rows: ArrayLike) -> FloatArray:
    """``p_rows`` validated as ``(N + 1, V)`` target rows for ``tree`` (renormalised float64)."""
    if not isinstance(tree, DraftTree):
        raise ValueError(f"tree must be a DraftTree, got {type(tree).__name__}")
    p = check_prob_rows("p_rows", p_rows)
    if p.shape != (tree.size + 1, tree.vocab):
        raise ValueError(
            f"p_rows has shape {p.shape}; expected (N + 1, V) = ({tree.size + 1}, {tree.vocab})"
        )
    return p


def multidraft_kernel(tree: DraftTree, p_rows: ArrayLike, proposals: ProposalFn = proposal_laws) -> FloatArray:
    """Exact output law ``(N + 1, V)`` of multi-draft residual verification.

    ``proposals`` gives the law each child is verified against; the default
    reads it from the tree's recorded draw kinds, which is what makes the step
    lossless.  Passing another rule exists for the audit's BIASED examples
    (e.g. the i.i.d. rule on trees drawn without replacement).
    """
    p = check_tree_p_rows(tree, p_rows)
    kernel = np.zeros_like(p)
    stack: list[tuple[int, float]] = [(ROOT, 1.0)]  # (accepted node, probability of reaching it)
    while stack:
        node, reach = stack.pop()
        r = p[node + 1]
        for kid, law in zip(tree.children(node), proposals(tree, node)):
            tok = tree.tokens[kid]
            accept = acceptance_at(r, law, tok)
            if accept > 0.0:
                stack.append((kid, reach * accept))
            reach *= 1.0 - accept
            if reach == 0.0:
                break
            r = residual(r, law, tok)
        kernel[node + 1] += reach * r
    return kernel


def multidraft_sample_from_uniforms(
    tree: DraftTree, p_rows: ArrayLike, u: ArrayLike, proposals: ProposalFn = proposal_laws
) -> list[int]:
    """One verification step driven by ``N + 1`` uniforms (layout in the module doc)."""
    p = check_tree_p_rows(tree, p_rows)
    uu = check_uniforms("u", u, tree.size + 1)
    node = ROOT
    while True:
        got = residual_walk_step(tree, node, p[node + 1], uu, proposals)
        if not isinstance(got, int):
            return list(tree.path(node)) + [categorical(got, float(uu[tree.size]))]
        node = got


def residual_walk_step(
    tree: DraftTree, node: int, p_row: FloatArray, uu: FloatArray, proposals: ProposalFn = proposal_laws
) -> int | FloatArray:
    """The sampler at one accepted node: the first child whose test passes (``uu[kid]`` against
    :func:`~tmc.residual.acceptance_at`), or, when every test fails, the residual to emit
    from (``p_row`` at a leaf).  Residuals are formed only as far as the tests go."""
    r = p_row
    for kid, law in zip(tree.children(node), proposals(tree, node)):
        tok = tree.tokens[kid]
        if uu[kid] < acceptance_at(r, law, tok):
            return kid
        r = residual(r, law, tok)
    return r


def multidraft_sample(
    tree: DraftTree, p_rows: ArrayLike, rng: np.random.Generator | int, proposals: ProposalFn = proposal_laws
) -> list[int]:
    """One verification step: the emitted tokens (accepted path plus one token).

    ``rng`` is a ``numpy.random.Generator`` or an integer seed.
    """
    if not isinstance(tree, DraftTree):
        raise ValueError(f"tree must be a DraftTree, got {type(tree).__name__}")
    return multidraft_sample_from_uniforms(tree, p_rows, as_rng(rng).random(tree.size + 1), proposals)


def tree_kernel_outputs(tree: DraftTree, kernel: FloatArray) -> dict[Path, float]:
    """Output law of one tree as ``{emitted string: probability}`` (merging equal strings)."""
    paths = tree.paths()
    out: dict[Path, float] = {}
    for j, b in zip(*np.nonzero(kernel)):
        s = paths[int(j)] + (int(b),)
        out[s] = out.get(s, 0.0) + float(kernel[j, b])
    return out
