"""Options of one bias audit: a frozen :class:`AuditConfig`, validated on construction.

Notation (DESIGN.md §3): ``p`` is the target, ``q`` the draft.  Every option of
:func:`verification.audit.audit` lives here, with a comment per field; each
field is checked in ``__post_init__``, which raises ``ValueError`` naming the
field.  Draw kinds given as strings are converted to :class:`tmc.multidraft.Draw`
here, once: nothing past this boundary sees a string draw kind.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from tmc.multidraft import Draw
from tmc.validate import check_int
from verification.audit.space import (
    AUDIT_CHAIN_LENGTHS,
    AUDIT_TREE_SHAPES,
    Kind,
    check_chain_lengths,
    check_tree_shapes,
)

__all__ = ["AuditConfig", "Kind", "Mode", "ModeChoice"]

Mode = Literal["exact", "sampling"]
ModeChoice = Literal["auto", "exact", "sampling"]

MODE_CHOICES: tuple[ModeChoice, ...] = ("auto", "exact", "sampling")
DEFAULT_EXACT_BUDGET = 500  # cases generated when the kernel is enumerated
DEFAULT_SAMPLING_BUDGET = 40  # cases generated when each case is sampled (each costs ~10^3 steps)
MAX_VOCAB_LIMIT = 4  # exhaustive enumeration of drafts is exponential in the vocabulary


@dataclass(frozen=True)
class AuditConfig:
    """How one audit searches and how its statistical tests are calibrated."""

    mode: ModeChoice = "auto"  # "auto": exact when the verifier exposes a kernel; "exact"; "sampling"
    budget: int | None = None  # cases searched in all, a hard cap; None: 500 exact, 40 sampling (or one per cell)
    seed: int = 0  # seed of the search and of every sampled step (>= 0); an audit is reproducible from it
    draws: tuple[Draw, ...] | None = None  # tree draw kinds searched; None: the kinds the verifier is paired with
    max_vocab: int = 3  # largest vocabulary searched, 1..4 (drafts of >= 5 nodes stop at 2, see space.py)
    chain_lengths: tuple[int, ...] = AUDIT_CHAIN_LENGTHS  # draft chain lengths searched (chain verifiers)
    tree_shapes: tuple[tuple[int, ...], ...] = AUDIT_TREE_SHAPES  # tree shapes searched (tree verifiers)
    tol: float = 1e-9  # exact mode: a completion TV at or below this is float rounding, not bias
    tv: float = 0.1  # sampling mode: TV each case's test detects with probability >= 1 - beta
    alpha: float = 1e-6  # false-fail rate of the verdict (sampling confirmation; exact-mode sampler check)
    beta: float = 1e-3  # miss probability of every calibrated test at the TV it is sized for
    shrink_cap: int | None = None  # distinct cases evaluated while shrinking; None: 5 x budget exact, budget sampling
    check_sampler: bool = True  # exact mode: also test the sampler against its kernel (calibrated KL-bound test)
    sampler_tv: float = 0.2  # exact mode: TV between sampler and kernel each sampler check detects

    def __post_init__(self) -> None:
        if self.mode not in MODE_CHOICES:
            raise ValueError(f"mode must be one of {', '.join(MODE_CHOICES)}, got {self.mode!r}")
        if self.budget is not None:
            object.__setattr__(self, "budget", check_int("budget", self.budget, minimum=1))
        object.__setattr__(self, "seed", check_int("seed", self.seed, minimum=0))
        object.__setattr__(self, "draws", _parse_draws(self.draws))
        max_vocab = check_int("max_vocab", self.max_vocab, minimum=1)
        if max_vocab > MAX_VOCAB_LIMIT:
            raise ValueError(f"max_vocab must be in 1..{MAX_VOCAB_LIMIT} (exhaustive enumeration), got {max_vocab}")
        object.__setattr__(self, "max_vocab", max_vocab)
        object.__setattr__(self, "chain_lengths", check_chain_lengths("chain_lengths", self.chain_lengths))
        object.__setattr__(self, "tree_shapes", check_tree_shapes("tree_shapes", self.tree_shapes))
        _check_real("tol", self.tol, low=0.0, high=math.inf, closed_low=True, closed_high=False)
        _check_real("tv", self.tv, low=0.0, high=1.0, closed_low=False, closed_high=True)
        _check_real("sampler_tv", self.sampler_tv, low=0.0, high=1.0, closed_low=False, closed_high=True)
        _check_real("alpha", self.alpha, low=0.0, high=1.0, closed_low=False, closed_high=False)
        if self.alpha < MIN_ALPHA:  # split over the cases it would round to 0 (5e-324 looped for ever)
            raise ValueError(f"alpha must be at least {MIN_ALPHA:g}: it is split over the audit's cases, and "
                             f"{self.alpha!r} split would round to 0")
        _check_real("beta", self.beta, low=0.0, high=1.0, closed_low=False, closed_high=False)
        for name in ("tv", "sampler_tv"):  # before any case: a tiny tv made a case draw for hours
            _check_case_samples(name, getattr(self, name), self.alpha, self.beta)
        if self.shrink_cap is not None:
            object.__setattr__(self, "shrink_cap", check_int("shrink_cap", self.shrink_cap, minimum=0))
        if not isinstance(self.check_sampler, bool):
            raise ValueError(f"check_sampler must be True or False, got {self.check_sampler!r}")

    def budget_for(self, mode: Mode, cells: int = 0) -> int:
        """The case budget of a search in ``mode`` over ``cells`` cells.

        The default is raised to one case per cell where the reach has more
        cells than it (a tree verifier paired with three draw kinds has 75 in
        sampling mode), so a default search reaches every cell.
        """
        if self.budget is not None:
            return self.budget
        return max(DEFAULT_EXACT_BUDGET if mode == "exact" else DEFAULT_SAMPLING_BUDGET, cells)

    def shrink_cap_for(self, mode: Mode, cells: int = 0) -> int:
        """Distinct cases the shrinker may evaluate in ``mode`` (``cells``: as for :meth:`budget_for`)."""
        if self.shrink_cap is not None:
            return self.shrink_cap
        budget = self.budget_for(mode, cells)
        return 5 * budget if mode == "exact" else budget


def _parse_draws(draws: object) -> tuple[Draw, ...] | None:
    if draws is None:
        return None
    if isinstance(draws, (str, Draw)):
        draws = (draws,)
    if not isinstance(draws, (tuple, list)) or not draws:
        raise ValueError(f"draws must be a non-empty sequence of draw kinds, got {draws!r}")
    kinds = [Draw.parse(d, f"draws[{i}]") for i, d in enumerate(draws)]
    return tuple(dict.fromkeys(kinds))  # repeated kinds searched once, first-seen order


def _check_real(name: str, value: object, *, low: float, high: float, closed_low: bool, closed_high: bool) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        raise ValueError(f"{name} must be a number, got {value!r}")
    above = value >= low if closed_low else value > low
    below = value <= high if closed_high else value < high
    if not (above and below):
        interval = f"{'[' if closed_low else '('}{low:g}, {high:g}{']' if closed_high else ')'}"
        raise ValueError(f"{name} must be in {interval}, got {value!r}")


#: The least false-fail rate an audit takes: it is split (Bonferroni) over at most some 10^6 cases.
MIN_ALPHA = 1e-300

#: The most samples one case of an audit may draw: its samplers run in Python (some 10-50 µs a sample), so
#: past this a search would run for hours (``--sampling --tv 1e-6`` drew 6.9 M samples a case).
MAX_CASE_SAMPLES = 10**6


def _check_case_samples(name: str, tv: float, alpha: float, beta: float) -> None:
    """``ValueError`` when a case's test at ``tv`` needs more than :data:`MAX_CASE_SAMPLES` samples: with one
    possible output (the hard-failure size) or two (the KL-bound size at ``alpha``, a lower bound for any
    case, whose rate is ``alpha`` split further)."""
    from verification.calibrated import kl_required_samples

    def size(cells: int) -> float:
        try:
            return kl_required_samples(cells, tv, alpha, beta)
        except ValueError:  # above the calibrated module's own cap
            return math.inf

    if max(size(1), size(2)) > MAX_CASE_SAMPLES:
        raise ValueError(f"{name} = {tv:g}: a case's test would draw more than {MAX_CASE_SAMPLES:,} samples "
                         f"(alpha {alpha:g}, beta {beta:g}); raise {name} (--tv)")
