"""Benchmark of the batch samplers against the scalar ones (printed, never asserted).

``p`` is the target's law and ``q`` the draft's (DESIGN.md §3); ``p_rows`` / ``q_rows`` hold their rows.

DESIGN.md §5 asks for ≥ 10^5 verification steps per second per verifier on
``V <= 8`` on one core.  For each verifier (SpS, ASpS, block, multi-draft
trees of every draw kind) and each vocabulary size and draft shape, this
times one batch call on ``trials`` pre-drawn rows of uniforms (best of
``repeat``, input validation included, noise generation excluded) and the
scalar ``*_sample_from_uniforms`` on ``scalar_steps`` of the same rows, side
by side in one run, and reports steps per second and the speed-up.  A
``draft+sps`` row times whole speculative steps (draft chain from a toy
model, then SpS) against the scalar draft-then-verify loop.

The batch code is plain numpy elementwise work, which numpy runs on one
thread; the figures are one-core figures.  Inputs: random rows with exact
zeros (:func:`tmc.toy.random_row`, ``p`` independent of ``q``), draft tokens
drawn from ``q``; draft trees drawn by :func:`tmc.drafts.sample_tree_draft`
(the one place drafts are sampled), with the target rows it records.

Registered as ``tmc bench batch`` through the ``tmc.benchmarks`` entry-point
group (:func:`bench`).
"""

from __future__ import annotations

import argparse
import timeit
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from tmc.chain import asps_sample_from_uniforms, block_sample_from_uniforms, sps_sample_from_uniforms
from tmc.commands.bench import hardware
from tmc.commands.table import format_table
from tmc.drafts import check_widths, sample_tree_draft
from tmc.multidraft import ALL_DRAWS, multidraft_sample_from_uniforms
from tmc.noise import categorical
from tmc.toy import Path, ToyModel, random_row
from tmc.validate import FloatArray, check_int
from verification.batch import (
    asps_batch,
    block_batch,
    multidraft_batch,
    speculative_step_batch,
    sps_batch,
)

GOAL_STEPS_PER_S = 1e5  # DESIGN.md §5, per verifier on V <= 8, one core

_CHAIN = {
    "sps": (sps_batch, sps_sample_from_uniforms),
    "asps": (asps_batch, asps_sample_from_uniforms),
    "block": (block_batch, block_sample_from_uniforms),
}


def _best_seconds(fn: Callable[[], object], repeat: int) -> float:
    return min(timeit.repeat(fn, number=1, repeat=repeat))


def _row(verifier: str, vocab: int, shape: str, trials: int, batch_s: float, scalar_steps: int, scalar_s: float) -> dict[str, Any]:
    batch_rate = trials / batch_s
    scalar_rate = scalar_steps / scalar_s
    return {
        "verifier": verifier,
        "vocab": vocab,
        "shape": shape,
        "trials": trials,
        "batch_steps_per_s": batch_rate,
        "scalar_steps_per_s": scalar_rate,
        "speedup": batch_rate / scalar_rate,
        "meets_goal": batch_rate >= GOAL_STEPS_PER_S,
    }


def _chain_inputs(vocab: int, n: int, rng: np.random.Generator) -> tuple[list[int], FloatArray, FloatArray]:
    q = np.array([random_row(vocab, rng) for _ in range(n)]).reshape(n, vocab)
    p = np.array([random_row(vocab, rng) for _ in range(n + 1)])
    ref = [int(rng.choice(vocab, p=q[i])) for i in range(n)]
    return ref, q, p


def _scalar_steps(model: ToyModel, n: int, noise_draft: FloatArray, noise_verify: FloatArray) -> None:
    """The scalar reference of a speculative step: draft by inverse CDF, then SpS."""
    for nd, nv in zip(noise_draft, noise_verify):
        ref: Path = ()
        for i in range(n):
            ref += (categorical(model.q(ref), float(nd[i])),)
        sps_sample_from_uniforms(ref, *model.chain_rows(ref), nv)


