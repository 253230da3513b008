"""Tests of :mod:`spec.tree`: orders, tree masks, position ids, KV keep lists, block counts, reorder.

Expected values are written by hand for small trees, or recomputed here by
brute force from ``DraftTree.parents`` alone (ancestor walks, recursive DFS,
layer-by-layer BFS), never read back from :mod:`spec.tree`.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spec.tree import (
    accepted_nodes,
    attention_mask,
    bfs_order,
    check_order,
    dfs_order,
    keep_indices,
    mask_blocks,
    position_ids,
    random_tree,
    reorder,
    tree_mask,
)
from tmc.drafts import sample_tree_draft
from tmc.multidraft import ALL_DRAWS, DraftTree, multidraft_kernel, tree_kernel_outputs
from tmc.ordered_traversal import ordered_traversal_kernel
from tmc.toy import ToyModel
from tmc.traversal import traversal_kernel

# --------------------------------------------------------------------------------------------
# hand trees
# --------------------------------------------------------------------------------------------

# Tree A, parents (-1, -1, 0, 0, 1, 3):
#
#   root
#   ├── 0 (tok 5)
#   │   ├── 2 (tok 1)
#   │   └── 3 (tok 2)
#   │       └── 5 (tok 3)
#   └── 1 (tok 7)
#       └── 4 (tok 1)
A_PARENTS = (-1, -1, 0, 0, 1, 3)
A_TOKENS = (5, 7, 1, 2, 1, 3)
A_DFS = (0, 2, 3, 5, 1, 4)
A_BFS = (0, 1, 2, 3, 4, 5)  # equals the index order for this tree

# Tree B, parents (-1, 0, -1, 1, 2, 0): index order is not breadth first.
#
#   root
#   ├── 0 (tok 0)
#   │   ├── 1 (tok 0)
#   │   │   └── 3 (tok 0)
#   │   └── 5 (tok 1)
#   └── 2 (tok 1)
#       └── 4 (tok 0)
B_PARENTS = (-1, 0, -1, 1, 2, 0)
B_TOKENS = (0, 0, 1, 0, 0, 1)
B_DFS = (0, 1, 3, 5, 2, 4)
B_BFS = (0, 2, 1, 5, 4, 3)


def topk_tree(parents: Sequence[int], tokens: Sequence[int], vocab: int = 8) -> DraftTree:
    return DraftTree(tuple(parents), tuple(tokens), ("topk",) * len(parents), {}, vocab)


TREE_A = topk_tree(A_PARENTS, A_TOKENS)
TREE_B = topk_tree(B_PARENTS, B_TOKENS, vocab=2)
EMPTY = DraftTree((), (), (), {}, 3)


def bits(*rows: str) -> np.ndarray:
    return np.array([[c == "1" for c in r] for r in rows], dtype=bool)


def test_hand_orders() -> None:
    assert dfs_order(TREE_A) == A_DFS
    assert bfs_order(TREE_A) == A_BFS
    assert dfs_order(TREE_B) == B_DFS
    assert bfs_order(TREE_B) == B_BFS
    # a chain: every order is the index order
    chain = topk_tree((-1, 0, 1, 2), (1, 2, 3, 4))
    assert dfs_order(chain) == bfs_order(chain) == (0, 1, 2, 3)
    # a star: both orders are the verification (index) order of the root's children
    star = topk_tree((-1,) * 5, (0, 1, 2, 3, 4))
    assert dfs_order(star) == bfs_order(star) == (0, 1, 2, 3, 4)


def test_orders_return_plain_int_tuples() -> None:
    for order in (dfs_order(TREE_B), bfs_order(TREE_B), check_order(TREE_B, np.array(B_DFS))):
        assert isinstance(order, tuple)
        assert all(type(x) is int for x in order)


def test_check_order_hand() -> None:
    assert check_order(TREE_A, None) == (0, 1, 2, 3, 4, 5)
    assert check_order(TREE_A, list(A_DFS)) == A_DFS
    assert check_order(TREE_A, np.array(A_DFS, dtype=np.int32)) == A_DFS
    assert check_order(TREE_A, [0.0, 2.0, 3.0, 5.0, 1.0, 4.0]) == A_DFS  # integral floats are fine


def test_tree_mask_hand_index_order() -> None:
    expected = bits(
        "100000",  # 0
        "010000",  # 1
        "101000",  # 2: 0, 2
        "100100",  # 3: 0, 3
        "010010",  # 4: 1, 4
        "100101",  # 5: 0, 3, 5
    )
    got = tree_mask(TREE_A)
    assert got.dtype == np.bool_
    assert got.shape == (6, 6)
    np.testing.assert_array_equal(got, expected)


def test_tree_mask_hand_dfs_order() -> None:
    # positions hold nodes 0, 2, 3, 5, 1, 4
    expected = bits(
        "100000",  # node 0
        "110000",  # node 2: 0, 2
        "101000",  # node 3: 0, 3
        "101100",  # node 5: 0, 3, 5
        "000010",  # node 1
        "000011",  # node 4: 1, 4
    )
    np.testing.assert_array_equal(tree_mask(TREE_A, A_DFS), expected)


def test_tree_mask_hand_tree_b_bfs_order() -> None:
    # positions hold nodes 0, 2, 1, 5, 4, 3
    expected = bits(
        "100000",  # node 0
        "010000",  # node 2
        "101000",  # node 1: 0, 1
        "100100",  # node 5: 0, 5
        "010010",  # node 4: 2, 4
        "101001",  # node 3: 0, 1, 3
    )
    np.testing.assert_array_equal(tree_mask(TREE_B, B_BFS), expected)


def test_tree_mask_hand_with_root() -> None:
    expected = bits(
        "1000000",  # the root sees only itself
        "1100000",
        "1010000",
        "1101000",
        "1100100",
        "1010010",
        "1100101",
    )
    np.testing.assert_array_equal(tree_mask(TREE_A, with_root=True), expected)


def test_attention_mask_hand() -> None:
    got = attention_mask(TREE_A, 3, A_DFS)
    expected = bits(
        "111" "100000",
        "111" "110000",
        "111" "101000",
        "111" "101100",
        "111" "000010",
        "111" "000011",
    )
    assert got.dtype == np.bool_
    np.testing.assert_array_equal(got, expected)
    with_root = attention_mask(TREE_A, 2, A_DFS, with_root=True)
    assert with_root.shape == (7, 9)
    # positions: past, past, root, node 0, 2, 3, 5, 1, 4
    np.testing.assert_array_equal(with_root[0], bits("11" "1000000")[0])
    np.testing.assert_array_equal(with_root[4], bits("11" "1101100")[0])  # node 5: root, 0, 3, itself
    np.testing.assert_array_equal(with_root[6], bits("11" "1000011")[0])  # node 4: root, 1, itself


def test_attention_mask_zero_past_is_tree_mask() -> None:
    np.testing.assert_array_equal(attention_mask(TREE_B, 0, B_BFS), tree_mask(TREE_B, B_BFS))


def test_position_ids_hand() -> None:
    # depths (root's children = 1): 1, 1, 2, 2, 2, 3
    ids = position_ids(TREE_A, 10)
    assert ids.dtype == np.int64
    np.testing.assert_array_equal(ids, [10, 10, 11, 11, 11, 12])
    np.testing.assert_array_equal(position_ids(TREE_A, 10, A_DFS), [10, 11, 11, 12, 10, 11])
    np.testing.assert_array_equal(position_ids(TREE_A, 10, A_DFS, with_root=True), [10, 11, 12, 12, 13, 11, 12])
    np.testing.assert_array_equal(position_ids(TREE_A, 0, with_root=True), [0, 1, 1, 2, 2, 2, 3])
    # tree B in BFS order: depths 1, 1, 2, 2, 2, 3
    np.testing.assert_array_equal(position_ids(TREE_B, 4, B_BFS), [4, 4, 5, 5, 5, 6])


def test_accepted_nodes_hand() -> None:
    assert accepted_nodes(TREE_A, (5, 2, 3, 0)) == (0, 3, 5)
    assert accepted_nodes(TREE_A, (5, 1, 6)) == (0, 2)
    assert accepted_nodes(TREE_A, (7, 1, 7)) == (1, 4)
    assert accepted_nodes(TREE_A, (4,)) == ()  # everything rejected: only the corrected token
    assert accepted_nodes(TREE_A, [np.int64(7), np.int64(0)]) == (1,)
    assert accepted_nodes(TREE_B, (0, 0, 0, 1)) == (0, 1, 3)
    assert accepted_nodes(TREE_B, (0, 1, 0)) == (0, 5)
    assert accepted_nodes(TREE_B, (1, 0, 1)) == (2, 4)


def test_accepted_nodes_of_a_deep_chain_and_bad_final_tokens() -> None:
    """A chain of 5000 nodes (a budget-4096 decode drafts one that deep) gives its whole path back: the search
    had recursed once per level and stopped at Python's recursion limit (about 1000).  A twin whose subtree
    dies out deep down hands over to the next twin.  The final (corrected or bonus) token is checked against
    the vocabulary like the others; it had been taken unchecked (``[0, 7]`` at ``V = 3`` gave ``(0,)``)."""
    n = 5000
    chain = topk_tree([-1, *range(n - 1)], [i % 3 for i in range(n)], vocab=3)
    toks = [i % 3 for i in range(n)] + [1]
    assert accepted_nodes(chain, toks) == tuple(range(n))
    # two root twins carrying token 0; the first one's chain is one level short of the tokens
    depth = 2000
    parents = [-1, -1, *([0] + list(range(2, depth)))[: depth - 1], 1, *range(depth + 1, 2 * depth)]
    tokens = [0, 0, *([1] * (depth - 1)), *([1] * depth)]
    draws = ("iid", "iid", *(("topk",) * (2 * depth - 1)))  # twins: drawn i.i.d. from the root's row
    twins = DraftTree(tuple(parents), tuple(tokens), draws, {-1: np.array([0.5, 0.5, 0.0])}, 3)
    got = accepted_nodes(twins, [0, *([1] * depth), 2])
    assert got == (1, *range(depth + 1, 2 * depth + 1)) and len(got) == depth + 1
    small = topk_tree([-1], [0], vocab=3)
    for bad, message in (([0, 7], r"tokens\[1\] = 7 is outside the tree's vocabulary \[0, 3\)"),
                         ([-5], r"tokens\[0\] must be"), ([3, 1], r"tokens\[0\] = 3 is outside")):
        with pytest.raises(ValueError, match=message):
            accepted_nodes(small, bad)


def test_keep_indices_hand() -> None:
    past = list(range(10))
    np.testing.assert_array_equal(keep_indices(TREE_A, (0, 3, 5), 10), past + [10, 13, 15])
    np.testing.assert_array_equal(keep_indices(TREE_A, (0, 3, 5), 10, A_DFS), past + [10, 12, 13])
    np.testing.assert_array_equal(keep_indices(TREE_A, (0, 3, 5), 10, A_DFS, with_root=True), past + [10, 11, 13, 14])
    np.testing.assert_array_equal(keep_indices(TREE_A, (1, 4), 10, A_DFS), past + [14, 15])
    np.testing.assert_array_equal(keep_indices(TREE_A, (), 10, A_DFS), past)
    np.testing.assert_array_equal(keep_indices(TREE_A, (), 10, A_DFS, with_root=True), past + [10])
    np.testing.assert_array_equal(keep_indices(TREE_A, (1,), 0), [1])
    np.testing.assert_array_equal(keep_indices(TREE_B, (0, 1, 3), 2, B_BFS), [0, 1, 2, 4, 7])
    assert keep_indices(TREE_A, (0,), 3).dtype == np.int64


def test_block_counts_hand_block_two() -> None:
    # index order, 2x2 tiles of test_tree_mask_hand_index_order: 1 + 2 + 3 non-empty
    assert mask_blocks(tree_mask(TREE_A), 2) == 6
    # DFS order: the (node 1, node 4) rows see nothing of the first four positions
    assert mask_blocks(tree_mask(TREE_A, A_DFS), 2) == 4
    assert mask_blocks(tree_mask(TREE_A, A_DFS), 3) == 3  # [[1, 0], [1, 1]] of 3x3 tiles


# --------------------------------------------------------------------------------------------
# mask_blocks on hand masks
# --------------------------------------------------------------------------------------------


def test_mask_blocks_hand() -> None:
    assert mask_blocks(np.eye(64, dtype=bool), 32) == 2
    assert mask_blocks(np.eye(64, dtype=bool)) == 2  # default block 32
    one = np.zeros((64, 64), dtype=bool)
    one[40, 5] = True
    assert mask_blocks(one, 32) == 1
    assert mask_blocks(np.zeros((64, 64), dtype=bool), 32) == 0
    assert mask_blocks(np.ones((64, 64), dtype=bool), 32) == 4
    assert mask_blocks(np.tril(np.ones((256, 256), dtype=bool)), 32) == 36  # 8 * 9 / 2
    assert mask_blocks(np.ones((7, 7), dtype=bool), 1) == 49
    assert mask_blocks(np.eye(7, dtype=bool), 1) == 7


def test_mask_blocks_non_multiple_sizes() -> None:
    assert mask_blocks(np.ones((65, 65), dtype=bool), 32) == 9  # 3 x 3 tiles, the last ones partial
    assert mask_blocks(np.eye(65, dtype=bool), 32) == 3
    assert mask_blocks(np.ones((33, 1), dtype=bool), 32) == 2
    assert mask_blocks(np.ones((5, 70), dtype=bool), 32) == 3
    corner = np.zeros((50, 40), dtype=bool)
    corner[49, 39] = True  # only the last, partial tile
    assert mask_blocks(corner, 32) == 1
    assert mask_blocks(np.ones((3, 3), dtype=bool), 32) == 1  # block larger than the mask
    assert mask_blocks(np.zeros((3, 3), dtype=bool), 32) == 0


def test_mask_blocks_accepts_non_bool_and_lists() -> None:
    assert mask_blocks([[0, 1], [0, 0]], 1) == 1
    assert mask_blocks(np.array([[0.0, 2.5], [0.0, 1.0]]), 1) == 2
    assert mask_blocks(np.zeros((0, 0), dtype=bool), 4) == 0
    assert mask_blocks(np.zeros((0, 5), dtype=bool), 4) == 0
    for bad, message in (([["no", "yes"]], "dtype <U3"), (np.array([[0.0, np.nan]]), "NaN or infinite"),
                         ([[None, 1]], "dtype object")):  # text and NaN had been read as True
        with pytest.raises(ValueError, match=message):
            mask_blocks(bad, 1)


def test_with_root_must_be_a_bool() -> None:
    """``with_root="no"`` had been read as True by each function that takes it."""
    for fn in (lambda w: tree_mask(TREE_A, None, w), lambda w: position_ids(TREE_A, 3, None, w),
               lambda w: keep_indices(TREE_A, (0,), 3, None, w)):
        for bad in ("no", 1, None):
            with pytest.raises(ValueError, match="with_root must be a bool"):
                fn(bad)
        assert np.array_equal(fn(np.True_), fn(True))


def brute_blocks(m: np.ndarray, b: int) -> int:
    return sum(
        bool(m[i : i + b, j : j + b].any()) for i in range(0, m.shape[0], b) for j in range(0, m.shape[1], b)
    )


@settings(max_examples=50)
@given(
    rows=st.integers(0, 40),
    cols=st.integers(0, 40),
    block=st.integers(1, 12),
    density=st.floats(0.0, 0.3),
    seed=st.integers(0, 2**32 - 1),
)
def test_mask_blocks_matches_tile_loop(rows: int, cols: int, block: int, density: float, seed: int) -> None:
    m = np.random.default_rng(seed).random((rows, cols)) < density
    assert mask_blocks(m, block) == brute_blocks(m, block)


# --------------------------------------------------------------------------------------------
# random trees, reference computations from parents only
# --------------------------------------------------------------------------------------------


@st.composite
def trees(draw: st.DrawFn, max_size: int = 30) -> DraftTree:
    """A random topk tree: node i below the root or an earlier node; siblings get tokens 0, 1, ..."""
    size = draw(st.integers(0, max_size))
    parents = [draw(st.integers(-1, i - 1)) for i in range(size)]
    counts: dict[int, int] = {}
    tokens = []
    for par in parents:
        tokens.append(counts.get(par, 0))
        counts[par] = tokens[-1] + 1
    return DraftTree(tuple(parents), tuple(tokens), ("topk",) * size, {}, max(2, size))


def anc_or_self(parents: Sequence[int], node: int) -> set[int]:
    out = set()
    while node != -1:
        out.add(node)
        node = parents[node]
    return out


def depth_of(parents: Sequence[int], node: int) -> int:
    return len(anc_or_self(parents, node))


def kids_of(parents: Sequence[int], node: int) -> list[int]:
    return [i for i, p in enumerate(parents) if p == node]


def ref_dfs(parents: Sequence[int]) -> list[int]:
    out: list[int] = []

    def visit(node: int) -> None:
        out.append(node)
        for kid in kids_of(parents, node):
            visit(kid)

    for top in kids_of(parents, -1):
        visit(top)
    return out


def ref_bfs(parents: Sequence[int]) -> list[int]:
    out: list[int] = []
    layer = kids_of(parents, -1)
    while layer:
        out += layer
        layer = [k for node in layer for k in kids_of(parents, node)]
    return out


def random_topological(parents: Sequence[int], seed: int) -> list[int]:
    rnd = random.Random(seed)
    placed: set[int] = set()
    ready = kids_of(parents, -1)
    out = []
    while ready:
        node = ready.pop(rnd.randrange(len(ready)))
        out.append(node)
        placed.add(node)
        ready += kids_of(parents, node)
    return out


def ref_mask(parents: Sequence[int], order: Sequence[int]) -> np.ndarray:
    n = len(order)
    m = np.zeros((n, n), dtype=bool)
    for i in range(n):
        anc = anc_or_self(parents, order[i])
        for j in range(n):
            m[i, j] = order[j] in anc
    return m


def all_orders(tree: DraftTree, seed: int) -> dict[str, list[int] | None]:
    return {
        "none": None,
        "index": list(range(tree.size)),
        "dfs": ref_dfs(tree.parents),
        "bfs": ref_bfs(tree.parents),
        "topological": random_topological(tree.parents, seed),
        "any_permutation": list(np.random.default_rng(seed).permutation(tree.size)),
    }


@settings(max_examples=50)
@given(tree=trees(), seed=st.integers(0, 10**6))
def test_orders_match_reference(tree: DraftTree, seed: int) -> None:
    assert list(dfs_order(tree)) == ref_dfs(tree.parents)
    assert list(bfs_order(tree)) == ref_bfs(tree.parents)
    for order in (dfs_order(tree), bfs_order(tree)):
        assert sorted(order) == list(range(tree.size))


@settings(max_examples=50)
@given(tree=trees())
def test_dfs_subtrees_contiguous(tree: DraftTree) -> None:
    order = dfs_order(tree)
    pos = {node: k for k, node in enumerate(order)}
    for v in range(tree.size):
        sub = sorted(pos[u] for u in range(tree.size) if v in anc_or_self(tree.parents, u))
        assert sub == list(range(pos[v], pos[v] + len(sub)))  # starts at v, no gaps
    for v in range(-1, tree.size):  # siblings keep verification order
        kids = kids_of(tree.parents, v)
        assert [pos[k] for k in kids] == sorted(pos[k] for k in kids)


@settings(max_examples=50)
@given(tree=trees())
def test_bfs_depths_non_decreasing(tree: DraftTree) -> None:
    order = bfs_order(tree)
    depths = [depth_of(tree.parents, v) for v in order]
    assert depths == sorted(depths)
    pos = {node: k for k, node in enumerate(order)}
    for v in range(tree.size):  # parents come first
        if tree.parents[v] != -1:
            assert pos[tree.parents[v]] < pos[v]
    # within one depth, ordered by the parent's position then by index
    keys = [(depth_of(tree.parents, v), pos.get(tree.parents[v], -1), v) for v in order]
    assert keys == sorted(keys)


@settings(max_examples=50)
@given(tree=trees(), seed=st.integers(0, 10**6), past=st.integers(0, 5))
def test_masks_match_ancestor_walk(tree: DraftTree, seed: int, past: int) -> None:
    for name, order in all_orders(tree, seed).items():
        layout = list(range(tree.size)) if order is None else order
        expected = ref_mask(tree.parents, layout)
        got = tree_mask(tree, order)
        assert got.dtype == np.bool_, name
        np.testing.assert_array_equal(got, expected, err_msg=name)
        if name in ("none", "index", "dfs", "bfs", "topological"):  # parents first: lower triangular
            assert not np.triu(got, 1).any(), name

        rooted = tree_mask(tree, order, with_root=True)
        assert rooted.shape == (tree.size + 1, tree.size + 1)
        assert rooted[:, 0].all()  # everyone sees the root
        assert not rooted[0, 1:].any()  # the root sees only itself
        np.testing.assert_array_equal(rooted[1:, 1:], expected, err_msg=name)

        for with_root, inner in ((False, expected), (True, rooted)):
            att = attention_mask(tree, past, order, with_root=with_root)
            assert att.shape == (inner.shape[0], past + inner.shape[0])
            assert att[:, :past].all()
            np.testing.assert_array_equal(att[:, past:], inner, err_msg=name)


@settings(max_examples=50)
@given(tree=trees(), seed=st.integers(0, 10**6), past=st.integers(0, 50))
def test_position_ids_are_past_plus_depth(tree: DraftTree, seed: int, past: int) -> None:
    for name, order in all_orders(tree, seed).items():
        layout = list(range(tree.size)) if order is None else order
        depths = [depth_of(tree.parents, v) for v in layout]
        got = position_ids(tree, past, order)
        assert got.dtype == np.int64
        assert got.tolist() == [past + d - 1 for d in depths], name
        assert position_ids(tree, past, order, with_root=True).tolist() == [past] + [past + d for d in depths], name


@settings(max_examples=50)
@given(tree=trees(), seed=st.integers(0, 10**6), past=st.integers(0, 6), with_root=st.booleans(), last=st.integers(0, 9))
def test_accepted_nodes_and_keep_indices(tree: DraftTree, seed: int, past: int, with_root: bool, last: int) -> None:
    rnd = random.Random(seed)
    for name, order in all_orders(tree, seed).items():
        layout = list(range(tree.size)) if order is None else order
        # the flattened step: past tokens, (the root's token,) then the nodes in layout order
        flat_tokens = [("past", k) for k in range(past)] + ([("root",)] if with_root else [])
        flat_tokens += [("tok", tree.tokens[v]) for v in layout]
        flat_nodes = [("past", k) for k in range(past)] + ([("root",)] if with_root else []) + list(layout)
        for v in [-1] + ([rnd.randrange(tree.size) for _ in range(3)] if tree.size else []):
            path_nodes = sorted(anc_or_self(tree.parents, v)) if v != -1 else []  # ancestors have smaller index
            emitted = tree.path(v) + (last % tree.vocab,)
            got_path = accepted_nodes(tree, emitted)
            assert got_path == tuple(path_nodes), name
            keep = keep_indices(tree, got_path, past, order, with_root)
            assert keep.dtype == np.int64
            prefix = [("past", k) for k in range(past)] + ([("root",)] if with_root else [])
            assert [flat_tokens[i] for i in keep] == prefix + [("tok", t) for t in tree.path(v)], name
            assert [flat_nodes[i] for i in keep] == prefix + path_nodes, name


def test_accepted_nodes_takes_the_twin_that_carries_the_rest() -> None:
    """Two i.i.d. root children both carry token 3; only the second has a child with token 5, so the
    emitted string 3, 5 runs through the second (hand-built; the first twin is taken when it fits)."""
    q = {-1: np.array([0.0, 0.0, 0.0, 0.5, 0.5, 0.0, 0.0, 0.0]), 0: np.full(8, 0.125), 1: np.full(8, 0.125)}
    twins = DraftTree((-1, -1, 0, 1), (3, 3, 4, 5), ("iid",) * 4, q, 8)
    assert accepted_nodes(twins, (3, 5, 0)) == (1, 3)
    assert accepted_nodes(twins, (3, 4, 0)) == (0, 2)
    assert accepted_nodes(twins, (3, 7)) == (0,)
    with pytest.raises(ValueError, match="leave the tree"):
        accepted_nodes(twins, (3, 6, 0))  # neither twin has a child with token 6


def test_accepted_nodes_iid_duplicates_every_verifier_output_parses() -> None:
    """i.i.d. siblings may repeat a token; every string any tree verifier emits must still map to a
    root-down path whose tokens are the emitted ones (the function takes the first matching child)."""
    model = ToyModel.random(2, 3, 7)
    rng = np.random.default_rng(3)
    seen_duplicate = False
    for _ in range(40):
        draft = sample_tree_draft(model, (3, 2), "iid", rng)
        tree = draft.tree
        toks = [tree.tokens[k] for k in tree.children(-1)]
        seen_duplicate |= len(set(toks)) < len(toks)
        for kernel in (multidraft_kernel, traversal_kernel, ordered_traversal_kernel):
            for s, prob in tree_kernel_outputs(tree, kernel(tree, draft.p_rows)).items():
                if prob <= 1e-12:
                    continue
                path = accepted_nodes(tree, s)
                assert len(path) == len(s) - 1
                assert tuple(tree.tokens[v] for v in path) == s[:-1]
                keep = keep_indices(tree, path, 0)
                assert keep.tolist() == list(path)
    assert seen_duplicate


# --------------------------------------------------------------------------------------------
# reorder keeps the tree and every verifier's output law
# --------------------------------------------------------------------------------------------


def inverse(order: Sequence[int]) -> list[int]:
    inv = [0] * len(order)
    for k, v in enumerate(order):
        inv[v] = k
    return inv


def same_tree(a: DraftTree, b: DraftTree) -> None:
    assert a.parents == b.parents
    assert a.tokens == b.tokens
    assert a.draws == b.draws
    assert a.vocab == b.vocab
    assert set(a.q_rows) == set(b.q_rows)
    for k in a.q_rows:
        np.testing.assert_array_equal(a.q_rows[k], b.q_rows[k])


def test_reorder_hand() -> None:
    new = reorder(TREE_A, A_DFS)
    # old 0,2,3,5,1,4 -> new 0..5; parents (-1, 0, 0, 2, -1, 4)
    assert new.parents == (-1, 0, 0, 2, -1, 4)
    assert new.tokens == (5, 1, 2, 3, 7, 1)
    assert new.vocab == TREE_A.vocab
    newb = reorder(TREE_B, B_BFS)
    # old 0,2,1,5,4,3 -> new 0..5
    assert newb.parents == (-1, -1, 0, 0, 1, 2)
    assert newb.tokens == (0, 1, 0, 1, 0, 0)
    same_tree(reorder(TREE_A, range(6)), TREE_A)  # identity


def test_reorder_keeps_q_rows_and_draws() -> None:
    q = {-1: np.array([0.5, 0.3, 0.2]), 0: np.array([0.1, 0.2, 0.7]), 2: np.array([0.3, 0.3, 0.4])}
    # root -> 0 (tok 0), 1 (tok 1); 0 -> 2 (tok 2); 2 -> 3 (tok 0), 4 (tok 0, iid duplicate)
    tree = DraftTree((-1, -1, 0, 2, 2), (0, 1, 2, 0, 0), ("swor", "swor", "iid", "iid", "iid"), q, 3)
    order = (0, 2, 3, 4, 1)
    assert dfs_order(tree) == order
    new = reorder(tree, order)
    assert new.parents == (-1, 0, 1, 1, -1)
    assert [d.value for d in new.draws] == ["swor", "iid", "iid", "iid", "swor"]
    assert set(new.q_rows) == {-1, 0, 1}
    np.testing.assert_array_equal(new.q_rows[-1], q[-1])
    np.testing.assert_array_equal(new.q_rows[0], q[0])
    np.testing.assert_array_equal(new.q_rows[1], q[2])


@settings(max_examples=50)
@given(tree=trees())
def test_reorder_paths_and_round_trip(tree: DraftTree) -> None:
    for order in (dfs_order(tree), bfs_order(tree)):
        new = reorder(tree, order)
        assert new.size == tree.size
        for k, old in enumerate(order):
            assert new.path(k) == tree.path(old)
            assert new.node_depth(k) == tree.node_depth(old)
        if order == dfs_order(tree):
            assert dfs_order(new) == tuple(range(tree.size))
        same_tree(reorder(new, inverse(order)), tree)
        # the mask of the renumbered tree in index order is the old mask in that order
        np.testing.assert_array_equal(tree_mask(new), tree_mask(tree, order))


def permuted_p_rows(p_rows: np.ndarray, order: Sequence[int]) -> np.ndarray:
    return p_rows[[0] + [v + 1 for v in order]]


@pytest.mark.parametrize("widths", [(2, 2), (3, 1, 2), (1, 2, 2), (2, 1, 1)])
@pytest.mark.parametrize("draw", [d.value for d in ALL_DRAWS])
def test_reorder_keeps_every_verifier_law(widths: tuple[int, ...], draw: str) -> None:
    vocab = 3
    model = ToyModel.random(vocab, len(widths), 11 + len(widths))
    rng = np.random.default_rng(sum(widths) * 7 + len(draw))
    differs = False
    for _ in range(6):
        draft = sample_tree_draft(model, widths, draw, rng)
        tree = draft.tree
        for order in (dfs_order(tree), bfs_order(tree)):
            differs |= order != tuple(range(tree.size))
            new = reorder(tree, order)
            p_new = permuted_p_rows(draft.p_rows, order)
            # the permuted rows are the target rows at the renumbered nodes' paths
            for j, path in enumerate(new.paths()):
                np.testing.assert_array_equal(p_new[j], model.p(path))
            for kernel in (multidraft_kernel, traversal_kernel, ordered_traversal_kernel):
                before = tree_kernel_outputs(tree, kernel(tree, draft.p_rows))
                after = tree_kernel_outputs(new, kernel(new, p_new))
                keys = {s for s, v in before.items() if v > 1e-13} | {s for s, v in after.items() if v > 1e-13}
                for s in keys:
                    assert after.get(s, 0.0) == pytest.approx(before.get(s, 0.0), abs=1e-12), (kernel.__name__, s)
                assert sum(after.values()) == pytest.approx(1.0)
    assert differs  # the DFS layout really renumbered some trees


# --------------------------------------------------------------------------------------------
# random_tree
# --------------------------------------------------------------------------------------------


def test_random_tree_shape_and_determinism() -> None:
    a = random_tree(200, 5)
    b = random_tree(200, np.random.default_rng(5))
    assert isinstance(a, DraftTree)
    assert a.size == 200
    same_tree(a, b)
    assert a.parents != random_tree(200, 6).parents
    assert all(-1 <= p < i for i, p in enumerate(a.parents))
    assert {d.value for d in a.draws} == {"topk"}
    assert len(a.q_rows) == 0
    for v in range(-1, a.size):  # tokens 0, 1, 2, ... within each sibling group
        assert [a.tokens[k] for k in a.children(v)] == list(range(len(a.children(v))))
    assert a.vocab >= max(len(a.children(v)) for v in range(-1, a.size))
    assert random_tree(3, 0, vocab=50).vocab == 50
    assert random_tree(0, 0).size == 0
    # node 0 always hangs below the root; node 1 below the root or node 0
    assert a.parents[0] == -1


def test_random_tree_parent_law_is_uniform() -> None:
    """Node 3's parent is uniform on {-1, 0, 1, 2}.  Exactly: node i's parent is one ``integers(-1, i)`` draw
    (uniform by numpy's contract).  Statistically, 4000 trees: each count within 120 of 1000 (a frequency within
    0.03 of 1/4) has false-fail rate at most 4.4e-5 (exact binomial tails, union over the 4 cells; the seed is
    fixed) and misses a shift of 0.05 from one parent to another (0.30 / 0.20) with probability 4.2e-5 (1e7
    simulated multinomials).  Counts, not float frequencies: ``|880 / 4000 - 0.25| < 0.03`` is False in floating
    point, which made the rate 5.2e-5 (a statistics audit of 2026-11-28)."""

    class Recording(np.random.Generator):
        calls: list[tuple[int, int]] = []

        def integers(self, low, high=None, *args, **kwargs):  # type: ignore[no-untyped-def, override]
            self.calls.append((low, high))
            return super().integers(low, high, *args, **kwargs)

    recording = Recording(np.random.PCG64(0))
    random_tree(5, recording)
    assert recording.calls == [(-1, i) for i in range(5)]
    rng = np.random.default_rng(0)
    counts = np.bincount([random_tree(4, rng).parents[3] + 1 for _ in range(4000)], minlength=4)
    assert counts.shape == (4,)
    assert np.all(np.abs(counts - 1000) <= 120)


# --------------------------------------------------------------------------------------------
# the empty tree
# --------------------------------------------------------------------------------------------


def test_empty_tree() -> None:
    assert dfs_order(EMPTY) == ()
    assert bfs_order(EMPTY) == ()
    assert check_order(EMPTY, None) == ()
    assert check_order(EMPTY, []) == ()
    assert tree_mask(EMPTY).shape == (0, 0)
    np.testing.assert_array_equal(tree_mask(EMPTY, (), with_root=True), [[True]])
    assert attention_mask(EMPTY, 4).shape == (0, 4)
    np.testing.assert_array_equal(attention_mask(EMPTY, 4, with_root=True), np.ones((1, 5), dtype=bool))
    assert position_ids(EMPTY, 4).tolist() == []
    assert position_ids(EMPTY, 4, with_root=True).tolist() == [4]
    assert accepted_nodes(EMPTY, (2,)) == ()
    assert keep_indices(EMPTY, (), 4).tolist() == [0, 1, 2, 3]
    assert keep_indices(EMPTY, (), 4, with_root=True).tolist() == [0, 1, 2, 3, 4]
    assert keep_indices(EMPTY, (), 0).tolist() == []
    assert mask_blocks(tree_mask(EMPTY)) == 0
    assert mask_blocks(tree_mask(EMPTY, with_root=True), 32) == 1
    same_tree(reorder(EMPTY, ()), EMPTY)
    with pytest.raises(ValueError, match="leave the tree"):
        accepted_nodes(EMPTY, (0, 1))
    with pytest.raises(ValueError, match="root-down"):
        keep_indices(EMPTY, (0,), 0)


# --------------------------------------------------------------------------------------------
# bad input
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "call",
    [
        lambda t: dfs_order(t),
        lambda t: bfs_order(t),
        lambda t: check_order(t, None),
        lambda t: tree_mask(t),
        lambda t: attention_mask(t, 0),
        lambda t: position_ids(t, 0),
        lambda t: accepted_nodes(t, (1,)),
        lambda t: keep_indices(t, (), 0),
        lambda t: reorder(t, ()),
    ],
)
@pytest.mark.parametrize("bad", [None, (-1, 0), {"parents": (-1,)}, "tree"])
def test_not_a_draft_tree(call, bad) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match="DraftTree"):
        call(bad)


@pytest.mark.parametrize(
    "order, match",
    [
        ((0, 1, 2, 3, 4), "permutation"),  # too short
        ((0, 1, 2, 3, 4, 5, 6), "permutation"),  # too long
        ((0, 0, 2, 3, 4, 5), "permutation"),  # repeat
        ((1, 2, 3, 4, 5, 6), "permutation"),  # out of range
        ((-1, 0, 1, 2, 3, 4), "permutation"),
        ((0, 1, 2, 3, 4, 5.5), "integer"),
        ((0, 1, 2, 3, 4, "5"), "integer"),
        ((True, 0, 2, 3, 4, 5), "integer"),
    ],
)
def test_bad_order(order, match) -> None:  # type: ignore[no-untyped-def]
    for call in (
        lambda: check_order(TREE_A, order),
        lambda: tree_mask(TREE_A, order),
        lambda: attention_mask(TREE_A, 2, order),
        lambda: position_ids(TREE_A, 2, order),
        lambda: keep_indices(TREE_A, (0,), 2, order),
        lambda: reorder(TREE_A, order),
    ):
        with pytest.raises(ValueError, match=match):
            call()


@pytest.mark.parametrize("past", [-1, -10, 1.5, "3", None, True])
def test_bad_past(past) -> None:  # type: ignore[no-untyped-def]
    for call in (
        lambda: attention_mask(TREE_A, past),
        lambda: position_ids(TREE_A, past),
        lambda: keep_indices(TREE_A, (0,), past),
    ):
        with pytest.raises(ValueError, match="past"):
            call()


def test_accepted_nodes_bad_tokens() -> None:
    with pytest.raises(ValueError, match="leave the tree"):
        accepted_nodes(TREE_A, (5, 7, 0))  # 7 is not a child of node 0
    with pytest.raises(ValueError, match="leave the tree"):
        accepted_nodes(TREE_A, (6, 0))  # no child of the root has token 6
    with pytest.raises(ValueError, match="leave the tree"):
        accepted_nodes(TREE_A, (5, 2, 3, 1, 0))  # past the leaf 5
    with pytest.raises(ValueError, match="at least"):
        accepted_nodes(TREE_A, ())
    with pytest.raises(ValueError, match="integer"):
        accepted_nodes(TREE_A, (5, 0.5))
    with pytest.raises(ValueError, match=r"tokens\[1\]"):
        accepted_nodes(TREE_A, (5, "x"))


@pytest.mark.parametrize(
    "path",
    [
        (3,),  # parent of 3 is 0, not the root
        (0, 4),  # 4 hangs below 1
        (0, 3, 2),  # 2 is 3's sibling
        (0, 99),
        (-1,),
        (1, 4, 4),
    ],
)
def test_keep_indices_bad_path(path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match="root-down"):
        keep_indices(TREE_A, path, 3)
    with pytest.raises(ValueError, match="root-down"):
        keep_indices(TREE_A, path, 3, A_DFS, with_root=True)


def test_keep_indices_non_integer_path() -> None:
    with pytest.raises(ValueError, match=r"path\[1\]"):
        keep_indices(TREE_A, (0, 2.5), 3)


@pytest.mark.parametrize("block, match", [(0, "block"), (-32, "block"), (1.5, "block"), (True, "block")])
def test_mask_blocks_bad_block(block, match) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match=match):
        mask_blocks(np.eye(4, dtype=bool), block)


@pytest.mark.parametrize("mask", [np.ones(8, dtype=bool), np.ones((2, 2, 2), dtype=bool), True])
def test_mask_blocks_bad_mask(mask) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match="2-D"):
        mask_blocks(mask, 2)


def test_reorder_child_before_parent() -> None:
    with pytest.raises(ValueError, match="before its parent"):
        reorder(TREE_A, (2, 0, 1, 3, 4, 5))
    with pytest.raises(ValueError, match="before its parent"):
        reorder(TREE_A, tuple(reversed(A_DFS)))


def test_reorder_sibling_swap_rejected() -> None:
    # parents first, but the root's children 0 and 1 swapped: would change the verification order
    with pytest.raises(ValueError, match="sibling order"):
        reorder(TREE_A, (1, 0, 2, 3, 4, 5))
    with pytest.raises(ValueError, match="sibling order"):
        reorder(TREE_A, (0, 1, 3, 2, 4, 5))


def test_random_tree_bad_input() -> None:
    with pytest.raises(ValueError, match="size"):
        random_tree(-1, 0)
    with pytest.raises(ValueError, match="rng"):
        random_tree(4, -3)
    with pytest.raises(ValueError, match="size"):
        random_tree(2.5, 0)


# --------------------------------------------------------------------------------------------
# validation of non-sequence arguments (found missing by these tests, then fixed)
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "call",
    [
        lambda: check_order(TREE_A, 5),
        lambda: tree_mask(TREE_A, 5),
        lambda: accepted_nodes(TREE_A, 5),
        lambda: keep_indices(TREE_A, 5, 0),
    ],
    ids=["check_order", "tree_mask", "accepted_nodes", "keep_indices"],
)
def test_non_sequence_arguments_raise_value_error(call) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError):
        call()


@pytest.mark.parametrize("vocab", ["x", None])
def test_random_tree_bad_vocab(vocab) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match="vocab"):
        random_tree(4, 0, vocab=vocab)
