"""Benchmarks of ``tmc bench``: kernel time per step, exact enumeration and LP timings.

Printed, never asserted (DESIGN.md §9).  All three kernels are timed side by
side in one run on the same inputs, and reported as microseconds per step and
as a ratio to SpS, so machine noise affects them alike.  Inputs are a random
target and a draft close to it over ``V = 32000`` tokens, with the draft chain
sampled from the draft; the times include input validation.
"""

from __future__ import annotations

import os
import platform
import timeit
from functools import partial
from collections.abc import Sequence
from typing import Any

import numpy as np

from tmc.chain import asps_kernel, block_kernel, sps_kernel
from tmc.commands.table import format_table
from tmc.validate import FloatArray

KERNELS = {"sps": sps_kernel, "asps": asps_kernel, "block": block_kernel}


def _softmax_rows(logits: FloatArray) -> FloatArray:
    x = np.exp(logits - logits.max(axis=1, keepdims=True))
    out: FloatArray = x / x.sum(axis=1, keepdims=True)
    return out


def _inputs(n: int, vocab: int, rng: np.random.Generator) -> tuple[Any, FloatArray, FloatArray]:
    logits = 4.0 * rng.standard_normal((n + 1, vocab))
    p = _softmax_rows(logits)
    q = _softmax_rows(logits[:n] + 0.5 * rng.standard_normal((n, vocab)))
    ref = np.array([rng.choice(vocab, p=q[i]) for i in range(n)], dtype=np.int64)
    return ref, q, p


def cpu_name() -> str:
    """The processor and its core count, e.g. ``"AMD EPYC, 2 cores"``: Linux's ``/proc/cpuinfo`` model name where
    there is one (``platform.processor()`` is empty on Linux), else ``platform.processor()`` or the machine type."""
    name = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as info:
            name = next((line.split(":", 1)[1].strip() for line in info if line.startswith("model name")), "")
    except OSError:
        pass
    return f"{name or platform.processor() or platform.machine() or 'cpu'}, {os.cpu_count()} cores"


def hardware() -> str:
    """One line naming the machine the figures were taken on."""
    return f"{platform.machine()} {cpu_name()}, python {platform.python_version()}, numpy {np.__version__}"


def run_kernel_bench(
    ns: Sequence[int] = (1, 4, 16, 64), vocab: int = 32000, repeat: int = 5, seed: int = 0
) -> dict[str, Any]:
    """Best-of-``repeat`` time per kernel call for each chain length ``n``."""
    rng = np.random.default_rng(seed)
    results: list[dict[str, Any]] = []
    for n in ns:
        ref, q, p = _inputs(n, vocab, rng)
        row: dict[str, Any] = {"n": n, "vocab": vocab}
        for name, fn in KERNELS.items():
            timer = timeit.Timer(partial(fn, ref, q, p))
            number = max(1, int(0.2 / max(timer.timeit(1), 1e-6)))
            row[f"{name}_us"] = 1e6 * min(timer.repeat(repeat, number)) / number
        results.append(row)
    return {"hardware": hardware(), "repeat": repeat, "results": results}


def render(report: dict[str, Any]) -> str:
    rows = [
        [
            r["n"],
            r["vocab"],
            f"{r['sps_us']:.0f}",
            f"{r['asps_us']:.0f}",
            f"{r['block_us']:.0f}",
            f"{r['asps_us'] / r['sps_us']:.2f}",
            f"{r['block_us'] / r['sps_us']:.2f}",
        ]
        for r in report["results"]
    ]
    head = ["n", "V", "SpS µs", "ASpS µs", "block µs", "ASpS/SpS", "block/SpS"]
    return format_table(head, rows, title=f"Kernel time per step ({report['hardware']})")


def _timed(fn: Any) -> tuple[Any, float]:
    start = timeit.default_timer()
    out = fn()
    return out, timeit.default_timer() - start


def run_exact_bench(seed: int = 0) -> dict[str, Any]:
    """Wall time of the exact computations named in issue #3 (one core, one run each)."""
    from tmc.drafts import tree_drafts
    from tmc.enumeration import chain_output_law, tree_output_law
    from tmc.lp import chain_optimal_length, optimal_length
    from tmc.toy import ToyModel

    rng = np.random.default_rng(seed)
    rows: list[dict[str, Any]] = []
    chain_model = ToyModel.random(4, 6, rng, zero_prob=0.0)
    for name, fn in (("sps", sps_kernel), ("asps", asps_kernel)):
        law, secs = _timed(partial(chain_output_law, chain_model, 6, fn))
        rows.append({"task": f"E[len] {name}, all chains V=4 n=6", "cases": law.n_drafts, "value": law.expected_length, "seconds": secs})
    tree_model = ToyModel.random(3, 3, rng, zero_prob=0.0)
    for draw in ("iid", "swor", "topk"):
        law, secs = _timed(partial(tree_output_law, tree_model, [2, 2, 1], draw))
        rows.append({"task": f"E[len] multidraft, trees V=3 widths 2,2,1 {draw}", "cases": law.n_drafts, "value": law.expected_length, "seconds": secs})
    lp_model = ToyModel.random(3, 3, rng, zero_prob=0.0)
    res, secs = _timed(partial(chain_optimal_length, lp_model, 3))
    rows.append({"task": "LP limit, chains V=3 n=3", "cases": res.n_variables, "value": res.expected_length, "seconds": secs})
    for draw in ("iid", "swor"):
        outcomes = tree_drafts(lp_model, [2, 1], draw)
        res, secs = _timed(partial(optimal_length, lp_model, outcomes))
        rows.append({"task": f"LP limit, trees V=3 widths 2,1 {draw}", "cases": res.n_variables, "value": res.expected_length, "seconds": secs})
    return {"hardware": hardware(), "results": rows}


