"""The path-aware skip (issue 33, item 1): a suite whose diff since its last verified PASS touches no path that
can affect it ends PASS (unchanged) without a training.

The base is the newest verification in the record whose suite PASSed in a full run with the same per-suite
experiment fingerprint (spec as written, data in use, baseline version) and the same baseline version
(``verification_history.verified_passes``). The diff is read from the node's own checkout
(``node.ops.changed_files``); which of its files can affect the suite is the spec's data (``affects``,
``unaffecting``: ``core.paths``). A base the node no longer has, a dirty worktree or ``lane = full`` skip
nothing. What it covers and does not is said on the report (``core.report.words.UNCHANGED_COVERS``).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from rl_verify.core import evidence as executed
from rl_verify.core import bitwise, lane, paths
from rl_verify.core.model import UNCHANGED, SuiteResult
from rl_verify.core.names import short_sha
from rl_verify.engines import engine_of
from rl_verify.node import ops as node
from rl_verify.orchestration.confirmation import OUTCOME_FILE
from rl_verify.orchestration import bitwise_lane, verification_history
from rl_verify.orchestration.verification_history import verified_passes
from rl_verify.store import record, references
from rl_verify.suites import card
from rl_verify.suites.rules import rules_of
from rl_verify.suites.spec import SuiteSpec, data_file

log = logging.getLogger(__name__)


def suite_fingerprint(spec: SuiteSpec, files: Mapping[str, bytes], version: int) -> str:
    """The experiment fingerprint of one suite on its own (``card.experiment_fingerprint``): its spec as written,
    the data it is judged with (its baseline version's golden table when that replaces the spec's data file,
    ``files``), and the version's number."""
    engine = engine_of(spec)
    if engine.baseline_is_data and engine.baseline_file in files:
        data = json.loads(files[engine.baseline_file])
    else:
        data = json.loads(data_file(spec.data).read_text(encoding="utf-8"))
    return card.experiment_fingerprint([spec], lambda _: data, {spec.name: version})


