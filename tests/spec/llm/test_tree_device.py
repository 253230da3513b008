"""Device walks of the tree verifiers (spec.llm.tree_device) against the numpy references of tmc.

STYLE.md rule 11: same uniforms, same tokens, exactly.  The cases are those of
``test_verify_torch.py`` (random trees of every draw kind, V in 2..6, rows with
exact zeros, target rows equal to the draft row or one-hot, edge uniforms),
trees of a decode's fixed shapes at V = 4096, an empty tree and V = 1.  The
plan's traversal order is checked against :func:`tmc.traversal.traversal_tests`,
its paths against ``DraftTree.path``; the walk runs on the ``meta`` device,
where any host read raises; bad input raises ``ValueError`` naming the argument.
"""

from __future__ import annotations

import itertools
import math
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from tmc import ALL_DRAWS, Draw, DraftTree  # noqa: E402
from tmc.traversal import traversal_tests  # noqa: E402

from spec.builders import FixedBuilder  # noqa: E402
from spec.llm.tree_device import (  # noqa: E402
    DEVICE_TREE_METHODS,
    TreePlan,
    tree_head,
    verify_tree_on_device,
    walks_on_device,
)
from spec.llm.verify import TREE_METHODS, verify_tree  # noqa: E402
from tests.spec.llm.conftest import no_host_scalar_writes  # noqa: E402
from tests.spec.llm.test_verify_torch import (  # noqa: E402
    DEVICES,
    NUMPY_TREE,
    TREE_BAD,
    as_tensor,
    tree_cases,
)

pytestmark = pytest.mark.llm  # one torch thread: tests/spec/llm/conftest.py


def run(method: str, tree: DraftTree, q: np.ndarray | None, p: np.ndarray, u: np.ndarray, device: str,
        trusted: bool = False, draws: object = None) -> list[int]:
    plan = TreePlan.of(tree.parents, tree.draws if draws is None else draws, device)
    out = verify_tree_on_device(method, plan, torch.tensor(tree.tokens), as_tensor(q, device), as_tensor(p, device),
                                as_tensor(u, device), trusted=trusted)
    got = [int(t) for t in out.tokens.tolist()]
    assert out.n_accepted == len(out.nodes) == len(got) - 1
    assert [tree.tokens[i] for i in out.nodes] == got[:-1]
    assert all(tree.parents[b] == a for a, b in zip((-1,) + out.nodes, out.nodes))
    return got


def test_device_methods_are_tree_methods():
    assert set(DEVICE_TREE_METHODS) <= set(TREE_METHODS)


def refused_wide_swor(method: str, tree: DraftTree, q: np.ndarray | None, p: np.ndarray, u: np.ndarray) -> bool:
    """Whether ``method`` has no device walk for ``tree`` (ordered Traversal at a node with 3 or more children
    drawn swor); then asserts the device walk refuses it by name."""
    if walks_on_device(method, tree.parents, tree.draws):
        return False
    swor_kids = [sum(1 for v, d in zip(tree.parents, tree.draws) if v == par and d == Draw.SWOR)
                 for par in set(tree.parents)]
    assert method == "ordered_traversal" and max(swor_kids) >= 3
    with pytest.raises(ValueError, match=r"ordered_traversal: node -?\d+ has 3 or more children drawn 'swor'"):
        verify_tree_on_device(method, TreePlan.of(tree.parents, tree.draws), list(tree.tokens), q, p, u)
    return True


@pytest.mark.parametrize("device", DEVICES)
def test_device_walks_equal_numpy_on_same_uniforms(device):
    count = 240 if device == "cpu" else 80
    checked = refused = 0
    for i, (tree, p, q, u) in enumerate(tree_cases(seed=4, count=count)):
        for method in DEVICE_TREE_METHODS:
            if refused_wide_swor(method, tree, q, p, u):
                refused += 1
                continue
            want = NUMPY_TREE[method](tree, p, u)
            draws = [d.value for d in tree.draws] if i % 2 else None
            assert run(method, tree, q, p, u, device, trusted=bool(i % 3), draws=draws) == want, (method, tree, p, u)
            # the accepted nodes, not only their tokens (an iid twin carries the same token): the host walk's
            host = verify_tree(method, list(tree.tokens), list(tree.parents), tree.draws, q, p, u)
            plan = TreePlan.of(tree.parents, tree.draws, device)
            out = verify_tree_on_device(method, plan, list(tree.tokens), q, p, u)
            assert out.nodes == host.nodes
            checked += 1
    assert checked + refused == len(DEVICE_TREE_METHODS) * count and refused < count // 8


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


#: Fixed shapes a decode verifies: FixedBuilder's full trees, a chain, a star.
SHAPES = {
    "fixed 2 wide": FixedBuilder(width=2).full_shape(7),
    "fixed 3 wide, depth 2": FixedBuilder(width=3, depth=2).full_shape(9),
    "chain of 5": tuple(range(-1, 4)),
    "star of 4": (-1, -1, -1, -1),
}


def decode_tree(rng: np.random.Generator, parents: tuple[int, ...], kind: Draw, vocab: int,
                sharp: float) -> tuple[DraftTree, np.ndarray, np.ndarray]:
    """A tree drawn as a decode draws it from softmax rows (target = draft + noise), its p and q rows."""
    n = len(parents)
    logits = rng.normal(size=(n + 1, vocab)) * sharp
    q = softmax(logits)
    p = softmax(logits + rng.normal(size=(n + 1, vocab)))
    tokens = [0] * n
    for par in sorted(set(parents)):
        kids = [i for i, x in enumerate(parents) if x == par]
        row = q[par + 1]
        if kind == Draw.TOPK:
            toks = np.argsort(-row, kind="stable")[: len(kids)]
        else:
            toks = rng.choice(vocab, size=len(kids), replace=kind == Draw.IID, p=row)
        for kid, tok in zip(kids, toks):
            tokens[kid] = int(tok)
    rows = {par: q[par + 1] for par in set(parents)} if kind != Draw.TOPK else {}
    return DraftTree(parents, tuple(tokens), (kind,) * n, rows, vocab), p, q


