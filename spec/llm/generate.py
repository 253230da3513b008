"""Speculative decoding with any builder × lossless verifier on a Hugging Face model pair (DESIGN.md §8).

One step:

1. the **builder** grows a draft tree, asking the draft LM for one tree layer
   per call (:class:`spec.llm.adapter.LLMDraft`: one batched forward per call);
   the rows it samples from are the *processed* draft law (temperature, top-k,
   top-p applied by :class:`spec.llm.sampling.Sampling`, the same settings as
   the target's unless ``draft_temperature`` sets the draft's own);
2. the **target** scores the root and every node in ONE forward over the
   flattened tree (:func:`spec.llm.adapter.tree_logits`: 4D tree mask, depth
   position ids), and the same processing turns its logits into ``p`` rows;
3. a **torch verifier** (:mod:`spec.llm.verify`, equal to the numpy reference
   on identical noise) emits the accepted drafts plus one token, from fresh
   uniforms drawn from the one seeded generator;
4. both KV caches keep exactly the context + the accepted path (gather,
   :func:`spec.llm.adapter.select_cache`; the emitted last token is fed as the
   next step's root), and a stateful builder (DynaTree) updates its state.

The caches are ``DynamicCache`` or, by default on CUDA, the static cache of
:mod:`spec.llm.static_cache`, whose forwards replay captured CUDA graphs.
Chains, fixed i.i.d. trees (whose shapes no draw can change) and fixed
top-k trees on rows with full support skip the host builder in step 1: they
are drawn (or ranked) on the models' device with the same uniforms
(``chain_on_device``, :meth:`spec.llm.adapter.LLMDraft.draft_tree`).

Because every step is a lossless verification of a tree whose nodes record
the law they were drawn from, the output law is the target's (processed)
law; at temperature 0 every builder × verifier reproduces greedy decoding
token for token (tested).  An EOS token ends generation (tokens after it in
the same step are dropped), and a step that would pass ``max_new_tokens`` is
cut: a prefix of an exact sample is an exact sample of the prefix.  ``eos_token_id`` may
name several stop tokens (Llama 3's generation config lists three).

Batch size 1.  Notation: ``p`` target, ``q`` draft (DESIGN.md §3).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from numpy.typing import NDArray
from transformers import DynamicCache

from spec.acceptance import verifiers_for
from spec.builders import (
    ChainBuilder, DynaTreeBuilder, DySpecBuilder, DySpecThresholdBuilder, FixedBuilder, TreeBuilder, WetapBuilder,
    make_builder,
)
from spec.llm.adapter import (
    LLMDraft, check_attention, check_positions, check_span, exact_tree_nodes, forward_masked, forward_unchecked,
    query_scale_floor, rope_switches, select_cache, sync, tree_logits, trim_cache,
)
from spec.llm.host_verify import verify_chain_numpy, verify_tree_numpy
from spec.llm.sampling import Sampling, logits_of, step_fault
from spec.llm.static_cache import (StaticTreeCache, cache_keyword, holds_layers, model_device, model_dtype,
                                   shared_static_cache)
from spec.llm.step_graph import COMPILE_SCOPES, ChainStepGraph, shared_chain_step
from spec.llm.tree_device import DEVICE_TREE_METHODS, TreePlan, read_head, tree_head, walks_on_device
from spec.llm.tree_step_graph import FUSED_DRAWS, TreeStepGraph, shared_tree_step
from spec.llm.verify import (
    CHAIN_METHODS,
    TREE_METHODS,
    Verified,
    noise_size,
    verify_chain,
    verify_chain_on_device,
    verify_tree,
)
from spec.randomness import RngSampler
from spec.tree import bfs_order, dfs_order, keep_indices, position_ids, tree_mask
from tmc.multidraft import DraftTree, Draw
from tmc.noise import categorical
from tmc.validate import check_int

__all__ = [
    "CACHES", "GenerateOutput", "HOST_VERIFY_MAX_ENTRIES", "StepStats", "VERIFIERS", "VERIFY_BACKENDS", "ar_generate",
    "cache_capacity", "generate", "resolve_cache", "resolve_verify_backend", "stop_ids",
]

#: Verifier names ``generate`` accepts: the chain ones need a chain builder.
VERIFIERS: tuple[str, ...] = CHAIN_METHODS + TREE_METHODS
ORDERS = ("dfs", "bfs", "index")
#: KV cache kinds ``generate`` accepts (``auto``: static on CUDA, dynamic elsewhere and for layer kinds it cannot hold).
CACHES = ("auto", "dynamic", "static")

#: The most draft nodes a step may hold: its tree pass builds a ``budget × (context + budget)`` mask and
#: attention, and ``--budget 100000`` (a 10,709-node DySpec tree) took the 23 GiB of this machine until the
#: kernel killed the process, with no message.  Published trees stay below 1,000 nodes.
MAX_BUDGET = 4096
#: Verifier implementations ``generate`` accepts (``auto``: :func:`resolve_verify_backend`).
VERIFY_BACKENDS = ("auto", "torch", "numpy", "device")
#: ``auto``'s bound for a chain drafted on a GPU: the numpy references while a step's target rows,
#: ``(budget + 1) x V`` float64 entries, number at most this (1 MiB), the torch ports above it.
#: Measured on an H100 host (README, "Which implementation verifies"): numpy won at V = 4096 with
#: 5 and 21 rows (SpS 0.35 against 1.26 ms, 0.74 against 1.19 ms), tied with SpS at V = 32000
#: with 5 rows, and lost from there on (SpS at V = 128256: 11.6 against 1.1 ms).
HOST_VERIFY_MAX_ENTRIES = 1 << 17
#: The ``torch.compile`` backend of ``compile_step=True`` (the CPU tests trace with ``"eager"``: no code generation).
COMPILE_BACKEND = "inductor"

@dataclass(frozen=True)
class StepStats:
    """One decode step."""

    tree_size: int  # draft nodes built
    accepted: int  # draft tokens accepted and emitted (a step cut by EOS / max_new_tokens counts those kept)
    emitted: int  # tokens this step added to the output (after EOS / length cuts)
    draft_forwards: int  # draft LM forward passes (one per tree layer; with a void fused step's, when one was redone)
    build_s: float  # builder time, draft forwards included
    target_s: float  # the one target forward over the tree
    verify_s: float  # the verifier
    draft_s: float = 0.0  # the draft forwards (part of build_s)
    graph_s: float = 0.0  # a fused step (step_graph): all of it, not split into the parts above
    loop_s: float = 0.0  # after the verifier: the target cache kept to the accepted path, the draft's step ended
    # (host time: on a GPU the moves' device time falls in the next step's build_s, whose draft forward waits)

@dataclass(frozen=True)
class GenerateOutput:
    """New tokens and per-step statistics."""

    tokens: list[int]
    steps: list[StepStats] = field(default_factory=list)
    prefill_s: float = 0.0
    total_s: float = 0.0

    @property
    def tokens_per_step(self) -> float:
        return len(self.tokens) / max(1, len(self.steps))

    def summary(self) -> dict[str, float]:
        s = self.steps
        return {
            "new_tokens": float(len(self.tokens)),
            "steps": float(len(s)),
            "tokens_per_step": self.tokens_per_step,
            "mean_tree_size": float(np.mean([x.tree_size for x in s])) if s else 0.0,
            "build_s": float(sum(x.build_s for x in s)),
            "draft_s": float(sum(x.draft_s for x in s)),
            "target_s": float(sum(x.target_s for x in s)),
            "verify_s": float(sum(x.verify_s for x in s)),
            "graph_s": float(sum(x.graph_s for x in s)),
            "loop_s": float(sum(x.loop_s for x in s)),
            "total_s": self.total_s,
            "tokens_per_s": len(self.tokens) / self.total_s if self.total_s > 0 else 0.0,
        }

def _prompt(input_ids: Any, vocab: int) -> list[int]:
    if isinstance(input_ids, (torch.Tensor, np.ndarray)):
        if isinstance(input_ids, torch.Tensor) and (input_ids.is_meta or input_ids.layout != torch.strided):
            raise ValueError(f"input_ids must be a dense tensor with data, got a {input_ids.layout} tensor on "
                             f"{input_ids.device}")
        if input_ids.ndim == 2:  # (1, n), as a tokenizer's return_tensors="pt" or "np" gives
            if input_ids.shape[0] != 1:
                raise ValueError(f"input_ids: batch size 1 only, got shape {tuple(input_ids.shape)}")
            input_ids = input_ids[0]
        if input_ids.ndim != 1:
            raise ValueError(f"input_ids must be a 1-D sequence of token ids (or one row of shape (1, n)), "
                             f"got shape {tuple(input_ids.shape)}")
        # token ids are integers: a float tensor (bf16 / fp16 ids past 256 / 2048 already rounded) is refused
        if isinstance(input_ids, torch.Tensor):
            integral = not (input_ids.is_floating_point() or input_ids.is_complex() or input_ids.dtype == torch.bool)
        else:
            integral = bool(np.issubdtype(input_ids.dtype, np.integer))
        if not integral:
            raise ValueError(f"input_ids must hold integer token ids, got a tensor of dtype {input_ids.dtype}")
        input_ids = input_ids.tolist()
    # an ordered sequence: a set or dict has no order, and bytes-like ids would be bytes, not token ids
    if isinstance(input_ids, (str, bytes, bytearray, memoryview)) or not isinstance(input_ids, Sequence):
        raise ValueError(f"input_ids must be a sequence of token ids (a list, tuple, tensor or array), got "
                         f"{type(input_ids).__name__} {input_ids!r}")
    if input_ids and isinstance(input_ids[0], (list, tuple)):  # [[5, 6]]: a batch as lists
        if len(input_ids) != 1:
            raise ValueError(f"input_ids: batch size 1 only, got {len(input_ids)} rows")
        input_ids = input_ids[0]
    ids = [check_int(f"input_ids[{i}]", t, minimum=0) for i, t in enumerate(input_ids)]
    if not ids:
        raise ValueError("input_ids must hold at least one token")
    bad = [t for t in ids if t >= vocab]
    if bad:
        raise ValueError(f"input_ids hold tokens outside the vocabulary [0, {vocab}): {bad[:5]}")
    return ids

def stop_ids(eos_token_id: Any, vocab: int) -> frozenset[int]:
    """The stop tokens ``eos_token_id`` names: ``None`` (none), one id, or a collection of ids, any of which
    ends generation (as a list in ``generation_config.eos_token_id`` does in transformers).  Each id must be
    an integer in ``[0, vocab)``; ``ValueError`` names the one that is not."""
    if eos_token_id is None:
        return frozenset()
    if isinstance(eos_token_id, (torch.Tensor, np.ndarray)):
        eos_token_id = eos_token_id.tolist()
    if isinstance(eos_token_id, (str, bytes, Mapping)):  # a dict's keys are no stop list anyone meant
        raise ValueError(f"eos_token_id must be None, a token id or a collection of token ids, got {eos_token_id!r}")
    if isinstance(eos_token_id, Iterable):
        named = [(f"eos_token_id[{i}]", t) for i, t in enumerate(eos_token_id)]
    else:
        named = [("eos_token_id", eos_token_id)]
    stops: set[int] = set()
    for name, value in named:
        tok = check_int(name, value, minimum=0)
        if tok >= vocab:
            raise ValueError(f"{name} = {tok} is outside the vocabulary [0, {vocab})")
        stops.add(tok)
    return frozenset(stops)

def _cut_at_stop(tokens: list[int], stops: frozenset[int]) -> tuple[list[int], bool]:
    """``tokens`` up to and including the first stop token, and whether one was met."""
    if not stops or stops.isdisjoint(tokens):
        return tokens, False
    for i, t in enumerate(tokens):
        if t in stops:
            return tokens[: i + 1], True
    return tokens, False

def _vocab(model: Any, name: str) -> int:
    try:
        vocab = int(model.config.vocab_size)
    except AttributeError:
        raise ValueError(f"{name} must be a transformers causal LM (with .config.vocab_size)") from None
    if getattr(model, "training", False) is True:  # dropout on: each forward another law, temperature 0 not greedy
        raise ValueError(f"{name} is in training mode (dropout would change every forward): call {name}.eval() "
                         f"first (from_pretrained and spec.llm.models return models in eval mode)")
    return vocab

def _order(tree: DraftTree, order: str) -> Sequence[int] | None:
    return dfs_order(tree) if order == "dfs" else bfs_order(tree) if order == "bfs" else None

def _draft_probs(tree: DraftTree, vocab: int) -> torch.Tensor | None:
    """``(N + 1, V)`` draft rows in the verifiers' layout (``None`` when every node is ``topk``)."""
    if all(d == Draw.TOPK for d in tree.draws):
        return None
    rows = np.zeros((tree.size + 1, vocab))
    for node, row in tree.q_rows.items():
        rows[node + 1] = row
    return torch.from_numpy(rows)

