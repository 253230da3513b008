"""Every draft a toy draft model can propose, with its probability (the one enumeration).

Notation (DESIGN.md §3): ``q`` is the draft model, ``p`` the target.  A *draft*
is what one speculative step proposes: a chain of ``n`` tokens drawn
autoregressively from ``q``, or a tree of a fixed shape whose children are
drawn ``iid``, ``swor`` (without replacement) or ``topk`` (deterministically)
from their parent's ``q`` row (:class:`tmc.multidraft.Draw`).  This module is
the single place such drafts are enumerated; the exact output laws
(:mod:`tmc.laws`), the LP limit (:mod:`tmc.lp`), the suites, the audit and
the benchmarks all take their drafts from here, so a report enumerates each
draft set once and hands the same list to every consumer.

Each draft carries its weight ``w_d`` (its probability under the draft
model), the rows a verifier needs, and ``accepted_paths``: the node paths a
verifier may accept (the root ``()`` first), which is all the LP needs.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import permutations, product

import numpy as np
from numpy.typing import NDArray

from tmc.multidraft import Draw, DraftTree, swor_sequence_prob
from tmc.toy import Path, ToyModel
from tmc.validate import check_int

FloatArray = NDArray[np.float64]


@dataclass(frozen=True)
class DraftChain:
    """One draft chain with its probability and the rows along it."""

    ref: Path  # the n draft tokens
    weight: float  # probability that the draft model produces ref
    q_rows: FloatArray  # (n, V) draft rows along ref
    p_rows: FloatArray  # (n + 1, V) target rows along ref

    @property
    def accepted_paths(self) -> tuple[Path, ...]:
        """``ref[:k]`` for ``k = 0..n``: what a chain verifier may accept."""
        return tuple(self.ref[:k] for k in range(len(self.ref) + 1))


@dataclass(frozen=True)
class TreeDraft:
    """One draft tree with its probability and the target rows at its nodes."""

    tree: DraftTree  # the tree, with each node's draw kind and the draft rows
    weight: float  # probability that the draft model produces this tree
    p_rows: FloatArray  # (N + 1, V) target rows: the root, then each node's path

    @property
    def accepted_paths(self) -> tuple[Path, ...]:
        """The root and every node's path, in the kernel's row order."""
        return self.tree.paths()


Draft = DraftChain | TreeDraft


def check_widths(widths: Sequence[int]) -> tuple[int, ...]:
    """A tree shape: one positive integer width per depth (``ValueError`` otherwise)."""
    if isinstance(widths, (str, bytes)) or not hasattr(widths, "__iter__"):
        raise ValueError(f"widths must be a sequence of positive integers, got {widths!r}")
    out = tuple(check_int(f"widths[{i}]", w) for i, w in enumerate(widths))
    if any(w < 1 for w in out):
        raise ValueError(f"widths must be positive, got {list(out)}")
    return out


def _checked(model: object) -> ToyModel:
    """``model`` when it is a :class:`~tmc.toy.ToyModel`, else a ``ValueError`` naming it."""
    if not isinstance(model, ToyModel):
        raise ValueError(f"model must be a tmc.ToyModel, got {type(model).__name__}")
    return model


def iter_chain_drafts(model: ToyModel, n: int, prefix: Path = ()) -> Iterator[DraftChain]:
    """Every draft chain of length ``n`` with positive draft probability."""
    n = check_int("n", n, minimum=0)
    prefix = _checked(model).checked_path("prefix", prefix)
    for ref in product(range(model.vocab), repeat=n):
        q_rows, p_rows = model.chain_rows(ref, prefix)
        weight = float(np.prod(q_rows[np.arange(n), list(ref)])) if n else 1.0
        if weight > 0.0:
            yield DraftChain(ref, weight, q_rows, p_rows)


def chain_drafts(model: ToyModel, n: int, prefix: Path = ()) -> list[DraftChain]:
    """:func:`iter_chain_drafts` as a list (enumerate once, use many times)."""
    return list(iter_chain_drafts(model, n, prefix))


def child_options(model: ToyModel, path: Path, width: int, draw: Draw | str) -> list[tuple[tuple[int, ...], float]]:
    """Every ordered tuple of children a node at ``path`` can get, with its probability.

    ``iid``: ``width`` i.i.d. draws from ``q``.  ``swor``: ``min(width, |supp q|)``
    distinct draws, each from ``q`` renormalised without the earlier ones.
    ``topk``: the ``width`` most likely tokens under ``q`` (ties to the lower
    id), probability 1.
    """
    kind = Draw.parse(draw)
    width = check_int("width", width, minimum=0)
    q = _checked(model).q(model.checked_path("path", path))
    if kind == Draw.TOPK:
        order = sorted(range(model.vocab), key=lambda t: (-q[t], t))
        return [(tuple(order[:width]), 1.0)]
    support = [t for t in range(model.vocab) if q[t] > 0.0]
    if kind == Draw.IID:
        return [(c, float(np.prod([q[t] for t in c]))) for c in product(support, repeat=width)]
    return [(combo, swor_sequence_prob(q, combo)) for combo in permutations(support, min(width, len(support)))]


def iter_tree_drafts(
    model: ToyModel, widths: Sequence[int], draw: Draw | str, prefix: Path = ()
) -> Iterator[TreeDraft]:
    """Every draft tree of the given shape with its probability under the draft.

    ``widths[d]`` is the number of children of every node at depth ``d``
    (the root is depth 0).  Nodes are numbered breadth first.
    """
    kind = Draw.parse(draw)
    shape = check_widths(widths)
    base = _checked(model).checked_path("prefix", prefix)

    # Depth first over the choices of each node's children, breadth first over the nodes, with an explicit
    # stack (a recursion of one frame per node hit Python's limit at about 1000 nodes: `--tree 10,10,10`).
    State = tuple[list[tuple[int, Path]], list[int], list[int], float]  # queue, parents, tokens, weight
    stack: list[State] = [([(-1, ())], [], [], 1.0)]
    while stack:
        queue, parents, tokens, weight = stack.pop()
        while queue and len(queue[0][1]) == len(shape):  # a leaf: no children to draw
            queue = queue[1:]
        if not queue:
            tree = DraftTree(
                tuple(parents), tuple(tokens), (kind,) * len(tokens), _draft_rows(model, base, parents, tokens, len(shape)), model.vocab
            )
            p_rows = np.array([model.p(base + path) for path in tree.paths()])
            yield TreeDraft(tree, weight, p_rows)
            continue
        (node, path), rest = queue[0], queue[1:]
        first = len(tokens)
        options = child_options(model, base + path, shape[len(path)], kind)
        for combo, prob in reversed(options):  # pushed last to first: popped in the order of child_options
            kids = [(first + i, path + (t,)) for i, t in enumerate(combo)]
            stack.append((rest + kids, parents + [node] * len(combo), tokens + list(combo), weight * prob))


def tree_drafts(model: ToyModel, widths: Sequence[int], draw: Draw | str, prefix: Path = ()) -> list[TreeDraft]:
    """:func:`iter_tree_drafts` as a list (enumerate once, use many times)."""
    return list(iter_tree_drafts(model, widths, draw, prefix))


def _draft_rows(
    model: ToyModel, prefix: Path, parents: list[int], tokens: list[int], depth: int
) -> dict[int, FloatArray]:
    """``q`` rows of the root and of every node above the last depth."""
    paths: dict[int, Path] = {-1: ()}
    for i, (par, tok) in enumerate(zip(parents, tokens)):
        paths[i] = paths[par] + (tok,)
    return {node: model.q(prefix + path) for node, path in paths.items() if len(path) < depth}


def one_level_draft_law(model: ToyModel, k: int, draw: Draw | str, prefix: Path = ()) -> dict[tuple[int, ...], float]:
    """Law of the ordered ``k`` root children drawn from ``q(· | prefix)`` (``iid`` or ``swor``).

    ``swor`` needs ``k`` at most the number of tokens with ``q > 0``.
    """
    kind = Draw.parse(draw)
    k = check_int("k", k, minimum=0)
    if kind == Draw.TOPK:
        raise ValueError("one_level_draft_law takes draw 'iid' or 'swor'; a topk draft has one outcome")
    prefix = _checked(model).checked_path("prefix", prefix)
    support = int(np.count_nonzero(model.q(prefix) > 0))
    if kind == Draw.SWOR and k > support:
        raise ValueError(f"k = {k} draws without replacement need k tokens with q > 0; q has {support}")
    return dict(child_options(model, prefix, k, kind))


def sample_children(q_row: FloatArray, width: int, draw: Draw | str, rng: np.random.Generator) -> list[int]:
    """Children of one node drawn as ``draw`` says from its draft row (what a builder does).

    ``topk`` takes the ``width`` most likely tokens (ties to the lower id), ``iid``
    draws ``width`` tokens independently, ``swor`` draws ``min(width, |supp q|)``
    distinct tokens, each from ``q`` renormalised without the earlier ones.
    """
    kind = Draw.parse(draw)
    vocab = q_row.shape[0]
    if kind == Draw.TOPK:
        return sorted(range(vocab), key=lambda t: (-q_row[t], t))[:width]
    if kind == Draw.IID:
        return [int(t) for t in rng.choice(vocab, size=width, p=q_row)]
    k = min(width, int(np.count_nonzero(q_row > 0)))
    return [int(t) for t in rng.choice(vocab, size=k, replace=False, p=q_row)]


def sample_tree_draft(
    model: ToyModel, widths: Sequence[int], draw: Draw | str, rng: np.random.Generator, prefix: Path = ()
) -> TreeDraft:
    """One draft tree of the shape drawn from the toy draft (nodes breadth first), with its weight."""
    kind = Draw.parse(draw)
    shape = check_widths(widths)
    base = _checked(model).checked_path("prefix", prefix)
    parents: list[int] = []
    tokens: list[int] = []
    rows: dict[int, FloatArray] = {}
    weight = 1.0
    frontier: list[tuple[int, Path]] = [(-1, ())]
    for width in shape:
        nxt: list[tuple[int, Path]] = []
        for node, path in frontier:
            rows[node] = model.q(base + path)
            kids = sample_children(rows[node], width, kind, rng)
            weight *= _children_prob(rows[node], kids, kind)
            for tok in kids:
                parents.append(node)
                tokens.append(tok)
                nxt.append((len(tokens) - 1, path + (tok,)))
        frontier = nxt
    tree = DraftTree(tuple(parents), tuple(tokens), (kind,) * len(tokens), rows, model.vocab)
    return TreeDraft(tree, weight, np.array([model.p(base + path) for path in tree.paths()]))


def _children_prob(q_row: FloatArray, kids: Sequence[int], kind: Draw) -> float:
    if kind == Draw.TOPK:
        return 1.0
    if kind == Draw.IID:
        return float(np.prod([q_row[t] for t in kids]))
    return swor_sequence_prob(q_row, kids)
