"""The limit: optimal lossless one-step verification as a linear program (DESIGN.md §6).

Notation (DESIGN.md §3): ``p`` is the target model, ``q`` the draft.  A draft
*outcome* ``d`` (a chain or a tree drawn from ``q``) has probability ``w_d``
and a set of node paths a verifier may accept (the root ``()`` always
included).  A *verifiable output* of ``d`` is an accepted node path ``σ``
followed by one token ``b``: ``s = σ + (b,)``.  Any one-step verifier that
sees ``d`` is a law ``x[d, ·]`` over these outputs, so over all verifiers::

    maximise    Σ_{d,s} len(s) · x[d, s]
    subject to  Σ_s x[d, s] = w_d                            for every outcome d
                Σ_d Σ_{s ≤ t} x[d, s] · P(t | s) = P(t)      for every t, |t| = L, P(t) > 0
                x ≥ 0,

where ``L`` is the longest output length and ``s ≤ t`` means ``s`` is a
prefix of ``t``.  The second family is the completion identity of
DESIGN.md §4 for the averaged output law ``K̄(s) = Σ_d x[d, s]``: it holds
exactly for the lossless verifiers, so the optimum is the best expected
output length any lossless verifier can reach on the same draft.

Scaling.  §6 writes the completion constraint as ``Σ x[d, s] / P(s) = 1``.
Its coefficients ``1 / P(s)`` pass 1e15 as soon as an output carries two
1e-12 factors, and HiGHS then refuses the model ("Model error"), although
the problem is always feasible (the verifier that ignores the draft and
emits one token from ``p``).  Multiplying each row by ``P(t)`` gives
coefficients ``P(t | s) ≤ 1`` but right-hand sides ``P(t)`` far below the
solver's feasibility tolerance (1e-7); in that form HiGHS (1.12, scipy 1.17)
still declared some random V = 4 chains with exact zeros infeasible, with
and without presolve (``ToyModel.random(4, 4, default_rng(337))``, n = 4),
and missed the optimum by up to 9e-7 elsewhere.  So the LP is solved in
*unit* form, with one column per distinct output ``s`` holding
``k(s) = K̄(s) / P(s) ∈ [0, 1]``::

    Σ_s x[d, s] = w_d                      weight row of outcome d
    Σ_d x[d, s] − P(s) · k(s) = 0          linking row of output s
    Σ_{s ≤ t} k(s) = 1                     completion row of path t

The completion row is the §6 row with the factor ``1 / P(s)`` moved into the
variable, so all its coefficients and its right-hand side are 1; the only
path probabilities left are the ``P(s) ≤ 1`` of the linking rows.  ``P(s)``
is a product of target conditionals, never a quotient.  The distinct-output
columns also keep the matrix small: the completion rows hold about
``L · V^L`` entries however many drafts there are.  :func:`build_lp` can
also build the ``conditional`` (``P(t | s)`` rows) and ``naive``
(``1 / P(s)`` rows) forms, for comparison.  Outputs with ``P(s) = 0``
cannot occur in a lossless step, so they get no variable; paths ``t`` with
``P(t) = 0`` give rows that hold trivially and are left out.

HiGHS's presolve declared some of these feasible LPs infeasible in every
form (about one random V = 4, n = 5 chain with exact zeros in twenty), so it
is off by default; a failed solve is retried once with presolve on.

Results are exact up to the solver's tolerances (about 1e-7 on primal
feasibility): compare them with a tolerance of 1e-6, not 1e-12.

References: Hu et al., "Towards optimal multi-draft speculative decoding"
(ICLR 2025) for the closed form of the one-level optimum
(:func:`hu_closed_form_acceptance`).
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy import sparse
from scipy.optimize import linprog

from tmc.drafts import chain_drafts, one_level_draft_law
from tmc.multidraft import Draw
from tmc.toy import Path, ToyModel
from tmc.validate import check_int, check_prob_row, real_scalar

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]

#: Largest allowed |Σ_d w_d − 1| for the draft outcome weights.
WEIGHT_SUM_TOL = 1e-9
#: Largest vocabulary for the 2^V subset enumeration of the closed form.
MAX_CLOSED_FORM_VOCAB = 22
SCALINGS = ("unit", "conditional", "naive")


class Outcome(Protocol):
    """What the LP needs of a draft: its probability and the node paths a verifier may accept.

    :class:`tmc.drafts.DraftChain`, :class:`tmc.drafts.TreeDraft` and
    :class:`DraftOutcome` all qualify.
    """

    @property
    def weight(self) -> float: ...

    @property
    def accepted_paths(self) -> tuple[Path, ...]: ...


@dataclass(frozen=True)
class DraftOutcome:
    """One possible draft (chain or tree) with its probability."""

    weight: float  # w_d: probability that the draft model produces this draft
    accepted_paths: tuple[Path, ...]  # node paths a verifier may accept; the root () is implied


@dataclass(frozen=True, eq=False)
class LPProblem:
    """The linear program of the module doc, ready for ``linprog``.

    Columns: the ``x[d, s]`` first, then one column per distinct output
    (``k(s) = K̄(s) / P(s)`` in unit form, ``K̄(s)`` otherwise).  Rows: one
    weight row per outcome, one linking row per distinct output, then one
    completion row per leaf ``t``.
    """

    variables: tuple[tuple[int, Path], ...]  # column j < n_x is x[d, s] for (d, s) = variables[j]
    outputs: tuple[Path, ...]  # column n_x + i and linking row n_outcomes + i belong to outputs[i]
    output_probs: FloatArray  # (n_outputs,) P(s | prefix) for each output
    cost: FloatArray  # (n_x + n_outputs,) −len(s) on the x columns, 0 after: linprog minimises
    a_eq: Any  # scipy.sparse CSR (n_outcomes + n_outputs + n_leaves, n_x + n_outputs)
    b_eq: FloatArray  # weights w_d, then zeros (linking rows), then the completion right-hand sides
    leaves: tuple[Path, ...]  # the paths t of length L with P(t) > 0, one completion row each
    leaf_probs: FloatArray  # (n_leaves,) P(t | prefix) for each leaf
    n_outcomes: int  # number of draft outcomes: the first n_outcomes rows
    length: int  # L: length of the completion paths t
    scaling: str  # "unit", "conditional" or "naive" (module doc)


@dataclass(frozen=True)
class LPResult:
    """Optimum of the lossless-verification LP."""

    expected_length: float  # optimal E[len(s)]: tokens per step of the best lossless verifier
    status: str  # the solver's message
    n_variables: int  # number of x[d, s] (the LP also has one column per distinct output)
    n_outputs: int  # distinct outputs s: one column and one linking row each
    n_constraints: int  # weight rows, linking rows and completion rows
    output_law: dict[Path, float]  # averaged optimal law K̄(s) = Σ_d x[d, s], zeros left out
    joint: tuple[dict[Path, float], ...]  # x[d, s] per outcome d (= w_d · K_d(s)), zeros left out
    length: int  # L used for the completion rows
    solve_seconds: float  # wall time of linprog alone (both tries when retried)


# ------------------------------------------------------------ draft outcomes


def chain_outcomes(model: ToyModel, n: int, prefix: Path = ()) -> list[DraftOutcome]:
    """Every draft chain of length ``n``: accepted paths ``ref[:k]``, ``k = 0..n``."""
    return [DraftOutcome(d.weight, d.accepted_paths) for d in chain_drafts(model, n, prefix)]


def one_level_outcomes(model: ToyModel, k: int, draws: Draw | str, prefix: Path = ()) -> list[DraftOutcome]:
    """Depth-1 trees of ``k`` root children (see :func:`one_level_draft_law`)."""
    law = one_level_draft_law(model, k, Draw.parse(draws, "draws"), prefix)
    return [DraftOutcome(w, tuple((tok,) for tok in tup)) for tup, w in law.items()]


# ------------------------------------------------------------------ the LP


def _check_outcomes(outcomes: Sequence[Outcome], vocab: int) -> list[list[Path]]:
    """Validate the outcomes; return each one's deduplicated accepted paths, root first."""
    if not outcomes:
        raise ValueError("outcomes is empty: need at least one draft outcome")
    total = 0.0
    paths_per: list[list[Path]] = []
    for i, d in enumerate(outcomes):
        weight = real_scalar(f"outcomes[{i}].weight", d.weight)  # text or None: a ValueError, not a TypeError
        if not np.isfinite(weight) or weight < 0:
            raise ValueError(f"outcomes[{i}].weight = {d.weight!r} must be finite and >= 0")
        total += weight
        # token ids as given: 1.9 was truncated to 1, another token and another optimum
        paths = {tuple(check_int(f"outcomes[{i}] path {tuple(path)!r} token", t) for t in path)
                 for path in d.accepted_paths} | {()}
        for path in paths:
            if any(t < 0 or t >= vocab for t in path):
                raise ValueError(f"outcomes[{i}] path {path!r} has a token outside [0, {vocab})")
            if path and path[:-1] not in paths:
                raise ValueError(
                    f"outcomes[{i}] path {path!r} is accepted without its parent {path[:-1]!r}"
                )
        paths_per.append(sorted(paths, key=lambda s: (len(s), s)))
    if abs(total - 1.0) > WEIGHT_SUM_TOL:
        raise ValueError(f"outcome weights sum to {total!r}, not 1 (tolerance {WEIGHT_SUM_TOL})")
    return paths_per


