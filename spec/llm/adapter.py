"""Hugging Face causal LMs as tree draft and tree target: masks, positions, KV cache (DESIGN.md §8).

One verification forward pass feeds the whole flattened token tree
(:mod:`spec.tree`) after the cached past, with

* a **4D additive mask** ``(1, 1, n, past + n)``: ``0`` where a node may
  attend (the past, its ancestors, itself), the dtype's minimum elsewhere.
  transformers 5.17 to 5.24 hand a 4D mask to the attention kernel as given
  (``masking_utils._preprocess_mask_arguments`` returns early); ``sdpa``
  takes a bool or an additive mask, ``eager`` *adds* the mask to the scores,
  so a bool mask would be silently wrong there: the additive form is the one
  that is right for both (and for transformers 4.x, which expected it);
* **explicit position ids** ``past + depth``, so a node's rotary phase is the
  one plain decoding of its path would use;
* for a model with a **sliding window** (:func:`~spec.llm.windows.attention_window`:
  Mistral, Gemma 2 and 3, Qwen2, GPT-OSS, ...), the window its own decoding
  applies: a node at position ``p`` sees positions ``> p - window`` only
  (:func:`~spec.llm.windows.windowed`), in every layer or, for a model that
  takes its masks by layer kind, in its ``sliding_attention`` layers (the mask
  is then passed as the dict ``{"full_attention": ..., "sliding_attention": ...}``
  those models read).  The dynamic cache keeps every position (its layers are
  plain ``DynamicLayer``), and so does the static cache, so nothing the window
  may need again is dropped; :func:`forward_unchecked` cuts the mask for both;
* for Llama 4, its attention chunks the same way on the dynamic cache
  (:func:`~spec.llm.windows.attention_chunks`: its ``chunked_attention`` layers get
  the mask cut to each node's chunk), while the decode loop caps each step's tree
  where its query temperature tuning reads the cache slot
  (:func:`~spec.llm.windows.exact_tree_nodes`).

Each node then sees exactly what plain decoding of its path sees, so its
logits equal that decoding's (tests: ``atol = 1e-5``, float32).

KV cache after a step (DESIGN.md §8: "gather or rebuild, whichever is correct
for the cache class in use").  After the forward the ``DynamicCache`` holds
past + the whole flattened tree; :func:`select_cache` keeps the past and the
accepted path by **gathering** each layer's keys/values along the sequence
axis.  For ``DynamicCache`` with full-attention ``DynamicLayer`` layers this
is exact in transformers 5.17 to 5.24: a layer's state is just its ``keys``
and ``values`` tensors ``(B, H, S, D)`` (``get_seq_length`` reads ``S``,
``update`` concatenates), the accepted nodes' entries were computed with the
same attention set and positions as plain decoding, and RoPE is baked into
the keys, so moving an entry to another slot changes nothing.  It saves the
second forward that crop-and-refill (crop to the past, re-feed the accepted
tokens) would cost.  Other layer kinds (sliding window, quantised, static,
linear-attention) keep extra state that a gather would desynchronise, so
:func:`select_cache` refuses them with ``ValueError``; callers may fall back
to :func:`trim_cache` + refeed there.  A
:class:`~spec.llm.static_cache.StaticTreeCache` (fixed buffers written at
explicit slots, CUDA graphs) goes through the same three functions:
:func:`forward_masked` runs its forward, :func:`select_cache` and
:func:`trim_cache` move or drop its slots.

``DynamicCache.crop`` changed meaning: 5.17 treats ``crop(n > 0)`` as
"keep the first ``n``" (deprecated) and ``crop(-m)`` as "remove the last
``m``"; 5.23 and 5.24 raise for ``n > 0`` and keep ``crop(-m)``.  :func:`trim_cache`
only ever calls ``crop`` with a negative count, which all of them (and 4.x) read
the same way, and checks the resulting length.

5.24 renamed the forward's cache argument from ``past_key_values`` to ``cache``
(the old name still works but warns); every forward here passes the cache under
:func:`~spec.llm.static_cache.cache_keyword`, the name the model's signature has.

:class:`LLMDraft` implements :class:`spec.draft.DraftModel` over a draft LM
for one decode step, feeding each ``rows`` call's new nodes in one forward.
It is also a :class:`spec.draft.BeamDraft`: a beam builder (WETAP) asks it
for a layer's best continuations, selected where the logits are
(:func:`select_beam_torch` on CUDA), so ``width × V`` rows never cross to
the host.  A chain builder need not cross at all: :meth:`LLMDraft.draft_chain`
draws a whole chain on the device (the inverse-CDF rule of the host builders,
with the same uniforms), and the decode loop waits for the device a fixed
number of times per step (three) instead of once per drafted token.
:meth:`LLMDraft.draft_tree` does the same for any tree whose shape is fixed
before the draws (a fixed i.i.d. tree, or a fixed top-k tree on rows with
full support), one forward per layer.
Notation: ``p`` target, ``q`` draft (DESIGN.md §3).
"""

from __future__ import annotations

import contextlib
import functools
import numbers
import time
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import torch
from numpy.typing import NDArray
from transformers.cache_utils import DynamicCache, DynamicLayer

from spec.builders.base import check_prob
from spec.draft import check_beam_args, select_beam, select_top
from spec.llm.sampling import Sampling, categorical_draw, logits_fault, logits_of, ranked_tokens, swor_draws
from spec.llm.static_cache import StaticTreeCache, cache_keyword, offset_positions
from spec.llm.static_cache import model_device as _device
from spec.llm.static_cache import model_dtype as _dtype
from spec.llm.windows import (
    AttentionWindow, attention_chunks, attention_window, chunked, exact_tree_nodes, query_scale_floor, windowed,
)
from spec.tree import attention_mask, check_order, position_ids
from tmc.multidraft import ROOT, DraftTree, Path
from tmc.validate import check_int

FloatArray = NDArray[np.float64]
BoolArray = NDArray[np.bool_]
IntArray = NDArray[np.int64]

__all__ = [
    "DeviceChain",
    "DeviceTree",
    "LLMDraft",
    "AttentionWindow",
    "additive_mask",
    "attention_chunks",
    "attention_window",
    "cache_length",
    "check_attention",
    "check_positions",
    "check_span",
    "chunked",
    "exact_tree_nodes",
    "forward_masked",
    "forward_unchecked",
    "full_attention_span",
    "learned_positions",
    "offset_positions",
    "query_scale_floor",
    "rope_switches",
    "select_beam_torch",
    "select_cache",
    "select_top_torch",
    "sync",
    "tree_logits",
    "trim_cache",
    "windowed",
]


#: The attention implementations that apply a custom 4D mask as given (DESIGN.md §8).
MASKED_ATTENTION = ("sdpa", "eager")


def _alibi(config: Any) -> bool:
    """Whether a config's model adds ALiBi biases (BLOOM always; Falcon and MPT when their config says so)."""
    if getattr(config, "model_type", None) == "bloom" or getattr(config, "alibi", False) is True:
        return True
    attn = getattr(config, "attn_config", None)  # MPT: an attention sub-config (a dict in older releases)
    return bool(attn.get("alibi", False) if isinstance(attn, dict) else getattr(attn, "alibi", False))


def _slot_alibi(config: Any) -> bool:
    """Whether a model's ALiBi biases follow its keys' cache slots (MPT): right for a chain, whose slots are its
    positions, wrong for a branching tree, whose siblings share a position but not a slot."""
    return getattr(config, "model_type", None) == "mpt" and _alibi(config)


