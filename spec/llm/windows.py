"""Sliding windows: which layers of a transformers model attend through a window, and the mask that applies it.

A model with a sliding window (Mistral, Mixtral, Phi-3, Starcoder2, Qwen3-MoE; Gemma 2 and 3, Qwen2,
GPT-OSS, Cohere 2, ...) lets a query at position ``p`` see the keys at positions ``> p - window`` only, in
every layer or only in its ``sliding_attention`` layers.  The tree pass must apply the same window to
reproduce the model's own decoding: :func:`attention_window` says which window and in which layers,
:func:`windowed` cuts a forward's bool mask to it.  Both the dynamic cache's forwards
(:func:`spec.llm.adapter.forward_unchecked`) and the static cache's
(:class:`spec.llm.static_cache.StaticTreeCache`) use them, so they live below both.
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

BoolArray = NDArray[np.bool_]

__all__ = ["AttentionWindow", "attention_window", "windowed"]

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
def _mask_style(modules: tuple[str, ...]) -> str:
    """``"by_kind"``, ``"all"`` or ``"none"``: how the code of ``modules`` applies a config's sliding window."""
    source = ""
    for name in modules:
        with contextlib.suppress(TypeError, OSError):  # a module without source (built in, frozen): no evidence
            source += inspect.getsource(sys.modules[name])
    if _MASK_BY_KIND.search(source):
        return "by_kind"
    return "all" if "create_sliding_window_causal_mask" in source else "none"


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
    base = getattr(model, "base_model", model)
    style = _mask_style(tuple(dict.fromkeys((type(model).__module__, type(base).__module__))))
    if style == "by_kind":
        kinds = set(getattr(cfg, "layer_types", None) or [])
        if "sliding_attention" not in kinds:
            return None
        return AttentionWindow(int(size), kinds != {"sliding_attention"})
    return AttentionWindow(int(size), False) if style == "all" else None


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
    keys = np.concatenate([np.arange(allowed.shape[1] - len(pos), dtype=np.int64), pos])
    near = keys[None, :] > pos[:, None] - size
    return None if near[allowed].all() else allowed & near
