"""Which verification a suite gets (issue 33): none (its diff cannot move its numbers), the bitwise-first lane,
or the full statistical check. Pure: every fact is a parameter, so that the rule is tested on its own.

The order is the runbook's trust order: a cheaper answer is only taken when nothing says it might be wrong.
1. ``full`` when the run asks for it (param ``lane`` = ``full``) or a scheduled run finds the suite's last full
   verification older than ``RL_VERIFY_FULL_EVERY_DAYS`` (or none): what no diff shows (the environment) is
   verified at least that often.
2. ``full`` when the record contradicts a shortcut (issue 42): a FAIL of this very commit, or of a commit the
   shortcut would rest on as equal (the same affecting files as the verified PASS, the same lane bits as the
   reference). A shortcut never says PASS where the project already knows better.
3. ``unchanged``: the diff since the suite's last verified PASS (same experiment fingerprint and baseline
   version) touches no path that can affect it, and every ``affects`` pattern matches a file of the checkout at
   this commit (a rule naming paths the tree no longer has decides nothing). No training.
4. ``full`` when the suite has no lane, an ``affects`` or ``bitwise.disabled_by`` pattern matches no file of the
   checkout (the suite's account of its code is out of date: nothing vouches for the lane either), the diff
   touches a path that turns the lane off, or no trusted reference exists for this environment (or the one that
   exists is blind to a regression the record knows).
5. ``bitwise`` otherwise: k deterministic steps compared with the reference; a difference falls back to
   ``full`` under the same approval (decided later, by the comparison, not here).

``judge`` is the one decision path: the DAG (``orchestration.unchanged``, ``orchestration.bitwise_lane``), the
bisection's plan, ``rl-verify shortcut`` and ``scripts/bench_shortcuts.py`` call it with the facts they have.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Literal

from rl_verify import settings
from rl_verify.core import paths
from rl_verify.core.evidence import Reading
from rl_verify.core.names import short_sha

#: The values of the run param ``lane``.
REQUESTS = settings.LANES
#: A reference's state for this suite, experiment, environment and lane config.
ReferenceState = Literal["trusted", "absent", "not reproducible", "blind"]
Choice = Literal["unchanged", "bitwise", "full"]


@dataclass(frozen=True)
class LaneChoice:
    """The verification a suite gets and why, in one sentence the card and the report show."""

    choice: Choice
    why: str
    #: The rule that decided (``rl-verify shortcut`` names it): lane = full, full-every, record, affects,
    #: lane = skip, no lane, bitwise.disabled_by, reference.
    rule: str = ""


def _files(changed: Sequence[str], most: int = 5) -> str:
    shown = ", ".join(changed[:most])
    return shown + (f" and {len(changed) - most} more" if len(changed) > most else "")


#: The fix a stale path rule's line names.
STALE_FIX = ("name the checkout's current paths in the suite spec (XTuner moves code: `git log --follow` on the old "
             "path finds the new one), or remove the pattern")


def stale_words(field: str, patterns: Sequence[str], not_yet: Sequence[str] = ()) -> str:
    """One sentence naming a suite's path rules that match no file of the checkout, and the fix; patterns that are
    all in ``not_yet`` (they name files a newer commit has: the rules are newer than this commit) are said so."""
    shown = ", ".join(f"'{p}'" for p in patterns)
    if patterns and set(patterns) <= set(not_yet):
        return (f"{field} pattern(s) {shown} name files this commit does not have yet (the suite's rules are newer "
                "than the commit): nothing vouches for a shortcut older than its rules")
    return f"{field} pattern(s) {shown} match no file of the checkout at this commit; fix: {STALE_FIX}"


def choose(*, requested: str, scheduled: bool, verified_pass: str | None, affecting: Sequence[str],
           has_lane: bool, lane_disabling: Sequence[str], reference: ReferenceState,
           last_full_at: datetime | None, now: datetime, full_every_days: float,
           environment_change: str = "", stale_affects: Sequence[str] = (), stale_lane: Sequence[str] = (),
           contradicted: str = "", blind: str = "", lane_unseen: Sequence[str] = (),
           unrun_since: str = "", not_yet: Sequence[str] = (), definition: Sequence[str] = ()) -> LaneChoice:
    """The verification a suite gets.

    ``verified_pass``: the commit of the suite's last verified PASS with the same experiment fingerprint and
    baseline version (None: none, so no skip). ``affecting``: the diff's files since it that can affect the
    suite (``core.paths.affecting``). ``lane_disabling``: the diff's files that turn the lane off.
    ``last_full_at``: when the suite's last full verification ended (None: never). ``environment_change``: when
    no reference exists for this environment but one does for another, what changed since it (named in the why).
    ``stale_affects`` / ``stale_lane``: the suite's ``affects`` / ``bitwise.disabled_by`` patterns that match no
    file of the checkout at this commit. ``contradicted``: what the record knows against a shortcut (a FAIL of
    this commit, ...), one phrase; "" when nothing. ``blind``: with ``reference`` "blind", the regression the
    reference's bits did not show. ``lane_unseen``: the diff's touched lines (``path:line``) that the reference's
    full run executed and its lane's k steps did not (``core.evidence.read_diff``, issues 44, 53). ``unrun_since``:
    the commit of a trusted reference since which the diff changes only ``.py`` blocks no process of its full run ran
    and no other file that can affect the suite ("" when not so): PASS (unchanged) by executed-code evidence.
    ``definition``: the diff's files that define the experiment (``Rules.read``: launch script, config, checker):
    what they set (the step count, the schedules, the verdict) reaches past the lane's k steps, so the lane is off.
    """
    if requested not in REQUESTS:
        raise ValueError(f"lane {requested!r} is not one of {', '.join(REQUESTS)}; use 'full' to force the full "
                         "verification")
    if requested == "full":
        return LaneChoice("full", "the run asked for a full verification (lane = full)", "lane = full")
    if scheduled:
        due = last_full_at is None or now - last_full_at >= timedelta(days=full_every_days)
        if due:
            age = "there was none" if last_full_at is None else \
                f"the last one was {(now - last_full_at).total_seconds() / 86400:.1f} days ago"
            return LaneChoice("full", f"a scheduled run verifies in full every {full_every_days:g} days and {age} "
                                      "(RL_VERIFY_FULL_EVERY_DAYS)", "full-every")
    if contradicted:
        return LaneChoice("full", f"the record contradicts a shortcut: {contradicted}", "record")
    skip_off = ""  # why the path-aware skip, which the diff alone would allow, is off
    if verified_pass and not affecting:
        if not stale_affects:
            return LaneChoice("unchanged", f"the diff since the verified PASS at {short_sha(verified_pass)} touches "
                                           "no path that can affect this suite", "affects")
        skip_off = f"no PASS (unchanged): {stale_words('affects', stale_affects, not_yet)}"
    if unrun_since and stale_affects and not skip_off:
        skip_off = f"no PASS (unchanged): {stale_words('affects', stale_affects, not_yet)}"
    if unrun_since and not stale_affects and not skip_off:
        return LaneChoice("unchanged", f"no block of Python the diff since the verified PASS at "
                                       f"{short_sha(unrun_since)} touches ran in any process of its full run "
                                       "(executed-code evidence of its reference), and no other file that can "
                                       "affect this suite changed", "evidence")
    if requested == "skip":
        return LaneChoice("full", skip_off or "the run asked for the path-aware skip only (lane = skip)",
                          "affects" if skip_off else "lane = skip")
    if not has_lane:
        return LaneChoice("full", skip_off or "the suite declares no bitwise lane",
                          "affects" if skip_off else "no lane")
    if stale_affects:  # the suite's account of its own code is out of date: nothing vouches for the lane either
        newer = set(stale_affects) <= set(not_yet)
        return LaneChoice("full", ("the suite's path rules are newer than this commit: " if newer else
                                   "the suite's path rules are out of date: ")
                          + stale_words("affects", stale_affects, not_yet), "affects")
    if stale_lane:
        return LaneChoice("full", "the lane's rule cannot be trusted: "
                                  + stale_words("bitwise.disabled_by", stale_lane, not_yet), "bitwise.disabled_by")
    if lane_unseen:
        return LaneChoice("full", f"the lane's deterministic steps never ran {_files(lane_unseen)}, which the "
                                  "reference's full run ran (executed-code evidence): the change shows only in the "
                                  "full verification", "evidence")
    if lane_disabling:
        return LaneChoice("full", f"the diff touches code the deterministic mode bypasses: {_files(lane_disabling)}",
                          "bitwise.disabled_by")
    if definition:
        return LaneChoice("full", f"the diff changes what defines the experiment ({_files(definition)}): what it "
                                  "sets (step count, schedules, evaluation, the verdict's checker) reaches past the "
                                  "lane's steps", "experiment")
    if reference == "absent":
        changed = f"the environment changed {environment_change}: " if environment_change else ""
        return LaneChoice("full", f"{changed}no bitwise reference for this environment yet (one is made after a full "
                                  "PASS)", "reference")
    if reference == "not reproducible":
        return LaneChoice("full", "the bitwise lane is off: not reproducible on this environment (the reference's "
                                  "self-check runs differed)", "reference")
    if reference == "blind":
        return LaneChoice("full", f"the bitwise reference is blind to a regression the record knows ({blind}): the "
                                  "lane is off for it until a full PASS makes a new reference", "reference")
    return LaneChoice("bitwise", "a trusted reference exists for this environment and the diff touches no path "
                                 "that turns the lane off", "bitwise.disabled_by")


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


@dataclass(frozen=True)
class Rules:
    """A suite's path rules (its spec's data): what can move its numbers, and what turns its lane off (None: the
    suite declares no lane, or the caller does not decide the lane)."""

    affects: Sequence[str] = paths.DEFAULT_AFFECTS
    unaffecting: Sequence[str] = paths.DEFAULT_UNAFFECTING
    disabled_by: Sequence[str] | None = None
    #: The checkout files the training or its verdict reads whatever runs (launch script, config, checker): a
    #: change to one of them moves numbers whatever executed-code evidence says.
    read: Sequence[str] = ()


@dataclass(frozen=True)
class Facts:
    """What is known when a suite's verification is chosen. ``changed_since_pass``: the files changed between the
    verified PASS and the commit under test (None: unknown, so no skip); ``changed_since_reference``: the same
    since the bitwise reference's commit (None: unknown, so no lane; [] for the reference's own commit);
    ``tree``: the checkout's files at the commit under test (None: not read, so every rule counts as unchecked and
    no shortcut is taken). The rest as :func:`choose` takes them."""

    requested: str = "auto"
    scheduled: bool = False
    verified_pass: str | None = None
    changed_since_pass: Sequence[str] | None = None
    changed_since_reference: Sequence[str] | None = None
    tree: Sequence[str] | None = None
    #: The rules' stale patterns when the tree was checked earlier (``{"affects": [...], "disabled_by": [...]}``,
    #: as ``stale_rules`` found them; used instead of ``tree``).
    stale: Mapping[str, Sequence[str]] | None = None
    reference: ReferenceState = "absent"
    #: The bitwise reference's commit (a verified PASS), what ``changed_since_reference`` and ``evidence`` read from.
    reference_sha: str | None = None
    #: Why ``changed_since_reference`` is None (shown as the lane's reason to stay off).
    reference_diff_problem: str = ""
    #: What the reference's executed-code evidence says of the diff since its commit (``core.evidence.read_diff``;
    #: issues 44, 53; None: no evidence). Evidence only ever takes a shortcut away from what the path rules give,
    #: except PASS (unchanged) for ``.py`` files whose every touched block no process of the full run ran.
    evidence: Reading | None = None
    #: The stale patterns that name files a newer commit of the checkout has (the rules are newer than the commit).
    not_yet: Sequence[str] = ()
    contradicted: str = ""
    blind: str = ""
    last_full_at: datetime | None = None
    now: datetime | None = None
    #: None: ``settings.FULL_EVERY_DAYS`` as it is when judged.
    full_every_days: float | None = None
    environment_change: str = ""


@dataclass(frozen=True)
class Judgement:
    """:func:`judge`'s answer: the choice and why, and the facts that decided it (for the card, the report and
    ``rl-verify shortcut``)."""

    choice: Choice
    why: str
    rule: str = ""
    affecting: tuple[str, ...] = ()
    disabling: tuple[str, ...] = ()
    stale_affects: tuple[str, ...] = ()
    stale_lane: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, object]:
        return {"choice": self.choice, "rule": self.rule, "why": self.why, "affecting": list(self.affecting),
                "disabling": list(self.disabling), "stale_affects": list(self.stale_affects),
                "stale_lane": list(self.stale_lane)}


def stale_rules(rules: Rules, tree: Sequence[str] | None) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The ``affects`` and ``disabled_by`` patterns of ``rules`` that match no file of ``tree`` (every one when the
    tree is unknown: an unchecked rule is no rule)."""
    if tree is None:
        return tuple(rules.affects), tuple(rules.disabled_by or ())
    return tuple(paths.stale(rules.affects, tree)), tuple(paths.stale(rules.disabled_by or (), tree))


