"""spec.llm.adapter: tree forward = plain decoding of each path; cache trim/gather; the LLM draft.

The reference everywhere is plain decoding: one full-sequence forward of
``context + path`` with no cache, default mask and positions (minGPT's test:
two computations of the same logits must agree, here to ``atol = 1e-5`` in
float32 on tiny random Llama models).
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("transformers")
import torch  # noqa: E402
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM  # noqa: E402
from transformers.cache_utils import DynamicSlidingWindowLayer  # noqa: E402

from spec.builders import DynaTreeBuilder, WetapBuilder  # noqa: E402
from spec.draft import BeamDraft, DraftModel, TopDraft, beam_candidates, draft_rows, select_beam  # noqa: E402
from spec.draft import select_top, top_candidates  # noqa: E402
from tests.spec.llm.conftest import transformers_version  # noqa: E402
from tests.spec.test_beam import random_rows  # noqa: E402
from spec.llm.adapter import (  # noqa: E402
    LLMDraft,
    additive_mask,
    cache_length,
    forward_masked,
    select_beam_torch,
    select_top_torch,
    select_cache,
    tree_logits,
    trim_cache,
)
from spec.llm.sampling import Sampling, process_logits  # noqa: E402
from spec.llm.generate import _prefill  # noqa: E402
from spec.llm.static_cache import StaticTreeCache, cache_keyword  # noqa: E402
from spec.tree import bfs_order, dfs_order, keep_indices, random_tree  # noqa: E402
from tmc.multidraft import DraftTree  # noqa: E402

pytestmark = pytest.mark.llm

VOCAB = 50
ATOL = 1e-5
_MODELS: dict[tuple[str, int], LlamaForCausalLM] = {}


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny models run ~10x faster on one thread than on two contended ones."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def tiny_model(impl: str = "sdpa", seed: int = 0) -> LlamaForCausalLM:
    """A tiny random Llama (built once per implementation and seed)."""
    if (impl, seed) not in _MODELS:
        torch.manual_seed(seed)
        cfg = LlamaConfig(
            vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64
        )
        cfg._attn_implementation = impl
        _MODELS[impl, seed] = LlamaForCausalLM(cfg).eval()
    return _MODELS[impl, seed]


def context(n: int = 7, seed: int = 0) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(0, VOCAB, size=n)]


def prefill(model, tokens) -> tuple[DynamicCache, torch.Tensor]:
    """A cache holding ``tokens`` and the logits after the last one (plain forward)."""
    cache = DynamicCache()
    with torch.no_grad():
        out = model(torch.tensor([list(tokens)]), use_cache=True, **{cache_keyword(model): cache})
    return cache, out.logits[0, -1]


def plain(model, tokens) -> torch.Tensor:
    """Logits after ``tokens``: full-sequence forward, no cache."""
    with torch.no_grad():
        return model(torch.tensor([list(tokens)])).logits[0, -1]


def hand_tree() -> DraftTree:
    # root -> 0 (tok 3) -> 2 (tok 7) -> 4 (tok 7); root -> 1 (tok 9) -> 3 (tok 3); 0 -> 5 (tok 11)
    return DraftTree.build([-1, -1, 0, 1, 2, 0], [3, 9, 7, 3, 7, 11], "topk", {}, VOCAB)


def trees() -> list[DraftTree]:
    return [hand_tree(), random_tree(9, 1, vocab=VOCAB), random_tree(12, 2, vocab=VOCAB)]


# --- tree_logits --------------------------------------------------------------------------


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
@pytest.mark.parametrize("with_root", [False, True])
def test_tree_logits_equal_plain_decoding_of_each_path(impl, with_root):
    model, ctx = tiny_model(impl), context()
    cached = ctx[:-1] if with_root else ctx
    for tree in trees():
        rows = [plain(model, ctx + list(tree.path(i))) for i in range(tree.size)]
        expected = torch.stack(([plain(model, ctx)] if with_root else []) + rows)
        for order in (None, dfs_order(tree), bfs_order(tree)):
            cache, _ = prefill(model, cached)
            got = tree_logits(model, cache, tree, len(cached), root_token=ctx[-1] if with_root else None, order=order)
            assert got.shape == (tree.size + with_root, VOCAB)
            assert cache_length(cache) == len(ctx) + tree.size
            torch.testing.assert_close(got, expected, rtol=0, atol=ATOL)


def test_tree_logits_of_an_empty_tree_without_root_runs_no_forward():
    model, ctx = tiny_model(), context()
    cache, _ = prefill(model, ctx)
    empty = DraftTree.build([], [], "topk", {}, VOCAB)
    assert tree_logits(model, cache, empty, len(ctx)).shape == (0, VOCAB)
    assert cache_length(cache) == len(ctx)
    root_only = tree_logits(model, cache, empty, len(ctx), root_token=5)
    torch.testing.assert_close(root_only[0], plain(model, ctx + [5]), rtol=0, atol=ATOL)


def test_tree_logits_on_an_empty_cache_with_the_root_token():
    model, ctx = tiny_model(), context(1)
    tree = hand_tree()
    cache = DynamicCache()
    got = tree_logits(model, cache, tree, 0, root_token=ctx[0], order=dfs_order(tree))
    expected = [plain(model, ctx)] + [plain(model, ctx + list(tree.path(i))) for i in range(tree.size)]
    torch.testing.assert_close(got, torch.stack(expected), rtol=0, atol=ATOL)


def test_tree_logits_rejects_bad_inputs():
    model, ctx = tiny_model(), context()
    cache, _ = prefill(model, ctx)
    tree = hand_tree()
    with pytest.raises(ValueError, match="past_len"):
        tree_logits(model, cache, tree, len(ctx) - 1)
    with pytest.raises(ValueError, match="tree"):
        tree_logits(model, cache, [0, 1], len(ctx))
    with pytest.raises(ValueError, match="order"):
        tree_logits(model, cache, tree, len(ctx), order=[0, 1, 2])
    with pytest.raises(ValueError, match="root_token"):
        tree_logits(model, cache, tree, len(ctx), root_token=-1)
    too_big = DraftTree.build([-1], [VOCAB + 3], "topk", {}, 2 * VOCAB)
    with pytest.raises(ValueError, match="tokens"):
        tree_logits(model, cache, too_big, len(ctx))
    assert cache_length(cache) == len(ctx)  # nothing was fed


def test_forward_masked_takes_integer_ids_in_the_vocabulary_only():
    model, ctx = tiny_model(), context()
    cache, _ = prefill(model, ctx)
    n = len(ctx)
    allowed = np.ones((1, n + 1), dtype=bool)
    for bad in ([True], [np.bool_(True)], [1.5], [VOCAB], [-1], ["a"], [None]):
        with pytest.raises(ValueError, match="tokens must be integers"):
            forward_masked(model, cache, bad, [n], allowed)
    assert cache_length(cache) == n  # nothing was fed
    for ids in ([3], [np.int64(3)], np.array([3], dtype=np.int32)):  # Python and numpy integers are ids
        logits = forward_masked(model, cache, ids, [n], allowed)
        assert logits.shape == (1, VOCAB)
        trim_cache(cache, n)


@pytest.mark.parametrize("kind", ["dynamic", "static"])
def test_forward_masked_refuses_empty_tokens_and_positions_that_are_not_ids(kind: str):
    """Empty tokens died in the model on the dynamic cache (a reshape error), a position of 5.5 was fed as 5 and
    -3 indexed from the end: each is a ValueError now, on both caches, and nothing is fed."""
    model, ctx = tiny_model(), context()
    cache = DynamicCache() if kind == "dynamic" else StaticTreeCache(model, 64)
    _prefill(model, cache, ctx)
    n = len(ctx)
    with pytest.raises(ValueError, match="tokens must not be empty"):
        forward_masked(model, cache, [], [], np.ones((0, n), dtype=bool))
    for bad, match in (([5.5], "positions must be integers"), ([-3], "positions must be >= 0"),
                       ([[n]], "positions must be 1 integers"), ([n, n], "positions must be 1 integers"),
                       ([True], "positions must be integers"), ([np.nan], "positions must be integers")):
        with pytest.raises(ValueError, match=match):
            forward_masked(model, cache, [3], bad, np.ones((1, n + 1), dtype=bool))
    assert cache_length(cache) == n  # nothing was fed
    assert forward_masked(model, cache, [3], [float(n)], np.ones((1, n + 1), dtype=bool)).shape == (1, VOCAB)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_additive_mask_is_zero_where_allowed_and_dtype_min_elsewhere(dtype):
    """Host-built (float16/32/64) and device-built (bfloat16) masks alike; the min is torch's, never -inf."""
    allowed = np.array([[True, False, False], [True, True, False]])
    mask = additive_mask(allowed, dtype)
    assert mask.shape == (1, 1, 2, 3) and mask.dtype == dtype
    low = torch.finfo(dtype).min
    expected = torch.tensor([[0.0, low, low], [0.0, 0.0, low]], dtype=dtype)
    assert torch.equal(mask[0, 0], expected) and bool(torch.isfinite(mask).all())