def check_attention(model: Any, name: str, *, trees: bool = True) -> None:
    """``ValueError`` unless ``model`` attends with an implementation that takes the tree's 4D mask,
    and numbers its positions from 0 (:func:`offset_positions`).

    Tree forwards pass an additive ``(1, 1, n, past + n)`` mask; ``sdpa`` and ``eager`` apply it as
    given.  Flash-attention kernels take no arbitrary mask, and with ``flex_attention`` tree forwards
    failed here (transformers 5.24, torch 2.13 CPU: NaN logits, an index error in the compiled kernel,
    a crash of the process), so every other implementation is refused before any forward.  A model
    whose config names no implementation (a stand-in) passes.  Models with ALiBi biases: BLOOM and
    Falcon with ``alibi`` failed on the 4D mask (tiny random ones) and are refused.  MPT adds its biases
    by cache slot: a chain's node logits match its own decoding, a branching tree's were off by 0.04.  So
    MPT is refused only where ``trees`` (its rows must be its own decoding's on branching trees: a target
    whose builder may branch); ``trees=False`` is for a target fed chains only, or for a draft, whose rows
    need only be the law its tokens were drawn from.
    """
    config = getattr(model, "config", None)
    impl = getattr(config, "_attn_implementation", None)
    if impl is not None and impl not in MASKED_ATTENTION:
        raise ValueError(
            f"{name} attends with attn_implementation={impl!r}, which does not take the tree's 4D attention mask; "
            f"load it with attn_implementation='sdpa' (or 'eager'), or call {name}.set_attn_implementation('sdpa')"
        )
    pad = offset_positions(model)
    if pad is not None:
        raise ValueError(
            f"{name} numbers its positions from padding_idx + 1 = {pad + 1} (RoBERTa-style position embeddings), "
            f"while the tree pass feeds position ids from 0: its node logits would not be its own decoding's; "
            f"use a model with rotary or 0-based learned positions"
        )
    if config is None or not _alibi(config):
        return
    if not _slot_alibi(config):
        raise ValueError(
            f"{name} adds ALiBi position biases, which the tree pass cannot give it: BLOOM and Falcon build them from "
            f"a 2D padding mask and take no 4D tree mask; use a model with rotary or learned positions"
        )
    if trees:
        raise ValueError(
            f"{name} adds ALiBi position biases by cache slot (MPT), which a branching tree's nodes overrun (its node "
            f"logits then differ from its own decoding): decode it with builder='chain' (a chain's slots are its "
            f"positions), or use a model with rotary or learned positions"
        )


#: Layer kinds of ``config.layer_types`` that attend through the mask (a window or chunks limit how far).
_ATTENTION_LAYERS = ("full_attention", "sliding_attention", "chunked_attention")


def _span_limits(config: Any, *, chunks_applied: bool = False, steps_capped: bool = False,
                 switches_handled: bool = False) -> list[tuple[int, str]]:
    """The position limits (with their reasons) up to which the tree pass reproduces the model's own decoding.

    ``chunks_applied``: the forwards cut their masks to the model's attention chunks (:func:`attention_chunks`),
    so chunks limit nothing; ``steps_capped``: the decode loop caps each step's tree at :func:`exact_tree_nodes`,
    so the query temperature tuning limits nothing; ``switches_handled``: the decode loop cuts each step's tree
    before a ``longrope`` switch and recomputes the cache past it (:func:`rope_switches`), so those limit nothing.
    """
    kinds = set(getattr(config, "layer_types", None) or [])
    other = sorted(kinds - set(_ATTENTION_LAYERS))
    if other:
        raise ValueError(f"the model has layers of kind {other}; tree verification needs attention layers "
                         f"({', '.join(_ATTENTION_LAYERS)})")
    limits: list[tuple[int, str]] = []
    chunk = getattr(config, "attention_chunk_size", None)
    if chunk and (not kinds or "chunked_attention" in kinds) and not chunks_applied:
        limits.append((int(chunk), f"it attends within attention chunks of {int(chunk)} positions, which the tree "
                                   "mask does not apply to this model's code"))
    # GPT-Neo's local layers close keys by cache slot (a buffer of window_size bands), not by position, and a
    # tree node's slot lies past its position: the two agree only while every slot is below window_size
    window = getattr(config, "window_size", None)
    if window and "local" in (getattr(config, "attention_layers", None) or []):
        limits.append((int(window), f"its local attention layers window by cache slot (window_size = {int(window)}), "
                                    "which a tree's cache slots overrun"))
    limits += [(top, why) for top, why, kind in _rope_limits(config) if not (switches_handled and kind == "longrope")]
    floor = query_scale_floor(config)
    if floor is not None and not steps_capped:
        limits.append((floor - 1, f"its layers without rotary embeddings scale queries by the cache length in "
                                  f"steps of floor_scale = {floor}, which a tree's cache slots overrun"))
    return limits


def _rope_limits(config: Any) -> list[tuple[int, str, str]]:
    """Limits from rotary embeddings whose frequencies follow the forward's largest position id (transformers'
    ``dynamic_rope_update``): one tree forward would give every node its deepest node's frequencies, where a
    node's own decoding uses its own.  ``dynamic`` (NTK) rescales past ``max_position_embeddings``; ``longrope``
    (Phi-3 128k, Phi-4-mini) switches to its long factors past ``original_max_position_embeddings``.  Below those
    the frequencies never change, so the tree pass is exact there (a tiny Phi-3: 6e-4 off across the switch).
    Each limit comes with its reason and its rope type."""
    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None)
    if not isinstance(params, dict):
        return []
    by_kind = "rope_type" not in params and "type" not in params  # per layer kind (Gemma 3 and the like)
    entries = [v for v in params.values() if isinstance(v, dict)] if by_kind else [params]
    limits: list[tuple[int, str, str]] = []
    for entry in entries:
        kind = str(entry.get("rope_type", entry.get("type", "default")))
        if "dynamic" in kind:
            top = getattr(config, "max_position_embeddings", None)
            why = f"its {kind!r} rotary embeddings rescale past max_position_embeddings = {top}"
        elif kind == "longrope":
            top = entry.get("original_max_position_embeddings") or getattr(config, "original_max_position_embeddings", None)
            why = f"its 'longrope' rotary embeddings switch factors past original_max_position_embeddings = {top}"
        else:
            continue
        if top:
            limits.append((int(top), why + ", by the largest position of a forward, which a tree's deepest node sets",
                           "longrope" if kind == "longrope" else "dynamic"))
    return limits


def rope_switches(config: Any) -> tuple[int, ...]:
    """The positions ``s`` (sorted, distinct) at which a ``longrope`` model's rotary embeddings change factors:
    ``original_max_position_embeddings`` (Phi-3 128k, Phi-3.5, Phi-4-mini: 4096), ``()`` for other models.

    transformers picks the factors of a forward from its largest position id: the short ones while it is below
    ``s``, the long ones for every token of a forward that reaches position ``s`` or past it.  Phi-3's own
    ``generate`` drops its cache once the sequence passes ``s`` tokens and recomputes it with the long factors
    (from transformers 5.20; 5.17-5.19 drop it but feed only the newest token there, with no context),
    so the law of the token after a context of ``L`` tokens is that of one forward over the whole context:
    short factors for ``L <= s``, long ones for ``L > s``.  :func:`spec.llm.generate.generate` keeps that law:
    no step's tree passes from below ``s`` to ``s`` (the step whose root sits at ``s - 1`` has none: a root-only
    step), and the cache is recomputed in one forward when the root first reaches ``s``."""
    return tuple(sorted({top for top, _, kind in _rope_limits(config) if kind == "longrope"}))


def full_attention_span(config: Any) -> int | None:
    """How many positions (prompt, new tokens and a step's tree) the tree pass reproduces a model with this
    config over, from the config alone: ``None`` for no limit.  Sliding windows are applied
    (:func:`attention_window`), so they do not limit it; attention chunks (Llama 4) and Llama 4's query
    temperature tuning (``attn_temperature_tuning``: from ``floor_scale - 1`` positions on) do here, while
    :func:`check_span`, which sees the model and the cache, lifts them where they are taken care of.
    ``ValueError`` for layer kinds that are not attention (``layer_types`` naming linear attention,
    state-space layers and the like).
    """
    limits = _span_limits(config)
    return min(limits)[0] if limits else None


#: Module names of learned absolute position tables: GPT-2's and GPTBigCode's ``wpe``, OPT's ``embed_positions``
#: (an embedding with an ``offset`` of 2), and the ``position_embeddings`` of other families.
_POSITION_TABLES = ("wpe", "embed_positions", "position_embeddings")


