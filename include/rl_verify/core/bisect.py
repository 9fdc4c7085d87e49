"""Bisection of a reproduced FAIL to the commit that caused it: the planner (issue 22; pure, no Airflow).

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

import enum
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Collection, Mapping, Sequence

#: The longest range (commits after the good one) a bisection accepts by default: at P = 1 with both ends
#: re-checked and the pair confirmed it costs at most 10 probes; longer ranges usually mean a wrong "good".
MAX_COMMITS = 64

# The verification outcomes a probe ends with (core.confirm's words; kept literal so that this module
# imports nothing but the standard library).
_PASS_LIKE = ("PASS", "PASS (not reproduced)")
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

    * PASS, PASS (not reproduced) -> GOOD; FAIL (reproduced) -> BAD; INCONCLUSIVE -> UNSURE; SKIP -> SKIP.
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
        if failure_class == "infrastructure":
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


@dataclass(frozen=True)
class Settings:
    """How sure the answer must be. ``confirm``: agreeing readings each side of the deciding pair needs
    (1 = plain bisection; recorded outcomes and majorities always count as confirmed). ``unsure_retries``:
    fresh probes of a commit read INCONCLUSIVE before it is treated as skipped."""

    confirm: int = 2
    unsure_retries: int = 1

    def __post_init__(self) -> None:
        if self.confirm < 1:
            raise BisectInputError(f"confirm = {self.confirm}", "confirm", "1 (plain) or more")
        if self.unsure_retries < 0:
            raise BisectInputError(f"unsure_retries = {self.unsure_retries}", "unsure_retries", "0 or more")


# States of one commit.
UNKNOWN, OPEN, GOOD, BAD, SKIPPED = "unknown", "open", "good", "bad", "skipped"


@dataclass(frozen=True)
class CommitState:
    """What is known of one commit: ``state`` (unknown, open = needs another probe, good, bad, skipped), the
    probes' readings, the recorded reading, whether it counts as confirmed, and why, in words."""

    index: int
    commit: str
    state: str
    readings: tuple[Reading, ...] = ()
    recorded: Reading | None = None
    confirmed: bool = False
    why: str = ""
    #: How a good or bad state was reached: "record", "majority" (flaky readings settled) or "probes".
    settled_by: str = ""

    @property
    def agreeing(self) -> int:
        """How many of the probes' readings agree with ``state`` (0 unless good or bad)."""
        want = {GOOD: Reading.GOOD, BAD: Reading.BAD}.get(self.state)
        return sum(r == want for r in self.readings) if want else 0

    @property
    def firm(self) -> bool:
        """Good or bad beyond one reading: recorded, a majority, or two agreeing readings (what a
        contradiction needs before it is believed)."""
        return self.settled_by in ("record", "majority") or self.agreeing >= 2


@dataclass(frozen=True)
class Culprit:
    """The answer: the culprit is one of ``commits`` (indices ``first``..``last`` of the range, the bad side
    of the deciding pair last); ``last_good`` the good side; ``skipped`` the commits of the range that could
    not be judged. ``exact`` when it is one commit."""

    first: int
    last: int
    commits: tuple[str, ...]
    last_good: str
    skipped: tuple[str, ...]

    @property
    def exact(self) -> bool:
        return self.first == self.last


# Kinds of answer.
CULPRIT = "culprit"
GOOD_END_FAILS = "good end fails"
BAD_END_PASSES = "bad end passes"
END_SKIPPED = "end not judged"
INCONSISTENT = "inconsistent"


@dataclass(frozen=True)
class Answer:
    """How the bisection ends: ``kind`` (culprit, good end fails, bad end passes, end not judged,
    inconsistent), the reason in words, and the culprit (kind culprit only)."""

    kind: str
    reason: str
    culprit: Culprit | None = None


@dataclass(frozen=True)
class Plan:
    """What to do now. ``probe``: commits to launch (at most ``free``, never one already running, never the
    same twice), most urgent first; ``stop``: running probes whose outcome can no longer change the answer;
    ``answer`` once decided (then ``probe`` is empty and every running probe is in ``stop``); ``low`` /
    ``high`` the indices of the bracket (last GOOD, first BAD, ends presumed until checked); ``why`` a
    reason per commit probed or stopped; ``states`` every commit's :class:`CommitState`."""

    probe: tuple[str, ...]
    stop: tuple[str, ...]
    answer: Answer | None
    low: int
    high: int
    states: tuple[CommitState, ...]
    why: Mapping[str, str] = field(default_factory=dict)

    @property
    def done(self) -> bool:
        return self.answer is not None

    @property
    def waiting(self) -> bool:
        """Nothing to launch and no answer yet: wait for a running probe."""
        return self.answer is None and not self.probe