def test_additive_mask_refuses_a_mask_that_is_not_2d():
    with pytest.raises(ValueError, match="2-D"):
        additive_mask(np.ones(3, dtype=bool), torch.float32)


# --- the cache keyword ---------------------------------------------------------------------


def test_cache_keyword_follows_the_installed_transformers():
    """5.24 renamed the forward's ``past_key_values`` to ``cache`` (the old name warns); the
    helper reads the name off the signature, so it must agree with the release notes' version."""
    want = "cache" if transformers_version() >= (5, 24) else "past_key_values"
    assert cache_keyword(tiny_model()) == want


def test_cache_keyword_of_other_signatures():
    class Old:
        def forward(self, input_ids, past_key_values=None, use_cache=None): ...

    class New:
        def forward(self, input_ids, cache=None, use_cache=None): ...

    class Both:  # a model that takes both names: keep the long-standing one
        def forward(self, input_ids, past_key_values=None, cache=None): ...

    class Opaque:  # **kwargs only: the long-standing name
        def forward(self, *args, **kwargs): ...

    assert [cache_keyword(cls()) for cls in (Old, New, Both, Opaque)] == [
        "past_key_values", "cache", "past_key_values", "past_key_values"]


def test_the_cache_keyword_fills_the_cache_without_a_warning():
    """With warnings as errors (pyproject), the deprecated name would fail here on 5.24."""
    model, ctx = tiny_model(), context(5)
    cache = DynamicCache()
    with torch.no_grad():
        model(torch.tensor([ctx]), use_cache=True, **{cache_keyword(model): cache})
    assert cache_length(cache) == 5


