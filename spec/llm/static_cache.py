"""A static KV cache written at explicit slots, with captured CUDA graphs (DESIGN.md §8).

The decode loop's forwards are small (a tree of ≤ a few dozen tokens, a draft
layer, one root token), so on a GPU their cost is kernel launches and host
work, not arithmetic.  :class:`StaticTreeCache` removes both where a
``DynamicCache`` cannot:

* **Fixed buffers.**  One tensor ``kv`` of shape
  ``(layers, 2, 1, kv_heads, capacity, head_dim)`` holds every layer's keys
  and values.  A forward writes its ``n`` new entries at the explicit slots
  ``length .. length + n - 1`` (``index_copy_``) and attends over the whole
  buffer, with a 4D additive mask that opens only the slots the node may see:
  the context ``[0, length)``, its tree ancestors and itself.  Slots past the
  context hold stale entries from rejected nodes; the mask keeps them out and
  a later forward overwrites them.
* **Keeping the accepted path** (:meth:`StaticTreeCache.select`) is one
  gather over all layers at once: the kept positions are copied to the
  contiguous slots after the retained prefix and ``length`` becomes their
  count.  As for ``DynamicCache``, this is exact: each kept entry was
  computed with the attention set and position plain decoding of its path
  uses, and RoPE is already applied to the stored keys.
* **CUDA graphs.**  Every input of a forward lives in a per-size static
  buffer (token ids, position ids, write slots and the bool mask, uploaded in
  one copy; the graph turns the bool mask into the additive one), so the forward of
  ``n`` tokens is padded to the next power of two ``B ≥ n`` and replays a
  graph captured once for ``(model, B)``.  Padding rows write to slots no
  real row attends to and their logits are dropped.  The first forward of a
  size runs twice eagerly (warm-up, on a side stream) and captures; later ones
  replay.  On the CPU (or with ``graphs=False``) the same buffers run eagerly,
  so the CPU tests exercise everything but the capture.

The cache implements the one method transformers' Llama-style attention calls
on a cache — ``update(keys, values, layer_idx, ...)``, the same in 5.17 to 5.24
but for the extra keyword 5.24 passes — plus ``get_seq_length``; it is not a
``transformers.Cache`` subclass, so masking code sizes the mask from the 4D
mask it is given (5.17 to 5.24 return a 4D mask as is).  The model is called
with the cache under :func:`cache_keyword` (5.24 renamed ``past_key_values``).

**Sliding windows** (Mistral, Gemma 2 and 3, Qwen2, ...: :func:`spec.llm.windows.attention_window`)
are a mask matter here: every slot is kept (slot ``j < length`` holds position
``j``), and the forward's caller passes the window-cut mask
(:func:`spec.llm.windows.windowed`).  A model that windows every layer gets
that mask alone; one that takes its masks by layer kind gets the dict
``{"full_attention": ..., "sliding_attention": ...}`` from two static mask
buffers, so one captured graph serves both kinds of layer.  Layer kinds other
than full and sliding attention (chunked, linear, ...) are refused: they need
state or masks this buffer does not keep.  Batch size 1.
"""

from __future__ import annotations

import functools
import inspect
import itertools
import math
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from numpy.typing import NDArray

from spec.llm.windows import attention_window, query_scale_floor
from tmc.validate import check_int

__all__ = ["StaticTreeCache", "cache_keyword", "holds_layers", "shared_static_cache"]

#: Forwards of at most this many tokens replay a captured graph (larger ones, e.g. a prefill, run eagerly).
MAX_GRAPH_TOKENS = 128
#: Capacity is rounded up to a multiple of this.
CAPACITY_STEP = 64
#: A cache asking for more bytes than this (1 PiB, past any one device) is a ``MemoryError`` before torch is asked:
#: ``max_new_tokens = 2**62`` made torch raise "Storage size calculation overflowed", 2**63 a TypeError.
MAX_CACHE_BYTES = 2**50


@functools.cache
def _cache_keyword_of(forward: Any) -> str:
    try:
        names = inspect.signature(forward).parameters
    except (TypeError, ValueError):  # a builtin or an odd callable: the long-standing name
        return "past_key_values"
    return "cache" if "cache" in names and "past_key_values" not in names else "past_key_values"


