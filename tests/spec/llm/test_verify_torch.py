"""Torch verifiers (spec.llm.verify) against the numpy reference samplers of tmc, on identical noise.

STYLE.md rule 11: the numpy kernel is the reference and the torch port must
emit the same tokens for the same uniforms.  Every case is exact equality
(no tolerance): random vocabularies of 2..6 tokens, rows with exact zeros,
target rows equal to the draft row or one-hot, chains of 0..5 tokens, trees
of every draw kind (built node by node as ``tmc.DraftTree`` or drawn by
``tmc.drafts.sample_tree_draft``), uniforms that include 0, subnormals and
values one ulp below 1; plus chains with V = 32000.  Then the bad-input
paths, each of which must raise ``ValueError`` naming the argument.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from tmc import ALL_DRAWS, Draw, DraftTree, ToyModel  # noqa: E402
from tmc.chain import (  # noqa: E402
    asps_sample_from_uniforms,
    block_sample_from_uniforms,
    sps_sample_from_uniforms,
)
from tmc.drafts import sample_tree_draft  # noqa: E402
from tmc.kseq import kseq_sample_from_uniforms  # noqa: E402
from tmc.multidraft import multidraft_sample_from_uniforms  # noqa: E402
from tmc.ordered_traversal import ordered_traversal_sample_from_uniforms  # noqa: E402
from tmc.toy import random_row  # noqa: E402
from tmc.traversal import traversal_sample_from_uniforms  # noqa: E402

from spec.llm.verify import (  # noqa: E402
    CHAIN_METHODS,
    MAX_SWOR_TUPLES,
    TORCH_VERIFIERS,
    TREE_METHODS,
    Verified,
    noise_size,
    verify_chain,
    verify_chain_on_device,
    verify_tree,
)

pytestmark = pytest.mark.llm


@pytest.fixture(autouse=True, scope="module")
def one_thread() -> Iterator[None]:
    """One intra-op thread: these tensors are tiny, and on a loaded 2-core machine
    idle OpenMP workers cost more than the work (the whole module ~3x slower)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)

CUDA = pytest.param(
    "cuda",
    marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")],
)
DEVICES = ["cpu", CUDA]

NUMPY_CHAIN: dict[str, Callable[..., list[int]]] = {
    "sps": sps_sample_from_uniforms,
    "asps": lambda ref, q, p, u: asps_sample_from_uniforms(ref, q, p, u[:1]),
    "block": block_sample_from_uniforms,
}
NUMPY_TREE: dict[str, Callable[..., list[int]]] = {
    "multidraft": multidraft_sample_from_uniforms,
    "traversal": traversal_sample_from_uniforms,
    "ordered_traversal": ordered_traversal_sample_from_uniforms,
    "kseq": kseq_sample_from_uniforms,
}

#: Uniforms at the edges of [0, 1): 0, the smallest subnormal, tiny, and up to one ulp below 1.
EDGE_UNIFORMS = (0.0, 5e-324, 1e-300, 1e-12, 0.5, 1.0 - 1e-12, math.nextafter(1.0, 0.0))


# ------------------------------------------------------------------ cases


def uniforms(rng: np.random.Generator, size: int) -> np.ndarray:
    """``size`` uniforms, about a fifth of them from :data:`EDGE_UNIFORMS`."""
    u = rng.random(size)
    edge = rng.random(size) < 0.2
    u[edge] = rng.choice(EDGE_UNIFORMS, size=int(edge.sum()))
    return u


def target_row(rng: np.random.Generator, vocab: int, q_row: np.ndarray | None) -> np.ndarray:
    """A target row: random with exact zeros, or equal to the draft row, or one-hot (temperature 0)."""
    pick = rng.random()
    if q_row is not None and pick < 0.15:
        return q_row.copy()
    if pick < 0.25:
        return np.eye(vocab)[rng.integers(vocab)]
    return random_row(vocab, rng, zero_prob=0.3)


def chain_case(rng: np.random.Generator) -> tuple[list[int], np.ndarray, np.ndarray]:
    """``(ref, q_rows, p_rows)``: V in 2..6, n in 0..5, each ``ref[i] ~ q_rows[i]``."""
    vocab = int(rng.integers(2, 7))
    n = int(rng.integers(0, 6))
    q = np.array([random_row(vocab, rng, zero_prob=0.3) for _ in range(n)]).reshape(n, vocab)
    ref = [int(rng.choice(vocab, p=row)) for row in q]
    p = np.array([target_row(rng, vocab, q[i] if i < n else None) for i in range(n + 1)])
    return ref, q, p


Case = tuple[DraftTree, np.ndarray, dict[int, np.ndarray]]  # (tree, p_rows, the q rows the tree was built from)


def random_tree(rng: np.random.Generator) -> Case:
    """A ``DraftTree`` built node by node (random parents, a random draw kind per sibling group), its p rows and q rows."""
    vocab = int(rng.integers(2, 7))
    size = int(rng.integers(1, 8))
    parents = [int(rng.integers(-1, i)) for i in range(size)]
    groups: dict[int, list[int]] = {}
    for i, par in enumerate(parents):
        groups.setdefault(par, []).append(i)
    tokens = [0] * size
    draws = [Draw.IID] * size
    q_rows: dict[int, np.ndarray] = {}
    for par, kids in groups.items():
        q_row = random_row(vocab, rng, zero_prob=0.3)
        support = int(np.count_nonzero(q_row))
        kind = ALL_DRAWS[int(rng.integers(3))]
        if (kind == Draw.SWOR and len(kids) > support) or (kind == Draw.TOPK and len(kids) > vocab):
            kind = Draw.IID
        if kind == Draw.IID:
            toks = rng.choice(vocab, size=len(kids), p=q_row)
        elif kind == Draw.SWOR:
            toks = rng.choice(vocab, size=len(kids), replace=False, p=q_row)
        else:
            toks = rng.permutation(vocab)[: len(kids)]
        if kind != Draw.TOPK or rng.random() < 0.5:
            q_rows[par] = q_row  # a topk group may still record its row; it is never read
        for kid, tok in zip(kids, toks):
            tokens[kid], draws[kid] = int(tok), kind
    tree = DraftTree(tuple(parents), tuple(tokens), tuple(draws), q_rows, vocab)
    p = np.array([target_row(rng, vocab, q_rows.get(node)) for node in range(-1, size)])
    return tree, p, q_rows


