"""The search: hypothesis over the cells, shrinking to a minimal case, and confirming a sampled finding.

Notation (DESIGN.md §3): ``p`` is the target, ``q`` the draft.

**Search.**  Cells (:func:`verification.audit.cases.search_cells`) are visited
smallest first; in each, :func:`hypothesis.find` draws cases from
:func:`~verification.audit.cases.audit_cases` with a share of the budget left,
seeded from the audit's seed, and shrinks the first biased case to the
simplest rows.  A cell's share is the budget left times its vocabulary size
over the vocabulary sizes of the cells left, rounded down, and at least one
case: budget unused by tiny cells (V = 1 has one model) goes to the larger
ones, and a budget of at least one case per cell reaches every cell.  The
budget is a hard cap on the distinct cases evaluated before the first biased
one: when it is spent the search stops, and the cells left are reported
unsearched (``cases tried`` 0).  :class:`CaseSearch` is the predicate: it
caches each distinct case's evaluation, counts what was tried per cell, and
caps the search at the budget and the shrinking work at ``shrink_cap``.

**Earlier cells.**  A cell's search is random and bounded, so it can miss a
biased case that a later cell then finds; the rows shrunk there can already be
biased on an earlier cell.  So the found rows are re-evaluated, with the
search's own evaluation, on every earlier cell of the same vocabulary and draw
kind whose prefixes they cover (a shared row pair covers every depth; rows per
depth or per prefix only the depths they were drawn for), in cell order.  On
the first such cell where they are biased the case moves there, and
hypothesis searches that cell again (a fresh seed, at most the cell's share
and the shrinking work left) to find and shrink a case there; the moved case
stands if that search finds none.  This repeats until the case stays in its
cell.  So the reported case has the smallest vocabulary and shape among the
cells searched before it: each of those cells was searched without a biased
case being found, and the reported rows are unbiased on every one of them
that can hold them (same vocabulary and draw kind, prefixes covered).  (A
second search rather than more shrinking: hypothesis cannot resume shrinking
from a given case under a fixed seed, since a seed turns its example database
off.)

**Confirmation** (sampling mode).  The search's tests only *select* a case;
the verdict rests on fresh samples, independent of the search's noise.  The
shrunk case, and the case first flagged before shrinking if it differs (a
shrunk case can be one that was flagged by luck), are each re-sampled at level
``alpha / k`` (``k`` ≤ 2 flagged cases, Bonferroni), so the audit's
false-fail rate is at most ``alpha`` whatever the search did.  Each fresh
sample is sized *before* sampling to detect TV
``min(tv, max(found_tv / 2, tv / 4))``, where ``found_tv`` is the plug-in TV
the search measured on that case: a real bias of at least that TV is
confirmed with probability ``≥ 1 − beta`` (half what the search saw, but
never less than ``tv / 4``: a real bias of half a small ``found_tv`` below
``tv / 2`` has no such guarantee); the floor ``tv / 4`` caps the fresh
sample at 16 times the search's.  Crashes, invalid outputs and outputs of target probability 0 are
conclusive on their own (no lossless verifier produces them): such a finding
stands on the search's own sample, and the :class:`Confirmation` says so
(``conclusive``).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from random import Random

import numpy as np
from hypothesis import HealthCheck, Phase, Verbosity, find, settings
from hypothesis.errors import NoSuchExample

from verification.audit.cases import AuditCase, audit_cases
from verification.audit.config import AuditConfig
from verification.audit.evaluate import Evaluation, law_entropy, sampled_evaluation
from verification.audit.report import Confirmation
from verification.audit.space import Cell
from verification.examples import Verifier


@dataclass
class CellLog:
    """What the search did in one cell (mutable bookkeeping of one audit)."""

    share: int = 0  # cases hypothesis was allowed to generate there (0: not searched)
    tried: int = 0  # distinct cases evaluated
    samples: int = 0  # sampling mode: largest sample of one case
    spread_case: AuditCase | None = None  # exact mode: the unbiased case a sampler check runs on (sampler_score)
    spread: tuple[float, float] = (-1.0, -1.0)  # its sampler_score


@dataclass
class CaseSearch:
    """The search predicate: evaluates cases, caches verdicts, logs cells, caps the search and shrinking work.

    Mutable bookkeeping of one audit call; never shared between audits.
    """

    evaluate: Callable[[AuditCase], Evaluation]  # the verdict on one case
    shrink_cap: int  # distinct cases evaluated after the first biased one
    budget: int | None = None  # distinct cases evaluated before the first biased one (set by run_search)
    cache: dict[str, Evaluation] = field(default_factory=dict)  # case digest -> evaluation
    cells: dict[Cell, CellLog] = field(default_factory=dict)
    tried: int = 0  # distinct cases evaluated before the first biased one
    shrunk: int = 0  # distinct cases evaluated after it, by hypothesis
    rechecked: set[str] = field(default_factory=set)  # digests of found rows checked on earlier cells
    first_flagged: AuditCase | None = None  # the first biased case, before shrinking
    moves: list[tuple[Cell, Cell]] = field(default_factory=list)  # (from, to): the case moved to an earlier cell
    unsearched: int = 0  # cells left unsearched because the budget was spent

    def __call__(self, case: AuditCase) -> bool:
        hit = self.cache.get(case.digest)
        if hit is None:
            if self.first_flagged is None and self.budget is not None and self.tried >= self.budget:
                return False  # budget spent: never evaluate past it
            if self.first_flagged is not None and self.shrunk >= self.shrink_cap:
                return False  # shrink budget spent: treat untried candidates as not biased
            hit = self._evaluate(case)
            if self.first_flagged is None:
                self.tried += 1
            else:
                self.shrunk += 1
        if hit.biased and self.first_flagged is None:
            self.first_flagged = case
        return hit.biased

    @property
    def rechecks(self) -> int:
        """Distinct (rows, earlier cell) pairs checked, evaluated then or already by the search."""
        return len(self.rechecked)

    def recheck(self, case: AuditCase) -> Evaluation:
        """The search's evaluation of found rows on an earlier cell (not capped: a handful per audit)."""
        self.rechecked.add(case.digest)
        hit = self.cache.get(case.digest)
        if hit is None:
            hit = self._evaluate(case)
        return hit

    def _evaluate(self, case: AuditCase) -> Evaluation:
        ev = self.evaluate(case)
        self.cache[case.digest] = ev
        log = self.cells.setdefault(case.cell, CellLog())
        log.tried += 1
        log.samples = max(log.samples, ev.samples)
        if not ev.biased and ev.samples == 0:
            score = sampler_score(case, ev)
            if score > log.spread:
                log.spread_case, log.spread = case, score
        return ev