def _is_chain(tree: DraftTree) -> bool:
    return _chain_parents(tree.parents)


def _chain_parents(parents: Sequence[int]) -> bool:
    """Whether ``parents`` make a chain: each node the child of the one before."""
    return all(par == i - 1 for i, par in enumerate(parents))

def resolve_cache(model: Any, cache: str, *others: Any) -> str:
    """``cache`` checked against :data:`CACHES`, with ``auto`` read as ``static`` on CUDA and ``dynamic``
    elsewhere, or where ``model`` or one of ``others`` has layers a static cache cannot hold (layer kinds
    other than full and sliding-window attention: :func:`~spec.llm.static_cache.holds_layers`)."""
    if cache not in CACHES:
        raise ValueError(f"cache must be one of {CACHES}, got {cache!r}")
    if cache == "auto":
        static = model_device(model).type == "cuda" and all(holds_layers(m) for m in (model, *others))
        return "static" if static else "dynamic"
    return cache

def cache_capacity(prompt_tokens: int, max_new_tokens: int, budget: int = 0, fed: int = 0) -> int:
    """The slots a decode asks of its KV caches up front: :func:`generate` with ``budget`` draft
    nodes a step, :func:`ar_generate` with ``budget = 0``; the draft's cache with ``fed``, the
    nodes a step may feed it (:meth:`TreeBuilder.draft_nodes <spec.builders.base.TreeBuilder.draft_nodes>`:
    WETAP's unpruned layers), where they outnumber ``budget``.

    A static cache grows past it on demand, and growing drops its captured graphs (they point at
    the old buffers); a benchmark sizes the shared caches to the largest of its runs before its
    warm-up (:func:`spec.bench_decode.run_decode_bench`), so no timed run captures again.
    """
    return prompt_tokens + max_new_tokens + 4 * budget + max(0, fed - budget) + 64


def _new_cache(model: Any, kind: str, role: str, capacity: int, graphs: bool | None) -> Any:
    """An empty KV cache of a resolved ``kind``: ``DynamicCache`` or the model's shared
    :class:`~spec.llm.static_cache.StaticTreeCache`."""
    if graphs is not None and not isinstance(graphs, bool):
        raise ValueError(f"graphs must be None, True or False, got {graphs!r}")
    if kind == "dynamic":
        if graphs:
            raise ValueError("graphs=True needs cache='static' (a DynamicCache changes shape every step)")
        return DynamicCache()
    return shared_static_cache(model, role, capacity, graphs=graphs)

def _prefill(model: Any, cache: Any, tokens: Sequence[int]) -> None:
    """Feed ``tokens`` causally into an empty cache (a ``DynamicCache`` through the model's own causal mask)."""
    if tokens and isinstance(cache, DynamicCache):
        with torch.no_grad():
            model(input_ids=torch.tensor([list(tokens)], device=model_device(model)), use_cache=True,
                  **{cache_keyword(model): cache})
    elif tokens:
        n = len(tokens)
        forward_masked(model, cache, tokens, np.arange(n), np.tril(np.ones((n, n), dtype=bool)))


def _switches_passed(switches: Sequence[int], position: int) -> int:
    """How many of a ``longrope`` model's switches (:func:`~spec.llm.adapter.rope_switches`) a forward reaching
    ``position`` has passed: its factors are those of that many switches."""
    return sum(position >= s for s in switches)


def _recompute(model: Any, cache: Any, context: Sequence[int]) -> None:
    """Refill ``cache`` with all of ``context`` but its last token, computed in ONE forward over all of it.

    At a ``longrope`` switch (:func:`~spec.llm.adapter.rope_switches`): the forward reaches the last token's
    position, so every cached key takes the factors past the switch, as in Phi-3's own ``generate``, which drops
    its cache there; the last token (the next step's root) is fed again by that step."""
    trim_cache(cache, 0)
    _prefill(model, cache, context)
    trim_cache(cache, len(context) - 1)