def cache_keyword(model: Any) -> str:
    """The keyword ``model``'s forward takes its KV cache under: ``"cache"`` from transformers
    5.24 on (where ``past_key_values`` still works but warns that it is deprecated), else
    ``"past_key_values"``.  Read from the forward's signature (which the deprecation wrapper
    forwards), once per model class, so one code path serves 5.17 to 5.24."""
    return _cache_keyword_of(type(model).forward)


def model_device(model: Any) -> torch.device:
    """The device of the model's first parameter."""
    device: torch.device = next(model.parameters()).device
    return device


def model_dtype(model: Any) -> torch.dtype:
    """The model's ``dtype`` (its first parameter's when it has none)."""
    dtype = getattr(model, "dtype", None)
    return dtype if isinstance(dtype, torch.dtype) else next(model.parameters()).dtype


def offset_positions(model: Any) -> int | None:
    """The padding index of a position table whose positions start after it (RoBERTa, XLM-R, CamemBERT,
    Data2VecText: ``padding_idx + 1 + i`` for the ``i``-th token), or ``None``.  The tree pass feeds position
    ids ``past + depth`` from 0; such a model numbers its own decoding from ``padding_idx + 1`` (node logits
    off by 0.3 on a tiny RobertaForCausalLM), so it is refused (:func:`spec.llm.adapter.check_attention`, and by this cache)."""
    modules = getattr(model, "named_modules", None)
    for name, module in modules() if modules is not None else ():
        if (isinstance(module, torch.nn.Embedding) and name.rsplit(".", 1)[-1] == "position_embeddings"
                and module.padding_idx is not None):
            return int(module.padding_idx)
    return None


def _geometry(model: Any) -> tuple[int, int, int]:
    """``(layers, kv_heads, head_dim)`` from a decoder config, refusing layer kinds this cache cannot hold."""
    cfg = getattr(model, "config", None)
    if cfg is None or not hasattr(cfg, "num_hidden_layers"):
        raise ValueError(f"model must be a transformers causal LM with a decoder config, got {type(model).__name__}")
    kinds = set(getattr(cfg, "layer_types", None) or ["full_attention"])
    if not kinds <= {"full_attention", "sliding_attention"}:
        raise ValueError(f"StaticTreeCache holds full-attention and sliding-window layers only; this model has "
                         f"{sorted(kinds)} (cache='dynamic')")
    if offset_positions(model) is not None:
        raise ValueError("this model numbers its positions from padding_idx + 1 (RoBERTa-style), and StaticTreeCache "
                         "feeds position ids from 0 (cache='dynamic')")
    if getattr(cfg, "attention_layers", None) is not None or getattr(cfg, "model_type", None) == "gpt_neo":
        raise ValueError("GPT-Neo cuts its causal band out of a fixed buffer by the number of keys it is given, and "
                         "StaticTreeCache gives every slot it has: local layers lost their context past window_size "
                         "slots, global ones failed past max_position_embeddings (cache='dynamic')")
    if query_scale_floor(cfg) is not None:
        raise ValueError("this model scales its queries by the cache length (attn_temperature_tuning), which "
                         "StaticTreeCache gives as a host integer that a captured CUDA graph would freeze "
                         "(cache='dynamic')")
    heads = int(cfg.num_attention_heads)
    if getattr(cfg, "new_decoder_architecture", False):  # Falcon's new layout caches keys for every query head
        kv_heads = heads
    elif getattr(cfg, "multi_query", False):  # one key/value head: GPTBigCode, Falcon's old layout
        kv_heads = 1
    else:
        kv_heads = int(getattr(cfg, "num_key_value_heads", None) or getattr(cfg, "num_kv_heads", None) or heads)
    head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // heads)
    return int(cfg.num_hidden_layers), kv_heads, head_dim


