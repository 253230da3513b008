"""Exact acceptance lengths of verifiers against the LP limit (``tmc acceptance``).

``p`` is the target's law and ``q`` the draft's (DESIGN.md §3); ``p_rows`` / ``q_rows`` hold their rows.

For a toy model and a draft shape (a chain of ``n`` tokens, or a fixed tree
``widths`` with a draw kind) this computes, by exhaustive enumeration, each
applicable verifier's expected number of tokens per step and its worst
completion-identity error, and the LP limit of DESIGN.md §6: the best
expected length any lossless verifier could reach with the same draft.  The
drafts are enumerated once per report (:mod:`tmc.drafts`) and the same list
goes to every verifier and to the LP.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tmc.chain import asps_kernel, block_kernel, sps_kernel
from tmc.commands.table import format_table
from tmc.drafts import DraftChain, TreeDraft, chain_drafts, tree_drafts
from tmc.laws import ChainKernel, OutputLaw, TreeKernel, output_law
from tmc.kseq import kseq_kernel
from tmc.lp import lp_limit
from tmc.multidraft import ALL_DRAWS, DraftTree, Draw, multidraft_kernel
from tmc.ordered_traversal import ordered_traversal_kernel
from tmc.toy import PAPER_TOY_FILE, ToyModel, load_model
from tmc.traversal import traversal_kernel

__all__ = ["PAPER_TOY_FILE", "chain_report", "load_model", "random_model", "render", "tree_report"]

#: Chain verifiers reported for a chain draft, by JSON key.
CHAIN_VERIFIERS: dict[str, ChainKernel] = {"sps": sps_kernel, "asps": asps_kernel, "block": block_kernel}


@dataclass(frozen=True)
class TreeRule:
    """A lossless tree verifier as the reports use it."""

    kernel: TreeKernel  # exact (N + 1, V) output law of one tree
    draws: tuple[Draw, ...] = ALL_DRAWS  # draw kinds of the trees it verifies
    # True when the rule is lossless only if the number of children of a node is fixed
    # before they are drawn (it reasons about the whole sibling sample, as ratio
    # ordering and K-SEQ's rho do); tree builders whose sibling counts depend on the
    # tokens drawn (DySpec) are not verified with it.
    fixed_widths: bool = False


#: Tree verifiers reported for a tree draft (and for a chain seen as a width-1 tree), by JSON key.
TREE_VERIFIERS: dict[str, TreeRule] = {
    "multidraft": TreeRule(multidraft_kernel),
    "traversal": TreeRule(traversal_kernel),
    "ordered_traversal": TreeRule(ordered_traversal_kernel, fixed_widths=True),
    # K-SEQ runs the residual rule at swor / topk nodes, so it is reported for i.i.d. trees only.
    "kseq": TreeRule(kseq_kernel, (Draw.IID,), fixed_widths=True),
}


def tree_verifiers(draw: Draw | str) -> dict[str, TreeKernel]:
    """The tree verifiers that apply to trees drawn ``draw``, by JSON key."""
    kind = Draw.parse(draw)
    return {name: rule.kernel for name, rule in TREE_VERIFIERS.items() if kind in rule.draws}


def _entry(law: OutputLaw) -> dict[str, Any]:
    return {
        "expected_length": law.expected_length,
        "completion_error": law.completion_error,
        "drafts_enumerated": law.n_drafts,
    }


def _as_trees(drafts: Sequence[DraftChain]) -> list[TreeDraft]:
    """The same chains as width-1 trees drawn i.i.d. (for the tree verifiers)."""
    return [TreeDraft(DraftTree.chain(d.ref, d.q_rows, Draw.IID), d.weight, d.p_rows) for d in drafts]


def chain_report(model: ToyModel, n: int) -> dict[str, Any]:
    """Verifiers and LP limit for a chain of ``n`` draft tokens (chains enumerated once)."""
    drafts = chain_drafts(model, n)
    report: dict[str, Any] = {name: _entry(output_law(model, drafts, fn)) for name, fn in CHAIN_VERIFIERS.items()}
    trees = _as_trees(drafts)
    report.update({name: _entry(output_law(model, trees, fn)) for name, fn in tree_verifiers(Draw.IID).items()})
    report["lp"] = {"expected_length": lp_limit(model, drafts).expected_length}
    return report


def tree_report(model: ToyModel, widths: Sequence[int], draw: Draw | str) -> dict[str, Any]:
    """Tree verifiers and LP limit for a fixed tree shape (trees enumerated once)."""
    drafts = tree_drafts(model, widths, draw)
    report: dict[str, Any] = {name: _entry(output_law(model, drafts, fn)) for name, fn in tree_verifiers(draw).items()}
    report["lp"] = {"expected_length": lp_limit(model, drafts).expected_length}
    return report


def render(report: dict[str, Any], title: str) -> str:
    """The acceptance table: verifier, E[tokens/step], % of the LP limit, completion error."""
    limit = float(report["lp"]["expected_length"])
    rows = []
    for name, entry in report.items():
        if name == "lp":
            continue
        length = float(entry["expected_length"])
        rows.append([name, f"{length:.6f}", f"{100 * length / limit:.2f}%", f"{entry['completion_error']:.1e}"])
    rows.append(["LP limit", f"{limit:.6f}", "100.00%", "-"])
    return format_table(["verifier", "E[tokens/step]", "% of LP", "completion err"], rows, title=title)


def random_model(vocab: int, depth: int, seed: int) -> ToyModel:
    """The built-in random model of ``--random V --seed S``."""
    if vocab < 1:
        raise ValueError(f"--random needs V >= 1, got {vocab}")
    return ToyModel.random(vocab, depth, np.random.default_rng(seed), name=f"random(V={vocab}, seed={seed})")