def sampled_tree(rng: np.random.Generator) -> Case:
    """A tree drawn by ``tmc.drafts.sample_tree_draft`` from a random toy model."""
    vocab = int(rng.integers(2, 7))
    widths = [[2], [3], [2, 2], [1, 2], [2, 1, 1], [3, 1]][int(rng.integers(6))]
    model = ToyModel.random(vocab, len(widths), rng, zero_prob=0.3)
    draft = sample_tree_draft(model, widths, ALL_DRAWS[int(rng.integers(3))], rng)
    return draft.tree, draft.p_rows, model_rows(model, draft.tree)


def model_rows(model: ToyModel, tree: DraftTree) -> dict[int, np.ndarray]:
    """The toy model's draft rows that ``tree`` was built from."""
    return {node: model.q(tree.path(node)) for node in tree.q_rows}


def draft_rows(
    tree: DraftTree, rows: dict[int, np.ndarray], rng: np.random.Generator, filler: str
) -> np.ndarray | None:
    """The ``(N + 1, V)`` draft_probs of the torch API from the rows the tree was built from.

    Not ``tree.q_rows``: ``DraftTree`` renormalises its rows and renormalising
    twice can move the last bit, so the torch verifier gets the input numpy
    got and both normalise it once (a target row copied from the draft row
    then stays bit-equal to it, which decides ties in ordered Traversal).
    Unread rows hold NaN or random junk; ``None`` for half of the all-``topk``
    trees (allowed there).
    """
    if all(d == Draw.TOPK for d in tree.draws) and rng.random() < 0.5:
        return None
    fill = np.nan if filler == "nan" else rng.random()
    q = np.full((tree.size + 1, tree.vocab), fill)
    for node, row in rows.items():
        q[node + 1] = row
    return q


def tree_cases(seed: int, count: int) -> Iterator[tuple[DraftTree, np.ndarray, np.ndarray | None, np.ndarray]]:
    rng = np.random.default_rng(seed)
    for i in range(count):
        tree, p, rows = random_tree(rng) if i % 3 else sampled_tree(rng)
        yield tree, p, draft_rows(tree, rows, rng, "nan" if i % 2 else "junk"), uniforms(rng, tree.size + 1)


def as_tensor(x: np.ndarray | None, device: str) -> torch.Tensor | None:
    return None if x is None else torch.as_tensor(x, device=device)


def check_verified(out: Verified, device: str) -> list[int]:
    """The result's own consistency; returns its tokens as a list."""
    assert isinstance(out, Verified)
    assert out.tokens.dtype == torch.int64 and out.tokens.device.type == device
    assert out.n_accepted == out.tokens.shape[0] - 1 == len(out.nodes)
    return [int(t) for t in out.tokens.tolist()]


# --------------------------------------------------------------- equality


def _traced_ops(fn: Callable[..., object], *args: object) -> set[str]:
    """The aten operations of ``fn`` as dynamo traces it (``torch.compile``, fullgraph, aot eager graphs)."""
    from torch._functorch.aot_autograd import aot_module_simplified

    ops: set[str] = set()

    def backend(gm: torch.fx.GraphModule, inputs: list[torch.Tensor]) -> Callable[..., object]:
        def record(g: torch.fx.GraphModule, _: list[torch.Tensor]) -> Callable[..., object]:
            ops.update(str(n.target) for n in g.graph.nodes if n.op == "call_function")
            return g.forward
        return aot_module_simplified(gm, inputs, fw_compiler=record)

    torch._dynamo.reset()
    torch.compile(fn, backend=backend, fullgraph=True, dynamic=False)(*args)
    torch._dynamo.reset()
    return ops


@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")  # torch's own code
def test_totals_are_sequential_eagerly_and_one_sum_under_compile():
    """Eagerly a total is the scan's last entry (numpy's order below 8 terms, equal rows equal totals); under
    ``torch.compile`` it is a sum reduction (no scan traced), within two sums' rounding bounds of the scan,
    equal rows of one tensor still getting equal totals; the compiled draw traces no binary search, no argmax."""
    from spec.llm.sampling import categorical_draw
    from spec.llm.verify import _total

    rng = np.random.default_rng(3)
    x = torch.from_numpy(rng.random((5, 4096)))
    x[3] = x[1]
    eager = _total(x)
    assert torch.equal(eager, torch.cumsum(x, dim=-1)[:, -1:])
    compiled = torch.compile(_total, fullgraph=True, dynamic=False)(x)
    torch._dynamo.reset()
    assert compiled.shape == (5, 1) and compiled[3] == compiled[1]
    assert torch.allclose(compiled, eager, rtol=4096 * 2.0**-52, atol=0.0)  # 2 (n - 1) 2^-53
    ops = _traced_ops(_total, x)
    assert "aten.sum.dim_IntList" in ops and not any("cumsum" in op for op in ops)
    ops = _traced_ops(categorical_draw, x, torch.rand(5, dtype=torch.float64))
    assert not any("searchsorted" in op or "argmax" in op for op in ops), ops


@pytest.mark.parametrize("device", DEVICES)
def test_chain_verifiers_equal_numpy_on_same_uniforms(device):
    rng = np.random.default_rng(1)
    cases = 300 if device == "cpu" else 100
    for _ in range(cases):
        ref, q, p = chain_case(rng)
        u = uniforms(rng, len(ref) + 1)
        for method in CHAIN_METHODS:
            want = NUMPY_CHAIN[method](ref, q, p, u)
            out = verify_chain(method, torch.tensor(ref, dtype=torch.int64), as_tensor(q, device), as_tensor(p, device), as_tensor(u, device))
            got = check_verified(out, device)
            assert got == want, (method, ref, q.tolist(), p.tolist(), u.tolist())
            assert out.nodes == tuple(range(out.n_accepted))


@pytest.mark.parametrize("device", DEVICES)
def test_chain_verifiers_with_a_deterministic_draft_equal_numpy_with_point_masses(device):
    rng = np.random.default_rng(2)
    for _ in range(150):
        ref, _, p = chain_case(rng)
        q_point = np.eye(p.shape[1])[ref].reshape(len(ref), p.shape[1])
        u = uniforms(rng, len(ref) + 1)
        for method in CHAIN_METHODS:
            want = NUMPY_CHAIN[method](ref, q_point, p, u)
            got = check_verified(verify_chain(method, ref, None, as_tensor(p, device), as_tensor(u, device)), device)
            assert got == want, (method, ref, p.tolist(), u.tolist())


