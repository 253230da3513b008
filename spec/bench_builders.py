"""Which tree builder buys most, where: E[tokens/step] per builder and budget, next to the LP limit.

Two families of toy models with V = 4 (rows per prefix up to depth 2, shared
rows below; target row = 0.6 · draft row + 0.4 · an independent row):

* ``peaked``: Dirichlet(0.3) rows — the draft is confident;
* ``flat``: Dirichlet(3) rows — the draft spreads its mass.

For budgets 4, 8, 16 and 32 every builder (paper defaults; fixed = width 2
without replacement, chain = i.i.d.) is scored with residual (multidraft)
and Traversal verification: exactly where the builder's randomness
enumerates in 3 000 runs (then also the LP limit of its draft law), else by
Monte Carlo over 400 sampled trees (95% interval half-width reported).
Results are averaged over ``MODELS`` models per family.  Run as
``tmc bench builders`` (``--json``, ``--seed``).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import numpy as np

from spec.acceptance import builder_report, random_stationary_model
from spec.builders import BUILDERS
from tmc.commands.table import format_table

BUDGETS = (4, 8, 16, 32)
FAMILIES = {"peaked": 0.3, "flat": 3.0}
MODELS = 3
VERIFIERS = ("multidraft", "traversal")


def run_builder_bench(budgets: tuple[int, ...] = BUDGETS, n_models: int = MODELS, seed: int = 0,
                      samples: int = 400, max_runs: int = 3000, progress: Any = None) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    for family, conc in FAMILIES.items():
        ms = [random_stationary_model(4, seed * 100 + k, concentration=conc, agreement=0.6, zero_prob=0.0,
                                      name=f"{family}-{k}") for k in range(n_models)]
        for budget in budgets:
            for name in BUILDERS:
                # each model's trees from a seed of its own (builder_report's tree_rng stream of it, apart from the
                # words that set the model's rows): the mean's interval below adds the three as independent
                reps = [builder_report(m, name, budget, list(VERIFIERS), samples=samples, seed=seed * 100 + k,
                                       max_runs=max_runs) for k, m in enumerate(ms)]
                row: dict[str, Any] = {"family": family, "budget": budget, "builder": name,
                                       "exact": all(r["exact"] for r in reps),
                                       "mean_trees": float(np.mean([r["trees"] for r in reps]))}
                for v in VERIFIERS:
                    vals = [next(e for e in r["entries"] if e["verifier"] == v) for r in reps]
                    row[v] = float(np.mean([e["expected_length"] for e in vals]))
                    halves = [(e["ci95"][1] - e["ci95"][0]) / 2 for e in vals if "ci95" in e]
                    row[f"{v}_ci95_half"] = float(np.sqrt(np.sum(np.square(halves))) / len(vals)) if halves else 0.0
                lps = [r["lp"]["expected_length"] for r in reps if r["lp"]]
                row["lp"] = float(np.mean(lps)) if len(lps) == len(reps) else None
                rows.append(row)
                if progress:
                    progress(f"  {family} budget {budget} {name}: traversal {row['traversal']:.3f}")
    return {"budgets": list(budgets), "models_per_family": n_models, "rows": rows}


def _models(n: int) -> str:
    return f"{n} model" + ("" if n == 1 else "s")


def render(report: dict[str, Any]) -> str:
    out = []
    for family in FAMILIES:
        table = []
        for r in report["rows"]:
            if r["family"] != family:
                continue
            def cell(v: str) -> str:
                half = r[f"{v}_ci95_half"]
                return f"{r[v]:.3f}" + (f" ±{half:.3f}" if half else "")
            lp = f"{r['lp']:.3f}" if r["lp"] else "-"
            # rounded, then + 0.0: a Traversal length equal to its LP limit up to rounding printed "-0.0%"
            gap = f"{round(100 * (1 - r['traversal'] / r['lp']), 1) + 0.0:.1f}%" if r["lp"] else "-"
            table.append([str(r["budget"]), r["builder"], cell("multidraft"), cell("traversal"), lp, gap,
                          "exact" if r["exact"] else "MC"])
        out.append(format_table(["budget", "builder", "residual", "traversal", "LP", "traversal below LP", "how"],
                                table, title=f"{family} draft (V = 4, mean of {_models(report['models_per_family'])}): E[tokens/step]"))
    return "\n\n".join(out)


def bench(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    """``tmc bench builders``."""
    print("scoring every builder on peaked and flat toy drafts, budgets 4-32 ...", file=sys.stderr)
    report = run_builder_bench(seed=args.seed, progress=lambda m: print(m, file=sys.stderr))
    return report, render(report)
