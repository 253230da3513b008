"""Chains drafted and verified on the model's device (``generate(..., chain_on_device=True)``, the default).

The device path must give exactly what the host path gives (``ChainBuilder``
through ``LLMDraft.rows`` + ``verify_chain``) with the same seed: the same
uniforms in the same order, the same inverse-CDF rule.  On the CPU the
cumulative sums are sequential in both numpy and torch, so the tokens are
equal on every seed; the draft rows agree to the host's renormalisation
(relative 1e-15).
"""

from __future__ import annotations

import copy
import itertools
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from transformers import DynamicCache  # noqa: E402

from spec.builders import ChainBuilder  # noqa: E402
from spec.llm.adapter import LLMDraft  # noqa: E402
from spec.llm.generate import VERIFIERS, generate  # noqa: E402
from spec.llm.verify import TREE_METHODS  # noqa: E402
from spec.llm.models import tiny_pair  # noqa: E402
from spec.llm.sampling import Sampling  # noqa: E402
from spec.randomness import RngSampler  # noqa: E402

pytestmark = pytest.mark.llm


@pytest.fixture(scope="module")
def pair() -> tuple[object, object]:
    target, draft = tiny_pair(29, seed=3)
    with torch.no_grad():  # sharper rows: long accepted runs and some rejections
        target.lm_head.weight.mul_(12.0)
        draft.lm_head.weight.mul_(12.0)
    return target, draft


#: (temperature, top_k, draft_temperature) of the device-against-host checks: greedy, plain, filtered, and
#: the draft at its own temperature (a warm draft under a greedy target, a cooler one under T = 1)
SETTINGS = ((0.0, None, None), (1.0, None, None), (0.6, 9, None), (0.0, None, 1.0), (1.0, None, 0.5))


@pytest.mark.parametrize(("verifier", "draw", "cache"),
                         list(itertools.product(VERIFIERS, ("iid", "topk"), ("dynamic", "static"))))
def test_device_chain_equals_the_host_chain(pair: tuple[object, object], verifier: str, draw: str, cache: str) -> None:
    """Chain verifiers on the device and tree verifiers on the chain drafted there, against the host path."""
    target, draft = pair
    if verifier == "kseq" and draw == "topk":  # K-SEQ needs i.i.d. siblings: both paths refuse, before any forward
        for on_device in (True, False):
            with pytest.raises(ValueError, match="'kseq' verifies iid trees only; these trees are drawn topk"):
                generate(target, draft, [5, 3, 5], "chain", verifier, builder_params={"draw": draw}, cache=cache,
                         chain_on_device=on_device)
        return
    runs = 0
    for (temperature, top_k, dtemp), seed, k in itertools.product(SETTINGS, range(2), (1, 4)):
        kw = dict(temperature=temperature, max_new_tokens=14, budget=k, seed=seed, cache=cache,
                  builder_params={"draw": draw}, top_k=top_k, draft_temperature=dtemp)
        host = generate(target, draft, [5, 3, 5], "chain", verifier, chain_on_device=False, **kw)
        for backend in ("torch", "numpy"):  # the torch verifier on the device, or its numpy reference
            dev = generate(target, draft, [5, 3, 5], "chain", verifier, chain_on_device=True, verify_backend=backend,
                           **kw)
            assert dev.tokens == host.tokens, (temperature, dtemp, seed, k, backend)
            assert [(s.accepted, s.emitted, s.tree_size, s.draft_forwards) for s in dev.steps] == \
                [(s.accepted, s.emitted, s.tree_size, s.draft_forwards) for s in host.steps]
        runs += 1
    assert runs == 20


#: a stop that both cuts some chains and lets others reach the budget of 5 on this pair (the argmax is likelier
#: than a sampled token)
CONFIDENCE = {"iid": 0.05, "topk": 0.3}