@pytest.mark.parametrize("device", DEVICES)
def test_on_device_chain_verifier_equals_numpy_trusted_or_not(device):
    """The decode loop's entry (one transfer, with the caller's fault flag): the same tokens as the
    numpy reference with and without its value checks, sampled and deterministic drafts."""
    rng = np.random.default_rng(11)
    clear = torch.zeros((), dtype=torch.bool, device=device)
    for _ in range(150 if device == "cpu" else 60):
        ref, q, p = chain_case(rng)
        u = uniforms(rng, len(ref) + 1)
        q_point = np.eye(p.shape[1])[ref].reshape(len(ref), p.shape[1])
        tok = torch.tensor(ref, dtype=torch.int64, device=device)
        for method in CHAIN_METHODS:
            for q_rows, q_ref in ((q, q), (None, q_point)):
                want = NUMPY_CHAIN[method](ref, q_ref, p, u)
                for trusted in (False, True):
                    out, drafted = verify_chain_on_device(method, tok, as_tensor(q_rows, device), as_tensor(p, device),
                                                          as_tensor(u, device), clear, trusted=trusted)
                    assert out is not None and drafted == ref
                    assert check_verified(out, "cpu") == want, (method, trusted, ref, p.tolist(), u.tolist())


def test_on_device_chain_verifier_checks_unless_trusted():
    """A bad row raises on the checked path; the trusted path skips the checks (garbage, no error),
    and a raised fault flag returns ``None`` before anything is read."""
    p = torch.tensor([[0.5, 0.5], [0.9, 0.3]], dtype=torch.float64)  # row 1 sums to 1.2
    q = torch.tensor([[0.5, 0.5]], dtype=torch.float64)
    tok, u = torch.tensor([1]), torch.tensor([0.3, 0.6], dtype=torch.float64)
    clear, raised = torch.tensor(False), torch.tensor(True)
    with pytest.raises(ValueError, match="target_probs row 1 sums to"):
        verify_chain_on_device("sps", tok, q, p, u, clear)
    out, _ = verify_chain_on_device("sps", tok, q, p, u, clear, trusted=True)
    assert out is not None
    assert verify_chain_on_device("sps", tok, q, p, u, raised) == (None, [])
    assert verify_chain_on_device("sps", tok, q, p, u, raised, trusted=True) == (None, [])


def test_asps_takes_one_uniform_or_n_plus_one():
    rng = np.random.default_rng(3)
    for _ in range(50):
        ref, q, p = chain_case(rng)
        u = uniforms(rng, len(ref) + 1)
        one = verify_chain("asps", ref, torch.as_tensor(q), torch.as_tensor(p), torch.as_tensor(u[:1]))
        full = verify_chain("asps", ref, torch.as_tensor(q), torch.as_tensor(p), torch.as_tensor(u))
        assert one.tokens.tolist() == full.tokens.tolist() == asps_sample_from_uniforms(ref, q, p, u[:1])
    assert noise_size("asps", 4) == 1 and noise_size("sps", 4) == noise_size("kseq", 4) == 5


@pytest.mark.parametrize("device", DEVICES)
def test_tree_verifiers_equal_numpy_on_same_uniforms(device):
    checked = 0
    for tree, p, q, u in tree_cases(seed=4, count=240 if device == "cpu" else 80):
        for method in TREE_METHODS:
            want = NUMPY_TREE[method](tree, p, u)
            draws = [d.value for d in tree.draws] if checked % 2 else tree.draws
            out = verify_tree(
                method, torch.tensor(tree.tokens), torch.tensor(tree.parents), draws, as_tensor(q, device), as_tensor(p, device), as_tensor(u, device)
            )
            got = check_verified(out, device)
            assert got == want, (method, tree, p.tolist(), u.tolist())
            # the accepted nodes form the path whose tokens were emitted
            assert [tree.tokens[i] for i in out.nodes] == got[:-1]
            assert all(tree.parents[b] == a for a, b in zip((-1,) + out.nodes, out.nodes))
            checked += 1
    assert checked == len(TREE_METHODS) * (240 if device == "cpu" else 80)


def test_tree_verifiers_take_one_draw_kind_for_all_nodes():
    rng = np.random.default_rng(5)
    model = ToyModel.random(4, 2, rng, zero_prob=0.2)
    for kind in ALL_DRAWS:
        for _ in range(10):
            draft = sample_tree_draft(model, [2, 2], kind, rng)
            tree, u = draft.tree, uniforms(rng, draft.tree.size + 1)
            q = draft_rows(tree, model_rows(model, tree), rng, "nan")
            for method in TREE_METHODS:
                out = verify_tree(method, list(tree.tokens), list(tree.parents), kind.value, q, draft.p_rows, u)
                assert out.tokens.tolist() == NUMPY_TREE[method](tree, draft.p_rows, u)


def test_width_one_tree_is_the_chain():
    # residual verification on a chain is SpS and Traversal is block verification (tmc's module docs)
    rng = np.random.default_rng(6)
    for _ in range(60):
        ref, q, p = chain_case(rng)
        u = uniforms(rng, len(ref) + 1)
        q_tree = np.vstack([q, np.full((1, p.shape[1]), np.nan)])
        parents = list(range(-1, len(ref) - 1))
        for tree_method, chain_method in (("multidraft", "sps"), ("traversal", "block")):
            tree_out = verify_tree(tree_method, ref, parents, "iid", q_tree, p, u)
            assert tree_out.tokens.tolist() == verify_chain(chain_method, ref, q, p, u).tokens.tolist()


@pytest.mark.parametrize("device", DEVICES)
def test_chain_verifiers_equal_numpy_at_vocabulary_32000(device):
    rng = np.random.default_rng(7)
    vocab, n = 32000, 8
    logits = rng.normal(size=(n + 1, vocab)) * 3.0

    def softmax(x: np.ndarray) -> np.ndarray:
        e = np.exp(x - x.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)

    p = softmax(logits)
    q = softmax(logits[:n] + rng.normal(size=(n, vocab)) * 0.3)
    ref = [int(rng.choice(vocab, p=row)) for row in q]
    p_t, q_t = torch.as_tensor(p, device=device), torch.as_tensor(q, device=device)
    for _ in range(4):
        u = uniforms(rng, n + 1)
        for method in CHAIN_METHODS:
            got = check_verified(verify_chain(method, ref, q_t, p_t, torch.as_tensor(u, device=device)), device)
            assert got == NUMPY_CHAIN[method](ref, q, p, u), method