# --- trim_cache / select_cache ------------------------------------------------------------


def test_crop_with_a_negative_count_removes_that_many_tokens_in_this_version():
    """The one crop convention trim_cache relies on (transformers 4.x and 5.17 to 5.24 agree)."""
    model, ctx = tiny_model(), context()
    cache, _ = prefill(model, ctx)
    cache.crop(-3)
    assert cache_length(cache) == len(ctx) - 3


def test_trim_cache_keeps_the_first_positions_and_only_crops_with_negative_counts(monkeypatch):
    model, ctx = tiny_model(), context(9)
    cache, _ = prefill(model, ctx)
    keys = [layer.keys.clone() for layer in cache.layers]
    calls = []
    crop = cache.crop
    monkeypatch.setattr(cache, "crop", lambda n: (calls.append(n), crop(n))[1])
    assert trim_cache(cache, 9) is cache and calls == []  # already that long
    trim_cache(cache, 4)
    assert calls == [-5] and cache_length(cache) == 4
    for layer, before in zip(cache.layers, keys):
        assert torch.equal(layer.keys, before[..., :4, :])
    with torch.no_grad():  # continuing from the trimmed cache = plain decoding
        out = model(torch.tensor([ctx[4:]]), use_cache=True, **{cache_keyword(model): cache}).logits[0, -1]
    torch.testing.assert_close(out, plain(model, ctx), rtol=0, atol=ATOL)
    trim_cache(cache, 0)
    assert cache_length(cache) == 0


@pytest.mark.parametrize("length", [-1, 10, 2.5])
def test_trim_cache_rejects_bad_lengths(length):
    cache, _ = prefill(tiny_model(), context(9))
    with pytest.raises(ValueError, match="length"):
        trim_cache(cache, length)


@pytest.mark.parametrize("with_root", [False, True])
def test_select_cache_after_a_tree_forward_continues_like_plain_decoding(with_root):
    model, ctx = tiny_model(), context()
    cached = ctx[:-1] if with_root else ctx
    tree = random_tree(12, 3, vocab=VOCAB)
    deepest = max(range(tree.size), key=tree.node_depth)
    first_leaf = next(i for i in range(tree.size) if not tree.children(i))
    cases = [(deepest, None), (deepest, dfs_order(tree)), (first_leaf, bfs_order(tree)), (1, dfs_order(tree))]
    for node, order in cases:
        path = [node]
        while tree.parents[path[0]] != -1:
            path.insert(0, tree.parents[path[0]])
        cache, _ = prefill(model, cached)
        tree_logits(model, cache, tree, len(cached), root_token=ctx[-1] if with_root else None, order=order)
        select_cache(cache, keep_indices(tree, path, len(cached), order, with_root))
        accepted = ctx + list(tree.path(node))
        assert cache_length(cache) == len(accepted)
        reference, _ = prefill(model, accepted)
        for got, ref in zip(cache.layers, reference.layers):
            torch.testing.assert_close(got.keys, ref.keys, rtol=0, atol=ATOL)
            torch.testing.assert_close(got.values, ref.values, rtol=0, atol=ATOL)
        with torch.no_grad():
            out = model(torch.tensor([[17, 4]]), use_cache=True, **{cache_keyword(model): cache}).logits[0]
        torch.testing.assert_close(out[-1], plain(model, accepted + [17, 4]), rtol=0, atol=ATOL)