@pytest.mark.parametrize(("draw", "cache"), list(itertools.product(("iid", "topk"), ("dynamic", "static"))))
def test_confidence_chain_on_the_device_equals_the_host_chain(pair: tuple[object, object], draw: str,
                                                              cache: str) -> None:
    """``ChainBuilder(confidence=c)``: the device path stops where the host builder stops, and leaves the
    generator where the host path leaves it (the next step's uniforms are the same), for every verifier
    (tree verifiers take the host path either way).  Some chains stop early and some run to the budget."""
    target, draft = pair
    sizes: set[int] = set()
    for verifier in VERIFIERS:
        if verifier == "kseq" and draw == "topk":
            continue
        for (temperature, top_k, dtemp), seed in itertools.product(SETTINGS[1:], range(2)):
            kw = dict(temperature=temperature, max_new_tokens=14, budget=5, seed=seed, cache=cache, top_k=top_k,
                      builder_params={"draw": draw, "confidence": CONFIDENCE[draw]},
                      draft_temperature=dtemp)
            host = generate(target, draft, [5, 3, 5], "chain", verifier, chain_on_device=False, **kw)
            dev = generate(target, draft, [5, 3, 5], "chain", verifier, chain_on_device=True, **kw)
            assert dev.tokens == host.tokens, (verifier, temperature, dtemp, seed)
            assert [(s.accepted, s.emitted, s.tree_size, s.draft_forwards) for s in dev.steps] == \
                [(s.accepted, s.emitted, s.tree_size, s.draft_forwards) for s in host.steps]
            sizes |= {s.tree_size for s in host.steps}
    assert 5 in sizes and min(sizes) < 5, sizes


def test_draft_chain_stops_after_the_first_unconfident_token(pair: tuple[object, object]) -> None:
    """``draft_chain(k, u, confidence)`` against the host builder on the same uniforms: the same tokens and
    rows, fewer forwards when it stops, and a chain-only, in-range ``confidence``."""
    _, model = pair
    stopped = 0
    for seed, c in itertools.product(range(6), (0.02, 0.05, 0.3)):
        on_host, on_device = _drafts(model, [4, 8, 15, 16], Sampling(1.0))
        tree = ChainBuilder(confidence=c).build(on_host, 5, RngSampler(np.random.default_rng(seed)))
        chain = on_device.draft_chain(5, torch.from_numpy(np.random.default_rng(seed).random(5)), c)
        assert chain.tokens.tolist() == list(tree.tokens)
        n = len(tree.tokens)
        np.testing.assert_allclose(chain.q.numpy(), [tree.q_rows[i - 1] for i in range(n)], rtol=1e-14, atol=1e-300)
        assert on_device.forwards == on_host.forwards == n  # the pending tokens, then tokens 1..n-1
        stopped += n < 5
        on_device.settle_chain(chain.tokens.tolist())
    assert 0 < stopped < 18
    draft, _ = _drafts(model, [1, 2, 3], Sampling(1.0))
    for bad in (0.0, 1.5, float("nan")):
        with pytest.raises(ValueError, match="confidence"):
            draft.draft_chain(3, None, bad)
    with pytest.raises(ValueError, match="stop_below needs a chain"):
        draft.draft_tree((-1, -1), None, stop_below=0.5)


@pytest.mark.parametrize("verifier", ["sps", "traversal"])
def test_device_chain_stops_at_eos_and_length(pair: tuple[object, object], verifier: str) -> None:
    target, draft = pair
    host = generate(target, draft, [1, 2], "chain", verifier, temperature=1.0, max_new_tokens=30, budget=4, seed=4,
                    chain_on_device=False)
    eos = host.tokens[7]
    for n in (1, 5, 30):
        kw = dict(temperature=1.0, max_new_tokens=n, budget=4, seed=4, eos_token_id=eos)
        dev = generate(target, draft, [1, 2], "chain", verifier, **kw)
        assert dev.tokens == generate(target, draft, [1, 2], "chain", verifier, chain_on_device=False, **kw).tokens
        assert len(dev.tokens) <= n and dev.tokens.count(eos) <= 1 and (eos not in dev.tokens or dev.tokens[-1] == eos)