def test_tree_verifiers_equal_numpy_at_vocabulary_32000():
    rng = np.random.default_rng(8)
    vocab = 32000
    for kind in ALL_DRAWS:
        q_root = random_row(vocab, rng, zero_prob=0.5, concentration=0.3)
        q_rows = {-1: q_root, **{i: random_row(vocab, rng, zero_prob=0.5, concentration=0.3) for i in range(2)}}
        if kind == Draw.TOPK:
            kids = [int(t) for t in np.argsort(-q_root, kind="stable")[:2]]
            leaves = [int(np.argmax(q_rows[i])) for i in range(2)]
        else:
            kids = [int(t) for t in rng.choice(vocab, size=2, replace=kind == Draw.IID, p=q_root)]
            leaves = [int(rng.choice(vocab, p=q_rows[i])) for i in range(2)]
        tree = DraftTree.build([-1, -1, 0, 1], kids + leaves, kind.value, q_rows, vocab)
        p = np.array([0.5 * random_row(vocab, rng) + 0.5 * q_rows.get(node, random_row(vocab, rng)) for node in range(-1, 4)])
        q = draft_rows(tree, q_rows, rng, "nan")
        for _ in range(2):
            u = uniforms(rng, tree.size + 1)
            for method in TREE_METHODS:
                out = verify_tree(method, list(tree.tokens), list(tree.parents), tree.draws, q, p, u)
                assert out.tokens.tolist() == NUMPY_TREE[method](tree, p, u), (kind, method)


def test_ordered_traversal_with_three_tiny_swor_children_equals_numpy():
    """Three children drawn without replacement from ``q = [1.0, 1e-200, 1e-200, 1e-200]``, the large token ranked
    first (``p(t) = 1e-210`` for the others): each sorted law given a tiny first child was 0 / 0 in both ports
    (the tuples' probabilities underflowed; tests/tmc/test_ordered_traversal.py has the exact laws).  Both share
    the enumeration now and agree on every uniform, with no warning."""
    import warnings

    q_root = np.array([1.0, 1e-200, 1e-200, 1e-200])
    rows = {-1: q_root, **{node: np.full(4, 0.25) for node in range(3)}}
    tree = DraftTree.build([-1, -1, -1], [1, 2, 3], "swor", rows, 4)
    q = np.array([rows[node] for node in range(-1, 3)])
    p = np.array([[1.0, 1e-210, 1e-210, 1e-210], [0.1, 0.2, 0.3, 0.4], [0.4, 0.3, 0.2, 0.1], [0.25] * 4])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for u0 in EDGE_UNIFORMS:
            u = np.full(tree.size + 1, u0)
            want = ordered_traversal_sample_from_uniforms(tree, p, u)
            out = verify_tree("ordered_traversal", [1, 2, 3], [-1, -1, -1], "swor", q, p, u)
            assert out.tokens.tolist() == want, u0


# ----------------------------------------------------------- edge cases


def test_identical_rows_accept_every_draft_and_emit_the_bonus():
    q = np.array([[0.2, 0.5, 0.3], [0.6, 0.4, 0.0]])
    p = np.vstack([q, [[0.0, 0.0, 1.0]]])
    for method in CHAIN_METHODS:
        out = verify_chain(method, [1, 0], q, p, [math.nextafter(1.0, 0.0)] * 3)
        assert out.tokens.tolist() == [1, 0, 2] and out.n_accepted == 2


def test_zero_target_mass_rejects_even_at_uniform_zero():
    q = np.array([[0.5, 0.5]])
    p = np.array([[1.0, 0.0], [0.5, 0.5]])
    for method in ("sps", "block"):
        assert verify_chain(method, [1], q, p, [0.0, 0.0]).tokens.tolist() == [0]
    for method in TREE_METHODS:
        assert verify_tree(method, [1], [-1], "iid", np.vstack([q, q]), p, [0.0, 0.0]).tokens.tolist() == [0]


def test_one_token_vocabulary_and_empty_drafts():
    one = np.ones((3, 1))
    for method in CHAIN_METHODS:
        assert verify_chain(method, [0, 0], one[:2], one, [0.3, 0.6, 0.9]).tokens.tolist() == [0, 0, 0]
        out = verify_chain(method, [], None, [[0.25, 0.75]], [0.5])
        assert out.tokens.tolist() == [1] and out.n_accepted == 0 and out.nodes == ()
    for method in TREE_METHODS:
        out = verify_tree(method, [], [], "iid", None, [[0.25, 0.75]], [0.5])
        assert out.tokens.tolist() == [1] and out.nodes == ()


def test_float32_rows_are_upcast():
    q = torch.tensor([[0.25, 0.75]], dtype=torch.float32)
    p = torch.tensor([[0.5, 0.5], [1.0, 0.0]], dtype=torch.float32)
    for method in CHAIN_METHODS:
        want = NUMPY_CHAIN[method]([1], q.double().numpy(), p.double().numpy(), np.array([0.6, 0.2]))
        assert verify_chain(method, torch.tensor([1]), q, p, torch.tensor([0.6, 0.2])).tokens.tolist() == want


def _rounded(rows: np.ndarray, excess: float, dtype: torch.dtype) -> torch.Tensor:
    """``rows`` scaled to sum to ``1 + excess`` and rounded to ``dtype``, as a lower-precision softmax leaves them."""
    return torch.tensor(rows * (1.0 + excess)).to(dtype)


def _renormalised(rows: torch.Tensor) -> np.ndarray:
    out = rows.double().numpy()
    return out / out.sum(axis=1, keepdims=True)