def test_forward_masked_takes_the_models_where_and_refuses_a_malformed_one():
    model, ctx = tiny_model(), context()
    cache, _ = prefill(model, ctx)
    n = cache_length(cache)
    allowed = np.ones((1, n + 1), dtype=bool)
    looked_up = forward_masked(model, cache, [3], [n], allowed)
    trim_cache(cache, n)
    given = forward_masked(model, cache, [3], [n], allowed, where=(torch.device("cpu"), torch.float32))
    assert torch.equal(looked_up, given)
    trim_cache(cache, n)
    for bad in (("cpu", torch.float32), (torch.device("cpu"),), [torch.device("cpu"), torch.float32]):
        with pytest.raises(ValueError, match=r"where must be None or a \(torch.device, torch.dtype\) pair"):
            forward_masked(model, cache, [3], [n], allowed, where=bad)
    assert cache_length(cache) == n


def test_select_cache_of_a_prefix_is_a_trim_and_works_under_inference_mode():
    model, ctx = tiny_model(), context()
    with torch.inference_mode():
        cache, _ = prefill(model, ctx)
    select_cache(cache, [0, 1, 2])
    assert cache_length(cache) == 3
    select_cache(cache, torch.tensor([0, 2]))  # a gather on inference tensors, outside inference mode
    assert cache_length(cache) == 2


def test_select_cache_of_a_range_trims_like_the_list_and_refuses_one_too_long():
    """``range(n)``, the decode loop's chain case, takes a shortcut to a trim: same cache, same checks."""
    model, ctx = tiny_model(), context()
    by_range, _ = prefill(model, ctx)
    by_list, _ = prefill(model, ctx)
    select_cache(by_range, range(4))
    select_cache(by_list, [0, 1, 2, 3])
    for a, b in zip(by_range.layers, by_list.layers):
        assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)
    with pytest.raises(ValueError, match=r"\[0, 4\)"):
        select_cache(by_range, range(5))
    assert cache_length(by_range) == 4
    select_cache(by_range, range(0))
    assert cache_length(by_range) == 0


@pytest.mark.parametrize(
    "indices, match",
    [([0, 2, 2], "strictly increasing"), ([3, 1], "strictly increasing"), ([0, 7], r"\[0, 7\)"), ([-1, 0], r"\[0, 7\)"),
     ([[0, 1]], "1-D"), ([0.0, 1.0], "1-D")],
)
def test_select_cache_rejects_bad_indices(indices, match):
    cache, _ = prefill(tiny_model(), context())
    with pytest.raises(ValueError, match=match):
        select_cache(cache, indices)
    assert cache_length(cache) == 7


def test_select_cache_refuses_caches_it_cannot_gather():
    cache, _ = prefill(tiny_model(), context())
    with pytest.raises(ValueError, match="DynamicCache"):
        select_cache(object(), [0])
    cache.layers[1] = DynamicSlidingWindowLayer(sliding_window=4)
    with pytest.raises(ValueError, match="DynamicSlidingWindowLayer"):
        select_cache(cache, [0, 1])
    with pytest.raises(ValueError, match="DynamicSlidingWindowLayer"):  # a prefix range as well
        select_cache(cache, range(2))


# --- LLMDraft -----------------------------------------------------------------------------

SAMPLINGS = [Sampling(), Sampling(temperature=0.7, top_k=10, top_p=0.9), Sampling(temperature=0.0)]


def expected_rows(model, ctx, paths, sampling):
    return process_logits(torch.stack([plain(model, ctx + list(p)) for p in paths]), **vars(sampling)).numpy()


