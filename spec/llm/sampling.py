"""Logits → the sampling law: temperature, top-k, top-p (DESIGN.md §8).

Speculative decoding is lossless for the *processed* target law ``p``, so the
same function must turn the target's logits into ``p`` and the draft's logits
into ``q``; :func:`process_logits` is that one function.  The steps, in order:

1. **temperature** ``T``: logits ``/ T``; ``T = 0`` is greedy decoding, a
   one-hot row at the argmax (ties to the lowest token id), and the two
   filters below are then moot (the argmax survives both);
2. **top-k**: keep the ``k`` largest logits (ranked as given, before the
   division by ``T``, which can round two distinct logits to one value); ties at
   the boundary go to the lowest token ids, so exactly ``min(k, V)`` tokens survive (Hugging Face's
   ``TopKLogitsWarper`` keeps every tie instead; the two differ only on exact
   float ties);
3. **top-p** (nucleus, Holtzman et al. 2020): of the law after top-k, keep the
   smallest set of most likely tokens whose mass is ``>= top_p``, in the same
   order (the logits', descending, ties to the lowest id); the most likely token is always
   kept (Hugging Face's ``TopPLogitsWarper`` cuts tied tokens from the low ids
   instead: ``[0, 0, 0]`` at ``top_p = 0.5`` keeps tokens 0 and 1 here, 1 and 2
   there);
4. renormalise: a softmax over the kept logits.

Arithmetic is float64 whatever the input dtype (a bf16 model's logits are
upcast first), so rows sum to 1 within float64 rounding and the top-p cut is
not moved by float32 cumulative-sum error.  Hugging Face filters in the
logits' own dtype, so its kept set can differ where the cut falls within a
rounding of a boundary: an audit of 2026-11-27 found no difference on 14,000
random float32 rows, and differences on 6 of 2,000 float16 rows and 39 of
2,000 bfloat16 rows (V = 50, T = 0.7, top-k 10, top-p 0.9).  None of this
touches losslessness: the draft's and the target's rows go through this one
function.  ``-inf`` logits (banned tokens)
are allowed; NaN, ``+inf`` and rows with no finite logit raise ``ValueError``.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from tmc.validate import check_int

__all__ = ["Sampling", "categorical_draw", "check_sampling", "logits_fault", "logits_of", "nonfinite",
           "point_rows", "process_logits", "ranked_tokens", "step_fault", "swor_draws"]


def check_sampling(
    temperature: float, top_k: int | None, top_p: float | None
) -> tuple[float, int | None, float | None]:
    """The sampling settings validated (``ValueError`` naming the argument) and normalised."""
    real = isinstance(temperature, numbers.Real) and not isinstance(temperature, bool)
    try:
        finite = real and math.isfinite(float(temperature))
    except OverflowError:  # an int past float's range (10**400)
        finite = False
    if not finite:
        raise ValueError(f"temperature must be a finite number >= 0, got {temperature!r}")
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0 (0 = greedy), got {temperature!r}")
    if top_k is not None:  # check_int's rule, as for max_new_tokens and budgets: 4 and 4.0, not 4.5 or True
        try:
            top_k = check_int("top_k", top_k, minimum=1)
        except ValueError:
            raise ValueError(f"top_k must be None or an integer >= 1, got {top_k!r}") from None
    if top_p is not None:
        if isinstance(top_p, bool) or not isinstance(top_p, numbers.Real) or not 0 < top_p <= 1:
            raise ValueError(f"top_p must be None or a number in (0, 1], got {top_p!r}")
    return float(temperature), None if top_k is None else int(top_k), None if top_p is None else float(top_p)


def process_logits(
    logits: torch.Tensor, temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None
) -> torch.Tensor:
    """Probabilities ``(..., V)`` in float64 from logits ``(..., V)``: temperature, top-k, top-p, renormalise.

    ``temperature = 0`` gives one-hot rows at the argmax (lowest id on ties).
    ``top_k = None`` and ``top_p = None`` (or ``1``) switch those filters off.
    """
    temperature, top_k, top_p = check_sampling(temperature, top_k, top_p)
    if not isinstance(logits, torch.Tensor) or not logits.is_floating_point() or logits.ndim < 1:
        raise ValueError("logits must be a floating-point torch.Tensor of shape (..., V)")
    if logits.element_size() < 2:  # float8: no max or softmax on the CPU
        raise ValueError(f"logits of dtype {logits.dtype} are not supported: give float16, bfloat16, float32 or float64")
    if logits.shape[-1] == 0:
        raise ValueError("logits has vocabulary size 0")
    _check_finite_rows(logits)
    return _process(logits, temperature, top_k, top_p)


def _process(logits: torch.Tensor, temperature: float, top_k: int | None, top_p: float | None) -> torch.Tensor:
    """:func:`process_logits` after the checks (settings validated, logits finite or flagged)."""
    if temperature == 0:
        # torch.argmax returns the first maximal index: ties go to the lowest token id.  Widening to
        # float64 is exact and keeps the order, so the argmax is taken on the logits as they are.
        return point_rows(logits.argmax(dim=-1, keepdim=True), logits.shape[-1])
    x = raw = logits.to(torch.float64)  # raw: the logits as given, which top-k and top-p rank
    if temperature < 1.0:  # shifted first, so a tiny T cannot overflow x / T to inf (and softmax to NaN)
        x = (x - x.amax(dim=-1, keepdim=True)) / temperature
    elif temperature != 1.0:
        x = x / temperature
    k = x.shape[-1] if top_k is None else min(top_k, x.shape[-1])
    if k == x.shape[-1] and (top_p is None or top_p == 1.0):
        return torch.softmax(x, dim=-1)
    # Ranked on the logits as given: the shift and the division by T round, and can merge two distinct
    # logits into a tie (40, 1e-20, 2e-20 at T = 0.5: both small ones become -80), which would move the
    # boundary by id.  A stable descending sort keeps equal logits in id order: ties go to the lowest id.
    ordered, idx = torch.sort(raw, dim=-1, descending=True, stable=True)  # (..., V)
    keep = torch.ones_like(ordered, dtype=torch.bool)
    keep[..., k:] = False
    if top_p is not None and top_p < 1.0:
        if temperature != 1.0:
            ordered = x.gather(-1, idx)  # the tempered logits, in the logits' order
        probs = torch.softmax(ordered.masked_fill(~keep, -math.inf), dim=-1)
        before = torch.cumsum(probs, dim=-1) - probs  # mass of the strictly more likely tokens
        keep &= before < top_p  # rank 0 has before = 0 < top_p: the top token always stays
    kept = torch.zeros_like(keep).scatter_(-1, idx, keep)
    return torch.softmax(x.masked_fill(~kept, -math.inf), dim=-1)


def point_rows(top: torch.Tensor, vocab: int) -> torch.Tensor:
    """float64 rows ``(..., vocab)``: one at the index ``top`` ``(..., 1)`` holds, zero elsewhere.

    Eagerly a zero fill and a scatter (two kernels).  Inside ``torch.compile`` the rows are a comparison with
    ``arange`` instead: inductor rewrites a scalar scatter onto a constant tensor, and in torch 2.11 that
    rewrite returns float32 rows (2.13 keeps float64), which a float64 ``index_copy`` then refuses.
    The indices are not range-checked (no host read): the caller's are argmaxes or checked draws.
    """
    if top.ndim == 0 or top.shape[-1] != 1 or top.dtype != torch.int64:
        raise ValueError(f"top must be an int64 tensor of shape (..., 1), got {top.dtype} {tuple(top.shape)}")
    if isinstance(vocab, bool) or not isinstance(vocab, int) or vocab < 1:
        raise ValueError(f"vocab must be an int >= 1, got {vocab!r}")
    if torch.compiler.is_compiling():
        return (torch.arange(vocab, device=top.device) == top).to(torch.float64)
    return torch.zeros((*top.shape[:-1], vocab), dtype=torch.float64, device=top.device).scatter_(-1, top, 1.0)


def logits_fault(*xs: torch.Tensor) -> torch.Tensor:
    """A 0-d bool tensor on the device of ``xs``, True when :func:`process_logits` would refuse one of them.

    No host sync: a caller that keeps rows on the device (a chain drafted
    there) collects the flags and checks them once, then names the fault
    with :func:`process_logits` on the same logits.  A row's maximum is NaN,
    ``+inf`` or ``-inf`` exactly when the row holds a NaN, a ``+inf`` or no
    finite logit; several tensors' row maxima are joined and tested at once
    (:func:`nonfinite`: a fused step's kernels are what it costs on a GPU).
    """
    if not xs:
        raise ValueError("logits_fault needs at least one logits tensor")
    maxima = [x.amax(dim=-1).reshape(-1) for x in xs]
    return nonfinite(maxima[0] if len(maxima) == 1 else torch.cat(maxima))


def step_fault(t_logits: torch.Tensor, t_fault: torch.Tensor | None, *draft_raw: torch.Tensor) -> torch.Tensor:
    """A step's fault flag, 0-d bool: :func:`logits_fault` of the target's logits ``t_logits`` and of any draft
    logits ``draft_raw``, where ``t_fault`` is the target's part when :meth:`Sampling.probs_with_fault` gave
    it for free (greedy rows), else ``None``.  One rule for the fused steps' heads and the decode loop's
    unfused steps (whose draft flags come already joined: they pass none here and ``|`` theirs)."""
    if t_fault is None:
        return logits_fault(*draft_raw, t_logits)
    return logits_fault(*draft_raw) | t_fault if draft_raw else t_fault


def nonfinite(m: torch.Tensor) -> torch.Tensor:
    """0-d bool: some entry of ``m`` is NaN or infinite.  ``m - m`` is 0 for a finite entry and NaN for the others
    (``inf - inf``), and NaN differs from 0: three kernels, where ``~isfinite(m).all()`` dispatches six."""
    return (m - m).ne(0).any()


def categorical_draw(weights: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF draws on the device, :func:`tmc.noise.categorical` row by row: int64, no host sync.

    ``weights`` ``(..., L)`` non-negative rows with positive sums, ``u`` the
    uniforms ``(...)``, one per row (a 0-d uniform for one ``(L,)`` row, which
    gives a 0-d index).  A zero weight is never chosen, ``u == 0`` included.
    The cumulative sums are ``torch.cumsum`` along the row (sequential on the
    CPU, like ``numpy.cumsum``).

    Inside ``torch.compile`` the same rule takes another form (:func:`_draw_compiled`): inductor's kernels for
    this one cost an H200 11.5 µs per ``(1, 4096)`` float64 row, and for the flattened ``(5 * 4096,)`` row of
    an ASpS head torch 2.11's inductor cannot generate them at all (the argmax over a scan it splits across
    blocks).  Eagerly this form stays: 7 non-view operations against the other form's 10 (the eager step pays
    per kernel).
    """
    if torch.compiler.is_compiling():
        return _draw_compiled(weights, u)
    cdf = torch.cumsum(weights, dim=-1)
    i = torch.searchsorted(cdf, u.unsqueeze(-1) * cdf[..., -1:], right=True).squeeze(-1)
    # u * total rounded up to total (i == L) takes the last index with positive weight: the first
    # index where the count of positive weights reaches its maximum (argmax returns the first).
    # Every other i has cdf[i] > u * total, so i <= that index and the minimum leaves it alone.
    last = (weights > 0.0).cumsum(dim=-1).argmax(dim=-1)
    return torch.minimum(i, last)


def _draw_compiled(weights: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """:func:`categorical_draw`'s rule in the form inductor fuses well: for a non-decreasing ``cdf`` the binary
    search's index is the count of entries ``<= u * total``, and the last index with positive weight is a
    maximum of indices, not an argmax over a second scan.  Same total (the scan's last entry), same index.
    On an H200 (torch 2.11) a ``(1, 4096)`` draw cost 9.3 µs instead of 11.5 (CUDA-graph replays; 10.5 on a
    second machine of the same kind)."""
    cdf = torch.cumsum(weights, dim=-1)
    i = (cdf <= u.unsqueeze(-1) * cdf[..., -1:]).sum(dim=-1)
    ids = torch.arange(weights.shape[-1], device=weights.device)
    last = torch.where(weights > 0.0, ids, 0).amax(dim=-1)
    return torch.minimum(i, last)


def swor_draws(rows: torch.Tensor, ranks: Sequence[tuple[torch.Tensor, torch.Tensor]],
               u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Siblings drawn without replacement on the device, rank by rank, with no host sync: the rule of
    :class:`spec.builders.FixedBuilder` with ``draw="swor"`` (:func:`spec.builders.base.without`, then
    :func:`tmc.noise.categorical`).

    ``ranks[j]`` = ``(parents, places)``: for the nodes with ``j`` earlier siblings, their parents' rows in
    ``rows`` ``(M, L)`` and their places in the output.  Each such node is drawn by inverse CDF with
    ``u[place]`` from its parent's row with the tokens of its earlier siblings set to 0.  Returns the tokens
    ``(len(u),)`` int64 and a 0-d bool: some node's law had no mass left (the host builder draws no more
    siblings there; that node's token is meaningless).  Out-of-place operations only, so ``torch.compile``
    traces it whole.
    """
    removed = torch.zeros_like(rows, dtype=torch.bool)
    tok = torch.zeros(u.shape[0], dtype=torch.int64, device=rows.device)
    empty = []
    for parents, places in ranks:
        law = rows.index_select(0, parents).masked_fill(removed.index_select(0, parents), 0.0)
        drawn = categorical_draw(law, u.index_select(0, places))
        empty.append((law <= 0.0).all(dim=-1).any())
        tok = tok.index_copy(0, places, drawn)
        removed = removed.index_put((parents, drawn), torch.ones((), dtype=torch.bool, device=rows.device))
    return tok, torch.stack(empty).any()


def ranked_tokens(rows: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``k`` largest entries of each row, largest first and equal values by lowest index: the
    order of :func:`spec.builders.base.top_tokens`, on the device, with no host sync.

    ``rows`` ``(M, L)`` with ``1 <= k <= L``; returns the indices ``(M, k)`` int64 and their values.
    Unlike ``top_tokens`` nothing is cut at zero: an entry ``<= 0`` among the values means the row
    has fewer than ``k`` positive entries (the caller checks).  ``torch.topk`` gives the ``k``
    largest values exactly but leaves the order of equal values open, so the index of rank ``r``
    is found again as the ``(j + 1)``-th index holding its value, ``j`` the earlier ranks with the
    same value (one cumulative count over ``(M, k, L)``; a full stable sort of three ``L = 4096``
    float64 rows took 0.8 ms on the CPU against 0.13 ms this way).
    """
    values = torch.topk(rows, k, dim=-1).values  # (M, k), largest first
    same = values.unsqueeze(-1) == values.unsqueeze(-2)  # (M, k, k)
    before = torch.tril(same, diagonal=-1).sum(dim=-1)  # earlier ranks holding the same value
    equal = rows.unsqueeze(1) == values.unsqueeze(-1)  # (M, k, L)
    nth = torch.cumsum(equal, dim=-1) == (before + 1).unsqueeze(-1)
    return (equal & nth).to(torch.int8).argmax(dim=-1), values


@contextmanager
def logits_of(role: str) -> Iterator[None]:
    """Name the model whose logits :func:`process_logits` refuses: ``"logits contain NaN"`` raised inside
    becomes ``"draft's logits contain NaN"`` (draft and target share one :class:`Sampling`, so its error
    alone could not say which model produced them)."""
    try:
        yield
    except ValueError as err:
        if str(err).startswith("logits "):
            raise ValueError(f"{role}'s {err}") from None
        raise


def _check_finite_rows(x: torch.Tensor) -> None:
    """``ValueError`` for NaN or ``+inf`` logits and for rows where every logit is ``-inf``.

    One pass and one host sync: a row's maximum is NaN if the row holds a NaN
    (``amax`` propagates NaN), ``+inf`` if it holds ``+inf``, and ``-inf`` if
    every entry is ``-inf``; the slower checks below only name the fault.
    """
    if x.numel() == 0 or not bool(logits_fault(x)):
        return
    if bool(torch.isnan(x).any()):
        raise ValueError("logits contain NaN")
    if bool(torch.isposinf(x).any()):
        raise ValueError("logits contain +inf")
    raise ValueError("logits have a row where every token is -inf")


@dataclass(frozen=True)
class Sampling:
    """The sampling settings shared by draft and target (validated on construction)."""

    temperature: float = 1.0  # 0 = greedy (one-hot at the argmax)
    top_k: int | None = None  # keep the k most likely tokens; None = all
    top_p: float | None = None  # keep the smallest most-likely set of mass >= top_p; None = all

    def __post_init__(self) -> None:
        # kept as checked (float, int, float): the unchecked paths compute with them directly,
        # and a Fraction or a numpy scalar there raised TypeError mid-decode
        temperature, top_k, top_p = check_sampling(self.temperature, self.top_k, self.top_p)
        object.__setattr__(self, "temperature", temperature)
        object.__setattr__(self, "top_k", top_k)
        object.__setattr__(self, "top_p", top_p)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """:func:`process_logits` with these settings: float64 rows ``(..., V)``."""
        return process_logits(logits, self.temperature, self.top_k, self.top_p)

    def probs_unchecked(self, logits: torch.Tensor) -> torch.Tensor:
        """:meth:`probs` without the finiteness check and its host sync.

        For callers that check :func:`logits_fault` themselves: rows with
        NaN or ``+inf`` logits come out as garbage (NaN), not as an error.
        """
        return _process(logits, self.temperature, self.top_k, self.top_p)

    def probs_with_fault(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """:meth:`probs_unchecked`, with :func:`logits_fault` of the same logits when it comes free.

        At temperature 0 one ``max`` over each row gives both the argmax (the first maximal index,
        as ``argmax`` gives it) and the row maxima the flag reads, so the flag is returned;
        otherwise the second item is ``None`` and the caller computes the flag when it needs it.
        """
        if self.temperature != 0:
            return self.probs_unchecked(logits), None
        top_value, top = logits.max(dim=-1, keepdim=True)
        return point_rows(top, logits.shape[-1]), nonfinite(top_value)
