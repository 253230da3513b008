"""Kernel benchmark: time per verification step of SpS, ASpS and block.

Printed, never asserted (DESIGN.md §9).  All three kernels are timed side by
side in one run on the same inputs, and reported as microseconds per step and
as a ratio to SpS, so machine noise affects them alike.  Inputs are a random
target and a draft close to it over ``V = 32000`` tokens, with the draft chain
sampled from the draft; the times include input validation.
"""

from __future__ import annotations

import json
import os
import platform
import timeit
from functools import partial
from collections.abc import Sequence
from typing import Any

import numpy as np

from tmc.chain import asps_kernel, block_kernel, sps_kernel
from tmc.report import format_table
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


def hardware() -> str:
    """One line naming the machine the figures were taken on."""
    return f"{platform.machine()} {platform.processor() or 'cpu'}, {os.cpu_count()} cores, python {platform.python_version()}, numpy {np.__version__}"


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


def write_json(report: dict[str, Any], path: str) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(report, fh, indent=2)