@pytest.mark.parametrize("sampling", SAMPLINGS)
@pytest.mark.parametrize("pending", [0, 1, 3])
def test_llm_draft_rows_equal_processed_plain_rows_with_one_forward_per_call(sampling, pending):
    model, ctx = tiny_model(seed=1), context(8, seed=1)
    cache, last = prefill(model, ctx[: len(ctx) - pending])
    kwargs = {"pending": ctx[len(ctx) - pending :]} if pending else {"last_logits": last}
    draft = LLMDraft(model, cache, len(ctx) - pending, sampling=sampling, **kwargs)
    assert isinstance(draft, DraftModel) and draft.vocab == VOCAB and draft.context_len == len(ctx)
    layers = [[()], [(3,), (9,)], [(3, 7), (3, 11), (9, 3)], [(3, 7, 7), (9, 3, 1), (9, 3, 2)]]
    for k, paths in enumerate(layers):
        before = draft.forwards
        got = draft.rows(paths)
        assert got.dtype == np.float64 and got.shape == (len(paths), VOCAB)
        np.testing.assert_allclose(got, expected_rows(model, ctx, paths, sampling), rtol=0, atol=ATOL)
        assert draft.forwards - before == (0 if k == 0 and not pending else 1)
    n_fed = 2 + 3 + 3
    assert cache_length(cache) == len(ctx) + n_fed
    again = draft.rows([(9,), (), (3, 11), (9,)])  # all known: no forward, repeats allowed
    assert draft.forwards == (4 if pending else 3)
    np.testing.assert_allclose(again[0], again[3])
    draft_rows(draft, [(3,), (9, 3)])  # passes the builders' boundary check


def test_llm_draft_prefills_an_empty_cache_from_pending_tokens():
    model, ctx = tiny_model(seed=1), context(8, seed=1)
    draft = LLMDraft(model, DynamicCache(), 0, pending=ctx)
    paths = [(), (3,), (9,)]
    np.testing.assert_allclose(draft.rows(paths), expected_rows(model, ctx, paths, Sampling()), rtol=0, atol=ATOL)
    assert draft.forwards == 1 and cache_length(draft.cache) == len(ctx) + 2


def test_llm_draft_feeds_missing_ancestors_in_the_same_forward():
    model, ctx = tiny_model(seed=1), context(8, seed=1)
    cache, last = prefill(model, ctx)
    draft = LLMDraft(model, cache, len(ctx), last_logits=last)
    paths = [(4, 5, 6), (4, 8), (2,)]
    np.testing.assert_allclose(draft.rows(paths), expected_rows(model, ctx, paths, Sampling()), rtol=0, atol=ATOL)
    assert draft.forwards == 1 and cache_length(cache) == len(ctx) + 5  # (4,), (4,5), (4,5,6), (4,8), (2,)
    assert draft.rows([]).shape == (0, VOCAB) and draft.forwards == 1


def test_llm_draft_takes_paths_as_lists_and_numpy_arrays():
    model, ctx = tiny_model(seed=1), context(8, seed=1)
    cache, last = prefill(model, ctx)
    draft = LLMDraft(model, cache, len(ctx), last_logits=last)
    paths = [np.array([4, 5]), [4], np.array([], dtype=np.int64), (np.int64(4), np.int64(5), 6)]
    want = expected_rows(model, ctx, [(4, 5), (4,), (), (4, 5, 6)], Sampling())
    np.testing.assert_allclose(draft.rows(paths), want, rtol=0, atol=ATOL)
    assert draft.forwards == 1


@pytest.mark.parametrize(
    "emitted, fed, next_pending",
    [((3, 7, 30), 2, (30,)), ((3, 7), 2, ()), ((9, 30, 31), 1, (30, 31)), ((30,), 0, (30,)), ((), 0, ())],
)
def test_llm_draft_end_step_keeps_the_accepted_path_and_the_next_step_continues(emitted, fed, next_pending):
    model, ctx = tiny_model(seed=1), context(8, seed=1)
    cache, _ = prefill(model, ctx[:-1])
    draft = LLMDraft(model, cache, len(ctx) - 1, pending=ctx[-1:])
    draft.rows([()])
    draft.rows([(3,), (9,)])
    draft.rows([(3, 7), (9, 3)])
    nxt = draft.end_step(emitted)
    new_ctx = ctx + list(emitted)
    assert cache_length(cache) == len(ctx) + fed and nxt.past_len == len(ctx) + fed
    assert nxt.pending == next_pending and nxt.context_len == len(new_ctx)
    paths = [(), (5,), (5, 6)]
    np.testing.assert_allclose(nxt.rows(paths), expected_rows(model, new_ctx, paths, Sampling()), rtol=0, atol=ATOL)
    assert nxt.forwards == 1
    with pytest.raises(RuntimeError, match="ended"):
        draft.rows([()])
    with pytest.raises(RuntimeError, match="end_step"):
        draft.end_step(())


