"""The bisection planner: from the readings so far, each commit's state and what to probe, stop or answer next
(:func:`plan`; its rules are the package docstring's). Keeps no state; standard library only."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Collection, Mapping, Sequence

from rl_verify.core.bisect.readings import MAX_COMMITS, BisectInputError, Reading, check_range


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