def _leaf_table(model: ToyModel, length: int, prefix: Path) -> tuple[list[Path], FloatArray]:
    """Paths ``t`` of ``length`` with ``P(t) > 0`` and their target conditionals.

    Returns the leaves and ``cond`` of shape ``(n_leaves, length)`` with
    ``cond[i, j] = p(t_j | prefix + t[:j]) > 0``.
    """
    leaves: list[Path] = []
    conds: list[list[float]] = []
    stack: list[tuple[Path, list[float]]] = [((), [])]
    while stack:
        node, factors = stack.pop()
        if len(node) == length:
            leaves.append(node)
            conds.append(factors)
            continue
        row = model.p(tuple(prefix) + node)
        for a in np.flatnonzero(row > 0)[::-1]:
            stack.append((node + (int(a),), factors + [float(row[a])]))
    return leaves, np.asarray(conds, dtype=np.float64).reshape(len(leaves), length)


def build_lp(
    model: ToyModel,
    outcomes: Sequence[Outcome],
    prefix: Path = (),
    length: int | None = None,
    scaling: str = "unit",
) -> LPProblem:
    """Assemble the LP of the module doc as a sparse matrix.

    ``length`` is ``L``; by default the longest output length.  A longer ``L``
    gives the same optimum (each row is the sum of its children's rows).
    ``scaling`` picks the form of the completion rows (module doc); only
    ``"unit"`` is robust on tiny probabilities.
    """
    if scaling not in SCALINGS:
        raise ValueError(f"scaling must be one of {SCALINGS}, got {scaling!r}")
    paths_per = _check_outcomes(outcomes, model.vocab)
    longest = 1 + max(len(path) for paths in paths_per for path in paths)
    # an integer: with 2.5 no path ever had the length, and the leaf enumeration grew for ever
    L = longest if length is None else check_int("length", length, minimum=1)
    if L < longest:
        raise ValueError(f"length {L} is shorter than the longest output ({longest})")
    leaves, cond = _leaf_table(model, L, prefix)
    ones = np.ones((len(leaves), 1))
    # prefix_prob[i, k] = P(t[:k]) and suffix_prob[i, k] = P(t | t[:k]), (n_leaves, L + 1)
    prefix_prob: FloatArray = np.cumprod(np.hstack([ones, cond]), axis=1, dtype=np.float64)
    reversed_cond = np.hstack([cond, ones])[:, ::-1]
    suffix_prob: FloatArray = np.cumprod(reversed_cond, axis=1, dtype=np.float64)[:, ::-1]
    below: dict[Path, list[int]] = defaultdict(list)  # output s -> leaves t ≥ s
    for i, t in enumerate(leaves):
        for k in range(1, L + 1):
            below[t[:k]].append(i)
    variables: list[tuple[int, Path]] = []
    output_index: dict[Path, int] = {}
    for d, paths in enumerate(paths_per):
        for sigma in paths:
            for b in range(model.vocab):
                s = sigma + (b,)
                if s in below:  # else P(s) = 0: no lossless verifier emits s
                    variables.append((d, s))
                    output_index.setdefault(s, len(output_index))
    outputs = list(output_index)
    n_out, n_x, n_y = len(outcomes), len(variables), len(outputs)
    out_len = np.array([len(s) for s in outputs], dtype=np.int64)
    out_prob: FloatArray = prefix_prob[[below[s][0] for s in outputs], out_len]  # P(s)
    # Completion entries: output column j, leaf row i, for every leaf t ≥ s_j.
    leaf_lists = [np.asarray(below[s], dtype=np.int64) for s in outputs]
    ent_leaf = np.concatenate(leaf_lists)
    ent_out = np.repeat(np.arange(n_y, dtype=np.int64), [len(r) for r in leaf_lists])
    link = np.ones(n_y)  # coefficient of the output column in its linking row
    rhs = np.ones(len(leaves))
    if scaling == "unit":
        coef = np.ones(ent_leaf.shape[0])
        link = out_prob
    elif scaling == "conditional":
        coef = suffix_prob[ent_leaf, out_len[ent_out]]
        rhs = prefix_prob[:, -1]
    else:
        coef = 1.0 / out_prob[ent_out]
    x_cols = np.arange(n_x, dtype=np.int64)
    x_out = np.array([output_index[s] for _, s in variables], dtype=np.int64)
    y_cols = n_x + np.arange(n_y, dtype=np.int64)
    rows = np.concatenate(
        [
            np.array([d for d, _ in variables], dtype=np.int64),  # weight rows: x[d, s]
            n_out + x_out,  # linking rows: x[d, s]
            n_out + np.arange(n_y, dtype=np.int64),  # linking rows: −(P(s)) k(s)
            n_out + n_y + ent_leaf,  # completion rows
        ]
    )
    cols = np.concatenate([x_cols, x_cols, y_cols, y_cols[ent_out]])
    vals = np.concatenate([np.ones(n_x), np.ones(n_x), -link, coef])
    a_eq = sparse.csr_matrix((vals, (rows, cols)), shape=(n_out + n_y + len(leaves), n_x + n_y))
    weights = np.array([d.weight for d in outcomes], dtype=np.float64)
    lengths = np.array([len(s) for _, s in variables], dtype=np.float64)
    return LPProblem(
        variables=tuple(variables),
        outputs=tuple(outputs),
        output_probs=out_prob,
        cost=np.concatenate([-lengths, np.zeros(n_y)]),
        a_eq=a_eq,
        b_eq=np.concatenate([weights, np.zeros(n_y), rhs]),
        leaves=tuple(leaves),
        leaf_probs=prefix_prob[:, -1].copy(),
        n_outcomes=n_out,
        length=L,
        scaling=scaling,
    )