def learned_positions(model: Any) -> int | None:
    """How many positions ``model``'s absolute position table holds (positions ``0 .. n - 1``), or ``None``
    when it has none (rotary computed on the fly, ALiBi or no positions: nothing then stops a position from
    being fed).  A learned table is an embedding module; GPT-J's and CodeGen's fixed sinusoid tables are
    buffers named ``embed_positions`` (``(n_positions, rotary_dim)``), indexed by the position ids."""
    modules = getattr(model, "named_modules", None)
    for name, module in modules() if modules is not None else ():
        if isinstance(module, torch.nn.Embedding) and name.rsplit(".", 1)[-1] in _POSITION_TABLES:
            return int(module.num_embeddings) - int(getattr(module, "offset", 0))
    buffers = getattr(model, "named_buffers", None)
    for name, buffer in buffers() if buffers is not None else ():
        if name.rsplit(".", 1)[-1] == "embed_positions" and buffer.ndim == 2:
            return int(buffer.shape[0])
    return None


def check_positions(model: Any, name: str, positions: int, *, speculative: bool = False) -> int | None:
    """``ValueError`` if a decode that feeds ``model`` its first ``positions`` positions (``0 .. positions - 1``)
    runs past its learned position table (:func:`learned_positions`), which would fail deep in its forward
    with an index error.  Plain decoding feeds prompt + ``max_new_tokens`` - 1 positions.  A tree step feeds
    its nodes at ``root position + depth``; :func:`spec.llm.generate.generate` cuts the trees of its last steps
    to the positions left, so a ``speculative`` decode (the message says so) needs one position more than plain
    decoding: its last step's root and one node.  Returns the table's length (``None``: no table)."""
    table = learned_positions(model)
    if table is not None and positions > table:
        need = "prompt + max_new_tokens: the last step's root and one node" if speculative else \
            "prompt + max_new_tokens - 1"
        raise ValueError(
            f"{name} has position embeddings for {table} positions, and this decode may feed it "
            f"{positions} ({need}): shorten the prompt or max_new_tokens"
        )
    return table


def check_span(model: Any, name: str, positions: int, *, steps_capped: bool = False,
               switches_handled: bool = False) -> None:
    """``ValueError`` unless the tree pass gives ``model`` the attention of its own decoding over its first
    ``positions`` positions.

    The limits of :func:`full_attention_span`, less those the decode takes care of: attention chunks where the
    forwards apply them (:func:`attention_chunks`: Llama 4's code), and the query temperature tuning when
    ``steps_capped`` (the decode loop caps each step's tree at :func:`exact_tree_nodes`, as
    :func:`spec.llm.generate.generate` does), and ``longrope``'s switches when ``switches_handled`` (the decode
    loop cuts trees before them and recomputes the cache past them, :func:`rope_switches`, as ``generate``
    does).  Beyond a remaining limit a model's tree
    rows would differ from its own decoding and the output law would not be the target's (a tiny Llama 4 with
    chunks of 6 and the chunks not applied: node logits off by 0.16 past the chunk).  Within it the two agree,
    so a decode that stays inside it is allowed.
    """
    cfg = getattr(model, "config", None)
    limits = [] if cfg is None else _span_limits(cfg, chunks_applied=attention_chunks(model) is not None,
                                                 steps_capped=steps_capped, switches_handled=switches_handled)
    span, why = min(limits) if limits else (None, "")
    if span is not None and positions > span:
        raise ValueError(
            f"the tree pass reproduces {name}'s own decoding over {span} positions only ({why}), and this decode "
            f"may reach {positions} (prompt + max_new_tokens - 1 + budget): shorten the decode"
        )