def weights_key(model: Any) -> tuple[tuple[int, tuple[int, ...]], ...]:
    """Where each of ``model``'s parameters and buffers lives, and its shape.  A captured graph (and a fused
    step's vocabulary sizes) are tied to those tensors: a model whose tensors were replaced
    (``resize_token_embeddings``, a parameter assigned anew) gets a new key and so new graphs when its shared
    cache or fused step is next asked for; updates in place (``load_state_dict``, an optimiser) keep it."""
    return tuple((t.data_ptr(), tuple(t.shape)) for t in itertools.chain(model.parameters(), model.buffers()))


def holds_layers(model: Any) -> bool:
    """Whether a :class:`StaticTreeCache` can hold ``model``'s layers (full or sliding-window attention only, and
    no query scaled by the cache length: Llama 4's temperature tuning)."""
    try:
        _geometry(model)
    except ValueError:
        return False
    return True


def _round_capacity(n: int) -> int:
    return max(CAPACITY_STEP, math.ceil(n / CAPACITY_STEP) * CAPACITY_STEP)


@dataclass
class _Size:
    """Static inputs (and, once captured, the graph and its output) of forwards padded to ``size`` tokens.

    ``index``, ``allowed`` and ``near`` are views of one byte buffer ``staged``,
    so a forward uploads its host inputs in one copy (:meth:`StaticTreeCache._upload`).
    ``near`` and ``near_mask`` exist for a model that takes its masks by layer
    kind: they are its ``sliding_attention`` layers' window-cut mask.
    """

    size: int
    staged: torch.Tensor  # (24 size + masks size capacity,) uint8: index's bytes, then the bool masks'
    index: torch.Tensor  # (3, size) int64 view of staged: token ids, position ids, write slots
    allowed: torch.Tensor  # (size, capacity) bool view of staged: the slots each row may see
    mask: torch.Tensor  # (1, 1, size, capacity) additive, model dtype
    near: torch.Tensor | None = None  # (size, capacity) bool view of staged: the windowed layers' slots
    near_mask: torch.Tensor | None = None  # (1, 1, size, capacity) additive
    graph: Any = None  # torch.cuda.CUDAGraph once captured
    logits: torch.Tensor | None = None  # the captured forward's output (1, size, V)


def _index_view(staged: Any, size: int) -> Any:
    """The ``(3, size)`` int64 head of a staging buffer (a torch tensor or its numpy twin)."""
    head = staged[: 24 * size]
    return (head.view(torch.int64) if isinstance(head, torch.Tensor) else head.view(np.int64)).reshape(3, size)


def _allowed_view(staged: Any, size: int, capacity: int, which: int = 0) -> Any:
    """Bool mask ``which`` (``(size, capacity)``) of a staging buffer's tail: 0 the full mask, 1 the window's."""
    tail = staged[24 * size + which * size * capacity : 24 * size + (which + 1) * size * capacity]
    return (tail.view(torch.bool) if isinstance(tail, torch.Tensor) else tail.view(np.bool_)).reshape(size, capacity)


