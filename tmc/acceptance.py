"""Exact acceptance lengths of verifiers against the LP limit (``tmc acceptance``).

For a toy model and a draft shape (a chain of ``n`` tokens, or a fixed tree
``widths`` with a draw kind) this computes, by exhaustive enumeration, each
applicable verifier's expected number of tokens per step and its worst
completion-identity error, and the LP limit of DESIGN.md §6: the best
expected length any lossless verifier could reach with the same draft.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path as FilePath
from typing import Any

import numpy as np

from tmc.chain import asps_kernel, block_kernel, sps_kernel
from tmc.enumeration import OutputLaw, chain_output_law, enumerate_draft_trees, tree_output_law
from tmc.lp import DraftOutcome, chain_optimal_length, optimal_length
from tmc.multidraft import Draw
from tmc.report import format_table
from tmc.toy import ToyModel

PAPER_TOY_FILE = FilePath(__file__).with_name("models") / "paper_toy.json"


def load_model(path: str) -> ToyModel:
    """Read a toy model JSON file (format in :mod:`tmc.toy`); ``ValueError`` if malformed."""
    try:
        obj = json.loads(FilePath(path).read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not valid JSON ({err})") from None
    if not isinstance(obj, dict):
        raise ValueError(f"{path}: expected a JSON object with 'vocab', 'draft' and 'target'")
    return ToyModel.from_dict(obj, name=str(obj.get("name", FilePath(path).stem)))


def _entry(law: OutputLaw) -> dict[str, Any]:
    return {
        "expected_length": law.expected_length,
        "completion_error": law.completion_error,
        "drafts_enumerated": law.n_drafts,
    }


def chain_report(model: ToyModel, n: int) -> dict[str, Any]:
    """Verifiers and LP limit for a chain of ``n`` draft tokens."""
    report: dict[str, Any] = {
        name: _entry(chain_output_law(model, n, fn))
        for name, fn in (("sps", sps_kernel), ("asps", asps_kernel), ("block", block_kernel))
    }
    report["multidraft"] = _entry(tree_output_law(model, [1] * n, Draw.IID))
    report["lp"] = {"expected_length": chain_optimal_length(model, n).expected_length}
    return report


def tree_outcomes(model: ToyModel, widths: Sequence[int], draw: Draw | str) -> list[DraftOutcome]:
    """LP draft outcomes of a fixed-shape tree: every tree with its accepted node paths."""
    return [
        DraftOutcome(weight, tuple(tree.path(i) for i in range(-1, tree.size)))
        for weight, tree in enumerate_draft_trees(model, widths, draw)
    ]


def tree_report(model: ToyModel, widths: Sequence[int], draw: Draw | str) -> dict[str, Any]:
    """Multi-draft verification and LP limit for a fixed tree shape."""
    return {
        "multidraft": _entry(tree_output_law(model, widths, draw)),
        "lp": {"expected_length": optimal_length(model, tree_outcomes(model, widths, draw)).expected_length},
    }


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
