"""spec.llm.static_cache: the static KV cache gives plain decoding's logits, and the decode loop's tokens.

References as in ``test_adapter.py``: one full-sequence forward of
``context + path`` with no cache (``atol = 1e-5``, float32), and the
``DynamicCache`` loop on identical noise.  CUDA graphs are checked in
``test_cuda.py``; here the padding they need runs on the CPU (``pad=True``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

pytest.importorskip("transformers")
import torch  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM  # noqa: E402

from spec.builders import BUILDERS  # noqa: E402
from spec.llm.adapter import LLMDraft, cache_length, forward_masked, select_cache, tree_logits, trim_cache  # noqa: E402
from spec.llm.generate import VERIFIERS, ar_generate, generate  # noqa: E402
from spec.llm.models import tiny_llama  # noqa: E402
from spec.llm.sampling import Sampling, process_logits  # noqa: E402
from spec.llm.static_cache import StaticTreeCache, cache_keyword, shared_static_cache  # noqa: E402
from spec.tree import bfs_order, dfs_order, keep_indices, random_tree  # noqa: E402
from tmc.multidraft import DraftTree  # noqa: E402

pytestmark = pytest.mark.llm

VOCAB = 50
ATOL = 1e-5


@pytest.fixture(scope="module")
def model() -> LlamaForCausalLM:
    return tiny_llama(VOCAB, hidden_size=32, layers=2, heads=4, kv_heads=2, seed=0)


def context(n: int = 7, seed: int = 0) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(0, VOCAB, size=n)]


def plain(model: LlamaForCausalLM, tokens: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([list(tokens)])).logits[0, -1]


def causal(model: LlamaForCausalLM, cache: StaticTreeCache, tokens: list[int]) -> torch.Tensor:
    n = len(tokens)
    return forward_masked(model, cache, tokens, np.arange(cache.length, cache.length + n),
                          np.tril(np.ones((n, cache.length + n), dtype=bool), k=cache.length))


def hand_tree() -> DraftTree:
    return DraftTree.build([-1, -1, 0, 1, 2, 0], [3, 9, 7, 3, 7, 11], "topk", {}, VOCAB)


@pytest.mark.parametrize("pad", [False, True])
@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_tree_logits_on_the_static_cache_equal_plain_decoding(model: LlamaForCausalLM, pad: bool, impl: str) -> None:
    model.config._attn_implementation = impl
    try:
        ctx = context()
        for tree in (hand_tree(), random_tree(9, 1, vocab=VOCAB), random_tree(13, 2, vocab=VOCAB)):
            expected = torch.stack([plain(model, ctx)] + [plain(model, ctx + list(tree.path(i)))
                                                          for i in range(tree.size)])
            cache = StaticTreeCache(model, 64, pad=pad)
            causal(model, cache, ctx[:-1])
            got = tree_logits(model, cache, tree, len(ctx) - 1, root_token=ctx[-1], order=dfs_order(tree))
            assert cache_length(cache) == len(ctx) + tree.size
            torch.testing.assert_close(got, expected, rtol=0, atol=ATOL)
    finally:
        model.config._attn_implementation = "sdpa"


@pytest.mark.parametrize("pad", [False, True])
def test_select_after_tree_forwards_continues_like_plain_decoding(model: LlamaForCausalLM, pad: bool) -> None:
    """Several steps: tree forward, keep one root-to-node path (entries moved), the next tree sees exactly it."""
    rng = np.random.default_rng(3)
    ctx = context()
    cache = StaticTreeCache(model, 64, pad=pad)
    causal(model, cache, ctx[:-1])
    past, root = len(ctx) - 1, ctx[-1]
    moved = 0
    for step in range(5):
        tree = random_tree(int(rng.integers(6, 12)), step, vocab=VOCAB)
        order = bfs_order(tree)
        got = tree_logits(model, cache, tree, past, root_token=root, order=order)
        torch.testing.assert_close(got[0], plain(model, ctx), rtol=0, atol=ATOL)
        node = max(range(tree.size), key=lambda i: (len(tree.path(i)), i))  # the deepest, last in BFS order
        path = []
        while node >= 0:
            path.append(node)
            node = tree.parents[node]
        path.reverse()
        keep = keep_indices(tree, path, past, order, with_root=True)
        moved += bool(np.any(np.asarray(keep) != np.arange(len(keep))))
        select_cache(cache, keep)
        ctx = ctx + [tree.tokens[i] for i in path]
        assert cache_length(cache) == len(ctx)
        past, root = len(ctx), int(rng.integers(VOCAB))
        ctx = ctx + [root]
    assert moved >= 3
    torch.testing.assert_close(causal(model, cache, [root])[0], plain(model, ctx), rtol=0, atol=ATOL)


def test_capacity_grows_and_keeps_the_context(model: LlamaForCausalLM) -> None:
    ctx = context(50, seed=1)
    cache = StaticTreeCache(model, 1)
    assert cache.capacity == 64
    causal(model, cache, ctx[:40])
    got = causal(model, cache, ctx[40:])  # 50 of 64 slots
    torch.testing.assert_close(got[-1], plain(model, ctx), rtol=0, atol=ATOL)
    more = context(30, seed=2)
    got = causal(model, cache, more)
    assert cache.capacity >= 80 and cache.length == 80
    torch.testing.assert_close(got[-1], plain(model, ctx + more), rtol=0, atol=ATOL)


def test_trim_and_prefix_select(model: LlamaForCausalLM) -> None:
    ctx = context(12)
    cache = StaticTreeCache(model, 64)
    causal(model, cache, ctx)
    trim_cache(cache, 9)
    assert cache_length(cache) == 9
    select_cache(cache, range(5))
    assert cache.length == 5
    got = causal(model, cache, ctx[5:8])
    torch.testing.assert_close(got[-1], plain(model, ctx[:8]), rtol=0, atol=ATOL)
    with pytest.raises(ValueError, match="exceeds"):
        trim_cache(cache, 9)
    with pytest.raises(ValueError, match="strictly increasing"):
        select_cache(cache, [0, 2, 1])
    with pytest.raises(ValueError, match=r"\[0, 8\)"):
        select_cache(cache, range(9))
    assert cache.length == 8


@pytest.mark.parametrize("sampling", [Sampling(1.0), Sampling(0.7, top_k=5)])
def test_llm_draft_on_the_static_cache_gives_the_processed_plain_rows(model: LlamaForCausalLM,
                                                                      sampling: Sampling) -> None:
    ctx = context()
    draft = LLMDraft(model, StaticTreeCache(model, 64, pad=True), 0, pending=ctx, sampling=sampling)
    paths = [(), (4,), (4, 9), (17,), (4, 9, 2)]
    rows = draft.rows(paths)
    assert draft.forwards == 1
    for path, row in zip(paths, rows):
        want = process_logits(plain(model, ctx + list(path)), sampling.temperature, sampling.top_k, sampling.top_p)
        np.testing.assert_allclose(row, want.numpy(), rtol=0, atol=1e-6)


def test_every_builder_and_verifier_is_greedy_on_the_static_cache() -> None:
    target = tiny_llama(13, hidden_size=32, layers=2, heads=4, seed=0)
    draft = tiny_llama(13, hidden_size=32, layers=1, heads=4, seed=1)
    with torch.no_grad():  # sharp rows so trees get deep and paths are moved in the cache
        target.lm_head.weight.mul_(40.0)
        draft.lm_head.weight.mul_(40.0)
    prompt = [3, 1, 4, 1, 5]
    ref = ar_generate(target, prompt, temperature=0, max_new_tokens=16).tokens
    assert ar_generate(target, prompt, temperature=0, max_new_tokens=16, cache="static").tokens == ref
    ran = 0
    for name in BUILDERS:
        for verifier in VERIFIERS:
            if verifier in ("sps", "asps", "block") and name != "chain":
                continue
            try:
                out = generate(target, draft, prompt, name, verifier, temperature=0, max_new_tokens=16, budget=6,
                               seed=1, cache="static")
            except ValueError as err:  # not lossless on this builder's trees: refused
                assert "verif" in str(err)
                continue
            assert out.tokens == ref, (name, verifier)
            ran += 1
    assert ran >= 20


@pytest.mark.parametrize(("builder", "verifier"), [("chain", "asps"), ("dyspec", "traversal"),
                                                   ("fixed", "multidraft"), ("dynatree", "traversal")])
def test_sampling_on_the_static_cache_replays_the_dynamic_run(builder: str, verifier: str) -> None:
    """Identical noise, rows equal to float32 rounding: the same tokens on every seed tried."""
    target = tiny_llama(17, hidden_size=32, layers=2, heads=4, seed=4)
    draft = tiny_llama(17, hidden_size=16, layers=1, heads=2, seed=5)
    with torch.no_grad():
        target.lm_head.weight.mul_(10.0)
        draft.lm_head.weight.mul_(10.0)
    accepted = 0
    for seed in range(4):
        kw = dict(budget=6, temperature=1.0, max_new_tokens=20, seed=seed)
        a = generate(target, draft, [2, 7, 1], builder, verifier, cache="dynamic", **kw)
        b = generate(target, draft, [2, 7, 1], builder, verifier, cache="static", **kw)
        assert a.tokens == b.tokens
        assert [s.accepted for s in a.steps] == [s.accepted for s in b.steps]
        accepted += sum(s.accepted for s in b.steps)
    assert accepted > 0  # some drafts were accepted, so kept paths were moved in the cache


def test_shared_cache_is_reused_per_model_and_role(model: LlamaForCausalLM) -> None:
    a = shared_static_cache(model, "target", 40)
    causal(model, a, context())
    assert shared_static_cache(model, "target", 40) is a and a.length == 0
    assert shared_static_cache(model, "draft", 40) is not a
    big = shared_static_cache(model, "target", 500)
    assert big is a and a.capacity >= 500


def test_a_cache_made_under_inference_mode_works_outside_it(model: LlamaForCausalLM) -> None:
    with torch.inference_mode():
        cache = StaticTreeCache(model, 64, pad=True)
        causal(model, cache, context()[:3])
    got = causal(model, cache, context()[3:])
    torch.testing.assert_close(got[-1], plain(model, context()), rtol=0, atol=ATOL)


def test_bad_input(model: LlamaForCausalLM) -> None:
    with pytest.raises(ValueError, match="graphs=True needs a CUDA model"):
        StaticTreeCache(model, 64, graphs=True)
    with pytest.raises(ValueError, match="capacity"):
        StaticTreeCache(model, 0)
    with pytest.raises(ValueError, match="max_graph_tokens"):
        StaticTreeCache(model, 64, max_graph_tokens=0)
    cache = StaticTreeCache(model, 64)
    with pytest.raises(RuntimeError, match="only through"):
        cache.update(torch.zeros(1, 2, 1, 8), torch.zeros(1, 2, 1, 8), 0)
    other = tiny_llama(VOCAB, seed=9)
    with pytest.raises(ValueError, match="another model"):
        causal(other, cache, [1, 2])
    with pytest.raises(ValueError, match="empty"):
        cache.forward([], [], np.zeros((0, 0), dtype=bool))
    sliding = MistralForCausalLM(MistralConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=1,
                                               num_attention_heads=4, intermediate_size=64, sliding_window=8))
    assert StaticTreeCache(sliding, 64).window == (8, False)  # a window is a mask matter (test_windows.py)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                      intermediate_size=64)
    cfg.layer_types = ["full_attention", "linear_attention"]
    with pytest.raises(ValueError, match=r"full-attention and sliding-window layers only.*linear_attention"):
        StaticTreeCache(LlamaForCausalLM(cfg), 64)


def test_refusals_no_other_test_reached(model: LlamaForCausalLM) -> None:
    """A mutation audit (2026-11-28) removed each of these checks and no test failed: ``trim`` past the held
    length (it "kept" slots never written: the next token's logits moved 0.032), a mask of one row for three
    tokens (broadcast to every query: 0.049 off plain decoding, on either cache), and a crop that reads another
    convention (``trim_cache`` kept 2 positions when asked for 7)."""
    from transformers import DynamicCache

    cache = StaticTreeCache(model, 64)
    causal(model, cache, context(5))
    with pytest.raises(ValueError, match="length 8 exceeds the 5 positions the cache holds"):
        cache.trim(8)
    dynamic = DynamicCache()
    with torch.no_grad():
        model(torch.tensor([context(4)]), use_cache=True, **{cache_keyword(model): dynamic})
    for held in (dynamic, StaticTreeCache(model, 64)):
        if isinstance(held, StaticTreeCache):
            causal(model, held, context(4))
        with pytest.raises(ValueError, match=r"allowed has shape \(1, 7\); expected \(3, 7\) for 3 tokens after 4"):
            forward_masked(model, held, [17, 19, 23], [4, 5, 6], np.ones((1, 7), dtype=bool))
    mirrored = DynamicCache()
    with torch.no_grad():
        model(torch.tensor([context(9)]), use_cache=True, **{cache_keyword(model): mirrored})
    crop = mirrored.crop
    mirrored.crop = lambda n: crop(-(cache_length(mirrored) + n))  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match=r"cache.crop\(-2\) left 2 positions, expected 7"):
        trim_cache(mirrored, 7)


def test_a_padded_forward_that_ends_at_capacity_equals_plain_decoding(model: LlamaForCausalLM) -> None:
    """Padding rounds a forward's length up (to 4 here) but never writes past the capacity: 3 tokens after 61 in a
    64-slot padded cache fill it exactly (a mutation audit: without the bound, slot 64 was written, IndexError)."""
    ctx = context(64, seed=3)
    cache = StaticTreeCache(model, 64, pad=True)
    causal(model, cache, ctx[:61])
    got = causal(model, cache, ctx[61:])[-1]
    assert cache.capacity == 64 and cache.length == 64
    torch.testing.assert_close(got, plain(model, ctx), atol=ATOL, rtol=0)


def test_head_dim_is_read_from_the_config_where_it_is_set() -> None:
    """Qwen3 and others set ``head_dim`` apart from ``hidden_size // heads`` (16 here against 32 // 4 = 8); sized
    by the quotient, the static cache refused the model (a mutation audit: the architecture tests all had equal
    values).  Greedy on the static cache = plain greedy decoding."""
    import transformers

    def tiny(seed: int) -> Any:
        torch.manual_seed(seed)
        cfg = transformers.Qwen3Config(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                       num_key_value_heads=2, head_dim=16, intermediate_size=64,
                                       max_position_embeddings=256)
        cfg._attn_implementation = "sdpa"
        return transformers.Qwen3ForCausalLM(cfg).eval()

    target, draft = tiny(0), tiny(1)
    want = ar_generate(target, [3, 1, 4], temperature=0, max_new_tokens=8, cache="dynamic").tokens
    got = generate(target, draft, [3, 1, 4], "dyspec", "traversal", temperature=0, max_new_tokens=8, budget=4,
                   cache="static")
    assert got.tokens == want


def test_keys_of_another_shape_than_the_config_says_are_named() -> None:
    """A config that misstates the key/value heads (a family with its own spelling) sizes the buffers wrongly:
    the first write names the shapes and the way out instead of failing inside ``index_copy_``."""
    liar = tiny_llama(VOCAB, seed=3)
    liar.config.num_key_value_heads = 1  # the model was built with one per query head
    cache = StaticTreeCache(liar, 64)
    with pytest.raises(ValueError, match=r"layer 0 gives keys of shape \(1, 4, 2, 8\).*for 1 key/value heads of 8.*"
                                         r"cache='dynamic'"):
        causal(liar, cache, [1, 2])


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"cache": "paged"}, "cache must be one of"),
    ({"cache": "dynamic", "graphs": True}, "graphs=True needs cache='static'"),
    ({"cache": "static", "graphs": True}, "graphs=True needs a CUDA model"),
    ({"graphs": "yes"}, "graphs must be"),
])
def test_generate_rejects_bad_cache_settings(model: LlamaForCausalLM, kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        generate(model, model, [1, 2, 3], "chain", "sps", max_new_tokens=2, **kwargs)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=match.split(" needs")[0]):
            ar_generate(model, [1, 2, 3], max_new_tokens=2, **kwargs)  # type: ignore[arg-type]