def commit_state(index: int, commit: str, readings: Sequence[Reading], recorded: Reading | None,
                 settings: Settings = Settings()) -> CommitState:
    """One commit's state from its probes' ``readings`` and its ``recorded`` reading.

    A recorded GOOD/BAD decides (confirmed), a recorded SKIP skips. Otherwise: GOOD and BAD readings both
    present -> the majority once there are 3 or more of them and one side leads (confirmed), else open;
    only GOOD (or only BAD) -> that, confirmed from ``settings.confirm`` readings; only UNSURE -> open up to
    ``settings.unsure_retries`` retries, then skipped; only SKIP -> skipped; nothing -> unknown. SKIP and
    UNSURE readings beside GOOD/BAD ones are outweighed by them.
    """
    readings = tuple(Reading(r) for r in readings)
    if recorded in (Reading.GOOD, Reading.BAD):
        state = GOOD if recorded == Reading.GOOD else BAD
        return CommitState(index, commit, state, readings, recorded, True, f"recorded {recorded.value}", "record")
    if recorded == Reading.SKIP:
        return CommitState(index, commit, SKIPPED, readings, recorded, False, "recorded as not judged")
    good, bad = readings.count(Reading.GOOD), readings.count(Reading.BAD)
    unsure, skip = readings.count(Reading.UNSURE), readings.count(Reading.SKIP)
    if good and bad:
        if good + bad >= 3 and good != bad:
            state = GOOD if good > bad else BAD
            return CommitState(index, commit, state, readings, None, True,
                               f"flaky, settled by majority ({good} good, {bad} bad)", "majority")
        return CommitState(index, commit, OPEN, readings, None, False,
                           f"conflicting readings ({good} good, {bad} bad): probe again, a majority of three or "
                           "more decides")
    if good or bad:
        state, count = (GOOD, good) if good else (BAD, bad)
        return CommitState(index, commit, state, readings, None, count >= settings.confirm,
                           f"{count} {state} reading{'s' * (count > 1)}", "probes")
    if unsure:
        if unsure <= settings.unsure_retries:
            return CommitState(index, commit, OPEN, readings, None, False,
                               f"inconclusive ({unsure}x): probe again with a fresh verification")
        return CommitState(index, commit, SKIPPED, readings, None, False,
                           f"inconclusive {unsure} times: treated as skipped")
    if skip:
        return CommitState(index, commit, SKIPPED, readings, None, False, "could not be checked out or launched")
    return CommitState(index, commit, UNKNOWN, readings, None, False, "not probed yet")


