"""A whole fixed-tree step as one piece of fixed-shape device work (``generate(..., step_graph=True)`` on a tree).

:class:`spec.llm.tree_step_graph.TreeStepGraph` does the work of the device
tree step (:func:`spec.llm.generate._tree_step` with ``LLMDraft.draft_tree``)
with every length on the device and the accepted path moved into place on
the device.  On the CPU the same buffers run eagerly: the tokens and per-step
accepted counts must equal the usual device tree's on the same seeds, with
both pending cases (a step whose path reached the last, never fed, layer leaves
the draft two tokens) covered; greedy decoding is reproduced, with a draft of
another vocabulary size too; the step reads no value on the host (it runs on
the ``meta`` device).  The capture itself is tested in ``test_cuda.py``.
"""

from __future__ import annotations

import copy
import itertools
import math
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from spec.builders import FixedBuilder  # noqa: E402
from spec.llm.adapter import _tree_layout  # noqa: E402
from spec.llm.generate import generate  # noqa: E402
from spec.llm.sampling import Sampling  # noqa: E402
from spec.llm.static_cache import StaticTreeCache, shared_static_cache  # noqa: E402
from spec.llm.step_graph import ChainStepGraph  # noqa: E402
from spec.llm.tree_device import DEVICE_TREE_METHODS  # noqa: E402
from spec.llm.tree_step_graph import TreeStepGraph  # noqa: E402
from tmc.commands.acceptance import TREE_VERIFIERS  # noqa: E402
from tmc.multidraft import Draw  # noqa: E402
from tests.spec.llm.conftest import no_host_scalar_writes  # noqa: E402

from .conftest import greedy_decode  # noqa: E402
from .test_generate import _tiny  # noqa: E402
from .test_step_graph import (  # noqa: E402, F401  (pair: the fixture)
    check_fused_steps_equal_the_device_path,
    check_late_nan_logits_raise,
    pair,
)
from .test_windows import tiny  # noqa: E402

pytestmark = pytest.mark.llm

#: (builder, width, depth, budget): full trees two and three wide, a one-wide tree, and the chain builder
SHAPES = [("fixed", 2, None, 7), ("fixed", 3, 2, 9), ("fixed", 1, None, 3), ("chain", None, None, 4)]


#: (temperature, top_k, top_p, draft_temperature) where the device drafts a top-k tree (the draft's rows keep
#: ``width`` tokens with q > 0: ``generate._device_shape``): sampled targets, a top-k target, a greedy target
#: with the draft at 1, a draft sharper than the target
RANKED_SETTINGS = [(1.0, None, None, None), (0.6, 9, None, None), (0.0, None, None, 1.0), (1.0, None, None, 0.5)]


def shape_kw(builder: str, width: int | None, depth: int | None, budget: int, draw: str = "iid") -> dict[str, Any]:
    params: dict[str, Any] = {"draw": draw}
    if builder == "fixed":
        params.update(width=width, depth=depth)
    return dict(budget=budget, builder_params=params)


def _verifies(verifier: str, draw: str) -> bool:
    """Whether ``verifier`` is lossless on trees drawn ``draw`` (K-SEQ: i.i.d. only; ``generate`` refuses the rest)."""
    return Draw(draw) in TREE_VERIFIERS[verifier].draws


def _depth(builder: str, width: int | None, depth: int | None, budget: int) -> int:
    """The layers of a :data:`SHAPES` entry's tree (its draft forwards per fused step)."""
    if builder == "chain":
        return budget
    return len(_tree_layout(FixedBuilder(width=width, depth=depth).full_shape(budget))[0])


@pytest.mark.parametrize(("verifier", "shape"), list(itertools.product(DEVICE_TREE_METHODS, SHAPES)))
def test_fused_tree_steps_give_the_device_trees_tokens(pair: tuple[Any, Any], verifier: str,
                                                       shape: tuple[str, int | None, int | None, int]) -> None:
    check_fused_steps_equal_the_device_path(pair, shape[0], verifier, _depth(*shape), 30, **shape_kw(*shape))


@pytest.mark.parametrize(("verifier", "shape", "draw"),
                         [(v, s, d) for v, s, d in itertools.product(DEVICE_TREE_METHODS, SHAPES, ("topk", "swor"))
                          if (s[0] == "fixed" or d == "topk") and _verifies(v, d)  # a chain: iid or topk
                          and not (v == "ordered_traversal" and d == "swor" and s[1] == 3)])  # host-walked