@pytest.mark.parametrize(("dtype", "excess"), [(torch.float32, 1.2e-5), (torch.float16, 5e-4), (torch.bfloat16, 3e-3)])
def test_lower_precision_rows_are_checked_at_their_precision(dtype, excess):
    """Rows off by what their precision's softmax leaves (tmc.validate.ROW_SUM_TOLS; 1.2e-5 is a float32
    softmax over 128k tokens) pass and give numpy's tokens on the rows renormalised in float64; float32 rows
    off by 1.2e-5 are refused when given in float64, and a float32 row off by 1e-3 (not a rounding) is refused."""
    rng = np.random.default_rng(5)
    for _ in range(30):
        vocab = int(rng.integers(2, 12))
        q, p = rng.dirichlet(np.ones(vocab), size=2), rng.dirichlet(np.ones(vocab), size=3)
        ref = [int(rng.choice(vocab, p=row)) for row in q]
        q_lo, p_lo = _rounded(q, excess, dtype), _rounded(p, excess, dtype)
        u = rng.random(3)
        for method in CHAIN_METHODS:
            want = NUMPY_CHAIN[method](ref, _renormalised(q_lo), _renormalised(p_lo), u)
            assert verify_chain(method, ref, q_lo, p_lo, u).tokens.tolist() == want
        tree_q = torch.cat([q_lo[:1], q_lo[:1], q_lo[1:]])  # two root children drawn iid, rows (N + 1, V)
        tree_tok = [ref[0], int(rng.choice(vocab, p=q[0]))]
        for method in TREE_METHODS:
            tree = DraftTree((-1, -1), tuple(tree_tok), ("iid", "iid"), {-1: _renormalised(q_lo)[0]}, vocab)
            want = NUMPY_TREE[method](tree, _renormalised(p_lo), u)
            assert verify_tree(method, tree_tok, [-1, -1], "iid", tree_q, p_lo, u).tokens.tolist() == want
    with pytest.raises(ValueError, match=r"target_probs row 0 sums to .*tolerance 1e-06 for float64 rows"):
        verify_chain("sps", [0], [[0.5, 0.5]], _rounded(np.full((2, 2), 0.5), 1.2e-5, torch.float32).double(), [0.1, 0.2])
    with pytest.raises(ValueError, match=r"draft_probs row 0 sums to .*tolerance 0.0001 for float32 rows"):
        verify_chain("sps", [0], _rounded(np.full((1, 2), 0.5), 1e-3, torch.float32), np.full((2, 2), 0.5), [0.1, 0.2])


def test_a_float32_softmax_over_a_llama3_vocabulary_is_accepted():
    """torch's float32 softmax over 128256 tokens: rows off by more than 1e-6 (they were refused), verified
    as numpy verifies the same rows renormalised in float64."""
    gen = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(2, 128256, generator=gen) * 4.0, dim=-1)
    assert float((p.double().sum(dim=1) - 1.0).abs().max()) > 1e-6
    q = p[:1]
    u = np.array([0.4, 0.9])
    want = sps_sample_from_uniforms([int(q.argmax())], _renormalised(q), _renormalised(p), u)
    assert verify_chain("sps", [int(q.argmax())], q, p, u).tokens.tolist() == want


@pytest.mark.parametrize(("where", "bad"), [
    ("target_probs", np.full((2, 2), 0.5) + 0j), ("target_probs", [[True, False], [False, True]]),
    ("draft_probs", np.full((1, 2), 0.5) + 0j), ("uniforms", np.array([0.1, 0.2]) + 0j), ("uniforms", [True, False]),
])
def test_non_real_arrays_are_refused_by_name(where, bad):
    """Complex and bool data given as numpy arrays or lists (not only as tensors) are refused, not cast."""
    args = {"draft_probs": np.full((1, 2), 0.5), "target_probs": np.full((2, 2), 0.5), "uniforms": [0.1, 0.2]}
    args[where] = bad
    with pytest.raises(ValueError, match=rf"^{where} (must hold real numbers|has complex entries)"):
        verify_chain("sps", [0], args["draft_probs"], args["target_probs"], args["uniforms"])
    tree_args = dict(args, draft_probs=np.full((2, 2), 0.5) if where != "draft_probs" else np.full((2, 2), 0.5) + 0j)
    with pytest.raises(ValueError, match=rf"^{where} (must hold real numbers|has complex entries)"):
        verify_tree("traversal", [0], [-1], "iid", tree_args["draft_probs"], tree_args["target_probs"],
                    tree_args["uniforms"])


def test_registry_names_every_method_once():
    assert set(TORCH_VERIFIERS) == set(CHAIN_METHODS) | set(TREE_METHODS)
    assert not set(CHAIN_METHODS) & set(TREE_METHODS)
    q = np.array([[0.5, 0.5]])
    p = np.array([[0.5, 0.5], [0.5, 0.5]])
    for method in CHAIN_METHODS:
        assert TORCH_VERIFIERS[method]([0], q, p, [0.1, 0.1]).tokens.tolist() == [0, 0]
    for method in TREE_METHODS:
        assert TORCH_VERIFIERS[method]([0], [-1], "iid", np.vstack([q, q]), p, [0.1, 0.1]).tokens.tolist() == [0, 0]


# ---------------------------------------------------------------- bad input

Q2 = [[0.5, 0.5], [0.5, 0.5]]
P3 = [[0.5, 0.5], [0.5, 0.5], [0.5, 0.5]]
U3 = [0.1, 0.2, 0.3]


def with_entry(rows: list[list[float]], row: int, col: int, value: float) -> list[list[float]]:
    out = [list(r) for r in rows]
    out[row][col] = value
    return out


