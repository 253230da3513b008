"""What a decoder needs from a token tree, as functions of :class:`tmc.DraftTree`.

``tmc.DraftTree`` is the one token-tree value of the project: parent indices,
tokens, each node's draw kind and the draft rows of the expanded nodes
(DESIGN.md §7).  This module adds no second tree class; it computes, for one
verification forward pass over the flattened tree:

* an **order** in which to lay the nodes out (:func:`dfs_order`,
  :func:`bfs_order`, or the tree's own index order);
* the **tree attention mask** (:func:`tree_mask`, :func:`attention_mask`):
  each drafted node sees the whole past, its ancestors and itself;
* the **position ids** (:func:`position_ids`): past length + depth, where the
  root's children have depth 0 in this count (they sit right after the past);
* the **KV index list** (:func:`keep_indices`) that keeps the past and the
  accepted path of a verified step;
* DySpec App. C's **block count** (:func:`mask_blocks`): the number of
  non-empty ``b × b`` blocks of the mask, which is what a block-sparse
  attention kernel pays for.

Every function takes an optional ``order`` (a permutation of ``0..N-1``;
``order[k]`` is the node at flattened position ``k``) and ``with_root``: a
decode loop whose last emitted token is not in the KV cache yet feeds it as
flattened position 0 (depth −1 in the count above), before the tree nodes.
Notation: ``p`` target, ``q`` draft (DESIGN.md §3).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

from tmc.multidraft import ROOT, DraftTree
from tmc.validate import check_int

IntArray = NDArray[np.int64]
BoolArray = NDArray[np.bool_]

__all__ = [
    "accepted_nodes",
    "attention_mask",
    "bfs_order",
    "check_order",
    "dfs_order",
    "keep_indices",
    "mask_blocks",
    "position_ids",
    "random_tree",
    "reorder",
    "tree_mask",
]


def _tree(tree: object) -> DraftTree:
    if not isinstance(tree, DraftTree):
        raise ValueError(f"tree must be a tmc.DraftTree, got {type(tree).__name__}")
    return tree


def _seq(name: str, value: object) -> list[object]:
    if value is None or isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise ValueError(f"{name} must be a sequence of integers, got {value!r}")
    return list(value)


def dfs_order(tree: DraftTree) -> tuple[int, ...]:
    """Nodes in depth-first pre-order, children in verification order (DySpec App. C)."""
    t = _tree(tree)
    out: list[int] = []
    stack = list(reversed(t.children(ROOT)))
    while stack:
        node = stack.pop()
        out.append(node)
        stack.extend(reversed(t.children(node)))
    return tuple(out)


def bfs_order(tree: DraftTree) -> tuple[int, ...]:
    """Nodes breadth first (by depth, then parent order, then verification order)."""
    t = _tree(tree)
    out: list[int] = []
    layer = list(t.children(ROOT))
    while layer:
        out.extend(layer)
        layer = [kid for node in layer for kid in t.children(node)]
    return tuple(out)


def check_order(tree: DraftTree, order: Sequence[int] | None) -> tuple[int, ...]:
    """``order`` validated as a permutation of the nodes (``None``: index order)."""
    t = _tree(tree)
    if order is None:
        return tuple(range(t.size))
    out = tuple(check_int(f"order[{k}]", v) for k, v in enumerate(_seq("order", order)))
    if sorted(out) != list(range(t.size)):
        raise ValueError(f"order must be a permutation of the {t.size} node indices, got {list(out)[:12]}")
    return out


def _flag(with_root: object) -> bool:
    """``with_root`` as a bool, or ``ValueError`` (a text such as ``"no"`` had been read as True)."""
    if not isinstance(with_root, (bool, np.bool_)):
        raise ValueError(f"with_root must be a bool, got {with_root!r}")
    return bool(with_root)


def tree_mask(tree: DraftTree, order: Sequence[int] | None = None, with_root: bool = False) -> BoolArray:
    """``(n, n)`` boolean mask over the flattened tree: ``[i, j]`` is True when position ``j``
    is an ancestor of position ``i`` or ``i`` itself (``n = N``, or ``N + 1`` with the root)."""
    t = _tree(tree)
    ordr = check_order(t, order)
    with_root = _flag(with_root)
    off = 1 if with_root else 0
    pos = np.empty(t.size, dtype=np.int64)
    pos[list(ordr)] = np.arange(t.size) + off
    n = t.size + off
    mask = np.zeros((n, n), dtype=bool)
    if with_root:
        mask[:, 0] = True
    rows: dict[int, BoolArray] = {}
    for node in range(t.size):  # parents come before children in index order
        par = t.parents[node]
        row = rows[par].copy() if par != ROOT else np.zeros(n, dtype=bool)
        if with_root:
            row[0] = True
        row[pos[node]] = True
        rows[node] = row
        mask[pos[node]] = row
    return mask


def attention_mask(
    tree: DraftTree, past: int, order: Sequence[int] | None = None, with_root: bool = False
) -> BoolArray:
    """``(n, past + n)`` boolean mask: every flattened node sees the ``past`` cached tokens,
    its ancestors and itself (True = may attend)."""
    past = check_int("past", past, minimum=0)
    inner = tree_mask(tree, order, with_root)
    return np.concatenate([np.ones((inner.shape[0], past), dtype=bool), inner], axis=1)


def position_ids(
    tree: DraftTree, past: int, order: Sequence[int] | None = None, with_root: bool = False
) -> IntArray:
    """Position of each flattened node: ``past + depth`` with the root's children at depth 0
    (or 1 when the root itself is fed at position ``past``)."""
    t = _tree(tree)
    past = check_int("past", past, minimum=0)
    ordr = check_order(t, order)
    with_root = _flag(with_root)
    off = 1 if with_root else 0
    depths = [t.node_depth(node) - 1 + off for node in ordr]
    return np.asarray(([0] if with_root else []) + depths, dtype=np.int64) + past


def accepted_nodes(tree: DraftTree, tokens: Sequence[int]) -> tuple[int, ...]:
    """The node path a verifier accepted, from the tokens it emitted (all but the last).

    ``tokens`` is a verifier's output: the accepted draft tokens then one
    corrected or bonus token.  Siblings drawn i.i.d. may repeat a token; their
    paths are the same string, so the first such child is taken (its KV
    entries are the same), unless only a later twin's subtree carries the
    rest of the tokens: then the first twin that does.
    """
    t = _tree(tree)
    toks = [check_int(f"tokens[{i}]", x, minimum=0) for i, x in enumerate(_seq("tokens", tokens))]
    if not toks:
        raise ValueError("tokens must hold at least the final corrected or bonus token")
    for i, tok in enumerate(toks):
        if tok >= t.vocab:
            raise ValueError(f"tokens[{i}] = {tok} is outside the tree's vocabulary [0, {t.vocab})")
    found = _path_below(t, ROOT, toks[:-1])
    if found is None:
        path = _first_twin_prefix(t, toks[:-1])
        raise ValueError(f"tokens {toks} leave the tree at token {toks[len(path)]} after nodes {path}")
    return tuple(found)


def _path_below(t: DraftTree, node: int, toks: Sequence[int]) -> list[int] | None:
    """Nodes below ``node`` carrying ``toks``, trying twins in child order; ``None`` when none does.

    A depth-first search with a stack of child iterators, not recursion (a chain of a few thousand nodes
    passed Python's recursion limit).  Each node is tried at most once (only with the tokens of its depth),
    so this is linear in the tree.
    """
    path: list[int] = []
    stack = [iter(t.children(node))]  # stack[d]: the children still to try for toks[d]
    while len(path) < len(toks):
        want = toks[len(path)]
        kid = next((k for k in stack[-1] if t.tokens[k] == want), None)
        if kid is None:  # no (further) twin carries toks[len(path)] here: back up one level
            stack.pop()
            if not stack:
                return None
            path.pop()
        else:
            path.append(kid)
            stack.append(iter(t.children(kid)))
    return path


def _first_twin_prefix(t: DraftTree, toks: Sequence[int]) -> list[int]:
    """The nodes matched by taking the first child carrying each token, until no child does (for errors)."""
    node, path = ROOT, list[int]()
    for tok in toks:
        kid = next((k for k in t.children(node) if t.tokens[k] == tok), None)
        if kid is None:
            break
        path.append(kid)
        node = kid
    return path


def keep_indices(
    tree: DraftTree,
    path: Sequence[int],
    past: int,
    order: Sequence[int] | None = None,
    with_root: bool = False,
) -> IntArray:
    """KV-cache positions to keep after a verified step: the ``past``, (the root,) then the
    accepted ``path`` of nodes (from :func:`accepted_nodes`) in the flattened layout."""
    t = _tree(tree)
    past = check_int("past", past, minimum=0)
    ordr = check_order(t, order)
    where = {node: k for k, node in enumerate(ordr)}
    with_root = _flag(with_root)
    off = 1 if with_root else 0
    prev = ROOT
    nodes: list[int] = [check_int(f"path[{i}]", x) for i, x in enumerate(_seq("path", path))]
    for i, node in enumerate(nodes):
        if not 0 <= node < t.size or t.parents[node] != prev:
            raise ValueError(f"path {nodes} is not a root-down path of the tree (entry {i})")
        prev = node
    kept = list(range(past + off)) + [past + off + where[node] for node in nodes]
    return np.asarray(kept, dtype=np.int64)


def mask_blocks(mask: BoolArray, block: int = 32) -> int:
    """Number of ``block × block`` tiles of ``mask`` holding at least one True (DySpec App. C).

    ``mask``: booleans, or finite numbers (nonzero = True); ``ValueError`` for text, NaN or infinities
    (``"no"`` and NaN had been read as True)."""
    block = check_int("block", block, minimum=1)
    raw = np.asarray(mask)
    if raw.dtype != np.bool_ and not (raw.dtype.kind in "iuf" and bool(np.isfinite(raw).all())):
        raise ValueError(f"mask must hold booleans or finite numbers, got dtype {raw.dtype}"
                         + (" with a NaN or infinite entry" if raw.dtype.kind == "f" else ""))
    m = raw.astype(bool)
    if m.ndim != 2:
        raise ValueError(f"mask must be 2-D, got shape {m.shape}")
    rows = -(-m.shape[0] // block)
    cols = -(-m.shape[1] // block)
    padded = np.zeros((rows * block, cols * block), dtype=bool)
    padded[: m.shape[0], : m.shape[1]] = m
    return int(padded.reshape(rows, block, cols, block).any(axis=(1, 3)).sum())


def reorder(tree: DraftTree, order: Sequence[int]) -> DraftTree:
    """The same tree renumbered so that node ``order[k]`` becomes node ``k``.

    ``order`` must list parents before children (DFS and BFS orders do); the
    verification order of siblings is kept, so every verifier's output law is
    unchanged.
    """
    t = _tree(tree)
    ordr = check_order(t, order)
    new = {old: k for k, old in enumerate(ordr)}
    new[ROOT] = ROOT
    for k, old in enumerate(ordr):
        if t.parents[old] != ROOT and new[t.parents[old]] > k:
            raise ValueError(f"order puts node {old} before its parent {t.parents[old]}")
    for node in range(ROOT, t.size):
        kids = [new[k] for k in t.children(node)]
        if kids != sorted(kids):
            raise ValueError(f"order changes the sibling order of node {node}'s children")
    return DraftTree(
        tuple(new[t.parents[old]] for old in ordr),
        tuple(t.tokens[old] for old in ordr),
        tuple(t.draws[old] for old in ordr),
        {new[k]: v for k, v in t.q_rows.items()},
        t.vocab,
    )


def random_tree(size: int, rng: np.random.Generator | int, vocab: int = 2) -> DraftTree:
    """A random recursive tree: node ``i`` hangs below a uniform node ``< i`` or the root.

    Sibling ``j`` of each group carries token ``j`` (the distinct tokens a ``topk``
    draw needs), so the tree's vocabulary is ``vocab`` raised, where needed, to the
    largest sibling count; used for the mask-block measurement, where only the
    shape matters.
    """
    size = check_int("size", size, minimum=0)
    vocab = check_int("vocab", vocab, minimum=1)
    gen = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(check_int("rng", rng, minimum=0))
    parents = [int(gen.integers(-1, i)) for i in range(size)]
    counts: dict[int, int] = {}
    tokens = []
    for par in parents:
        tokens.append(counts.get(par, 0))
        counts[par] = tokens[-1] + 1
    return DraftTree(tuple(parents), tuple(tokens), ("topk",) * size, {}, max(vocab, max(counts.values(), default=1)))  # type: ignore[arg-type]
