"""A whole fixed-tree step as one fixed-shape piece of device work, captured as ONE CUDA graph (DESIGN.md §8).

``p`` is the target's law and ``q`` the draft's (DESIGN.md §3); ``p_rows`` / ``q_rows`` hold their rows.

:class:`spec.llm.step_graph.ChainStepGraph` does this for a chain verified by
a chain verifier.  :class:`TreeStepGraph` does it for a tree of a shape known
before the step (a ``fixed`` tree or a fixed chain, given as ``parents``
numbered breadth first), drawn i.i.d., without replacement (``swor``) or
ranked (``topk``), verified by
a verifier whose walk runs on the device
(:func:`spec.llm.tree_device.walks_on_device`).
The step is the work of :func:`spec.llm.generate._tree_step` with
:meth:`~spec.llm.adapter.LLMDraft.draft_tree`, on the same uniforms in the same
order, so the tokens are the same (tested on the CPU, where the same buffers
run eagerly).

**Slots.**  As in the chain step the lengths live on the device, and a step
uploads six integers (the target and draft cache lengths, the root, the
draft's one or two pending tokens and their count) and its uniforms in one
copy.  Both caches hold the context at slots equal to its positions.  The
draft feeds its pending tokens as two rows (the second a padding row when
there is one), then each layer that has children as one forward: layer
``d``'s nodes go to the slots after the context in breadth-first order, at
position ``root + d``, each seeing the context, its ancestors and itself.  The
target scores the root and every node in one forward, at the slots after its
context in the decode's layout (``order``).

**Keeping the accepted path.**  Unlike a chain's, a tree's accepted path is
not a prefix of what was fed, so the step ends by moving the accepted nodes'
keys and values to the slots right after the context, in both caches: one
gather of ``depth`` slots (``depth - 1`` for the draft, which never feeds the
last layer) and one write, padded with slots moved onto themselves, so the
shape is fixed.  A node is never moved onto a slot an earlier move reads: the
gather completes before the write.  The slots are arithmetic on the accepted
path, done by the head (:func:`_keep_slots`), so under ``compile_step`` they
fuse with the walk and only the two gathers and two writes stay eager.

**Pending tokens.**  After the step the draft lacks the emitted token and, if
the path reached the last layer (never fed), that node's token too: one or
two pending tokens, as in the chain step.

**Short steps.**  A ranked node takes the ``r``-th most likely token of its
parent's row, which needs ``r + 1`` tokens with ``q > 0`` there; a ``swor``
node is drawn from its parent's row with its ``r`` earlier siblings' tokens
removed, which needs mass left there.  Where a row underflows the host
builder grows fewer children, a shape this step cannot take.  The step then
sets a flag beside the fault flag and
:meth:`TreeStepGraph.step` returns ``None``: nothing of the context moved
(every write went to slots past it), no uniform was used, and the caller
runs the step another way (:func:`spec.llm.generate.generate` takes the
device tree's path, which finds the tree short too and lets the host
builder grow it).  The decode loop only fuses ranked and ``swor`` trees
whose rows keep ``width`` tokens (draft temperature above 0, no top-p, no
top-k below the width), where only an underflow to 0 cuts a row short.

**Sliding windows.**  A tree node's slot is not its position, so a window is
not a plain slot range; each forward's mask is cut as the device tree's
forwards cut theirs (:func:`spec.llm.windows.windowed`: a cached slot reads
as its own number, a key fed in the same forward at its position).  The
target sees the context from ``position - size + 1`` on, and an ancestor
fewer than ``size`` layers up (its nodes are all fed in one forward, at their
positions).  A draft layer's forward sees the context likewise, an earlier
layer's node when its *slot* lies within the window (the slot is at or past
its position, so it reads nearer than it is: the device tree's rule, and the
rows need not be the draft's own decoding's, since each node records the law
it was drawn from), and its own layer's nodes.  The fixed parts are tables
made once per shape.  Batch size 1,
both models on one device, both caches
:class:`~spec.llm.static_cache.StaticTreeCache`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np
import torch
from numpy.typing import NDArray

from spec.llm.adapter import _tree_layout
from spec.llm.sampling import Sampling, categorical_draw, ranked_tokens, swor_draws
from spec.llm.static_cache import StaticTreeCache
from spec.llm.step_graph import ChainStepResult, FusedStep, clamp_ids, resolve_io, shared_step, target_rows_and_fault
from spec.llm.tree_device import DEVICE_TREE_METHODS, TreePlan, tree_head, walks_on_device
from tmc.multidraft import ROOT, Draw
from tmc.validate import check_int

__all__ = ["FUSED_DRAWS", "TreeStepGraph", "shared_tree_step"]

#: How a fused tree step may draw its nodes: no draw changes the shape (a ranked or without-replacement step that
#: comes out short is reported, not grown smaller).
FUSED_DRAWS: tuple[Draw, ...] = (Draw.IID, Draw.SWOR, Draw.TOPK)

#: The bit of the output's flag that marks a short step (bit 0 is the logits fault, FusedStep's).
SHORT = 2

def _tables(parents: tuple[int, ...], order: Sequence[int]) -> dict[str, Any]:
    """The shape's host tables: layers, the fed nodes' offsets, ancestor masks, the target's layout, and for
    ranked draws each layer's parents and each node's rank."""
    n = len(parents)
    layers, rank = _tree_layout(parents)
    if sorted(order) != list(range(n)):
        raise ValueError(f"order must be a permutation of the {n} nodes, got {list(order)}")
    ancestors: list[set[int]] = []
    depth: list[int] = []
    for i, par in enumerate(parents):
        ancestors.append({i} | (ancestors[par] if par != ROOT else set()))
        depth.append(1 + (depth[par] if par != ROOT else 0))
    fed = [node for layer in layers[:-1] for node in layer]
    fed_at = {node: k for k, node in enumerate(fed)}
    where = {node: k + 1 for k, node in enumerate(order)}  # target layout: the root at 0
    t_mask = np.zeros((n + 1, n + 1), dtype=bool)
    t_mask[:, 0] = True
    for node in range(n):
        t_mask[where[node], [where[a] for a in ancestors[node]]] = True
    return {
        "layers": layers,
        "fed": fed,
        # per fed layer: the layer's offsets among the fed slots and what each node may see of them
        "fed_slots": [[fed_at[v] for v in layer] for layer in layers[:-1]],
        "fed_masks": [np.array([[f in ancestors[v] for f in fed] for v in layer], dtype=bool).reshape(len(layer), len(fed))
                      for layer in layers[:-1]],
        # per layer d >= 2: each node's parent's row in layer d - 1's forward
        "parent_rows": [[layers[d - 1].index(parents[v]) for v in layers[d]] for d in range(1, len(layers))],
        # per layer (the root's children first): the rows of its distinct parents in the forward they are drawn
        # from (draft_tree's ``drawn_from``), each node's index among them, and each node's rank among its siblings
        "ranked": [_ranked_layer(parents, layer, rank, layers[d - 1] if d else (ROOT,))
                   for d, layer in enumerate(layers)],
        "fed_at": [fed_at.get(v, -1) for v in range(n)],
        "order": list(order),
        "t_depths": [0] + [depth[v] for v in order],
        "t_mask": t_mask,
        "t_rows": [0] + [where[v] for v in range(n)],  # each node's layout row, index order (the root first)
    }


def _ranked_layer(parents: tuple[int, ...], layer: Sequence[int], rank: Sequence[int],
                  above: Sequence[int]) -> tuple[list[int], list[int], list[int]]:
    """One layer's ranked-draw table: the rows (in the layer ``above``'s forward) of its distinct parents in
    node order, each node's index among those parents, and each node's rank among its siblings."""
    drawn_from = list(dict.fromkeys(parents[v] for v in layer))
    where = {par: j for j, par in enumerate(drawn_from)}
    return [list(above).index(par) for par in drawn_from], [where[parents[v]] for v in layer], [rank[v] for v in layer]


class TreeStepGraph(FusedStep):
    """One step of a fixed tree (drawn i.i.d., without replacement or ranked) and a device-walked tree verifier,
    as fixed-shape device work (module doc).

    ``parents``: the shape, breadth first; ``order``: the node of each position
    of the target's forward after the root (the decode's layout); ``draw``:
    ``iid`` (each node drawn by inverse CDF from its parent's row), ``swor``
    (the node with ``r`` earlier siblings drawn so from its parent's row with
    those siblings' tokens removed) or ``topk`` (that node is its parent
    row's ``r``-th most likely token); a ``swor`` or ``topk`` step where some
    row has too few tokens with ``q > 0`` is reported short (:meth:`step`).  The other arguments are
    :class:`~spec.llm.step_graph.ChainStepGraph`'s; ``verifier`` is
    one of :data:`~spec.llm.tree_device.DEVICE_TREE_METHODS` with a device walk for the shape
    (:func:`~spec.llm.tree_device.walks_on_device`).  ``compile_backend`` compiles the draws
    and the verifier's head (the target's rows, the flags, the walk and the cache moves' slots:
    :func:`_tree_head`) before the capture, or the whole step with
    ``compile_scope="whole"`` (:mod:`spec.llm.step_graph`).  ``io``: where the upload and the transfer back
    run (:data:`~spec.llm.step_graph.STEP_IO_MODES`; ``None``: :data:`~spec.llm.step_graph.STEP_IO`).
    """

    def __init__(self, target: Any, draft: Any, t_cache: StaticTreeCache, d_cache: StaticTreeCache, *,
                 parents: Sequence[int], order: Sequence[int], verifier: str, sampling: Sampling,
                 d_sampling: Sampling, vocab: int, draw: Draw | str = Draw.IID,
                 compile_backend: str | None = None, compile_scope: str = "parts", io: str | None = None) -> None:
        self._setup(target, draft, t_cache, d_cache, vocab, io)
        if verifier not in DEVICE_TREE_METHODS:
            raise ValueError(f"verifier must be one of {DEVICE_TREE_METHODS} (walked on the device), got {verifier!r}")
        if draw not in FUSED_DRAWS:
            raise ValueError(f"draw must be one of {[d.value for d in FUSED_DRAWS]} (no draw changes the shape), "
                             f"got {draw!r}")
        if not walks_on_device(verifier, parents, draw):
            raise ValueError(f"{verifier} has no device walk for this shape drawn {Draw(draw).value!r}: a node has "
                             "3 or more children drawn 'swor' (ordered Traversal's sorted laws enumerate tuples on "
                             "the host)")
        self.draw = Draw(draw)
        self.parents = tuple(check_int(f"parents[{i}]", p, minimum=-1) for i, p in enumerate(parents))
        tab = _tables(self.parents, [check_int(f"order[{i}]", v, minimum=0) for i, v in enumerate(order)])
        self.order = tuple(tab["order"])
        self.verifier, self.sampling, self.d_sampling = verifier, sampling, d_sampling
        self.size = n = len(self.parents)
        self.depth = len(tab["layers"])
        self.forwards = self.depth  # draft forwards: the pending tokens, then each layer but the last
        self.draft_uniforms, self.noise = (0 if self.draw == Draw.TOPK else n), n + 1
        self.fed = len(tab["fed"])
        dev = self.device
        self.plan = TreePlan.of(self.parents, self.draw, dev)
        self._tab = tab
        # each layer's nodes as a range (_tree_layout takes breadth-first shapes only): its uniforms are a slice
        self._spans = [(layer[0], layer[-1] + 1) for layer in tab["layers"]]
        self._staging(self.draft_uniforms + self.noise)  # the draws' uniforms (i.i.d.), then the verifier's

        def long(values: Any) -> torch.Tensor:
            return torch.as_tensor(np.asarray(values, dtype=np.int64), device=dev)

        with torch.inference_mode(False):
            self._fed_slots = [long(s) for s in tab["fed_slots"]]
            self._fed_masks = [torch.as_tensor(m, device=dev) for m in tab["fed_masks"]]
            # each layer's nodes' parent rows in the forward they are drawn from (the root's one row first)
            self._parent_rows = [long([0] * len(tab["layers"][0]))] + [long(r) for r in tab["parent_rows"]]
            self._q_rows = long([0] + [v + 1 for v in tab["fed"]])  # the verifier rows the processed rows fill
            self._t_order = long(tab["order"])
            self._t_depths = long(tab["t_depths"])
            self._t_mask = torch.as_tensor(tab["t_mask"], device=dev)
            # sliding windows (module doc): the tree part of each forward's window-cut mask, fixed per shape
            self._t_window = None if t_cache.window is None else t_cache.window.size
            self._d_window = None if d_cache.window is None else d_cache.window.size
            self._t_near: torch.Tensor | None = None
            self._d_near: list[torch.Tensor] = []
            if self._t_window is not None:  # a node sees an ancestor fewer than `size` layers up
                gap = np.subtract.outer(tab["t_depths"], tab["t_depths"])
                self._t_near = torch.as_tensor(tab["t_mask"] & (gap < self._t_window), device=dev)
            if self._d_window is not None:  # an earlier layer's slot reads as its position, the layer's own do not
                offsets = np.arange(self.fed)
                self._d_near = [torch.as_tensor(m & ((offsets > d - self._d_window)
                                                     | (offsets >= min(tab["fed_slots"][d])))[None, :], device=dev)
                                for d, m in enumerate(tab["fed_masks"])]
            self._t_rows = long(tab["t_rows"])
            self._t_slots = torch.arange(n + 1, dtype=torch.int64, device=dev)
            self._two_rows = torch.arange(2, dtype=torch.int64, device=dev)
            keep = _Keep(t_at=long(tab["t_rows"][1:] + [0]),  # a path's padding entry (-1) maps to the last: 0
                         t_path=torch.arange(self.depth, dtype=torch.int64, device=dev),
                         fed_at=long(tab["fed_at"] + [-1]),  # ... and to -1 here
                         d_path=torch.arange(max(self.depth - 1, 0), dtype=torch.int64, device=dev))
            # draws without replacement, per layer and sibling rank: the nodes' parent rows, their places in the layer
            self._swor_ranks = [] if self.draw != Draw.SWOR else [
                [(long([par_rows[i] for i in range(len(ranks)) if ranks[i] == j]),
                  long([i for i in range(len(ranks)) if ranks[i] == j])) for j in range(max(ranks) + 1)]
                for par_rows, (_, _, ranks) in zip([[0] * len(tab["layers"][0])] + tab["parent_rows"], tab["ranked"])]
            # ranked draws, per layer: the parents' rows, each node's entry of their flattened (P, k) ranking
            self._rank_rows, self._rank_picks, self._rank_k, self._always_short = [], [], [], []
            for rows, of_node, ranks in tab["ranked"] if self.draw == Draw.TOPK else ():
                k = min(max(ranks) + 1, self.vocab)  # draft_tree's rule: a rank past the vocabulary is short
                self._rank_rows.append(long(rows))
                self._rank_picks.append(long([j * k + min(r, k - 1) for j, r in zip(of_node, ranks)]))
                self._rank_k.append(k)
                self._always_short.append(max(ranks) >= self.vocab)
        top = min(self.vocab, self._d_vocab) - 1
        layers: dict[Draw, Callable[..., Any]] = {Draw.IID: _draw_layer, Draw.SWOR: _swor_layer, Draw.TOPK: _rank_layer}
        draw_fn = functools.partial(layers[self.draw], sampling=d_sampling, top=top)
        head_fn = functools.partial(_tree_head, sampling=sampling, verifier=verifier, plan=self.plan,
                                    t_rows=self._t_rows, q_rows=self._q_rows if self.draw != Draw.TOPK else None,
                                    keep=keep)
        self._kernels(draw_fn, head_fn, compile_backend, compile_scope)

    # --- buffers ---------------------------------------------------------------------------

    def _prepare(self, t_need: int, d_need: int) -> None:
        """Grow the caches to hold ``t_need`` / ``d_need`` slots; (re)make the buffers when a cache moved."""
        if not self._grow(t_need, d_need):
            return
        self._first = self.d_cache._new_size(2)  # the pending token(s): always two rows
        self._layer_bufs = [self.d_cache._new_size(len(layer)) for layer in self._tab["layers"][:-1]]
        self._verify = self.t_cache._new_size(self.size + 1)  # the root and every node
        with torch.inference_mode(False):
            self._t_cols = torch.arange(self.t_cache.capacity, dtype=torch.int64, device=self.device)
            self._d_cols = torch.arange(self.d_cache.capacity, dtype=torch.int64, device=self.device)

    # --- the step's device work --------------------------------------------------------------

    @staticmethod
    def _sees(cols: torch.Tensor, start: torch.Tensor, table: torch.Tensor,
              lowest: torch.Tensor | None = None) -> torch.Tensor:
        """``(m, capacity)``: the context (the slots below ``start``; with ``lowest``, ``(m,)`` or ``(1,)``, only
        those from each row's ``lowest``) and, of the ``table.shape[1]`` slots from ``start``, those ``table``
        opens for each row."""
        width = table.shape[1]
        rel = cols - start
        inside = (rel >= 0) & (rel < width)
        context = (rel < 0)[None, :]
        if lowest is not None:
            context = context & (cols[None, :] >= lowest[:, None])
        return context | (inside[None, :] & table[:, rel.clamp(0, max(width - 1, 0))])

    def _pending_rows(self, d_len: torch.Tensor, pending: torch.Tensor) -> torch.Tensor:
        """The draft's logits ``(2, V)`` for its pending token and the padding row (or the two pending tokens)."""
        pos = d_len + self._two_rows
        seen = self._d_cols[None, :] <= pos[:, None]
        near = None if self._d_window is None else seen & (self._d_cols[None, :] > pos[:, None] - self._d_window)
        return self._fit(self._feed(self.d_cache, self._first, self._draft_ids(pending), pos, pos, seen, near))

    @torch.no_grad()
    def _run(self) -> tuple[torch.Tensor, list[torch.Tensor], torch.Tensor]:
        """The step from the staged inputs: ``(out, draft logits, target logits)``, with no host sync.

        ``out`` is int64 ``(3 + depth + N,)``: the fault flag, the accepted count, the emitted token, the
        accepted nodes (``-1`` after the last), every drawn token."""
        ints = self._ints
        u_draft, u_verify = self._u[: self.draft_uniforms], self._u[self.draft_uniforms :]
        t_len, d_len, root, two = ints[0], ints[1], ints[2], ints[5]
        first = self._pending_rows(d_len, ints[3:5])
        raw = [first.index_select(0, ints[5:6])]  # the row after the pending tokens
        start = d_len + 1 + two  # the slot of the first fed node; the root's position is start - 1
        rows: list[torch.Tensor] = []  # the processed rows each layer is drawn from (the verifier's q)
        drawn: list[torch.Tensor] = []
        short: list[torch.Tensor] = []  # ranked / swor draws: some node fell on a token with q = 0
        for d, (lo, hi) in enumerate(self._spans):
            if self.draw == Draw.IID:
                row, tok = self._draw(raw[-1], self._parent_rows[d], u_draft[lo:hi])
                rows.append(row)
            elif self.draw == Draw.SWOR:
                row, tok, cut = self._draw(raw[-1], self._swor_ranks[d], u_draft[lo:hi])
                rows.append(row)
                short.append(cut)
            else:
                tok, cut = self._draw(raw[-1], self._rank_rows[d], self._rank_picks[d], self._rank_k[d],
                                      self._always_short[d])
                short.append(cut)
            drawn.append(tok)
            if d < len(self._spans) - 1:  # the last layer is never fed
                raw.append(self._layer_logits(d, tok, start))
        x = torch.cat(drawn)  # every node's token, index order (layers are consecutive ranges)
        t_ids = torch.cat([root.reshape(1), x.index_select(0, self._t_order)])
        t_logits = self._target_logits(t_ids, t_len)
        out, *moves = self._head(t_logits, x, rows, raw, short, u_verify, t_len, start)
        self._keep(*moves)
        return out, raw, t_logits

    def _target_logits(self, ids: torch.Tensor, t_len: torch.Tensor) -> torch.Tensor:
        """The target's logits ``(N + 1, V)`` for the root and the nodes in layout order, at slots from ``t_len``."""
        pos = t_len + self._t_depths
        near = None
        if self._t_near is not None and self._t_window is not None:  # the context seen from pos - size + 1 on
            near = self._sees(self._t_cols, t_len, self._t_near, pos - self._t_window + 1)
        return self._feed(self.t_cache, self._verify, ids, pos, t_len + self._t_slots,
                          self._sees(self._t_cols, t_len, self._t_mask), near)

    def _layer_logits(self, d: int, tokens: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
        """The draft's logits for fed layer ``d`` (depth ``d + 1``), its nodes at their slots from ``start``."""
        allowed = self._sees(self._d_cols, start, self._fed_masks[d])
        pos = (start + d).expand(tokens.shape[0])
        near = None
        if self._d_window is not None:  # the context seen from pos - size + 1 on
            near = self._sees(self._d_cols, start, self._d_near[d], (start + d - self._d_window + 1).reshape(1))
        return self._fit(self._feed(self.d_cache, self._layer_bufs[d], self._draft_ids(tokens), pos,
                                    start + self._fed_slots[d], allowed, near))

    def _keep(self, t_dst: torch.Tensor, t_src: torch.Tensor, d_dst: torch.Tensor, d_src: torch.Tensor) -> None:
        """Move the accepted nodes' keys and values to the slots after each cache's context (module doc), from
        the slots the head computed (:func:`_keep_slots`): two gathers and two writes."""
        for kv, dst, src in ((self.t_cache.kv, t_dst, t_src), (self.d_cache.kv, d_dst, d_src)):
            if dst.numel():  # a one-layer tree moves nothing in the draft's cache
                kv.index_copy_(-2, dst, kv.index_select(-2, src))

    # --- the host side -----------------------------------------------------------------------

    @torch.no_grad()
    def profile(self, t_past: int, root: int, d_past: int, pending: Sequence[int], reps: int = 50) -> dict[str, float]:
        """:meth:`spec.llm.step_graph.ChainStepGraph.profile` for the tree step: the whole step, its forwards
        alone (the pending rows, each fed layer and the target, every token the root) and the target forward
        alone, in milliseconds, and ``overhead_pct`` = (step - forwards) / target; ``call_ms`` and
        ``call_overhead_pct`` the same for the step as the decode calls it (:meth:`draw_step`), ``host_ms`` and
        ``host_pct`` that call without the replay or run.  The caches' lengths do not
        change."""
        reps = check_int("reps", reps, minimum=1)
        t_past, d_past = self._check_state(t_past, root, d_past, pending)  # ints: call() restores them
        n = self.size
        calls = self._profile_calls(t_past, root, d_past, pending)  # stages and captures

        def forwards() -> torch.Tensor:
            ints = self._ints
            start = ints[1] + 1 + ints[5]
            self._pending_rows(ints[1], ints[3:5])
            for d, layer in enumerate(self._tab["layers"][:-1]):
                self._layer_logits(d, ints[2].expand(len(layer)), start)
            return self._target_logits(ints[2].expand(n + 1), ints[0])

        def target() -> torch.Tensor:
            return self._target_logits(self._ints[2].expand(n + 1), self._ints[0])

        return self._time_in_turns(self._body, forwards, target, reps, calls)

    def step(self, t_past: int, root: int, d_past: int, pending: Sequence[int],
             u_draft: NDArray[np.float64] | None, u_verify: NDArray[np.float64]) -> ChainStepResult | None:
        """One step after ``t_past`` target positions (the root ``root`` not among them) and ``d_past``
        draft positions followed by ``pending`` (one or two tokens); one upload, one transfer back.

        ``u_draft``: the ``N`` uniforms of the draws (``None`` for ranked draws); ``u_verify``: the
        verifier's ``N + 1``.  Both caches' lengths must be ``t_past`` and ``d_past``; afterwards they hold
        the context and the accepted path.  Logits a :class:`~spec.llm.sampling.Sampling` refuses raise its
        ``ValueError`` (the draft's first), the caches' lengths still ``t_past`` / ``d_past`` and the context's
        slots untouched (they may have grown).  The result's ``drafted`` holds every node's token.  ``None``
        when a ranked node fell on a token with ``q = 0`` or a ``swor`` node's law had no mass left (the
        host builder grows a smaller tree there): the
        step is void, its uniforms unused, and both caches' lengths are still ``t_past`` / ``d_past`` (the
        context's slots untouched), so the caller can run the step another way.
        """
        n, m = self.size, self.draft_uniforms
        t_past, d_past = self._check_state(t_past, root, d_past, pending)
        drawn, verify = self._check_uniforms(u_draft, u_verify, m or None, n + 1,
                                             f"give {m or None} draft uniforms and {n + 1} verifier uniforms")
        self._put_uniforms(drawn, verify)
        return self._finish(t_past, root, d_past, pending)

    def _finish(self, t_past: int, root: int, d_past: int, pending: Sequence[int]) -> ChainStepResult | None:
        got = self._launch(t_past, root, d_past, pending, (t_past + self.size + 1, d_past + 2 + self.fed))
        if got[0] & SHORT:
            return None
        k, y = got[1], got[2]
        nodes, drafted = got[3 : 3 + k], got[3 + self.depth :]
        t_next = t_past + 1 + k
        d_next = d_past + len(pending) + min(k, self.depth - 1)
        self.t_cache.length, self.d_cache.length = t_next, d_next
        path = [drafted[v] for v in nodes]
        nxt = (path[-1], y) if k == self.depth else (y,)
        return ChainStepResult(k, path + [y], drafted, t_next, d_next, nxt)


class _Keep(NamedTuple):
    """A shape's tables for moving the accepted path (:func:`_keep_slots`), int64 device tensors."""

    t_at: torch.Tensor  # (N + 1,): each node's offset from the target's context, the padding entry's 0
    t_path: torch.Tensor  # (depth,): 0, 1, ...
    fed_at: torch.Tensor  # (N + 1,): each node's offset among the draft's fed slots; -1: last layer, padding
    d_path: torch.Tensor  # (depth - 1,): 0, 1, ...


def _keep_slots(path: torch.Tensor, t_len: torch.Tensor, start: torch.Tensor,
                keep: _Keep) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Where the accepted ``path`` (``(depth,)`` nodes, ``-1`` after the last) moves, in each cache: ``(t_dst,
    t_src, d_dst, d_src)``.  The target's slots after its context ``t_len`` and the root take the path's
    nodes, from their slots in the target's layout; the draft's from ``start`` (its first fed slot) take the
    path's fed nodes.  A padding entry, or a node the draft never fed, moves its slot onto itself."""
    size = keep.t_at.shape[0]  # N + 1: ``path % size`` sends -1 to the tables' padding entry
    t_dst = t_len + 1 + keep.t_path
    t_src = torch.where(path >= 0, t_len + keep.t_at.index_select(0, path % size), t_dst)
    at = keep.fed_at.index_select(0, path[: keep.d_path.shape[0]] % size)
    d_dst = start + keep.d_path
    return t_dst, t_src, d_dst, torch.where(at >= 0, start + at, d_dst)


def _tree_head(t_logits: torch.Tensor, x: torch.Tensor, rows: Sequence[torch.Tensor], raw: Sequence[torch.Tensor],
               short: Sequence[torch.Tensor], u: torch.Tensor, t_len: torch.Tensor, start: torch.Tensor, *,
               sampling: Sampling, verifier: str, plan: TreePlan, t_rows: torch.Tensor, q_rows: torch.Tensor | None,
               keep: _Keep) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The tree step's verification from the target's logits: the step's output, int64 ``(3 + depth + N,)`` =
    the flag (the fault of the draft's ``raw`` and the target's logits, plus :data:`SHORT` when a ranked or
    swor draw fell short), the accepted count, the emitted token, the accepted nodes
    (:func:`~spec.llm.tree_device.tree_head` on the trusted rows) and the drafted tokens ``x``; then the
    cache moves of the accepted path (:func:`_keep_slots`, the target's context ending at ``t_len``, the
    draft's fed slots from ``start``).  ``p``: the target's rows ``t_rows`` processed; ``q``: the layers'
    processed ``rows`` at the verifier rows ``q_rows`` (``None``: ranked draws, no rows).  One function, so
    that ``compile_step`` fuses the target's rows, the fault flags, the walk and the slot arithmetic, as a
    chain's head does."""
    p, fault = target_rows_and_fault(sampling, t_logits, raw, t_rows)
    q = None if q_rows is None else torch.zeros_like(p).index_copy(0, q_rows, torch.cat(list(rows)))
    flag = fault.to(torch.int64) + (SHORT * torch.stack(list(short)).any().to(torch.int64) if short else 0)
    head = tree_head(verifier, plan, x, q, p, u, trusted=True)  # (bad = 0, n, y, path)
    return (torch.cat([flag.reshape(1), head[1:], x]), *_keep_slots(head[3:], t_len, start, keep))


def _draw_layer(logits: torch.Tensor, parent_rows: torch.Tensor, u: torch.Tensor, *, sampling: Sampling,
                top: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One layer's draws: the processed rows ``(m, V)`` of ``logits`` and each node's token, drawn by inverse
    CDF with its uniform from its parent's row (``parent_rows``: each node's row index), clamped to
    ``[0, top]`` (:meth:`spec.llm.adapter.LLMDraft.draft_tree`'s rule)."""
    rows = sampling.probs_unchecked(logits)
    tok = categorical_draw(rows.index_select(0, parent_rows), u)
    return rows, clamp_ids(tok, top, rows.shape[-1])


def _swor_layer(logits: torch.Tensor, ranks: Sequence[tuple[torch.Tensor, torch.Tensor]], u: torch.Tensor, *,
                sampling: Sampling, top: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One layer's draws without replacement (:meth:`spec.llm.adapter.LLMDraft.draft_tree` with ``swor``): the
    processed rows ``(m, V)`` of ``logits``, each node's token (:func:`~spec.llm.sampling.swor_draws` with
    ``ranks``, the layer's per-rank parent rows and places), clamped to ``[0, top]``, and its short flag."""
    rows = sampling.probs_unchecked(logits)
    tok, short = swor_draws(rows, ranks, u)
    return rows, clamp_ids(tok, top, rows.shape[-1]), short


def _rank_layer(logits: torch.Tensor, parents: torch.Tensor, picks: torch.Tensor, k: int, always_short: bool, *,
                sampling: Sampling, top: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One layer's ranked draws (:meth:`spec.llm.adapter.LLMDraft.draft_tree` with no uniforms): each node's
    token, the entry ``picks`` of its parent's ``k`` most likely tokens (the rows ``parents`` of the processed
    ``logits``; each row's argmax when ``k == 1``), clamped to ``[0, top]``, and a 0-d bool: some node fell
    on a token with ``q = 0`` (or ``always_short``: a rank past the vocabulary)."""
    rows = sampling.probs_unchecked(logits).index_select(0, parents)
    if k == 1:  # one child per parent, in the parents' order
        tok = rows.argmax(dim=-1)
        short = torch.zeros((), dtype=torch.bool, device=rows.device)
    else:
        ranked, values = ranked_tokens(rows, k)
        tok = ranked.reshape(-1).index_select(0, picks)
        short = (values.reshape(-1).index_select(0, picks) <= 0.0).any()
    if always_short:
        short = torch.ones((), dtype=torch.bool, device=rows.device)
    return clamp_ids(tok, top, rows.shape[-1]), short


def shared_tree_step(target: Any, draft: Any, t_cache: StaticTreeCache, d_cache: StaticTreeCache, *,
                     parents: Sequence[int], order: Sequence[int], verifier: str, sampling: Sampling,
                     d_sampling: Sampling, vocab: int, draw: Draw | str = Draw.IID,
                     compile_backend: str | None = None, compile_scope: str = "parts",
                     io: str | None = None) -> TreeStepGraph:
    """The :class:`TreeStepGraph` of these caches and settings, made once and reused across decodes
    (:func:`spec.llm.step_graph.shared_chain_step`'s rule)."""
    io = resolve_io(io)
    key = ("tree", id(d_cache), tuple(parents), tuple(order), verifier, sampling, d_sampling, vocab,
           getattr(draw, "value", draw), compile_backend, compile_scope, io)
    return shared_step(t_cache, key, TreeStepGraph, target, draft, d_cache, lambda: TreeStepGraph(
        target, draft, t_cache, d_cache, parents=parents, order=order, verifier=verifier, sampling=sampling,
        d_sampling=d_sampling, vocab=vocab, draw=draw, compile_backend=compile_backend,
        compile_scope=compile_scope, io=io))
