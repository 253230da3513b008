"""Example verifiers for the bias audit: lossless references and BIASED ones.

Notation (DESIGN.md §3): ``p`` is the target model, ``q`` the draft.  Chain
verifiers take ``(ref, q_rows, p_rows, rng)`` like :func:`tmc.sps_sample`;
tree verifiers take ``(tree, p_rows, rng)`` like
:func:`tmc.multidraft.multidraft_sample`, where ``p_rows[0]`` is the target
row at the root and ``p_rows[i + 1]`` the row after node ``i``'s path.

**How the audit finds a kernel.**  Every example is a :class:`ChainVerifier`
or :class:`TreeVerifier`: a frozen record holding the sampler, the exact
kernel when one can be written (``None`` otherwise), the ground-truth label
``biased`` and, for trees, the draft draw kinds the verifier is meant to be
paired with.  The record is itself callable with the sampler's convention,
so ``tmc audit verification.examples:TUTORIAL_TREE_WALK --kind tree`` and a
plain function such as ``tmc.sps_sample`` are audited through one entry
point: a record with a kernel is audited exactly, anything else by
calibrated sampling.  Wrap your own verifier in a record to give it a kernel.

The BIASED examples reproduce verifiers that look plausible but do not
preserve the target law:

* :data:`TUTORIAL_TREE_WALK` — the nanoGPT tree-speculation tutorial
  (``002_2ce1e914bdf19cc9.txt``, "Accept/Reject: Walking the Tree"): every
  node of a top-k tree gets an independent test ``u < min(1, p/q)`` with the
  draft softmax ``q`` of its parent, the longest accepted root path wins
  (first found in DFS order), a bonus token comes from ``p`` at its end, and
  if no first-level child passes, a token from ``norm((p − q)_+)`` at the root.
* :data:`WETAP_BEAM` — WETAP's verifier (``004_4d052269d5cf7467.txt``,
  Algorithm 1 lines 27–51, eq. (9)): deterministic threshold test
  ``min(1, P(beam)/Q(beam)) > τ`` on cumulative beam probabilities, deepest
  layer first, the accepted node with the largest cumulative target
  probability, then one token from ``p`` after it.
* :data:`GREEDY_MATCH` — exact-match ("greedy") verification used with a
  sampled target: keep draft tokens while they equal ``argmax p``, then emit
  ``argmax p``.  Lossless only when every target row is one-hot.
* :data:`BROKEN_TRAVERSAL` — Traversal Verification (:mod:`tmc.traversal`)
  with the parent's acceptance value left un-updated after a child is
  deleted (:mod:`verification.broken_traversal`).
* :data:`BROKEN_KSEQ` — SpecTr's K-SEQ (:mod:`tmc.kseq`) with the division
  factor fixed to ``ρ = 1`` (:mod:`verification.broken_kseq`).
* :data:`IID_RULE_ON_SWOR` and :data:`IID_RULE_ON_TOPK` — SpecInfer's
  residual rule, which assumes every child was drawn i.i.d. from ``q``, run on
  trees drawn without replacement, or deterministically (top-k).  The same
  rule on i.i.d. drafts (:data:`IID_RULE_ON_IID`) is lossless: the bias is in
  the pairing, not in the rule.  These are :mod:`tmc.multidraft`'s own
  verifier with one argument changed, ``proposals=iid_proposals``: the
  biased examples differ from the correct code in that one function only.

The lossless references wrap :mod:`tmc.chain` (SpS, ASpS, block) and
:mod:`tmc.multidraft` (residual verification with the recorded proposal law).
Wherever an example takes a residual it uses the one residual rule,
:func:`tmc.residual.residual`, and its acceptance test
:func:`tmc.residual.acceptance_probability`.

Where the papers leave a detail open, the choice made here is stated in the
docstring of the function that makes it.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

from tmc.chain import (
    asps_kernel,
    asps_sample,
    block_kernel,
    block_sample,
    sps_kernel,
    sps_sample,
)
from tmc.multidraft import ALL_DRAWS as ALL_DRAWS  # re-exported: the audit imports it from here
from tmc.multidraft import (
    ROOT,
    Draw,
    DraftTree,
    check_tree_p_rows,
    multidraft_kernel,
    multidraft_sample,
    multidraft_sample_from_uniforms,
)
from tmc.noise import categorical, check_uniforms
from tmc.residual import acceptance_probability, residual
from tmc.kseq import kseq_kernel, kseq_sample
from tmc.ordered_traversal import ordered_traversal_kernel, ordered_traversal_sample
from tmc.traversal import traversal_kernel, traversal_sample
from tmc.validate import as_rng, check_chain
from verification.broken_kseq import broken_kseq_kernel, broken_kseq_sample
from verification.broken_traversal import broken_traversal_kernel, broken_traversal_sample

FloatArray = NDArray[np.float64]
Rng = np.random.Generator | int  # a Generator or an integer seed (tmc.validate.as_rng)
# A record's sampler gets a Generator: the record's __call__ turns an integer seed into one.
ChainSampleFn = Callable[[ArrayLike | Sequence[int], ArrayLike, ArrayLike, np.random.Generator], list[int]]
ChainKernelFn = Callable[[ArrayLike | Sequence[int], ArrayLike, ArrayLike], FloatArray]
TreeSampleFn = Callable[[DraftTree, ArrayLike, np.random.Generator], list[int]]
TreeKernelFn = Callable[[DraftTree, ArrayLike], FloatArray]


@dataclass(frozen=True)
class ChainVerifier:
    """A chain verifier: sampler, optional exact kernel and ground-truth label."""

    name: str  # short identifier used in reports
    sample: ChainSampleFn  # one step: (ref, q_rows, p_rows, rng) -> emitted tokens
    kernel: ChainKernelFn | None = None  # exact (n + 1, V) output law, None if unknown
    biased: bool = False  # ground truth: True if the output law is not the target's
    source: str = ""  # where the rule comes from (paper, section)

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("name must be a non-empty string")
        if not callable(self.sample):
            raise ValueError(f"sample of verifier {self.name!r} is not callable")
        if self.kernel is not None and not callable(self.kernel):
            raise ValueError(f"kernel of verifier {self.name!r} is not callable")

    @property
    def kind(self) -> Literal["chain"]:
        return "chain"

    def __call__(
        self, ref: ArrayLike | Sequence[int], q_rows: ArrayLike, p_rows: ArrayLike, rng: Rng
    ) -> list[int]:
        """One step; ``rng`` is a ``numpy.random.Generator`` or an integer seed."""
        return self.sample(ref, q_rows, p_rows, as_rng(rng))


@dataclass(frozen=True)
class TreeVerifier:
    """A tree verifier: sampler, optional exact kernel, ground truth and draft draw kinds."""

    name: str  # short identifier used in reports
    sample: TreeSampleFn  # one step: (tree, p_rows, rng) -> emitted tokens
    kernel: TreeKernelFn | None = None  # exact (N + 1, V) output law, None if unknown
    biased: bool = False  # ground truth: True if the output law is not the target's
    draws: tuple[Draw, ...] = ALL_DRAWS  # how the drafts it is paired with are drawn
    source: str = ""  # where the rule comes from (paper, section)

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("name must be a non-empty string")
        if not callable(self.sample):
            raise ValueError(f"sample of verifier {self.name!r} is not callable")
        if self.kernel is not None and not callable(self.kernel):
            raise ValueError(f"kernel of verifier {self.name!r} is not callable")
        if not self.draws or any(not isinstance(d, Draw) for d in self.draws):
            raise ValueError(f"draws of verifier {self.name!r} must be a non-empty tuple of Draw")

    @property
    def kind(self) -> Literal["tree"]:
        return "tree"

    def __call__(self, tree: DraftTree, p_rows: ArrayLike, rng: Rng) -> list[int]:
        """One step; ``rng`` is a ``numpy.random.Generator`` or an integer seed."""
        return self.sample(tree, p_rows, as_rng(rng))


Verifier = ChainVerifier | TreeVerifier


# ------------------------------------------------------------ tree helpers


def _draft_row(tree: DraftTree, node: int) -> FloatArray:
    """The draft softmax ``q(· | node)``; these verifiers need it even for top-k children."""
    row = tree.q_rows.get(node)
    if row is None:
        raise ValueError(f"tree has no q_rows[{node}]: this verifier needs the draft row of every expanded node")
    return row


def _depths(tree: DraftTree) -> list[int]:
    """Depth of each node (1 for the root's children)."""
    return [tree.node_depth(i) for i in range(tree.size)]


# ------------------------------------------------- BIASED: tutorial walk


def _tutorial_accept_probs(tree: DraftTree, p: FloatArray) -> FloatArray:
    """Per-node acceptance probability ``min(1, p_parent(x) / q_parent(x))``."""
    acc = np.zeros(tree.size)
    for i, (par, tok) in enumerate(zip(tree.parents, tree.tokens)):
        acc[i] = acceptance_probability(float(p[par + 1, tok]), float(_draft_row(tree, par)[tok]))
    return acc


def _tutorial_root_fallback(tree: DraftTree, p: FloatArray) -> FloatArray:
    """Law of the token emitted when no first-level child passes.

    Every first-level child stores a token from ``norm((p_root − q_root)_+)``
    (they share ``q_root``); the tutorial returns one of them.  A tree with no
    children at all emits from ``p``.  The residual is :func:`tmc.residual.residual`
    with the first child as the rejected token; which child only matters in
    its degenerate case ``p_root = q_root``, where the fallback is reached
    with probability 0 (up to rounding).
    """
    root: FloatArray = p[0]
    kids = tree.children(ROOT)
    if not kids:
        return root
    return residual(p[0], _draft_row(tree, ROOT), tree.tokens[kids[0]])


def tutorial_tree_walk_kernel(tree: DraftTree, p_rows: ArrayLike) -> FloatArray:
    """Exact output law ``(N + 1, V)`` of the tutorial's tree walk.  BIASED.

    Every node passes independently with probability ``a_i``; the walk
    selects the deepest node reachable through passed nodes, the first one in
    DFS (pre-)order on ties, because the tutorial replaces its best path only
    by a strictly longer one.  Processing the children of a node in order,
    a later subtree wins only when it reaches strictly deeper, which gives the
    law of the selected node by one bottom-up pass.
    """
    p = check_tree_p_rows(tree, p_rows)
    acc = _tutorial_accept_probs(tree, p)
    depth = {ROOT: 0, **dict(enumerate(_depths(tree)))}
    chosen: dict[int, dict[int, float]] = {}  # node -> law of the selected node, given node passed
    for node in [*range(tree.size - 1, -1, -1), ROOT]:
        law: dict[int, float] = {node: 1.0}
        for kid in tree.children(node):
            law = _merge_subtree(law, chosen[kid], float(acc[kid]), depth)
        chosen[node] = law
    kernel = np.zeros_like(p)
    for node, prob in chosen[ROOT].items():
        row = _tutorial_root_fallback(tree, p) if node == ROOT else p[node + 1]
        kernel[node + 1] += prob * row
    return kernel


def _merge_subtree(
    current: dict[int, float], subtree: dict[int, float], accept: float, depth: dict[int, int]
) -> dict[int, float]:
    """Law of the selection after also walking one more child subtree (passed w.p. ``accept``)."""
    out: dict[int, float] = defaultdict(float)
    for x, px in current.items():
        out[x] += px * (1.0 - accept)
        for y, py in subtree.items():
            winner = y if depth[y] > depth[x] else x
            out[winner] += px * accept * py
    return dict(out)


def tutorial_tree_walk_from_uniforms(tree: DraftTree, p_rows: ArrayLike, u: ArrayLike) -> list[int]:
    """One step of the tutorial's tree walk driven by ``N + 1`` uniforms.  BIASED.

    ``u[i]`` is node ``i``'s independent accept test, ``u[N]`` draws the final
    (bonus or fallback) token.
    """
    p = check_tree_p_rows(tree, p_rows)
    uu = check_uniforms("u", u, tree.size + 1)
    passed = uu[: tree.size] < _tutorial_accept_probs(tree, p)
    best, best_depth = ROOT, 0

    def visit(node: int, depth: int) -> None:
        nonlocal best, best_depth
        for kid in tree.children(node):
            if passed[kid]:
                if depth + 1 > best_depth:
                    best, best_depth = kid, depth + 1
                visit(kid, depth + 1)

    visit(ROOT, 0)
    row = _tutorial_root_fallback(tree, p) if best == ROOT else p[best + 1]
    return list(tree.path(best)) + [categorical(row, float(uu[tree.size]))]


def tutorial_tree_walk_sample(tree: DraftTree, p_rows: ArrayLike, rng: Rng) -> list[int]:
    """One step of the tutorial's independent-per-node tree walk.  BIASED (see module doc).

    ``rng`` is a ``numpy.random.Generator`` or an integer seed.
    """
    if not isinstance(tree, DraftTree):
        raise ValueError(f"tree must be a DraftTree, got {type(tree).__name__}")
    return tutorial_tree_walk_from_uniforms(tree, p_rows, as_rng(rng).random(tree.size + 1))


# ---------------------------------------------------- BIASED: WETAP beam


def _log_or_ninf(x: float) -> float:
    return math.log(x) if x > 0.0 else -math.inf


def wetap_select(tree: DraftTree, p_rows: ArrayLike, tau: float) -> int:
    """The node WETAP's deep-to-shallow beam verification stops at (``-1``: none).

    Algorithm 1 lines 29–46: from the deepest layer up, a node passes when
    ``min(1, P/Q) > τ`` with ``P``, ``Q`` the cumulative target and draft
    probabilities of its whole beam (root child down to the node itself,
    eq. (9)); the first layer with a passing node ends the scan.  Line 37's
    update ``if x_j > η`` is garbled in the paper; the prose says the passing
    token "with most cumulative probability" is selected, which we read as the
    largest cumulative *target* probability ``P`` (ties: the earlier node).
    ``P/Q`` follows float semantics: ``Q = 0 < P`` passes, ``P = 0`` never does.
    """
    p = check_tree_p_rows(tree, p_rows)
    _check_tau(tau)
    depth = _depths(tree)
    log_p: list[float] = []
    log_q: list[float] = []
    for par, tok in zip(tree.parents, tree.tokens):
        base_p = 0.0 if par == ROOT else log_p[par]
        base_q = 0.0 if par == ROOT else log_q[par]
        log_p.append(base_p + _log_or_ninf(float(p[par + 1, tok])))
        log_q.append(base_q + _log_or_ninf(float(_draft_row(tree, par)[tok])))
    for layer in range(max(depth, default=0), 0, -1):
        passing = [
            i for i in range(tree.size) if depth[i] == layer and _beam_passes(log_p[i], log_q[i], tau)
        ]
        if passing:
            return max(passing, key=lambda i: (log_p[i], -i))
    return ROOT


def _beam_passes(log_p: float, log_q: float, tau: float) -> bool:
    if log_p == -math.inf:
        return False
    ratio = 1.0 if log_q == -math.inf else min(1.0, math.exp(min(log_p - log_q, 0.0)))
    return ratio > tau


def _check_tau(tau: float) -> None:
    if not (math.isfinite(tau) and 0.0 <= tau <= 1.0):
        raise ValueError(f"tau must be a threshold in [0, 1], got {tau!r}")


def wetap_beam_kernel(tree: DraftTree, p_rows: ArrayLike, tau: float = 0.5) -> FloatArray:
    """Exact output law ``(N + 1, V)`` of WETAP's beam-threshold verifier.  BIASED.

    The accepted node is a deterministic function of the tree and ``p``; the
    step then emits one token from ``p`` after it (line 48–49).
    """
    p = check_tree_p_rows(tree, p_rows)
    node = wetap_select(tree, p, tau)
    kernel = np.zeros_like(p)
    kernel[node + 1] = p[node + 1]
    return kernel


def wetap_beam_from_uniforms(tree: DraftTree, p_rows: ArrayLike, u: ArrayLike, tau: float = 0.5) -> list[int]:
    """One WETAP verification step driven by one uniform (the final token).  BIASED."""
    p = check_tree_p_rows(tree, p_rows)
    uu = check_uniforms("u", u, 1)
    node = wetap_select(tree, p, tau)
    return list(tree.path(node)) + [categorical(p[node + 1], float(uu[0]))]


def wetap_beam_verifier(tau: float = 0.5) -> TreeVerifier:
    """WETAP's beam-threshold verifier with threshold ``tau`` as an auditable record.

    The paper gives no value for ``τ``; 0.5 is our default.  Every ``τ < 1``
    is biased; ``τ = 1`` never accepts and degenerates to plain sampling from
    ``p`` (lossless, one token per step).
    """
    _check_tau(tau)

    def sample(tree: DraftTree, p_rows: ArrayLike, rng: Rng) -> list[int]:
        return wetap_beam_from_uniforms(tree, p_rows, as_rng(rng).random(1), tau)

    def kernel(tree: DraftTree, p_rows: ArrayLike) -> FloatArray:
        return wetap_beam_kernel(tree, p_rows, tau)

    return TreeVerifier(
        name=f"wetap_beam(tau={tau:g})",
        sample=sample,
        kernel=kernel,
        biased=tau < 1.0,
        draws=(Draw.TOPK,),
        source="WETAP (004_4d052269d5cf7467), Algorithm 1 lines 27-51, eq. (9)",
    )


# --------------------------------------------- BIASED: greedy exact match


def greedy_match_kernel(ref: ArrayLike | Sequence[int], q_rows: ArrayLike, p_rows: ArrayLike) -> FloatArray:
    """Exact output law ``(n + 1, V)`` of exact-match verification.  BIASED unless ``p`` is one-hot.

    Accept ``ref[k]`` iff it equals ``argmax p_rows[k]`` (ties: the lowest
    id); at the first mismatch emit ``argmax p_rows[k]``, after a full match
    ``argmax p_rows[n]``.  The step is deterministic given the draft.
    """
    toks, _, p = check_chain(ref, q_rows, p_rows)
    kernel = np.zeros_like(p)
    for k, tok in enumerate(toks):
        best = int(np.argmax(p[k]))
        if int(tok) != best:
            kernel[k, best] = 1.0
            return kernel
    kernel[toks.shape[0], int(np.argmax(p[-1]))] = 1.0
    return kernel


def greedy_match_sample(ref: ArrayLike | Sequence[int], q_rows: ArrayLike, p_rows: ArrayLike, rng: Rng) -> list[int]:
    """One exact-match step (uses no noise).  BIASED when the target is sampled at temperature > 0.

    ``rng`` (a ``numpy.random.Generator`` or an integer seed) is checked but not used.  The rule is walked
    here directly, not read off :func:`greedy_match_kernel`, so the suite's sampler-vs-kernel row compares two
    implementations (until 2026-11-28 this was the kernel's argmax, and a kernel emitting a wrong token still
    passed that row: a statistics audit).
    """
    as_rng(rng)
    toks, _, p = check_chain(ref, q_rows, p_rows)
    out: list[int] = []
    for k, tok in enumerate(toks):
        best = int(np.argmax(p[k]))  # ties: the lowest id
        if int(tok) != best:
            return [*out, best]
        out.append(best)
    return [*out, int(np.argmax(p[len(toks)]))]


# -------------------------------------- BIASED: i.i.d. rule, wrong pairing


def iid_proposals(tree: DraftTree, node: int) -> list[FloatArray]:
    """SpecInfer's proposal rule: the draft row ``q(· | node)`` for every child of ``node``.

    The one thing the i.i.d.-rule examples change in :mod:`tmc.multidraft`'s
    verifier (whose default, :func:`tmc.multidraft.proposal_laws`, reads each
    child's law from its recorded draw kind).  Right for children drawn i.i.d.
    from ``q``; wrong for children drawn without replacement or by top-k.
    """
    kids = tree.children(node)
    if not kids:
        return []
    row = tree.q_rows.get(node)
    if row is None:
        raise ValueError(
            f"tree has no q_rows[{node}]: the i.i.d. rule verifies the children of node {node} "
            "against the draft row q(. | node), so every node with children needs one"
        )
    return [row] * len(kids)


def iid_rule_kernel(tree: DraftTree, p_rows: ArrayLike) -> FloatArray:
    """Exact output law ``(N + 1, V)`` of SpecInfer's rule applied whatever the draw kind.

    Residual verification (DESIGN.md §4) with proposal ``q_i = q(· | node)``
    for every child, i.e. as if all siblings were drawn i.i.d. from the draft
    softmax: :func:`tmc.multidraft.multidraft_kernel` with
    ``proposals=iid_proposals``.  Lossless on i.i.d. trees; BIASED on trees
    drawn without replacement or by top-k.
    """
    return multidraft_kernel(tree, p_rows, proposals=iid_proposals)


def iid_rule_from_uniforms(tree: DraftTree, p_rows: ArrayLike, u: ArrayLike) -> list[int]:
    """One step of the i.i.d. rule driven by ``N + 1`` uniforms (layout of :mod:`tmc.multidraft`)."""
    return multidraft_sample_from_uniforms(tree, p_rows, u, proposals=iid_proposals)


def iid_rule_sample(tree: DraftTree, p_rows: ArrayLike, rng: Rng) -> list[int]:
    """One step of SpecInfer's i.i.d. rule, ignoring how the children were drawn.

    ``rng`` is a ``numpy.random.Generator`` or an integer seed.
    """
    return multidraft_sample(tree, p_rows, rng, proposals=iid_proposals)


# ------------------------------------------------------------ the records

_TUTORIAL = "nanoGPT tree-speculation tutorial (002_2ce1e914bdf19cc9), 'Accept/Reject: Walking the Tree'"
_SPECINFER = "SpecInfer residual rule with proposal q for every child (DESIGN.md §4)"

TUTORIAL_TREE_WALK = TreeVerifier(
    name="tutorial_tree_walk",
    sample=tutorial_tree_walk_sample,
    kernel=tutorial_tree_walk_kernel,
    biased=True,
    draws=(Draw.TOPK,),
    source=_TUTORIAL,
)
WETAP_BEAM = wetap_beam_verifier(0.5)
GREEDY_MATCH = ChainVerifier(
    name="greedy_match",
    sample=greedy_match_sample,
    kernel=greedy_match_kernel,
    biased=True,
    source="exact-match (greedy) verification used with a sampled target",
)
IID_RULE_ON_SWOR = TreeVerifier(
    name="iid_rule_on_swor",
    sample=iid_rule_sample,
    kernel=iid_rule_kernel,
    biased=True,
    draws=(Draw.SWOR,),
    source=_SPECINFER + ", drafts drawn without replacement",
)
IID_RULE_ON_TOPK = TreeVerifier(
    name="iid_rule_on_topk",
    sample=iid_rule_sample,
    kernel=iid_rule_kernel,
    biased=True,
    draws=(Draw.TOPK,),
    source=_SPECINFER + ", drafts drawn by top-k (draft softmax used as their proposal)",
)
IID_RULE_ON_IID = TreeVerifier(
    name="iid_rule_on_iid",
    sample=iid_rule_sample,
    kernel=iid_rule_kernel,
    biased=False,
    draws=(Draw.IID,),
    source=_SPECINFER + ", drafts drawn i.i.d. (SpecInfer: the correct pairing)",
)
SPS = ChainVerifier("sps", sps_sample, sps_kernel, False, "tmc.chain: standard speculative sampling")
ASPS = ChainVerifier("asps", asps_sample, asps_kernel, False, "tmc.chain: ASpS, TMC paper Algorithm 1")
BLOCK = ChainVerifier("block", block_sample, block_kernel, False, "tmc.chain: block verification")
MULTIDRAFT = TreeVerifier(
    name="multidraft",
    sample=multidraft_sample,
    kernel=multidraft_kernel,
    biased=False,
    draws=ALL_DRAWS,
    source="tmc.multidraft: residual verification with each node's recorded proposal law",
)

TRAVERSAL = TreeVerifier(
    name="traversal",
    sample=traversal_sample,
    kernel=traversal_kernel,
    biased=False,
    draws=ALL_DRAWS,
    source="tmc.traversal: Traversal Verification (Weng et al., NeurIPS 2025), leaf to root",
)
BROKEN_TRAVERSAL = TreeVerifier(
    name="broken_traversal",
    sample=broken_traversal_sample,
    kernel=broken_traversal_kernel,
    biased=True,
    draws=ALL_DRAWS,
    source="Traversal Verification with the parent's acceptance value left un-updated after a deletion",
)
ORDERED_TRAVERSAL = TreeVerifier(
    name="ordered_traversal",
    sample=ordered_traversal_sample,
    kernel=ordered_traversal_kernel,
    biased=False,
    draws=ALL_DRAWS,
    source="tmc.ordered_traversal: Traversal Verification visiting siblings by decreasing p/q (this project)",
)
KSEQ = TreeVerifier(
    name="kseq",
    sample=kseq_sample,
    kernel=kseq_kernel,
    biased=False,
    draws=ALL_DRAWS,
    source="tmc.kseq: SpecTr K-SEQ (Sun et al., NeurIPS 2023) at i.i.d. nodes, residual rule elsewhere",
)
BROKEN_KSEQ = TreeVerifier(
    name="kseq_rho_one",
    sample=broken_kseq_sample,
    kernel=broken_kseq_kernel,
    biased=True,
    draws=(Draw.IID,),
    source="SpecTr K-SEQ (Sun et al., NeurIPS 2023) with the division factor fixed to 1",
)

BIASED_EXAMPLES: tuple[Verifier, ...] = (
    TUTORIAL_TREE_WALK,
    WETAP_BEAM,
    GREEDY_MATCH,
    IID_RULE_ON_SWOR,
    IID_RULE_ON_TOPK,
    BROKEN_TRAVERSAL,
    BROKEN_KSEQ,
)
CORRECT_EXAMPLES: tuple[Verifier, ...] = (
    SPS,
    ASPS,
    BLOCK,
    MULTIDRAFT,
    IID_RULE_ON_IID,
    TRAVERSAL,
    ORDERED_TRAVERSAL,
    KSEQ,
)
EXAMPLES: tuple[Verifier, ...] = BIASED_EXAMPLES + CORRECT_EXAMPLES


def example(name: str) -> Verifier:
    """The shipped example called ``name``; ``ValueError`` for an unknown name."""
    for v in EXAMPLES:
        if v.name == name:
            return v
    raise ValueError(f"unknown example {name!r}; known: {', '.join(v.name for v in EXAMPLES)}")