CHAIN_BAD = {
    "unknown method": (("spss", [0, 1], Q2, P3, U3), "method must be one of"),
    "tree method as chain": (("kseq", [0, 1], Q2, P3, U3), "method must be one of"),
    "tokens 2-D": (("sps", [[0, 1]], Q2, P3, U3), "draft_tokens must be 1-D"),
    "float tokens": (("sps", [0.0, 1.0], Q2, P3, U3), "draft_tokens must hold integer ids"),
    "target 1-D": (("sps", [0, 1], Q2, [0.5, 0.5], U3), "target_probs must be a 2-D"),
    "target rows": (("sps", [0, 1], Q2, P3[:2], U3), r"target_probs has shape \(2, 2\); expected \(n \+ 1, V\)"),
    "draft rows": (("sps", [0, 1], Q2[:1], P3, U3), r"draft_probs has shape \(1, 2\); expected \(n, V\)"),
    "draft vocab": (("sps", [0, 1], [[1.0], [1.0]], P3, U3), r"draft_probs has shape \(2, 1\)"),
    "uniforms short": (("sps", [0, 1], Q2, P3, U3[:2]), r"uniforms must have shape \(3,\)"),
    "asps uniforms": (("asps", [0, 1], Q2, P3, U3[:2]), r"uniforms must have shape \(1,\) or \(3,\)"),
    "target NaN": (("sps", [0, 1], Q2, with_entry(P3, 2, 0, math.nan), U3), "target_probs row 2 contains NaN"),
    "target inf": (("block", [0, 1], Q2, with_entry(P3, 1, 1, math.inf), U3), "target_probs row 1 contains NaN or infinite"),
    "target negative": (("asps", [0, 1], Q2, with_entry(with_entry(P3, 1, 1, -0.5), 1, 0, 1.5), U3), "target_probs row 1 has a negative entry"),
    "target sum": (("sps", [0, 1], Q2, with_entry(P3, 0, 0, 0.6), U3), "target_probs row 0 sums to"),
    "draft NaN": (("sps", [0, 1], with_entry(Q2, 1, 1, math.nan), P3, U3), "draft_probs row 1 contains NaN"),
    "draft negative": (("block", [0, 1], with_entry(with_entry(Q2, 0, 1, -0.1), 0, 0, 1.1), P3, U3), "draft_probs row 0 has a negative entry"),
    "draft sum": (("asps", [0, 1], with_entry(Q2, 1, 0, 0.9), P3, U3), "draft_probs row 1 sums to"),
    "token too large": (("sps", [0, 2], Q2, P3, U3), r"draft_tokens\[1\] = 2 is outside the vocabulary"),
    "token negative": (("block", [-1, 0], None, P3, U3), r"draft_tokens\[0\] = -1 is outside the vocabulary"),
    "drafted q = 0": (("sps", [0, 1], [[0.5, 0.5], [1.0, 0.0]], P3, U3), r"draft_tokens\[1\] = 1 has draft_probs\[1, 1\] = 0"),
    "uniform one": (("sps", [0, 1], Q2, P3, [0.1, 1.0, 0.3]), r"uniforms\[1\] = 1.0 is not a uniform draw"),
    "uniform negative": (("block", [0, 1], Q2, P3, [-0.1, 0.1, 0.3]), r"uniforms\[0\] = -0.1"),
    "uniform NaN": (("asps", [0, 1], Q2, P3, [math.nan]), r"uniforms\[0\] = nan"),
    "complex rows": (("sps", [0, 1], Q2, torch.ones(3, 2, dtype=torch.complex128) / 2, U3), "target_probs must hold real numbers"),
}


@pytest.mark.parametrize("case", list(CHAIN_BAD), ids=list(CHAIN_BAD))
def test_chain_bad_input_raises(case):
    args, match = CHAIN_BAD[case]
    with pytest.raises(ValueError, match=match):
        verify_chain(*args)


R2 = [[0.5, 0.5]] * 3  # (N + 1, V) rows for a 2-node tree
T2 = ([0, 1], [-1, -1])  # two root children with tokens 0 and 1

TREE_BAD = {
    "unknown method": (("sps", *T2, "iid", R2, R2, U3), "method must be one of"),
    "parents length": (("multidraft", [0, 1], [-1], "iid", R2, R2, U3), r"parents must have shape \(2,\)"),
    "parent not earlier": (("traversal", [0, 1], [-1, 1], "iid", R2, R2, U3), r"parents\[1\] = 1; a parent must be"),
    "parent below root": (("kseq", [0, 1], [-2, 0], "iid", R2, R2, U3), r"parents\[0\] = -2"),
    "bad draw name": (("multidraft", *T2, "greedy", R2, R2, U3), "draws must be one of"),
    "draws length": (("multidraft", *T2, ["iid"], R2, R2, U3), "draws has 1 entries; expected one per node"),
    "mixed siblings": (("traversal", *T2, ["iid", "swor"], R2, R2, U3), "children of node -1 mix draw kinds"),
    "swor repeat": (("kseq", [1, 1], [-1, -1], "swor", R2, R2, U3), r"children of node -1 repeat a token"),
    "topk repeat": (("multidraft", [1, 1], [-1, -1], "topk", None, R2, U3), r"repeat a token \(\[1, 1\]\) but were drawn 'topk'"),
    "no draft rows": (("ordered_traversal", *T2, "iid", None, R2, U3), "draft_probs is None but node -1 has children drawn 'iid'"),
    "token outside": (("multidraft", [0, 2], [-1, -1], "iid", R2, R2, U3), r"draft_tokens\[1\] = 2 is outside"),
    "target shape": (("multidraft", *T2, "iid", R2, R2[:2], U3), r"target_probs has shape \(2, 2\); expected \(N \+ 1, V\)"),
    "draft shape": (("multidraft", *T2, "iid", R2[:2], R2, U3), r"draft_probs has shape \(2, 2\); expected \(N \+ 1, V\)"),
    "target NaN": (("traversal", *T2, "iid", R2, with_entry(R2, 2, 1, math.nan), U3), "target_probs row 2 contains NaN"),
    "target negative": (("kseq", *T2, "iid", R2, with_entry(with_entry(R2, 0, 0, -1.0), 0, 1, 2.0), U3), "target_probs row 0 has a negative"),
    "target sum": (("multidraft", *T2, "iid", R2, with_entry(R2, 1, 1, 0.7), U3), "target_probs row 1 sums to"),
    "target +inf and -inf": (("traversal", *T2, "iid", R2, with_entry(with_entry(R2, 1, 0, math.inf), 1, 1, -math.inf), U3),
                             "target_probs row 1 contains NaN or infinite"),
    "target -inf": (("multidraft", *T2, "iid", R2, with_entry(R2, 0, 1, -math.inf), U3), "target_probs row 0 contains NaN or infinite"),
    "used draft row NaN": (("multidraft", *T2, "iid", with_entry(R2, 0, 0, math.nan), R2, U3), "draft_probs row 0 contains NaN"),
    "used draft row sum": (("kseq", [0, 1], [-1, 0], "iid", with_entry(R2, 1, 0, 0.1), R2, U3), "draft_probs row 1 sums to"),
    "drafted q = 0": (("traversal", *T2, "swor", [[1.0, 0.0]] * 3, R2, U3), r"draft_tokens\[1\] = 1 has draft_probs\[0, 1\] = 0"),
    "uniform one": (("kseq", *T2, "iid", R2, R2, [0.1, 0.2, 1.0]), r"uniforms\[2\] = 1.0"),
    "uniforms length": (("kseq", *T2, "iid", R2, R2, U3[:2]), r"uniforms must have shape \(3,\)"),
    "float parents": (("multidraft", [0, 1], [-1.0, -1.0], "iid", R2, R2, U3), "parents must hold integer ids"),
}