@pytest.mark.parametrize(("shape", "kind"), list(itertools.product(SHAPES, ALL_DRAWS)))
def test_device_walks_equal_numpy_and_the_host_walk_at_vocabulary_4096(shape, kind):
    rng = np.random.default_rng(11)
    parents = SHAPES[shape]
    accepted = 0
    for sharp in (0.5, 3.0):  # flat rows (most drafts rejected) and sharp ones (long accepted paths)
        for _ in range(4):
            tree, p, q = decode_tree(rng, parents, kind, 4096, sharp)
            u = rng.random(tree.size + 1)
            for method in DEVICE_TREE_METHODS:
                if refused_wide_swor(method, tree, q, p, u):  # and its host walk at V = 4096 would enumerate 6.9e10
                    continue  # 3-tuples: refused too (test_verify_torch)
                got = run(method, tree, None if kind == Draw.TOPK else q, p, u, "cpu", trusted=True)
                assert got == NUMPY_TREE[method](tree, p, u), (shape, kind, method)
                host = verify_tree(method, list(tree.tokens), list(parents), kind, q, p, u)
                assert got == host.tokens.tolist()
                accepted += len(got) - 1
    assert accepted > 0  # the cases reach past the root



@pytest.mark.parametrize(("root_kind", "kid_kind"), [(Draw.SWOR, Draw.IID), (Draw.IID, Draw.SWOR),
                                                     (Draw.TOPK, Draw.IID), (Draw.SWOR, Draw.TOPK)])
def test_two_siblings_sets_of_different_draw_kinds_walk_as_numpy(root_kind, kid_kind):
    """The root's 2 children drawn one way, its first child's 2 another: the multidraft and K-SEQ walks then
    batch both kinds at rank 1, where their laws differ (the random trees above seldom build this; a walk that
    applied one kind's law to both gave other tokens in 32 of 900 such cases)."""
    rng = np.random.default_rng(0)
    parents, vocab = (-1, -1, 0, 0), 3
    draws = (root_kind, root_kind, kid_kind, kid_kind)
    for _ in range(60):
        q, p = rng.dirichlet(np.ones(vocab), size=5), rng.dirichlet(np.ones(vocab), size=5)
        tokens = []
        for row, kind in ((q[0], root_kind), (q[1], kid_kind)):
            if kind == Draw.TOPK:
                tokens += [int(t) for t in np.argsort(-row, kind="stable")[:2]]
            else:
                tokens += [int(t) for t in rng.choice(vocab, size=2, replace=kind == Draw.IID, p=row)]
        rows = {par: q[par + 1] for par, kind in ((-1, root_kind), (0, kid_kind)) if kind != Draw.TOPK}
        tree = DraftTree(parents, tuple(tokens), draws, rows, vocab)
        u = rng.random(5)
        for method in DEVICE_TREE_METHODS:
            got = run(method, tree, q, p, u, "cpu")
            assert got == NUMPY_TREE[method](tree, p, u), (method, tokens, q, p, u)
            host = verify_tree(method, tokens, list(parents), list(draws), q, p, u)
            plan = TreePlan.of(parents, draws)
            assert verify_tree_on_device(method, plan, tokens, q, p, u).nodes == host.nodes

def test_plan_orders_tests_as_tmc_and_records_each_path():
    """The traversal order and the root-down paths come from the shape alone: tmc's own walk (its order
    does not depend on the rows) and ``DraftTree.path`` give them independently."""
    for tree, p, _q, _u in tree_cases(seed=9, count=60):
        plan = TreePlan.of(tree.parents, tree.draws)
        order = [t.node for t in traversal_tests(tree, p)]
        assert [r - 1 for r in plan.post.tolist()] == order
        for node in range(-1, tree.size):
            depth = tree.node_depth(node)
            row = plan.paths[node + 1].tolist()
            nodes, rest = row[:depth], row[depth:]
            assert tuple(tree.tokens[i] for i in nodes) == tree.path(node) and set(rest) <= {-1}
            assert all(tree.parents[b] == a for a, b in zip([-1] + nodes, nodes)) and nodes[-1:] == [node][:depth]
            assert plan.lengths[node + 1] == depth


def test_empty_tree_emits_from_the_root_row():
    p = np.array([[0.2, 0.3, 0.5]])
    tree = DraftTree((), (), (), {}, 3)
    for method in DEVICE_TREE_METHODS:
        for u, want in ((0.0, 0), (0.25, 1), (0.6, 2), (math.nextafter(1.0, 0.0), 2)):
            assert run(method, tree, None, p, np.array([u]), "cpu") == [want] == NUMPY_TREE[method](tree, p, [u])


def test_one_token_vocabulary_accepts_every_draft():
    tree = DraftTree.build([-1, 0, 0], [0, 0, 0], "iid", {-1: [1.0], 0: [1.0]}, 1)
    ones = np.ones((4, 1))
    for method in DEVICE_TREE_METHODS:
        assert run(method, tree, ones, ones, np.full(4, 0.99), "cpu") == [0, 0, 0] == NUMPY_TREE[method](tree, ones, [0.99] * 4)


@pytest.mark.parametrize(("kind", "method", "trusted"), list(itertools.product(ALL_DRAWS, DEVICE_TREE_METHODS, (False, True))))
def test_device_walk_reads_nothing_on_the_host(kind, method, trusted):
    """On the ``meta`` device tensors hold no data, so ``.item()``, ``bool()`` or ``.tolist()`` of any of
    them raises: the whole step, checks included, runs without one, and writes no Python scalar by indexing
    (a host copy on CUDA, refused in a graph capture).  Teeth: the host walk raises there."""
    meta = "meta"
    plan = TreePlan.of(FixedBuilder(width=2).full_shape(7), kind, meta)
    q = torch.empty(8, 64, dtype=torch.float64, device=meta)
    tok = torch.empty(7, dtype=torch.int64, device=meta)
    u = torch.empty(8, dtype=torch.float64, device=meta)
    with no_host_scalar_writes():
        head = tree_head(method, plan, tok, None if kind == Draw.TOPK else q, q, u, trusted=trusted)
    assert head.device.type == meta and tuple(head.shape) == (3 + plan.depth,)
    with pytest.raises(NotImplementedError):
        verify_tree(method, tok, list(plan.parents), kind, q, q, u)


