"""One executable check per theorem and lemma of the source papers, with a report.

TMC paper (Tree Monte Carlo and Accelerated Speculative Sampling), Appendix A
(tree distributions, the sub-distribution order, prefix sub-samplers and their
convergence) and Appendix B (the SpS / ASpS neighbour distributions), plus
DySpec's Appendix D (greedy optimality of the dynamic token tree).  ``p`` is
the target (the paper's ``P``), ``q`` the draft (``P_ref``).

Layering (DESIGN.md §2): ``proofs_check`` depends on :mod:`tmc`, whose float
code the checks cross-check, and on :mod:`verification.strategies` for one
reason: the checks on toy models draw them with
``verification.strategies.toy_models``, so the theorem checks and the test
suites run on the same distribution of cases (every draft/target relation:
identical, near ties, greedy, tiny, disjoint) from one definition instead of
two that could drift apart.  Nothing else of :mod:`verification` is used.

Layout:

* :mod:`proofs_check.registry` — what a check is (:class:`Check`), what it
  returns (:class:`CheckResult`), expectations and the per-case :class:`Tally`;
* :mod:`proofs_check.exact` — exact rational tree distributions, the order
  and prefix kernels, independent of :mod:`tmc`;
* :mod:`proofs_check.chain_literal` — the literal exact chain references
  (SpS by eq. (1), ASpS by Algorithm 1, block verification), also used by
  the tests of :mod:`tmc.chain`, and float rows made exact;
* :mod:`proofs_check.cases` — hypothesis strategies drawn reproducibly;
* :mod:`proofs_check.tree_theorems` — Thm A.6-A.22;
* :mod:`proofs_check.sub_samplers` — Thm A.27-A.32;
* :mod:`proofs_check.neighbour` — the SpS / ASpS neighbour recursion (App. B.1);
* :mod:`proofs_check.speculative` — Lemma B.5-B.7, Thm B.8-B.10 and in-text facts;
* :mod:`proofs_check.dyspec` — DySpec Thm D.1 and Algorithm 1;
* :mod:`proofs_check.runner`, :mod:`proofs_check.report`, :mod:`proofs_check.cli`.

``tmc proofs`` or ``python -m proofs_check [--quick] [--json] [--only ID]``
prints the report (``--json``: as one JSON object) and exits non-zero if any
check fails or any negative control misses its violation.  Importing the
package is cheap (the ``tmc`` command registers ``proofs`` from it); the
check modules and hypothesis load on first use of :func:`all_checks`,
:func:`run_all` or :func:`all_passed`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from proofs_check.cli import cli_main
from proofs_check.registry import Budget, Check, CheckResult, Expect, Outcome

if TYPE_CHECKING:
    from proofs_check.runner import all_checks, all_passed, run_all

_RUNNER = ("all_checks", "all_passed", "run_all")  # loaded on first use: they import every check


def __getattr__(name: str) -> Any:
    if name in _RUNNER:
        from proofs_check import runner

        return getattr(runner, name)
    raise AttributeError(f"module 'proofs_check' has no attribute {name!r}")


__all__ = [
    "Budget",
    "Check",
    "CheckResult",
    "Expect",
    "Outcome",
    "all_checks",
    "all_passed",
    "cli_main",
    "run_all",
]
