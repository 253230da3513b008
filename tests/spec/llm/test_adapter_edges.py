"""Edges of spec.llm.adapter and spec.llm.static_cache that the broader tests leave open (found by a mutation
audit: each test here failed on a one-line change of the code that the rest of the suite let pass).

Tiny random models on the CPU, a few seconds in all.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from transformers import DynamicCache  # noqa: E402

from spec.builders import ChainBuilder  # noqa: E402
from spec.llm.adapter import (  # noqa: E402
    LLMDraft, cache_length, forward_masked, full_attention_span, select_cache,
)
from spec.llm.models import tiny_llama  # noqa: E402
from spec.llm.sampling import Sampling, process_logits  # noqa: E402
from spec.llm.static_cache import StaticTreeCache, cache_keyword  # noqa: E402
from spec.randomness import RngSampler  # noqa: E402

pytestmark = pytest.mark.llm


def _draft_model() -> object:
    return tiny_llama(29, hidden_size=16, layers=1, heads=2, intermediate=32, seed=1)


def _plain(model: object, tokens: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([tokens])).logits[0, -1]  # type: ignore[operator]


@pytest.mark.parametrize(("kinds", "span"), [(["local"], 12), (["global"], None), (["global", "local"], 12)])
def test_gpt_neo_span_is_limited_by_its_local_layers_only(kinds: list[str], span: int | None) -> None:
    """The window_size limit holds where some layer is ``local`` (all-local included), and not for
    an all-global GPT-Neo (a config mixing both kinds cannot tell the two rules apart)."""
    cfg = transformers.GPTNeoConfig(vocab_size=13, hidden_size=32, num_layers=2, num_heads=4,
                                    attention_types=[[kinds, 2 // len(kinds)]], window_size=12,
                                    bos_token_id=None, eos_token_id=None)
    assert full_attention_span(cfg) == span


@pytest.mark.parametrize("kind", ["dynamic", "static"])
def test_select_cache_of_a_range_that_does_not_start_at_zero_gathers_it(kind: str) -> None:
    """``range(2, 5)`` is indices 2, 3, 4 (as the list is), not a prefix of 3 positions."""
    model = tiny_llama(50, seed=0)
    ctx = [5, 9, 2, 7, 11, 3, 8]
    caches = []
    for indices in (range(2, 5), [2, 3, 4]):
        cache = DynamicCache() if kind == "dynamic" else StaticTreeCache(model, 64)
        forward_masked(model, cache, ctx, list(range(7)), np.tril(np.ones((7, 7), dtype=bool)))
        select_cache(cache, indices)
        assert cache_length(cache) == 3
        caches.append(cache)
    if kind == "dynamic":
        for a, b in zip(caches[0].layers, caches[1].layers):
            assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)
    else:
        assert torch.equal(caches[0].kv[..., :3, :], caches[1].kv[..., :3, :])


@pytest.mark.parametrize("columns", [6, 8])
def test_a_mask_with_the_wrong_number_of_columns_is_refused_before_any_forward(columns: int) -> None:
    """3 tokens after 4 cached need 7 columns: a wrong column count is refused by name before the forward (without
    the check the dynamic cache's first layer grew before attention raised a RuntimeError)."""
    model = tiny_llama(50, seed=0)
    cache = DynamicCache()
    with torch.no_grad():
        model(torch.tensor([[1, 2, 3, 4]]), use_cache=True, **{cache_keyword(model): cache})
    with pytest.raises(ValueError, match=rf"allowed has shape \(3, {columns}\); expected \(3, 7\)"):
        forward_masked(model, cache, [17, 19, 23], [4, 5, 6], np.ones((3, columns), dtype=bool))
    assert [layer.keys.shape[-2] for layer in cache.layers] == [4, 4]


def test_a_ranked_tree_never_feeds_an_id_the_draft_cannot_embed() -> None:
    """A draft embedding 11 ids on a decode vocabulary of 16; a greedy row has one token with q > 0,
    so the 12th ranked root child falls on id 11, which the draft lacks.  It is clamped (and ``short`` set, so the
    decode loop falls back to the host builder) instead of reaching the embedding (IndexError)."""
    model = tiny_llama(11, hidden_size=16, layers=1, heads=2, intermediate=32, seed=1)
    draft = LLMDraft(model, DynamicCache(), 0, pending=[1, 2, 3], sampling=Sampling(0.0), vocab=16)
    tree = draft.draft_tree((-1,) * 12 + (0,), None)
    assert bool(tree.short)
    assert int(tree.tokens.max()) <= 10
    assert draft.forwards == 2  # the pending tokens, then the 12 root children


def test_draft_chain_stops_where_the_chain_builder_does_when_q_equals_the_confidence() -> None:
    """``ChainBuilder`` ends a chain after a token whose q is *below* the confidence; greedy rows have
    q = 1.0, so ``confidence=1.0`` stops nothing, on the host and on the device alike."""
    model = _draft_model()

    def draft() -> LLMDraft:
        return LLMDraft(model, DynamicCache(), 0, pending=[4, 8, 15], sampling=Sampling(0.0))

    host = ChainBuilder(confidence=1.0).build(draft(), 4, RngSampler(np.random.default_rng(0)))
    on_device = draft()
    chain = on_device.draft_chain(4, torch.from_numpy(np.random.default_rng(0).random(4)), 1.0)
    assert len(host.tokens) == 4
    assert chain.tokens.tolist() == list(host.tokens)
    assert on_device.forwards == 4  # the pending tokens, then tokens 1..3


def test_rows_asked_after_settle_tree_see_every_settled_ancestor() -> None:
    """After ``draft_tree`` + ``settle_tree`` of a 3-node chain, the row of its deepest node (fed by
    ``rows``) attends to both settled ancestors: it equals plain decoding of the context and the path."""
    model = _draft_model()
    ctx = [4, 8, 15]
    draft = LLMDraft(model, DynamicCache(), 0, pending=ctx, sampling=Sampling(1.0))
    tree = draft.draft_tree((-1, 0, 1), torch.tensor([0.3, 0.6, 0.9], dtype=torch.float64))
    toks = tree.tokens.tolist()
    draft.settle_tree(toks)
    got = draft.rows([tuple(toks)])[0]
    want = process_logits(_plain(model, ctx + toks), 1.0, None, None).numpy()
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)


def test_static_cache_capacity_doubles_when_a_forward_overruns_it() -> None:
    """The buffers grow by doubling (one reallocation, and so one re-capture of graphs, per
    doubling), not to the next multiple of CAPACITY_STEP that fits."""
    model = tiny_llama(50, seed=0)
    cache = StaticTreeCache(model, 128)
    forward_masked(model, cache, list(range(50)) * 2 + list(range(28)), list(range(128)),
                   np.tril(np.ones((128, 128), dtype=bool)))
    assert cache.capacity == 128
    forward_masked(model, cache, [7], [128], np.ones((1, 129), dtype=bool))
    assert cache.capacity == 256 and cache.length == 129
