"""A whole chain step as one piece of fixed-shape device work (``generate(..., step_graph=True)``).

:class:`spec.llm.step_graph.ChainStepGraph` does the work of the device chain
(:func:`spec.llm.generate._chain_step`) with every length on the device, so
that on CUDA the step can be captured as one graph.  On the CPU the same
buffers run eagerly; these tests check that the tokens and per-step accepted
counts equal the device chain's on the same seed (both pending cases: a step
after one that accepted every draft feeds the draft two tokens), that greedy
decoding is reproduced past a sliding window and with a draft of another
vocabulary size, and that the step reads no tensor value on the host: it
runs on the ``meta`` device, where any such read raises.  The capture itself
is tested in ``test_cuda.py``.
"""

from __future__ import annotations

import copy
import gc
import itertools
import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from spec.llm import static_cache  # noqa: E402
from spec.llm.generate import generate, resolve_step_graph  # noqa: E402
from spec.llm.models import tiny_pair  # noqa: E402
from spec.llm.sampling import Sampling  # noqa: E402
from spec.llm.static_cache import StaticTreeCache  # noqa: E402
from spec.llm.step_graph import ChainStepGraph, shared_chain_step  # noqa: E402
from spec.llm.verify import CHAIN_METHODS  # noqa: E402
from tests.spec.llm.conftest import no_host_scalar_writes  # noqa: E402

from .conftest import greedy_decode  # noqa: E402
from .test_generate import _tiny  # noqa: E402
from .test_windows import GREEDY_BITES, tiny  # noqa: E402

pytestmark = pytest.mark.llm


@pytest.fixture(scope="module")
def pair() -> tuple[Any, Any]:
    """A sharp target and a draft that is the target with noise on its output layer: long accepted runs
    (every draft accepted in many steps) and rejections, at T = 0 and T = 1 (measured while writing)."""
    target, _ = tiny_pair(29, seed=3)
    with torch.no_grad():
        target.lm_head.weight.mul_(12.0)
    draft = copy.deepcopy(target)
    torch.manual_seed(1)
    with torch.no_grad():
        draft.lm_head.weight.add_(0.2 * torch.randn_like(draft.lm_head.weight))
    return target, draft


Setting = tuple[float, int | None, float | None, float | None]

#: (temperature, top_k, top_p, draft_temperature)
SETTINGS: list[Setting] = [(0.0, None, None, None), (1.0, None, None, None), (0.7, 9, 0.9, None),
                           (0.0, None, None, 1.0), (1.0, None, None, 0.6)]


def check_fused_steps_equal_the_device_path(pair: tuple[Any, Any], builder: str, verifier: str, depth: int,
                                            new_tokens: int, settings: Sequence[Setting] = SETTINGS,
                                            **shape: Any) -> None:
    """``step_graph=True`` against the same decode without it, over ``settings`` × 2 seeds: the same tokens
    and per-step accepted counts, every step fused but the first (which feeds the prompt to the draft), each
    with ``depth`` draft forwards and no split times, at least 5 steps of each pending case (a path of
    ``depth`` leaves the draft two tokens), and plain greedy decoding at T = 0."""
    target, draft = pair
    full = partial = 0
    for (temp, top_k, top_p, dtemp), seed in itertools.product(settings, (0, 1)):
        kw: dict[str, Any] = dict(temperature=temp, top_k=top_k, top_p=top_p, draft_temperature=dtemp,
                                  max_new_tokens=new_tokens, seed=seed, cache="static", **shape)
        ref = generate(target, draft, [5, 3, 5], builder, verifier, **kw)
        got = generate(target, draft, [5, 3, 5], builder, verifier, step_graph=True, **kw)
        assert got.tokens == ref.tokens, (temp, top_k, top_p, dtemp, seed)
        assert [s.accepted for s in got.steps] == [s.accepted for s in ref.steps]
        fused = [s for s in got.steps if s.graph_s > 0]
        assert len(fused) == len(got.steps) - 1
        assert all(s.build_s == s.target_s == s.verify_s == 0.0 and s.draft_forwards == depth for s in fused)
        full += sum(s.accepted == depth for s in fused[:-1])  # the next step feeds the draft two pending tokens
        partial += sum(s.accepted < depth for s in fused[:-1])
        if temp == 0:
            assert got.tokens == greedy_decode(target, [5, 3, 5], new_tokens)
    assert full >= 5 and partial >= 5, (full, partial)


