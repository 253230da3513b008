"""Sliding windows and attention chunks: which layers of a transformers model attend through them, and the masks
that apply them; Llama 4's query temperature tuning and the tree size it allows.

A model with a sliding window (Mistral, Mixtral, Phi-3, Starcoder2, Qwen3-MoE; Gemma 2 and 3, Qwen2,
GPT-OSS, Cohere 2, ...) lets a query at position ``p`` see the keys at positions ``> p - window`` only, in
every layer or only in its ``sliding_attention`` layers.  The tree pass must apply the same window to
reproduce the model's own decoding: :func:`attention_window` says which window and in which layers,
:func:`windowed` cuts a forward's bool mask to it.  Both the dynamic cache's forwards
(:func:`spec.llm.adapter.forward_unchecked`) and the static cache's
(:class:`spec.llm.static_cache.StaticTreeCache`) use them, so they live below both.  Llama 4's attention
chunks (:func:`attention_chunks`, :func:`chunked`) go the same way on the dynamic cache (the static one
holds no chunked layers), and so does the cap on a step's tree that its query temperature tuning needs
(:func:`query_scale_floor`, :func:`exact_tree_nodes`).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import re
import sys
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
from numpy.typing import NDArray

from tmc.validate import check_int

BoolArray = NDArray[np.bool_]

__all__ = ["AttentionWindow", "attention_chunks", "attention_window", "chunked", "exact_tree_nodes",
           "query_scale_floor", "windowed"]

#: How a model module reads a 4D ``attention_mask``: as a dict keyed by layer kind (Gemma 2 and 3, Qwen2,
#: GPT-OSS, Cohere 2, ...: each layer takes the entry of its ``config.layer_types`` kind).
_MASK_BY_KIND = re.compile(r"isinstance\(\s*(?:\w+\s*:=\s*)?attention_mask\s*,\s*dict\s*\)")


class AttentionWindow(NamedTuple):
    """A model's sliding window: at position ``p`` its windowed layers attend to positions ``> p - size``
    (transformers' ``sliding_window_overlay``).  ``by_kind``: only the layers of kind ``sliding_attention``
    are windowed, so a forward passes its mask as a dict keyed by layer kind; else every layer is."""

    size: int
    by_kind: bool


@functools.cache
def _source(modules: tuple[str, ...]) -> str:
    """The code of ``modules``, joined (read once per module set)."""
    source = ""
    for name in modules:
        with contextlib.suppress(TypeError, OSError):  # a module without source (built in, frozen): no evidence
            source += inspect.getsource(sys.modules[name])
    return source


@functools.cache
def _mask_style(modules: tuple[str, ...]) -> str:
    """``"by_kind"``, ``"all"`` or ``"none"``: how the code of ``modules`` applies a config's sliding window."""
    source = _source(modules)
    if _MASK_BY_KIND.search(source):
        return "by_kind"
    return "all" if "create_sliding_window_causal_mask" in source else "none"


def _modules(model: Any) -> tuple[str, ...]:
    """The modules of ``model``'s class and of its ``base_model``'s (where transformers builds the masks)."""
    base = getattr(model, "base_model", model)
    return tuple(dict.fromkeys((type(model).__module__, type(base).__module__)))


def attention_window(model: Any) -> AttentionWindow | None:
    """The sliding window ``model``'s own decoding applies, or ``None``; read as transformers' model code does.

    A model module that takes a mask dict by layer kind (Gemma 2 and 3, Qwen2, GPT-OSS, Cohere 2, ...)
    windows the layers ``config.layer_types`` names ``sliding_attention``; one that builds a single mask
    with ``create_sliding_window_causal_mask`` (Mistral, Mixtral, Phi-3, Starcoder2, Qwen3-MoE) windows
    every layer when ``config.sliding_window`` is set; code that does neither attends in full with sdpa
    and eager whatever the config says.  The module is recognised from its source (the classes of the
    model and of its ``base_model``), once per module.
    """
    cfg = getattr(model, "config", None)
    size = getattr(cfg, "sliding_window", None)
    if not size:
        return None
    style = _mask_style(_modules(model))
    if style == "by_kind":
        kinds = set(getattr(cfg, "layer_types", None) or [])
        if "sliding_attention" not in kinds:
            return None
        return AttentionWindow(int(size), kinds != {"sliding_attention"})
    return AttentionWindow(int(size), False) if style == "all" else None


def _key_positions(allowed: BoolArray, pos: NDArray[np.int64]) -> NDArray[np.int64]:
    """The position of every key of a forward's mask ``allowed`` (``(n, have + n)``): cached slot ``j`` read as
    position ``j``, then the new tokens' ``pos``."""
    return np.concatenate([np.arange(allowed.shape[1] - len(pos), dtype=np.int64), pos])


def windowed(allowed: BoolArray, positions: Sequence[int] | NDArray[np.int64], size: int) -> BoolArray | None:
    """``allowed`` (``(n, have + n)``: a forward's mask over ``have`` cached positions and ``n`` new tokens at
    ``positions``) with a sliding window of ``size`` applied, or ``None`` when it already lies within it.

    Cache slot ``j < have`` is read as position ``j``: true of a cache that holds the context and then the
    accepted path, as the target's does at every verification forward.  (A draft's cache also holds earlier
    tree layers, at slots past their positions: those read as nearer than they are, and a draft's rows
    need not be its own decoding's anyway.)
    """
    pos = np.asarray(positions, dtype=np.int64)
    if len(pos) == 0 or int(pos.max()) < size:  # no position lies ``size`` back from any query yet
        return None
    near = _key_positions(allowed, pos)[None, :] > pos[:, None] - size
    return None if near[allowed].all() else allowed & near


def attention_chunks(model: Any) -> int | None:
    """The chunk size of the attention chunks ``model``'s own decoding applies and the tree pass applies too,
    or ``None``.

    Llama 4's ``chunked_attention`` layers let a query at position ``p`` see the keys at positions ``k`` with
    ``k // C == p // C`` only (``C = config.attention_chunk_size``; transformers' ``chunked_overlay``, no
    padding at batch size 1), its ``full_attention`` layers every earlier position.  Its model code takes its
    masks as a dict keyed by layer kind, so a forward can pass each kind its own: a model whose code does that
    and builds chunked masks (``create_chunked_causal_mask``), with ``chunked_attention`` among its
    ``config.layer_types``, gets its chunk size back.  Any other model with chunks in its config gets ``None``,
    and then :func:`spec.llm.adapter.check_span` limits its decodes to one chunk.
    """
    cfg = getattr(model, "config", None)
    size = getattr(cfg, "attention_chunk_size", None)
    if not size or "chunked_attention" not in set(getattr(cfg, "layer_types", None) or []):
        return None
    modules = _modules(model)
    return int(size) if _mask_style(modules) == "by_kind" and _builds_chunked_masks(modules) else None


@functools.cache
def _builds_chunked_masks(modules: tuple[str, ...]) -> bool:
    """Whether the code of ``modules`` builds chunked causal masks (``create_chunked_causal_mask``: Llama 4)."""
    return "create_chunked_causal_mask" in _source(modules)


def chunked(allowed: BoolArray, positions: Sequence[int] | NDArray[np.int64], size: int) -> BoolArray | None:
    """``allowed`` (``(n, have + n)``, as :func:`windowed` takes it) cut to attention chunks of ``size``
    positions (a query at position ``p`` sees the keys at positions ``k`` with ``k // size == p // size``), or
    ``None`` when it already lies within them.

    Cache slot ``j < have`` is read as position ``j``, as in :func:`windowed`: true of the target's cache at
    every verification forward; a draft's rows need not be its own decoding's.
    """
    size = check_int("size", size, minimum=1)
    pos = np.asarray(positions, dtype=np.int64)
    if len(pos) == 0:
        return None
    lo = pos // size * size  # the first position of each query's chunk
    if int(lo.max()) == 0:  # every query in the first chunk: nothing before it to cut
        return None
    same = _key_positions(allowed, pos)[None, :] >= lo[:, None]  # a key past the query is not allowed anyway
    return None if same[allowed].all() else allowed & same


def query_scale_floor(config: Any) -> int | None:
    """``floor_scale`` of a model whose layers without rotary embeddings scale their queries by the cache length
    (Llama 4's ``attn_temperature_tuning``), else ``None``.

    Such a layer scales the query of the token at cache slot ``s`` by ``1 + attn_scale · log1p(⌊(s + 1) /
    floor_scale⌋)``, reading ``s`` from the cache's length, not from the position ids.  A tree node's slot lies
    past its position, so its scale is its own decoding's only while both fall in one step of the floor
    (:func:`exact_tree_nodes`).  ``no_rope_layers`` unknown: some layers are assumed to lack rotary embeddings.
    """
    floor = getattr(config, "floor_scale", None)
    if getattr(config, "attn_temperature_tuning", False) and floor and not all(
            getattr(config, "no_rope_layers", None) or [False]):
        return int(floor)
    return None


def exact_tree_nodes(floor: int, past: int) -> int:
    """How many tree nodes a verification forward after ``past`` cached positions may hold for a model with
    :func:`query_scale_floor` ``floor``, so that every node's query scale is the one its own decoding gives it
    (at least 1).

    The root goes to slot ``past`` at position ``past``, and the nodes to slots ``past + 1 .. past + N``, each
    at a position ``past + depth`` with ``1 <= depth <=`` its slot's offset.  The scale reads
    ``⌊(s + 1) / floor⌋``, one value for the slots from ``past + 1`` up to the last before the next multiple
    of ``floor`` (minus one): every slot and every position in that range shares it.  A chain (slot =
    position) is exact whatever its length.
    """
    floor, past = check_int("floor", floor, minimum=1), check_int("past", past, minimum=0)
    return ((past + 2) // floor + 1) * floor - 2 - past
