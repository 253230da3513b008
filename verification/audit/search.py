"""The search: hypothesis over the cells, shrinking to a minimal case, and confirming a sampled finding.

Notation (DESIGN.md §3): ``p`` is the target, ``q`` the draft.

**Search.**  Cells (:func:`verification.audit.cases.search_cells`) are visited
smallest first; in each, :func:`hypothesis.find` draws cases from
:func:`~verification.audit.cases.audit_cases` with an equal share of the
budget left, seeded from the audit's seed, and shrinks the first biased case
to the simplest rows.  So the reported case has the smallest vocabulary and
shape among the cells searched before it.  A cell's share of the budget left
is proportional to its vocabulary size.  :class:`CaseSearch` is the
predicate: it caches each distinct case's evaluation, counts what was tried
per cell and caps the shrinking work.

**Confirmation** (sampling mode).  The search's tests only *select* a case;
the verdict rests on fresh samples, independent of the search's noise.  The
shrunk case, and the case first flagged before shrinking if it differs (a
shrunk case can be one that was flagged by luck), are each re-sampled at level
``alpha / k`` (``k`` ≤ 2 flagged cases, Bonferroni), so the audit's
false-fail rate is at most ``alpha`` whatever the search did.  Each fresh
sample is sized *before* sampling to detect TV
``min(tv, max(found_tv / 2, tv / 4))``, where ``found_tv`` is the plug-in TV
the search measured on that case: a real bias of at least half the magnitude
the search saw (and in any case of ``tv``) is confirmed with probability
``≥ 1 − beta``; the floor ``tv / 4`` caps the fresh sample at 16 times the
search's.  Crashes, invalid outputs and outputs of target probability 0 are
conclusive on their own (no lossless verifier produces them).
"""

from __future__ import annotations

import math
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

    tried: int = 0  # distinct cases evaluated
    samples: int = 0  # sampling mode: largest sample of one case
    spread_case: AuditCase | None = None  # exact mode: unbiased case with the most spread output law
    spread: float = -1.0  # its output law's entropy


@dataclass
class CaseSearch:
    """The search predicate: evaluates cases, caches verdicts, logs cells, caps shrinking work.

    Mutable bookkeeping of one audit call; never shared between audits.
    """

    evaluate: Callable[[AuditCase], Evaluation]  # the verdict on one case
    shrink_cap: int  # distinct cases evaluated after the first biased one
    cache: dict[str, Evaluation] = field(default_factory=dict)  # case digest -> evaluation
    cells: dict[Cell, CellLog] = field(default_factory=dict)
    tried: int = 0  # distinct cases evaluated before the first biased one
    shrunk: int = 0  # distinct cases evaluated after it
    first_flagged: AuditCase | None = None  # the first biased case, before shrinking

    def __call__(self, case: AuditCase) -> bool:
        hit = self.cache.get(case.digest)
        if hit is None:
            if self.first_flagged is not None and self.shrunk >= self.shrink_cap:
                return False  # shrink budget spent: treat untried candidates as not biased
            hit = self.evaluate(case)
            self.cache[case.digest] = hit
            self._log(case, hit)
        if hit.biased and self.first_flagged is None:
            self.first_flagged = case
        return hit.biased

    def _log(self, case: AuditCase, ev: Evaluation) -> None:
        if self.first_flagged is None:
            self.tried += 1
        else:
            self.shrunk += 1
        log = self.cells.setdefault(case.cell, CellLog())
        log.tried += 1
        log.samples = max(log.samples, ev.samples)
        if not ev.biased and ev.samples == 0:
            spread = law_entropy(ev.output_law)
            if spread > log.spread:
                log.spread_case, log.spread = case, spread


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
    """Search the cells in order with hypothesis; shrink and return the first biased case.

    Each cell gets a share of the budget left proportional to its vocabulary
    size (larger vocabularies hold more distinct cases), so budget unused by
    tiny cells (V = 1 has one model) goes to the larger ones.
    """
    for i, cell in enumerate(cells):
        weight_left = sum(c.vocab for c in cells[i:])
        share = max(1, math.ceil((budget - search.tried) * cell.vocab / weight_left))
        try:
            return find(
                audit_cases(cell=cell),
                search,
                settings=search_settings(share),
                random=Random(f"{seed}:{i}"),
            )
        except NoSuchExample:
            continue
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
            return Confirmation(flagged, (*runs, found), config.alpha, i)
        fresh = sampled_evaluation(
            subject, case, tv=confirm_tv(found.tv, config.tv), alpha=level, beta=config.beta,
            rng=case_rng(config.seed, case, "confirm"),
        )
        runs.append(fresh)
        if fresh.biased:
            return Confirmation(flagged, tuple(runs), config.alpha, i)
    return Confirmation(flagged, tuple(runs), config.alpha, None)