def test_fused_ranked_and_swor_tree_steps_give_the_device_trees_tokens(
        pair: tuple[Any, Any], verifier: str, shape: tuple[str, int | None, int | None, int], draw: str) -> None:
    """Top-k trees (each node its parent row's next most likely token; a chain takes each row's argmax) and
    trees drawn without replacement (each sibling from its parent's row with the earlier siblings' tokens
    removed): the fused steps draw on the device as ``LLMDraft.draft_tree`` does."""
    check_fused_steps_equal_the_device_path(pair, shape[0], verifier, _depth(*shape), 30, RANKED_SETTINGS,
                                            **shape_kw(*shape, draw=draw))


@pytest.mark.parametrize(("verifier", "draw"),
                         [(v, d) for v, d in itertools.product(DEVICE_TREE_METHODS, ("topk", "swor")) if _verifies(v, d)])
def test_short_ranked_steps_are_void_and_redone_unfused(pair: tuple[Any, Any], verifier: str, draw: str,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """At a draft temperature of 0.002 this sharp draft's rows underflow to 0 past their top token in some
    steps but not in others (measured while writing: a third to two thirds of them).  A fused ranked step
    that ranks a token with q = 0, or a swor step whose second sibling's law has no mass left, is void:
    the step gives ``None`` with both caches' lengths as they were; the decode redoes that step unfused on the
    same uniforms, sends the next steps to the host path (1, then 2, 4, ... after each further short step),
    and fuses again.  Tokens and accepted counts stay the device tree's."""
    target, draft = pair
    original = TreeStepGraph._finish  # what step and draw_step (the decode's call) run after their checks
    voids: list[bool] = []

    def spied(self: TreeStepGraph, t_past: int, root: int, d_past: int, *args: Any) -> Any:
        got = original(self, t_past, root, d_past, *args)
        if got is None:
            assert (self.t_cache.length, self.d_cache.length) == (t_past, d_past)
        voids.append(got is None)
        return got

    monkeypatch.setattr(TreeStepGraph, "_finish", spied)
    refused_then_fused = 0
    for seed in (0, 1):
        kw: dict[str, Any] = dict(temperature=1.0, draft_temperature=0.002, max_new_tokens=40, seed=seed,
                                  cache="static", **shape_kw("fixed", 2, None, 7, draw=draw))
        ref = generate(target, draft, [5, 3, 5], "fixed", verifier, **kw)
        before = len(voids)
        ran = [0]
        hook = draft.register_forward_hook(lambda *_: ran.__setitem__(0, ran[0] + 1))
        try:
            got = generate(target, draft, [5, 3, 5], "fixed", verifier, step_graph=True, **kw)
        finally:
            hook.remove()
        assert got.tokens == ref.tokens, seed
        # the stats count every draft forward, a void step's too (they left those out)
        assert sum(s.draft_forwards for s in got.steps) == ran[0], (seed, ran)
        assert [s.accepted for s in got.steps] == [s.accepted for s in ref.steps]
        fused = [s.graph_s > 0 for s in got.steps]
        void = sum(voids[before:])
        assert fused.count(False) - 1 >= void  # every void step is redone unfused
        # the back-off: a short step (void, or a device tree's) sends the next 1, 2, 4, ... steps to the host path,
        # so at most about log2(steps) of them are void (before it, each one could be)
        assert void <= math.log2(len(got.steps)) + 1, (seed, void, len(got.steps))
        refused_then_fused += sum(not a and b for a, b in zip(fused[1:], fused[2:]))
    assert sum(voids) >= 2 and voids.count(False) >= 4 and refused_then_fused >= 2, (voids, refused_then_fused)


def test_a_draft_short_at_every_step_backs_off_to_the_host_path(pair: tuple[Any, Any]) -> None:
    """A draft at temperature 1e-4 underflows past its top token at every step, so every device-drafted or fused
    top-k tree comes out short.  Each such step had paid its forwards before the host path redid it: 59 and 87
    target forwards for 29 steps on the device and fused paths against the host path's 30 (audit D1 of
    2026-11-27).  With the back-off (1, 2, 4, ... host steps after each short one) at most log2(steps) + 1
    steps are short, each wasting one target forward, and the tokens stay the host path's."""
    target, draft = pair
    calls = [0]
    hook = target.register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    kw: dict[str, Any] = dict(temperature=1.0, draft_temperature=1e-4, max_new_tokens=30, seed=0,
                              **shape_kw("fixed", 3, None, 6, draw="topk"))
    runs = {}
    try:
        for name, extra in (("host", dict(chain_on_device=False)), ("device", {}),
                            ("fused", dict(cache="static", step_graph=True))):
            calls[0] = 0
            out = generate(target, draft, [3, 1, 4, 1, 5], "fixed", "traversal", **kw, **extra)
            runs[name] = (out.tokens, calls[0], len(out.steps))
    finally:
        hook.remove()
    tokens, host_forwards, steps = runs["host"]
    assert host_forwards == steps + 1  # the prefill and one forward a step
    for name in ("device", "fused"):
        assert runs[name][0] == tokens, name
        assert host_forwards < runs[name][1] <= host_forwards + math.log2(steps) + 1, (name, runs[name], steps)


def test_fused_tree_steps_stop_at_eos_and_length(pair: tuple[Any, Any]) -> None:
    target, draft = pair
    base: dict[str, Any] = dict(temperature=1.0, seed=4, cache="static", **shape_kw("fixed", 2, None, 7))
    plain = generate(target, draft, [1, 2], "fixed", "traversal", max_new_tokens=30, **base)
    eos = plain.tokens[9]
    for n in (1, 2, 7, 30):
        kw: dict[str, Any] = dict(max_new_tokens=n, eos_token_id=eos, **base)
        got = generate(target, draft, [1, 2], "fixed", "traversal", step_graph=True, **kw)
        assert got.tokens == generate(target, draft, [1, 2], "fixed", "traversal", **kw).tokens
        assert len(got.tokens) <= n and (eos not in got.tokens or got.tokens[-1] == eos)


@pytest.mark.parametrize("draft_vocab", [11, 16])
def test_fused_tree_steps_with_a_draft_of_another_vocabulary_size(draft_vocab: int) -> None:
    """The second prompt makes the target emit ids the 11-token draft lacks: they go in as id 0."""
    target, draft = _tiny(13, 0, scale=40.0), _tiny(draft_vocab, 1, layers=1, scale=40.0)
    for prompt, verifier, dtemp in itertools.product(([3, 1, 4, 1, 5], [12, 11, 2]), DEVICE_TREE_METHODS, (None, 1.0)):
        out = generate(target, draft, prompt, "fixed", verifier, temperature=0, max_new_tokens=16, cache="static",
                       draft_temperature=dtemp, step_graph=True, **shape_kw("fixed", 2, None, 6))
        assert out.tokens == greedy_decode(target, prompt, 16), (prompt, verifier, dtemp)


def _meta_step(target: Any, draft: Any, verifier: str, sampling: Sampling, draw: str = "iid") -> torch.Tensor:
    """The step's device work on copies of the models on the ``meta`` device (shapes, no values)."""
    t, d = copy.deepcopy(target).to("meta"), copy.deepcopy(draft).to("meta")
    tc, dc = StaticTreeCache(t, 64), StaticTreeCache(d, 64)
    tc.length, dc.length = 6, 5
    parents = (-1, -1, 0, 0, 1, 1, 2)
    step = TreeStepGraph(t, d, tc, dc, parents=parents, order=(0, 2, 6, 3, 1, 4, 5), verifier=verifier,
                         sampling=sampling, d_sampling=sampling, vocab=int(t.config.vocab_size), draw=draw)
    step._prepare(6 + 8, 5 + 2 + 6)
    with no_host_scalar_writes():  # a host copy on CUDA: a capture refuses it
        out, raw, t_logits = step._run()
    assert out.device.type == "meta" and tuple(out.shape) == (3 + 3 + 7,)
    assert len(raw) == 3 and tuple(t_logits.shape) == (8, t.config.vocab_size)  # the root's row and two fed layers
    return out


@pytest.mark.parametrize("verifier", DEVICE_TREE_METHODS)
def test_the_tree_step_reads_no_value_on_the_host(pair: tuple[Any, Any], verifier: str) -> None:
    """The step runs on the ``meta`` device, where reading a value (``.item()``, ``bool``, ``tolist``) raises:
    nothing in it waits for the device, so a CUDA graph can capture it whole."""
    target, draft = pair
    for sampling, draw in itertools.product((Sampling(0.0), Sampling(1.0), Sampling(0.7, top_k=5, top_p=0.9)),
                                            ("iid", "swor", "topk")):
        _meta_step(target, draft, verifier, sampling, draw)


@pytest.mark.parametrize("draw", ["iid", "swor", "topk"])
def test_outside_its_compiled_parts_the_tree_step_reduces_no_row(pair: tuple[Any, Any], draw: str) -> None:
    """``compile_step=True`` compiles the layer draws and the head: the head takes the target's logits, so the
    target's rows, the fault flags and the short flag are processed there with the walk, fused by inductor.
    What stays eager in ``_run`` (the forwards' inputs, the concatenations, the cache moves) reduces over no
    row: no softmax, max, any, sum or scan is dispatched outside the forwards, the draws and the head.  (The
    target's rows and the flags were eager before, 16 to 20 kernels a step.)"""
    from spec.llm.opcount import count_ops

    class Piece(torch.nn.Module):  # count_ops counts a module's forward as "inside"
        def __init__(self, fn: Any) -> None:
            super().__init__()
            self.fn = fn

        def forward(self, *args: Any) -> Any:
            return self.fn(*args)

    target, draft = pair
    tc, dc = StaticTreeCache(target, 64), StaticTreeCache(draft, 64)
    tc.length, dc.length = 6, 5
    step = TreeStepGraph(target, draft, tc, dc, parents=(-1, -1, 0, 0, 1, 1, 2), order=(0, 2, 6, 3, 1, 4, 5),
                         verifier="traversal", sampling=Sampling(1.0), d_sampling=Sampling(1.0),
                         vocab=int(target.config.vocab_size), draw=draw)
    step._prepare(6 + 8, 5 + 2 + 6)
    step._draw, step._head = draw_piece, head_piece = Piece(step._draw), Piece(step._head)
    with torch.no_grad():
        _, ops = count_ops(step._run, [target, draft, draw_piece, head_piece])
    reductions = {"_softmax", "_log_softmax", "amax", "amin", "max", "min", "any", "all", "sum", "mean", "prod",
                  "cumsum", "cumprod", "cummax", "argmax", "argmin", "logsumexp", "searchsorted", "sort", "topk"}
    reducing = {name for name in ops.by_name if name.split(".")[1] in reductions}  # "aten.amax.default"
    assert not reducing, reducing

    def forwards() -> torch.Tensor:  # the forwards alone, as the profile times them: their inputs' kernels
        ints = step._ints
        start = ints[1] + 1 + ints[5]
        step._pending_rows(ints[1], ints[3:5])
        for d, layer in enumerate(step._tab["layers"][:-1]):
            step._layer_logits(d, ints[2].expand(len(layer)), start)
        return step._target_logits(ints[2].expand(8), ints[0])

    with torch.no_grad():
        _, base = count_ops(forwards, [target, draft])
    # Beyond the forwards' inputs: the pending row's pick, the drafted tokens' and the target ids'
    # concatenations with the layout gather, and the cache moves as two gathers and two writes (the moves'
    # slot arithmetic is in the head since the count was 82, 82 and 79 kernels here, not 65)
    def view(name: str) -> bool:  # "aten.select.int": a view launches no kernel
        _, op, overload = name.split(".")
        return bool(getattr(getattr(torch.ops.aten, op), overload).is_view)

    extra = {name: n - base.by_name.get(name, 0) for name, n in ops.by_name.items()
             if n != base.by_name.get(name, 0) and not view(name)}
    assert extra == {"aten.index_select.default": 4, "aten.cat.default": 2, "aten.index_copy_.default": 2}, extra


def test_the_tree_meta_check_catches_a_host_read(pair: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """Teeth: with the draft's rows processed by the checked ``Sampling.probs`` (a host read), it fails."""
    target, draft = pair
    monkeypatch.setattr(Sampling, "probs_unchecked", Sampling.probs)
    with pytest.raises((RuntimeError, NotImplementedError), match="meta"):
        _meta_step(target, draft, "traversal", Sampling(1.0))


@pytest.mark.parametrize("which", ["draft", "target"])
def test_bad_logits_in_a_fused_tree_step_raise_the_usual_error(pair: tuple[Any, Any], which: str,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    check_late_nan_logits_raise(pair, which, monkeypatch, TreeStepGraph, "fixed", "multidraft",
                                **shape_kw("fixed", 2, None, 4))


@pytest.mark.parametrize(("kwargs", "match"), [
    # top-k and swor trees the device does not draft: a top-p, a top-k below the width, a sampled draft whose
    # rows need not keep the width (top-k 1); DySpec, DynaTree and WETAP trees from a sampled draft
    (dict(builder_params={"draw": "topk"}, top_p=0.9), "the 'chain' builder with no confidence stop"),
    (dict(builder_params={"draw": "topk", "width": 3}, top_k=2), "the 'chain' builder with no confidence stop"),
    (dict(builder_params={"draw": "swor"}, top_k=1), "the 'chain' builder with no confidence stop"),
    (dict(verifier="ordered_traversal", builder_params={"draw": "swor", "width": 3}),
     "ordered_traversal: at most 2 children a node drawn swor"),
    (dict(builder="dyspec", builder_params={}), "the 'chain' builder with no confidence stop"),
    (dict(builder="dynatree", builder_params={}), "or on the chain a fixed, DySpec, DynaTree or WETAP builder"),
    (dict(builder="wetap", builder_params={}, draft_temperature=0.5, temperature=0), "a greedy draft"),
    (dict(cache="dynamic"), "needs cache='static'"),
    (dict(verify_backend="numpy"), "verify_backend 'torch', 'device' or 'auto'"),
    (dict(chain_on_device=False), "chain_on_device=True"),
])
def test_step_graph_on_a_tree_needs_a_device_drafted_fixed_shape_and_a_device_walk(pair: tuple[Any, Any],
                                                                         kwargs: dict[str, Any], match: str) -> None:
    target, draft = pair
    args: dict[str, Any] = dict(builder="fixed", verifier="traversal", cache="static", step_graph=True,
                                max_new_tokens=4, builder_params={"draw": "iid"})
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        generate(target, draft, [1, 2], **args)


@pytest.mark.parametrize(("window", "budget"), [(3, 7), (2, 24)])
@pytest.mark.parametrize("name", ["mistral", "gemma3", "qwen2"])
def test_fused_tree_steps_past_a_sliding_window(name: str, window: int, budget: int) -> None:
    """29 positions: every layer windowed (Mistral) or only the sliding ones (Gemma 3, Qwen2).  The fused
    steps cut each forward's mask as the device tree's forwards do (the target's context at slots equal to
    positions and its nodes at their depths; the draft's earlier layers read at their slots), so greedy
    decoding is reproduced and at T = 1 the tokens and accepted counts are the device tree's, for i.i.d. and
    top-k trees (ranked from the draft at 1).  With a window of 2 on a 2-wide tree of 24 nodes, node 10
    (depth 3, with a child) sees its ancestor node 1 (the root's second child) at a slot nearer than its
    position: in the window read by slot, as the device tree's forward reads it, out of it read by
    position."""
    target, draft = tiny(name, 0, window), tiny(name, 1, window)
    prompt, n = [3, 1, 4, 1, 5], 24
    ref = greedy_decode(target, prompt, n)
    cases = [(v, d) for v, d in itertools.product(DEVICE_TREE_METHODS, ("iid", "topk")) if _verifies(v, d)]
    for verifier, draw in cases:
        kw: dict[str, Any] = dict(max_new_tokens=n, draft_temperature=1.0, cache="static",
                                  **shape_kw("fixed", 2, None, budget, draw=draw))
        got = generate(target, draft, prompt, "fixed", verifier, temperature=0, step_graph=True, **kw)
        assert got.tokens == ref, (verifier, draw)
        assert sum(s.graph_s > 0 for s in got.steps) == len(got.steps) - 1
        for seed in range(3):
            plain = generate(target, draft, prompt, "fixed", verifier, temperature=1.0, seed=seed, **kw)
            fused = generate(target, draft, prompt, "fixed", verifier, temperature=1.0, seed=seed, step_graph=True,
                             **kw)
            assert fused.tokens == plain.tokens, (verifier, draw, seed)
            assert [s.accepted for s in fused.steps] == [s.accepted for s in plain.steps]


@pytest.mark.parametrize("name", ["mistral", "gemma3"])
def test_whole_compiled_steps_past_a_sliding_window(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """``compile_step="whole"`` on windowed models (every layer windowed; by layer kind, two mask buffers): dynamo
    traces the fused chain and swor tree steps whole (``eager`` backend: a graph break would raise) and greedy
    decoding past a window of 3 is reproduced."""
    from spec.llm import generate as gen

    monkeypatch.setattr(gen, "COMPILE_BACKEND", "eager")
    target, draft = tiny(name, 0, 3), tiny(name, 1, 3)
    ref = greedy_decode(target, [3, 1, 4, 1, 5], 24)
    for builder, verifier, kw in (("fixed", "traversal", shape_kw("fixed", 2, None, 7, draw="swor")),
                                  ("chain", "sps", {"budget": 4})):
        got = generate(target, draft, [3, 1, 4, 1, 5], builder, verifier, temperature=0, max_new_tokens=24,
                       draft_temperature=1.0, cache="static", step_graph=True, compile_step="whole", **kw)
        assert got.tokens == ref, builder
    torch._dynamo.reset()


@pytest.mark.parametrize("name", ["mistral", "gemma3"])
def test_fused_draft_rows_equal_draft_trees_rows_in_a_window(name: str) -> None:
    """Row by row, with a window of 2 that bites at every layer of a 2-wide tree of 24 nodes: the laws the
    fused step draws each layer from equal those ``LLMDraft.draft_tree`` draws the same tree from (same
    uniforms, same tokens).  Node 10 sees its ancestor node 1 (the root's second child) at a slot one nearer
    than its position, inside the window as the device tree's forward reads slots; read by position it
    would not be."""
    from spec.llm.adapter import LLMDraft
    from spec.llm.generate import _prefill

    target, draft = tiny(name, 0, 2), tiny(name, 1, 2)
    prompt, vocab, sampling = [3, 1, 4, 1, 5, 9], 13, Sampling(1.0)
    parents = FixedBuilder(width=2).full_shape(24)
    u = np.random.default_rng(0).random(len(parents))
    past = len(prompt) - 1
    caches = [StaticTreeCache(m, 64) for m in (target, draft, draft)]
    for model, cache in zip((target, draft, draft), caches):
        _prefill(model, cache, prompt[:-1])
    device = LLMDraft(draft, caches[2], past, pending=[prompt[-1]], sampling=sampling, vocab=vocab)
    tree = device.draft_tree(parents, torch.from_numpy(u))
    step = TreeStepGraph(target, draft, caches[0], caches[1], parents=parents, order=range(len(parents)),
                         verifier="traversal", sampling=sampling, d_sampling=sampling, vocab=vocab)
    step._put_uniforms(u, np.full(len(parents) + 1, 0.5))
    step._stage(past, prompt[-1], past, [prompt[-1]], (past + len(parents) + 1, past + 2 + step.fed))
    out, raw, _ = step._run()
    assert out[3 + step.depth :].tolist() == tree.tokens.tolist()
    layers = _tree_layout(parents)[0]
    fused = {-1: sampling.probs(raw[0])[0]}  # each fed node's row: its layer's forward, its place in the layer
    for d, layer in enumerate(layers[:-1]):
        fused.update(zip(layer, sampling.probs(raw[d + 1])))
    assert 10 in tree.rows_of
    for j, node in enumerate(tree.rows_of):
        torch.testing.assert_close(fused[node], tree.q[j], atol=1e-6, rtol=1e-5, msg=f"node {node}")


def test_tree_step_graph_refuses_bad_arguments(pair: tuple[Any, Any]) -> None:
    target, draft = pair
    tc, dc = StaticTreeCache(target, 64), StaticTreeCache(draft, 64)
    kw: dict[str, Any] = dict(parents=(-1, -1, 0), order=(0, 1, 2), verifier="traversal", sampling=Sampling(),
                              d_sampling=Sampling(), vocab=29)
    with pytest.raises(ValueError, match="t_cache must be a StaticTreeCache"):
        TreeStepGraph(target, draft, transformers.DynamicCache(), dc, **kw)
    with pytest.raises(ValueError, match="walked on the device"):
        TreeStepGraph(target, draft, tc, dc, **{**kw, "verifier": "sps"})
    with pytest.raises(ValueError, match="ordered_traversal has no device walk for this shape drawn 'swor'"):
        TreeStepGraph(target, draft, tc, dc, **{**kw, "verifier": "ordered_traversal", "parents": (-1, -1, -1),
                                                "draw": "swor"})
    with pytest.raises(ValueError, match="breadth first"):
        TreeStepGraph(target, draft, tc, dc, **{**kw, "parents": (-1, 0, -1)})
    with pytest.raises(ValueError, match="order must be a permutation"):
        TreeStepGraph(target, draft, tc, dc, **{**kw, "order": (0, 1, 1)})
    with pytest.raises(ValueError, match="vocab 30 differs"):
        TreeStepGraph(target, draft, tc, dc, **{**kw, "vocab": 30})
    for draw in ("sample", None, 2):
        with pytest.raises(ValueError, match=r"draw must be one of \['iid', 'swor', 'topk'\]"):
            TreeStepGraph(target, draft, tc, dc, **{**kw, "draw": draw})
    step = TreeStepGraph(target, draft, tc, dc, **kw)
    u3, u4 = np.full(3, 0.5), np.full(4, 0.5)
    # the checks FusedStep shares (test_step_graph.py has each), then the tree's own uniform counts
    with pytest.raises(ValueError, match="the caches hold 0 / 0 positions, not t_past 2 / d_past 0"):
        step.step(2, 1, 0, [1], u3, u4)
    for u_draft, u_verify in ((None, u4), (u4, u4), (u3, u3)):
        with pytest.raises(ValueError, match="give 3 draft uniforms and 4 verifier uniforms"):
            step.step(0, 1, 0, [1], u_draft, u_verify)
    with pytest.raises(ValueError, match=r"u_verify\[2\] = nan is not a uniform draw in \[0, 1\)"):
        step.step(0, 1, 0, [1], u3, np.array([0.5, 0.5, np.nan, 0.5]))
    with pytest.raises(ValueError, match="u_draft must hold real numbers"):  # had run as zeros
        step.step(0, 1, 0, [1], np.ones(3, dtype=bool), u4)
    ranked = TreeStepGraph(target, draft, tc, dc, **{**kw, "draw": "topk"})  # no draft uniforms
    for u_draft, u_verify in ((u3, u4), (np.zeros(0), u4), (None, u3)):
        with pytest.raises(ValueError, match="give None draft uniforms and 4 verifier uniforms"):
            ranked.step(0, 1, 0, [1], u_draft, u_verify)
    assert (tc.length, dc.length) == (0, 0)  # nothing ran


def test_tree_profile_times_the_step_and_its_forwards(pair: tuple[Any, Any]) -> None:
    target, draft = pair
    tc, dc = StaticTreeCache(target, 64), StaticTreeCache(draft, 64)
    step = TreeStepGraph(target, draft, tc, dc, parents=(-1, -1, 0, 0, 1), order=(0, 2, 3, 1, 4),
                         verifier="multidraft", sampling=Sampling(1.0), d_sampling=Sampling(1.0), vocab=29)
    got = step.profile(0, 4, 0, [4], reps=2)
    assert set(got) == {"step_ms", "forwards_ms", "target_ms", "overhead_pct", "call_ms", "call_overhead_pct",
                        "host_ms", "host_pct"}
    assert all(np.isfinite(v) for v in got.values()) and min(got["step_ms"], got["forwards_ms"], got["target_ms"],
                                                             got["host_ms"]) > 0
    assert (tc.length, dc.length) == (0, 0)
    step.profile(0.0, 4, np.int64(0), [4], reps=1)  # type: ignore[arg-type]  # integral: taken as ints, as step does
    assert type(tc.length) is int and type(dc.length) is int  # a float length had broken the next forward


def test_fused_tree_steps_grow_the_caches_they_outrun(pair: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """Caches sized far too small (64 slots for 100 positions) grow during the fused steps, which remake their
    buffers; the tokens stay the device tree's."""
    from spec.llm import generate as gen

    target, draft = pair
    kw: dict[str, Any] = dict(temperature=1.0, max_new_tokens=96, seed=3, cache="static", **shape_kw("fixed", 2, None, 7))
    ref = generate(target, draft, [5, 3, 5, 1], "fixed", "traversal", **kw)
    small_t, small_d = copy.deepcopy(target), copy.deepcopy(draft)  # fresh shared caches
    monkeypatch.setattr(gen, "cache_capacity", lambda *args: 1)
    got = generate(small_t, small_d, [5, 3, 5, 1], "fixed", "traversal", step_graph=True, **kw)
    assert got.tokens == ref.tokens
    caches = [shared_static_cache(m, role, 1) for m, role in ((small_t, "target"), (small_d, "draft"))]
    assert all(c.capacity >= 100 for c in caches)
    (step,) = caches[0].step_graphs.values()
    assert step._layout is not None and step._layout[0] is caches[0].kv and step._layout[1] is caches[1].kv


@pytest.mark.parametrize(("verifier", "draw", "scope"),
                         [(v, d, c) for v, d, c in itertools.product(DEVICE_TREE_METHODS, ("iid", "swor", "topk"),
                                                                     (True, "whole")) if _verifies(v, d)])
def test_compiled_tree_steps_trace_whole_and_give_the_same_tokens(pair: tuple[Any, Any], verifier: str, draw: str,
                                                                  scope: bool | str,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """``compile_step=True`` on a tree: the layer draws and the walk through ``torch.compile(fullgraph=True)``
    (``"whole"``: the whole step, both models' forwards included) with dynamo's ``eager`` backend (a graph
    break would raise); the tokens stay the device tree's.  Top-k and swor trees draw from the draft at 1
    (under a greedy target too)."""
    from spec.llm import generate as gen

    monkeypatch.setattr(gen, "COMPILE_BACKEND", "eager")
    target, draft = pair
    before = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    for temp, seed in itertools.product((0.0, 1.0), (0, 1)):
        kw: dict[str, Any] = dict(temperature=temp, max_new_tokens=24, seed=seed, cache="static",
                                  draft_temperature=None if draw == "iid" else 1.0,
                                  **shape_kw("fixed", 2, None, 7, draw=draw))
        ref = generate(target, draft, [5, 3, 5], "fixed", verifier, **kw)
        got = generate(target, draft, [5, 3, 5], "fixed", verifier, step_graph=True, compile_step=scope, **kw)
        assert got.tokens == ref.tokens, (temp, seed)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] > before
    torch._dynamo.reset()


@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")  # torch's own code
def test_compiled_tree_steps_with_inductor_on_the_cpu(pair: tuple[Any, Any]) -> None:
    """Inductor's generated code for the layer draws and the walk gives the device tree's tokens, and greedy
    decoding with one-hot rows on both sides (torch 2.11's inductor returned those rows as float32, which the
    fused step's float64 ``index_copy`` refused: :func:`spec.llm.sampling.point_rows`); for the whole step (the
    forwards' inputs and masks, both models, the cache moves), greedy decoding."""
    target, draft = pair
    kw: dict[str, Any] = dict(temperature=1.0, max_new_tokens=24, seed=2, cache="static", **shape_kw("fixed", 2, None, 7))
    ref = generate(target, draft, [5, 3, 5], "fixed", "traversal", **kw)
    got = generate(target, draft, [5, 3, 5], "fixed", "traversal", step_graph=True, compile_step=True, **kw)
    assert got.tokens == ref.tokens
    kw.update(temperature=0.0)
    got = generate(target, draft, [5, 3, 5], "fixed", "traversal", step_graph=True, compile_step=True, **kw)
    assert got.tokens == greedy_decode(target, [5, 3, 5], 24)
    kw.update(draft_temperature=1.0)
    got = generate(target, draft, [5, 3, 5], "fixed", "traversal", step_graph=True, compile_step="whole", **kw)
    assert got.tokens == greedy_decode(target, [5, 3, 5], 24)
    torch._dynamo.reset()


@pytest.mark.parametrize("kind", ["chain:iid", "chain:topk", "tree:iid", "tree:swor", "tree:topk"])
def test_draw_step_is_step_on_the_generators_draws(pair: tuple[Any, Any], kind: str) -> None:
    """``draw_step`` (the decode's call: uniforms drawn into the upload's host slots, no arrays, no checks) runs
    the step ``step`` runs on ``rng.random(draft_uniforms)`` (or ``None``) then ``rng.random(noise)``: eight steps
    each way from fresh caches on one seed give the same results and leave the generators in one state; a
    generator of another kind is refused before any work."""
    target, draft = pair
    shape, draw = kind.split(":")

    def make() -> Any:
        tc, dc = StaticTreeCache(target, 64), StaticTreeCache(draft, 64)
        tc.length = dc.length = 0
        if shape == "chain":
            return ChainStepGraph(target, draft, tc, dc, k=3, verifier="sps", iid=draw == "iid", sampling=Sampling(),
                                  d_sampling=Sampling(), vocab=29)
        return TreeStepGraph(target, draft, tc, dc, parents=(-1, -1, 0, 0, 1, 1, 2), order=range(7),
                             verifier="traversal", sampling=Sampling(1.0), d_sampling=Sampling(1.0), vocab=29,
                             draw=draw)

    def decode(step: Any, rng: np.random.Generator, drawn: bool) -> list[Any]:
        state, out = (0, 4, 0, (4,)), []
        for _ in range(8):
            if drawn:
                one = step.draw_step(*state, rng)
            else:
                u_draft = rng.random(step.draft_uniforms) if step.draft_uniforms else None
                one = step.step(*state, u_draft, rng.random(step.noise))
            out.append(one)
            if one is None:  # a short tree: the caches as they were; the next step draws afresh
                continue
            state = (one.t_past, one.tokens[-1], one.d_past, one.pending)
        return out

    rngs = [np.random.default_rng(7), np.random.default_rng(7)]
    by_step = decode(make(), rngs[0], False)
    assert decode(make(), np.random.default_rng(8), False) != by_step  # the uniforms matter: another seed parts
    assert decode(make(), rngs[1], True) == by_step
    assert rngs[0].bit_generator.state == rngs[1].bit_generator.state
    step = make()
    with pytest.raises(ValueError, match="rng must be a numpy.random.Generator, got RandomState"):
        step.draw_step(0, 4, 0, [4], np.random.RandomState(0))
    with pytest.raises(ValueError, match="the caches hold 0 / 0 positions, not t_past 1 / d_past 0"):
        step.draw_step(1, 4, 0, [4], rngs[0])
    assert step.captures == step.replays == 0 and step._out is None  # refused before any work
