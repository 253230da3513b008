"""Tree Monte Carlo core: exact kernels and samplers for lossless speculative sampling.

``p`` is always the target model and ``q`` the draft model (the TMC paper's
``P`` and ``P_ref``).  Pure numpy (scipy only for the LP); importing
:mod:`tmc` never imports torch or scipy.

Kernel indexing (the one convention every verifier follows).  A verifier's
*kernel* is its exact output law given one draft, an array ``K`` of shape
``(rows, V)`` whose row ``j`` belongs to the ``j``-th node path a step can
accept and whose column ``b`` is the one corrected or bonus token emitted
after it:

* chain of ``n`` draft tokens ``ref``: ``(n + 1, V)``, row ``k`` is the
  accepted prefix ``ref[:k]``, so ``K[k, b]`` is the probability of emitting
  ``ref[:k] + [b]`` (:mod:`tmc.chain`);
* draft tree of ``N`` nodes: ``(N + 1, V)``, row 0 is the root (nothing
  accepted) and row ``i + 1`` the path to node ``i``
  (:meth:`DraftTree.paths` lists them in this order; :mod:`tmc.multidraft`).

A width-1 tree is a chain and both conventions give the same array.  For a
lossless verifier ``K.sum() == 1``.

Main entry points:

* chain verifiers — :func:`sps_kernel`, :func:`asps_kernel`,
  :func:`block_kernel` and their samplers ``*_sample`` (``rng``: a
  ``Generator`` or an integer seed) and ``*_sample_from_uniforms``;
* tree verification — :class:`DraftTree` (validated on construction, each
  node's :class:`Draw` kind recorded), :func:`multidraft_kernel`,
  :func:`multidraft_sample` (recursive residual verification) and
  :func:`traversal_kernel`, :func:`traversal_sample` (Traversal Verification,
  Weng et al. 2025: leaf-to-root, sequence-level acceptance),
  :func:`ordered_traversal_kernel` (Traversal visiting siblings by decreasing
  ``p/q`` with order-statistic proposal laws: this project's verifier) and
  :func:`kseq_kernel`, :func:`kseq_sample` (SpecTr's K-SEQ, Sun et al. 2023,
  at nodes with i.i.d. children);
* drafts and exact laws — :func:`chain_drafts` / :func:`tree_drafts` (every
  draft of a toy model with its weight, enumerated once), :func:`output_law`
  (averaged law, expected length, completion-identity error),
  :func:`chain_output_law` / :func:`tree_output_law` (both in one call);
* the limit — :func:`lp_limit` (the best expected length of any lossless
  verifier on the same drafts, chains or trees; loads scipy on first use);
* tree distributions, the sub-distribution order and prefix samplers in
  :mod:`tmc.tree`, :mod:`tmc.order` and :mod:`tmc.prefix`.

The command line (:mod:`tmc.cli`, :mod:`tmc.commands`) is built on top and is
never imported by the core.
"""

from __future__ import annotations

from typing import Any

from tmc.chain import (
    asps_kernel,
    asps_sample,
    asps_sample_from_uniforms,
    block_kernel,
    block_sample,
    block_sample_from_uniforms,
    sps_kernel,
    sps_sample,
    sps_sample_from_uniforms,
)
from tmc.drafts import DraftChain, TreeDraft, chain_drafts, tree_drafts
from tmc.enumeration import ChainLaw, chain_joint_law, chain_output_law, tree_output_law
from tmc.kseq import kseq_kernel, kseq_rho, kseq_sample, kseq_sample_from_uniforms
from tmc.laws import OutputLaw, averaged_law, completion_error, output_law
from tmc.multidraft import (
    ALL_DRAWS,
    Draw,
    DraftTree,
    multidraft_kernel,
    multidraft_sample,
    multidraft_sample_from_uniforms,
    proposal_laws,
)
from tmc.ordered_traversal import ordered_traversal_kernel, ordered_traversal_sample
from tmc.toy import ToyModel, load_model, paper_toy_model
from tmc.traversal import traversal_kernel, traversal_sample, traversal_sample_from_uniforms

__all__ = [
    "ALL_DRAWS",
    "ChainLaw",
    "DraftChain",
    "DraftTree",
    "Draw",
    "LPResult",
    "OutputLaw",
    "ToyModel",
    "TreeDraft",
    "asps_kernel",
    "asps_sample",
    "asps_sample_from_uniforms",
    "averaged_law",
    "block_kernel",
    "block_sample",
    "block_sample_from_uniforms",
    "chain_drafts",
    "chain_joint_law",
    "chain_output_law",
    "completion_error",
    "kseq_kernel",
    "kseq_rho",
    "kseq_sample",
    "kseq_sample_from_uniforms",
    "load_model",
    "lp_limit",
    "multidraft_kernel",
    "multidraft_sample",
    "multidraft_sample_from_uniforms",
    "ordered_traversal_kernel",
    "ordered_traversal_sample",
    "output_law",
    "paper_toy_model",
    "proposal_laws",
    "sps_kernel",
    "sps_sample",
    "sps_sample_from_uniforms",
    "traversal_kernel",
    "traversal_sample",
    "traversal_sample_from_uniforms",
    "tree_drafts",
    "tree_output_law",
]

_LAZY = {"lp_limit", "LPResult"}  # from tmc.lp, which imports scipy


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from tmc import lp

        return getattr(lp, name)
    raise AttributeError(f"module 'tmc' has no attribute {name!r}")