def _linprog(problem: LPProblem, presolve: bool) -> Any:
    return linprog(
        problem.cost,
        A_eq=problem.a_eq,
        b_eq=problem.b_eq,
        bounds=(0, None),
        method="highs",
        options={"presolve": presolve},
    )


def solve_lp(problem: LPProblem, presolve: bool = False) -> LPResult:
    """Solve with HiGHS; raise ``RuntimeError`` with the solver's message on failure.

    Every such LP is feasible (the verifier that ignores the draft and emits
    one token from ``p``), but HiGHS's presolve sometimes says otherwise
    (module doc).  So presolve is off by default, and a failed solve is
    retried once with the other setting; ``solve_seconds`` covers both.
    ``joint`` and ``output_law`` hold every nonzero value the solver returns,
    however small (values within the solver's tolerance of 0 are not cut).
    """
    start = time.perf_counter()
    res = _linprog(problem, presolve)
    if res.status != 0:
        res = _linprog(problem, not presolve)
    seconds = time.perf_counter() - start
    if res.status != 0:
        raise RuntimeError(f"HiGHS did not solve the lossless-verification LP: {res.message}")
    x = np.asarray(res.x, dtype=np.float64)
    joint: list[dict[Path, float]] = [{} for _ in range(problem.n_outcomes)]
    law: dict[Path, float] = defaultdict(float)
    for (d, s), value in zip(problem.variables, x):
        if value != 0.0:
            joint[d][s] = float(value)
            law[s] += float(value)
    return LPResult(
        expected_length=float(-res.fun),
        status=str(res.message),
        n_variables=len(problem.variables),
        n_outputs=len(problem.outputs),
        n_constraints=int(problem.b_eq.shape[0]),
        output_law=dict(law),
        joint=tuple(joint),
        length=problem.length,
        solve_seconds=seconds,
    )