def sampler_score(case: AuditCase, ev: Evaluation) -> tuple[float, float]:
    """How much a sampler check on ``case`` exercises the rejection branch: ``(TV(p, q) × H(residual), H(output
    law))`` at the root, compared in that order.

    The first is the chance the first draft is rejected times the entropy of the residual the correction is
    drawn from: 0 when ``p = q`` (every draft accepted) or the residual is one token (nothing to get wrong in
    its draw).  Ranking by the output law's entropy alone chose ``p = q`` cases in 4 of 6 chain groups, where a
    sampler that reused the accept test's uniform for the residual draw matched its kernel exactly.
    """
    p, q = np.asarray(case.model.p(()), dtype=np.float64), np.asarray(case.model.q(()), dtype=np.float64)
    excess = np.maximum(p - q, 0.0)
    reject = float(excess.sum())
    residual_entropy = law_entropy({(t,): float(m) / reject for t, m in enumerate(excess)}) if reject > 0 else 0.0
    return reject * residual_entropy, law_entropy(ev.output_law)


def case_rng(seed: int, case: AuditCase, salt: str) -> np.random.Generator:
    """Noise of one case, from the audit's seed and the case itself (the search sees a fixed predicate)."""
    return np.random.default_rng([seed, int(case.digest[:16], 16), zlib.crc32(salt.encode())])


