"""spec.llm.host_verify: the numpy references behind the torch verifiers' interface.

The decode loop calls these on the CPU (``verify_backend="numpy"``) and the
torch ports elsewhere, so each must give the torch port's result on identical
noise: the same tokens, the same accepted count, and accepted nodes that form
a path of the tree carrying the emitted tokens.  The nodes themselves may
differ only between i.i.d. twins (siblings with the same token), which this
checks on trees that have them.  Cases: the random chains and trees of
``test_verify_torch`` (V = 2..6, exact zeros, edge uniforms, every draw kind).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from spec.llm.host_verify import verify_chain_numpy, verify_tree_numpy  # noqa: E402
from spec.llm.verify import CHAIN_METHODS, TREE_METHODS, verify_chain, verify_tree  # noqa: E402
from tests.spec.llm.test_verify_torch import chain_case, check_verified, tree_cases, uniforms  # noqa: E402
from tmc import Draw, DraftTree  # noqa: E402

pytestmark = pytest.mark.llm


def test_chain_numpy_equals_the_torch_verifier() -> None:
    rng = np.random.default_rng(11)
    for _ in range(200):
        ref, q, p = chain_case(rng)
        u = uniforms(rng, len(ref) + 1)
        for method in CHAIN_METHODS:
            for rows in (q, None):  # the drawn rows, or a deterministic draft (point masses)
                want = verify_chain(method, ref, None if rows is None else torch.as_tensor(rows), torch.as_tensor(p),
                                    torch.as_tensor(u))
                got = verify_chain_numpy(method, ref, rows, p, u)
                assert check_verified(got, "cpu") == check_verified(want, "cpu"), (method, ref, p.tolist(), u.tolist())
                assert got.nodes == want.nodes == tuple(range(got.n_accepted))
                # trusted=True (the decode loop's call) skips the reference's checks and keeps its tokens
                fast = verify_chain_numpy(method, ref, rows, p, u, trusted=True)
                assert torch.equal(fast.tokens, got.tokens) and fast.n_accepted == got.n_accepted, (method, ref)


def test_tree_numpy_equals_the_torch_verifier_up_to_iid_twins() -> None:
    checked = twins = 0
    for tree, p, q, u in tree_cases(seed=12, count=240):
        for method in TREE_METHODS:
            want = verify_tree(method, torch.tensor(tree.tokens), torch.tensor(tree.parents), tree.draws,
                               None if q is None else torch.as_tensor(q), torch.as_tensor(p), torch.as_tensor(u))
            got = verify_tree_numpy(method, tree, p, u)
            tokens = check_verified(got, "cpu")
            assert tokens == check_verified(want, "cpu"), (method, tree, p.tolist(), u.tolist())
            assert [tree.tokens[i] for i in got.nodes] == tokens[:-1]  # a path carrying the emitted tokens
            assert all(tree.parents[b] == a for a, b in zip((-1,) + got.nodes, got.nodes))
            if got.nodes != want.nodes:  # only a twin's path: same tokens, i.i.d. siblings
                twins += 1
                assert all(tree.draws[a] == Draw.IID for a, b in zip(got.nodes, want.nodes) if a != b)
            checked += 1
    assert checked == 240 * len(TREE_METHODS)
    print(f"{twins} of {checked} steps accepted an i.i.d. twin of the torch verifier's node")


def test_bad_input_is_refused() -> None:
    p = np.full((3, 4), 0.25)
    u = np.full(3, 0.5)
    with pytest.raises(ValueError, match="method must be one of"):
        verify_chain_numpy("traversal", [1, 2], None, p, u)
    with pytest.raises(ValueError, match="method must be one of"):
        verify_tree_numpy("sps", DraftTree((-1,), (1,), (Draw.TOPK,), {}, 4), p[:2], u[:2])
    with pytest.raises(ValueError, match="tree must be a tmc.DraftTree"):
        verify_tree_numpy("traversal", [1, 2], p, u)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="2-D"):
        verify_chain_numpy("sps", [1, 2], None, p[0], u)
    with pytest.raises(ValueError, match=r"draft_tokens\[1\] = 7 is outside"):
        verify_chain_numpy("sps", [1, 7], None, p, u)
    bad = p.copy()
    bad[1, 2] = np.nan
    with pytest.raises(ValueError, match="p_rows row 1"):  # the reference's own check
        verify_chain_numpy("block", [1, 2], None, bad, u)
    with pytest.raises(ValueError, match="p_rows row 1"):
        verify_tree_numpy("traversal", DraftTree((-1,), (1,), (Draw.TOPK,), {}, 4), bad[:2], u[:2])
    with pytest.raises(ValueError, match="u"):
        verify_chain_numpy("sps", [1, 2], None, p, np.array([0.5, 1.0, 0.5]))
    for ids in (["a", 0], [0.5, 0], np.array([1.5, 0.0])):  # a deterministic draft's ids, checked by name
        with pytest.raises(ValueError, match=r"^draft_tokens"):
            verify_chain_numpy("sps", ids, None, p, u)
    q = np.full((2, 4), 0.25)
    for bad_u in (math.nan, 1.0, -5.0):  # ASpS reads the first of n + 1 uniforms; all are checked, as in torch
        with pytest.raises(ValueError, match=r"uniforms\[1\] = .* is not a uniform draw"):
            verify_chain_numpy("asps", [1, 2], q, p, np.array([0.1, bad_u, 0.3]))
        with pytest.raises(ValueError, match=r"uniforms\[1\] = .* is not a uniform draw"):
            verify_chain("asps", [1, 2], q, p, np.array([0.1, bad_u, 0.3]))


def test_ordered_traversal_refuses_a_huge_swor_enumeration_before_walking() -> None:
    """Three children drawn ``swor`` from a 200-token row would make ordered Traversal sum over
    200·199·198 > MAX_SWOR_TUPLES tuples (about 20 s here; hours at V = 4096): both backends refuse
    the tree before walking it, with the node in the message.  The other verifiers take the tree
    (the target gives node 0's token probability 0, so they accept nothing)."""
    from spec.llm.verify import MAX_SWOR_TUPLES

    vocab = 200
    assert math.perm(vocab, 3) > MAX_SWOR_TUPLES
    flat = np.full(vocab, 1.0 / vocab)
    tree = DraftTree((-1, 0, 0, 0), (5, 1, 2, 3), (Draw.SWOR,) * 4, {-1: flat, 0: flat}, vocab)
    p = np.tile(flat, (5, 1))
    p[0, 5] = 0.0
    p[0] /= p[0].sum()
    q = np.tile(flat, (5, 1))
    u = np.full(5, 0.5)
    for verify in (lambda: verify_tree_numpy("ordered_traversal", tree, p, u),
                   lambda: verify_tree("ordered_traversal", torch.tensor(tree.tokens), torch.tensor(tree.parents),
                                       tree.draws, torch.as_tensor(q), torch.as_tensor(p), torch.as_tensor(u))):
        with pytest.raises(ValueError, match=r"node 0 has 3 children drawn 'swor' .* MAX_SWOR_TUPLES"):
            verify()
    for method in ("multidraft", "traversal"):
        assert verify_tree_numpy(method, tree, p, u).n_accepted == 0