def _drafts(model: object, ctx: list[int], sampling: Sampling) -> list[LLMDraft]:
    return [LLMDraft(model, DynamicCache(), 0, pending=ctx, sampling=sampling) for _ in range(2)]


@pytest.mark.parametrize("temperature", [1.0, 0.0])
def test_draft_chain_draws_the_chain_builders_tokens_and_rows(pair: tuple[object, object], temperature: float) -> None:
    _, model = pair
    sampling = Sampling(temperature)
    for seed in range(4):
        on_host, on_device = _drafts(model, [4, 8, 15, 16], sampling)
        tree = ChainBuilder().build(on_host, 5, RngSampler(np.random.default_rng(seed)))
        chain = on_device.draft_chain(5, torch.from_numpy(np.random.default_rng(seed).random(5)))
        assert chain.tokens.tolist() == list(tree.tokens)
        q = np.array([tree.q_rows[i - 1] for i in range(5)])  # token i is drawn from its parent's row (ROOT = -1)
        np.testing.assert_allclose(chain.q.numpy(), q, rtol=1e-14, atol=1e-300)
        assert not bool(chain.fault)
        assert on_device.forwards == on_host.forwards == 5  # the pending tokens, then tokens 1..4
        on_device.settle_chain(chain.tokens.tolist())
        # the next step starts from the same cache: accepted 2 drafts, then a token of our choice
        emitted = list(tree.tokens[:2]) + [(tree.tokens[2] + 1) % 29]
        nxt_host, nxt_dev = on_host.end_step(emitted), on_device.end_step(emitted)
        assert nxt_dev.past_len == nxt_host.past_len and nxt_dev.pending == nxt_host.pending
        np.testing.assert_allclose(nxt_dev.rows([(), (3,)]), nxt_host.rows([(), (3,)]), rtol=1e-6, atol=1e-9)


def test_draft_chain_argmax_without_uniforms(pair: tuple[object, object]) -> None:
    _, model = pair
    on_host, on_device = _drafts(model, [9, 9, 2], Sampling(1.0))
    tree = ChainBuilder(draw="topk").build(on_host, 4, 0)
    chain = on_device.draft_chain(4, None)
    assert chain.tokens.tolist() == list(tree.tokens)


def test_draft_chain_misuse_is_refused(pair: tuple[object, object]) -> None:
    _, model = pair
    draft, _ = _drafts(model, [1, 2, 3], Sampling(1.0))
    with pytest.raises(ValueError, match="k must"):
        draft.draft_chain(0, None)
    with pytest.raises(ValueError, match=r"shape \(3,\)"):
        draft.draft_chain(3, torch.zeros(2, dtype=torch.float64))
    with pytest.raises(ValueError, match="floating-point"):
        draft.draft_chain(3, torch.zeros(3, dtype=torch.int64))
    for bad in (1.0, -0.25, float("nan")):
        with pytest.raises(ValueError, match=r"\[0, 1\)"):
            draft.draft_chain(3, torch.tensor([0.5, bad, 0.5], dtype=torch.float64))
    with pytest.raises(RuntimeError, match="follows draft_chain"):
        draft.settle_chain([1, 2, 3])
    chain = draft.draft_chain(3, torch.full((3,), 0.5, dtype=torch.float64))
    with pytest.raises(RuntimeError, match="no node fed yet"):
        draft.draft_chain(3, None)
    with pytest.raises(RuntimeError, match="settle_chain"):
        draft.rows([()])
    with pytest.raises(RuntimeError, match="settle_chain"):
        draft.end_step([1])
    with pytest.raises(ValueError, match="drew 3 tokens, got 2"):
        draft.settle_chain([1, 2])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        draft.settle_chain([1, 2, 99])
    draft.settle_chain(chain.tokens.tolist())
    nxt = draft.end_step(chain.tokens.tolist()[:1])
    assert nxt.rows([()]).shape == (1, 29)