class StaticTreeCache:
    """Fixed-capacity KV cache for one model, written at explicit slots (module doc).

    ``capacity`` is the number of slots (rounded up to a multiple of
    :data:`CAPACITY_STEP`); a forward that would pass it grows the buffers
    (doubling; captured graphs are dropped and re-captured).  ``graphs``:
    capture CUDA graphs (default: when the model is on CUDA; ``True`` off
    CUDA is a ``ValueError``).  ``pad``: pad forwards of ≤ ``max_graph_tokens``
    tokens to a power of two (default: as ``graphs``; ``pad=True`` without
    graphs exercises the padding on the CPU).  ``length`` is the number of
    context positions held, slots ``[0, length)``.
    """

    def __init__(self, model: Any, capacity: int, *, graphs: bool | None = None, pad: bool | None = None,
                 max_graph_tokens: int = MAX_GRAPH_TOKENS) -> None:
        self._model_ref: Callable[[], Any] = lambda: model  # weak for a shared cache (hold_weakly)
        self.weights = weights_key(model)
        self._keyword = cache_keyword(model)
        self.layers, self.kv_heads, self.head_dim = _geometry(model)
        self.window = attention_window(model)
        self._masks = 2 if self.window is not None and self.window.by_kind else 1  # bool masks a forward stages
        self.device = model_device(model)
        self.dtype = model_dtype(model)
        on_cuda = self.device.type == "cuda"
        if graphs and not on_cuda:
            raise ValueError(f"graphs=True needs a CUDA model; this one is on {self.device}")
        self.graphs = on_cuda if graphs is None else bool(graphs)
        self.pad = self.graphs if pad is None else bool(pad)
        if self.graphs and not self.pad:
            raise ValueError("graphs=True needs pad=True: a graph is captured per padded size")
        self.max_graph_tokens = check_int("max_graph_tokens", max_graph_tokens, minimum=1)
        self.capacity = 0
        self.kv = torch.zeros(0)
        self.length = 0
        self.captures = 0  # graphs captured so far (tests, benchmarks)
        self._sizes: dict[int, _Size] = {}
        self._slots: torch.Tensor | None = None  # write slots of the forward in flight
        self._pool: Any = None
        self.step_graphs: dict[Any, Any] = {}  # fused steps over this cache (spec.llm.step_graph.shared_chain_step)
        self._allocate(_round_capacity(check_int("capacity", capacity, minimum=1)))

    @property
    def model(self) -> Any:
        """The model this cache holds the keys and values of."""
        model = self._model_ref()
        if model is None:
            raise RuntimeError("this StaticTreeCache's model has been freed")
        return model

    def hold_weakly(self) -> None:
        """Keep only a weak reference to the model: a cache kept in a registry keyed by its model (the
        shared caches) would otherwise keep that model, and itself, alive for ever."""
        self._model_ref = weakref.ref(self.model)

    # --- the transformers cache protocol ---------------------------------------------------

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int,
               *args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """Write this forward's keys/values ``(1, H, n, D)`` at its slots; return the layer's whole buffers.

        The extra arguments (``cache_kwargs`` up to 5.23, ``kwargs=`` in 5.24) carry nothing
        a full-attention layer needs here: positions are this forward's slots."""
        if self._slots is None:
            raise RuntimeError("StaticTreeCache is written only through StaticTreeCache.forward")
        keys, values = self.kv[layer_idx, 0], self.kv[layer_idx, 1]  # (1, H, capacity, D) views
        if key_states.shape[1] != keys.shape[-3] or key_states.shape[-1] != keys.shape[-1]:
            raise ValueError(f"layer {layer_idx} gives keys of shape {tuple(key_states.shape)}, but the static cache was "
                             f"sized from the config for {keys.shape[-3]} key/value heads of {keys.shape[-1]}; "
                             f"use cache='dynamic' for this model")
        keys.index_copy_(-2, self._slots, key_states.to(keys.dtype))
        values.index_copy_(-2, self._slots, value_states.to(values.dtype))
        return keys, values

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.length

    def __len__(self) -> int:
        return self.layers

    # --- forwards ------------------------------------------------------------------------

    def forward(self, tokens: Sequence[int] | torch.Tensor, positions: Sequence[int] | NDArray[np.int64],
                allowed: NDArray[np.bool_], near: NDArray[np.bool_] | None = None) -> torch.Tensor:
        """Logits ``(n, V)`` of ``tokens`` fed after the ``length`` cached positions; ``length += n``.

        ``positions`` are their position ids and ``allowed`` the
        ``(n, length + n)`` bool mask over the context and the new tokens
        (checked by the caller, :func:`spec.llm.adapter.forward_masked`).
        ``near``: for a model with a sliding window, ``allowed`` cut to the
        window (:func:`spec.llm.windows.windowed`; ``None`` when it cuts
        nothing); it goes to every layer, or to the ``sliding_attention``
        layers of a model that takes its masks by layer kind.
        ``tokens`` may be an int64 tensor on the model's device (ids in range,
        the caller's duty): it is copied on the device, with no host sync.
        """
        n, have = len(tokens), self.length
        if n == 0:
            raise ValueError("tokens must not be empty")
        if near is not None and self.window is None:
            raise ValueError("near is a sliding window's mask, and this model has no sliding window")
        if have + n > self.capacity:
            self._allocate(_round_capacity(max(have + n, 2 * self.capacity)))
        size = 1 << (n - 1).bit_length()  # next power of two
        padded = self.pad and size <= self.max_graph_tokens and have + size <= self.capacity
        if not padded:
            size = n
        kept = size <= self.max_graph_tokens  # small forwards keep their buffers, padded or not
        buf = self._sizes.get(size) if kept else None
        if buf is None:
            buf = self._new_size(size)
            if kept:
                self._sizes[size] = buf
        graphed = padded and self.graphs
        staged = np.zeros(buf.staged.shape[0], dtype=np.uint8)
        index = _index_view(staged, size)
        if not isinstance(tokens, torch.Tensor):
            index[0, :n] = np.asarray(tokens, dtype=np.int64)
        index[1, :n] = np.asarray(positions, dtype=np.int64)
        index[2] = np.arange(have, have + size)
        # one mask for every layer (the window's when it windows them all), or the full one and the window's
        cut = allowed if near is None else near
        for which, rows in enumerate([cut] if self._masks == 1 else [allowed, cut]):
            mask = _allowed_view(staged, size, self.capacity, which)
            mask[:n, : have + n] = rows
            mask[n:, 0] = True  # padding rows: any one open slot keeps their softmax finite
        self._upload(buf.staged, staged)
        if isinstance(tokens, torch.Tensor):
            buf.index[0, :n].copy_(tokens)
        with torch.no_grad():
            if graphed:
                if buf.graph is None:
                    self._capture(buf)
                buf.graph.replay()
                assert buf.logits is not None
                logits = buf.logits[0, :n].clone()
            else:
                logits = self._eager(buf)[0, :n]
        self.length = have + n
        return logits

    def _upload(self, dst: torch.Tensor, arr: NDArray[Any]) -> None:
        """Copy a host array into a device buffer without waiting for the device.

        On CUDA a plain ``copy_`` from pageable memory synchronises the stream;
        from pinned memory with ``non_blocking`` it is queued behind the work
        in flight (torch's pinned-memory cache keeps the block alive until the
        copy ran), so a chain drafted on the device never waits for its forwards.
        """
        src = torch.from_numpy(arr)
        if self.device.type == "cuda":
            dst.copy_(src.pin_memory(), non_blocking=True)
        else:
            dst.copy_(src)

    def _eager(self, buf: _Size) -> torch.Tensor:
        """The forward of ``buf``'s inputs; a graph captures it whole, the additive mask's conversion included."""
        torch.where(buf.allowed, self._open, self._closed, out=buf.mask[0, 0])
        mask: torch.Tensor | dict[str, torch.Tensor] = buf.mask
        if buf.near is not None and buf.near_mask is not None:  # each layer takes the entry of its kind
            torch.where(buf.near, self._open, self._closed, out=buf.near_mask[0, 0])
            mask = {"full_attention": buf.mask, "sliding_attention": buf.near_mask}
        self._slots = buf.index[2]
        try:
            out = self.model(input_ids=buf.index[0:1], attention_mask=mask, position_ids=buf.index[1:2],
                             use_cache=True, **{self._keyword: self})
        finally:
            self._slots = None
        logits: torch.Tensor = out.logits
        return logits

    def _capture(self, buf: _Size) -> None:
        """Warm up on a side stream (twice), then capture the forward of ``buf`` into a CUDA graph."""
        stream = torch.cuda.Stream(self.device)  # type: ignore[no-untyped-call]
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for _ in range(2):
                self._eager(buf)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            buf.logits = self._eager(buf)
        buf.graph = graph
        self.captures += 1

    # --- keeping and dropping positions --------------------------------------------------

    def select(self, indices: NDArray[np.int64]) -> None:
        """Keep positions ``indices`` (strictly increasing, validated by the caller) as slots ``0..len-1``."""
        idx = np.asarray(indices, dtype=np.int64)
        moved = np.flatnonzero(idx != np.arange(len(idx)))
        prefix = int(moved[0]) if moved.size else len(idx)
        if prefix < len(idx):
            tail = torch.as_tensor(idx[prefix:], device=self.device)
            self.kv[..., prefix : len(idx), :] = self.kv.index_select(-2, tail)
        self.length = len(idx)

    def trim(self, length: int) -> None:
        """Keep the first ``length`` positions."""
        length = check_int("length", length, minimum=0)
        if length > self.length:
            raise ValueError(f"length {length} exceeds the {self.length} positions the cache holds")
        self.length = length

    def reset(self) -> StaticTreeCache:
        """Empty the cache (buffers and captured graphs are kept); returns it."""
        self.length = 0
        return self

    # --- buffers -------------------------------------------------------------------------

    def _allocate(self, capacity: int) -> None:
        # plain tensors even under torch.inference_mode(): the cache may be reused outside it
        with torch.inference_mode(False), torch.no_grad():
            self._allocate_buffers(capacity)

    def _allocate_buffers(self, capacity: int) -> None:
        shape = (self.layers, 2, 1, self.kv_heads, capacity, self.head_dim)
        size = math.prod(shape) * torch.finfo(self.dtype).bits // 8
        too_big = MemoryError(f"the static cache of {capacity:,} slots needs {size / 2**30:,.1f} GiB on "
                              f"{self.device}: shorten the decode (max_new_tokens) or use cache='dynamic'")
        if size > MAX_CACHE_BYTES:  # past any device (torch's own errors there: size overflows, int64 unpacking)
            raise too_big
        try:
            kv = torch.zeros(shape, dtype=self.dtype, device=self.device)
        except RuntimeError as err:  # torch.OutOfMemoryError is one; the CPU allocator's "can't allocate" too
            if "alloc" not in str(err).lower() and not isinstance(err, getattr(torch, "OutOfMemoryError", ())):
                raise
            raise too_big from None
        if self.length:
            kv[..., : self.length, :] = self.kv[..., : self.length, :]
        self.kv, self.capacity = kv, capacity
        self._sizes.clear()  # graphs point at the old buffers
        self._pool = None  # freed with its last graph: a new capture needs a new pool
        self._open = torch.zeros((), dtype=self.dtype, device=self.device)
        self._closed = torch.full((), torch.finfo(self.dtype).min, dtype=self.dtype, device=self.device)

    def _new_size(self, size: int) -> _Size:
        dev = self.device
        cap, masks = self.capacity, self._masks
        with torch.inference_mode(False):
            staged = torch.zeros(24 * size + masks * size * cap, dtype=torch.uint8, device=dev)
            buf = _Size(size, staged, _index_view(staged, size), _allowed_view(staged, size, cap),
                        torch.zeros((1, 1, size, cap), dtype=self.dtype, device=dev))
            if masks == 2:
                buf.near = _allowed_view(staged, size, cap, 1)
                buf.near_mask = torch.zeros((1, 1, size, cap), dtype=self.dtype, device=dev)
            return buf