def run_batch_bench(
    trials: int = 10**6,
    scalar_steps: int = 2000,
    vocabs: Sequence[int] = (4, 8),
    lengths: Sequence[int] = (1, 4),
    tree_widths: Sequence[int] = (2, 2),
    repeat: int = 3,
    seed: int = 0,
) -> dict[str, Any]:
    """Steps per second of every batch verifier and its scalar sampler, side by side."""
    trials = check_int("trials", trials, minimum=1)
    scalar_steps = check_int("scalar_steps", scalar_steps, minimum=1)
    repeat = check_int("repeat", repeat, minimum=1)
    shape_widths = check_widths(tree_widths)
    seed = check_int("seed", seed, minimum=0)
    rng = np.random.default_rng(seed)
    results: list[dict[str, Any]] = []
    for vocab in vocabs:
        for n in lengths:
            ref, q, p = _chain_inputs(vocab, n, rng)
            for name, (batch, scalar) in _CHAIN.items():
                u = rng.random((trials, 1 if name == "asps" else n + 1))
                batch_s = _best_seconds(lambda: batch(ref, q, p, u), repeat)
                scalar_s = _best_seconds(lambda: [scalar(ref, q, p, row) for row in u[:scalar_steps]], 1)
                results.append(_row(name, vocab, f"n={n}", trials, batch_s, scalar_steps, scalar_s))
            model = ToyModel.random(vocab, n, rng)
            nd, nv = rng.random((trials, n)), rng.random((trials, n + 1))
            batch_s = _best_seconds(lambda: speculative_step_batch(model, n, "sps", nd, nv), repeat)
            scalar_s = _best_seconds(lambda: _scalar_steps(model, n, nd[:scalar_steps], nv[:scalar_steps]), 1)
            results.append(_row("draft+sps", vocab, f"n={n}", trials, batch_s, scalar_steps, scalar_s))
        model = ToyModel.random(vocab, len(shape_widths), rng)
        shape = "tree " + "x".join(str(w) for w in shape_widths)
        for draw in ALL_DRAWS:
            draft = sample_tree_draft(model, shape_widths, draw, rng)
            tree, p_rows = draft.tree, draft.p_rows
            u = rng.random((trials, tree.size + 1))
            batch_s = _best_seconds(lambda: multidraft_batch(tree, p_rows, u), repeat)
            scalar_s = _best_seconds(
                lambda: [multidraft_sample_from_uniforms(tree, p_rows, row) for row in u[:scalar_steps]], 1
            )
            results.append(_row(f"multidraft-{draw.value}", vocab, shape, trials, batch_s, scalar_steps, scalar_s))
    return {
        "hardware": hardware(),
        "seed": seed,
        "trials": trials,
        "scalar_steps": scalar_steps,
        "repeat": repeat,
        "goal_steps_per_s": GOAL_STEPS_PER_S,
        "results": results,
    }


def render(report: dict[str, Any]) -> str:
    """The benchmark as a plain-text table."""
    rows = [
        [
            r["verifier"],
            r["vocab"],
            r["shape"],
            r["trials"],
            f"{r['batch_steps_per_s']:.3g}",
            f"{r['scalar_steps_per_s']:.3g}",
            f"{r['speedup']:.0f}x",
            "yes" if r["meets_goal"] else "NO",
        ]
        for r in report["results"]
    ]
    head = ["verifier", "V", "draft", "trials", "batch steps/s", "scalar steps/s", "speed-up", f"≥{report['goal_steps_per_s']:.0e}"]
    title = f"Batch vs scalar samplers, one core ({report['hardware']})"
    return format_table(head, rows, title=title)


def bench(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    """``tmc bench batch``: the report and its table (uses ``--seed``; ``--n``/``--vocab`` are the kernels')."""
    report = run_batch_bench(seed=args.seed)
    return report, render(report)


if __name__ == "__main__":
    print(render(run_batch_bench()))