def optimal_length(
    model: ToyModel,
    outcomes: Sequence[Outcome],
    prefix: Path = (),
    length: int | None = None,
) -> LPResult:
    """Best expected output length of any lossless verifier on these draft outcomes."""
    return solve_lp(build_lp(model, outcomes, prefix, length))


def lp_limit(model: ToyModel, drafts: Sequence[Outcome], prefix: Path = ()) -> LPResult:
    """The §6 bound for any draft set: chains or trees from :mod:`tmc.drafts`.

    ``lp_limit(model, chain_drafts(model, n))`` for chains of ``n`` tokens,
    ``lp_limit(model, tree_drafts(model, widths, draw))`` for trees; the same
    lists can then be handed to :func:`tmc.laws.output_law` for each verifier,
    so the drafts are enumerated once.
    """
    return optimal_length(model, drafts, prefix)


def chain_optimal_length(model: ToyModel, n: int, prefix: Path = ()) -> LPResult:
    """The §6 bound for draft chains of length ``n`` (compare with SpS / ASpS)."""
    return optimal_length(model, chain_drafts(model, n, prefix), prefix)


# ------------------------------------------------------- one-level closed form


def hu_closed_form_acceptance(p_row: ArrayLike, joint: Mapping[tuple[int, ...], float]) -> float:
    """Optimal acceptance probability of ``k`` drafts at one node (Hu et al., ICLR 2025).

    The best probability that a lossless one-node verifier emits one of the
    ``k`` drafted tokens is an optimal-transport (coupling) value; Hu et al.,
    "Towards optimal multi-draft speculative decoding" (ICLR 2025), turn it
    into a minimum over token subsets.  In the form used here (a max-flow /
    min-cut argument: drafts → tokens they contain → target ``p``)::

        α* = 1 + min_{H ⊆ [V]} ( p(H) − Q(every draft ∈ H) ),

    with ``Q`` the joint law of the ``k`` drafted tokens (``q(H)^k`` for
    i.i.d. drafts).  ``k = 1`` gives ``Σ min(p, q)``.  All ``2^V`` sets are
    enumerated (by subset sums), so ``V`` must be small.  ``joint`` maps each
    ordered draft tuple to its probability.
    """
    p = check_prob_row("p_row", p_row)
    vocab = p.shape[0]
    if not isinstance(joint, Mapping) or not joint:
        raise ValueError(f"joint must be a non-empty mapping from draft tuples to probabilities, got {joint!r}")
    sizes = {len(key) for key in joint if isinstance(key, tuple)}
    if len(sizes) > 1:
        raise ValueError(f"joint keys must all hold k tokens (one per draft); they hold {sorted(sizes)}")
    if vocab > MAX_CLOSED_FORM_VOCAB:
        raise ValueError(f"p_row has V = {vocab} > {MAX_CLOSED_FORM_VOCAB}: 2^V sets are too many")
    by_mask = np.zeros(1 << vocab)  # Q(set of drafted tokens == mask)
    total = 0.0
    for key, value in joint.items():
        if not isinstance(key, tuple) or not key:
            raise ValueError(f"joint key {key!r} must be a non-empty tuple of token ids (one per draft)")
        tup = tuple(check_int(f"joint key {key!r} token", t) for t in key)
        prob = real_scalar(f"joint[{key!r}]", value)
        if not np.isfinite(prob) or prob < 0:
            raise ValueError(f"joint[{key!r}] = {value!r} must be finite and >= 0")
        if any(t < 0 or t >= vocab for t in tup):
            raise ValueError(f"joint key {tup!r} has a token outside [0, {vocab})")
        mask = 0
        for t in tup:
            mask |= 1 << t
        by_mask[mask] += prob
        total += prob
    if abs(total - 1.0) > WEIGHT_SUM_TOL:
        raise ValueError(f"joint sums to {total!r}, not 1 (tolerance {WEIGHT_SUM_TOL})")
    # Subset sums (zeta transform): inside[H] = Q(every draft ∈ H); p_of[H] = p(H).
    inside = by_mask.copy()
    p_of = np.zeros(1 << vocab)
    masks = np.arange(1 << vocab)
    for tok in range(vocab):
        has = (masks >> tok) & 1 == 1
        inside[has] += inside[masks[has] ^ (1 << tok)]
        p_of[has] += p[tok]
    return float(1.0 + np.min(p_of - inside))
