"""Exact output laws of verifiers on a toy model, in one call.

The convenience layer over :mod:`tmc.drafts` (the one enumeration of draft
chains and trees) and :mod:`tmc.laws` (averaged laws and the completion
identity): ``chain_output_law(model, n, kernel)`` enumerates the drafts and
summarises the verifier's averaged law; callers that evaluate several
verifiers on the same drafts should enumerate once with
:func:`tmc.drafts.chain_drafts` / :func:`tmc.drafts.tree_drafts` and call
:func:`tmc.laws.output_law` for each verifier.

Also here: a chain verifier as an exact prefix sampler of the target (TMC
paper Thm 5.7), :func:`speculative_prefix_kernel`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

from tmc.drafts import (
    DraftChain,
    chain_drafts,
    child_options,
    iter_chain_drafts,
    iter_tree_drafts,
    tree_drafts,
)
from tmc.laws import (
    ChainKernel,
    OutputLaw,
    TreeKernel,
    averaged_law,
    chain_kernel_outputs,
    completion_error,
    joint_law,
    output_law,
)
from tmc.multidraft import Draw, DraftTree, multidraft_kernel
from tmc.prefix import PrefixKernel
from tmc.toy import Path, ToyModel
from tmc.tree import TreeDistribution, TreeSpace
from tmc.validate import FloatArray

ChainLaw = OutputLaw  # the chain case keeps its own name in the public API

__all__ = [
    "ChainKernel",
    "ChainLaw",
    "DraftChain",
    "OutputLaw",
    "TreeKernel",
    "averaged_chain_law",
    "averaged_tree_law",
    "chain_joint_law",
    "chain_output_law",
    "child_options",
    "completion_error",
    "enumerate_draft_trees",
    "enumerate_drafts",
    "kernel_outputs",
    "speculative_prefix_kernel",
    "target_tree_distribution",
    "tree_output_law",
    "tree_p_rows",
]

enumerate_drafts = iter_chain_drafts
kernel_outputs = chain_kernel_outputs


def chain_output_law(model: ToyModel, n: int, kernel_fn: ChainKernel, prefix: Path = ()) -> OutputLaw:
    """Averaged output law, expected length and completion error of a chain verifier."""
    return output_law(model, chain_drafts(model, n, prefix), kernel_fn, prefix)


def averaged_chain_law(
    model: ToyModel, n: int, kernel_fn: ChainKernel, prefix: Path = ()
) -> tuple[dict[Path, float], int]:
    """``(K̄, number of drafts)``: the averaged output law without the completion check."""
    drafts = chain_drafts(model, n, prefix)
    return averaged_law(drafts, kernel_fn), len(drafts)


def chain_joint_law(
    model: ToyModel, n: int, kernel_fn: ChainKernel, prefix: Path = ()
) -> dict[tuple[Path, Path], float]:
    """Joint law of (draft chain, output string): ``w_d · K_d(s)``."""
    return joint_law(chain_drafts(model, n, prefix), kernel_fn)


def enumerate_draft_trees(
    model: ToyModel, widths: Sequence[int], draw: Draw | str, prefix: Path = ()
) -> Iterator[tuple[float, DraftTree]]:
    """``(weight, tree)`` for every draft tree of the shape (see :func:`tmc.drafts.iter_tree_drafts`)."""
    for d in iter_tree_drafts(model, widths, draw, prefix):
        yield d.weight, d.tree


def tree_p_rows(model: ToyModel, tree: DraftTree, prefix: Path = ()) -> FloatArray:
    """Target rows ``(N + 1, V)``: the root, then each node's path."""
    return np.array([model.p(tuple(prefix) + path) for path in tree.paths()])


def tree_output_law(
    model: ToyModel,
    widths: Sequence[int],
    draw: Draw | str,
    kernel_fn: TreeKernel = multidraft_kernel,
    prefix: Path = (),
) -> OutputLaw:
    """Averaged output law, expected length and completion error of a tree verifier."""
    return output_law(model, tree_drafts(model, widths, draw, prefix), kernel_fn, prefix)


def averaged_tree_law(
    model: ToyModel,
    widths: Sequence[int],
    draw: Draw | str,
    kernel_fn: TreeKernel = multidraft_kernel,
    prefix: Path = (),
) -> tuple[dict[Path, float], int]:
    """``(K̄, number of draft trees)``: the averaged output law without the completion check."""
    drafts = tree_drafts(model, widths, draw, prefix)
    return averaged_law(drafts, kernel_fn), len(drafts)


# ------------------------------------------- verifiers as prefix samplers


def target_tree_distribution(model: ToyModel, depth: int) -> TreeDistribution:
    """The target ``p`` as a leaf-only tree distribution on the full tree of ``depth``."""
    space = TreeSpace.full(model.vocab, depth)

    def cond(path: Path) -> dict[int, float]:
        row = model.p(path)
        return {a: float(row[a]) for a in range(model.vocab) if row[a] > 0.0}

    return TreeDistribution.from_conditionals(space, cond)


def speculative_prefix_kernel(model: ToyModel, n: int, kernel_fn: ChainKernel, depth: int) -> PrefixKernel:
    """One speculative step as an exact prefix sampler on the tree of ``depth`` (Thm 5.7).

    From a prefix ``σ`` the draft proposes ``min(n, depth − len(σ) − 1)``
    tokens and the verifier emits its output after ``σ``; at depth ``depth``
    (a leaf) the prefix is returned unchanged.  Composing it with itself is
    speculative decoding run for several steps (Def A.26).
    """

    def kernel(prefix: Path) -> dict[Path, float]:
        room = depth - len(prefix)
        if room <= 0:
            return {prefix: 1.0}
        law = averaged_law(chain_drafts(model, min(n, room - 1), prefix), kernel_fn)
        return {prefix + s: m for s, m in law.items()}

    return kernel