def render_exact(report: dict[str, Any]) -> str:
    rows = [[r["task"], r["cases"], f"{r['value']:.6f}", f"{r['seconds']:.3f}"] for r in report["results"]]
    head = ["computation", "drafts / LP vars", "value", "seconds"]
    return format_table(head, rows, title=f"Exact enumeration and LP timings ({report['hardware']})")


#: The fixed benchmark set of ``tmc bench gap``: shapes (children per node at each depth).
GAP_SHAPES: tuple[tuple[int, ...], ...] = ((2,), (3,), (2, 1), (1, 2), (2, 2), (2, 1, 1))
GAP_VOCABS: tuple[int, ...] = (3, 4)
GAP_MODELS = 20  # random toy models per (V, shape), seeds 0..GAP_MODELS-1


def run_gap_bench(
    vocabs: Sequence[int] = GAP_VOCABS,
    models: int = GAP_MODELS,
    shapes: Sequence[tuple[int, ...]] = GAP_SHAPES,
    progress: Any = None,
    seed: int = 0,
) -> dict[str, Any]:
    """Each tree verifier's expected length as % below the LP limit on a fixed set of toy models.

    Model ``s`` of vocabulary ``V`` is ``ToyModel.random(V, depth, s)``
    (exact zeros with probability 0.2, Dirichlet(1) rows), ``s = seed..seed+models-1``;
    every draw kind, every verifier that applies to it.  Drafts are enumerated
    once per (model, shape, draw) and shared by the verifiers and the LP.
    """
    from tmc.commands.acceptance import tree_verifiers
    from tmc.drafts import tree_drafts
    from tmc.laws import output_law
    from tmc.lp import lp_limit
    from tmc.multidraft import ALL_DRAWS
    from tmc.toy import ToyModel

    rows: list[dict[str, Any]] = []
    for vocab in vocabs:
        for shape in shapes:
            for draw in ALL_DRAWS:
                start = timeit.default_timer()
                gaps: dict[str, list[float]] = {name: [] for name in tree_verifiers(draw)}
                for s in range(seed, seed + models):
                    model = ToyModel.random(vocab, len(shape), s)
                    drafts = tree_drafts(model, shape, draw)
                    limit = lp_limit(model, drafts).expected_length
                    for name, kernel in tree_verifiers(draw).items():
                        length = output_law(model, drafts, kernel).expected_length
                        gaps[name].append(100.0 * (limit - length) / limit)
                row: dict[str, Any] = {"vocab": vocab, "shape": list(shape), "draw": draw.value, "models": models}
                for name, values in gaps.items():
                    row[name] = {"mean_pct_below_lp": float(np.mean(values)), "max_pct_below_lp": float(np.max(values))}
                rows.append(row)
                if progress is not None:
                    progress(f"V={vocab} {shape} {draw.value}: {timeit.default_timer() - start:.1f} s")
    return {"hardware": hardware(), "models_per_shape": models, "model_seeds": [seed, seed + models - 1], "results": rows}


def _pct(x: float) -> str:
    """Two decimals; LP round-off (|x| < 1e-4 %) shows as 0.00 rather than -0.00."""
    return f"{0.0 if abs(x) < 1e-4 else x:.2f}"


def render_gap(report: dict[str, Any]) -> str:
    fixed = ("vocab", "shape", "draw", "models")
    names = list(dict.fromkeys(k for r in report["results"] for k in r if k not in fixed))  # report order
    table = []
    for r in report["results"]:
        cells = [f"{_pct(r[n]['mean_pct_below_lp'])} / {_pct(r[n]['max_pct_below_lp'])}" if n in r else "-" for n in names]
        table.append([f"V={r['vocab']}", ",".join(map(str, r["shape"])), r["draw"], *cells])
    title = f"% below the LP limit, mean / max over {report['models_per_shape']} random models per row"
    return format_table(["V", "shape", "draw", *names], table, title=title)