def test_llm_draft_end_step_without_any_forward_passes_everything_on():
    model, ctx = tiny_model(seed=1), context(8, seed=1)
    cache, last = prefill(model, ctx)
    draft = LLMDraft(model, cache, len(ctx), last_logits=last)
    draft.rows([()])
    nxt = draft.end_step((12, 13))
    assert nxt.past_len == len(ctx) and nxt.pending == (12, 13) and draft.forwards == 0
    after = nxt.end_step(())  # no forward in this step either: still pending
    assert after.pending == (12, 13)
    np.testing.assert_allclose(
        after.rows([(1,)]), expected_rows(model, ctx + [12, 13], [(1,)], Sampling()), rtol=0, atol=ATOL
    )


def test_llm_draft_decodes_several_steps_like_plain_decoding():
    model, ctx = tiny_model(seed=2), context(5, seed=2)
    cache, last = prefill(model, ctx)
    draft = LLMDraft(model, cache, len(ctx), last_logits=last, sampling=Sampling(temperature=0.0))
    for _ in range(4):  # greedy chain of 3 drafted tokens per step, accept 2, emit a third token
        path: tuple[int, ...] = ()
        for _ in range(3):
            path += (int(np.argmax(draft.rows([path])[0])),)
        emitted = path[:2] + ((path[2] + 1) % VOCAB,)
        draft = draft.end_step(emitted)
        ctx = ctx + list(emitted)
    np.testing.assert_allclose(draft.rows([()]), expected_rows(model, ctx, [()], Sampling(0.0)), rtol=0, atol=ATOL)


def test_llm_draft_rejects_bad_inputs():
    model, ctx = tiny_model(), context()
    cache, last = prefill(model, ctx)
    with pytest.raises(ValueError, match="past_len"):
        LLMDraft(model, cache, len(ctx) + 1, last_logits=last)
    with pytest.raises(ValueError, match="exactly one"):
        LLMDraft(model, cache, len(ctx))
    with pytest.raises(ValueError, match="exactly one"):
        LLMDraft(model, cache, len(ctx), pending=[1], last_logits=last)
    with pytest.raises(ValueError, match="last_logits"):
        LLMDraft(model, cache, len(ctx), last_logits=last[:-1])
    with pytest.raises(ValueError, match="pending"):
        LLMDraft(model, cache, len(ctx), pending=[VOCAB])
    with pytest.raises(ValueError, match="sampling"):
        LLMDraft(model, cache, len(ctx), last_logits=last, sampling={"temperature": 1.0})
    draft = LLMDraft(model, cache, len(ctx), last_logits=last)
    for bad in ([(VOCAB,)], [(1, -2)], ["ab"], [5]):
        with pytest.raises(ValueError, match="paths"):
            draft.rows(bad)
    with pytest.raises(ValueError, match="tokens"):
        draft.end_step([VOCAB + 1])
    assert draft.forwards == 0 and cache_length(cache) == len(ctx)


# --- LLMDraft as a BeamDraft ----------------------------------------------------------------


@pytest.mark.parametrize("sampling", SAMPLINGS)
def test_llm_draft_beam_equals_select_beam_of_its_rows_with_one_forward_per_call(sampling):
    model, ctx = tiny_model(seed=1), context(8, seed=1)
    rng = np.random.default_rng(3)
    layers = [[()], [(3,), (9,), (4,)], [(3, 7), (3, 11), (9, 3), (4, 4)]]
    beam = LLMDraft(model, prefill(model, ctx)[0], len(ctx), last_logits=prefill(model, ctx)[1], sampling=sampling)
    rows = LLMDraft(model, prefill(model, ctx)[0], len(ctx), last_logits=prefill(model, ctx)[1], sampling=sampling)
    assert isinstance(beam, BeamDraft)
    for paths in layers:
        weights = rng.random(len(paths))
        for k in (1, 4, 30, len(paths) * VOCAB + 5):
            before = beam.forwards
            pos, val = beam_candidates(beam, paths, weights, k)
            assert beam.forwards - before <= 1
            want_pos, want_val = select_beam(draft_rows(rows, paths), weights, k)
            np.testing.assert_array_equal(pos, want_pos)
            np.testing.assert_allclose(val, want_val, rtol=1e-14, atol=0)
    assert beam.forwards == rows.forwards == 2