def _draw(logits: torch.Tensor, sampling: Sampling, rng: np.random.Generator) -> int:
    """One token from the target's processed row ``logits`` ``(V,)``, by inverse CDF on one fresh uniform."""
    with logits_of("target"):
        probs = sampling.probs(logits).cpu().numpy()
    return categorical(probs, float(rng.random()))


def _root_step(target: Any, cache: Any, past: int, root: int, sampling: Sampling, rng: np.random.Generator,
               where: tuple[torch.device, torch.dtype]) -> Verified:
    """A step of no draft nodes: the target's row after the root alone, and a token drawn from it (the law of
    plain decoding).  The step whose root sits right before a ``longrope`` switch takes it: a node past the
    switch would need the other factors in the same forward."""
    logits = forward_masked(target, cache, [root], [past], np.ones((1, past + 1), dtype=bool), where=where)[0]
    return Verified(torch.tensor([_draw(logits, sampling, rng)], device=logits.device), 0, ())


def _verify(method: str, tree: DraftTree, p: torch.Tensor, rng: np.random.Generator, adaptive: bool,
            backend: str) -> Verified:
    """One verification of a host-built tree: the torch port or (``backend == "numpy"``) its numpy reference."""
    u_np = rng.random(noise_size(method, tree.size))
    vocab = p.shape[-1]
    if method in CHAIN_METHODS:
        if not _is_chain(tree) or any(d == Draw.SWOR for d in tree.draws):
            raise ValueError(f"verifier {method!r} verifies chains; use a chain builder or a tree verifier")
        q = _draft_probs(tree, vocab)
        q_chain = None if q is None else q[: tree.size]  # row i: law of token i
        if backend == "numpy":
            # trusted: p from checked logits, the rows of a validated DraftTree, tokens drawn from them
            return verify_chain_numpy(method, tree.tokens, None if q_chain is None else q_chain.numpy(),
                                      p.cpu().numpy(), u_np, trusted=True)
        u = torch.from_numpy(u_np).to(p.device)
        return verify_chain(method, torch.tensor(tree.tokens, dtype=torch.long),
                            None if q_chain is None else q_chain.to(p.device), p, u)
    verifiers_for(method, set(tree.draws), adaptive)  # ValueError when not lossless on these trees
    if backend == "numpy":
        return verify_tree_numpy(method, tree, p.cpu().numpy(), u_np)
    return verify_tree(method, torch.tensor(tree.tokens, dtype=torch.long), torch.tensor(tree.parents, dtype=torch.long),
                       tree.draws, _draft_probs(tree, vocab), p, torch.from_numpy(u_np))

def resolve_verify_backend(model: Any, backend: str, device_chain: bool, entries: int = 0) -> str:
    """``backend`` checked against :data:`VERIFY_BACKENDS`, with ``auto`` resolved.

    ``auto`` is ``numpy`` on the CPU, and for the tree verifiers everywhere
    (on trees and on chains), which walk on the host either way (the torch
    ports after one copy of the rows), where numpy's small operations cost a
    third of torch's.  For a chain drafted on a GPU and verified by a chain
    verifier (``device_chain``) it weighs the copy: the numpy references
    read host copies of the step's rows, whose cost grows with ``entries``
    (the target rows' ``(budget + 1) x V``), while the torch ports keep the
    step on the device at a nearly fixed 0.6-1.8 ms of dispatches on an
    H100 host (``tmc bench verify``).  So ``numpy`` up to
    :data:`HOST_VERIFY_MAX_ENTRIES` entries, ``torch`` above.
    """
    if backend not in VERIFY_BACKENDS:
        raise ValueError(f"verify_backend must be one of {VERIFY_BACKENDS}, got {backend!r}")
    if backend == "auto":
        large = device_chain and model_device(model).type != "cpu" and entries > HOST_VERIFY_MAX_ENTRIES
        return "torch" if large else "numpy"
    return backend


def _device_chain(b: TreeBuilder, verifier: str) -> bool:
    """Whether a step can be drafted and verified on the device (:func:`_chain_step`): a
    :class:`ChainBuilder` itself (a subclass may draw otherwise) with a chain verifier."""
    return type(b) is ChainBuilder and verifier in CHAIN_METHODS


def _fused_tree(fixed_shape: tuple[tuple[int, ...], Draw] | None, verifier: str) -> bool:
    """Whether ``step_graph=True`` runs :class:`TreeStepGraph`: a shape drafted on the device, drawn i.i.d.,
    without replacement or ranked (:data:`~spec.llm.tree_step_graph.FUSED_DRAWS`), verified by a tree verifier
    walked on the device."""
    return fixed_shape is not None and fixed_shape[1] in FUSED_DRAWS and walks_on_device(verifier, *fixed_shape)


def _step_graph_refusal(b: TreeBuilder, verifier: str, chain_on_device: bool, cache: str, backend: str,
                        fixed_shape: tuple[tuple[int, ...], Draw] | None) -> str | None:
    """What keeps ``step_graph=True`` from running (:class:`ChainStepGraph`'s or :class:`TreeStepGraph`'s
    needs), or ``None`` when nothing does."""
    if not chain_on_device:
        return "step_graph=True drafts on the device: it needs chain_on_device=True"
    # not a tree step: then a chain verifier's ChainStepGraph (a tree verifier on a chain is a tree step, since
    # every device walk takes a chain)
    if not _fused_tree(fixed_shape, verifier):
        tree = (f"or {' / '.join(DEVICE_TREE_METHODS)} on a 'fixed' (or 'chain') tree drafted on the device, drawn "
                "iid, or topk / swor from draft rows that keep width tokens (draft temperature above 0, no top-p, "
                "top-k >= width; ordered_traversal: at most 2 children a node drawn swor), or on the chain a fixed, "
                "DySpec, DynaTree or WETAP builder grows from a greedy draft")
        if type(b) is not ChainBuilder or b.confidence is not None:
            return (f"step_graph=True needs the 'chain' builder with no confidence stop (a chain of fixed "
                    f"length) and a chain verifier, {tree}")
    if cache != "static":
        return f"step_graph=True needs cache='static' (explicit slots), got {cache!r}"
    if backend == "numpy":
        return "step_graph=True verifies on the device: it needs verify_backend 'torch', 'device' or 'auto'"
    return None


#: Tree verifiers whose steps run fused only when ``step_graph=True`` asks, not under ``"auto"``: their device walks
#: dispatch many small operations, which a captured step runs as that many kernels unless ``compile_step`` fuses
#: them (neither timed on a GPU), where the host walk copies the rows once.  K-SEQ bisects for each node's ``ρ*``
#: in some 55 rounds (2058 operations for a 2-wide tree of 7 nodes at V = 4096); ordered Traversal sorts each
#: node's rows and forms its order-statistic laws (569; Traversal 390, multidraft 98).
ASKED_FUSION_ONLY: tuple[str, ...] = ("ordered_traversal", "kseq")


def resolve_step_graph(step_graph: bool | str, graphed: bool, refusal: str | None) -> bool:
    """Whether the steps run fused: ``True`` (refused with a ``ValueError`` naming the need when ``refusal``
    says one is missing) or ``False`` as given; ``"auto"``: fused where both caches capture CUDA graphs
    (``graphed``: static caches on CUDA, ``graphs`` not turned off) and nothing refuses it.  On an H200 the
    fused step ran 1.31-1.48x the unfused one for chains and i.i.d. trees (README, "H200, 2026-11-26"); on
    the CPU, where it runs eagerly, it gained little or lost, so ``auto`` leaves it off there."""
    if step_graph is True:
        if refusal is not None:
            raise ValueError(refusal)
        return True
    return step_graph == "auto" and graphed and refusal is None


def _greedy_chain(b: TreeBuilder, budget: int) -> tuple[int, Draw] | None:
    """The length and draw kind of the chain ``b`` grows from one-hot draft rows (a greedy draft), for the
    builders whose tree is then a chain whatever the context; ``None`` for the others.

    A one-hot row has one token with ``q > 0``, so a ``topk`` or ``swor`` node gets one child: ``fixed``
    (not ``iid``, whose draws are twins) grows a chain down to ``depth``; DySpec's draw takes the row's whole
    mass, its next sibling's value ``v · (1 − R[y])`` is 0 and its first child's ``v``, so Alg. 1 and 2
    grow a chain down to ``max_depth``; DynaTree's path probabilities are all 1, so every depth gate but
    ``D_max`` passes and nothing is pruned; WETAP's beam keeps the one candidate a layer, ``length`` layers,
    and its pruning to the budget drops the deepest leaf first (the chain's score is its depth, then the
    deepest layer is spared while a shallower leaf exists, and a chain has none).  Tested against the host
    builders (``tests/spec/llm/test_device_chain.py``).
    """
    if type(b) in (DySpecBuilder, DySpecThresholdBuilder):
        assert isinstance(b, DySpecBuilder | DySpecThresholdBuilder)
        return (budget if b.max_depth is None else min(budget, b.max_depth)), Draw.SWOR
    if type(b) is FixedBuilder and b.draw != Draw.IID:
        return (budget if b.depth is None else min(budget, b.depth)), Draw(b.draw)
    if type(b) is DynaTreeBuilder:
        return min(budget, b.max_depth), Draw.TOPK
    if type(b) is WetapBuilder:
        return min(budget, b.length), Draw.TOPK
    return None