def test_chain_on_device_must_be_a_bool(pair: tuple[object, object]) -> None:
    target, draft = pair
    with pytest.raises(ValueError, match="chain_on_device"):
        generate(target, draft, [1], "chain", "sps", chain_on_device=1)  # type: ignore[arg-type]


@pytest.mark.parametrize(("which", "verifier", "temperature"),
                         list(itertools.product(("draft", "target"), ("sps", "traversal"), (0.0, 1.0))))
def test_bad_logits_raise_the_host_paths_error(which: str, verifier: str, temperature: float) -> None:
    """NaN logits raise the same ValueError on both paths (the device path checks its flag once per step;
    at temperature 0 the target's flag comes with its greedy rows, ``Sampling.probs_with_fault``)."""
    target, draft = tiny_pair(17, seed=1)
    with torch.no_grad():
        (draft if which == "draft" else target).lm_head.weight[5, 0] = float("nan")
    for on_device, backend in itertools.product((True, False), ("torch", "numpy")):
        with pytest.raises(ValueError, match=f"^{which}'s logits contain NaN"):
            generate(target, draft, [1, 2], "chain", verifier, temperature=temperature, max_new_tokens=6, budget=3,
                     seed=0, chain_on_device=on_device, verify_backend=backend)


@pytest.mark.parametrize(("verifier", "cache"), list(itertools.product(TREE_METHODS, ("dynamic", "static"))))
def test_device_tree_equals_the_host_tree(pair: tuple[object, object], verifier: str, cache: str) -> None:
    """A fixed i.i.d. tree drafted on the device (``draft_tree``, shape from ``FixedBuilder.full_shape``)
    gives the host path's tokens, accepted counts and forward counts, with every verifier backend (``device``:
    ``multidraft`` and ``traversal`` walked on the device, ``spec.llm.tree_device``).

    The sharp rows of this pair make i.i.d. twins (siblings with one token) common: the device path feeds
    each twin, the host path each path once."""
    target, draft = pair
    runs = 0
    for (temperature, top_k, dtemp), seed, (width, depth, budget) in itertools.product(
            SETTINGS, range(2), ((2, None, 7), (3, 2, 9), (1, None, 3))):
        kw = dict(temperature=temperature, max_new_tokens=14, budget=budget, seed=seed, cache=cache,
                  builder_params={"draw": "iid", "width": width, "depth": depth}, top_k=top_k,
                  draft_temperature=dtemp)
        host = generate(target, draft, [5, 3, 5], "fixed", verifier, chain_on_device=False, **kw)
        for backend in ("torch", "numpy", "device"):
            dev = generate(target, draft, [5, 3, 5], "fixed", verifier, chain_on_device=True, verify_backend=backend,
                           **kw)
            assert dev.tokens == host.tokens, (temperature, dtemp, seed, width, depth, budget, backend)
            assert [(s.accepted, s.emitted, s.tree_size, s.draft_forwards) for s in dev.steps] == \
                [(s.accepted, s.emitted, s.tree_size, s.draft_forwards) for s in host.steps]
        runs += 1
    assert runs == 30


#: (temperature, top_k, draft_temperature, path) for fixed top-k and swor trees: ``device`` where the draft's rows
#: keep ``width`` tokens with q > 0, and from a one-hot draft (the tree is a chain: ``generate._greedy_chain``);
#: ``host`` where they cannot (a top-k below the width); ``short`` where the rows of this sharp pair underflow to
#: 0 at a draft temperature of 0.001, so device trees come out short and the step is redone on the host
TOPK_SETTINGS = ((1.0, None, None, "device"), (0.6, 9, None, "device"), (0.0, None, 1.0, "device"),
                 (1.0, None, 0.5, "device"), (0.0, None, None, "device"), (1.0, 1, None, "host"),
                 (1.0, None, 0.001, "short"))


@pytest.mark.parametrize(("verifier", "cache", "draw"),
                         list(itertools.product(TREE_METHODS, ("dynamic", "static"), ("topk", "swor"))))