_SHARED: weakref.WeakKeyDictionary[Any, dict[tuple[str, bool], StaticTreeCache]] = weakref.WeakKeyDictionary()


def shared_static_cache(model: Any, role: str, capacity: int, *, graphs: bool | None = None) -> StaticTreeCache:
    """An empty :class:`StaticTreeCache` for ``model`` in ``role`` (e.g. ``"target"``/``"draft"``), reused across calls.

    Captured graphs stay with the cache, so only the first decode of a model
    pays for capture.  One cache per model, role and graph setting; it grows on demand when ``capacity`` is larger.  The same model in two
    roles (self-speculation) gets two caches.  A model whose tensors were replaced since (:func:`weights_key`) gets a
    new cache, so no graph captured over the old tensors replays.  The registry holds models weakly and each cache
    holds its model weakly (:meth:`StaticTreeCache.hold_weakly`), so a model no one else holds is freed with its
    caches and the fused steps kept on them.
    """
    per_model = _SHARED.setdefault(model, {})
    key = (role, model_device(model).type == "cuda" if graphs is None else bool(graphs))
    cache = per_model.get(key)
    if (cache is None or cache.device != model_device(model) or cache.dtype != model_dtype(model)
            or cache.weights != weights_key(model)):
        cache = StaticTreeCache(model, capacity, graphs=graphs)
        cache.hold_weakly()
        per_model[key] = cache
    cache.reset()
    if cache.capacity < capacity:
        cache._allocate(_round_capacity(capacity))
    return cache