def _device_shape(b: TreeBuilder, verifier: str, budget: int, drafting: Sampling,
                  vocab: int) -> tuple[tuple[int, ...], Draw] | None:
    """The parents of the trees ``b`` grows and how its nodes are drawn, when a tree verifier takes
    them (:func:`_tree_step`) and the shape is known before any draw: a :class:`ChainBuilder` with
    no ``confidence`` stop, a :class:`FixedBuilder` drawing ``iid`` (no draw can change the
    shape), or one drawing ``topk`` or ``swor`` from draft rows (processed by ``drafting``) that keep
    ``width`` tokens with ``q > 0``: a temperature above 0 with no top-p and no top-k below
    ``width`` (only an underflow to 0 can then cut a row short; the step sees it and takes the
    host path), or one child a node.  From a greedy draft, also the chains of :func:`_greedy_chain`
    (``fixed``, DySpec, DynaTree, WETAP), whose draft calls the host builder made one node at a
    time.  The classes themselves: a subclass may grow otherwise.  Else ``None``."""
    if verifier not in TREE_METHODS:
        return None
    if type(b) is ChainBuilder:  # a chain that may stop early has no fixed shape: the host path
        return None if b.confidence is not None else (tuple(range(-1, budget - 1)), Draw(b.draw))
    chain = _greedy_chain(b, budget) if drafting.greedy else None
    if chain is not None:
        return tuple(range(-1, chain[0] - 1)), chain[1]
    if type(b) is not FixedBuilder:
        return None
    kind = Draw(b.draw)
    full_rows = (drafting.temperature > 0 and drafting.top_p is None and b.width <= vocab
                 and (drafting.top_k is None or drafting.top_k >= b.width))
    if kind == Draw.IID or b.width == 1 or full_rows:  # one sibling: a ranked or swor child is always there
        return b.full_shape(budget), kind
    return None


@dataclass(frozen=True)
class _Shape:
    """A fixed tree shape laid out for the target forward, computed once per decode: only the
    cache length in front of it changes from step to step."""

    parents: tuple[int, ...]
    kind: Draw  # how every node is drawn (iid, or topk: ranked)
    order: tuple[int, ...]  # flattened layout (dfs / bfs / index)
    mask: NDArray[np.bool_]  # (N + 1, N + 1) root + flattened tree: ancestors and self (spec.tree.tree_mask)
    depths: NDArray[np.int64]  # position of the root and of each flattened node after 0 cached tokens
    ids: torch.Tensor  # node of each flattened position, on the device
    rows: torch.Tensor  # flattened position of the root (0) and of each node in index order, on the device
    skeleton: DraftTree  # the shape with placeholder tokens (for spec.tree.keep_indices)
    plan: TreePlan | None  # the device walk's tables (spec.llm.tree_device), when the step verifies with it

    @classmethod
    def of(cls, parents: tuple[int, ...], kind: Draw, order: str, vocab: int, device: torch.device,
           walk: bool = False) -> _Shape:
        point = np.zeros(vocab)
        point[0] = 1.0
        # the shape with placeholder tokens: masks, positions and layout depend on nothing else
        tree = DraftTree(parents, (0,) * len(parents), (Draw.IID,) * len(parents), dict.fromkeys(set(parents), point),
                         vocab)
        ordr = tuple(_order(tree, order) or range(tree.size))
        where = np.empty(tree.size, dtype=np.int64)
        where[list(ordr)] = np.arange(1, tree.size + 1)
        return cls(parents, kind, ordr, tree_mask(tree, ordr, with_root=True), position_ids(tree, 0, ordr, True),
                   torch.tensor(ordr, dtype=torch.long, device=device),
                   torch.from_numpy(np.concatenate([[0], where])).to(device), tree,
                   TreePlan.of(parents, kind, device) if walk else None)

    def allowed(self, past: int) -> NDArray[np.bool_]:
        """:func:`spec.tree.attention_mask` after ``past`` cached tokens."""
        return np.concatenate([np.ones((self.mask.shape[0], past), dtype=bool), self.mask], axis=1)


def _tree_step(
    d_step: LLMDraft, target: Any, t_cache: Any, t_past: int, root: int, shape: _Shape, verifier: str,
    sampling: Sampling, rng: np.random.Generator, backend: str, where: tuple[torch.device, torch.dtype],
) -> tuple[Verified, NDArray[np.int64], tuple[float, float]] | None:
    """One step of a fixed-shape tree drafted on the device (:meth:`LLMDraft.draft_tree`), drawn
    ``kind`` (``iid``, or ``topk``: ranked tokens, each row's argmax for a chain) and verified by a
    tree verifier.

    The tokens go to the target's forward as a device tensor, laid out as
    :func:`~spec.llm.adapter.tree_logits` lays out the host-built tree; the
    fault and ``short`` flags and the tokens come to the host in one transfer, then the
    rows for the verifier, which gets the :class:`DraftTree` the host builder
    would have built.  With a plan (``shape.plan``: ``verify_backend='device'``
    and a verifier with a device walk for the shape) the verifier runs on the device first
    (:func:`spec.llm.tree_device.tree_head`) and that one transfer carries
    its result as well: no rows are copied.  The uniforms come from ``rng`` in the host path's
    order (one per ``iid`` or ``swor`` node, then the verifier's), so the tokens are those
    of :class:`FixedBuilder` / :class:`ChainBuilder` + :func:`_verify`
    (tested).  Returns the
    verification, the target cache positions to keep and the times that end
    drafting and the target forward; or ``None`` when a ranked node fell
    on a token with ``q = 0`` or a ``swor`` row ran out of mass (``short``:
    the host builder grows another shape there), with both caches back where
    the step began and no uniform used: the caller then takes the host path for the step.
    ``where``: the target's ``(device, dtype)``.
    """
    device = where[0]
    n, kind = len(shape.parents), shape.kind
    rng_state = rng.bit_generator.state if kind == Draw.SWOR else None  # a swor tree may come out short
    sampled = kind != Draw.TOPK
    drafted = d_step.draft_tree(shape.parents, torch.from_numpy(rng.random(n)) if sampled else None,
                                swor=kind == Draw.SWOR)
    t1 = time.perf_counter()
    drawn = drafted.tokens.to(device)  # a no-op when draft and target share the device
    ids = torch.cat([torch.full((1,), root, dtype=torch.long, device=device), drawn.index_select(0, shape.ids)])
    logits = forward_unchecked(target, t_cache, ids, shape.depths + t_past, shape.allowed(t_past), where=where)
    p, t_fault = sampling.probs_with_fault(logits.index_select(0, shape.rows))  # every row, reordered
    sync(device)
    t2 = time.perf_counter()
    fault = drafted.fault.to(device) | step_fault(logits, t_fault)
    flags = [fault.to(torch.int64).reshape(1), drafted.short.to(device).to(torch.int64).reshape(1)]
    head = None
    if shape.plan is not None:  # verified on the device: the flags, the result and the tokens in ONE transfer
        if rng_state is None:  # given back if the step is redone on the host
            rng_state = rng.bit_generator.state
        u = rng.random(noise_size(verifier, n))
        # trusted: p from logits the fault flag vouches for, q the rows the tokens were drawn from (a
        # ranked token at q = 0 sets `short`), uniforms from random(); a flagged step's result is dropped
        head = tree_head(verifier, shape.plan, drawn, _drafted_rows(drafted, kind, n, p), p,
                         torch.from_numpy(u).to(device), trusted=True)[1:]
        flags.append(head)
    got = torch.cat([*flags, drawn]).tolist()
    if got[0]:  # name the fault: the draft's logits first, then the target's
        d_step.tree_fault()
        with logits_of("target"):
            sampling.probs(logits)
        raise RuntimeError("a logits fault was flagged but not found again")
    if got[1]:
        d_step.discard_tree()
        trim_cache(t_cache, t_past)
        if rng_state is not None:  # no uniform used: the host path draws them
            rng.bit_generator.state = rng_state
        return None
    if head is not None:
        tokens = got[2 + head.shape[0]:]
        res = read_head(got[2 : 2 + head.shape[0]], tokens)
        d_step.settle_tree(tokens)
        return res, keep_indices(shape.skeleton, res.nodes, t_past, shape.order, with_root=True), (t1, t2)
    u = rng.random(noise_size(verifier, n))
    tokens = got[2:]
    rows = dict(zip(drafted.rows_of, drafted.q.cpu().numpy())) if sampled else {}  # topk: no rows
    tree = DraftTree(shape.parents, tuple(tokens), (kind,) * n, rows, p.shape[-1])
    if backend == "numpy":
        res = verify_tree_numpy(verifier, tree, p.cpu().numpy(), u)
    else:
        res = verify_tree(verifier, torch.tensor(tokens, dtype=torch.long), torch.tensor(shape.parents), kind,
                          _drafted_rows(drafted, kind, n, p), p, torch.from_numpy(u))
    d_step.settle_tree(tokens)
    return res, keep_indices(tree, res.nodes, t_past, shape.order, with_root=True), (t1, t2)