def head_tokens(head: torch.Tensor, tree: DraftTree) -> list[int]:
    """The emitted tokens a :func:`tree_head` row stands for."""
    got = head.tolist()
    return [tree.tokens[i] for i in got[3 : 3 + got[1]]] + [got[2]]


@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")  # torch's own code
@pytest.mark.parametrize(("kind", "backend", "trusted"),
                         [(kind, "eager", True) for kind in ALL_DRAWS] + [(Draw.IID, "eager", False),
                                                                          (Draw.IID, "inductor", True)])
def test_device_walk_compiles_as_one_graph(kind, backend, trusted):
    """``torch.compile(..., fullgraph=True)`` traces the whole walk (a host read or a data-dependent branch
    would break the graph, an error here) and the compiled walk gives the references' tokens; ``eager``
    traces only, ``inductor`` generates the fused code a GPU would run (once, on the CPU: ~10-20 s).
    Untrusted, the value checks trace too (their tolerance looked up by dtype without numpy)."""
    import functools

    parents = SHAPES["fixed 2 wide"]
    plan = TreePlan.of(parents, kind)
    rng = np.random.default_rng(13)
    for method in DEVICE_TREE_METHODS:
        compiled = torch.compile(functools.partial(tree_head, method, plan, trusted=trusted), fullgraph=True,
                                 dynamic=False, backend=backend)
        for _ in range(3):
            tree, p, q = decode_tree(rng, parents, kind, 64, 3.0)
            u = rng.random(tree.size + 1)
            head = compiled(torch.tensor(tree.tokens), None if kind == Draw.TOPK else torch.tensor(q),
                            torch.tensor(p), torch.tensor(u))
            assert head_tokens(head, tree) == NUMPY_TREE[method](tree, p, u), (kind, method)
    torch._dynamo.reset()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_device_walk_replays_as_a_cuda_graph():
    """The walk captured once in a CUDA graph, then replayed on new rows, tokens and uniforms copied into
    its input buffers: the references' tokens every time."""
    parents = SHAPES["fixed 2 wide"]
    rng = np.random.default_rng(17)
    for kind, method in itertools.product((Draw.IID, Draw.SWOR), DEVICE_TREE_METHODS):
        plan = TreePlan.of(parents, kind, "cuda")
        n, vocab = len(parents), 512
        tok = torch.zeros(n, dtype=torch.int64, device="cuda")
        q = torch.full((n + 1, vocab), 1.0 / vocab, dtype=torch.float64, device="cuda")
        p, u = q.clone(), torch.full((n + 1,), 0.5, dtype=torch.float64, device="cuda")
        tok.copy_(torch.arange(n))  # distinct siblings for swor
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            tree_head(method, plan, tok, q, p, u, trusted=True)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            head = tree_head(method, plan, tok, q, p, u, trusted=True)
        for _ in range(4):
            tree, p_np, q_np = decode_tree(rng, parents, kind, vocab, 3.0)
            u_np = rng.random(n + 1)
            tok.copy_(torch.tensor(tree.tokens))
            q.copy_(torch.from_numpy(q_np))
            p.copy_(torch.from_numpy(p_np))
            u.copy_(torch.from_numpy(u_np))
            graph.replay()
            assert head_tokens(head, tree) == NUMPY_TREE[method](tree, p_np, u_np), (kind, method)


def device_args(args: tuple) -> tuple:
    """A ``TREE_BAD`` case for the device walks: ordered Traversal swapped for ``traversal`` where it has no
    device walk (a node with 3 or more children drawn swor)."""
    method, tok, parents, draws, *rest = args
    try:
        walks = walks_on_device(method, parents, draws)
    except (ValueError, TypeError):  # a malformed shape or draws: the case's own error comes from the walk
        walks = True
    return ("traversal" if method == "ordered_traversal" and not walks else method, tok, parents, draws, *rest)


#: Where the device entry point words a shape error its own way (its plan is made first).
DEVICE_MESSAGES = {
    "parents length": r"draft_tokens has shape \(2,\); expected \(1,\) for a tree of 1 nodes",
    "target shape": r"target_probs has shape \(2, 2\); expected \(3, 2\) for a tree of 2 nodes",
    "uniforms length": r"uniforms has shape \(2,\); expected \(3,\) for a tree of 2 nodes",
}


@pytest.mark.parametrize("case", list(TREE_BAD), ids=list(TREE_BAD))
def test_device_bad_input_raises(case):
    args, match = TREE_BAD[case]
    method, tok, parents, draws, q, p, u = device_args(args)
    with pytest.raises(ValueError, match=DEVICE_MESSAGES.get(case, match)):
        verify_tree_on_device(method, TreePlan.of(parents, draws), tok, q, p, u)


def test_device_walk_refuses_host_only_methods_and_bad_plans():
    plan = TreePlan.of([-1, -1], "iid")
    r2 = [[0.5, 0.5]] * 3
    for method in ("sps", "block"):
        with pytest.raises(ValueError,
                           match="method must be one of 'multidraft', 'traversal', 'ordered_traversal', 'kseq'"):
            verify_tree_on_device(method, plan, [0, 1], r2, r2, [0.1] * 3)
    r3 = [[0.25, 0.25, 0.5]] * 4
    wide = TreePlan.of([-1, -1, -1], "swor")
    assert not walks_on_device("ordered_traversal", [-1, -1, -1], "swor")
    assert walks_on_device("ordered_traversal", [-1, -1, -1], "iid")
    assert walks_on_device("traversal", [-1, -1, -1], "swor")
    assert walks_on_device("ordered_traversal", [-1, -1, 0, 0], "swor") and not walks_on_device("sps", [-1], "iid")
    with pytest.raises(ValueError, match=r"ordered_traversal: node -1 has 3 or more children drawn 'swor'.*host walk"):
        verify_tree_on_device("ordered_traversal", wide, [0, 1, 2], r3, r3, [0.1] * 4)
    with pytest.raises(ValueError, match=r"draft_probs is None but node -1 has children drawn 'swor'"):
        verify_tree_on_device("multidraft", TreePlan.of([-1, -1], "swor"), [0, 1], None, r2, [0.1] * 3)
    with pytest.raises(ValueError, match=r"parents\[0\] = 0; a parent must be"):
        TreePlan.of([0], "iid")


