"""Which verification a suite gets (issue 33): none (its diff cannot move its numbers), the bitwise-first lane,
or the full statistical check. Pure: every fact is a parameter, so that the rule is tested on its own.

The order is the runbook's trust order: a cheaper answer is only taken when nothing says it might be wrong.
1. ``full`` when the run asks for it (param ``lane`` = ``full``) or a scheduled run finds the suite's last full
   verification older than ``RL_VERIFY_FULL_EVERY_DAYS`` (or none): what no diff shows (the environment) is
   verified at least that often.
2. ``unchanged``: the diff since the suite's last verified PASS (same experiment fingerprint and baseline
   version) touches no path that can affect it. No training.
3. ``full`` when the suite has no lane, the diff touches a path that turns the lane off, or no trusted reference
   exists for this environment.
4. ``bitwise`` otherwise: k deterministic steps compared with the reference; a difference falls back to
   ``full`` under the same approval (decided later, by the comparison, not here).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

from rl_verify import settings
from rl_verify.core.names import short_sha

#: The values of the run param ``lane``.
REQUESTS = settings.LANES
#: A reference's state for this suite, experiment, environment and lane config.
ReferenceState = Literal["trusted", "absent", "not reproducible"]
Choice = Literal["unchanged", "bitwise", "full"]


@dataclass(frozen=True)
class LaneChoice:
    """The verification a suite gets and why, in one sentence the card and the report show."""

    choice: Choice
    why: str


def _files(changed: Sequence[str], most: int = 5) -> str:
    shown = ", ".join(changed[:most])
    return shown + (f" and {len(changed) - most} more" if len(changed) > most else "")


def choose(*, requested: str, scheduled: bool, verified_pass: str | None, affecting: Sequence[str],
           has_lane: bool, lane_disabling: Sequence[str], reference: ReferenceState,
           last_full_at: datetime | None, now: datetime, full_every_days: float,
           environment_change: str = "") -> LaneChoice:
    """The verification a suite gets.

    ``verified_pass``: the commit of the suite's last verified PASS with the same experiment fingerprint and
    baseline version (None: none, so no skip). ``affecting``: the diff's files since it that can affect the
    suite (``core.paths.affecting``). ``lane_disabling``: the diff's files that turn the lane off.
    ``last_full_at``: when the suite's last full verification ended (None: never). ``environment_change``: when
    no reference exists for this environment but one does for another, what changed since it (named in the why).
    """
    if requested not in REQUESTS:
        raise ValueError(f"lane {requested!r} is not one of {', '.join(REQUESTS)}; use 'full' to force the full "
                         "verification")
    if requested == "full":
        return LaneChoice("full", "the run asked for a full verification (lane = full)")
    if scheduled:
        due = last_full_at is None or now - last_full_at >= timedelta(days=full_every_days)
        if due:
            age = "there was none" if last_full_at is None else \
                f"the last one was {(now - last_full_at).total_seconds() / 86400:.1f} days ago"
            return LaneChoice("full", f"a scheduled run verifies in full every {full_every_days:g} days and {age} "
                                      "(RL_VERIFY_FULL_EVERY_DAYS)")
    if verified_pass and not affecting:
        return LaneChoice("unchanged", f"the diff since the verified PASS at {short_sha(verified_pass)} touches no "
                                       "path that can affect this suite")
    if requested == "skip":
        return LaneChoice("full", "the run asked for the path-aware skip only (lane = skip)")
    if not has_lane:
        return LaneChoice("full", "the suite declares no bitwise lane")
    if lane_disabling:
        return LaneChoice("full", f"the diff touches code the deterministic mode bypasses: {_files(lane_disabling)}")
    if reference == "absent":
        changed = f"the environment changed {environment_change}: " if environment_change else ""
        return LaneChoice("full", f"{changed}no bitwise reference for this environment yet (one is made after a full "
                                  "PASS)")
    if reference == "not reproducible":
        return LaneChoice("full", "the bitwise lane is off: not reproducible on this environment (the reference's "
                                  "self-check runs differed)")
    return LaneChoice("bitwise", "a trusted reference exists for this environment and the diff touches no path "
                                 "that turns the lane off")


def for_bisection(onset: int | None, lane_steps: Sequence[int]) -> tuple[str, str]:
    """The ``lane`` param of a bisection's probes and why (issue 33, item 3): ``auto`` (the bitwise lane first) only
    when the regression first showed (``onset``: the bad end's first breached step) within the lane's steps: before
    its onset a regressed commit's bits are a good commit's, so a later onset would read the culprit as good; else
    ``full``. (The path-aware part is the plan's: commits whose diff from the good end cannot move a number.)"""
    if not lane_steps:
        return "full", "no suite of the bisection declares a bitwise lane"
    k = min(lane_steps)
    if onset is None:
        return "full", ("where the regression first showed is not known (no first breached step in the bad end's "
                        "record): a bitwise lane could read the culprit as good")
    if onset >= k:
        return "full", (f"the regression first showed at step {onset}, not within the lane's {k} steps (0..{k - 1}): "
                        "before it a regressed commit has a good commit's bits (the lane's blind spot)")
    return "auto", (f"the regression first showed at step {onset}, within the lane's {k} steps: a probe whose "
                    "deterministic steps are the bits of a verified PASS is good")