def _drafted_rows(drafted: Any, kind: Draw, n: int, p: torch.Tensor) -> torch.Tensor | None:
    """The ``(N + 1, V)`` draft rows of a device-drafted tree in the verifiers' layout, on ``p``'s device
    (rows of nodes without sampled children are 0, never read; a ``swor`` node's row is its parent's full
    row, from which the verifier removes the earlier siblings); ``None`` for ranked (``topk``) trees."""
    if kind == Draw.TOPK:
        return None
    q_rows = torch.zeros((n + 1, p.shape[-1]), dtype=torch.float64, device=drafted.q.device)
    q_rows[[node + 1 for node in drafted.rows_of]] = drafted.q
    return q_rows.to(p.device)


def _chain_step(
    d_step: LLMDraft, target: Any, t_cache: Any, t_past: int, root: int, k: int, iid: bool, verifier: str,
    sampling: Sampling, rng: np.random.Generator, backend: str, where: tuple[torch.device, torch.dtype],
    confidence: float | None = None,
) -> tuple[Verified, int, tuple[float, float]]:
    """One chain step with the rows kept on the device: the draft tokens are drawn there
    (:meth:`LLMDraft.draft_chain`), fed to the target as a device tensor, and verified by
    :func:`verify_chain_on_device`, whose one transfer brings the step's result to the host
    (``backend == "torch"``), or by the numpy reference on host copies of the rows.

    The uniforms come from ``rng`` in the host path's order (one per token of an ``iid``
    chain, then the verifier's), so the tokens are those of ``ChainBuilder`` + :func:`_verify`.
    With ``confidence`` the chain may end before ``k`` tokens (one host read per token,
    :meth:`LLMDraft.draft_chain`); ``rng`` is then rewound to just past the uniforms used.
    Returns the verification, the chain length and the times that end drafting and the target forward.
    ``where``: the target's ``(device, dtype)``.
    """
    device = where[0]
    before = rng.bit_generator.state if iid and confidence is not None else None
    u_draft = torch.from_numpy(rng.random(k)) if iid else None
    chain = d_step.draft_chain(k, u_draft, confidence)
    drawn_k = int(chain.tokens.shape[0])
    if before is not None and drawn_k < k:
        rng.bit_generator.state = before  # the host builder drew one uniform per token it drew
        rng.random(drawn_k)
    k = drawn_k
    t1 = time.perf_counter()
    drawn = chain.tokens.to(device)  # a no-op when draft and target share the device
    ids = torch.cat([torch.full((1,), root, dtype=torch.long, device=device), drawn])
    allowed = np.tri(k + 1, t_past + k + 1, t_past, dtype=bool)  # the past, then causal over root + chain
    logits = forward_unchecked(target, t_cache, ids, np.arange(t_past, t_past + k + 1), allowed, where=where)
    p, t_fault = sampling.probs_with_fault(logits)
    sync(device)
    t2 = time.perf_counter()
    u = rng.random(noise_size(verifier, k))
    fault = chain.fault.to(device) | step_fault(logits, t_fault)
    res: Verified | None
    if backend == "numpy":  # the flag and the tokens in one transfer, then the rows for the numpy reference
        got = torch.cat([fault.to(torch.int64).reshape(1), chain.tokens]).tolist()
        drafted = got[1:]
        res = None if got[0] else verify_chain_numpy(  # trusted: no fault, tokens drawn from these rows
            verifier, drafted, chain.q.cpu().numpy() if iid else None, p.cpu().numpy(), u, trusted=True)
    else:
        res, drafted = verify_chain_on_device(verifier, drawn, chain.q.to(device) if iid else None,
                                              p, torch.from_numpy(u).to(device), fault, trusted=True)
    if res is None:  # name the fault: the draft's logits first, then the target's
        d_step.chain_fault()
        with logits_of("target"):
            sampling.probs(logits)
        raise RuntimeError("a logits fault was flagged but not found again")
    d_step.settle_chain(drafted)
    return res, k, (t1, t2)