def judge(rules: Rules, facts: Facts) -> Judgement:
    """The verification a suite gets from its rules and what is known (:func:`choose` over the diffs read through
    the rules): the one decision path of the DAG, the bisection's plan, ``rl-verify shortcut`` and the bench."""
    if facts.stale is not None:
        stale_affects, stale_lane = tuple(facts.stale.get("affects") or ()), tuple(facts.stale.get("disabled_by") or ())
    else:
        stale_affects, stale_lane = stale_rules(rules, facts.tree)
    since_pass = facts.changed_since_pass
    verified = facts.verified_pass if since_pass is not None else None
    affecting = tuple(paths.affecting(since_pass or (), rules.affects, rules.unaffecting))
    has_lane = rules.disabled_by is not None
    since_ref = facts.changed_since_reference
    reading = facts.evidence if facts.evidence is not None and not facts.evidence.problems else None
    disabling: tuple[str, ...] = ()
    reference = facts.reference
    if has_lane and reference == "trusted" and since_ref is None:  # without the diff nothing clears the lane
        disabling = (facts.reference_diff_problem or "(the diff since the reference's commit is not known)",)
    elif has_lane and since_ref:  # every changed file, .py included: evidence never grants against a rule
        disabling = tuple(paths.affecting(since_ref, rules.disabled_by or (), ()))
    by_evidence = ""
    if reading is not None and since_ref is not None and reference == "trusted" and facts.reference_sha:
        unrun = reading.judged() - set(rules.read)
        if not [p for p in paths.affecting(since_ref, rules.affects, rules.unaffecting) if p not in unrun]:
            by_evidence = facts.reference_sha
    chosen = choose(requested=facts.requested, scheduled=facts.scheduled, verified_pass=verified, affecting=affecting,
                    has_lane=has_lane, lane_disabling=disabling, reference=reference,
                    last_full_at=facts.last_full_at, now=facts.now or datetime.now(timezone.utc),
                    full_every_days=settings.FULL_EVERY_DAYS if facts.full_every_days is None else
                    facts.full_every_days, environment_change=facts.environment_change,
                    stale_affects=stale_affects, stale_lane=stale_lane, contradicted=facts.contradicted,
                    blind=facts.blind, lane_unseen=tuple(reading.lane_unseen if reading else ()),
                    unrun_since=by_evidence, not_yet=tuple(facts.not_yet),
                    definition=tuple(p for p in since_ref or () if p in set(rules.read)) if has_lane else ())
    return Judgement(chosen.choice, chosen.why, chosen.rule, affecting, disabling, stale_affects, stale_lane)
