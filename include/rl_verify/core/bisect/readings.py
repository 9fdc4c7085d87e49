"""The bisection's inputs: a probe's verification outcome as a reading (GOOD, BAD, SKIP, UNSURE) and the range
checked (good end first, bad end last, at most ``MAX_COMMITS`` commits after good). Standard library only."""

from __future__ import annotations

import enum
from typing import Sequence


#: The longest range (commits after the good one) a bisection accepts by default: at P = 1 with both ends
#: re-checked and the pair confirmed it costs at most 10 probes; longer ranges usually mean a wrong "good".
MAX_COMMITS = 64


# The verification outcomes a probe ends with (core.confirm's words; kept literal so that this module
# imports nothing but the standard library).
_PASS_LIKE = ("PASS", "PASS (not reproduced)", "PASS (unchanged)", "PASS (bitwise)")


_REPRODUCED = "FAIL (reproduced)"


_FAIL = "FAIL"


_INCONCLUSIVE = "INCONCLUSIVE"


#: What the caller passes for a commit that could not be checked out or launched at all.
SKIPPED_OUTCOME = "SKIP"


class Reading(str, enum.Enum):
    """What one probe says about its commit, for the bisection."""

    GOOD = "good"        # the regression is not in this commit
    BAD = "bad"          # it is
    SKIP = "skip"        # the commit could not be judged (checkout, launch, infrastructure)
    UNSURE = "unsure"    # the confirmation rule ran out of budget (INCONCLUSIVE)


def reading(outcome: str, failure_class: str | None = None, chased: str = "accuracy") -> Reading:
    """A probe's verification outcome as a bisection reading.

    ``outcome`` is the suite's outcome (``core.confirm``: PASS, PASS (not reproduced), FAIL (reproduced),
    FAIL, INCONCLUSIVE) or ``SKIPPED_OUTCOME`` ("SKIP": not checked out / not launched);
    ``failure_class`` the class of a plain FAIL; ``chased`` the class the bisection follows (the bad
    end's: accuracy or performance). Promises:

    * PASS, PASS (not reproduced), PASS (unchanged) -> GOOD; FAIL (reproduced) -> BAD; INCONCLUSIVE -> UNSURE;
      SKIP -> SKIP.
    * FAIL of the infrastructure class (crash, stall, no tracker, a log rule) -> SKIP: the commit was not
      judged. A FAIL of the chased class -> BAD. A performance FAIL while chasing accuracy -> GOOD (that
      class means every accuracy check held); an accuracy FAIL while chasing performance -> SKIP (its
      timing was not measured to the end).
    * Anything else raises ``ValueError`` naming the accepted values.
    """
    if outcome in _PASS_LIKE:
        return Reading.GOOD
    if outcome == _REPRODUCED:
        return Reading.BAD
    if outcome == _INCONCLUSIVE:
        return Reading.UNSURE
    if outcome == SKIPPED_OUTCOME:
        return Reading.SKIP
    if outcome == _FAIL:
        if chased not in ("accuracy", "performance"):
            raise ValueError(f"chased class {chased!r}: accuracy or performance")
        if str(failure_class or "").startswith("infrastructure"):  # a named cause too: "infrastructure (preempted)"
            return Reading.SKIP
        if failure_class == chased:
            return Reading.BAD
        if failure_class == "performance":
            return Reading.GOOD
        if failure_class == "accuracy":
            return Reading.SKIP
        raise ValueError(f"a FAIL needs its failure class (accuracy, performance, infrastructure), got "
                         f"{failure_class!r}")
    raise ValueError(f"unknown probe outcome {outcome!r}: one of {', '.join(_PASS_LIKE)}, {_REPRODUCED}, {_FAIL}, "
                     f"{_INCONCLUSIVE}, {SKIPPED_OUTCOME}")


class BisectInputError(ValueError):
    """A range or a call the planner refuses; ``param`` names the parameter to change, ``fix`` how."""

    def __init__(self, problem: str, param: str, fix: str) -> None:
        self.problem, self.param, self.fix = problem, param, fix
        super().__init__(f"{param}: {problem}. Fix: {fix}")


def check_range(commits: Sequence[str], max_commits: int = MAX_COMMITS) -> tuple[str, ...]:
    """``commits`` (good first, bad last) as a tuple, or ``BisectInputError`` naming the param and the fix.

    Refused: good and bad the same commit; no commit after good (an empty range: bad is not after good);
    a commit listed twice; more than ``max_commits`` commits after good. Whether good is an ancestor of
    bad is the caller's check (``git merge-base --is-ancestor`` on the node).
    """
    commits = tuple(commits)
    if len(commits) >= 2 and commits[0] == commits[-1] or len(commits) == 1:
        raise BisectInputError(f"good and bad are the same commit ({commits[0]})", "bad",
                               "give the failing commit as bad and an older, passing commit as good")
    if len(commits) < 2:
        raise BisectInputError("the range is empty: no commit lies between good and bad", "good",
                               "give as good an ancestor of bad (the last verified PASS)")
    seen: set[str] = set()
    for commit in commits:
        if commit in seen:
            raise BisectInputError(f"commit {commit} is listed twice", "commits",
                                   "list each commit of good..bad once, oldest first")
        seen.add(commit)
    if len(commits) - 1 > max_commits:
        raise BisectInputError(f"{len(commits) - 1} commits after good, more than the maximum of {max_commits}",
                               "good", f"choose a good commit at most {max_commits} commits before bad (a later "
                               "verified PASS), or raise the maximum")
    return commits