@torch.no_grad()
def generate(
    target: Any,
    draft: Any,
    input_ids: Any,
    builder: str | TreeBuilder = "dyspec",
    verifier: str = "traversal",
    *,
    budget: int = 16,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    max_new_tokens: int = 64,
    seed: int = 0,
    eos_token_id: int | Sequence[int] | None = None,
    draft_temperature: float | None = None,
    builder_params: dict[str, Any] | None = None,
    order: str = "dfs",
    cache: str = "auto",
    graphs: bool | None = None,
    chain_on_device: bool = True,
    verify_backend: str = "auto",
    step_graph: bool | str = "auto",
    compile_step: bool | str = False,
) -> GenerateOutput:
    """Speculative decoding of ``max_new_tokens`` tokens after ``input_ids`` (module doc).

    ``builder`` is a name of :data:`spec.builders.BUILDERS` (with
    ``builder_params``) or a builder object; ``verifier`` one of
    :data:`VERIFIERS`; ``budget`` the draft nodes per step; ``order`` how the
    tree is laid out for the target forward (``dfs``, ``bfs``, ``index``).
    ``cache``: ``dynamic`` (transformers' ``DynamicCache``, gathered after
    each step), ``static`` (:class:`~spec.llm.static_cache.StaticTreeCache`:
    fixed buffers written at explicit slots; with ``graphs`` — default: on
    CUDA — every forward of ≤ 128 tokens replays a captured CUDA graph) or
    ``auto`` (static on CUDA, dynamic elsewhere and for layer kinds the static cache cannot hold); the
    tokens are the same.
    Randomness: one ``numpy`` generator seeded with ``seed`` draws the
    builder's tokens and every step's uniforms.
    ``eos_token_id``: a stop token, or a collection of them (a
    ``generation_config.eos_token_id`` list: any one ends generation), or
    ``None`` (the default: none; the model's generation config is not read
    here, :func:`spec.llm.models.stop_token_ids` reads it for the command line).
    Nor are its sampling settings: ``temperature``, ``top_k`` and ``top_p``
    are the arguments' (default 1, none, none), whatever the model's
    ``generation_config`` says.
    The output ends with the first stop token, which it keeps.
    The draft may have fewer or more token ids than the target (one tokenizer, padded embeddings):
    it drafts on the target's ids (:class:`~spec.llm.adapter.LLMDraft`'s ``vocab``), losslessly.
    A model with a sliding window is decoded with its window applied to the tree mask, on either cache
    (:func:`~spec.llm.windows.attention_window`); Llama 4 with its attention chunks applied too, on the
    dynamic cache (:func:`~spec.llm.windows.attention_chunks`), where each step's tree is also capped at
    the nodes whose query temperature tuning equals their own decoding's
    (:func:`~spec.llm.windows.exact_tree_nodes`: only the steps that start within about ``budget``
    positions before a multiple of ``floor_scale`` are cut short; a chain is never cut).  Near the end of a
    learned position table (:func:`~spec.llm.adapter.learned_positions`, either model's) each step's tree or
    chain is cut to the positions left, the fused step handing over to the unfused path there, so the
    decode needs prompt + ``max_new_tokens`` positions, one more than plain decoding (refused by name
    otherwise, :func:`~spec.llm.adapter.check_positions`).  A ``longrope`` target (Phi-3 128k, Phi-4-mini)
    decodes past its switch with the law of full forwards, as Phi-3's own ``generate`` does: no step's tree
    crosses the switch, the step whose root sits right before it has no nodes, and the target's cache is
    recomputed once the root reaches it (:func:`~spec.llm.adapter.rope_switches`); a ``longrope`` draft's cache
    is recomputed at its own switch too (for its acceptance: its rows are the law its tokens were drawn from
    either way).  A target whose
    attention does not take the tree mask, or which would leave its own decoding within prompt +
    ``max_new_tokens`` + ``budget`` positions (chunks the mask cannot apply, GPT-Neo's local
    layers), is refused (:func:`~spec.llm.adapter.check_attention`,
    :func:`~spec.llm.adapter.check_span`).
    ``draft_temperature``: the temperature of the draft's rows (``None``,
    the default: ``temperature``, the draft processed exactly as the
    target); ``top_k`` / ``top_p`` apply to both either way.  Every draft
    node records the law it was drawn from, so the output law is the
    target's at any draft temperature; only the acceptance changes.  At
    ``temperature=0`` a one-hot draft turns every sampled or top-k tree
    into a chain (one child per node); ``draft_temperature=1`` gives such
    builders the draft's real alternatives while the output stays greedy
    decoding (README, "Draft temperature").
    ``chain_on_device``: a ``chain`` builder drafts with the rows on the
    models' device and, with a chain verifier, verifies there, synchronising
    once for the drafted chain, once after the target forward and once for
    the result (:func:`_chain_step`), instead of once per drafted token; a
    tree verifier takes the drafted chain and the rows to the host once.  A
    chain with a ``confidence`` stop reads each token's probability on the
    host (one synchronisation per token) and, with a tree verifier, takes
    the host path.
    A ``fixed`` builder drawing ``iid`` with a tree verifier drafts its tree
    (whose shape no draw can change) on the device the same way, one forward
    per layer and no host sync until the tokens are drawn
    (:func:`_tree_step`); so does one drawing ``topk`` or ``swor`` when the draft's rows
    keep ``width`` tokens with ``q > 0`` (draft temperature above 0, no
    top-p, no top-k below ``width``; a step whose rows underflow is redone
    on the host).  From a greedy draft (draft temperature 0) the trees of
    ``fixed`` (``topk``, ``swor``), ``dyspec``, ``dyspec-threshold``,
    ``dynatree`` and ``wetap`` are chains of a length known in advance
    (:func:`_greedy_chain`), drafted on the device the same way: one
    synchronisation for the chain instead of one draft call per node.  The
    tokens are the same either way (tested), ``False`` takes the host path.
    ``verify_backend``: ``torch`` runs the verifiers of
    :mod:`spec.llm.verify`, ``numpy`` their :mod:`tmc` references
    (:mod:`spec.llm.host_verify`: rows copied to the host, about 3x faster on
    the CPU and, for small vocabularies, on a GPU), ``auto`` the numpy ones
    except for a chain drafted on a GPU whose rows are large, ``(budget + 1)
    x V`` above :data:`HOST_VERIFY_MAX_ENTRIES` (:func:`resolve_verify_backend`);
    ``device`` is ``torch`` except that ``multidraft``, ``traversal``, ``ordered_traversal``
    (no node with 3 or more children drawn ``swor``) and ``kseq`` on a tree drafted on the
    device verify there too (:mod:`spec.llm.tree_device`:
    every node's tests as fixed-shape tensor work, so the step's one
    transfer carries the result and no rows are copied; on the CPU 1.5-5x
    slower than the host walk per verification, ``tmc bench verify``; not
    timed on a GPU); the tokens are the same (tested).
    ``step_graph``: run each step of a ``chain`` builder (no ``confidence``
    stop) with a chain verifier as ONE piece of fixed-shape device work, the
    draft forwards, draws, target forward and verifier together, captured as
    one CUDA graph when the caches capture graphs
    (:class:`~spec.llm.step_graph.ChainStepGraph`; needs ``cache`` static and the
    torch verifier); likewise each step of a tree drafted on the device
    (``fixed`` or ``chain``, drawn ``iid``, or ``topk`` / ``swor`` where the device
    drafts it, and a greedy draft's chains, above) with a verifier that has a device
    walk (:func:`~spec.llm.tree_device.walks_on_device`), walked on the device, the
    accepted path moved into place in both caches on the device
    too (:class:`~spec.llm.tree_step_graph.TreeStepGraph`, sliding windows
    included; a ranked or swor step that comes out short is redone unfused,
    on the same uniforms).  The first step, which feeds the prompt to the draft,
    takes the usual path.  The tokens are the same (tested on the CPU, where
    the same work runs eagerly, and on CUDA).  ``"auto"`` (default): fused
    wherever both caches capture CUDA graphs and the builder, verifier and
    backend allow it (``ordered_traversal`` and ``kseq`` only when asked: :data:`ASKED_FUSION_ONLY`),
    unfused otherwise (:func:`resolve_step_graph`: on an H200
    it ran 1.31-1.48x faster; on the CPU, run eagerly, it gained little or
    lost); ``True`` insists (a ``ValueError`` names what is missing).
    ``compile_step`` (with ``step_graph``): ``True`` (or ``"parts"``) sends
    the step's draws and verifier through ``torch.compile`` (inductor, whole
    graphs) first, so the captured graph launches a few fused kernels for
    them instead of some 80-130 small ones; ``"whole"`` compiles the whole step,
    both models' forwards included (:mod:`spec.llm.step_graph`), so the
    forwards' inputs, masks and cache moves are fused too.  The first step of
    each setting pays the compilation.  On an H200 (2026-11-26, torch 2.11)
    ``True`` took a chain SpS step's builder + verifier from 17% to 7.3% of
    the target forward and ``"whole"`` ran steps 1.9-2.3x faster than the
    graphed eager step (README, "H200, 2026-11-26, second lease").
    """
    t_start = time.perf_counter()
    if not isinstance(chain_on_device, bool):
        raise ValueError(f"chain_on_device must be True or False, got {chain_on_device!r}")
    if type(step_graph) not in (bool, str) or step_graph not in (True, False, "auto"):
        raise ValueError(f"step_graph must be True, False or 'auto', got {step_graph!r}")
    if compile_step not in (False, True, *COMPILE_SCOPES) or type(compile_step) not in (bool, str):
        raise ValueError(f"compile_step must be False, True or one of {COMPILE_SCOPES}, got {compile_step!r}")
    if compile_step and step_graph is not True:
        raise ValueError(f"compile_step={compile_step!r} compiles the fused step: it needs step_graph=True")
    scope = "whole" if compile_step == "whole" else "parts"
    vocab = _vocab(target, "target")
    d_vocab = _vocab(draft, "draft")  # a draft of another size works on the target's ids (LLMDraft's vocab)
    device = model_device(target)
    if device != model_device(draft):  # the device paths pass tensors from one model to the other
        raise ValueError(f"target and draft must be on one device, got {device} and "
                         f"{model_device(draft)}: move both there (model.to(device))")
    prompt = _prompt(input_ids, vocab)
    b, budget, sampling, d_sampling = check_decode_options(builder, verifier, budget, builder_params, temperature,
                                                           top_k, top_p, draft_temperature)
    check_attention(target, "target", trees=type(b) is not ChainBuilder)  # a chain builder's trees are chains
    check_attention(draft, "draft", trees=False)  # its rows need only be the law its tokens were drawn from
    if order not in ORDERS:
        raise ValueError(f"order must be one of {ORDERS}, got {order!r}")
    cache = resolve_cache(target, cache, draft)
    on_device = chain_on_device and _device_chain(b, verifier)
    max_new_tokens = check_int("max_new_tokens", max_new_tokens, minimum=0)
    seed = check_int("seed", seed, minimum=0)
    stops = stop_ids(eos_token_id, vocab)
    # a draft with chunks is still lossless (its rows are the law its tokens were drawn from); the target is not.
    # A target whose query temperature tuning reads the cache length gets each step's tree capped
    # (exact_tree_nodes; the static cache refuses such a model)
    floor = query_scale_floor(getattr(target, "config", None))
    # the last step's root is at most position len(prompt) + max_new_tokens - 2, its nodes up to `budget` past it:
    # that many positions (and cache slots) in all (the span was asked for one more, refusing decodes that fit)
    reach = len(prompt) + max_new_tokens - 1 + budget
    check_span(target, "target", reach, steps_capped=True, switches_handled=True)
    switches = rope_switches(getattr(target, "config", None))
    d_switches = rope_switches(getattr(draft, "config", None))  # recomputed past too: acceptance, not the law
    # A learned position table cuts the last steps' trees short instead (`room` below), so a speculative decode
    # needs one position more than plain decoding: the last step's root and one node.
    tables = [n for model, role in ((target, "target"), (draft, "draft"))
              if (n := check_positions(model, role, len(prompt) + max_new_tokens, speculative=True)) is not None]
    table = min(tables) if tables else None
    fixed_shape = _device_shape(b, verifier, budget, d_sampling, min(vocab, d_vocab)) if chain_on_device else None
    if fixed_shape is not None:  # the host path asks this of every tree it verifies
        verifiers_for(verifier, {fixed_shape[1]}, b.adaptive_widths)
    backend = resolve_verify_backend(target, verify_backend, on_device, (budget + 1) * vocab)
    refusal = _step_graph_refusal(b, verifier, chain_on_device, cache, verify_backend, fixed_shape)
    if step_graph is True:  # refused before any forward
        resolve_step_graph(True, False, refusal)
    rng = np.random.default_rng(seed)
    sampler = RngSampler(rng)
    where = (device, model_dtype(target))

    # Prefill: the target caches the prompt but its last token (fed as each step's root).
    # a first guess: a static cache grows on demand
    capacity = cache_capacity(len(prompt), max_new_tokens, budget)
    t_cache = _new_cache(target, cache, "target", capacity, graphs)
    d_cache = _new_cache(draft, cache, "draft", cache_capacity(len(prompt), max_new_tokens, budget,
                                                               b.draft_nodes(budget, vocab)), graphs)
    graphed = all(isinstance(c, StaticTreeCache) and c.graphs for c in (t_cache, d_cache))
    fuse = resolve_step_graph(step_graph, graphed and verifier not in ASKED_FUSION_ONLY, refusal)
    _prefill(target, t_cache, prompt[:-1])
    t_past, root = len(prompt) - 1, prompt[-1]
    era = _switches_passed(switches, t_past - 1)  # the factors the cached keys took (longrope)
    d_era = _switches_passed(d_switches, t_past)  # the draft's first forward feeds the prompt and a tree past it
    d_step = LLMDraft(draft, d_cache, 0, pending=prompt, sampling=d_sampling, vocab=vocab)
    sync(device)
    prefill_s = time.perf_counter() - t_start

    out: list[int] = []
    steps: list[StepStats] = []
    state = b.initial_state()
    # the tree step verifies on the device
    walk = backend == "device" and fixed_shape is not None and walks_on_device(verifier, *fixed_shape)
    shape = None if fixed_shape is None else _Shape.of(*fixed_shape, order, vocab, device, walk)
    fused: ChainStepGraph | TreeStepGraph | None = None
    d_state: tuple[int, tuple[int, ...]] | None = None  # (past, pending) of the draft while steps run fused
    chain_shape = shape is not None and _is_chain(shape.skeleton)
    # A device-drafted (or fused) tree that comes out short has cost its forwards before the host path redoes the
    # step; where that keeps happening (a draft so cold its ranked rows underflow) every step paid them two or three
    # times.  So a short tree sends the next `backoff` steps to the host path, and doubles `backoff`.
    host_until, backoff = 0, 1

    def unfused(state: tuple[int, tuple[int, ...]]) -> LLMDraft:
        """The draft's state of the fused steps handed back to an :class:`LLMDraft` for the unfused path."""
        return LLMDraft(draft, d_cache, state[0], pending=state[1], sampling=d_sampling, vocab=vocab)

    while len(out) < max_new_tokens:
        t0 = time.perf_counter()
        void_forwards = 0  # draft forwards of a fused step that came out short (this step is then redone)
        device_tree = len(steps) >= host_until  # this step may draft its tree on the device (or fused)
        # the nodes a tree may have this step: a tree of n nodes feeds both models positions up to t_past + n,
        # so near a learned position table's end fewer than `budget` (`room`); a query temperature tuning
        # (`floor`) cuts trees, not chains, which are exact at any length
        left = None if table is None else table - 1 - t_past  # positions past the root (>= 1: checked above)
        room = budget if left is None else min(budget, left)
        # a longrope target: no tree passes a switch (the root right before one gets none), and once the root
        # is at or past it, the cache is recomputed with the factors the root's own decoding takes
        room = min([room] + [s - 1 - t_past for s in switches if s > t_past])
        if _switches_passed(switches, t_past) > era:
            _recompute(target, t_cache, prompt + out)
            era = _switches_passed(switches, t_past)
        if _switches_passed(d_switches, t_past) > d_era:  # a longrope draft's keys, for its rows' sake
            _recompute(draft, d_cache, [t if t < d_vocab else 0 for t in prompt + out])  # as LLMDraft feeds them
            d_era = _switches_passed(d_switches, t_past)
            if d_state is not None:
                d_state = (t_past, (root,))
            else:
                d_step = unfused((t_past, (root,)))
        cap = room if floor is None or type(b) is ChainBuilder else min(room, exact_tree_nodes(floor, t_past))
        if room < budget and d_state is not None:  # the fused step's fixed shape no longer fits: unfused from here
            d_step, d_state = unfused(d_state), None
        if fuse and device_tree and room == budget and (d_state is not None or 1 <= len(d_step.pending) <= 2):
            if d_state is None:  # the draft's state passes from its LLMDraft to the fused steps
                d_state = (d_step.past_len, d_step.pending)
            if fused is None:
                backend_c = COMPILE_BACKEND if compile_step else None
                if shape is not None and _fused_tree(fixed_shape, verifier):
                    fused = shared_tree_step(target, draft, t_cache, d_cache, parents=shape.parents, order=shape.order,
                                             verifier=verifier, sampling=sampling, d_sampling=d_sampling, vocab=vocab,
                                             draw=shape.kind, compile_backend=backend_c, compile_scope=scope)
                else:
                    assert isinstance(b, ChainBuilder)
                    fused = shared_chain_step(target, draft, t_cache, d_cache, k=budget, verifier=verifier,
                                              iid=b.draw == Draw.IID, sampling=sampling, d_sampling=d_sampling,
                                              vocab=vocab, compile_backend=backend_c, compile_scope=scope)
            may_be_short = isinstance(fused, TreeStepGraph) and fused.draw != Draw.IID
            before = rng.bit_generator.state if may_be_short else None  # a ranked / swor tree may come out short
            one = fused.draw_step(t_past, root, *d_state, rng)  # its uniforms drawn into its upload buffer
            if one is not None:
                t3 = time.perf_counter()
                kept, stopped = _cut_at_stop(one.tokens[: max_new_tokens - len(out)], stops)
                out.extend(kept)
                steps.append(StepStats(fused.size, min(one.n_accepted, len(kept)), len(kept), fused.forwards, 0.0,
                                       0.0, 0.0, 0.0, t3 - t0))
                if stopped or len(kept) < len(one.tokens):
                    break
                t_past, root, d_state = one.t_past, one.tokens[-1], (one.d_past, one.pending)
                continue
            # short: no uniform used, the caches as the step found them; the host builder grows this step's tree
            # (the device tree would come out short too), from a draft that has not fed its pending tokens
            assert before is not None
            rng.bit_generator.state = before
            void_forwards = fused.forwards
            d_step, d_state = unfused(d_state), None
            device_tree = False
            host_until, backoff = len(steps) + 1 + backoff, 2 * backoff
        if cap == 0:  # a longrope switch right after the root
            t1 = time.perf_counter()
            keep: Sequence[int] | NDArray[np.int64] = range(t_past + 1)
            res, size = _root_step(target, t_cache, t_past, root, sampling, rng, where), 0
            t2 = time.perf_counter()
        elif on_device:
            assert isinstance(b, ChainBuilder)
            res, size, (t1, t2) = _chain_step(d_step, target, t_cache, t_past, root, cap, b.draw == Draw.IID,
                                              verifier, sampling, rng, backend, where, b.confidence)
            keep = range(t_past + 1 + res.n_accepted)  # fed in order: a trim
        elif (tried := device_tree and shape is not None and room == budget and (cap == budget or chain_shape)) and (
                got := _tree_step(d_step, target, t_cache, t_past, root, shape, verifier, sampling, rng, backend,
                                  where)) is not None:
            res, keep, (t1, t2) = got
            size = len(shape.parents)
        else:  # the host builder (also for a device-drafted tree that came out short, or one cut to `cap`)
            if tried:  # it came out short
                host_until, backoff = len(steps) + 1 + backoff, 2 * backoff
            # near a position table's end, a builder that feeds the draft deeper than its budget goes shallower
            tree = (b if left is None else b.within(left)).build(d_step, cap, sampler, state)
            t1 = time.perf_counter()
            ordr = _order(tree, order)
            logits = tree_logits(target, t_cache, tree, t_past, root_token=root, order=ordr, where=where)
            with logits_of("target"):
                p = sampling.probs(logits)
            sync(device)
            t2 = time.perf_counter()
            res = _verify(verifier, tree, p, rng, b.adaptive_widths, backend)
            size, keep = tree.size, keep_indices(tree, res.nodes, t_past, ordr, with_root=True)
            state = b.next_state(state, tree, res.n_accepted)
        tokens = [int(t) for t in res.tokens.tolist()]
        t3 = time.perf_counter()
        kept, stopped = _cut_at_stop(tokens[: max_new_tokens - len(out)], stops)
        out.extend(kept)
        done = stopped or len(kept) < len(tokens)
        forwards, forward_s = d_step.forwards + void_forwards, d_step.forward_s
        if not done:
            select_cache(t_cache, keep)
            t_past, root = t_past + 1 + len(res.nodes), tokens[-1]
            d_step = d_step.end_step(tokens)
        steps.append(StepStats(size, min(res.n_accepted, len(kept)), len(kept), forwards, t1 - t0, t2 - t1,
                               t3 - t2, forward_s, loop_s=time.perf_counter() - t3))
        if done:
            break
    sync(device)
    return GenerateOutput(out, steps, prefill_s, time.perf_counter() - t_start)