def test_unread_draft_rows_may_hold_anything():
    q = [[0.5, 0.5], [math.nan, -3.0], [7.0, 7.0]]
    r2 = [[0.5, 0.5]] * 3
    for method in DEVICE_TREE_METHODS:
        got = verify_tree_on_device(method, TreePlan.of([-1, -1], "iid"), [0, 1], q, r2, [0.1, 0.2, 0.3])
        assert got.tokens.tolist() == [0, 0]


def test_float32_rows_give_the_float64_walk():
    for tree, p, q, u in tree_cases(seed=6, count=40):
        p32 = torch.tensor(p, dtype=torch.float32)
        for method in DEVICE_TREE_METHODS:
            if refused_wide_swor(method, tree, q, p32, u):
                continue
            plan = TreePlan.of(tree.parents, tree.draws)
            want = verify_tree(method, list(tree.tokens), list(tree.parents), tree.draws, q, p32, u).tokens.tolist()
            assert verify_tree_on_device(method, plan, list(tree.tokens), q, p32, u).tokens.tolist() == want


def test_rows_are_checked_at_the_precision_they_came_in():
    """Float32 / bfloat16 rows off by their rounding (1.2e-5 / 3e-3) pass the device flag and walk as the
    host walk does; a float32 row off by 1e-3 is flagged, and the host checks then name it at float32's
    tolerance (the rows reach them in their own dtype)."""
    rng = np.random.default_rng(8)
    for dtype, excess in ((torch.float32, 1.2e-5), (torch.bfloat16, 3e-3)):
        for _ in range(10):
            q, p = rng.dirichlet(np.ones(6), size=3), rng.dirichlet(np.ones(6), size=3)
            q_lo, p_lo = (torch.tensor(x * (1 + excess)).to(dtype) for x in (q, p))
            tok, u = [int(rng.choice(6, p=q[0])), int(rng.choice(6, p=q[0]))], rng.random(3)
            for method in DEVICE_TREE_METHODS:
                want = verify_tree(method, tok, [-1, -1], "iid", q_lo, p_lo, u).tokens.tolist()
                got = verify_tree_on_device(method, TreePlan.of([-1, -1], "iid"), tok, q_lo, p_lo, u)
                assert got.tokens.tolist() == want
    p_bad = torch.tensor(np.full((3, 2), 0.5) * (1 + 1e-3), dtype=torch.float32)
    with pytest.raises(ValueError, match=r"target_probs row 0 sums to .*tolerance 0.0001 for float32 rows"):
        verify_tree_on_device("traversal", TreePlan.of([-1, -1], "iid"), [0, 1], np.full((3, 2), 0.5), p_bad, [0.1] * 3)


# ------------------------------------------------------------------ in the decode loop


DECODE_TREES = [(verifier, "iid", 2) for verifier in TREE_METHODS] + [
    ("ordered_traversal", "swor", 2), ("ordered_traversal", "swor", 3), ("traversal", "swor", 3)]


@pytest.mark.parametrize(("verifier", "draw", "width"), DECODE_TREES)
def test_decode_loop_verifies_fixed_trees_on_the_device(verifier, draw, width, monkeypatch):
    """``generate(verify_backend='device')`` on a fixed tree drafted on the device: where the verifier has a device
    walk for the shape (:func:`walks_on_device`: every tree verifier here but ordered Traversal on the 3-wide
    swor tree) it runs that walk (``tree_head``, once a step) and never the host walk, else the host walk, as
    ``torch`` does for all; the tokens are the numpy references' either way (``test_device_chain.py`` checks
    the same against the host-built tree for every setting)."""
    pytest.importorskip("transformers")
    import spec.llm.generate as gen
    from spec.llm.models import tiny_pair

    target, draft = tiny_pair(29, seed=3)
    with torch.no_grad():  # sharp rows: accepted paths of several nodes
        target.lm_head.weight.mul_(12.0)
        draft.lm_head.weight.mul_(12.0)
    calls = {"tree_head": 0, "verify_tree": 0}
    for name in calls:
        def spy(*args: object, _real: object = getattr(gen, name), _name: str = name, **kw: object) -> object:
            calls[_name] += 1
            return _real(*args, **kw)  # type: ignore[operator]
        monkeypatch.setattr(gen, name, spy)
    kw = dict(temperature=1.0, max_new_tokens=16, budget=7, seed=2, builder_params={"draw": draw, "width": width})
    ref = gen.generate(target, draft, [5, 3, 5], "fixed", verifier, verify_backend="numpy", **kw)
    assert max(s.accepted for s in ref.steps) >= 2
    assert calls == {"tree_head": 0, "verify_tree": 0}
    device_walk = walks_on_device(verifier, FixedBuilder(width=width).full_shape(7), draw)
    assert device_walk == (verifier != "ordered_traversal" or draw == "iid" or width == 2)
    for backend in ("torch", "device"):
        out = gen.generate(target, draft, [5, 3, 5], "fixed", verifier, verify_backend=backend, **kw)
        assert out.tokens == ref.tokens
        walked = backend == "device" and device_walk
        assert calls == {"tree_head": len(out.steps) if walked else 0, "verify_tree": 0 if walked else len(out.steps)}
        calls.update(tree_head=0, verify_tree=0)


