"""The built-in demo: the TMC paper's toy example and a random toy model.

``tmc demo`` prints the joint (draft, output) tables of SpS and ASpS on the
paper's toy example in the layout of its Tables 2 and 3, the exact expected
output lengths of SpS, ASpS and block verification with a chain of 2, and the
same comparison on a random V = 4, n = 4 model.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np

from tmc.chain import asps_kernel, block_kernel, sps_kernel
from tmc.enumeration import ChainKernel, chain_joint_law, chain_output_law
from tmc.commands.table import format_table
from tmc.toy import Path, ToyModel, paper_toy_model

LETTERS = "abc"
#: Columns and rows of the paper's Tables 2–3: drafts that start with ``a``
#: are shown in full, the others by their first token; outputs are shown to
#: two tokens, ``aτ`` being the output ``a`` alone.
PAPER_DRAFT_COLUMNS = ["aa", "ab", "ac", "b", "c"]
PAPER_OUTPUT_ROWS = ["aa", "ab", "ac", "aτ", "b", "c"]


def _draft_column(draft: Path) -> str:
    word = "".join(LETTERS[t] for t in draft)
    return word if word.startswith("a") else word[:1]


def _output_row(output: Path) -> str:
    word = "".join(LETTERS[t] for t in output)
    if word.startswith("a"):
        return word[:2] if len(word) >= 2 else "aτ"
    return word[:1]


def paper_joint_table(kernel_fn: ChainKernel) -> dict[tuple[str, str], float]:
    """Joint (output row, draft column) probabilities in the paper's layout, n = 2."""
    table: dict[tuple[str, str], float] = defaultdict(float)
    for (draft, output), prob in chain_joint_law(paper_toy_model(), 2, kernel_fn).items():
        table[(_output_row(output), _draft_column(draft))] += prob
    return dict(table)


def _lengths(model: ToyModel, n: int) -> dict[str, dict[str, float]]:
    """Exact expected output length and completion error of SpS, ASpS and block on chains of ``n``."""
    out = {}
    for label, fn in (("SpS", sps_kernel), ("ASpS", asps_kernel), ("block", block_kernel)):
        law = chain_output_law(model, n, fn)
        out[label] = {"expected_length": float(law.expected_length), "completion_error": float(law.completion_error)}
    return out


def demo_report(seed: int = 0) -> dict[str, Any]:
    """The demo's figures (``tmc demo --json``): the paper's joint tables (output row → draft column →
    probability, the rows and columns of its Tables 2–3) and the exact lengths, then the random model's."""
    model = ToyModel.random(4, 4, np.random.default_rng(seed), name=f"random(V=4, seed={seed})")
    tables = {}
    for key, fn in (("sps", sps_kernel), ("asps", asps_kernel)):
        table = paper_joint_table(fn)
        tables[key] = {out: {col: table.get((out, col), 0.0) for col in PAPER_DRAFT_COLUMNS} for out in PAPER_OUTPUT_ROWS}
    return {
        "paper": {"vocab": list(LETTERS), "n": 2, "joint_tables": tables, "lengths": _lengths(paper_toy_model(), 2)},
        "random": {"name": model.name, "seed": seed, "vocab": 4, "n": 4, "lengths": _lengths(model, 4)},
    }


def _render_lengths(lengths: dict[str, dict[str, float]], title: str) -> str:
    rows = [[label, f"{v['expected_length']:.6f}", f"{v['completion_error']:.1e}"] for label, v in lengths.items()]
    return format_table(["verifier", "E[tokens/step]", "completion err"], rows, title=title)


def render_demo(report: dict[str, Any]) -> str:
    """The demo's text from :func:`demo_report`."""
    paper, rand = report["paper"], report["random"]
    joint = []
    for key, name in (("sps", "SpS joint law (paper Table 2)"), ("asps", "ASpS joint law (paper Table 3)")):
        table = paper["joint_tables"][key]
        rows = [[out] + [f"{table[out][col]:.3f}" for col in PAPER_DRAFT_COLUMNS] for out in PAPER_OUTPUT_ROWS]
        joint += [format_table(["output \\ draft"] + PAPER_DRAFT_COLUMNS, rows, title=name), ""]
    return "\n".join([
        "TMC paper toy example (vocabulary {a, b, c}, chain of n = 2 draft tokens)",
        "",
        *joint,
        _render_lengths(paper["lengths"], "Exact expected output length (accepted + corrected/bonus token)"),
        "",
        _render_lengths(rand["lengths"], f"Random toy model V = 4, n = 4 (seed {rand['seed']}), all 256 draft chains enumerated"),
    ])


def run_demo(seed: int = 0) -> str:
    """Return the demo's text."""
    return render_demo(demo_report(seed))