def bases(specs: list[SuiteSpec], fingerprints: Mapping[str, str],
          versions: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per suite, the verified PASS the skip may rest on (``verified_passes``, one pass over the record), for the
    suites that have one."""
    return verified_passes({s.name: (fingerprints[s.name], (versions.get(s.name) or {}).get("label")) for s in specs})


def unchanged_on_node(client: Any, checkout: str, sha: str, specs: list[SuiteSpec], found: Mapping[str, dict[str, Any]],
                      scheduled: bool = False, now: float | None = None, tree: Sequence[str] | None = None,
                      verdicts: Sequence[Mapping[str, Any]] = (),
                      fingerprints: Mapping[str, str] | None = None,
                      environment: Callable[[], Mapping[str, Any] | None] | None = None) -> dict[str, dict[str, Any]]:
    """The suites of one node that need no training: for each with a base in ``found``, the files changed
    between the base and ``sha`` in the node's checkout, as ``core.lane.judge`` decides with the suite's rules
    checked against ``tree`` (the checkout's files at ``sha``) and what the record says (``verdicts``:
    ``verification_history.suite_verdicts``): a FAIL of this commit, or of a later commit whose affecting files are
    the base's, turns the skip off. A scheduled run also trains a suite whose base is older than
    ``settings.FULL_EVERY_DAYS``. With ``fingerprints`` (suite -> experiment fingerprint), a suite whose newest
    trusted reference on the node's environment now (``environment``: read once, when first needed) kept complete
    executed-code evidence is also unchanged when the diff since that reference's commit changes only Python blocks
    no process of its runs ran (issues 44, 53). Entry: the base (``sha``,
    ``run_id``, ``report``), ``files`` (every changed file), ``why`` (one sentence) and, from evidence,
    ``evidence`` (the changed lines, none of which ran)."""
    out: dict[str, dict[str, Any]] = {}
    diffs: dict[str, list[str] | str] = {}  # base commit -> its changed files, or why they are unknown
    now_at = datetime.fromtimestamp(time.time() if now is None else now, timezone.utc)

    def diff(base: str, head: str) -> list[str] | str:
        if (base, head) not in diffs:  # suites resting on the same commit share one diff
            try:
                changed = node.changed_files(client, checkout, base, head)
                diffs[(base, head)] = "it is not in the node's checkout" if changed is None else changed
            except node.NodeError as err:  # the skip only ever saves a training: without a diff, train
                diffs[(base, head)] = f"its diff could not be read ({err})"
        return diffs[(base, head)]

    for spec in specs:
        by_evidence = _by_evidence(client, checkout, sha, spec, (fingerprints or {}).get(spec.name), tree, verdicts,
                                   scheduled, now_at, environment or (lambda: None))
        if by_evidence:
            out[spec.name] = by_evidence
            log.info("%s: %s (%s)", spec.name, UNCHANGED, by_evidence["why"])
            continue
        base = found.get(spec.name)
        if not base:
            continue
        changed = diff(base["sha"], sha)
        if isinstance(changed, str):
            log.info("%s: verified PASS %s: %s: trained as usual", spec.name, short_sha(base["sha"]), changed)
            continue
        rules = rules_of(spec, with_lane=False)
        decided = lane.judge(rules, lane.Facts(
            requested="auto", scheduled=scheduled, verified_pass=base["sha"], changed_since_pass=changed, tree=tree,
            contradicted=_contradiction(spec, rules, sha, base, verdicts, diff),
            last_full_at=datetime.fromtimestamp(float(base.get("written_at") or 0), timezone.utc), now=now_at))
        if decided.choice != "unchanged":
            log.info("%s: %d of %d file(s) changed since its verified PASS %s can affect it%s: trained (%s)",
                     spec.name, len(decided.affecting), len(changed), short_sha(base["sha"]),
                     f" ({', '.join(decided.affecting[:5])})" if decided.affecting else "", decided.why)
            continue
        why = f"{decided.why} ({len(changed)} file(s) changed)"
        out[spec.name] = {**base, "files": changed, "why": why}
        log.info("%s: %s (%s)", spec.name, UNCHANGED, why)
    return out


def _contradiction(spec: SuiteSpec, rules: lane.Rules, sha: str, base: Mapping[str, Any],
                   verdicts: Sequence[Mapping[str, Any]], diff: Any) -> str:
    """What the record knows against skipping ``spec`` at ``sha`` on ``base`` (issue 42), or "": the newest full
    verdict of this very commit doubts it, or a commit verified after the base doubts it while none of its files
    that can affect the suite differ from the base's (the same code FAILed since: the environment, or a regression
    the base's PASS missed)."""
    same = verification_history.doubted(verdicts, spec.name, sha)
    if same:
        return verification_history.doubt_words(same)
    later = [v for v in verdicts if v["suite"] == spec.name and v["doubting"] and v["sha"] != sha
             and float(v.get("written_at") or 0) > float(base.get("written_at") or 0)]
    for verdict in later:
        changed = diff(base["sha"], verdict["sha"])
        if not isinstance(changed, str) and not paths.affecting(changed, rules.affects, rules.unaffecting):
            return verification_history.doubt_words(
                verdict, f"{short_sha(verdict['sha'])}, whose files that can affect {spec.name} are the verified "
                         f"PASS's, after that PASS")
    return ""


def _evidence_of_this_environment(spec: SuiteSpec, experiment: str,
                                  environment: Mapping[str, Any] | None) -> tuple[dict[str, Any], Any] | str:
    """The trusted reference of ``spec`` for this experiment, lane config and the node's environment now, with its
    complete executed-code evidence; or why there is none (one phrase)."""
    if not environment:
        return "the node's environment could not be read (evidence rests only on its own environment's)"
    key = bitwise.reference_key(spec.name, experiment, bitwise.fingerprint(environment),
                                bitwise_lane.lane_config(spec))
    reference = references.get(key)
    if references.state(reference) != references.TRUSTED:
        return f"no trusted bitwise reference on this environment ({references.state(reference)})"
    recorded = references.get_evidence(key, reference)
    if recorded is None:
        return f"the reference of {short_sha(str(reference.get('sha')))} on this environment kept no evidence"
    found = executed.Evidence.from_dict(recorded)
    if found.problems:
        return (f"the executed-code evidence of {short_sha(str(reference.get('sha')))} is incomplete ("
                + "; ".join(found.problems) + ")")
    return dict(reference), found


def _by_evidence(client: Any, checkout: str, sha: str, spec: SuiteSpec, experiment: str | None,
                 tree: Sequence[str] | None, verdicts: Sequence[Mapping[str, Any]], scheduled: bool, now_at: datetime,
                 environment: Callable[[], Mapping[str, Any] | None]) -> dict[str, Any] | None:
    """The suite's entry when the trusted reference of the node's environment now, with complete executed-code
    evidence, vouches for ``sha`` (issues 44, 53): its commit PASSed in full, and the diff since it changes only
    ``.py`` blocks no process of that full run or lane ran (``core.evidence.read_diff``) and no other file that can
    affect the suite; and the record knows no FAIL of this commit, nor of a later one whose diff from the reference
    changes no block that ran either (the same executed code). None otherwise (the path rules then decide)."""
    if spec.evidence is None or spec.bitwise is None or not experiment:
        return None
    kept = _evidence_of_this_environment(spec, experiment, environment())
    if isinstance(kept, str):
        log.info("%s: no PASS (unchanged) by executed-code evidence: %s: the path rules decide", spec.name, kept)
        return None
    reference, found = kept
    rules = rules_of(spec, with_lane=False)

    def judged(head: str) -> tuple[lane.Judgement, Any, dict[str, Any]] | None:
        try:
            read = node.changed_lines(client, checkout, reference["sha"], head)
            changes = None if read is None else executed.read_changes(read)
        except (node.NodeError, ValueError) as err:
            log.info("%s: the diff since the evidence's commit could not be read (%s)", spec.name, err)
            return None
        if changes is None:
            return None
        reading = executed.read_diff(found, changes)
        return lane.judge(rules, lane.Facts(
            requested="auto", scheduled=scheduled, changed_since_reference=list(changes), reference="trusted",
            reference_sha=reference["sha"], evidence=reading, tree=tree,
            last_full_at=_when(reference.get("made_at")), now=now_at)), reading, changes

    mine = judged(sha)
    if mine is None:
        return None
    decided, reading, changes = mine
    if decided.choice != "unchanged":
        log.info("%s: executed-code evidence of %s: %d touched line(s) ran, %d file(s) it cannot judge (%s)",
                 spec.name, short_sha(reference["sha"]), len(reading.ran), len(reading.unknown), decided.why)
        return None
    doubt = verification_history.doubted(verdicts, spec.name, sha)
    if doubt:
        log.info("%s: the record doubts %s (%s): no PASS (unchanged)", spec.name, short_sha(sha),
                 verification_history.doubt_words(doubt))
        return None
    made = _when(reference.get("made_at"))
    for verdict in verdicts:  # a later FAIL of the same executed code: the environment, or what the PASS missed
        if verdict["suite"] != spec.name or not verdict["doubting"] or verdict["sha"] == sha or made is None or \
                float(verdict.get("written_at") or 0) <= made.timestamp():
            continue
        theirs = judged(verdict["sha"])
        if theirs is None or theirs[0].choice == "unchanged":
            log.info("%s: %s, whose changed blocks since %s never ran either, ended %s after it: no PASS "
                     "(unchanged)", spec.name, short_sha(verdict["sha"]), short_sha(reference["sha"]),
                     verdict.get("outcome"))
            return None
    files = sorted(changes)
    why = (f"{decided.why} ({len(reading.unrun)} changed line(s) of Python in blocks no process ran; "
           f"{len(files)} file(s) changed)")
    return {**{k: reference.get(k) for k in ("sha", "run_id", "report")}, "files": files, "why": why,
            "evidence": {"lines": list(reading.unrun[:200]), "reference": reference.get("key"),
                         "made_at": reference.get("made_at"), "environment": reference.get("environment")}}


def _when(text: Any) -> datetime | None:
    try:
        return datetime.fromisoformat(str(text))
    except ValueError:
        return None


def write_outcomes(run_dir: Path, unchanged: Mapping[str, Mapping[str, Any]]) -> None:
    """Each unchanged suite's result and outcome in the run's record, as a compared and confirmed suite has
    them: the report, the verdict and the history read them like any other."""
    for suite, entry in unchanged.items():
        verified = {k: entry[k] for k in ("sha", "run_id", "report")}
        result = SuiteResult.unchanged(suite, verified, list(entry["files"]))
        record.write_json(run_dir / suite / "result.json", result.to_dict())
        record.write_json(run_dir / suite / OUTCOME_FILE, {
            "suite": suite, "outcome": UNCHANGED, "reason": entry["why"], "runs": [],
            "unchanged": {**verified, "files": list(entry["files"]),
                          **({"evidence": entry["evidence"]} if entry.get("evidence") else {})}})


def card_notes(resolved: Mapping[str, Any]) -> list[str]:
    """The card's lines about the suites that need no training (none when every suite trains)."""
    skipped = resolved.get("unchanged") or {}
    if not skipped:
        return []
    lines = [f"{suite}: {UNCHANGED}, no training: {entry['why']}; files: "
             + (", ".join(entry["files"][:10]) or "none") + (" ..." if len(entry["files"]) > 10 else "")
             for suite, entry in skipped.items()]
    if len(skipped) == len(resolved.get("suites") or []):
        lines.append("Nothing to launch: every suite is unchanged since its verified PASS, so no approval is asked.")
    return lines
