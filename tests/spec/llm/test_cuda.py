"""The decode loop on a CUDA device (marker ``gpu``; skipped without one): same tokens as on the CPU.

Tiny random pairs in float32: the tree forward's node logits on CUDA equal the
CPU's (TF32 off), greedy decoding through every builder family equals plain
greedy decoding, and at temperature 1 a seeded run gives the CPU run's tokens
(same uniforms, rows equal to float32 rounding) on nearly every seed.
"""

from __future__ import annotations

import copy
import itertools

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from spec.bench_decode import parse_method, run_decode_bench  # noqa: E402
from spec.llm.generate import ASKED_FUSION_ONLY, ar_generate, generate  # noqa: E402
from spec.llm.models import tiny_pair  # noqa: E402

pytestmark = [pytest.mark.llm, pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

METHODS = [("chain", "sps"), ("chain", "asps"), ("chain", "block"), ("fixed", "multidraft"), ("fixed", "traversal"),
           ("dyspec", "traversal"), ("dynatree", "traversal"), ("wetap", "traversal")]


@pytest.fixture(scope="module")
def pairs() -> tuple[tuple[object, object], tuple[object, object]]:
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    target, draft = tiny_pair(37, seed=5)
    with torch.no_grad():  # sharper rows: deeper trees, fewer near-ties
        target.lm_head.weight.mul_(20.0)
        draft.lm_head.weight.mul_(20.0)
    return (target, draft), (copy.deepcopy(target).cuda(), copy.deepcopy(draft).cuda())


@pytest.mark.parametrize("step_graph", [False, "auto"])
@pytest.mark.parametrize(("builder", "verifier"), METHODS)
def test_greedy_on_cuda_equals_greedy_on_cpu(pairs: tuple[tuple[object, object], tuple[object, object]],
                                             builder: str, verifier: str, step_graph: bool | str) -> None:
    (t_cpu, _), (t_gpu, d_gpu) = pairs
    prompt = [2, 7, 1, 8, 2, 8]
    ref = ar_generate(t_cpu, prompt, temperature=0, max_new_tokens=24).tokens
    assert ar_generate(t_gpu, prompt, temperature=0, max_new_tokens=24).tokens == ref
    out = generate(t_gpu, d_gpu, prompt, builder, verifier, budget=8, temperature=0, max_new_tokens=24, seed=0,
                   step_graph=step_graph)
    assert out.tokens == ref


def test_sampling_on_cuda_follows_the_cpu_run(pairs: tuple[tuple[object, object], tuple[object, object]]) -> None:
    """Same seed, same uniforms: the CUDA run emits the CPU run's tokens unless a uniform lands within
    float32 rounding of a decision boundary (a rare event); at least 9 of 10 seeds must agree."""
    (t_cpu, d_cpu), (t_gpu, d_gpu) = pairs
    prompt = [3, 1, 4, 1, 5]
    same = 0
    for seed in range(10):
        a = generate(t_cpu, d_cpu, prompt, "dyspec", "traversal", budget=8, temperature=1.0, max_new_tokens=12, seed=seed)
        b = generate(t_gpu, d_gpu, prompt, "dyspec", "traversal", budget=8, temperature=1.0, max_new_tokens=12, seed=seed)
        same += a.tokens == b.tokens
    assert same >= 9


@pytest.mark.parametrize(("builder", "verifier"), [("chain", "sps"), ("chain", "block"), ("dyspec", "traversal"),
                                                 ("fixed", "multidraft")])
def test_verify_backends_agree_on_cuda(pairs: tuple[tuple[object, object], tuple[object, object]],
                                       builder: str, verifier: str) -> None:
    """On the device the torch verifiers and their numpy references (rows copied to the host) see the same
    rows and uniforms: the same tokens and accepted counts, on the device chain path and on trees."""
    _, (t_gpu, d_gpu) = pairs
    for seed in range(3):
        kw = dict(budget=6, temperature=1.0, max_new_tokens=12, seed=seed)
        runs = [generate(t_gpu, d_gpu, [3, 1, 4], builder, verifier, verify_backend=b, step_graph=False, **kw)
                for b in ("torch", "numpy", "auto")]
        assert runs[0].tokens == runs[1].tokens == runs[2].tokens, seed
        assert [s.accepted for s in runs[0].steps] == [s.accepted for s in runs[1].steps]


def test_device_tree_on_cuda(pairs: tuple[tuple[object, object], tuple[object, object]]) -> None:
    """A fixed i.i.d. tree drafted on the GPU (``draft_tree``): greedy decoding equals the CPU's, and at
    T = 1 the tokens follow the host-drafted run on the same GPU unless a uniform lands within rounding
    of a boundary (the device's cumulative sums need not round as numpy's do): 9 of 10 seeds must agree."""
    (t_cpu, _), (t_gpu, d_gpu) = pairs
    prompt = [2, 7, 1, 8, 2, 8]
    iid = {"draw": "iid"}
    ref = ar_generate(t_cpu, prompt, temperature=0, max_new_tokens=24).tokens
    assert generate(t_gpu, d_gpu, prompt, "fixed", "traversal", budget=8, builder_params=iid, temperature=0,
                    max_new_tokens=24, seed=0, step_graph=False).tokens == ref
    same = 0
    for seed in range(10):
        runs = [generate(t_gpu, d_gpu, prompt, "fixed", "traversal", budget=8, builder_params=iid, temperature=1.0,
                         max_new_tokens=12, seed=seed, chain_on_device=on_device, step_graph=False)
                for on_device in (False, True)]
        same += runs[0].tokens == runs[1].tokens
    assert same >= 9


def test_device_topk_tree_on_cuda(pairs: tuple[tuple[object, object], tuple[object, object]]) -> None:
    """A fixed top-k tree drafted on the GPU (ranked tokens) under a greedy target with the draft at 1:
    greedy decoding equals the CPU's, and the host-drafted run on the same GPU gives the same tokens and
    accepted counts (ranking draws no uniform; a near-tie between two draft tokens could still rank
    differently on the device, so 4 of 5 prompts must agree step by step)."""
    (t_cpu, _), (t_gpu, d_gpu) = pairs
    topk = {"draw": "topk", "width": 2}
    same = 0
    for i in range(5):
        prompt = [2 + i, 7, 1, 8, 2, 8]
        ref = ar_generate(t_cpu, prompt, temperature=0, max_new_tokens=16).tokens
        runs = [generate(t_gpu, d_gpu, prompt, "fixed", "traversal", budget=6, builder_params=topk, temperature=0,
                         draft_temperature=1.0, max_new_tokens=16, seed=i, chain_on_device=on_device,
                         step_graph=False) for on_device in (False, True)]
        assert runs[0].tokens == runs[1].tokens == ref
        same += [s.accepted for s in runs[0].steps] == [s.accepted for s in runs[1].steps]
    assert same >= 4


def test_confidence_chain_on_cuda(pairs: tuple[tuple[object, object], tuple[object, object]]) -> None:
    """A chain that stops at its first token with ``q(x) < 0.3`` (one host read per token on the GPU) under a
    greedy target with the draft at 1: greedy decoding equals the CPU's, and at T = 1 the device path follows
    the host path on the same GPU on at least 9 of 10 seeds (a uniform within rounding of a boundary, or a
    probability within rounding of the threshold, may part them)."""
    (t_cpu, _), (t_gpu, d_gpu) = pairs
    prompt = [2, 7, 1, 8, 2, 8]
    ref = ar_generate(t_cpu, prompt, temperature=0, max_new_tokens=24).tokens
    for draw in ("iid", "topk"):
        assert generate(t_gpu, d_gpu, prompt, "chain", "sps", budget=8, temperature=0, draft_temperature=1.0,
                        builder_params={"draw": draw, "confidence": 0.3}, max_new_tokens=24, seed=0).tokens == ref
    same = 0
    for seed in range(10):
        runs = [generate(t_gpu, d_gpu, prompt, "chain", "sps", budget=8, builder_params={"confidence": 0.3},
                         temperature=1.0, max_new_tokens=12, seed=seed, chain_on_device=on_device)
                for on_device in (False, True)]
        same += runs[0].tokens == runs[1].tokens
    assert same >= 9


def test_bench_runs_on_cuda(pairs: tuple[tuple[object, object], tuple[object, object]]) -> None:
    _, (t_gpu, d_gpu) = pairs
    methods = [parse_method(m, 8, 3) for m in ("ar", "hf-assisted", "chain:sps", "dyspec:traversal")]
    report = run_decode_bench(t_gpu, d_gpu, [[1, 2, 3, 4]], methods, temperatures=(0.0,), new_tokens=8, warmup=False)
    assert all(r["agree_ar"] == 1.0 for r in report["rows"])
    assert report["environment"]["device"] != "cpu"


def test_static_cache_graphs_are_captured_once_and_replay_the_eager_forwards(
        pairs: tuple[tuple[object, object], tuple[object, object]]) -> None:
    """generate on CUDA defaults to the static cache with CUDA graphs: captured in the first call, only
    replayed in the next; replays give the eager static forwards' tokens on every seed."""
    from spec.llm.static_cache import shared_static_cache

    _, (t_gpu, d_gpu) = pairs
    prompt = [4, 4, 2, 9]
    generate(t_gpu, d_gpu, prompt, "dyspec", "traversal", budget=8, temperature=1.0, max_new_tokens=16, seed=0)
    caches = [shared_static_cache(m, role, 1, graphs=True) for m, role in ((t_gpu, "target"), (d_gpu, "draft"))]
    captured = [c.captures for c in caches]
    assert all(c.graphs for c in caches) and min(captured) > 0
    for seed in range(5):
        kw = dict(budget=8, temperature=1.0, max_new_tokens=16, seed=seed)
        graphed = generate(t_gpu, d_gpu, prompt, "dyspec", "traversal", **kw)
        eager = generate(t_gpu, d_gpu, prompt, "dyspec", "traversal", cache="static", graphs=False, **kw)
        assert graphed.tokens == eager.tokens
    assert [shared_static_cache(m, r, 1, graphs=True).captures for m, r in ((t_gpu, "target"), (d_gpu, "draft"))] == captured
    greedy = ar_generate(t_gpu, prompt, temperature=0, max_new_tokens=24, cache="static")
    assert greedy.tokens == ar_generate(t_gpu, prompt, temperature=0, max_new_tokens=24).tokens


def test_beam_selection_on_cuda_equals_the_numpy_reference() -> None:
    """select_beam_torch on CUDA rows (the WETAP path there) against select_beam on the same rows, ties included."""
    import numpy as np

    from spec.draft import select_beam
    from spec.llm.adapter import select_beam_torch
    from tests.spec.test_beam import random_rows

    rng = np.random.default_rng(9)
    for _ in range(50):
        n, vocab = int(rng.integers(1, 40)), int(rng.integers(1, 300))
        probs = random_rows(rng, n, vocab)
        weights = rng.choice([0.0, 0.3, 1.0], size=n) * rng.random(n)
        k = int(rng.integers(1, 160))
        pos, val = select_beam_torch(torch.from_numpy(probs).cuda(), weights, k)
        want_pos, want_val = select_beam(probs, weights, k)
        np.testing.assert_array_equal(pos, want_pos)
        np.testing.assert_array_equal(val, want_val)


def test_top_ranking_on_cuda_equals_the_numpy_reference() -> None:
    """select_top_torch on CUDA rows (the DynaTree path there) against select_top on the same rows, ties included."""
    import numpy as np

    from spec.draft import select_top
    from spec.llm.adapter import select_top_torch
    from tests.spec.test_beam import random_rows

    rng = np.random.default_rng(10)
    for _ in range(50):
        n, vocab = int(rng.integers(1, 40)), int(rng.integers(1, 300))
        probs = random_rows(rng, n, vocab)
        k = int(rng.integers(1, 12))
        tokens, values = select_top_torch(torch.from_numpy(probs).cuda(), k)
        want_tokens, want_values = select_top(probs, k)
        np.testing.assert_array_equal(tokens, want_tokens)
        np.testing.assert_array_equal(values, want_values)


@pytest.mark.parametrize("name", ["mistral", "gemma3"])
def test_windowed_models_replay_graphs_on_the_static_cache(name: str) -> None:
    """A sliding-window pair (every layer windowed: Mistral; by layer kind, two mask buffers: Gemma 3) takes the
    static cache with graphs under ``auto`` and decodes 29 positions past a window of 3 greedily, as plain
    decoding on the CPU does; at T = 1 the graphed run gives the eager static run's tokens."""
    from spec.llm.generate import resolve_cache
    from tests.spec.llm.conftest import greedy_decode
    from tests.spec.llm.test_windows import tiny

    torch.backends.cuda.matmul.allow_tf32 = False
    target, draft = tiny(name, 0, 3), tiny(name, 1, 3)
    prompt, n = [3, 1, 4, 1, 5], 24
    ref = greedy_decode(target, prompt, n)
    t_gpu, d_gpu = target.cuda(), draft.cuda()
    assert resolve_cache(t_gpu, "auto", d_gpu) == "static"
    assert ar_generate(t_gpu, prompt, temperature=0, max_new_tokens=n, cache="static").tokens == ref
    for builder, verifier in [("dyspec", "traversal"), ("chain", "sps"), ("fixed", "multidraft")]:
        kw = dict(temperature=0, max_new_tokens=n, budget=6, draft_temperature=1.0)
        assert generate(t_gpu, d_gpu, prompt, builder, verifier, **kw).tokens == ref, (builder, verifier)
    for seed in range(3):
        kw = dict(budget=6, temperature=1.0, max_new_tokens=n, seed=seed)
        graphed = generate(t_gpu, d_gpu, prompt, "dyspec", "traversal", **kw)
        eager = generate(t_gpu, d_gpu, prompt, "dyspec", "traversal", cache="static", graphs=False, **kw)
        assert graphed.tokens == eager.tokens


def _graphed_eager_and_plain_agree(t_gpu: object, d_gpu: object, prompt: list[int], builder: str, verifier: str,
                                   **tree: object) -> None:
    """At T = 1 on 5 seeds: the fused steps replayed as graphs, the same steps run eagerly (``graphs=False``)
    and the usual device path give the same tokens."""
    for seed in range(5):
        kw: dict[str, object] = dict(temperature=1.0, max_new_tokens=40, seed=seed, **tree)
        graphed = generate(t_gpu, d_gpu, prompt, builder, verifier, step_graph=True, **kw)
        eager = generate(t_gpu, d_gpu, prompt, builder, verifier, step_graph=True, cache="static", graphs=False, **kw)
        plain = generate(t_gpu, d_gpu, prompt, builder, verifier, step_graph=False, **kw)
        assert graphed.tokens == eager.tokens == plain.tokens, seed


@pytest.mark.parametrize("verifier", ["sps", "asps", "block"])
def test_fused_chain_steps_replay_one_graph(pairs: tuple[tuple[object, object], tuple[object, object]],
                                           verifier: str) -> None:
    """``step_graph=True`` on CUDA captures the whole chain step once and replays it every later step, in later
    decodes too: greedy decoding equals plain greedy decoding on the CPU, and at T = 1 the graphed run gives the
    tokens of the same fused step run eagerly (``graphs=False``) and of the usual device chain, on every seed; a
    window of 3 (Mistral, Gemma 3) decodes greedily past it."""
    from spec.llm.static_cache import shared_static_cache
    from spec.llm.step_graph import ChainStepGraph
    from tests.spec.llm.conftest import greedy_decode
    from tests.spec.llm.test_windows import tiny

    (t_cpu, _), (t_gpu, d_gpu) = pairs
    prompt = [2, 7, 1, 8, 2, 8]
    ref = ar_generate(t_cpu, prompt, temperature=0, max_new_tokens=40).tokens
    t_cache = shared_static_cache(t_gpu, "target", 1, graphs=True)
    t_cache.step_graphs.clear()  # the cache is shared: an earlier test in this process may have left steps on it
    for draw in ("iid", "topk"):
        for run in range(2):
            out = generate(t_gpu, d_gpu, prompt, "chain", verifier, budget=4, temperature=0, max_new_tokens=40,
                           step_graph=True, builder_params={"draw": draw})
            assert out.tokens == ref, draw
            fused = [s for s in t_cache.step_graphs.values() if isinstance(s, ChainStepGraph)
                     and s.iid == (draw == "iid") and s.verifier == verifier and s.sampling.temperature == 0]
            assert len(fused) == 1 and fused[0].graphs and fused[0].captures == 1  # once, in the first decode
            assert fused[0].replays == (run + 1) * (len(out.steps) - 1) > 0
    _graphed_eager_and_plain_agree(t_gpu, d_gpu, prompt, "chain", verifier, budget=4)
    for name in ("mistral", "gemma3"):
        target, draft = tiny(name, 0, 3), tiny(name, 1, 3)
        want = greedy_decode(target, [3, 1, 4, 1, 5], 24)
        got = generate(target.cuda(), draft.cuda(), [3, 1, 4, 1, 5], "chain", verifier, temperature=0, budget=4,
                       max_new_tokens=24, draft_temperature=1.0, step_graph=True)
        assert got.tokens == want, name


def test_fused_step_profile_on_cuda(pairs: tuple[tuple[object, object], tuple[object, object]]) -> None:
    """``ChainStepGraph.profile`` captures its forwards-only graphs and times them next to the step's."""
    from spec.llm.generate import _new_cache, _prefill
    from spec.llm.sampling import Sampling
    from spec.llm.step_graph import ChainStepGraph

    _, (t_gpu, d_gpu) = pairs
    tc, dc = _new_cache(t_gpu, "static", "target", 128, None), _new_cache(d_gpu, "static", "draft", 128, None)
    _prefill(t_gpu, tc, [1, 2, 3])
    _prefill(d_gpu, dc, [1, 2, 3])
    step = ChainStepGraph(t_gpu, d_gpu, tc, dc, k=4, verifier="sps", iid=True, sampling=Sampling(),
                          d_sampling=Sampling(), vocab=37)
    got = step.profile(3, 4, 3, [4], reps=20)
    assert step.graphs and step.captures == 1 and min(got["step_ms"], got["forwards_ms"], got["target_ms"]) > 0
    assert (tc.length, dc.length) == (3, 3)


@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")  # torch's own code
@pytest.mark.filterwarnings("ignore:TensorFloat32 tensor cores:UserWarning")  # inductor's advice; TF32 stays off
@pytest.mark.filterwarnings(r"ignore:\s*Online softmax is disabled:UserWarning")  # inductor's notice (tiny rows)
@pytest.mark.parametrize(("verifier", "scope"), [(v, c) for v in ("sps", "asps", "block") for c in (True, "whole")])
def test_compiled_fused_steps_on_cuda(pairs: tuple[tuple[object, object], tuple[object, object]], verifier: str,
                                      scope: bool | str) -> None:
    """``compile_step=True``: inductor's kernels for the draws and the verifier inside the captured step graph
    (``"whole"``: the whole step, both models' forwards included).  Greedy decoding equals the CPU's; at T = 1 the
    tokens equal the plain device chain's on at least 4 of 5 seeds (inductor may order a float64 sum otherwise,
    moving a row by about 1e-18, or a float32 one in a compiled forward; a draw flips only when a uniform lands
    that close to a boundary)."""
    (t_cpu, _), (t_gpu, d_gpu) = pairs
    prompt = [2, 7, 1, 8, 2, 8]
    ref = ar_generate(t_cpu, prompt, temperature=0, max_new_tokens=40).tokens
    out = generate(t_gpu, d_gpu, prompt, "chain", verifier, budget=4, temperature=0, max_new_tokens=40,
                   step_graph=True, compile_step=scope)
    assert out.tokens == ref
    same = 0
    for seed in range(5):
        kw = dict(budget=4, temperature=1.0, max_new_tokens=40, seed=seed)
        compiled = generate(t_gpu, d_gpu, prompt, "chain", verifier, step_graph=True, compile_step=scope, **kw)
        same += compiled.tokens == generate(t_gpu, d_gpu, prompt, "chain", verifier, step_graph=False, **kw).tokens
    assert same >= 4


@pytest.mark.parametrize("verifier", ["multidraft", "traversal"])
def test_fused_tree_steps_replay_one_graph(pairs: tuple[tuple[object, object], tuple[object, object]],
                                          verifier: str) -> None:
    """``step_graph=True`` on a fixed i.i.d. tree: the whole step (layer drafts, target forward, the device walk,
    the accepted path moved into place) captured once and replayed every later step, in later decodes too;
    greedy decoding equals the CPU's, and at T = 1 the graphed run gives the eager fused run's tokens and
    the usual device tree's on every seed; a window of 3 (Mistral, Gemma 3) decodes greedily past it."""
    from spec.llm.static_cache import shared_static_cache
    from spec.llm.tree_step_graph import TreeStepGraph
    from tests.spec.llm.conftest import greedy_decode
    from tests.spec.llm.test_windows import tiny

    (t_cpu, _), (t_gpu, d_gpu) = pairs
    prompt = [2, 7, 1, 8, 2, 8]
    ref = ar_generate(t_cpu, prompt, temperature=0, max_new_tokens=40).tokens
    t_cache = shared_static_cache(t_gpu, "target", 1, graphs=True)
    t_cache.step_graphs.clear()  # the cache is shared: an earlier test in this process may have left steps on it
    tree = dict(budget=7, builder_params={"draw": "iid", "width": 2})
    for run in range(2):
        out = generate(t_gpu, d_gpu, prompt, "fixed", verifier, temperature=0, max_new_tokens=40, step_graph=True,
                       **tree)
        assert out.tokens == ref
        fused = [s for s in t_cache.step_graphs.values() if isinstance(s, TreeStepGraph) and s.verifier == verifier
                 and s.sampling.temperature == 0]
        assert len(fused) == 1 and fused[0].graphs and fused[0].captures == 1  # once, in the first decode
        assert fused[0].replays == (run + 1) * (len(out.steps) - 1) > 0
    _graphed_eager_and_plain_agree(t_gpu, d_gpu, prompt, "fixed", verifier, **tree)
    for name in ("mistral", "gemma3"):
        target, draft = tiny(name, 0, 3), tiny(name, 1, 3)
        want = greedy_decode(target, [3, 1, 4, 1, 5], 24)
        got = generate(target.cuda(), draft.cuda(), [3, 1, 4, 1, 5], "fixed", verifier, temperature=0,
                       max_new_tokens=24, draft_temperature=1.0, step_graph=True, **tree)
        assert got.tokens == want, name


@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")  # torch's own code
@pytest.mark.filterwarnings("ignore:TensorFloat32 tensor cores:UserWarning")  # inductor's advice; TF32 stays off
@pytest.mark.filterwarnings(r"ignore:\s*Online softmax is disabled:UserWarning")  # inductor's notice (tiny rows)
@pytest.mark.parametrize("io", ["host", "upload", "graph"])
@pytest.mark.parametrize(("builder", "verifier", "tree"), [
    ("chain", "sps", {"budget": 4}), ("chain", "asps", {"budget": 4, "compile_step": True}),
    ("fixed", "traversal", {"budget": 7, "builder_params": {"draw": "iid", "width": 2}})])
def test_io_modes_replay_the_same_tokens_on_cuda(pairs: tuple[tuple[object, object], tuple[object, object]],
                                                 monkeypatch: pytest.MonkeyPatch, io: str, builder: str,
                                                 verifier: str, tree: dict[str, object]) -> None:
    """Each ``io`` mode (``STEP_IO_MODES``: the upload, and the copy of the output into pinned host memory,
    captured in the step's graph or run around it): greedy decoding equals the CPU's with the step captured
    once and replayed every later step, and at T = 1 on 3 seeds the graphed run gives the tokens of the plain
    device path (the compiled case: on at least 2 of 3, ``test_compiled_fused_steps_on_cuda``'s rule)."""
    from spec.llm import step_graph
    from spec.llm.static_cache import shared_static_cache

    (t_cpu, _), (t_gpu, d_gpu) = pairs
    prompt = [2, 7, 1, 8, 2, 8]
    ref = ar_generate(t_cpu, prompt, temperature=0, max_new_tokens=40).tokens
    t_cache = shared_static_cache(t_gpu, "target", 1, graphs=True)
    t_cache.step_graphs.clear()  # the cache is shared: an earlier test in this process may have left steps on it
    monkeypatch.setattr(step_graph, "STEP_IO", io)
    out = generate(t_gpu, d_gpu, prompt, builder, verifier, temperature=0, max_new_tokens=40, step_graph=True,
                   **tree)
    assert out.tokens == ref
    fused = [s for s in t_cache.step_graphs.values() if getattr(s, "io", None) == io]
    assert len(fused) == 1 and fused[0].graphs and fused[0].captures == 1
    assert fused[0].replays == len(out.steps) - 1 > 0
    same = 0
    for seed in range(3):
        kw: dict[str, object] = dict(temperature=1.0, max_new_tokens=40, seed=seed, **tree)
        got = generate(t_gpu, d_gpu, prompt, builder, verifier, step_graph=True, **kw)
        plain = generate(t_gpu, d_gpu, prompt, builder, verifier, step_graph=False,
                         **{k: v for k, v in kw.items() if k != "compile_step"})
        same += got.tokens == plain.tokens
    assert same >= (2 if "compile_step" in tree else 3)


def test_auto_fuses_steps_where_the_caches_capture_graphs(
        pairs: tuple[tuple[object, object], tuple[object, object]]) -> None:
    """``step_graph="auto"`` (the default) on CUDA: a fixed chain with a chain verifier and a fixed i.i.d. tree run
    every step after the first fused, with the tokens of ``step_graph=False`` at T = 0 and on 3 seeds at T = 1;
    DySpec at T = 1 (a shape known only after its draws) and runs with ``graphs=False`` stay unfused, and so do
    K-SEQ and ordered Traversal (fused only when asked: ``ASKED_FUSION_ONLY``) unless asked."""
    _, (t_gpu, d_gpu) = pairs
    prompt = [2, 7, 1, 8, 2, 8]
    cases = [("chain", "sps", {}), ("fixed", "traversal", {"draw": "iid", "width": 2})]
    for (builder, verifier, params), temperature, seed in itertools.product(cases, (0.0, 1.0), range(3)):
        kw: dict[str, object] = dict(budget=7, builder_params=params, temperature=temperature, max_new_tokens=24,
                                     seed=seed)
        auto = generate(t_gpu, d_gpu, prompt, builder, verifier, **kw)
        assert sum(s.graph_s > 0 for s in auto.steps) == len(auto.steps) - 1, (builder, temperature, seed)
        assert auto.tokens == generate(t_gpu, d_gpu, prompt, builder, verifier, step_graph=False, **kw).tokens
        eager = generate(t_gpu, d_gpu, prompt, builder, verifier, cache="static", graphs=False, **kw)
        assert not any(s.graph_s > 0 for s in eager.steps)
    out = generate(t_gpu, d_gpu, prompt, "dyspec", "traversal", budget=8, temperature=1.0, max_new_tokens=24)
    assert not any(s.graph_s > 0 for s in out.steps)
    kw = dict(budget=7, builder_params={"draw": "iid", "width": 2}, temperature=1.0, max_new_tokens=24)
    for verifier in ASKED_FUSION_ONLY:
        assert not any(s.graph_s > 0 for s in generate(t_gpu, d_gpu, prompt, "fixed", verifier, **kw).steps)
        asked = generate(t_gpu, d_gpu, prompt, "fixed", verifier, step_graph=True, **kw)
        assert sum(s.graph_s > 0 for s in asked.steps) == len(asked.steps) - 1, verifier


@pytest.mark.parametrize(("builder", "verifier"), [("fixed", "traversal"), ("dyspec", "multidraft"),
                                                 ("dynatree", "traversal"), ("wetap", "traversal")])
def test_fused_greedy_draft_chains_on_cuda(pairs: tuple[tuple[object, object], tuple[object, object]],
                                           builder: str, verifier: str) -> None:
    """A greedy draft makes each of these builders grow one chain of a known length (``_greedy_chain``);
    ``step_graph=True`` drafts, verifies and moves it into place as one replayed graph.  Greedy decoding equals
    the CPU's with every step after the first replayed; with the draft at 0 and the target at 1 the graphed run
    gives the eager fused run's tokens and the usual device chain's on every seed."""
    (t_cpu, _), (t_gpu, d_gpu) = pairs
    prompt = [2, 7, 1, 8, 2, 8]
    ref = ar_generate(t_cpu, prompt, temperature=0, max_new_tokens=40).tokens
    out = generate(t_gpu, d_gpu, prompt, builder, verifier, budget=8, temperature=0, max_new_tokens=40,
                   step_graph=True)
    assert out.tokens == ref
    assert sum(s.graph_s > 0 for s in out.steps) == len(out.steps) - 1
    _graphed_eager_and_plain_agree(t_gpu, d_gpu, prompt, builder, verifier, budget=8, draft_temperature=0.0)


@pytest.mark.parametrize(("verifier", "draw"), [(v, d) for v in ("multidraft", "traversal") for d in ("topk", "swor")])
def test_fused_ranked_tree_steps_on_cuda(pairs: tuple[tuple[object, object], tuple[object, object]],
                                         verifier: str, draw: str) -> None:
    """``step_graph=True`` on a fixed top-k tree ranked from the draft at 1 (``ranked_tokens`` inside the
    captured step), or a tree drawn without replacement: greedy decoding equals the CPU's with every step after
    the first fused, and at T = 1 the graphed run gives the eager fused run's tokens and the usual device tree's
    on every seed."""
    (t_cpu, _), (t_gpu, d_gpu) = pairs
    prompt = [2, 7, 1, 8, 2, 8]
    ref = ar_generate(t_cpu, prompt, temperature=0, max_new_tokens=40).tokens
    tree = dict(budget=7, draft_temperature=1.0, builder_params={"draw": draw, "width": 2})
    out = generate(t_gpu, d_gpu, prompt, "fixed", verifier, temperature=0, max_new_tokens=40, step_graph=True,
                   **tree)
    assert out.tokens == ref
    assert sum(s.graph_s > 0 for s in out.steps) == len(out.steps) - 1
    _graphed_eager_and_plain_agree(t_gpu, d_gpu, prompt, "fixed", verifier, **tree)


def test_fused_tree_step_profile_on_cuda(pairs: tuple[tuple[object, object], tuple[object, object]]) -> None:
    """``TreeStepGraph.profile`` captures its forwards-only graphs and times them next to the step's."""
    from spec.llm.generate import _new_cache, _prefill
    from spec.llm.sampling import Sampling
    from spec.llm.tree_step_graph import TreeStepGraph

    _, (t_gpu, d_gpu) = pairs
    tc, dc = _new_cache(t_gpu, "static", "target", 128, None), _new_cache(d_gpu, "static", "draft", 128, None)
    _prefill(t_gpu, tc, [1, 2, 3])
    _prefill(d_gpu, dc, [1, 2, 3])
    step = TreeStepGraph(t_gpu, d_gpu, tc, dc, parents=(-1, -1, 0, 0, 1, 1, 2), order=(0, 2, 6, 3, 1, 4, 5),
                         verifier="traversal", sampling=Sampling(), d_sampling=Sampling(), vocab=37)
    got = step.profile(3, 4, 3, [4], reps=20)
    assert step.graphs and step.captures == 1 and min(got["step_ms"], got["forwards_ms"], got["target_ms"]) > 0
    assert (tc.length, dc.length) == (3, 3)


@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")  # torch's own code
@pytest.mark.filterwarnings("ignore:TensorFloat32 tensor cores:UserWarning")  # inductor's advice; TF32 stays off
@pytest.mark.filterwarnings(r"ignore:\s*Online softmax is disabled:UserWarning")  # inductor's notice (tiny rows)
@pytest.mark.parametrize(("verifier", "draw", "scope"), [
    ("traversal", "iid", True), ("traversal", "iid", "whole"), ("multidraft", "swor", True), ("traversal", "topk", True),
    ("kseq", "iid", True), ("ordered_traversal", "swor", True)])
def test_compiled_fused_tree_steps_on_cuda(pairs: tuple[tuple[object, object], tuple[object, object]],
                                           verifier: str, draw: str, scope: bool | str) -> None:
    """``compile_step=True`` on a tree: inductor's kernels for the layer draws and the walk inside the captured
    step (``"whole"``: the whole step), for both device walks and the three draw kinds (each kind's draws and
    laws are other code for inductor: an ASpS head that compiled on the CPU once failed on CUDA).  Greedy equals
    the CPU's; at T = 1 the plain device tree's tokens on at least 4 of 5 seeds (as for chains: inductor may
    order a sum otherwise)."""
    (t_cpu, _), (t_gpu, d_gpu) = pairs
    prompt = [2, 7, 1, 8, 2, 8]
    tree = dict(budget=7, builder_params={"draw": draw, "width": 2})
    ref = ar_generate(t_cpu, prompt, temperature=0, max_new_tokens=40).tokens
    out = generate(t_gpu, d_gpu, prompt, "fixed", verifier, temperature=0, max_new_tokens=40, step_graph=True,
                   compile_step=scope, **tree)
    assert out.tokens == ref
    same = 0
    for seed in range(5):
        kw = dict(temperature=1.0, max_new_tokens=40, seed=seed, **tree)
        compiled = generate(t_gpu, d_gpu, prompt, "fixed", verifier, step_graph=True, compile_step=scope, **kw)
        same += compiled.tokens == generate(t_gpu, d_gpu, prompt, "fixed", verifier, step_graph=False, **kw).tokens
    assert same >= 4


# the fused steps' law on CUDA: inductor's triton code for a chain and two trees, and a graphed eager swor tree
CUDA_LAW = [("chain", "block", {}, True), ("fixed", "traversal", {"width": 2, "draw": "iid"}, True),
            ("fixed", "multidraft", {"width": 2, "draw": "swor"}, False),
            ("fixed", "kseq", {"width": 2, "draw": "iid"}, True)]


@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")  # torch's own code
@pytest.mark.filterwarnings("ignore:TensorFloat32 tensor cores:UserWarning")  # inductor's advice; TF32 stays off
@pytest.mark.filterwarnings(r"ignore:\s*Online softmax is disabled:UserWarning")  # inductor's notice (tiny rows)
@pytest.mark.parametrize(("builder", "verifier", "params", "compile_step"), CUDA_LAW,
                         ids=["chain-block-compiled", "fixed-traversal-compiled", "fixed-multidraft-swor-graphed",
                              "fixed-kseq-compiled"])
def test_fused_steps_on_cuda_follow_the_target_law(builder: str, verifier: str, params: dict[str, object],
                                                   compile_step: bool) -> None:
    """``test_fused_law``'s check on CUDA, where the steps replay captured graphs: the first two tokens of 700
    seeded fused decodes against the target's exact law at T = 1 (computed on the CPU from the same weights).
    False-fail rate 1e-3 over the four cases; a total variation of about 0.16 is detected with probability
    0.999 (``chi_square_detectable_tv(law, 700, alpha)``)."""
    from tests.spec.llm.test_fused_law import fused_counts
    from tests.spec.llm.test_generate import SAMPLES, SETTINGS, _law_pair, exact_two_token_law
    from tests.spec.llm.conftest import NULL_DRAWS
    from verification.calibrated import bonferroni, chi_square_check, chi_square_detectable_tv

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    alpha = bonferroni(1e-3, len(CUDA_LAW))
    target, draft = _law_pair()
    law = exact_two_token_law(target, *SETTINGS[0])
    try:
        counts = fused_counts(target.to(LAW_DEVICE), draft.to(LAW_DEVICE), builder, verifier, params, SETTINGS[0],
                              compile_step)
    finally:
        torch._dynamo.reset()  # dynamo counts every compiled partial against one code object
    result = chi_square_check(counts, law, alpha, simulate=NULL_DRAWS)
    assert result.passed, (result, chi_square_detectable_tv(law, SAMPLES, alpha))


LAW_DEVICE = "cuda"  # a name, so that the test's body can be run on the CPU (its skip mark aside)