def test_device_topk_tree_equals_the_host_tree(pair: tuple[object, object], verifier: str, cache: str, draw: str,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A fixed top-k tree drafted on the device (ranked tokens, ``spec.llm.sampling.ranked_tokens``), or a
    fixed tree drawn without replacement (each sibling from its parent's row with the earlier siblings'
    tokens removed), gives the host path's tokens, accepted counts and forward counts, with every verifier
    backend; where the draft's rows cannot keep ``width`` tokens the host path runs from the start, and a
    tree that comes out short (``discard_tree``) is redone on the host with the same tokens (and, for
    ``swor``, the same uniforms)."""
    target, draft = pair
    calls = {"draft_tree": 0, "discard_tree": 0}
    for name in calls:
        original = getattr(LLMDraft, name)

        def counted(self: LLMDraft, *args: object, _name: str = name, _original: Any = original, **kw: Any) -> Any:
            calls[_name] += 1
            return _original(self, *args, **kw)

        monkeypatch.setattr(LLMDraft, name, counted)
    runs = 0
    for (temperature, top_k, dtemp, path), seed, (width, depth, budget) in itertools.product(
            TOPK_SETTINGS, range(2), ((2, None, 7), (3, 2, 9))):
        kw = dict(temperature=temperature, max_new_tokens=14, budget=budget, seed=seed, cache=cache,
                  builder_params={"draw": draw, "width": width, "depth": depth}, top_k=top_k,
                  draft_temperature=dtemp)
        try:
            host = generate(target, draft, [5, 3, 5], "fixed", verifier, chain_on_device=False, **kw)
        except ValueError as err:  # not lossless on these trees (K-SEQ): the device path refuses alike
            with pytest.raises(ValueError, match="verifies iid trees only"):
                generate(target, draft, [5, 3, 5], "fixed", verifier, **kw)
            assert "verifies iid trees only" in str(err)
            continue
        for backend in ("torch", "numpy", "device"):
            before = dict(calls)
            dev = generate(target, draft, [5, 3, 5], "fixed", verifier, chain_on_device=True, verify_backend=backend,
                           **kw)
            drafted, discarded = (calls[k] - before[k] for k in ("draft_tree", "discard_tree"))
            assert dev.tokens == host.tokens, (temperature, dtemp, seed, width, depth, budget, backend)
            assert [(s.accepted, s.emitted, s.tree_size) for s in dev.steps] == \
                [(s.accepted, s.emitted, s.tree_size) for s in host.steps]
            if path == "host":
                assert drafted == 0
            else:
                assert drafted > 0 and (discarded > 0) == (path == "short"), (path, drafted, discarded)
            if path != "short":  # a discarded tree's forwards count too
                assert [s.draft_forwards for s in dev.steps] == [s.draft_forwards for s in host.steps]
        runs += 1
    assert runs in (0, 28)
    assert runs or verifier == "kseq"


#: (temperature, top_k, draft_temperature) with a greedy draft: a greedy target, a sampled one, a filtered one
GREEDY_DRAFT = ((0.0, None, None), (1.0, None, 0.0), (0.7, 5, 0.0))


#: (builder, params, chain length at budget 5, host draft calls a step) of the builders whose trees are chains
#: from a greedy draft (``generate._greedy_chain``): within the budget and cut by each builder's own depth; WETAP
#: builds its ``length`` layers (8) before it prunes to the budget
GREEDY_CHAINS = (
    ("dyspec", {}, 5, 5), ("dyspec", {"max_depth": 3}, 3, 3), ("dyspec-threshold", {"max_depth": 4}, 4, 4),
    ("fixed", {}, 5, 5), ("fixed", {"draw": "topk", "width": 3, "depth": 4}, 4, 4),
    ("dynatree", {}, 5, 5), ("dynatree", {"root_top1": False, "max_depth": 3, "base_depth": 2.0}, 3, 3),
    ("wetap", {}, 5, 8), ("wetap", {"length": 3, "w_min": 2}, 3, 3),
)


@pytest.mark.parametrize(("case", "cache"), list(itertools.product(GREEDY_CHAINS, ("dynamic", "static"))),
                         ids=lambda x: x if isinstance(x, str) else f"{x[0]}-{x[2]}")
def test_greedy_draft_chains_are_drafted_on_the_device_equal_to_the_host_trees(
        pair: tuple[object, object], case: tuple[str, dict[str, Any], int, int], cache: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """From one-hot draft rows these builders grow one chain of a known length, one draft call a node on the
    host path; ``generate`` drafts that chain on the device instead (``_greedy_chain``): same tokens, accepted
    counts and tree sizes as the host builder, one draft forward a node, for multidraft and traversal and every
    verifier backend, and the same tokens from fused steps; a warm draft keeps the host builder (or, for
    ``fixed``, drafts its full tree)."""
    builder, params, chain, calls = case
    target, _ = pair
    draft = copy.deepcopy(target)  # the target with a noisy head: its argmax often agrees (a random draft's never)
    with torch.no_grad():
        noise = torch.randn(draft.lm_head.weight.shape, generator=torch.Generator().manual_seed(0))
        draft.lm_head.weight.add_(noise, alpha=0.3)
    drafted = {"n": 0}
    original = LLMDraft.draft_tree

    def counted(self: LLMDraft, *args: Any, **kw: Any) -> Any:
        drafted["n"] += 1
        assert len(args[0]) == chain or drafted.get("warm")  # the parents: a chain of that length
        return original(self, *args, **kw)

    monkeypatch.setattr(LLMDraft, "draft_tree", counted)
    accepted = 0
    for (temperature, top_k, dtemp), verifier in itertools.product(GREEDY_DRAFT, ("multidraft", "traversal")):
        kw = dict(temperature=temperature, top_k=top_k, draft_temperature=dtemp, max_new_tokens=14, budget=5,
                  seed=1, cache=cache, builder_params=params)
        host = generate(target, draft, [5, 3, 5], builder, verifier, chain_on_device=False, **kw)
        assert drafted["n"] == 0
        assert {(s.tree_size, s.draft_forwards) for s in host.steps[1:]} == {(chain, calls)}  # one call a layer
        for backend in ("torch", "numpy", "device"):
            dev = generate(target, draft, [5, 3, 5], builder, verifier, verify_backend=backend, **kw)
            assert dev.tokens == host.tokens, (temperature, dtemp, verifier, backend)
            assert [(s.accepted, s.emitted, s.tree_size) for s in dev.steps] == \
                [(s.accepted, s.emitted, s.tree_size) for s in host.steps]
            assert {s.draft_forwards for s in dev.steps[1:]} == {chain}
            assert drafted["n"] == len(dev.steps)
            drafted["n"] = 0
        if cache == "static":  # and fused: the whole step as one piece of device work (TreeStepGraph)
            assert generate(target, draft, [5, 3, 5], builder, verifier, step_graph=True, **kw).tokens == host.tokens
            drafted["n"] = 0
        accepted += sum(s.accepted for s in host.steps)
    assert accepted > 0  # some chains are accepted past their first token
    drafted["warm"] = 1
    generate(target, draft, [5, 3, 5], builder, "traversal", temperature=0.0, draft_temperature=1.0,
             max_new_tokens=6, budget=5, cache=cache, builder_params=params)
    assert (drafted["n"] > 0) == (builder == "fixed")  # a warm draft: the host builder, but fixed's full tree


def test_device_tree_stops_at_eos_and_length_and_names_bad_logits(pair: tuple[object, object]) -> None:
    target, draft = pair
    kw: dict[str, object] = dict(temperature=1.0, budget=7, seed=4, builder_params={"draw": "iid"})
    host = generate(target, draft, [1, 2], "fixed", "traversal", max_new_tokens=30, chain_on_device=False, **kw)
    eos = host.tokens[7]
    for n in (1, 5, 30):
        dev = generate(target, draft, [1, 2], "fixed", "traversal", max_new_tokens=n, eos_token_id=eos, **kw)
        assert dev.tokens == generate(target, draft, [1, 2], "fixed", "traversal", max_new_tokens=n, eos_token_id=eos,
                                      chain_on_device=False, **kw).tokens
        assert len(dev.tokens) <= n and dev.tokens.count(eos) <= 1 and (eos not in dev.tokens or dev.tokens[-1] == eos)
    for which in ("draft", "target"):
        t, d = tiny_pair(17, seed=1)
        with torch.no_grad():
            (d if which == "draft" else t).lm_head.weight[5, 0] = float("nan")
        for on_device, temperature in itertools.product((True, False), (0.0, 1.0)):
            with pytest.raises(ValueError, match=f"^{which}'s logits contain NaN"):
                generate(t, d, [1, 2], "fixed", "traversal", max_new_tokens=6, chain_on_device=on_device,
                         **{**kw, "temperature": temperature})


def test_draft_tree_misuse_is_refused(pair: tuple[object, object]) -> None:
    _, model = pair
    draft, _ = _drafts(model, [1, 2, 3], Sampling(1.0))
    with pytest.raises(ValueError, match="at least one node"):
        draft.draft_tree((), None)
    with pytest.raises(ValueError, match=r"parents\[1\] = 1"):
        draft.draft_tree((-1, 1), None)
    with pytest.raises(ValueError, match="breadth first"):
        draft.draft_tree((-1, 0, -1), None)
    for bad, match in (((-1, -2), r"parents\[1\] must be >= -1"), ((-1, np.int64(-2)), r"parents\[1\] must be >= -1"),
                       ((-1, True), r"parents\[1\] must be an integer")):
        for _ in range(2):  # the second call would meet a cached layout
            with pytest.raises(ValueError, match=match):
                draft.draft_tree(bad, None)
    for u in (torch.tensor([0.5, 1.0], dtype=torch.float64), torch.tensor([-0.1, 0.5], dtype=torch.float32),
              torch.tensor([0.5, 1.0], dtype=torch.bfloat16)):  # the numpy test, and torch's for bfloat16
        with pytest.raises(ValueError, match=r"uniforms must lie in \[0, 1\)"):
            draft.draft_tree((-1, 0), u)
    with pytest.raises(ValueError, match=r"shape \(3,\)"):
        draft.draft_tree((-1, -1, 0), torch.zeros(2, dtype=torch.float64))
    for swor in ("yes", 1):
        with pytest.raises(ValueError, match="swor must be True .with uniforms. or False"):
            draft.draft_tree((-1, -1), torch.zeros(2, dtype=torch.float64), swor=swor)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="swor must be True .with uniforms. or False"):
        draft.draft_tree((-1, -1), None, swor=True)
    with pytest.raises(RuntimeError, match="follows draft_tree"):
        draft.settle_tree([1, 2, 3])
    with pytest.raises(RuntimeError, match="discard_tree follows draft_tree"):
        draft.discard_tree()
    tree = draft.draft_tree((-1, -1, 0, 0, 1), torch.full((5,), 0.5, dtype=torch.float64))
    assert tree.rows_of == (-1, 0, 1) and tuple(tree.q.shape) == (3, 29) and tuple(tree.tokens.shape) == (5,)
    assert draft.forwards == 2  # the pending tokens, then layer 1 (layer 2 is not fed)
    with pytest.raises(RuntimeError, match="settle_chain / settle_tree"):
        draft.rows([()])
    with pytest.raises(ValueError, match="drew 5 tokens, got 4"):
        draft.settle_tree([1, 2, 3, 4])
    toks = tree.tokens.tolist()
    draft.settle_tree(toks)
    nxt = draft.end_step(toks[:1] + toks[2:3] + [0])  # accepted node 0 and its first child, then a token
    assert nxt.past_len == 3 + 1 and nxt.pending == (toks[2], 0)  # layer 2 was never fed: its token is pending