def sync(device: torch.device) -> None:
    """Wait for the device's queued work (a no-op off CUDA): timers then measure the work itself."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# --- KV cache ---------------------------------------------------------------------------


def cache_length(cache: Any) -> int:
    """Number of positions a transformers cache holds (``get_seq_length``)."""
    if cache is None or not hasattr(cache, "get_seq_length"):
        raise ValueError(f"cache must be a transformers Cache, got {type(cache).__name__}")
    return int(cache.get_seq_length())


def trim_cache(cache: Any, length: int) -> Any:
    """Keep the first ``length`` positions of ``cache`` (in place; returns it).

    ``crop`` is called only with a negative count (remove that many), the one
    reading transformers 4.x and 5.17 to 5.24 share.
    """
    length = check_int("length", length, minimum=0)
    have = cache_length(cache)
    if length > have:
        raise ValueError(f"length {length} exceeds the {have} positions the cache holds")
    if isinstance(cache, StaticTreeCache):
        cache.trim(length)
        return cache
    if length < have:
        cache.crop(length - have)
    got = cache_length(cache)
    if got != length:  # a transformers version with yet another crop convention
        raise RuntimeError(f"cache.crop({length - have}) left {got} positions, expected {length}")
    return cache


def _dynamic_layers(cache: Any) -> list[DynamicLayer]:
    """The layers of a ``DynamicCache`` whose state is only ``keys``/``values`` (else ``ValueError``)."""
    if not isinstance(cache, DynamicCache) or not hasattr(cache, "layers"):
        raise ValueError(
            f"cache must be a transformers>=5 DynamicCache (with .layers), got {type(cache).__name__}"
        )
    layers: list[DynamicLayer] = []
    for i, layer in enumerate(cache.layers):
        # exact type: subclasses (sliding window, indexed, quantised) keep state a gather would break
        if type(layer) is not DynamicLayer or not isinstance(layer, DynamicLayer):
            raise ValueError(
                f"cache layer {i} is a {type(layer).__name__}; only full-attention DynamicLayer caches can be gathered"
            )
        layers.append(layer)
    return layers


def select_cache(cache: Any, indices: Sequence[int] | NDArray[np.integer[Any]] | torch.Tensor) -> Any:
    """Keep only sequence positions ``indices`` (strictly increasing) of a ``DynamicCache`` or
    :class:`~spec.llm.static_cache.StaticTreeCache`, in place.

    Typically ``spec.tree.keep_indices(...)``: the past, then the accepted
    path's flattened positions.  A leading run ``0, 1, ..., m-1`` is kept as
    a slice; the rest is gathered with ``index_select`` on the sequence axis
    (dim ``-2`` of each layer's ``(B, H, S, D)`` keys and values).
    """
    head = indices if isinstance(indices, range) and indices.start == 0 and indices.step == 1 else None
    if isinstance(cache, StaticTreeCache):
        if head is not None:  # the decode loop's chain steps: a trim, with no index array
            cache.trim(_prefix_length(head, cache.length))
        else:
            cache.select(_index_array(indices, cache.length))
        return cache
    layers = _dynamic_layers(cache)
    if head is not None:
        return trim_cache(cache, _prefix_length(head, cache_length(cache)))
    have = cache_length(cache)
    idx = _index_array(indices, have)
    moved = np.flatnonzero(idx != np.arange(len(idx)))
    prefix = int(moved[0]) if moved.size else len(idx)  # positions that stay where they are
    if prefix == len(idx):
        return trim_cache(cache, prefix)
    tail = torch.as_tensor(idx[prefix:], dtype=torch.long)
    for layer in layers:
        keys, values = layer.keys, layer.values  # (B, H, S, D)
        if keys is None or values is None or keys.numel() == 0:  # uninitialised layer (KV sharing)
            continue
        at = tail.to(keys.device)
        # torch.cat, not an in-place write: inference-mode tensors reject in-place updates
        layer.keys = torch.cat([keys[..., :prefix, :], keys.index_select(-2, at)], dim=-2)
        layer.values = torch.cat([values[..., :prefix, :], values.index_select(-2, at)], dim=-2)
    assert cache_length(cache) == len(idx)
    return cache


def fit_vocabulary(logits: torch.Tensor, vocab: int) -> torch.Tensor:
    """A draft's logits ``(..., V_draft)`` on the decode vocabulary of ``vocab`` ids: cut to it, or widened
    with ``-inf`` (ids the draft lacks are never drawn)."""
    extra = vocab - logits.shape[-1]
    if extra == 0:
        return logits
    if extra < 0:
        return logits[..., :vocab]
    pad = torch.full((*logits.shape[:-1], extra), -torch.inf, dtype=logits.dtype, device=logits.device)
    return torch.cat([logits, pad], dim=-1)


@functools.lru_cache(maxsize=128)
def _tree_layout(parents: tuple[int, ...]) -> tuple[tuple[tuple[int, ...], ...], tuple[int, ...]]:
    """The layers of a breadth-first tree shape (its nodes, by depth) and each node's count of earlier
    siblings; ``ValueError`` for an empty or malformed shape.  Cached: the decode loop drafts the same
    few shapes (a budget's chain, a fixed tree) every step.
    """
    if not parents:
        raise ValueError("parents must describe at least one node")
    depth: list[int] = []
    layers: list[list[int]] = []
    rank: list[int] = []
    siblings: dict[int, int] = {}
    for i, p in enumerate(parents):
        if p < ROOT:
            raise ValueError(f"parents[{i}] must be >= -1, got {p}")
        if p >= i:
            raise ValueError(f"parents[{i}] = {p}; a parent must be -1 (root) or an earlier node")
        depth.append(1 if p == ROOT else depth[p] + 1)
        if i and depth[i] < depth[i - 1]:
            raise ValueError(f"parents must number the nodes breadth first; node {i} is shallower than node {i - 1}")
        if depth[i] > len(layers):
            layers.append([])
        layers[-1].append(i)
        rank.append(siblings.get(p, 0))
        siblings[p] = rank[-1] + 1
    return tuple(tuple(layer) for layer in layers), tuple(rank)


def _prefix_length(indices: range, have: int) -> int:
    """Length of ``range(n)`` given as indices, refused as :func:`_index_array` refuses it when ``n > have``."""
    if len(indices) > have:
        raise ValueError(f"indices must lie in [0, {have}) (the cache length), got {indices}")
    return len(indices)


def _index_array(indices: object, have: int) -> NDArray[np.int64]:
    if isinstance(indices, torch.Tensor):
        indices = indices.detach().cpu().numpy()
    arr = np.asarray(indices)
    if arr.ndim != 1 or (arr.size and not np.issubdtype(arr.dtype, np.integer)):
        raise ValueError(f"indices must be a 1-D sequence of integers, got {indices!r}")
    arr = arr.astype(np.int64)
    if arr.size and (arr[0] < 0 or arr[-1] >= have):
        raise ValueError(f"indices must lie in [0, {have}) (the cache length), got {arr.tolist()}")
    if (np.diff(arr) <= 0).any():
        raise ValueError(f"indices must be strictly increasing, got {arr.tolist()}")
    return arr


# --- one masked forward -----------------------------------------------------------------


def _vocab(model: Any) -> int:
    return int(model.config.vocab_size)


#: Model dtypes numpy holds exactly, with the same smallest finite value: their masks are built on the host.
_NUMPY_DTYPES: dict[torch.dtype, type[np.floating[Any]]] = {
    torch.float16: np.float16, torch.float32: np.float32, torch.float64: np.float64}


def additive_mask(allowed: BoolArray, dtype: torch.dtype, device: torch.device | str = "cpu") -> torch.Tensor:
    """``(1, 1, n, kv)`` float mask from an ``(n, kv)`` bool mask: 0 where allowed, the dtype's min elsewhere.

    On the CPU, float16/32/64 masks come from one numpy ``where`` (this runs
    before every forward of the decode loop, where torch's four small
    operations cost more); others (bfloat16, any dtype on a GPU) from
    ``masked_fill`` on the device.
    """
    allowed = np.asarray(allowed, dtype=bool)
    if allowed.ndim != 2:
        raise ValueError(f"allowed must be a 2-D (n, kv) bool mask, got shape {allowed.shape}")
    host = _NUMPY_DTYPES.get(dtype)
    if host is not None and torch.device(device).type == "cpu":
        return torch.from_numpy(np.where(allowed, host(0), host(np.finfo(host).min)))[None, None]
    allowed_t = torch.as_tensor(allowed, device=device)
    masked = torch.zeros(allowed_t.shape, dtype=dtype, device=device)
    return masked.masked_fill_(~allowed_t, torch.finfo(dtype).min)[None, None]


def _token_ids(tokens: Sequence[int], vocab: int) -> list[int]:
    """``tokens`` as Python ints, each checked to be an integer (not a bool) in ``[0, vocab)``.

    Python ints, the decode loop's case, are checked with one ``min`` and one
    ``max`` instead of a per-token abstract-class test (a few microseconds a
    token, which adds up over a 128-node layer).
    """
    ids = list(tokens)
    if all(type(t) is int for t in ids):
        if ids and not (0 <= min(ids) and max(ids) < vocab):
            raise ValueError(f"tokens must be integers in [0, {vocab}), got {ids[:16]}")
        return ids
    if any(isinstance(t, bool | np.bool_) or not isinstance(t, numbers.Integral) or not 0 <= int(t) < vocab for t in ids):
        raise ValueError(f"tokens must be integers in [0, {vocab}), got {ids[:16]}")
    return [int(t) for t in ids]


def forward_masked(
    model: Any, cache: Any, tokens: Sequence[int], positions: Sequence[int] | NDArray[np.int64], allowed: BoolArray,
    *, where: tuple[torch.device, torch.dtype] | None = None,
) -> torch.Tensor:
    """Feed ``tokens`` after the cached positions in one forward; return their logits ``(n, V)``.

    ``positions`` are the rotary/absolute position ids and ``allowed`` the
    ``(n, cache_length + n)`` bool attention mask (True = may attend).  The
    cache grows by ``n`` positions, in the order of ``tokens``.  ``where``:
    as in :func:`forward_unchecked`.
    """
    n, have, vocab = len(tokens), cache_length(cache), _vocab(model)
    if n == 0:
        raise ValueError("tokens must not be empty")
    allowed = np.asarray(allowed, dtype=bool)
    if allowed.shape != (n, have + n):
        raise ValueError(f"allowed has shape {allowed.shape}; expected ({n}, {have + n}) for {n} tokens after {have}")
    positions = _position_ids(positions, n)
    if where is not None and not (isinstance(where, tuple) and len(where) == 2 and isinstance(where[0], torch.device)
                                  and isinstance(where[1], torch.dtype)):
        raise ValueError(f"where must be None or a (torch.device, torch.dtype) pair, got {where!r}")
    return forward_unchecked(model, cache, _token_ids(tokens, vocab), positions, allowed, where=where)


def _position_ids(positions: object, n: int) -> NDArray[np.int64]:
    """``positions`` as ``n`` int64 ids ``>= 0``: ``ValueError`` for another length or shape, booleans, fractions
    (5.5 was fed as 5) and negative ids (a learned table would be indexed from its end)."""
    arr = np.asarray(positions)
    if arr.shape != (n,):
        raise ValueError(f"positions must be {n} integers, one per token, got shape {arr.shape}")
    if arr.dtype.kind not in "iuf" or (arr.dtype.kind == "f" and not (np.isfinite(arr).all() and (arr == np.round(arr)).all())):
        raise ValueError(f"positions must be integers, got {arr[:16].tolist()}")
    if (arr < 0).any():
        raise ValueError(f"positions must be >= 0, got {arr[:16].tolist()}")
    return arr.astype(np.int64)


def forward_unchecked(
    model: Any, cache: Any, tokens: list[int] | torch.Tensor, positions: Sequence[int] | NDArray[np.int64],
    allowed: BoolArray, *, where: tuple[torch.device, torch.dtype] | None = None,
) -> torch.Tensor:
    """:func:`forward_masked` without its checks, for callers that built the inputs themselves.

    ``tokens`` may be an int64 tensor on the model's device (ids in range:
    the caller's duty, e.g. by clamping), fed with no host sync.  ``where``:
    the model's ``(device, dtype)`` when the caller knows them (the decode
    loop asks once per call, not once per forward), else looked up.
    """
    n, have = len(tokens), cache_length(cache)
    static = cache if isinstance(cache, StaticTreeCache) else None
    if static is not None and static.model is not model:
        raise ValueError("this StaticTreeCache belongs to another model")
    # a static cache read its window once, for the layout of its mask buffers (it holds no chunked layers)
    window = attention_window(model) if static is None else static.window
    mask_b = np.asarray(allowed, dtype=bool)
    near = None if window is None else windowed(mask_b, positions, window.size)
    if static is not None:
        return static.forward(tokens, positions, allowed, near)
    chunk = attention_chunks(model)
    same_chunk = None if chunk is None else chunked(mask_b, positions, chunk)
    device, dtype = (_device(model), _dtype(model)) if where is None else where
    if isinstance(tokens, torch.Tensor):
        ids = tokens.reshape(1, n)
    else:
        ids = torch.as_tensor(tokens, dtype=torch.long, device=device)[None]  # (1, n)
    pos = torch.as_tensor(np.asarray(positions, dtype=np.int64), device=device)[None]  # (1, n)
    full = additive_mask(allowed, dtype, device)  # (1, 1, n, have + n)
    mask: torch.Tensor | dict[str, torch.Tensor] = full
    if window is not None and near is not None:
        near_mask = additive_mask(near, dtype, device)
        # each layer takes the entry of its kind (the model's own masks are passed the same way)
        mask = {"full_attention": full, "sliding_attention": near_mask} if window.by_kind else near_mask
    if same_chunk is not None:  # a model with chunks takes its masks by layer kind (attention_chunks)
        mask = {**(mask if isinstance(mask, dict) else {"full_attention": full}),
                "chunked_attention": additive_mask(same_chunk, dtype, device)}
    # the decode loop runs under no_grad already: no context to enter per forward
    with torch.no_grad() if torch.is_grad_enabled() else contextlib.nullcontext():
        out = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True,
                    **{cache_keyword(model): cache})
    assert cache_length(cache) == have + n, "the model did not extend the cache it was given"
    logits: torch.Tensor = out.logits[0]
    return logits


def tree_logits(
    model: Any,
    cache: Any,
    tree: DraftTree,
    past_len: int,
    root_token: int | None = None,
    order: Sequence[int] | None = None,
    *,
    where: tuple[torch.device, torch.dtype] | None = None,
) -> torch.Tensor:
    """Logits ``(N (+1), V)`` of every tree node from ONE forward over the flattened tree.

    ``cache`` must hold exactly ``past_len`` positions (the context, or all
    of it but its last token, which is then passed as ``root_token`` and fed
    first at position ``past_len``).  ``order`` lays the nodes out (DFS, BFS,
    ``None`` = index order).  Rows come back in node-index order: row 0 is the
    root's when ``root_token`` is given, then nodes ``0..N-1``; row of node
    ``i`` is the logits after its path, i.e. ``p(· | context + path(i))``
    before :func:`spec.llm.sampling.process_logits`.  Afterwards the cache
    holds past (+ root) + the flattened tree: trim it with
    ``select_cache(cache, spec.tree.keep_indices(tree, path, past_len, order, with_root))``.
    ``where``: as in :func:`forward_unchecked`.
    """
    if not isinstance(tree, DraftTree):
        raise ValueError(f"tree must be a tmc.DraftTree, got {type(tree).__name__}")
    past_len = check_int("past_len", past_len, minimum=0)
    if past_len != cache_length(cache):
        raise ValueError(f"past_len {past_len} differs from the cache length {cache_length(cache)}")
    ordr = check_order(tree, order)
    with_root = root_token is not None
    head = [check_int("root_token", root_token, minimum=0)] if root_token is not None else []
    tokens = head + [tree.tokens[node] for node in ordr]
    if not tokens:
        return torch.zeros((0, _vocab(model)), dtype=_dtype(model), device=_device(model))
    allowed = attention_mask(tree, past_len, ordr, with_root)
    logits = forward_masked(model, cache, tokens, position_ids(tree, past_len, ordr, with_root), allowed, where=where)
    off = len(head)
    flat = np.empty(tree.size, dtype=np.int64)
    flat[list(ordr)] = np.arange(tree.size)  # flattened position of each node
    rows = np.concatenate([np.arange(off), off + flat])
    return logits.index_select(0, torch.as_tensor(rows, device=logits.device))


def select_beam_torch(probs: torch.Tensor, weights: FloatArray, k: int) -> tuple[IntArray, FloatArray]:
    """:func:`spec.draft.select_beam` on ``probs``' device: only the chosen candidates reach the host.

    Same values, same result: one float64 product per candidate, the ``k``-th
    largest value from ``torch.topk`` (its values do not depend on how it
    orders ties), positions in ascending order from ``nonzero``.
    """
    if probs.ndim != 2:
        raise ValueError(f"probs must be a 2-D (n, V) tensor, got shape {tuple(probs.shape)}")
    weights, k = check_beam_args(probs.shape[0], weights, k)
    w = torch.as_tensor(weights, device=probs.device)
    flat = (w[:, None] * probs.to(torch.float64)).reshape(-1)
    chosen = flat > 0.0
    if flat.numel() > k:
        chosen &= flat >= torch.topk(flat, int(k), sorted=False).values.min()
    pos = chosen.nonzero().reshape(-1)
    both = torch.stack([pos, flat[pos].view(torch.int64)]).cpu().numpy()  # one transfer: positions and value bits
    return both[0], both[1].view(np.float64)


def select_top_torch(probs: torch.Tensor, k: int) -> tuple[IntArray, FloatArray]:
    """:func:`spec.draft.select_top` on ``probs``' device: only ``n × k`` ids and values reach the host.

    :func:`~spec.llm.sampling.ranked_tokens` gives each row's ``min(k, V)`` largest
    entries in ``top_tokens``' order; entries ``<= 0`` become the padding
    ``(-1, 0)``, as do the ranks past ``V``.
    """
    if probs.ndim != 2:
        raise ValueError(f"probs must be a 2-D (n, V) tensor, got shape {tuple(probs.shape)}")
    k = check_int("k", k, minimum=1)
    n, vocab = probs.shape
    if n == 0 or vocab == 0:
        return np.full((n, k), -1, dtype=np.int64), np.zeros((n, k))
    tok, val = ranked_tokens(probs.to(torch.float64), min(k, vocab))
    real = val > 0.0
    tok = torch.where(real, tok, -1)
    val = torch.where(real, val, 0.0)
    both = torch.stack([tok, val.view(torch.int64)]).cpu().numpy()  # one transfer: ids and value bits
    tokens = np.full((n, k), -1, dtype=np.int64)
    values = np.zeros((n, k))
    tokens[:, : both.shape[2]] = both[0]
    values[:, : both.shape[2]] = both[1].view(np.float64)
    return tokens, values


# --- the draft side ---------------------------------------------------------------------


def _joined(parts: list[torch.Tensor]) -> torch.Tensor:
    """``torch.cat(parts)``, with no copy for one part (a one-token chain's step: one operation fewer)."""
    return parts[0] if len(parts) == 1 else torch.cat(parts)


class DeviceTree(NamedTuple):
    """A fixed-shape tree drafted on the model's device (:meth:`LLMDraft.draft_tree`); nothing synchronised yet."""

    tokens: torch.Tensor  # (N,) int64 draft tokens, node order
    q: torch.Tensor  # (M, V) float64: row j is the processed law the children of node rows_of[j] were drawn from
    rows_of: tuple[int, ...]  # the M nodes with children (-1 = the root), parents before children
    fault: torch.Tensor  # 0-d bool: some draft logits row is one process_logits refuses
    short: torch.Tensor  # 0-d bool: a ranked (topk) node fell on a token with q = 0 (draft_tree)


class DeviceChain(NamedTuple):
    """A chain drafted on the model's device (:meth:`LLMDraft.draft_chain`); nothing synchronised yet."""

    tokens: torch.Tensor  # (k,) int64 draft tokens
    q: torch.Tensor  # (k, V) float64: row i is the processed law token i was drawn from
    fault: torch.Tensor  # 0-d bool: some draft logits row is one process_logits refuses


class LLMDraft:
    """:class:`spec.draft.DraftModel` over a causal LM draft for one decode step.

    ``cache`` holds the first ``past_len`` context tokens; the rest of the
    context is either ``pending`` (tokens not fed yet: fed first, causally,
    with the first forward) or nothing, and then ``last_logits`` ``(V,)`` are
    the logits after the context's last token.  Exactly one of the two.

    Each :meth:`rows` call feeds every path of the call not fed yet (and any
    missing ancestor) in ONE forward: each node attends to the context, its
    ancestors and itself, at position ``context + depth - 1``.  Rows are the
    processed law ``q`` (:class:`~spec.llm.sampling.Sampling`) as float64
    numpy ``(len(paths), V)``; rows already evaluated are served from memory.
    ``forwards`` counts forward passes and ``forward_s`` their seconds.  :meth:`end_step` trims the cache to
    the context + the accepted tokens and returns the next step's draft.

    ``vocab``: the decode's vocabulary size (the target's; default the draft's own).  A draft whose
    embedding is smaller (Qwen-style padding: 151,936 against 152,064 ids) gets ``-inf`` logits for the
    ids it lacks, so its rows give them ``q = 0``; a larger one has its logits cut to ``vocab`` before
    processing, so it draws only ids the target has.  Either way the rows are the law the draft's
    tokens are drawn from, which is all a lossless verifier needs.  A context token the draft cannot
    embed (an id at or above its own size, which the target may emit) is fed to it as id 0; the rows
    after it are still the law its later tokens are drawn from.
    """

    def __init__(
        self,
        model: Any,
        cache: Any,
        past_len: int,
        *,
        pending: Sequence[int] = (),
        last_logits: torch.Tensor | None = None,
        sampling: Sampling = Sampling(),
        vocab: int | None = None,
    ) -> None:
        self.model = model
        self.cache = cache
        self.past_len = check_int("past_len", past_len, minimum=0)
        if self.past_len != cache_length(cache):
            raise ValueError(f"past_len {self.past_len} differs from the cache length {cache_length(cache)}")
        if not isinstance(sampling, Sampling):
            raise ValueError(f"sampling must be a spec.llm.sampling.Sampling, got {type(sampling).__name__}")
        self.sampling = sampling
        self._model_vocab = _vocab(model)
        self._vocab = self._model_vocab if vocab is None else check_int("vocab", vocab, minimum=1)
        self.pending: Path = tuple(self._token(f"pending[{i}]", t) for i, t in enumerate(pending))
        if (last_logits is None) == (not self.pending):
            raise ValueError("give exactly one of pending (tokens not in the cache) and last_logits")
        self._logits: dict[Path, torch.Tensor] = {}  # raw logits after each evaluated path; () = the root
        self._batch: tuple[list[Path], torch.Tensor | None] = ([], None)  # the last forward's nodes and their logits
        if last_logits is not None:
            if not isinstance(last_logits, torch.Tensor) or last_logits.numel() != self._vocab:
                raise ValueError(f"last_logits must be a tensor of {self._vocab} logits")
            self._logits[()] = last_logits.reshape(self._vocab)
        self._rows: dict[Path, FloatArray] = {}  # processed rows q(. | context + path)
        self._slot: dict[Path, int] = {}  # cache position of each fed node
        self._seen: dict[Path, tuple[int, ...]] = {}  # cache positions of each fed node's path (ancestors, itself)
        self._pending_fed = not self.pending  # True once the cache holds the whole context
        # draft_tree's shape and fed nodes (node, slot, logits) until settle_tree
        self._drafted: tuple[list[int], list[tuple[int, int, torch.Tensor]]] | None = None
        self._ended = False
        self._where: tuple[torch.device, torch.dtype] | None = None  # the model's (device, dtype), once asked
        self.forwards = 0
        self.forward_s = 0.0  # seconds in draft forwards (device synchronised)

    @property
    def vocab(self) -> int:
        return self._vocab

    def _fit(self, logits: torch.Tensor) -> torch.Tensor:
        """The draft's logits on the decode vocabulary (:func:`fit_vocabulary`)."""
        return fit_vocabulary(logits, self._vocab)

    def _model_where(self) -> tuple[torch.device, torch.dtype]:
        """The model's ``(device, dtype)``, looked up once for a whole decode (:meth:`end_step` hands it on)."""
        if self._where is None:
            self._where = (_device(self.model), _dtype(self.model))
        return self._where

    @property
    def context_len(self) -> int:
        """Tokens of context below the tree root (cached + pending)."""
        return self.past_len + len(self.pending)

    def _token(self, name: str, value: object) -> int:
        tok = check_int(name, value, minimum=0)
        if tok >= self._vocab:
            raise ValueError(f"{name} = {tok} is outside the vocabulary [0, {self._vocab})")
        return tok

    def _path(self, i: int, path: object) -> Path:
        if type(path) is tuple and (not path or path[:-1] in self._slot):
            # the prefix was validated when it was fed: check only the last token
            assert isinstance(path, tuple)
            if not path:
                return ()
            last = self._token(f"paths[{i}][{len(path) - 1}]", path[-1])
            return path if type(path[-1]) is int else path[:-1] + (last,)
        if isinstance(path, (str, bytes)) or not isinstance(path, Sequence | np.ndarray):
            raise ValueError(f"paths[{i}] must be a sequence of token ids, got {path!r}")
        return tuple(self._token(f"paths[{i}][{j}]", t) for j, t in enumerate(path))

    def rows(self, paths: Sequence[Path]) -> FloatArray:
        """``(len(paths), V)`` float64 rows ``q(· | context + path)``; at most one forward."""
        wanted = self._fed(paths)
        todo = list(dict.fromkeys(p for p in wanted if p not in self._rows))
        if todo:
            for path, row in zip(todo, self._probs(todo).cpu().numpy()):
                self._rows[path] = row
        out = np.zeros((len(wanted), self._vocab), dtype=np.float64)
        for i, path in enumerate(wanted):
            out[i] = self._rows[path]
        return out

    def beam_candidates(self, paths: Sequence[Path], weights: FloatArray, k: int) -> tuple[IntArray, FloatArray]:
        """:func:`spec.draft.select_beam` of these paths' rows, selected on the model's device.

        At most one forward, like :meth:`rows`; only the selected candidates
        (about ``k``) reach the host, not ``len(paths) × V`` rows.  Weights and
        ``k`` are checked by :func:`spec.draft.beam_candidates`, the builders'
        entry point.  The values equal the host computation from :meth:`rows`
        up to the rounding of the host's renormalisation (``≤ 1e-15`` relative).
        """
        wanted = self._fed(paths)
        if not wanted:
            return np.zeros(0, dtype=np.int64), np.zeros(0)
        probs = self._probs(wanted)
        w = np.asarray(weights, dtype=np.float64)
        if probs.device.type == "cpu":  # numpy's partition beats torch.topk on the CPU (about 2.5x at 128 x 4096)
            return select_beam(probs.numpy(), w, k)
        return select_beam_torch(probs, w, k)

    def top_candidates(self, paths: Sequence[Path], k: int) -> tuple[IntArray, FloatArray]:
        """:func:`spec.draft.select_top` of these paths' rows, ranked on the model's device.

        At most one forward, like :meth:`rows`; only each row's ``k`` best ids
        and their ``q`` reach the host, not ``len(paths) × V`` rows (DynaTree's
        question).  The values equal the host computation from :meth:`rows` up to
        the rounding of the host's renormalisation (``≤ 1e-15`` relative).
        """
        wanted = self._fed(paths)
        if not wanted:
            return np.zeros((0, k), dtype=np.int64), np.zeros((0, k))
        probs = self._probs(wanted)
        if probs.device.type == "cpu":  # top_tokens row by row: 1.4-10x faster than select_top_torch here
            return select_top(probs.numpy(), k)
        return select_top_torch(probs, k)

    def _probs(self, paths: Sequence[Path]) -> torch.Tensor:
        """The processed rows ``(len(paths), V)`` of fed paths, float64 on the model's device."""
        new, batch = self._batch
        if batch is not None and list(paths) == new:  # the layer just fed: its logits are one slice already
            with logits_of("draft"):
                return self.sampling.probs(batch)
        with logits_of("draft"):
            return self.sampling.probs(torch.stack([self._logits[p] for p in paths]))

    def _fed(self, paths: Sequence[Path]) -> list[Path]:
        """``paths`` validated, with every node not fed yet fed in one forward."""
        if self._ended:
            raise RuntimeError("this draft step has ended (end_step); use the draft it returned")
        if self._drafted is not None:
            raise RuntimeError("call settle_chain / settle_tree after draft_chain / draft_tree before asking for rows")
        wanted = [self._path(i, p) for i, p in enumerate(paths)]
        new: dict[Path, None] = {}  # nodes to feed, parents before children (an ordered set)
        for path in wanted:
            if not path or path in self._slot:
                continue
            if len(path) == 1 or path[:-1] in self._slot:  # the usual case: a child of a fed node
                new[path] = None
            else:
                new.update((path[:depth], None) for depth in range(1, len(path) + 1) if path[:depth] not in self._slot)
        if new or (() in wanted and () not in self._logits):
            self._feed(list(new))
        return wanted

    def draft_chain(self, k: int, uniforms: torch.Tensor | None, confidence: float | None = None) -> DeviceChain:
        """A chain of ``k`` draft tokens drawn on the model's device, with no host sync between tokens.

        Token ``i`` is drawn from the processed row ``q_i`` after the context
        and tokens ``< i`` by inverse CDF with ``uniforms[i]``
        (:func:`~spec.llm.sampling.categorical_draw`: the rule of
        :class:`spec.randomness.RngSampler`, so the same uniforms give the
        chain :class:`spec.builders.ChainBuilder` builds through :meth:`rows`),
        or is the row's argmax (lowest id on ties) when ``uniforms`` is
        ``None`` (a ``topk`` chain).  Forwards: the pending tokens if any,
        then one per token but the last.  Bad draft logits do not raise here:
        they set ``fault``; check it (with the step's one transfer), and call
        :meth:`settle_chain` with the drawn tokens before :meth:`end_step`.
        One synchronisation at the end puts the queued forwards' device time
        into ``forward_s``; nothing is copied to the host.  (The chain case of
        :meth:`draft_tree`.)

        ``confidence``: the chain ends after the first token whose draft
        probability is below it (:class:`spec.builders.ChainBuilder`'s rule),
        so it may hold fewer than ``k`` tokens and only the first
        ``len(tokens)`` uniforms are used.  Each token's probability is read
        on the host before the next forward: one synchronisation per token,
        as transformers' assisted generation pays for the same rule.
        """
        k = check_int("k", k, minimum=1)
        tree = self.draft_tree(tuple(range(-1, k - 1)), uniforms, stop_below=confidence)
        return DeviceChain(tree.tokens, tree.q, tree.fault)

    def settle_chain(self, tokens: Sequence[int]) -> None:
        """Record the nodes :meth:`draft_chain` fed, now that its ``tokens`` are known on the host."""
        self.settle_tree(tokens, "settle_chain follows draft_chain", "draft_chain")

    def chain_fault(self) -> None:
        """Raise the ``ValueError`` :func:`~spec.llm.sampling.process_logits` gives for the first bad
        row :meth:`draft_chain` met (call it when the chain's ``fault`` flag was set)."""
        self.tree_fault()

    def draft_tree(self, parents: Sequence[int], uniforms: torch.Tensor | None, *,
                   stop_below: float | None = None, swor: bool = False) -> DeviceTree:
        """A tree of a shape fixed in advance, drawn on the model's device with no host sync.

        ``parents`` numbers the nodes breadth first (a node's depth is never
        below an earlier node's; ``-1`` is the root).  Node ``i`` is drawn
        from its parent's processed row by inverse CDF with ``uniforms[i]``
        (the rule of :class:`spec.randomness.RngSampler`: the same uniforms
        give the tokens a host builder draws through :meth:`rows` for the
        same shape, node by node).  When ``uniforms`` is ``None`` the node
        with ``r`` earlier siblings is the ``r``-th most likely token of its
        parent's row (:func:`~spec.llm.sampling.ranked_tokens`: ties to the
        lowest id; a chain takes each row's argmax): the tree
        ``FixedBuilder(draw="topk")`` grows, as long as every row has a token
        with ``q > 0`` for each child; ``short`` is set when one has not (the
        host builder would have grown fewer children there: :meth:`discard_tree`,
        then the host path).  With ``swor`` (and uniforms) siblings are drawn
        without replacement, the tree ``FixedBuilder(draw="swor")`` grows: the
        node with ``r`` earlier siblings by inverse CDF from its parent's row
        with those siblings' tokens set to 0
        (:func:`spec.builders.base.without`); ``short`` is set when such a row
        has no mass left.  Forwards: the pending tokens if any, then one per layer
        that has children (the whole layer, as a host builder's
        ``fetch(frontier)`` feeds it), each node seeing the context, its
        ancestors and itself.  Bad draft logits set ``fault`` instead of
        raising; check it, then call :meth:`settle_tree` with the drawn
        tokens before :meth:`end_step`.  One synchronisation at the end.

        Unlike the host path, i.i.d. siblings that drew the same token are
        fed as separate nodes (the host feeds one path once): their rows are
        the same computation, in a forward with more tokens.

        ``stop_below`` (chains only, :meth:`draft_chain`'s ``confidence``):
        the chain ends after the first token whose probability in its row is
        below it; ``parents`` is then cut to the nodes drawn.
        """
        if self._ended:
            raise RuntimeError("this draft step has ended (end_step); use the draft it returned")
        if self._slot or self._drafted is not None:
            raise RuntimeError("draft_tree needs a draft step with no node fed yet")
        given = tuple(parents)
        if not all(type(p) is int for p in given):  # Python ints (the decode loop's) are checked by _tree_layout
            given = tuple(check_int(f"parents[{i}]", p, minimum=-1) for i, p in enumerate(given))
        layers, rank = _tree_layout(given)
        par, n = list(given), len(given)
        if stop_below is not None:
            if par != list(range(-1, n - 1)):
                raise ValueError("stop_below needs a chain: parents must be -1, 0, 1, ...")
            stop_below = check_prob("confidence", stop_below)
        if not isinstance(swor, bool) or (swor and uniforms is None):
            raise ValueError(f"swor must be True (with uniforms) or False, got {swor!r}")
        if uniforms is not None:
            shape_ok = isinstance(uniforms, torch.Tensor) and tuple(uniforms.shape) == (n,)
            if not shape_ok or not uniforms.is_floating_point():
                raise ValueError(f"uniforms must be None or a floating-point tensor of shape ({n},)")
            if uniforms.device.type == "cpu" and uniforms.dtype in (torch.float32, torch.float64):
                host = uniforms.detach().numpy()  # the decode loop's case: one numpy test, not four torch ops
                inside = bool(np.all((host >= 0.0) & (host < 1.0)))
            else:
                inside = bool(((uniforms >= 0.0) & (uniforms < 1.0)).all())
            if not inside:
                raise ValueError(f"uniforms must lie in [0, 1), got {uniforms.tolist()}")
        if not self._pending_fed:
            self._feed([], wait=False)
        root = self._logits[()]
        u = None if uniforms is None else uniforms.to(device=root.device, dtype=torch.float64)
        context = self.context_len
        short = [torch.zeros((), dtype=torch.bool, device=root.device)]
        prev_nodes: tuple[int, ...] = (ROOT,)
        prev_rows = self.sampling.probs_unchecked(root).reshape(1, self._vocab)
        seen: dict[int, tuple[int, ...]] = {ROOT: ()}
        tokens: list[torch.Tensor] = []
        q_rows: list[torch.Tensor] = []
        rows_of: list[int] = []
        raw = [root.reshape(1, self._vocab)]  # the logits of every row drawn from
        fed: list[tuple[int, int, torch.Tensor]] = []  # (node, slot, logits)
        for d, layer in enumerate(layers, start=1):
            drawn_from = list(dict.fromkeys(par[i] for i in layer))  # each parent once, in node order
            rows_of += drawn_from
            if len(prev_nodes) == 1:  # one parent (a chain, a tree's first layer): no index upload
                parent_rows = prev_rows
            else:
                local = {node: j for j, node in enumerate(prev_nodes)}
                parent_rows = prev_rows[[local[p] for p in drawn_from]]
            q_rows.append(parent_rows)
            where = {p: j for j, p in enumerate(drawn_from)}
            of_node = [where[par[i]] for i in layer]  # each node's row in parent_rows
            deepest = max(rank[i] for i in layer)
            if u is not None and swor and deepest > 0:  # rank by rank, the earlier siblings' tokens removed
                ranks = [(torch.tensor([of_node[i] for i, v in enumerate(layer) if rank[v] == j], device=root.device),
                          torch.tensor([i for i, v in enumerate(layer) if rank[v] == j], device=root.device))
                         for j in range(deepest + 1)]
                tok, cut = swor_draws(parent_rows, ranks, u[layer[0] : layer[-1] + 1])
                short.append(cut)
            elif u is not None:  # each node drawn from its parent's row
                rows = parent_rows.expand(len(layer), -1) if len(drawn_from) == 1 else parent_rows[of_node]
                tok = categorical_draw(rows, u[layer[0] : layer[-1] + 1])
            elif deepest == 0:  # one child per parent, in the parents' order: each row's argmax (lowest id on ties)
                tok = parent_rows.argmax(dim=-1)
            else:  # siblings: each parent's ranked tokens, computed once per parent
                top = min(deepest + 1, self._vocab)
                ranked, values = ranked_tokens(parent_rows, top)
                at = (of_node, [min(rank[i], top - 1) for i in layer])
                tok, got = ranked[at], values[at]
                short.append((got <= 0.0).any() if deepest < self._vocab else torch.ones((), dtype=torch.bool,
                                                                                          device=root.device))
            # a NaN row draws -1 (the fault flag reports it); a short ranked row may rank an id the draft lacks
            tok = tok.clamp(0, min(self._vocab, self._model_vocab) - 1)
            tokens.append(tok)
            if d == len(layers):
                break
            if stop_below is not None and float(parent_rows[0, tok[0]]) < stop_below:  # a host read per token
                par = par[:d]  # but the last: the chain ends there anyway
                break
            have = cache_length(self.cache)
            m = len(layer)
            allowed = np.zeros((m, have + m), dtype=bool)
            allowed[:, :context] = True
            rr: list[int] = []
            cc: list[int] = []
            for j, node in enumerate(layer):  # each node sees its ancestors and itself
                seen[node] = seen[par[node]] + (have + j,)
                rr += [j] * len(seen[node])
                cc += seen[node]
            allowed[rr, cc] = True
            t1 = time.perf_counter()
            logits = self._fit(forward_unchecked(self.model, self.cache, tok, [context + d - 1] * m, allowed,
                                                 where=self._model_where()))
            self.forward_s += time.perf_counter() - t1
            self.forwards += 1
            fed += [(node, have + j, logits[j]) for j, node in enumerate(layer)]
            raw.append(logits)
            prev_nodes, prev_rows = layer, self.sampling.probs_unchecked(logits)
        self._drafted = (par, fed)
        t1 = time.perf_counter()
        sync(root.device)  # the queued forwards' device time is draft-forward time
        self.forward_s += time.perf_counter() - t1
        return DeviceTree(_joined(tokens), _joined(q_rows), tuple(rows_of), logits_fault(_joined(raw)),
                          short[0] if len(short) == 1 else torch.stack(short).any())

    def settle_tree(self, tokens: Sequence[int], _missing: str = "settle_tree follows draft_tree",
                    _call: str = "draft_tree") -> None:
        """Record the nodes :meth:`draft_tree` fed, now that its ``tokens`` are known on the host.

        i.i.d. twins (two nodes with one path) keep the first twin's slot and
        logits, as the host path keeps the one node it fed.
        """
        if self._drafted is None:
            raise RuntimeError(_missing)
        par, fed = self._drafted
        toks = tuple(self._token(f"tokens[{i}]", t) for i, t in enumerate(tokens))
        if len(toks) != len(par):
            raise ValueError(f"{_call} drew {len(par)} tokens, got {len(toks)}")
        paths: dict[int, Path] = {ROOT: ()}
        for i, p in enumerate(par):
            paths[i] = paths[p] + (toks[i],)
        for node, slot, logits in fed:  # parents before children
            path = paths[node]
            if path not in self._slot:
                self._slot[path], self._seen[path] = slot, self._seen.get(path[:-1], ()) + (slot,)
                self._logits[path] = logits
        self._drafted = None

    def discard_tree(self) -> None:
        """Undo :meth:`draft_tree`: the nodes it fed leave the cache (the context stays fed), so a host
        builder can grow this step's tree instead (after a ``short`` ranked tree)."""
        if self._drafted is None:
            raise RuntimeError("discard_tree follows draft_tree")
        trim_cache(self.cache, self.context_len)
        self._drafted = None

    def tree_fault(self) -> None:
        """Raise the ``ValueError`` :func:`~spec.llm.sampling.process_logits` gives for the first bad
        row :meth:`draft_tree` (or :meth:`draft_chain`) met (call it when the ``fault`` flag was set)."""
        for logits in [self._logits[()]] + [lg for _, _, lg in (self._drafted or ((), []))[1]]:
            with logits_of("draft"):
                self.sampling.probs(logits)

    def _feed(self, new: list[Path], wait: bool = True) -> None:
        """One forward: the pending tokens (first time only), then the nodes ``new``.

        ``wait``: synchronise the device after the forward, so ``forward_s``
        holds its device time (the caller times the queue otherwise)."""
        have = cache_length(self.cache)
        pend = () if self._pending_fed else self.pending
        n = len(pend) + len(new)
        for k, node in enumerate(new):
            self._slot[node] = have + len(pend) + k
        allowed = np.zeros((n, have + n), dtype=bool)
        allowed[:, : self.past_len] = True
        for j in range(len(pend)):  # causal over the pending tokens
            allowed[j, self.past_len : self.past_len + j + 1] = True
        context = self.context_len
        allowed[len(pend) :, self.past_len : context] = True
        rows: list[int] = []
        cols: list[int] = []
        for k, node in enumerate(new):  # each node sees its ancestors and itself: one scatter for the layer
            seen = self._seen[node] = self._seen.get(node[:-1], ()) + (self._slot[node],)
            rows += [len(pend) + k] * len(seen)
            cols += seen
        if rows:
            allowed[rows, cols] = True
        positions = [self.past_len + j for j in range(len(pend))] + [context + len(node) - 1 for node in new]
        tokens = list(pend) + [node[-1] for node in new]
        if self._model_vocab < self._vocab:  # ids the draft cannot embed (padding ids of the target's) go in as 0
            tokens = [t if t < self._model_vocab else 0 for t in tokens]
        t0 = time.perf_counter()
        logits = self._fit(forward_masked(self.model, self.cache, tokens, positions, allowed,
                                          where=self._model_where()))
        if wait:
            sync(logits.device)
        self.forward_s += time.perf_counter() - t0
        self.forwards += 1
        if pend:
            self._logits[()] = logits[len(pend) - 1]
            self._pending_fed = True
        batch = logits[len(pend) :]
        self._batch = (new, batch)  # the usual next request: exactly these nodes, in this order
        self._logits.update(zip(new, batch.unbind(0)))

    def end_step(self, tokens: Sequence[int]) -> LLMDraft:
        """End the step after the verifier emitted ``tokens`` (accepted drafts + the final token).

        Keeps in the cache the context and the longest prefix of ``tokens``
        whose nodes were fed this step (gathered with :func:`select_cache`);
        the rest of ``tokens`` becomes the next step's ``pending``.  Returns
        the :class:`LLMDraft` of the next step (same model, cache, sampling);
        this one can no longer be used.
        """
        if self._ended:
            raise RuntimeError("end_step was already called on this draft step")
        if self._drafted is not None:
            raise RuntimeError("call settle_chain / settle_tree after draft_chain / draft_tree before end_step")
        toks = tuple(self._token(f"tokens[{i}]", t) for i, t in enumerate(tokens))
        if not self._pending_fed:  # nothing fed: the cache still holds exactly the past
            self._ended = True
            rest = self.pending + toks
            return self._successor(self.past_len, rest, None if rest else self._logits[()])
        fed = 0
        while fed < len(toks) and toks[: fed + 1] in self._slot:
            fed += 1
        context = self.context_len
        slots = [self._slot[toks[:d]] for d in range(1, fed + 1)]
        # a path fed in order right after the context (a chain's, always) is a trim, not a gather
        select_cache(self.cache, range(context + fed) if slots == list(range(context, context + fed))
                     else list(range(context)) + slots)
        self._ended = True
        rest = toks[fed:]
        return self._successor(context + fed, rest, None if rest else self._logits[toks])

    def _successor(self, past: int, pending: Path, last_logits: torch.Tensor | None) -> LLMDraft:
        nxt = LLMDraft(self.model, self.cache, past, pending=pending, last_logits=last_logits, sampling=self.sampling,
                       vocab=self._vocab)
        nxt._where = self._where
        return nxt
