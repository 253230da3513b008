"""One executable check per theorem and lemma of the source papers, with a report.

TMC paper (Tree Monte Carlo and Accelerated Speculative Sampling), Appendix A
(tree distributions, the sub-distribution order, prefix sub-samplers and their
convergence) and Appendix B (the SpS / ASpS neighbour distributions), plus
DySpec's Appendix D (greedy optimality of the dynamic token tree).  ``p`` is
the target (the paper's ``P``), ``q`` the draft (``P_ref``).

Layout:

* :mod:`proofs_check.registry` — what a check is (:class:`Check`), what it
  returns (:class:`CheckResult`), expectations and the per-case :class:`Tally`;
* :mod:`proofs_check.exact` — exact rational tree distributions, the order
  and prefix kernels, independent of :mod:`tmc`;
* :mod:`proofs_check.cases` — hypothesis strategies drawn reproducibly;
* :mod:`proofs_check.tree_theorems` — Thm A.6-A.22;
* :mod:`proofs_check.sub_samplers` — Thm A.27-A.32;
* :mod:`proofs_check.neighbour` — the SpS / ASpS neighbour recursion (App. B.1);
* :mod:`proofs_check.speculative` — Lemma B.5-B.7, Thm B.8-B.10 and in-text facts;
* :mod:`proofs_check.dyspec` — DySpec Thm D.1 and Algorithm 1;
* :mod:`proofs_check.runner`, :mod:`proofs_check.report`, :mod:`proofs_check.cli`.

``python -m proofs_check [--quick] [--json FILE]`` prints the report and exits
non-zero if any check fails or any negative control misses its violation.
"""

from proofs_check.cli import cli_main
from proofs_check.registry import Budget, Check, CheckResult, Expect, Outcome
from proofs_check.runner import all_checks, all_passed, run_all

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