@pytest.mark.parametrize("case", list(TREE_BAD), ids=list(TREE_BAD))
def test_tree_bad_input_raises(case):
    args, match = TREE_BAD[case]
    with pytest.raises(ValueError, match=match):
        verify_tree(*args)


def test_unread_draft_rows_may_hold_anything():
    # only the root's row is read (its children are iid; the leaves have no children)
    q = [[0.5, 0.5], [math.nan, -3.0], [7.0, 7.0]]
    for method in TREE_METHODS:
        assert verify_tree(method, *T2, "iid", q, R2, [0.1, 0.2, 0.3]).tokens.tolist() == [0, 0]


def test_ordered_traversal_refuses_a_huge_swor_enumeration():
    vocab = 200
    q = np.full((4, vocab), 1.0 / vocab)
    assert math.perm(vocab, 3) > MAX_SWOR_TUPLES
    with pytest.raises(ValueError, match="MAX_SWOR_TUPLES"):
        verify_tree("ordered_traversal", [0, 1, 2], [-1, -1, -1], "swor", q, q, [0.5] * 4)
    # the other tree verifiers do not enumerate
    assert verify_tree("traversal", [0, 1, 2], [-1, -1, -1], "swor", q, q, [0.0] * 4).n_accepted == 1


def test_ordered_traversal_on_a_row_whose_mass_one_token_holds():
    """Three children drawn without replacement from a row where token 0 holds ``q = 1.0`` as stored (the
    others ``1e-20`` to ``3e-20``): the sorted laws meet ``1 − Σ drawn = 0`` with tokens left and sum the
    tokens left (``tmc.ordered_traversal.mass_left``); the torch port gives numpy's tokens on a grid of
    uniforms, with no division by zero in either (warnings are errors here)."""
    q_row = np.array([1.0, 1e-20, 3e-20, 2e-20])
    tree = DraftTree((-1, -1, -1), (0, 1, 2), (Draw.SWOR,) * 3, {-1: q_row}, 4)
    p = np.array([[0.1, 0.4, 0.2, 0.3], [0.25] * 4, [0.25] * 4, [0.25] * 4])
    q = np.vstack([q_row, np.full((3, 4), np.nan)])  # only the root's row is read
    grid = np.linspace(0.0, 0.999, 7)
    for u in ((a, b, c, d) for a in grid for b in grid[::3] for c in grid[::3] for d in grid[::2]):
        want = ordered_traversal_sample_from_uniforms(tree, p, np.array(u))
        got = verify_tree("ordered_traversal", [0, 1, 2], [-1, -1, -1], "swor", q, p, list(u))
        assert got.tokens.tolist() == want, u


def test_noise_size_rejects_unknown_methods():
    with pytest.raises(ValueError, match="method must be one of"):
        noise_size("greedy", 3)


@pytest.mark.parametrize("device", DEVICES)
def test_asps_rejection_whose_residual_rounds_away_equals_numpy(device):
    """``q = [1e-300, 1.0]`` at full weight: numpy's ASpS kernel summed to 0 (its samplers raised); both now take
    the residual rule, with the same tokens for every uniform."""
    cases = [([0], [[1e-300, 1.0]], [[0.0, 1.0], [0.5, 0.5]]),
             ([1, 1, 0], [[0.0, 1.0], [0.9996889, 3.111e-4], [1.7e-300, 1.0]],
              [[0.9215, 0.0785], [0.6624, 0.3376], [0.0, 1.0], [0.0, 1.0]])]
    for ref, q, p in cases:
        q, p = np.array(q), np.array(p)
        for u0 in EDGE_UNIFORMS:
            u = np.array([u0])
            want = asps_sample_from_uniforms(ref, q, p, u)
            out = verify_chain("asps", torch.tensor(ref, dtype=torch.int64), as_tensor(q, device), as_tensor(p, device),
                               as_tensor(u, device))
            assert check_verified(out, device) == want, (ref, u0)


@pytest.mark.parametrize("device", DEVICES)
def test_block_stop_at_full_weight_whose_residual_rounds_away_equals_numpy(device):
    """Weight back at 1, then ``q = [1e-168, 1.0]`` next to ``p = [1e-281, 1.0]``: no residual mass in floats;
    the stop test there fires (stop = 1) in both ports, with the same tokens for every uniform."""
    ref, q = [0, 0], np.array([[0.3, 0.7], [1e-168, 1.0]])
    p = np.array([[0.4, 0.6], [1e-281, 1.0], [0.5, 0.5]])
    for u0 in EDGE_UNIFORMS:
        u = np.array([u0, u0, 0.5])
        want = block_sample_from_uniforms(ref, q, p, u)
        out = verify_chain("block", torch.tensor(ref, dtype=torch.int64), as_tensor(q, device), as_tensor(p, device),
                           as_tensor(u, device))
        assert check_verified(out, device) == want, u0
    assert want == [0, 1]


@pytest.mark.parametrize("device", DEVICES)
def test_chain_ports_where_a_row_falls_short_by_ulps_equal_numpy(device):
    """A first draft with ``p = q``, then rows equal but for an entry a few ulps lower in ``p``: no residual mass
    and ``1 − a = 0`` at full weight; block's scan stops there and ASpS takes SpS's residual there, in both ports
    (tests/tmc/test_chain_exact.py has the exact laws), with the same tokens for every uniform."""
    from tests.tmc.test_chain_exact import ULP_DEFICIT_P, ULP_DEFICIT_Q

    ref, q = [0, 1], np.array([ULP_DEFICIT_Q, ULP_DEFICIT_Q])
    p = np.array([ULP_DEFICIT_Q, ULP_DEFICIT_P, ULP_DEFICIT_Q])
    for method in ("sps", "asps", "block"):
        for u0 in EDGE_UNIFORMS:
            shapes = [np.array([u0])] if method == "asps" else [np.array([u0, u0, u0]), np.array([0.5, u0, 0.5]),
                                                                 np.array([0.5, 0.5, u0])]
            if method == "asps":  # the kernel's cells of rows 0 and 1 lie below ~2.6e-16
                shapes.append(np.array([min(u0, 1e-16)]))
            for u in shapes:
                want = NUMPY_CHAIN[method](ref, q, p, u)
                out = verify_chain(method, torch.tensor(ref, dtype=torch.int64), as_tensor(q, device),
                                   as_tensor(p, device), as_tensor(u, device))
                assert check_verified(out, device) == want, (method, u)
                assert want[:1] == [0], (method, u)


