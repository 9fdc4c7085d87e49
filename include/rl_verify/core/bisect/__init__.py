"""Bisection of a reproduced FAIL to the commit that caused it: the planner (issue 22; pure, no Airflow). Its
modules: ``readings`` (a probe's outcome as a reading; the range checked), ``planner`` (:func:`plan`) and ``cost``
(:func:`worst_case`).

The caller (the bisection DAG, ``scripts/bench_bisect.py``) owns the probes: each probe is a normal
verification of one commit (early abort, the confirmation rule's repeats, its report, cleanup). This
module only says, from what is known so far, what to do next. It keeps no state: call :func:`plan`
again whenever a probe ends or a node becomes free.

Inputs:

* ``commits``: the range, oldest first: ``commits[0]`` the good end (the last verified PASS),
  ``commits[-1]`` the bad end (the FAIL), every commit between them in first-parent order.
* ``readings``: per commit, what each finished probe of *this* bisection said, reduced to a
  :class:`Reading` by :func:`reading` (GOOD, BAD, SKIP, UNSURE).
* ``record``: per commit, a *decided* verification the record store already holds for that exact
  commit, baseline version and experiment fingerprint (the caller looks it up; usually only for the
  ends). A recorded GOOD or BAD is trusted as it is: it is not re-checked and needs no confirmation.
* ``running``: commits whose probe is in flight; ``free``: nodes free now (P).

Rules (each pinned by ``tests/unit/test_bisect.py``):

* **Ends.** An end without a recorded outcome is probed (the bad end first). Until its probe says
  otherwise the good end is presumed GOOD and the bad end BAD, so free nodes split the range meanwhile.
  A good end that reads BAD, or a bad end that reads GOOD, ends the bisection once that reading is
  confirmed (below): the regression is not in the range, or did not reproduce. An end that cannot be
  checked (SKIP) ends it too: without both ends there is no answer.
* **The bracket.** ``high`` = the first BAD commit, ``low`` = the last GOOD commit before it. Only
  commits strictly between them can move the answer: those are probed, everything else that is still
  running is stopped (:attr:`Plan.stop`).
* **Splitting.** P probes at once split the open commits into P+1 parts of (nearly) equal numbers of
  possible culprits: P = 1 is a binary search, P = 2 a ternary one. Probes already running count as
  split points: new probes go to the largest parts left.
* **SKIP** (a commit that cannot be checked out or launched, or failed as infrastructure): never
  probed again; the split goes around it. When only skipped commits lie between ``low`` and ``high``,
  the culprit is reported as the range ``low+1 .. high`` (mozregression's "skip").
* **Answer.** An adjacent (GOOD, BAD) pair, skipped commits allowed between them, each side confirmed:
  ``Settings.confirm`` agreeing readings (default 2: one more probe of each side, run in parallel),
  a recorded outcome, or a majority (below). A single probe's outcome is wrong now and then at
  realistic noise (a regressed commit's first run can pass); re-reading the two commits the answer
  rests on catches it, and a contradicted pair member sends the search back into the range.
* **Conflicts.** A commit with GOOD and BAD readings is flaky at this size of effect: it is probed
  again until 3 or more GOOD/BAD readings with a strict majority decide it (PyTorch's autorevert calls
  such a signal flaky; here the majority of fresh verifications settles it).
* **INCONCLUSIVE** (the confirmation budget spent without a decision): the commit is probed once more
  with a fresh verification (``Settings.unsure_retries``); if that is still UNSURE it is treated as
  skipped: the search goes around it and the culprit may end up a range that includes it.
* **Contradictions.** A GOOD commit after the first BAD one contradicts the single-change assumption:
  every commit in it with fewer than two agreeing readings is probed again (no split meanwhile);
  when each is confirmed and it still holds, the answer is INCONSISTENT (more than one change, or a
  flaky signal), with the commits named.

:func:`worst_case` gives the most probes and rounds one range can take (for the approval card):
exact over every culprit position (and every position of ``skips`` skipped commits), with truthful
readings; conflicts and INCONCLUSIVE readings add probes beyond it.
"""

from __future__ import annotations

from rl_verify.core.bisect.cost import Worst, worst_case
from rl_verify.core.bisect.planner import (Answer, BAD, BAD_END_PASSES, CULPRIT, CommitState, Culprit, END_SKIPPED,
                                           GOOD, GOOD_END_FAILS, INCONSISTENT, OPEN, Plan, SKIPPED, Settings, UNKNOWN,
                                           commit_state, plan)
from rl_verify.core.bisect.readings import (MAX_COMMITS, SKIPPED_OUTCOME, BisectInputError, Reading, check_range,
                                           reading)

__all__ = ["Answer", "BAD", "BAD_END_PASSES", "BisectInputError", "CULPRIT", "CommitState", "Culprit", "END_SKIPPED",
           "GOOD", "GOOD_END_FAILS", "INCONSISTENT", "MAX_COMMITS", "OPEN", "Plan", "Reading", "SKIPPED",
           "SKIPPED_OUTCOME", "Settings", "UNKNOWN", "Worst", "check_range", "commit_state", "plan", "reading",
           "worst_case"]