def check_decode_options(builder: str | TreeBuilder, verifier: str, budget: int,
                         builder_params: Mapping[str, Any] | None = None, temperature: float = 1.0,
                         top_k: int | None = None, top_p: float | None = None,
                         draft_temperature: float | None = None) -> tuple[TreeBuilder, int, Sampling, Sampling]:
    """The checks of :func:`generate` that need no model: ``(builder, budget, sampling, draft sampling)``, or the
    ``ValueError`` ``generate`` would raise.  ``tmc decode`` and ``tmc bench decode`` run them before loading a
    pair, so a bad name or setting is refused at once rather than after the models load (minutes for a large
    pair, or a hub download).  Also refused here: a chain verifier on a builder whose trees
    are not always chains of ``iid`` or ``topk`` draws (:func:`_chain_refusal`), and a verifier that needs a
    node's number of children fixed before they are drawn on a builder whose is not; :func:`generate` would
    otherwise meet them at some step (for the first, after a number of steps that depends on the seed when
    the draft only sometimes offers a second token)."""
    if builder_params is not None and not isinstance(builder_params, Mapping):
        raise ValueError(f"builder_params must be a mapping of builder parameters (e.g. {{'width': 2}}), got "
                         f"{type(builder_params).__name__} {builder_params!r}")
    b = make_builder(builder, **(builder_params or {}))
    if verifier not in VERIFIERS:
        raise ValueError(f"unknown verifier {verifier!r}; choose one of {', '.join(VERIFIERS)}")
    budget = check_int("budget", budget, minimum=1)
    if budget > MAX_BUDGET:
        raise ValueError(f"budget must be <= {MAX_BUDGET:,} draft nodes a step, got {budget:,}: a step's tree pass "
                         f"holds a budget x (context + budget) attention mask")
    if verifier not in CHAIN_METHODS:
        verifiers_for(verifier, set(), b.adaptive_widths)
    sampling = Sampling(temperature, top_k, top_p)
    d_sampling = sampling if draft_temperature is None else _draft_sampling(draft_temperature, top_k, top_p)
    if verifier in CHAIN_METHODS and (why := _chain_refusal(b, budget, d_sampling)) is not None:
        raise ValueError(f"verifier {verifier!r} verifies chains; {why}: use a chain builder or a tree verifier")
    return b, budget, sampling, d_sampling


