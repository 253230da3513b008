"""Tests of :mod:`spec.bench_masks` (DySpec App. C, Table 5: non-empty 32x32 blocks of the tree mask).

The paper's Table 5 reports, for random trees of 256/512/1024/2048 nodes, 36, 135.5, 490.2 and
1654.5 non-empty blocks without reordering and 22.5, 52.8, 119.3, 278.7 after its reordering.
What is asserted here is the method's claim (depth-first layout needs fewer blocks than
breadth-first and than construction order once trees are large), not the exact numbers, plus
facts that follow from the construction: in index order the mask is lower triangular, so 256
nodes give at most 8 * 9 / 2 = 36 blocks, and random recursive trees fill almost all of them.
"""

from __future__ import annotations

import numpy as np
import pytest

from spec.bench_masks import ORDERS, SIZES, block_counts, render, run_mask_bench
from spec.tree import random_tree
from tmc.multidraft import DraftTree

ROW_KEYS = {
    "family",
    "size",
    "trees",
    "mean_depth",
    "blocks_index",
    "blocks_bfs",
    "blocks_dfs",
    "bfs_over_dfs",
    "index_over_dfs",
}


def mean_counts(size: int, trees: int, seed: int) -> dict[str, float]:
    rng = np.random.default_rng(seed)
    counts = [block_counts(random_tree(size, rng)) for _ in range(trees)]
    return {name: float(np.mean([c[name] for c in counts])) for name in ORDERS}


def test_constants() -> None:
    assert SIZES == (256, 512, 1024, 2048)
    assert ORDERS == ("index", "bfs", "dfs")


def test_block_counts_hand_tree() -> None:
    # parents (-1, -1, 0, 0, 1, 3); DFS order 0, 2, 3, 5, 1, 4; BFS order = index order.
    # 2x2 tiles: index-order mask rows 100000 010000 101000 100100 010010 100101 -> 6 tiles,
    # DFS-order rows 100000 110000 101000 101100 000010 000011 -> 4 tiles.
    tree = DraftTree((-1, -1, 0, 0, 1, 3), (5, 7, 1, 2, 1, 3), ("topk",) * 6, {}, 8)
    assert block_counts(tree, 2) == {"index": 6, "bfs": 6, "dfs": 4}
    assert block_counts(tree) == {"index": 1, "bfs": 1, "dfs": 1}  # one 32x32 tile
    assert block_counts(DraftTree((), (), (), {}, 3)) == {"index": 0, "bfs": 0, "dfs": 0}


def test_chain_and_star_block_counts() -> None:
    # a chain of 64: the mask is the full lower triangle in every order -> 2 * 3 / 2 = 3 tiles
    chain = DraftTree((-1,) + tuple(range(63)), (0,) * 64, ("topk",) * 64, {}, 2)
    assert block_counts(chain) == {"index": 3, "bfs": 3, "dfs": 3}
    # a star of 64: the identity in every order -> 2 diagonal tiles
    star = DraftTree((-1,) * 64, tuple(range(64)), ("topk",) * 64, {}, 64)
    assert block_counts(star) == {"index": 2, "bfs": 2, "dfs": 2}


def test_index_order_256_is_near_the_papers_36() -> None:
    m = mean_counts(256, 4, seed=1)
    assert 34.0 <= m["index"] <= 36.0  # 36 is the lower-triangular maximum and the paper's figure
    assert m["dfs"] < m["index"]


@pytest.mark.parametrize("size", [512, 1024])
def test_dfs_needs_fewer_blocks(size: int) -> None:
    m = mean_counts(size, 3, seed=size)
    assert m["dfs"] < m["bfs"]
    assert m["dfs"] < m["index"]
    tiles = size // 32
    assert m["index"] <= tiles * (tiles + 1) / 2


def test_run_mask_bench_rows() -> None:
    messages: list[str] = []
    report = run_mask_bench(sizes=(256,), trees=2, progress=messages.append)
    assert report["block"] == 32
    rows = report["rows"]
    assert [r["family"] for r in rows] == ["random", "dyspec"]
    for r in rows:
        assert set(r) == ROW_KEYS
        assert r["size"] == 256
        assert r["trees"] == 2
        assert r["mean_depth"] >= 1.0
        for name in ORDERS:
            # at least the 8 diagonal tiles are non-empty; at most the lower triangle in index order
            assert 8.0 <= r[f"blocks_{name}"] <= 64.0
        assert r["blocks_index"] <= 36.0
        assert r["bfs_over_dfs"] == pytest.approx(r["blocks_bfs"] / r["blocks_dfs"])
        assert r["index_over_dfs"] == pytest.approx(r["blocks_index"] / r["blocks_dfs"])
    assert len(messages) == 2
    assert "random" in messages[0] and "256" in messages[0]
    # reproducible from the seed
    again = run_mask_bench(sizes=(256,), trees=2)
    assert again == report


def test_run_mask_bench_averages_every_tree() -> None:
    # the random family draws its trees first from default_rng(seed), one random_tree per tree
    rng = np.random.default_rng(5)
    trees = [random_tree(256, rng) for _ in range(3)]
    counts = [block_counts(t) for t in trees]
    row = run_mask_bench(sizes=(256,), trees=3, seed=5)["rows"][0]
    assert row["family"] == "random"
    for name in ORDERS:
        assert row[f"blocks_{name}"] == pytest.approx(np.mean([c[name] for c in counts]))
    assert row["mean_depth"] == pytest.approx(np.mean([t.depth() for t in trees]))


def test_run_mask_bench_random_family_ratios_512() -> None:
    report = run_mask_bench(sizes=(512,), trees=2, seed=3)
    random_row = next(r for r in report["rows"] if r["family"] == "random")
    assert random_row["bfs_over_dfs"] > 1.0
    assert random_row["index_over_dfs"] > 1.0


def test_run_mask_bench_block_size() -> None:
    report = run_mask_bench(sizes=(64,), trees=1, block=64)
    assert report["block"] == 64
    for r in report["rows"]:
        assert r["blocks_index"] == r["blocks_bfs"] == r["blocks_dfs"] == 1.0  # one tile holds the tree


def test_render_contains_columns() -> None:
    report = run_mask_bench(sizes=(256,), trees=2)
    text = render(report)
    for column in ("trees", "nodes", "depth", "index order", "BFS", "DFS", "BFS / DFS"):
        assert column in text
    assert "32x32" in text
    assert "random" in text and "dyspec" in text
    assert "256" in text
    r = report["rows"][0]
    assert f"{r['blocks_dfs']:.1f}" in text
    assert f"{r['bfs_over_dfs']:.2f}x" in text
