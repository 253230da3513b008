"""DySpec App. C: non-empty ``b × b`` blocks of the tree attention mask, by node order.

A block-sparse attention kernel pays per non-empty block of the mask.  This
benchmark lays trees of 256–2048 nodes out in their construction (index)
order, breadth first and depth first, and counts the non-empty 32 × 32 blocks
of the tree part of the mask (the past is dense in every order, so it is left
out, as in the paper's Table 5).  Two tree families:

* ``random``: random recursive trees (each node below a uniform earlier node);
* ``dyspec``: DySpec Alg. 1 trees grown on a synthetic draft
  (:class:`spec.draft.HashedDraft`, V = 64, Dirichlet(0.3) rows).

Run as ``tmc bench masks`` (``--json`` for the figures, ``--seed``).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import numpy as np

from spec.builders import DySpecBuilder
from spec.draft import HashedDraft
from spec.tree import bfs_order, dfs_order, mask_blocks, random_tree, tree_mask
from tmc.commands.table import format_table
from tmc.multidraft import DraftTree

SIZES = (256, 512, 1024, 2048)
ORDERS = ("index", "bfs", "dfs")


def block_counts(tree: DraftTree, block: int = 32) -> dict[str, int]:
    """Non-empty blocks of the tree mask in each order."""
    orders = {"index": None, "bfs": bfs_order(tree), "dfs": dfs_order(tree)}
    return {name: mask_blocks(tree_mask(tree, order), block) for name, order in orders.items()}


def run_mask_bench(sizes: tuple[int, ...] = SIZES, trees: int = 5, block: int = 32, seed: int = 0,
                   progress: Any = None) -> dict[str, Any]:
    """Mean block counts per tree family, size and order."""
    rng = np.random.default_rng(seed)
    rows: list[dict[str, Any]] = []
    for family in ("random", "dyspec"):
        for size in sizes:
            counts: dict[str, list[int]] = {name: [] for name in ORDERS}
            depths = []
            for k in range(trees):
                if family == "random":
                    tree = random_tree(size, rng)
                else:
                    tree = DySpecBuilder().build(HashedDraft(64, seed=(seed * 1000 + k) % 2**64), size, rng)
                depths.append(tree.depth())
                for name, c in block_counts(tree, block).items():
                    counts[name].append(c)
            means = {name: float(np.mean(v)) for name, v in counts.items()}
            rows.append({"family": family, "size": size, "trees": trees, "mean_depth": float(np.mean(depths)),
                         **{f"blocks_{n}": means[n] for n in ORDERS},
                         "bfs_over_dfs": means["bfs"] / means["dfs"], "index_over_dfs": means["index"] / means["dfs"]})
            if progress:
                progress(f"  {family} trees of {size} nodes: dfs {means['dfs']:.1f} blocks, bfs {means['bfs']:.1f}")
    return {"block": block, "rows": rows}


def render(report: dict[str, Any]) -> str:
    table = [[r["family"], str(r["size"]), f"{r['mean_depth']:.1f}", f"{r['blocks_index']:.1f}",
              f"{r['blocks_bfs']:.1f}", f"{r['blocks_dfs']:.1f}", f"{r['bfs_over_dfs']:.2f}x"] for r in report["rows"]]
    return format_table(["trees", "nodes", "depth", "index order", "BFS", "DFS", "BFS / DFS"], table,
                        title=f"non-empty {report['block']}x{report['block']} blocks of the tree mask (mean over trees)")


def bench(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    """``tmc bench masks``."""
    print("counting mask blocks for trees of 256-2048 nodes ...", file=sys.stderr)
    report = run_mask_bench(seed=args.seed, progress=lambda m: print(m, file=sys.stderr))
    return report, render(report)