def search_settings(budget: int) -> settings:
    return settings(
        max_examples=budget,
        derandomize=False,  # the seed comes from find(random=...)
        database=None,
        deadline=None,
        phases=(Phase.generate, Phase.shrink),
        print_blob=False,
        verbosity=Verbosity.quiet,
        suppress_health_check=list(HealthCheck),
    )


def run_search(search: CaseSearch, cells: Sequence[Cell], budget: int, seed: int) -> AuditCase | None:
    """Search the cells in order with hypothesis; return the first biased case, shrunk and settled.

    Each cell gets a share of the budget left proportional to its vocabulary
    size (larger vocabularies hold more distinct cases), rounded down and at
    least one case, so budget unused by tiny cells (V = 1 has one model) goes
    to the larger ones; the search stops when the budget is spent (module doc).
    """
    search.budget = budget
    for i, cell in enumerate(cells):
        left = budget - search.tried
        if left <= 0:
            search.unsearched = len(cells) - i
            return None
        share = max(1, left * cell.vocab // sum(c.vocab for c in cells[i:]))  # <= left: never past the budget
        search.cells.setdefault(cell, CellLog()).share = share
        found = find_in_cell(search, cell, share, Random(f"{seed}:{i}"))
        if found is not None:
            return settle(search, cells, i, found, seed)
    return None


def find_in_cell(search: CaseSearch, cell: Cell, examples: int, random: Random) -> AuditCase | None:
    """Hypothesis in one cell: the first biased case of ``examples`` generated, shrunk; None if none."""
    try:
        return find(audit_cases(cell=cell), search, settings=search_settings(examples), random=random)
    except NoSuchExample:
        return None


def settle(search: CaseSearch, cells: Sequence[Cell], index: int, case: AuditCase, seed: int) -> AuditCase:
    """Move a found case to the first earlier cell where its rows are biased too, search and shrink there,
    and repeat until it stays (module doc: earlier cells).  ``index``: the case's cell in ``cells``."""
    while True:
        j = earliest_biased(search, cells[:index], case)
        if j is None:
            return case
        moved = case.on(cells[j])
        assert moved is not None
        search.moves.append((case.cell, moved.cell))
        examples = min(search.cells.get(moved.cell, CellLog()).share, search.shrink_cap - search.shrunk)
        again = find_in_cell(search, moved.cell, examples, Random(f"{seed}:{j}:moved")) if examples > 0 else None
        case, index = (moved if again is None else again), j


def earliest_biased(search: CaseSearch, earlier: Sequence[Cell], case: AuditCase) -> int | None:
    """Index of the first cell of ``earlier`` that holds the case's rows and on which they are biased."""
    for j, cell in enumerate(earlier):
        moved = case.on(cell)
        if moved is not None and search.recheck(moved).biased:
            return j
    return None


def confirm_tv(found_tv: float, tv: float) -> float:
    """TV a confirming sample is sized to detect: half what the search measured, within [tv / 4, tv]."""
    return min(tv, max(found_tv / 2.0, tv / 4.0))


def confirm(subject: Verifier, search: CaseSearch, shrunk: AuditCase, config: AuditConfig) -> Confirmation:
    """Decide a sampled finding on fresh samples (module doc: level, size, power)."""
    cases = [shrunk]
    first = search.first_flagged
    if first is not None and first.digest != shrunk.digest:
        cases.append(first)
    flagged = tuple((case, search.cache[case.digest]) for case in cases)
    level = config.alpha / len(flagged)
    runs: list[Evaluation] = []
    for i, (case, found) in enumerate(flagged):
        if found.conclusive:
            return Confirmation(flagged, (*runs, found), config.alpha, i, conclusive=True)  # the search's own sample
        fresh = sampled_evaluation(
            subject, case, tv=confirm_tv(found.tv, config.tv), alpha=level, beta=config.beta,
            rng=case_rng(config.seed, case, "confirm"),
        )
        runs.append(fresh)
        if fresh.biased:
            return Confirmation(flagged, tuple(runs), config.alpha, i)
    return Confirmation(flagged, tuple(runs), config.alpha, None)
