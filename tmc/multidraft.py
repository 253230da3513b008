"""Draft trees and recursive multi-draft residual verification (DESIGN.md §4).

Notation: ``p`` is the target, ``q`` the draft.  A draft tree hangs below the
current prefix (the *root*, node index ``-1``); non-root nodes are numbered
``0..N-1`` in a topological order (a parent before its children) and siblings
are verified in index order.  Every node records how it was drawn:

* ``iid`` — i.i.d. from its parent's draft row ``q`` (SpecInfer);
* ``swor`` — without replacement: from ``q`` with the earlier siblings
  removed and renormalised (Sequoia, DySpec Alg. 3);
* ``topk`` — deterministically (top-k or greedy): a point mass.

Verification at an accepted node starts from the residual target ``r = p``
and walks the children in order: child ``x_i`` drawn from ``q_i`` is
accepted with probability ``min(1, r(x_i) / q_i(x_i))``; on rejection
``r ← norm((r − q_i)_+)``.  For a point mass this is "accept with
probability ``r(x_i)``, else remove ``x_i`` from ``r``".  If every child is
rejected one token is drawn from ``r``; at an accepted leaf a bonus token is
drawn from ``p``.  Because the proposal law comes from each node's recorded
draw kind, a tree cannot be verified with the wrong rule.

Arrays: ``p_rows`` has shape ``(N + 1, V)`` — row 0 is ``p(· | prefix)`` at
the root, row ``i + 1`` is ``p`` after node ``i``'s path.  The *kernel* has
the same shape: ``K[j, b]`` is the probability that the step accepts the path
to node ``j − 1`` (``j = 0``: the root, nothing accepted) and then emits ``b``.
A width-1 tree is a chain and its kernel is :func:`tmc.sps_kernel`'s.

Noise layout of the sampler: ``N + 1`` uniforms; ``u[i]`` is the accept test
of node ``i`` (each node is tested at most once) and ``u[N]`` draws the final
corrected or bonus token.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum

import numpy as np
from numpy.typing import ArrayLike, NDArray

from tmc.noise import categorical, check_uniforms
from tmc.validate import check_prob_rows

Path = tuple[int, ...]
FloatArray = NDArray[np.float64]
ROOT = -1


class Draw(str, Enum):
    """How a draft node was drawn from its parent's draft row."""

    IID = "iid"
    SWOR = "swor"
    TOPK = "topk"


@dataclass(frozen=True)
class DraftTree:
    """A token tree proposed by the draft model, with how each node was drawn."""

    parents: tuple[int, ...]  # parent index of each node; -1 = the root (current prefix)
    tokens: tuple[int, ...]  # token id of each node
    draws: tuple[Draw, ...]  # draw kind of each node
    q_rows: Mapping[int, FloatArray]  # draft row q(.|node) of every node with sampled children (-1 = root)
    vocab: int  # vocabulary size V

    @property
    def size(self) -> int:
        return len(self.tokens)

    def children(self, node: int) -> list[int]:
        """Children of ``node`` (``-1`` for the root) in verification order."""
        return [i for i, par in enumerate(self.parents) if par == node]

    def path(self, node: int) -> Path:
        """Tokens from the root down to ``node`` (``()`` for the root)."""
        out: list[int] = []
        while node != ROOT:
            out.append(self.tokens[node])
            node = self.parents[node]
        return tuple(reversed(out))

    def depth(self) -> int:
        return max((len(self.path(i)) for i in range(self.size)), default=0)

    @classmethod
    def build(
        cls,
        parents: Sequence[int],
        tokens: Sequence[int],
        draws: Sequence[str | Draw] | str | Draw,
        q_rows: Mapping[int, ArrayLike],
        vocab: int,
    ) -> DraftTree:
        """Validated constructor; ``draws`` may be one kind for every node."""
        n = len(tokens)
        kinds = [Draw(draws)] * n if isinstance(draws, (str, Draw)) else [Draw(d) for d in draws]
        rows = {int(k): check_prob_rows(f"q_rows[{k}]", np.asarray(v, dtype=np.float64)[None, :])[0] for k, v in q_rows.items()}
        tree = cls(tuple(int(x) for x in parents), tuple(int(t) for t in tokens), tuple(kinds), rows, vocab)
        validate_tree(tree)
        return tree

    @classmethod
    def chain(cls, ref: Sequence[int], q_rows: ArrayLike, draw: str | Draw = Draw.IID) -> DraftTree:
        """A width-1 tree: ``ref[i]`` drawn from ``q_rows[i]``."""
        q = np.asarray(q_rows, dtype=np.float64)
        n = len(ref)
        vocab = q.shape[1] if q.ndim == 2 else 0
        return cls.build(list(range(-1, n - 1)), ref, draw, {i - 1: q[i] for i in range(n)}, vocab)


