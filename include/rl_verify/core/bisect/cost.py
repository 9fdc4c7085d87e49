"""What a bisection can cost at most: :func:`worst_case`, exact over every culprit position with truthful
readings (for the approval card and the bench)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Mapping, Sequence

from rl_verify.core.bisect.planner import Settings, plan
from rl_verify.core.bisect.readings import MAX_COMMITS, BisectInputError, Reading, check_range


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