def _split(pool: Sequence[int], placed: Collection[int], slots: int) -> list[int]:
    """Up to ``slots`` new probe indices among ``pool`` (the bracket's open commits, in order): the commits
    already ``placed`` (running or due anyway) cut the pool into gaps; each new probe goes to the gap whose
    parts are largest (a gap of k commits holds k + 1 possible culprits, j probes cut it in j + 1 parts), and
    a gap's probes sit at equal distances, so P probes in one gap split it into P + 1 equal parts."""
    gaps: list[list[int]] = [[]]
    for i in pool:
        if i in placed:
            gaps.append([])
        else:
            gaps[-1].append(i)
    gaps = [g for g in gaps if g]
    counts = [0] * len(gaps)
    for _ in range(slots):
        best, size = None, 0.0
        for g, gap in enumerate(gaps):
            if counts[g] < len(gap) and (len(gap) + 1) / (counts[g] + 1) > size:
                best, size = g, (len(gap) + 1) / (counts[g] + 1)
        if best is None:
            break
        counts[best] += 1
    out: list[int] = []
    for gap, j in zip(gaps, counts):
        k = len(gap)
        chosen: list[int] = []
        for p in range(1, j + 1):
            # 1-based position p (k + 1) / (j + 1), rounded down: culprits on each side as equal as they go
            at = max(1, min(k, (p * (k + 1)) // (j + 1)))
            while gap[at - 1] in chosen and at < k:
                at += 1
            chosen.append(gap[at - 1])
        out += chosen
    return out


def plan(commits: Sequence[str], readings: Mapping[str, Sequence[Reading]] | None = None,
         running: Collection[str] = (), free: int = 1, *, record: Mapping[str, Reading] | None = None,
         settings: Settings = Settings(), max_commits: int = MAX_COMMITS) -> Plan:
    """The next step of the bisection of ``commits`` (good first, bad last; see the module docstring).

    Promises: ``probe`` holds at most ``free`` commits, none running, none twice, none already confirmed
    unless a conflict or a contradiction needs it again; a skipped commit is never probed; an answer is
    given only when both ends are settled and the deciding pair is confirmed, and then nothing is probed
    and every running probe is to be stopped. Raises ``BisectInputError`` for a bad range
    (:func:`check_range`), a reading or running probe of a commit outside it, or a negative ``free``.
    """
    commits = check_range(commits, max_commits)
    readings, record = dict(readings or {}), dict(record or {})
    index = {c: i for i, c in enumerate(commits)}
    for name, given in (("readings", readings), ("record", record), ("running", running)):
        strangers = [c for c in given if c not in index]
        if strangers:
            raise BisectInputError(f"{', '.join(map(str, strangers))} not in the range", name,
                                   "name only commits of good..bad")
    if free < 0:
        raise BisectInputError(f"free = {free}", "free", "the number of free nodes, 0 or more")
    states = tuple(commit_state(i, c, readings.get(c, ()), Reading(record[c]) if c in record else None, settings)
                   for i, c in enumerate(commits))
    last = len(commits) - 1
    running_idx = {index[c] for c in running}

    def finished(answer: Answer, low: int, high: int) -> Plan:
        return Plan((), tuple(c for c in commits if c in set(running)), answer, low, high, states,
                    {c: "the answer is known" for c in running})

    # --- the ends
    good_end, bad_end = states[0], states[last]
    must: list[tuple[int, str]] = []
    for end, contrary, label in ((bad_end, GOOD, "bad"), (good_end, BAD, "good")):
        if end.state == SKIPPED:
            return finished(Answer(END_SKIPPED, f"the {label} end {end.commit} could not be judged ({end.why}): no "
                                                "answer without both ends"), 0, last)
        if end.state == contrary and end.confirmed:
            kind = GOOD_END_FAILS if label == "good" else BAD_END_PASSES
            why = ("the regression is older than the range: choose an earlier good commit" if label == "good" else
                   "the failure does not reproduce at the bad end")
            return finished(Answer(kind, f"the {label} end {end.commit} reads {contrary} ({end.why}): {why}"), 0, last)
        if end.state == contrary:  # first: its confirmation may end the bisection
            must.insert(0, (end.index, f"the {label} end reads {contrary}: probe it again before concluding"))
        elif end.state == UNKNOWN:
            must.append((end.index, f"re-check the {label} end (no decided outcome in the record)"))
        elif end.state == OPEN:
            must.append((end.index, f"{label} end: {end.why}"))

    # --- the bracket. The ends are presumed good / bad until their probes say so (a contrary reading that is
    # not yet confirmed is being probed again, see above), so that free nodes split the range meanwhile.
    eff = [s.state for s in states]
    eff[0], eff[last] = GOOD, BAD
    high = min(i for i, s in enumerate(eff) if s == BAD)
    low = max(i for i in range(high) if eff[i] == GOOD)
    late = [j for j in range(high + 1, last) if eff[j] == GOOD]
    useful: set[int] = {i for i, _ in must}
    if late:
        weak = [m for m in [high] + late if not states[m].firm]
        if not weak:
            names = ", ".join(commits[j] for j in late)
            return finished(Answer(INCONSISTENT, f"{commits[high]} reads BAD and the later {names} GOOD, each "
                                                 "confirmed: more than one change, or a flaky signal"), low, high)
        # No split meanwhile: the bracket itself is in doubt until the contradiction is settled.
        for m in weak:
            must.append((m, f"contradiction: {commits[high]} reads BAD, later {commits[late[0]]} GOOD: probe "
                            "again"))
        useful |= set(weak)
        return _assemble(commits, states, must, [], running_idx, useful, free, low, high)

    inside = range(low + 1, high)
    open_inside = [i for i in inside if states[i].state == OPEN]
    pool = [i for i in inside if states[i].state in (UNKNOWN, OPEN)]
    for i in open_inside:
        must.append((i, states[i].why))
    useful |= set(pool)
    if not pool:
        for side, label in ((low, "good"), (high, "bad")):
            s = states[side]
            if s.state in (GOOD, BAD) and not s.confirmed:
                must.append((side, f"confirm the deciding pair's {label} side ({s.why}, {settings.confirm} needed)"))
                useful.add(side)
        if not must:
            skipped = tuple(commits[i] for i in inside)
            culprit = Culprit(low + 1, high, commits[low + 1:high + 1], commits[low], skipped)
            said = (f"{commits[high]} (last good {commits[low]})" if culprit.exact else
                    f"one of {commits[low + 1]}..{commits[high]} ({len(skipped)} commit(s) between could not be "
                    f"judged; last good {commits[low]})")
            return finished(Answer(CULPRIT, f"the culprit is {said}", culprit), low, high)
        return _assemble(commits, states, must, [], running_idx, useful, free, low, high)
    placed = (running_idx & set(pool)) | set(open_inside)
    due = {i for i, _ in must} - running_idx
    slots = max(0, free - len(due))
    splits = _split(pool, placed, slots)
    return _assemble(commits, states, must, splits, running_idx, useful, free, low, high)


def _assemble(commits: Sequence[str], states: Sequence[CommitState], must: list[tuple[int, str]],
              splits: list[int], running: set[int], useful: set[int], free: int, low: int, high: int) -> Plan:
    """The plan: the due probes first (ends, reprobes, confirmations), then the splits, at most ``free``; every
    running probe that is not useful is stopped."""
    why: dict[str, str] = {}
    chosen: list[int] = []
    for i, reason in must + [(i, f"split the open range {commits[low]}..{commits[high]}") for i in splits]:
        if i in running or i in chosen or len(chosen) >= free:
            continue
        chosen.append(i)
        why[commits[i]] = reason
    stop = [i for i in sorted(running) if i not in useful]
    for i in stop:
        why[commits[i]] = (f"outside the open range {commits[low]}..{commits[high]}: its outcome cannot change the "
                           "answer")
    return Plan(tuple(commits[i] for i in chosen), tuple(commits[i] for i in stop), None, low, high, tuple(states),
                why)


@dataclass(frozen=True)
class Worst:
    """The most probes (verifications) and rounds (probes in parallel count once) one range can take, and a
    culprit position that takes them. Training runs: ``probes`` x (1 + the confirmation's repeats)."""

    probes: int
    rounds: int
    culprit_at: int


@lru_cache(maxsize=256)
def worst_case(n_commits: int, free: int, *, good_known: bool = False, bad_known: bool = False,
               settings: Settings = Settings(), skips: int = 0) -> Worst:
    """The worst case of :func:`plan` over a range of ``n_commits`` commits after good, with ``free`` nodes.

    Exact: every culprit position (and, with ``skips`` = 1, every position of one skipped commit that is
    not an end) is bisected with truthful readings, each round launching what :func:`plan` asks for
    and waiting for all of it. ``good_known`` / ``bad_known``: the ends' outcomes come from the record.
    Not included: conflicting or INCONCLUSIVE readings (each costs one or two more probes) and more
    skipped commits than ``skips``. ``skips`` is 0 or 1.
    """
    if skips not in (0, 1):
        raise BisectInputError(f"skips = {skips}", "skips", "0 or 1")
    if free < 1:
        raise BisectInputError(f"free = {free}", "free", "1 or more nodes")
    commits = check_range([str(i) for i in range(n_commits + 1)], max(MAX_COMMITS, n_commits))
    record = {**({commits[0]: Reading.GOOD} if good_known else {}),
              **({commits[-1]: Reading.BAD} if bad_known else {})}
    worst: Worst | None = None
    skip_sets: list[tuple[int, ...]] = [()] if skips == 0 else [(s,) for s in range(1, n_commits)] or [()]
    for culprit in range(1, n_commits + 1):
        for skipped in skip_sets:
            probes, rounds = _bisect_truthfully(commits, culprit, set(skipped), record, free, settings)
            if worst is None or (probes, rounds) > (worst.probes, worst.rounds):
                worst = Worst(probes, rounds, culprit)
    assert worst is not None  # n_commits >= 1 (check_range)
    return worst


def _bisect_truthfully(commits: Sequence[str], culprit: int, skipped: set[int], record: Mapping[str, Reading],
                       free: int, settings: Settings) -> tuple[int, int]:
    readings: dict[str, list[Reading]] = {}
    probes = rounds = 0
    for _ in range(4 * len(commits) + 4):
        step = plan(commits, readings, (), free, record=record, settings=settings, max_commits=len(commits))
        if step.done:
            return probes, rounds
        for c in step.probe:
            i = int(c)
            readings.setdefault(c, []).append(Reading.SKIP if i in skipped else
                                              Reading.GOOD if i < culprit else Reading.BAD)
        probes, rounds = probes + len(step.probe), rounds + 1
    raise RuntimeError(f"bisection of {len(commits) - 1} commits did not end (culprit {culprit})")  # a planner bug