def validate_tree(tree: DraftTree) -> None:
    """Raise ``ValueError`` for a malformed tree (DESIGN.md §4, issue #3)."""
    n = tree.size
    if tree.vocab < 1:
        raise ValueError(f"vocab must be >= 1, got {tree.vocab}")
    if len(tree.parents) != n or len(tree.draws) != n:
        raise ValueError(
            f"parents ({len(tree.parents)}), tokens ({n}) and draws ({len(tree.draws)}) must have one entry per node"
        )
    for i, (par, tok) in enumerate(zip(tree.parents, tree.tokens)):
        if not ROOT <= par < i:
            raise ValueError(
                f"node {i} has parent {par}; parents must be -1 (root) or an earlier node (no cycles)"
            )
        if not 0 <= tok < tree.vocab:
            raise ValueError(f"node {i} has token {tok} outside the vocabulary [0, {tree.vocab})")
    for key, row in tree.q_rows.items():
        if not ROOT <= key < n:
            raise ValueError(f"q_rows key {key} is not a node of the tree")
        if row.shape != (tree.vocab,):
            raise ValueError(f"q_rows[{key}] has shape {row.shape}; expected ({tree.vocab},)")
    for node in [ROOT, *range(n)]:
        _validate_siblings(tree, node, tree.children(node))


def _validate_siblings(tree: DraftTree, node: int, kids: list[int]) -> None:
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
    """The law each child of ``node`` was actually drawn from, in order."""
    kids = tree.children(node)
    laws: list[FloatArray] = []
    removed = np.zeros(tree.vocab, dtype=bool)
    for k in kids:
        kind, tok = tree.draws[k], tree.tokens[k]
        if kind == Draw.TOPK:
            law = np.zeros(tree.vocab)
            law[tok] = 1.0
        elif kind == Draw.IID:
            law = tree.q_rows[node]
        else:
            rest = np.where(removed, 0.0, tree.q_rows[node])
            law = rest / rest.sum()
            removed[tok] = True
        laws.append(law)
    return laws


def _reject(r: FloatArray, law: FloatArray) -> FloatArray:
    """Residual after a rejection: ``norm((r − law)_+)``.

    When rounding leaves no mass (the rejection then had probability ~0) the
    residual stays ``r`` so the output remains a valid draw.
    """
    res = np.maximum(r - law, 0.0)
    total = res.sum()
    return res / total if total > 0.0 else r


def _check_p_rows(tree: DraftTree, p_rows: ArrayLike) -> FloatArray:
    p = check_prob_rows("p_rows", p_rows)
    if p.shape != (tree.size + 1, tree.vocab):
        raise ValueError(
            f"p_rows has shape {p.shape}; expected (N + 1, V) = ({tree.size + 1}, {tree.vocab})"
        )
    return p


def multidraft_kernel(tree: DraftTree, p_rows: ArrayLike) -> FloatArray:
    """Exact output law ``(N + 1, V)`` of multi-draft residual verification."""
    p = _check_p_rows(tree, p_rows)
    kernel = np.zeros_like(p)
    stack: list[tuple[int, float]] = [(ROOT, 1.0)]  # (accepted node, probability of reaching it)
    while stack:
        node, reach = stack.pop()
        r = p[node + 1]
        for kid, law in zip(tree.children(node), proposal_laws(tree, node)):
            tok = tree.tokens[kid]
            accept = min(1.0, r[tok] / law[tok])
            if accept > 0.0:
                stack.append((kid, reach * accept))
            reach *= 1.0 - accept
            if reach == 0.0:
                break
            r = _reject(r, law)
        kernel[node + 1] += reach * r
    return kernel


def multidraft_sample_from_uniforms(tree: DraftTree, p_rows: ArrayLike, u: ArrayLike) -> list[int]:
    """One verification step driven by ``N + 1`` uniforms (layout in the module doc)."""
    p = _check_p_rows(tree, p_rows)
    uu = check_uniforms("u", u, tree.size + 1)
    node = ROOT
    while True:
        r = p[node + 1]
        for kid, law in zip(tree.children(node), proposal_laws(tree, node)):
            tok = tree.tokens[kid]
            if uu[kid] < r[tok] / law[tok]:
                node = kid
                break
            r = _reject(r, law)
        else:
            return list(tree.path(node)) + [categorical(r, float(uu[tree.size]))]


def multidraft_sample(tree: DraftTree, p_rows: ArrayLike, rng: np.random.Generator) -> list[int]:
    """One verification step: the emitted tokens (accepted path plus one token)."""
    return multidraft_sample_from_uniforms(tree, p_rows, rng.random(tree.size + 1))


def tree_kernel_outputs(tree: DraftTree, kernel: FloatArray) -> dict[Path, float]:
    """Output law of one tree as ``{emitted string: probability}`` (merging equal strings)."""
    out: dict[Path, float] = {}
    for j, b in zip(*np.nonzero(kernel)):
        s = tree.path(int(j) - 1) + (int(b),)
        out[s] = out.get(s, 0.0) + float(kernel[j, b])
    return out