@pytest.mark.parametrize("device", DEVICES)
def test_chain_ports_at_the_subnormal_edge_equal_numpy(device):
    """A draft of ``p = 0`` then one of subnormal ``q``: the torch closed form of the running weights met
    ``−inf + inf`` (NaN) where the log ratio overflowed; a drafted ``q = 5e-324`` with ``p = 0``: numpy raised.
    Both ports now reject at the first draft (tests/tmc/test_chain_exact.py has the exact law)."""
    cases = [([0, 1], [[0.5, 0.5], [1.0, 1e-310]], [[0.0, 1.0], [0.5, 0.5], [0.5, 0.5]]),
             ([1], [[1.0, 1e-310]], [[0.5, 0.5], [0.25, 0.75]]),
             ([0], [[5e-324, 1.0]], [[0.0, 1.0], [0.5, 0.5]])]
    for ref, q, p in cases:
        q, p = np.array(q), np.array(p)
        for method in ("sps", "asps", "block"):
            for u0 in EDGE_UNIFORMS:
                u = np.array([u0]) if method == "asps" else np.full(len(ref) + 1, u0)
                want = NUMPY_CHAIN[method](ref, q, p, u)
                out = verify_chain(method, torch.tensor(ref, dtype=torch.int64), as_tensor(q, device),
                                   as_tensor(p, device), as_tensor(u, device))
                assert check_verified(out, device) == want, (method, ref, u0)
                if ref == [0, 1] or ref == [0]:
                    assert want == [1], (method, ref, u0)


@pytest.mark.parametrize("device", DEVICES)
def test_ports_beside_a_shared_entry_near_one_equal_numpy(device):
    """The drafts of tests/tmc/test_chain_exact.py's ``SHARED_DOMINANT_CHAINS`` (rows standing for ``1 − tiny``
    where floats hold 1.0; numpy's kernels equal exact rationals there): every chain port, and the host tree
    walks on the same chains as trees, give numpy's tokens for every uniform."""
    from tests.tmc.test_chain_exact import SHARED_DOMINANT_CHAINS

    for ref, q, p in SHARED_DOMINANT_CHAINS:
        q, p = np.array(q), np.array(p)
        tree = DraftTree.chain(ref, q)
        q_tree = np.vstack([q, np.full(q.shape[1], 1 / q.shape[1])])  # (N + 1, V): the last node's row is unread
        for u0 in EDGE_UNIFORMS:
            for method in ("sps", "asps", "block"):
                u = np.array([u0]) if method == "asps" else np.full(len(ref) + 1, u0)
                want = NUMPY_CHAIN[method](ref, q, p, u)
                out = verify_chain(method, torch.tensor(ref, dtype=torch.int64), as_tensor(q, device),
                                   as_tensor(p, device), as_tensor(u, device))
                assert check_verified(out, device) == want, (method, ref, u0)
            u = np.full(len(ref) + 1, u0)
            for method in ("multidraft", "traversal", "ordered_traversal"):
                want = NUMPY_TREE[method](tree, p, u)
                got = verify_tree(method, list(tree.tokens), list(tree.parents), tree.draws, as_tensor(q_tree, device),
                                  as_tensor(p, device), as_tensor(u, device))
                assert got.tokens.tolist() == want, (method, ref, u0)


@pytest.mark.parametrize(("n", "match"), [(-3, "n must be >= 0, got -3"), (1.5, "n must be an integer, got 1.5"),
                                          (True, "n must be an integer, got True"), ("3", "n must be an integer")])
def test_noise_size_checks_its_count(n, match):
    """``noise_size('sps', -3)`` was -2 and ``noise_size('sps', 1.5)`` 2.5."""
    with pytest.raises(ValueError, match=match):
        noise_size("sps", n)
    assert (noise_size("sps", 0), noise_size("kseq", 3), noise_size("asps", 3)) == (1, 4, 1)


def test_a_uint64_token_past_int64_is_reported_as_given():
    """The int64 cast came first: ``2**64 - 1`` was reported as ``draft_tokens[0] = -1``."""
    tok = np.array([2**64 - 1], dtype=np.uint64)
    p = torch.full((2, 2), 0.5, dtype=torch.float64)
    u = torch.full((2,), 0.5, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"^draft_tokens\[0\] = 18446744073709551615 is outside the int64 range"):
        verify_chain("sps", tok, p[:1], p, u)
    with pytest.raises(ValueError, match=r"^draft_tokens\[0\] = 18446744073709551615 is outside the int64 range"):
        verify_tree("multidraft", tok, [-1], "iid", p[:1], p, u)
    assert verify_chain("sps", np.array([1], dtype=np.uint64), p[:1], p, u).n_accepted == 1


def test_block_ports_where_a_drafted_ratio_lies_between_two_and_four():
    """Block verification with drafts whose second ratio p/q is 2.1 (after a first below 1): the log ratio is
    ``log p − log q`` there (``log1p`` only where ``q/2 <= p <= 2q``, as ``tmc.chain._log_ratio``), and at this
    uniform the two forms give different tokens (a mutation audit's case)."""
    q = np.array([[0.4133736580843336, 0.28453625827326273, 0.30209008364240364],
                  [0.31484650075707715, 0.0006172379403217016, 0.6845362613026013]])
    p = np.array([[0.10634645300274843, 0.13879161876986973, 0.7548619282273817],
                  [0.6661462017997217, 0.14728133016451606, 0.18657246803576227],
                  [0.11753332907993211, 0.7292289583672279, 0.15323771255284008]])
    u = np.array([0.999, 0.5443157442482136, 0.5])
    want = block_sample_from_uniforms([0, 0], q, p, u)
    assert want == [0, 0, 1]
    assert verify_chain("block", [0, 0], torch.as_tensor(q), torch.as_tensor(p), torch.as_tensor(u)).tokens.tolist() == want