@pytest.mark.parametrize(("verifier", "draw", "k"), list(itertools.product(CHAIN_METHODS, ("iid", "topk"), (1, 4))))
def test_fused_steps_give_the_device_chains_tokens(pair: tuple[Any, Any], verifier: str, draw: str, k: int) -> None:
    check_fused_steps_equal_the_device_path(pair, "chain", verifier, k, 40, budget=k, builder_params={"draw": draw})


def test_fused_steps_stop_at_eos_and_length(pair: tuple[Any, Any]) -> None:
    target, draft = pair
    plain = generate(target, draft, [1, 2], "chain", "sps", temperature=1.0, max_new_tokens=30, budget=3, seed=4,
                     cache="static")
    eos = plain.tokens[9]
    for n in (1, 2, 7, 30):
        kw: dict[str, Any] = dict(temperature=1.0, max_new_tokens=n, budget=3, seed=4, eos_token_id=eos, cache="static")
        got = generate(target, draft, [1, 2], "chain", "sps", step_graph=True, **kw)
        assert got.tokens == generate(target, draft, [1, 2], "chain", "sps", **kw).tokens
        assert len(got.tokens) <= n and (eos not in got.tokens or got.tokens[-1] == eos)


@pytest.mark.parametrize("name", ["mistral", "gemma3", "qwen2"])
def test_fused_steps_decode_greedily_past_a_sliding_window(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A window of 3, 29 positions: every layer windowed (Mistral) or only the sliding ones (Gemma 3, Qwen2).
    With the window read as absent, the fused steps leave greedy decoding where the window bites."""
    target, draft = tiny(name, 0, 3), tiny(name, 1, 3)
    prompt, n = [3, 1, 4, 1, 5], 24
    ref = greedy_decode(target, prompt, n)
    kw: dict[str, Any] = dict(temperature=0, max_new_tokens=n, budget=4, draft_temperature=1.0, cache="static",
                              step_graph=True)
    for verifier in CHAIN_METHODS:
        assert generate(target, draft, prompt, "chain", verifier, **kw).tokens == ref, verifier
    if name in GREEDY_BITES:  # fresh models: the shared static caches read the window when they are made
        monkeypatch.setattr(static_cache, "attention_window", lambda model: None)
        target, draft = tiny(name, 0, 3), tiny(name, 1, 3)
        assert generate(target, draft, prompt, "chain", "sps", **kw).tokens != ref


@pytest.mark.parametrize("draft_vocab", [11, 16])
def test_fused_steps_with_a_draft_of_another_vocabulary_size(draft_vocab: int) -> None:
    """The second prompt makes the target emit ids the 11-token draft lacks: they go in as id 0."""
    target, draft = _tiny(13, 0, scale=40.0), _tiny(draft_vocab, 1, layers=1, scale=40.0)
    for prompt, verifier, dtemp in itertools.product(([3, 1, 4, 1, 5], [12, 11, 2]), CHAIN_METHODS, (None, 1.0)):
        out = generate(target, draft, prompt, "chain", verifier, temperature=0, max_new_tokens=16, budget=4,
                       cache="static", draft_temperature=dtemp, step_graph=True)
        assert out.tokens == greedy_decode(target, prompt, 16), (prompt, verifier, dtemp)


def _meta_step(target: Any, draft: Any, verifier: str, iid: bool, sampling: Sampling, k: int = 4) -> torch.Tensor:
    """The step's device work on copies of the models on the ``meta`` device (shapes, no values)."""
    t, d = copy.deepcopy(target).to("meta"), copy.deepcopy(draft).to("meta")
    tc, dc = StaticTreeCache(t, 64), StaticTreeCache(d, 64)
    tc.length, dc.length = 6, 5
    step = ChainStepGraph(t, d, tc, dc, k=k, verifier=verifier, iid=iid, sampling=sampling, d_sampling=sampling,
                          vocab=int(t.config.vocab_size))
    step._prepare(6 + k + 1, 5 + k + 1)
    with no_host_scalar_writes():  # a host copy on CUDA: a capture refuses it
        out, raw, t_logits = step._run()
    assert out.device.type == "meta" and tuple(out.shape) == (3 + k,)
    assert len(raw) == k and tuple(t_logits.shape) == (k + 1, t.config.vocab_size)
    return out


@pytest.mark.parametrize(("verifier", "iid"), list(itertools.product(CHAIN_METHODS, (True, False))))
def test_the_step_reads_no_value_on_the_host(pair: tuple[Any, Any], verifier: str, iid: bool) -> None:
    """Every sampling setting, and windowed models of both kinds: the step runs on the ``meta`` device,
    where reading a value (``.item()``, ``bool``, ``tolist``) raises, so nothing in it waits for the device
    and a CUDA graph can capture it whole."""
    target, draft = pair
    for sampling in (Sampling(0.0), Sampling(1.0), Sampling(0.7, top_k=5, top_p=0.9)):
        _meta_step(target, draft, verifier, iid, sampling)
    for name in ("mistral", "gemma3"):
        _meta_step(tiny(name, 0, 3), tiny(name, 1, 3), verifier, iid, Sampling(1.0))


def test_the_meta_check_catches_a_host_read(pair: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """The check has teeth: with the rows processed by the checked ``Sampling.probs`` (which reads a flag on
    the host to raise its ``ValueError``), the step no longer runs on the meta device."""
    target, draft = pair
    monkeypatch.setattr(Sampling, "probs_unchecked", Sampling.probs)
    with pytest.raises((RuntimeError, NotImplementedError), match="meta"):
        _meta_step(target, draft, "sps", True, Sampling(1.0))


def check_late_nan_logits_raise(pair: tuple[Any, Any], which: str, monkeypatch: pytest.MonkeyPatch,
                                step_class: type, builder: str, verifier: str, **kw: Any) -> None:
    """NaN logits appearing in the ``which`` model before the third fused step (``step_class``) raise
    ``process_logits``' ValueError, as on the other paths, at T = 0 and 1; the caches' lengths are still those
    the step was called with (its docstring)."""
    real = step_class._execute
    calls = [0]
    poison: list[Any] = []
    seen: list[Any] = []

    def poisoned(self: Any) -> Any:
        calls[0] += 1
        if calls[0] == 3:
            seen[:] = [self, (self.t_cache.length, self.d_cache.length)]
            with torch.no_grad():
                poison[0].lm_head.weight[:, 0] = float("nan")
        return real(self)

    monkeypatch.setattr(step_class, "_execute", poisoned)
    for temperature in (0.0, 1.0):
        target, draft = (copy.deepcopy(m) for m in pair)
        calls[0] = 0
        poison[:] = [draft if which == "draft" else target]
        with pytest.raises(ValueError, match=f"^{which}'s logits contain NaN"):
            generate(target, draft, [1, 2], builder, verifier, temperature=temperature, max_new_tokens=60,
                     cache="static", step_graph=True, **kw)
        assert calls[0] == 3 and (seen[0].t_cache.length, seen[0].d_cache.length) == seen[1] > (2, 2)


@pytest.mark.parametrize("which", ["draft", "target"])
def test_bad_logits_in_a_fused_step_raise_the_usual_error(pair: tuple[Any, Any], which: str,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    check_late_nan_logits_raise(pair, which, monkeypatch, ChainStepGraph, "chain", "sps", budget=2)


@pytest.mark.parametrize(("kwargs", "match"), [
    (dict(step_graph=1), "step_graph must be True, False or 'auto'"),
    (dict(step_graph="on"), "step_graph must be True, False or 'auto'"),
    (dict(builder_params={"confidence": 0.5}), "the 'chain' builder with no confidence stop"),
    # (every tree verifier on a chain: fused tree steps; a fixed swor tree with sps is refused before, as no chain)
    # (a greedy draft: on others a topk tree may branch, and a chain verifier refuses it before any step)
    (dict(builder="fixed", builder_params={"draw": "topk"}, temperature=0.0), "the 'chain' builder"),
    (dict(builder="fixed"), "verifier 'sps' verifies chains"),
    (dict(chain_on_device=False), "chain_on_device=True"),
    (dict(cache="dynamic"), "needs cache='static'"),
    (dict(cache="auto"), "needs cache='static'"),  # auto is dynamic on the CPU
    (dict(verify_backend="numpy"), "verify_backend 'torch', 'device' or 'auto'"),
    (dict(compile_step=1), "compile_step must be False, True or one of"),
    (dict(compile_step="all"), "compile_step must be False, True or one of"),
    (dict(compile_step=True, step_graph=False), "compile_step=True compiles the fused step: it needs step_graph=True"),
    (dict(compile_step="whole", step_graph=False), "compile_step='whole' compiles the fused step: it needs"),
    (dict(compile_step=True, step_graph="auto"), "compile_step=True compiles the fused step: it needs step_graph=True"),
])
def test_step_graph_needs_a_fixed_chain_on_the_static_cache(pair: tuple[Any, Any], kwargs: dict[str, Any],
                                                            match: str) -> None:
    target, draft = pair
    args: dict[str, Any] = dict(builder="chain", verifier="sps", cache="static", step_graph=True, max_new_tokens=4)
    args.update(kwargs)
    calls = {"n": 0}
    hooks = [m.register_forward_hook(lambda *_: calls.__setitem__("n", calls["n"] + 1)) for m in (target, draft)]
    try:
        with pytest.raises(ValueError, match=match):
            generate(target, draft, [1, 2], **args)
    finally:
        for hook in hooks:
            hook.remove()
    assert calls["n"] == 0  # refused before any forward (the prompt's included)


def test_auto_fuses_only_where_both_caches_capture_graphs_and_nothing_refuses() -> None:
    """``resolve_step_graph``: ``"auto"`` fuses only with graphs and no refusal; ``True`` insists (the refusal is
    the error); ``False`` never fuses."""
    assert resolve_step_graph("auto", True, None) is True
    assert resolve_step_graph("auto", False, None) is False  # the CPU, or graphs=False
    assert resolve_step_graph("auto", True, "needs cache='static'") is False
    assert resolve_step_graph(False, True, None) is False
    assert resolve_step_graph(True, False, None) is True  # eager fused steps (the CPU tests' way)
    with pytest.raises(ValueError, match="needs cache='static'"):
        resolve_step_graph(True, True, "needs cache='static'")


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_auto_leaves_cpu_steps_unfused(pair: tuple[Any, Any], temperature: float) -> None:
    """On the CPU no cache captures graphs, so the default ``step_graph="auto"`` runs the usual steps: no step
    is fused, the tokens are ``step_graph=False``'s, for a chain and a fixed tree that could run fused."""
    target, draft = pair
    for builder, verifier in (("chain", "sps"), ("fixed", "traversal")):
        kw: dict[str, Any] = dict(budget=4, temperature=temperature, max_new_tokens=12, seed=3, cache="static",
                                  builder_params={"draw": "iid"})
        auto = generate(target, draft, [1, 2, 3], builder, verifier, **kw)
        assert not any(s.graph_s > 0 for s in auto.steps)
        assert auto.tokens == generate(target, draft, [1, 2, 3], builder, verifier, step_graph=False, **kw).tokens
        fused = generate(target, draft, [1, 2, 3], builder, verifier, step_graph=True, **kw)
        assert sum(s.graph_s > 0 for s in fused.steps) == len(fused.steps) - 1 > 0  # the shape could run fused


def test_chain_step_graph_refuses_bad_arguments(pair: tuple[Any, Any]) -> None:
    target, draft = pair
    tc, dc = StaticTreeCache(target, 64), StaticTreeCache(draft, 64)
    kw: dict[str, Any] = dict(k=3, verifier="sps", iid=True, sampling=Sampling(), d_sampling=Sampling(), vocab=29)
    with pytest.raises(ValueError, match="t_cache must be a StaticTreeCache"):
        ChainStepGraph(target, draft, transformers.DynamicCache(), dc, **kw)
    with pytest.raises(ValueError, match="d_cache belongs to another model"):
        ChainStepGraph(target, draft, tc, tc, **kw)
    with pytest.raises(ValueError, match="a chain verifier"):
        ChainStepGraph(target, draft, tc, dc, **{**kw, "verifier": "traversal"})
    with pytest.raises(ValueError, match="k must be"):
        ChainStepGraph(target, draft, tc, dc, **{**kw, "k": 0})
    with pytest.raises(ValueError, match="vocab 30 differs from the target's 29"):
        ChainStepGraph(target, draft, tc, dc, **{**kw, "vocab": 30})
    step = ChainStepGraph(target, draft, tc, dc, **kw)
    u3, u4 = np.full(3, 0.5), np.full(4, 0.5)
    with pytest.raises(ValueError, match="the caches hold 0 / 0 positions, not t_past 2 / d_past 0"):
        step.step(2, 1, 0, [1], u3, u4)
    with pytest.raises(ValueError, match="pending must hold one or two tokens, got 3"):
        step.step(0, 1, 0, [1, 2, 3], u3, u4)
    for u_draft, u_verify in ((None, u4), (u4, u4), (u3, u3)):
        with pytest.raises(ValueError, match="give 3 draft uniforms for an iid chain"):
            step.step(0, 1, 0, [1], u_draft, u_verify)
    with pytest.raises(ValueError, match=r"root = 29 is outside the vocabulary \[0, 29\)"):
        step.step(0, 29, 0, [1], u3, u4)
    with pytest.raises(ValueError, match=r"pending\[1\] = 30 is outside the vocabulary"):
        step.step(0, 1, 0, [1, 30], u3, u4)
    with pytest.raises(ValueError, match=r"pending\[0\] must be"):
        step.step(0, 1, 0, [-1], u3, u4)
    with pytest.raises(ValueError, match="t_past must be an integer, got 0.5"):
        step.step(0.5, 1, 0, [1], u3, u4)  # type: ignore[arg-type]
    for root, pending in ((2, [1]), (1, [2, 1])):  # not ending in the root; one token too many
        with pytest.raises(ValueError, match="the draft's context .* must be the target's"):
            step.step(0, root, 0, pending, u3, u4)
    with pytest.raises(ValueError, match=r"u_draft\[1\] = 1.0 is not a uniform draw in \[0, 1\)"):
        step.step(0, 1, 0, [1], np.array([0.5, 1.0, 0.5]), u4)
    with pytest.raises(ValueError, match=r"u_verify\[2\] = nan is not a uniform draw in \[0, 1\)"):
        step.step(0, 1, 0, [1], u3, np.array([0.5, 0.5, np.nan, 0.5]))
    # uniforms of another type or shape: named, never run (bool ones had run as zeros)
    for u_draft, u_verify, message in ((np.zeros(3, dtype=bool), u4, "u_draft must hold real numbers"),
                                       ([False] * 3, u4, "u_draft must hold real numbers"),
                                       (u3, None, "give 3 draft uniforms .*, got 3 and None"),
                                       (u3, u4[:, None], r"u_verify must have shape \(4,\), got \(4, 1\)"),
                                       (u3, np.array(["0.5"] * 4), "u_verify must hold real numbers")):
        with pytest.raises(ValueError, match=message):
            step.step(0, 1, 0, [1], u_draft, u_verify)  # type: ignore[arg-type]
    assert (tc.length, dc.length) == (0, 0)  # nothing ran
    step.step(0.0, 1, 0.0, [1], u3, u4)  # type: ignore[arg-type]  # integral floats: taken as the integers
    assert type(tc.length) is int and type(dc.length) is int


@pytest.mark.parametrize(("before", "after"), [(11, 13), (13, 11)])
def test_a_resized_draft_gets_a_new_fused_step(before: int, after: int) -> None:
    """The shared step (and cache) of a draft whose embeddings were replaced since is not reused: it read the
    draft's vocabulary when made, so grown from 11 to 13 ids its draws stayed clamped below 11 (token 10 made
    56% of a fused decode's tokens against none unfused: another law), and shrunk from 13 to 11 it fed ids
    11 and 12 to the smaller embedding (IndexError; on CUDA a device assert).  Now fused = unfused."""
    target, draft = _tiny(13, 0, scale=40.0), _tiny(before, 1, layers=1, scale=40.0)
    kw: dict[str, Any] = dict(temperature=1.0, max_new_tokens=24, budget=4, cache="static")
    for builder, extra in (("chain", {}), ("fixed", {"builder_params": {"draw": "iid", "width": 2}})):
        generate(target, draft, [12, 11, 2], builder, "traversal", step_graph=True, seed=0, **kw, **extra)
    torch.manual_seed(7)
    draft.resize_token_embeddings(after, mean_resizing=False)
    with torch.no_grad():
        draft.lm_head.weight[before:] = 40.0 * torch.randn(max(0, after - before), draft.lm_head.weight.shape[1])
    for builder, extra in (("chain", {}), ("fixed", {"builder_params": {"draw": "iid", "width": 2}})):
        for seed in range(3):
            plain = generate(target, draft, [12, 11, 2], builder, "traversal", seed=seed, **kw, **extra)
            fused = generate(target, draft, [12, 11, 2], builder, "traversal", step_graph=True, seed=seed, **kw,
                             **extra)
            assert fused.tokens == plain.tokens, (builder, seed)
            assert sum(s.graph_s > 0 for s in fused.steps) == len(fused.steps) - 1


def test_shared_caches_and_steps_do_not_keep_models_alive() -> None:
    """The registry of shared caches is keyed weakly by model, but each cache held its model and the target's
    cache held every fused step with its draft and the draft's cache: no model was ever freed (a draft tried
    and dropped stayed in memory).  Now a dropped draft is freed, with its cache; the target too."""
    target = _tiny(13, 0, scale=40.0)
    for fused in (False, True):
        draft = _tiny(13, 1, layers=1, scale=40.0)
        generate(target, draft, [3, 1, 4], "chain", "sps", temperature=1.0, max_new_tokens=8, budget=3,
                 cache="static", step_graph=fused)
        d_ref, c_refs = weakref.ref(draft), [weakref.ref(c) for c in static_cache._SHARED[draft].values()]
        del draft
        gc.collect()
        assert d_ref() is None and c_refs and all(c() is None for c in c_refs), fused
    t_cache = static_cache.shared_static_cache(target, "target", 1)
    assert not t_cache.step_graphs  # the freed draft's step left with its cache (its buffers and graph too)
    shared_chain_step(target, target, t_cache, static_cache.shared_static_cache(target, "draft", 1), k=2,
                      verifier="sps", iid=True, sampling=Sampling(), d_sampling=Sampling(), vocab=13)
    assert len(t_cache.step_graphs) == 1
    t_ref = weakref.ref(target)
    del target, t_cache
    gc.collect()
    assert t_ref() is None


def test_profile_times_the_step_and_its_forwards(pair: tuple[Any, Any]) -> None:
    """``profile`` (the benchmark's source for a fused row's overhead) leaves the caches' lengths as they were,
    and times the step as the decode calls it too (``call_ms``: the replay or run plus the upload, the
    transfer back and the host's checks, so never much below the run alone), and that call with the device work
    left out (``host_ms``: the step's run is not called for it)."""
    target, draft = pair
    tc, dc = StaticTreeCache(target, 64), StaticTreeCache(draft, 64)
    tc.length = dc.length = 0
    step = ChainStepGraph(target, draft, tc, dc, k=3, verifier="block", iid=True, sampling=Sampling(),
                          d_sampling=Sampling(), vocab=29)
    runs = 0
    run = step._run

    def counted() -> Any:
        nonlocal runs
        runs += 1
        return run()

    step._run = counted  # type: ignore[method-assign]
    got = step.profile(0, 4, 0, [4], reps=2)
    # the first call, the output the host-side run reads back, then the step and the call in 2 warm-up rounds and
    # 2 timed ones (the host-side run calls no run)
    assert runs == 1 + 1 + 2 * (2 + 2)
    assert set(got) == {"step_ms", "forwards_ms", "target_ms", "overhead_pct", "call_ms", "call_overhead_pct",
                        "host_ms", "host_pct"}
    assert all(np.isfinite(v) for v in got.values()) and min(got["step_ms"], got["forwards_ms"], got["target_ms"],
                                                             got["host_ms"]) > 0
    assert got["call_overhead_pct"] == pytest.approx(100 * (got["call_ms"] - got["forwards_ms"]) / got["target_ms"])
    assert got["host_pct"] == pytest.approx(100 * got["host_ms"] / got["target_ms"])
    assert (tc.length, dc.length) == (0, 0)
    step.profile(0.0, 4, np.int64(0), [4], reps=1)  # type: ignore[arg-type]  # integral: taken as ints, as step does
    assert type(tc.length) is int and type(dc.length) is int  # a float length had broken the next forward
    with pytest.raises(ValueError, match="the caches hold 0 / 0 positions, not t_past 1 / d_past 0"):
        step.profile(1, 4, 0, [4], reps=1)  # checked before any work


def _steps_by_io(pair: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch, builder: str, verifier: str,
                 **kw: Any) -> dict[str, list[Any]]:
    """Fused decodes (T = 1, 3 seeds, and T = 0) under each of ``STEP_IO_MODES`` as the default, with the step
    each made: ``{mode: [results..., step]}``."""
    from spec.llm import step_graph

    target, draft = pair
    got: dict[str, list[Any]] = {}
    for mode in step_graph.STEP_IO_MODES:
        monkeypatch.setattr(step_graph, "STEP_IO", mode)
        got[mode] = [generate(target, draft, [5, 3, 5], builder, verifier, step_graph=True, cache="static",
                              temperature=temp, max_new_tokens=30, seed=seed, **kw)
                     for temp, seed in ((1.0, 0), (1.0, 1), (1.0, 2), (0.0, 0))]
        t_cache = static_cache.shared_static_cache(target, "target", 1, graphs=False)
        got[mode].append(next(s for s in t_cache.step_graphs.values() if s.io == mode and s.verifier == verifier))
    return got


@pytest.mark.parametrize(("builder", "verifier", "kw"), [
    ("chain", "sps", {"budget": 4}), ("chain", "block", {"budget": 3, "builder_params": {"draw": "topk"}}),
    ("fixed", "traversal", {"budget": 7, "builder_params": {"draw": "iid", "width": 2}}),
    ("fixed", "multidraft", {"budget": 6, "builder_params": {"draw": "swor", "width": 2}})])
def test_every_io_mode_gives_the_same_tokens(pair: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch, builder: str,
                                             verifier: str, kw: dict[str, Any]) -> None:
    """Where the upload and the transfer back run (``io``) changes only the host's calls: the same tokens and
    accepted counts in every mode (here eagerly, on the CPU; on CUDA in ``test_cuda``), every step after the
    first fused; in ``"graph"`` mode the step's output is read from the host buffer its work wrote (all zeros
    before: a read of the buffer without the copy decodes the token 0 every step)."""
    got = _steps_by_io(pair, monkeypatch, builder, verifier, **kw)
    ref = got["host"]
    for mode, runs in got.items():
        step = runs.pop()
        assert step.io == mode and (step._back is not None) == (mode == "graph")
        for run, want in zip(runs, ref):
            assert run.tokens == want.tokens and [s.accepted for s in run.steps] == [s.accepted for s in want.steps]
            assert sum(s.graph_s > 0 for s in run.steps) == len(run.steps) - 1 > 3


def test_io_modes_are_checked(pair: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    from spec.llm import step_graph
    from spec.llm.tree_step_graph import TreeStepGraph

    target, draft = pair
    tc, dc = StaticTreeCache(target, 64), StaticTreeCache(draft, 64)
    kw: dict[str, Any] = dict(sampling=Sampling(), d_sampling=Sampling(), vocab=29)
    for bad in ("fast", "", 1, "GRAPH"):
        with pytest.raises(ValueError, match=r"io must be one of \('host', 'upload', 'graph'\) or None, got"):
            ChainStepGraph(target, draft, tc, dc, k=3, verifier="sps", iid=True, io=bad, **kw)
        with pytest.raises(ValueError, match="io must be one of"):
            TreeStepGraph(target, draft, tc, dc, parents=[-1, 0], order=[0, 1], verifier="traversal", io=bad, **kw)
        with pytest.raises(ValueError, match="io must be one of"):
            shared_chain_step(target, draft, tc, dc, k=3, verifier="sps", iid=True, io=bad, **kw)
    assert step_graph.resolve_io(None) == step_graph.STEP_IO == "graph"
    monkeypatch.setattr(step_graph, "STEP_IO", "upload")
    assert ChainStepGraph(target, draft, tc, dc, k=3, verifier="sps", iid=True, **kw).io == "upload"
    monkeypatch.setattr(step_graph, "STEP_IO", "fast")  # a bad default is named too, when a step is made
    with pytest.raises(ValueError, match="io must be one of .* got 'fast'"):
        ChainStepGraph(target, draft, tc, dc, k=3, verifier="sps", iid=True, **kw)


def test_fused_steps_grow_the_caches_they_outrun(pair: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """Caches sized far too small up front (64 slots for 100 positions) grow during the fused steps: the step
    rebuilds its buffers for the new ones, and the tokens stay the device chain's."""
    from spec.llm import generate as gen

    target, draft = pair
    kw: dict[str, Any] = dict(budget=4, temperature=1.0, max_new_tokens=96, seed=3, cache="static")
    ref = generate(target, draft, [5, 3, 5, 1], "chain", "block", **kw)
    small_t, small_d = copy.deepcopy(target), copy.deepcopy(draft)  # fresh shared caches
    monkeypatch.setattr(gen, "cache_capacity", lambda *args: 1)
    got = generate(small_t, small_d, [5, 3, 5, 1], "chain", "block", step_graph=True, **kw)
    assert got.tokens == ref.tokens
    caches = [static_cache.shared_static_cache(m, role, 1) for m, role in ((small_t, "target"), (small_d, "draft"))]
    assert all(c.capacity >= 100 for c in caches)
    (step,) = caches[0].step_graphs.values()
    assert step._layout is not None and step._layout[0] is caches[0].kv and step._layout[1] is caches[1].kv


@pytest.mark.parametrize(("verifier", "draw", "scope"),
                         list(itertools.product(CHAIN_METHODS, ("iid", "topk"), (True, "whole"))))
def test_compiled_steps_trace_whole_and_give_the_same_tokens(pair: tuple[Any, Any], verifier: str, draw: str,
                                                             scope: bool | str,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """``compile_step=True`` puts the draws and the verifier through ``torch.compile(fullgraph=True)``, and
    ``compile_step="whole"`` the whole step, both models' forwards and the static caches included; here with the
    ``eager`` backend (dynamo traces, no code is generated), so any graph break would raise.  The tokens stay the
    device chain's, and dynamo made new graphs."""
    from spec.llm import generate as gen

    monkeypatch.setattr(gen, "COMPILE_BACKEND", "eager")
    target, draft = pair
    before = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    for temp, seed in itertools.product((0.0, 1.0), (0, 1)):
        kw: dict[str, Any] = dict(budget=3, temperature=temp, max_new_tokens=24, seed=seed, cache="static",
                                  builder_params={"draw": draw})
        ref = generate(target, draft, [5, 3, 5], "chain", verifier, **kw)
        got = generate(target, draft, [5, 3, 5], "chain", verifier, step_graph=True, compile_step=scope, **kw)
        assert got.tokens == ref.tokens, (temp, seed)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] > before


def test_a_host_read_breaks_the_compiled_step(pair: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """``fullgraph=True`` has teeth: a draw whose rows go through the checked ``Sampling.probs`` (a host read)
    cannot be traced whole, and the decode raises instead of running a split graph."""
    from spec.llm import generate as gen

    monkeypatch.setattr(gen, "COMPILE_BACKEND", "eager")
    monkeypatch.setattr(Sampling, "probs_unchecked", Sampling.probs)
    torch._dynamo.reset()
    target, draft = pair
    with pytest.raises(torch._dynamo.exc.TorchDynamoException):  # dynamo refuses the data-dependent branch
        generate(target, draft, [5, 3, 5], "chain", "sps", budget=3, max_new_tokens=12, cache="static",
                 step_graph=True, compile_step=True)
    torch._dynamo.reset()


@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")  # torch's own code
def test_compiled_steps_with_inductor_on_the_cpu(pair: tuple[Any, Any]) -> None:
    """The real thing, on the CPU: inductor's generated kernels for the draws and the verifier give the device
    chain's tokens (their float64 rows differ from eager torch's by about 1e-18, far below what moves a draw)."""
    target, draft = pair
    kw: dict[str, Any] = dict(budget=3, temperature=1.0, max_new_tokens=24, seed=2, cache="static")
    ref = generate(target, draft, [5, 3, 5], "chain", "block", **kw)
    got = generate(target, draft, [5, 3, 5], "chain", "block", step_graph=True, compile_step=True, **kw)
    assert got.tokens == ref.tokens
    # the whole step, the two models' forwards included, as inductor's code (greedy: no draw rides on a last bit)
    kw["temperature"] = 0.0
    ref = generate(target, draft, [5, 3, 5], "chain", "block", **kw)
    got = generate(target, draft, [5, 3, 5], "chain", "block", step_graph=True, compile_step="whole", **kw)
    assert got.tokens == ref.tokens