def test_llm_draft_rows_asked_in_another_order_equal_those_of_the_layer_as_fed():
    """The layer just fed is served as one slice of its logits; any other request stacks rows: same values."""
    model, ctx = tiny_model(seed=2), context(8, seed=2)
    cache, last = prefill(model, ctx)
    draft = LLMDraft(model, cache, len(ctx), last_logits=last, sampling=Sampling(1.0))
    layer = [(3,), (9,), (4,)]
    weights = np.array([0.5, 0.3, 0.2])
    pos, val = beam_candidates(draft, layer, weights, 40)  # feeds the layer
    perm = [2, 0, 1]
    pos2, val2 = beam_candidates(draft, [layer[i] for i in perm], weights[perm], 40)  # no forward: stacked rows
    assert draft.forwards == 1
    back = np.array(perm)[pos2 // VOCAB] * VOCAB + pos2 % VOCAB  # positions in the fed order
    order = np.argsort(back)
    np.testing.assert_array_equal(back[order], pos)
    np.testing.assert_array_equal(val2[order], val)
    fresh = LLMDraft(model, prefill(model, ctx)[0], len(ctx), last_logits=last, sampling=Sampling(1.0))
    np.testing.assert_array_equal(draft.rows([layer[1], layer[0]]), fresh.rows(layer)[[1, 0]])  # stacked vs sliced
    assert fresh.forwards == 1


def test_select_beam_torch_equals_select_beam_with_ties_and_zeros():
    """The CUDA path's selection, run here on CPU tensors against the numpy reference."""
    rng = np.random.default_rng(5)
    for _ in range(200):
        n, vocab = int(rng.integers(1, 6)), int(rng.integers(1, 9))
        probs = random_rows(rng, n, vocab)
        weights = rng.choice([0.0, 0.5, 1.0], size=n)
        k = int(rng.integers(1, n * vocab + 2))
        pos, val = select_beam_torch(torch.from_numpy(probs), weights, k)
        want_pos, want_val = select_beam(probs, weights, k)
        assert pos.dtype == np.int64 and val.dtype == np.float64
        np.testing.assert_array_equal(pos, want_pos)
        np.testing.assert_array_equal(val, want_val)


@pytest.mark.parametrize(
    ("probs", "weights", "k", "message"),
    [
        (torch.full((2, 3), 1 / 3, dtype=torch.float64), [1.0], 1, "one number per path"),
        (torch.full((3,), 1 / 3, dtype=torch.float64), [1.0], 1, "2-D"),
        (torch.full((1, 3), 1 / 3, dtype=torch.float64), [-1.0], 1, "finite and >= 0"),
        (torch.full((1, 3), 1 / 3, dtype=torch.float64), [1.0], 0, "k must be >= 1"),
    ],
)
def test_select_beam_torch_refuses_bad_arguments(probs, weights, k, message):
    with pytest.raises(ValueError, match=message):
        select_beam_torch(probs, np.asarray(weights), k)


class _RowsOnly:
    """The same LLM draft seen only through ``rows`` (not a BeamDraft)."""

    def __init__(self, draft: LLMDraft) -> None:
        self.draft = draft

    @property
    def vocab(self) -> int:
        return self.draft.vocab

    def rows(self, paths):
        return self.draft.rows(paths)


def same_trees_as_the_row_path(builder, sampling) -> list[int]:
    """Trees of ``builder`` from an LLM draft (which answers beams and rankings on its side) equal those from
    the same draft seen through ``rows`` only, with the same forwards and no row on the host; their sizes."""
    model, ctx = tiny_model(seed=2), context(6, seed=4)
    sizes = []
    for seed, budget in ((0, 5), (1, 10), (2, 16)):
        drafts = [LLMDraft(model, DynamicCache(), 0, pending=ctx + [seed], sampling=sampling) for _ in range(2)]
        direct = builder.build(drafts[0], budget, seed)
        via_rows = builder.build(_RowsOnly(drafts[1]), budget, seed)
        assert (direct.parents, direct.tokens) == (via_rows.parents, via_rows.tokens)
        assert drafts[0].forwards == drafts[1].forwards and not drafts[0]._rows  # no row reached the host
        sizes.append(direct.size)
    return sizes


@pytest.mark.parametrize("sampling", [Sampling(), Sampling(temperature=0.0), Sampling(temperature=0.8, top_k=7)])
def test_wetap_trees_from_an_llm_draft_equal_the_row_path(sampling):
    same_trees_as_the_row_path(WetapBuilder(length=4, w_min=3, w_max=12), sampling)


# --- LLMDraft as a TopDraft (DynaTree's question) ------------------------------------------


@pytest.mark.parametrize("sampling", SAMPLINGS)
def test_llm_draft_top_equals_select_top_of_its_rows_with_one_forward_per_call(sampling):
    model, ctx = tiny_model(seed=1), context(8, seed=1)
    layers = [[()], [(3,), (9,), (4,)], [(3, 7), (3, 11), (9, 3), (4, 4)]]
    top = LLMDraft(model, prefill(model, ctx)[0], len(ctx), last_logits=prefill(model, ctx)[1], sampling=sampling)
    rows = LLMDraft(model, prefill(model, ctx)[0], len(ctx), last_logits=prefill(model, ctx)[1], sampling=sampling)
    assert isinstance(top, TopDraft)
    for paths in layers:
        for k in (1, 3, 12, VOCAB + 5):
            before = top.forwards
            tokens, values = top_candidates(top, paths, k)
            assert top.forwards - before <= 1
            want_tokens, want_values = select_top(draft_rows(rows, paths), k)
            np.testing.assert_array_equal(tokens, want_tokens)
            np.testing.assert_allclose(values, want_values, rtol=1e-14, atol=0)
    assert top.forwards == rows.forwards == 2 and not top._rows  # no row reached the host


def test_select_top_torch_equals_select_top_with_ties_and_zeros():
    """The CUDA path's ranking, run here on CPU tensors against the numpy reference."""
    rng = np.random.default_rng(6)
    for _ in range(200):
        n, vocab = int(rng.integers(1, 6)), int(rng.integers(1, 9))
        probs = random_rows(rng, n, vocab)
        k = int(rng.integers(1, vocab + 3))
        tokens, values = select_top_torch(torch.from_numpy(probs), k)
        want_tokens, want_values = select_top(probs, k)
        assert tokens.dtype == np.int64 and values.dtype == np.float64
        np.testing.assert_array_equal(tokens, want_tokens)
        np.testing.assert_array_equal(values, want_values)
    empty = select_top_torch(torch.zeros(0, 4, dtype=torch.float64), 2)
    assert empty[0].shape == empty[1].shape == (0, 2)


@pytest.mark.parametrize(
    ("probs", "k", "message"),
    [(torch.full((3,), 1 / 3, dtype=torch.float64), 1, "2-D"), (torch.full((1, 3), 1 / 3, dtype=torch.float64), 0, "k must be >= 1")],
)
def test_select_top_torch_refuses_bad_arguments(probs, k, message):
    with pytest.raises(ValueError, match=message):
        select_top_torch(probs, k)


@pytest.mark.parametrize("sampling", [Sampling(), Sampling(temperature=0.0), Sampling(temperature=0.3, top_k=7)])
def test_dynatree_trees_from_an_llm_draft_equal_the_row_path(sampling):
    # thresholds low enough for the random model's flat rows to grow trees of several layers and widths
    builder = DynaTreeBuilder(base_depth=3.0, max_depth=5, b_min=1, b_mid=2, b_max=3, tau_high=0.3, tau_low=0.1,
                              rho_stop=1e-6, rho_deep=1e-5, prune=0.0)
    sizes = same_trees_as_the_row_path(builder, sampling)
    # full trees (at temperature 0 one-hot rows make a chain of max_depth): the comparison covers every layer
    assert sizes == ([5, 5, 5] if sampling.greedy else [5, 10, 16])


def test_fit_vocabulary_reads_its_logits_every_call_and_the_layouts_are_cached():
    """``fit_vocabulary`` is a pure function of the logits' current values: a static cache's graph writes its
    logits into the same tensor every replay, so a cache keyed by the tensor would hand back the first
    replay's rows (a decorator once slid onto it from ``_tree_layout``, whose layouts are cached)."""
    from spec.llm.adapter import _tree_layout, fit_vocabulary

    logits = torch.zeros(2, 3)
    wide, cut, same = fit_vocabulary(logits, 5), fit_vocabulary(logits, 2), fit_vocabulary(logits, 3)
    assert wide.shape == (2, 5) and torch.isinf(wide[:, 3:]).all() and cut.shape == (2, 2) and same is logits
    logits.fill_(1.0)  # as a graph replay writes its output buffer
    assert fit_vocabulary(logits, 5)[:, :3].eq(1.0).all() and fit_vocabulary(logits, 2).eq(1.0).all()
    assert not hasattr(fit_vocabulary, "cache_info")
    before = _tree_layout.cache_info().hits
    _tree_layout((-1, -1, 0))
    _tree_layout((-1, -1, 0))
    assert _tree_layout.cache_info().hits >= before + 1