def _chain_refusal(b: TreeBuilder, budget: int, drafting: Sampling) -> str | None:
    """Why ``b``'s trees are not always chains a chain verifier takes (``iid`` or ``topk`` draws, one child a
    node), or ``None`` when they are, or when ``b`` is no class of ours (a subclass may grow otherwise: its
    trees are checked at each step).  The builders of :func:`_greedy_chain` grow chains from a one-hot draft
    (temperature 0 or top-k 1): drawn swor, never one a chain verifier takes; drawn ``topk``, one it takes
    there, and from any other draft a tree that may branch, at a step no setting foretells."""
    fixed = b if type(b) is FixedBuilder else None
    if fixed is not None and fixed.draw != Draw.SWOR and _chain_parents(fixed.full_shape(budget)):
        return None
    if fixed is not None and fixed.draw == Draw.IID:
        return f"a fixed tree drawn iid of width {fixed.width} branches"
    grown = _greedy_chain(b, budget)
    if grown is None:  # the chain builder, or a class not ours
        return None
    if grown[1] == Draw.SWOR:
        return f"{b.name} draws swor"
    if drafting.greedy or drafting.top_k == 1:
        return None
    what = b.name if fixed is None else f"a fixed tree drawn topk of width {fixed.width}"
    return f"{what} branches unless the draft is one-hot (draft temperature 0 or top_k 1)"


def _draft_sampling(temperature: float, top_k: int | None, top_p: float | None) -> Sampling:
    """The draft's :class:`Sampling` at its own temperature, a bad value named as ``draft_temperature``."""
    try:
        return Sampling(temperature, top_k, top_p)
    except ValueError as err:
        if not str(err).startswith("temperature"):
            raise
        raise ValueError(f"draft_{err}") from None


def ar_generate(
    target: Any,
    input_ids: Any,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    max_new_tokens: int = 64,
    seed: int = 0,
    eos_token_id: int | Sequence[int] | None = None,
    cache: str = "dynamic",
    graphs: bool | None = None,
) -> GenerateOutput:
    """Plain autoregressive decoding with the same processing and a seeded inverse-CDF draw per token.

    The baseline of the benchmarks: one target forward per token.  ``cache``
    and ``graphs`` as in :func:`generate` (default: a ``DynamicCache``, the
    loop of plain transformers decoding; ``static`` gives the same loop on
    the static cache, with a captured one-token graph on CUDA).
    """
    t_start = time.perf_counter()
    vocab = _vocab(target, "target")
    prompt = _prompt(input_ids, vocab)
    stops = stop_ids(eos_token_id, vocab)
    sampling = Sampling(temperature, top_k, top_p)
    rng = np.random.default_rng(check_int("seed", seed, minimum=0))
    max_new_tokens = check_int("max_new_tokens", max_new_tokens, minimum=0)
    check_positions(target, "target", len(prompt) + max_new_tokens - 1)
    cache = resolve_cache(target, cache)
    if cache == "static":  # its forwards pass a 4D mask (a token a step: a chain); the dynamic loop, the model's own
        check_attention(target, "target", trees=False)
    device = model_device(target)
    kv = _new_cache(target, cache, "target", cache_capacity(len(prompt), max_new_tokens), graphs)
    dynamic = isinstance(kv, DynamicCache)
    cache_arg = {cache_keyword(target): kv}  # the dynamic loop's keyword, looked up once
    _prefill(target, kv, prompt[:-1])
    tok, pos = prompt[-1], len(prompt) - 1
    switches = rope_switches(getattr(target, "config", None))  # a longrope target's cache is recomputed past one
    era = _switches_passed(switches, pos - 1)
    out: list[int] = []
    steps: list[StepStats] = []
    with torch.no_grad():
        while len(out) < max_new_tokens:
            t0 = time.perf_counter()
            if _switches_passed(switches, pos) > era:
                _recompute(target, kv, prompt + out)
                era = _switches_passed(switches, pos)
            if dynamic:
                ids = torch.tensor([[tok]], device=device)
                logits = target(input_ids=ids, use_cache=True, **cache_arg).logits[0, -1]
            else:
                logits = forward_masked(target, kv, [tok], [pos], np.ones((1, pos + 1), dtype=bool))[0]
            tok, pos = _draw(logits, sampling, rng), pos + 1
            out.append(tok)
            steps.append(StepStats(0, 0, 1, 0, 0.0, time.perf_counter() - t0, 0.0))
            if tok in stops:
                break
    sync(device)
    return GenerateOutput(out, steps, 0.0, time.perf_counter() - t_start)