def test_kseq_rho_and_residual_rows_agree_with_tmc():
    """K-SEQ's ``ρ*`` as fixed-shape device work (sort, prefix sums, a fixed number of bisection rounds) against
    :func:`tmc.kseq.kseq_rho`, row by row, on the rows tmc validates (V from 2 to 4096, k from 1 to 8, flat and
    sharp rows, half the draft row zero, p = q in a row): every device ``ρ`` is valid by tmc's own check
    (:func:`tmc.kseq.kseq_residual` refuses a ``ρ`` that breaks ``c(β(ρ)) ≤ ρ``); where numpy stops at
    ``ρ = 1`` without bisecting the two are equal; else within ``4 RHO_RTOL`` relative.  Not bit for bit:
    torch's ``expm1`` / ``log1p`` differ from the C library's in the last bit for some arguments (measured
    while writing: 8% of random ones), which turns a late bisection step where ``c(β(ρ)) − ρ`` is at rounding
    level (worst seen 2.1 RHO_RTOL).  At ``p = q`` the root is 1 and every ``ρ ≥ 1`` is valid, and the
    computed condition is rounding noise for ``ρ`` within about ``1e-3`` of 1 (``(1 − 1/ρ)^k`` below an ulp):
    there both land in ``[1, 1.001]``.  The residual rows at numpy's ``ρ`` agree with
    :func:`tmc.kseq.kseq_residual` to 1e-12 (its ``1 − c/ρ`` factor amplifies rounding where ``c ≈ ρ``)."""
    from tmc.kseq import RHO_RTOL, kseq_residual, kseq_rho
    from tmc.validate import check_prob_rows
    from spec.llm.tree_device import _kseq_residual_rows, _kseq_rho

    rng = np.random.default_rng(21)
    bisected = 0
    for vocab, sharp, trial in itertools.product((2, 3, 5, 64, 4096), (0.3, 2.0, 8.0), range(6)):
        k = rng.integers(1, 9, size=5)
        q, p = (softmax(rng.normal(size=(5, vocab)) * sharp) for _ in range(2))
        if trial % 3 == 0 and vocab > 2:
            q[:, : vocab // 2] = 0.0
            q /= q.sum(axis=1, keepdims=True)
        same = np.zeros(5, dtype=bool)
        if trial % 3 == 1:
            p[0], same[0] = q[0], k[0] > 1
        p, q = check_prob_rows("p", p), check_prob_rows("q", q)  # the rows tmc works on
        width = torch.tensor(k, dtype=torch.float64)[:, None]
        got = _kseq_rho(torch.tensor(p), torch.tensor(q), width, int(k.max()))[:, 0].numpy()
        want = np.array([kseq_rho(p[i], q[i], int(k[i])) for i in range(5)])
        for i in range(5):
            kseq_residual(p[i], q[i], int(k[i]), float(got[i]))  # raises for an invalid rho
        one = (want == 1.0) & ~same
        assert np.array_equal(got[one], want[one]), (vocab, sharp, trial)
        close = np.abs(got - want) <= 4 * RHO_RTOL * want
        assert np.all(close | same) and np.all(got[same] <= 1.001) and np.all(want[same] <= 1.001), (got, want)
        bisected += int((~one & ~same).sum())
        res = _kseq_residual_rows(torch.tensor(p), torch.tensor(q), width, torch.tensor(want)[:, None]).numpy()
        assert np.allclose(res, [kseq_residual(p[i], q[i], int(k[i]), want[i]) for i in range(5)], rtol=0, atol=1e-12)
    assert bisected > 200  # most rows with k >= 2 need the bisection


def test_kseq_ratio_count_under_compile_is_the_left_insertion_point():
    """``_count_below``'s compiled form (a comparison and a sum, which torch 2.11's triton can build where its
    fused ``searchsorted`` failed on an H100) gives ``searchsorted``'s left insertion point on sorted rows with
    ties, ``+inf`` tails, points equal to an entry, below every entry and above every finite one; and K-SEQ's
    ``ρ*`` compiled equals the eager one bit for bit on rows whose condition needs the bisection."""
    from spec.llm.tree_device import _count_below, _kseq_rho

    ratios = torch.tensor([[0.1, 0.5, 0.5, 0.5, 2.0, math.inf], [0.3, 0.3, 1.0, math.inf, math.inf, math.inf],
                           [1.0, 1.0, 1.0, 1.0, 1.0, 1.0]], dtype=torch.float64)
    compiled = torch.compile(_count_below, backend="eager", fullgraph=True)  # dynamo's tracing: is_compiling()
    for point in (0.05, 0.1, 0.3, 0.5, 0.7, 1.0, 2.0, 3.0, 1e308):
        rho = torch.full((3, 1), point, dtype=torch.float64)
        want = torch.searchsorted(ratios, rho)
        assert torch.equal(_count_below(ratios, rho), want)
        got = compiled(ratios, rho)
        assert got.dtype == torch.int64 and torch.equal(got, want), point
    rng = np.random.default_rng(5)
    p, q = (torch.tensor(softmax(rng.normal(size=(4, 64)) * 2.0)) for _ in range(2))
    k = torch.tensor([[1.0], [2.0], [4.0], [8.0]], dtype=torch.float64)
    rho = torch.compile(_kseq_rho, backend="eager", fullgraph=True)(p, q, k, 8)
    assert torch.equal(rho, _kseq_rho(p, q, k, 8)) and bool((rho[1:] > 1.0).all())


def test_kseq_rho_of_nearly_one_hot_targets_agrees_with_tmc_in_both_ports():
    """The rows where a slack on ``c ≈ 1`` had accepted ρ below ρ* (a target token of 1e-15 came out at 1e-90):
    the batched port, the host-loop port (:mod:`spec.llm.verify`) and tmc return the same ρ."""
    from spec.llm.tree_device import _kseq_rho
    from spec.llm.verify import _kseq_rho as host_rho
    from tmc.kseq import kseq_rho
    from tmc.validate import check_prob_rows

    rows = [([0.9999999999982664, 1.7336162073849617e-12], [1.0, 0.0], 6), ([0.99999999999999, 1e-14], [1.0, 0.0], 4),
            ([0.999999999999999, 1e-15], [1.0, 0.0], 6), ([0.5, 0.5], [0.3, 0.7], 7)]
    p = check_prob_rows("p", np.array([r[0] for r in rows]))
    q = check_prob_rows("q", np.array([r[1] for r in rows]))
    k = np.array([r[2] for r in rows])
    got = _kseq_rho(torch.tensor(p), torch.tensor(q), torch.tensor(k, dtype=torch.float64)[:, None], int(k.max()))
    want = [kseq_rho(p[i], q[i], int(k[i])) for i in range(len(rows))]
    assert got[:, 0].tolist() == want
    assert [host_rho(torch.tensor(p[i]), torch.tensor(q[i]), int(k[i])) for i in range(len(rows))] == want
    assert min(want[:3]) > 1.0003  # none accepted at 1


def test_ordered_traversal_visiting_order_and_sorted_laws_agree_with_tmc():
    """Ordered Traversal's device tables, level by level, against :func:`tmc.ordered_traversal.ratio_ordered_children`
    node by node: a tree whose levels mix nodes of 1 to 4 children drawn iid, swor (2 at most) or topk, V from 4
    to 64, draft rows with exact zeros, a target row equal to its draft row (every ratio tied: the lower id first),
    repeated iid tokens.  The visiting order equals tmc's exactly; the sorted laws of pairs drawn without
    replacement exactly for V < 8; the others within 4e-15 (measured while writing: at most 2.2e-16 for
    V < 8 and 5.6e-16 up to 64): they take integer powers as torch computes them (``x ** 3`` is ``x * x * x``)
    where tmc calls the C library's ``pow``, and for ``V >= 8`` totals are sequential where numpy's are pairwise.
    The token-level equality is ``test_device_walks_equal_numpy_on_same_uniforms``'s; these laws move an
    accepted token only when a uniform lands within that rounding of a threshold."""
    from tmc.ordered_traversal import ratio_ordered_children
    from tmc.validate import check_prob_rows
    from spec.llm.tree_device import _visiting

    rng = np.random.default_rng(5)
    parents = (-1, -1, -1, 0, 0, 0, 1, 1, 2, 3, 3, 3, 3)
    groups = {par: [i for i, x in enumerate(parents) if x == par] for par in sorted(set(parents))}
    compared = {Draw.IID: 0, Draw.SWOR: 0}
    for trial in range(160):
        vocab = int(rng.choice([4, 5, 7, 9, 64]))
        kinds = {par: [Draw.IID, Draw.TOPK, Draw.SWOR][rng.integers(3 if len(g) <= 2 else 2)]
                 for par, g in groups.items()}
        q = softmax(rng.normal(size=(len(parents) + 1, vocab)) * rng.choice([0.5, 3.0]))
        if trial % 4 == 0:
            q[:, : vocab // 2] = 0.0
            q /= q.sum(axis=1, keepdims=True)
        p = check_prob_rows("p", softmax(rng.normal(size=q.shape) * 2.0))
        tokens = [0] * len(parents)
        for par, group in groups.items():
            row = q[par + 1]
            drawn = (np.argsort(-row, kind="stable")[: len(group)] if kinds[par] == Draw.TOPK
                     else rng.choice(vocab, size=len(group), replace=kinds[par] == Draw.IID, p=row))
            for kid, tok in zip(group, drawn):
                tokens[kid] = int(tok)
        draws = tuple(kinds[par] for par in parents)
        tree = DraftTree(parents, tuple(tokens), draws, {v: q[v + 1] for v in groups if kinds[v] != Draw.TOPK}, vocab)
        qn = q.copy()
        for v in tree.q_rows:
            qn[v + 1] = tree.q_rows[v]  # tmc's normalised rows, which the walk sees too
        if trial % 5 == 0:
            p[1] = qn[1]  # node 0's ratios all tie (where it is drawn from a row)
        plan = TreePlan.of(parents, draws)
        for b in plan.levels:
            if not b.any_ordered:
                continue
            visit, laws = _visiting(plan, b, torch.tensor(p).index_select(0, b.rows),
                                    torch.tensor(qn).index_select(0, b.rows), torch.tensor(tokens))
            for r, row in enumerate(b.rows.tolist()):
                if not b.ordered[r, 0]:
                    continue
                kids, want = ratio_ordered_children(tree, row - 1, p[row])
                assert visit[r, : len(kids)].tolist() == list(kids), (trial, row - 1)
                for j, law in enumerate(want):
                    got = laws[j][r].numpy()
                    if kinds[row - 1] == Draw.SWOR and vocab < 8:
                        assert np.array_equal(got, law), (trial, row - 1, j)
                    else:
                        assert np.allclose(got, law, rtol=0.0, atol=4e-15), (trial, row - 1, j)
                    compared[kinds[row - 1]] += 1
    assert min(compared.values()) > 100, compared


@pytest.mark.parametrize("draw", ["iid", "swor"])
def test_ordered_traversal_beside_a_draft_token_of_mass_near_one_equals_numpy(draw):
    """Two children ``[0, 1]`` of ``q = [1.0, 1e-17, 1e-17]``: ``1.0 − π`` (iid) and ``1.0 − q`` (swor) lost
    the tiny mass, so the second child's sorted law at its drawn token was 0 in both ports and the walk
    accepted it at value 1.  Both ports now keep it (tmc's laws are checked against exact enumeration in
    tests/tmc/test_ordered_traversal.py); here the device walk gives numpy's tokens for every uniform."""
    q_root = np.array([1.0, 1e-17, 1e-17])
    tree = DraftTree.build([-1, -1], [0, 1], draw, {-1: q_root}, 3)
    p = np.array([[0.01, 1e-20, 0.99], [1 / 3] * 3, [0.2, 0.3, 0.5]])
    q = np.array([q_root, [1 / 3] * 3, [1 / 3] * 3])
    grid = (0.0, 1e-4, 0.005, 0.0099, 0.0101, 0.5, 0.999, math.nextafter(1.0, 0.0))
    accepted_second = 0
    for u in itertools.product(grid, repeat=3):
        want = NUMPY_TREE["ordered_traversal"](tree, p, list(u))
        assert run("ordered_traversal", tree, q, p, np.array(u), "cpu") == want, u
        host = verify_tree("ordered_traversal", list(tree.tokens), list(tree.parents), tree.draws, q, p, list(u))
        assert host.tokens.tolist() == want, u  # the host port kept the subtraction a day longer
        accepted_second += want[0] == 1
    # the second child's acceptance probability is ~5e-4 of the first child's rejection: only u = 0 or 1e-4 at
    # its test (at 0.005 and above it fails; at 0.5 it passed with the cancelled law)
    assert 0 < accepted_second < len(grid) ** 3 // 4


@pytest.mark.parametrize(("draw", "tokens", "q_root", "p_root", "u", "want"), [
    # a sorted law that underflows to 0 at a drawn token of target probability 0: the gap 0 - 0 passed it at
    # value 1 (numpy and the device walk emitted [4, 2]); exactly it is never accepted
    ("swor", [4, 0], [1e-30, 1.0, 1e-30, 2.0**-53, 1e-310], [1e-310, 1e-310, 1.0, 2.0**-53, 0.0], [0.5] * 3, [2]),
    # P(Bin(m, pi) >= c) underflowed to 0 at pi = 1e-310, c = 2: ZeroDivisionError in numpy and the host port
    ("iid", [1, 1, 4], [2.0**-53, 1e-310, 1e-310, 0.0, 1.0], [1.0, 1e-310, 1e-16, 5e-324, 0.0], [0.5, 1e-300, 1e-300, 0.3],
     [0]),
])
def test_ordered_traversal_at_the_subnormal_edge_in_every_port(draw, tokens, q_root, p_root, u, want):
    """Two valid drafts at the edge of the float range, found by an audit against exact rational laws (the
    expected tokens are its exact answers): numpy, the host torch walk and the device walk agree with them."""
    vocab = len(q_root)
    tree = DraftTree.build([-1] * len(tokens), tokens, draw, {-1: q_root}, vocab)
    p = np.array([p_root] + [[1 / vocab] * vocab] * len(tokens))
    q = np.array([q_root] + [[1 / vocab] * vocab] * len(tokens))
    assert NUMPY_TREE["ordered_traversal"](tree, p, u) == want
    assert run("ordered_traversal", tree, q, p, np.array(u), "cpu") == want
    host = verify_tree("ordered_traversal", tokens, [-1] * len(tokens), tree.draws, q, p, u)
    assert host.tokens.tolist() == want
    kernel = __import__("tmc").ordered_traversal_kernel(tree, p)
    assert kernel.sum() == pytest.approx(1.0, abs=1e-12) and (kernel >= 0).all()


def test_a_swor_first_child_comes_from_the_stored_row_on_every_port():
    """``tests/tmc/test_multidraft.py``'s row whose stored sum is ``1 - 1.1e-16``, drawn ``swor`` into two root
    children with ``p = q``: the first child is accepted for every uniform (``min(1, p/q) = 1``; ordered Traversal
    visits them in its own order), by numpy, by the device walks and by the host walks alike (each port once
    divided the first child's law by the row's sum)."""
    from tests.spec.llm.test_verify_torch import EDGE_UNIFORMS
    from tests.tmc.test_multidraft import SHORT_SUM_ROW

    tree = DraftTree.build([-1, -1], [1, 0], "swor", {-1: SHORT_SUM_ROW}, 2)
    q = tree.q_rows[-1]
    p = q_rows = np.stack([q, q, q])
    for u0 in EDGE_UNIFORMS:
        u = np.full(3, u0)
        for method in TREE_METHODS:
            want = NUMPY_TREE[method](tree, p, u)
            if method != "ordered_traversal":  # which visits the children in its own order
                assert want[0] == 1, (method, u0)
            host = verify_tree(method, list(tree.tokens), list(tree.parents), tree.draws, as_tensor(q_rows, "cpu"),
                               as_tensor(p, "cpu"), as_tensor(u, "cpu"))
            assert host.tokens.tolist() == want, (method, u0)
            if method in DEVICE_TREE_METHODS:
                assert run(method, tree, q_rows, p, u, "cpu") == want, (method, u0)


def test_ports_accept_where_rows_round_apart_as_numpy_does():
    """``tests/tmc/test_multidraft.py``'s ``ROUNDED_APART`` rows (the target below the draft at token 1 as floats,
    above it by the rests): every port's residual walk accepts the drafted token 1 for every uniform, as numpy's
    ``acceptance_at`` does, on an i.i.d. and a without-replacement pair of root children."""
    from tests.spec.llm.test_verify_torch import EDGE_UNIFORMS
    from tests.tmc.test_multidraft import ROUNDED_APART

    q_raw, p_raw = ROUNDED_APART
    for draw in ("iid", "swor"):
        tree = DraftTree.build([-1, -1], [1, 0], draw, {-1: q_raw}, 2)
        q_rows = np.stack([tree.q_rows[-1]] * 3)
        p = np.array([p_raw, p_raw, p_raw])
        for u0 in EDGE_UNIFORMS:
            u = np.full(3, u0)
            for method in ("multidraft", "kseq"):
                want = NUMPY_TREE[method](tree, p, u)
                if method == "multidraft":
                    assert want[0] == 1, (draw, u0)
                host = verify_tree(method, list(tree.tokens), list(tree.parents), tree.draws,
                                   as_tensor(q_rows, "cpu"), as_tensor(p, "cpu"), as_tensor(u, "cpu"))
                assert host.tokens.tolist() == want, (method, draw, u0)
                assert run(method, tree, q_rows, p, u, "cpu") == want, (method, draw, u0)


def test_device_walks_beside_a_shared_entry_near_one_equal_numpy():
    """The chains of ``SHARED_DOMINANT_CHAINS`` as trees: the device walks take the difference of the rests at a
    token both rows hold above 1/2 as numpy does (``p = [1.0, 1e-20]`` beside ``q = [1, 0]`` accepted node 0)."""
    from tests.tmc.test_chain_exact import SHARED_DOMINANT_CHAINS

    for ref, q, p in SHARED_DOMINANT_CHAINS:
        q, p = np.array(q), np.array(p)
        tree = DraftTree.chain(ref, q)
        for u0 in (0.0, 5e-324, 1e-300, 1e-12, 0.5, 1.0 - 1e-12, math.nextafter(1.0, 0.0)):
            u = np.full(len(ref) + 1, u0)
            for method in DEVICE_TREE_METHODS:
                got = run(method, tree, np.vstack([q, np.full(q.shape[1], 1 / q.shape[1])]), p, u, "cpu")
                assert got == NUMPY_TREE[method](tree, p, u), (method, ref, u0)


@pytest.mark.parametrize(("parents", "match"), [
    (None, r"^parents must be a sequence of parent indices, got None"),
    (3, r"^parents must be a sequence of parent indices, got 3"),
    ("-1", r"^parents must be a sequence"),
    ([0], r"^parents\[0\] = 0; a parent must be -1 \(root\) or an earlier node"),
    ([5, -7], r"^parents\[0\] = 5"),
    ([-1, -2], r"^parents\[1\] = -2"),
])
def test_a_parent_list_that_is_no_tree_is_refused_by_the_planning_entry_points(parents, match):
    """``walks_on_device`` answered True for ``[0]`` (a node its own parent); ``TreePlan.of(None)`` was a bare
    TypeError."""
    with pytest.raises(ValueError, match=match):
        walks_on_device("multidraft", parents, "iid")
    with pytest.raises(ValueError, match=match):
        walks_on_device("sps", parents, "iid")  # a verifier with no device walk gets the same answer to a non-tree
    with pytest.raises(ValueError, match=match):
        TreePlan.of(parents, "iid")
    assert walks_on_device("multidraft", [-1, 0, -1], "iid") and walks_on_device("multidraft", [], "iid")


def test_a_plan_and_its_device_are_checked():
    with pytest.raises(ValueError, match=r"^device must be a torch device or its name, got 'nodevice'"):
        TreePlan.of([-1], "iid", device="nodevice")
    p = torch.tensor([[0.5, 0.5], [0.5, 0.5]], dtype=torch.float64)
    with pytest.raises(ValueError, match=r"^plan must be a TreePlan"):
        verify_tree_on_device("multidraft", [-1], torch.tensor([0]), p, p, torch.tensor([0.5, 0.5]))
    got = verify_tree_on_device("multidraft", TreePlan.of([-1], "iid"), torch.tensor([0]), p, p,
                                torch.tensor([0.5, 0.5], dtype=torch.float64))
    assert got.n_accepted == 1  # p = q accepts


# Inputs on which a mutation audit found a port's rule could change unnoticed: each puts a uniform, a row sum or
# a value on the edge one rule decides, so only the rule as numpy has it gives numpy's tokens.
_ONE_BELOW = math.nextafter(1.0, 0.0)
_QUARTER = [0.25] * 4
_RAW_ROW = [0.7758038732521195, 0.07557556470194833, 0.14862056204593227]  # a second division by its sum moves it
_EDGE_TREES = {
    # p = q on a row whose first swor child's law must be the stored row: accepted at u one ulp below 1
    "swor first child, multidraft": ("multidraft", [-1, -1], [1, 2], "swor", [_RAW_ROW] * 3, [_RAW_ROW] * 3,
                                     [_ONE_BELOW, 0.5, 0.5], [1, 0]),
    "swor first child, traversal": ("traversal", [-1, -1], [1, 2], "swor", [_RAW_ROW] * 3, [_RAW_ROW] * 3,
                                    [_ONE_BELOW, 0.5, 0.5], [1, 0]),
    # ordered Traversal's law of the second of two sorted swor children (q(x) (1/(1 − q(y)) + ...)), k = 2
    "ordered second swor law": (
        "ordered_traversal", [-1, -1], [2, 1], "swor",
        [[0.14652654891777658, 0.23263686907083103, 0.28545186211342544, 0.33538471989796675], _QUARTER, _QUARTER],
        [[0.5162589338392383, 0.027096518733070413, 0.2584327618248082, 0.19821178560288305], _QUARTER, _QUARTER],
        [0.9, 0.32, 0.5], [0]),
    # p(x) < q(x) as floats, equal by the rests (difference 0): accepted (>= 0), at u one ulp below 1
    "rests equal": ("multidraft", [-1], [0], "iid", [[0.6198145214696259, 0.38018547853037415]] * 2,
                    [[0.6198145214696258, 0.38018547853037415]] * 2, [_ONE_BELOW, 0.5], [0, 0]),
    # Traversal: the root gives node 0 the value a = 1/2 exactly, where the near-one form of the excess starts
    "value one half": (
        "traversal", [-1, 0], [0, 1], "iid",
        [[0.5, 0.5, 0.0, 0.0], [0.010537359099573887, 0.44724470867207433, 0.0003687799414563416, 0.5418491522868953],
         _QUARTER],
        [[0.25, 0.75, 0.0, 0.0], [0.2869740662214923, 0.09423109477281243, 0.21511458139928363, 0.4036802576064117],
         _QUARTER],
        [0.3244504738587291, _ONE_BELOW, 0.3], [0, 0]),
    # K-SEQ: 1 − c/ρ is 2.2e-16 (rounding) and snaps to 0: tokens 0 and 2 keep no residual mass, u = 0 draws 1
    "kseq factor snap": (
        "kseq", [-1, -1], [0, 0], "iid",
        [[0.5421839917211866, 0.0028045065124043317, 0.42632985733261936, 0.02868164443378962]] * 3,
        [[0.5863756353052958, 0.08124544157627767, 0.27175514654150723, 0.060623776576919336]] * 3,
        [_ONE_BELOW, _ONE_BELOW, 0.0], [1]),
    # K-SEQ with one i.i.d. child: c = 1 exactly (not β / β rounded)
    "kseq one child": (
        "kseq", [-1], [0], "iid",
        [[0.8462373066190084, 0.08256604777431258, 0.018640406798118462, 0.052556238808560564]] * 2,
        [[0.09354000811301685, 0.1794052228693369, 0.28402245626781397, 0.4430323127498322]] * 2,
        [_ONE_BELOW, 0.12865620122091284], [2]),
}


@pytest.mark.parametrize("case", sorted(_EDGE_TREES))
def test_ports_equal_numpy_where_one_rule_decides(case):
    """numpy's tokens (the expected ones, also asserted as computed by hand-picked inputs) = the host walk's = the
    device walk's."""
    method, parents, tokens, draws, q, p, u, want = _EDGE_TREES[case]
    q_rows, p_rows, u = np.array(q), np.array(p), np.array(u)
    tree = DraftTree.build(parents, tokens, draws, {-1: q_rows[0], **{i: q_rows[i + 1] for i in range(len(tokens))}},
                           q_rows.shape[1])
    assert NUMPY_TREE[method](tree, p_rows, u) == want
    host = verify_tree(method, tokens, parents, draws, as_tensor(q_rows, "cpu"), as_tensor(p_rows, "cpu"),
                       as_tensor(u, "cpu"))
    assert host.tokens.tolist() == want
    assert run(method, tree, q_rows, p_rows, u, "cpu") == want
