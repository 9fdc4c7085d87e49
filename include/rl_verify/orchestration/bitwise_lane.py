"""The bitwise-first lane in the verification DAG (issue 33, item 2).

* ``decide`` (in ``check_prerequisites``, once the node's environment is read): per suite with a ``bitwise`` block
  in a ``lane = auto`` run, the reference kept for (suite, experiment fingerprint, environment fingerprint, lane
  config) and ``core.lane.choose``'s choice; the diff since the reference's commit decides whether a path the
  deterministic mode bypasses changed.
* The training task (``operators.SuiteTrainingOperator``) runs the lane's k deterministic steps first when the
  choice is ``bitwise``; the trigger compares each step with the reference as it arrives and stops the job. The
  same bits end the suite **PASS (bitwise)** (``pass_bitwise``); a difference, or a lane that could not finish,
  goes on to the full training under the same approval. The lane never FAILs a run.
* After a full training that exited 0, when no trusted reference exists for the key (or the lane differed), two
  more deterministic runs of k steps make a candidate (``candidate``): trusted when they agree bit for bit, else
  "not reproducible". ``promote`` keeps it in the store once the suite's outcome is a PASS.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

from rl_verify import settings
from rl_verify.core import bitwise, lane
from rl_verify.core import evidence as executed
from rl_verify.core.model import BITWISE, SuiteResult, is_infrastructure
from rl_verify.core.names import short_sha
from rl_verify.engines import load_suite
from rl_verify.node import ops as node
from rl_verify.orchestration import verification_history
from rl_verify.orchestration.nodes import node_settings, ssh_client, suite_node
from rl_verify.store import record, references
from rl_verify.suites.rules import rules_of
from rl_verify.suites.spec import SuiteSpec

log = logging.getLogger(__name__)

#: The run's record files of the lane: what the lane read, and a reference made by this run (until promoted).
LANE_FILE, CANDIDATE_FILE = "lane.json", "reference-candidate.json"
#: The run's record file of every suite's lane decision (``decide``).
LANES_FILE = "lanes.json"
#: What a PASS (bitwise) covers and what it does not (a shortcut verdict says both).
BITWISE_COVERS = ("What this covers: the first {k} steps of this commit's deterministic run are the same bits as "
                  "the verified commit's on the same environment (GPU, driver, CUDA, packages), every compared "
                  "metric of every one of them, the eval at step 0 included. What it does not cover: the steps "
                  "after step {last} (a change that shows only later passes the lane), timing, throughput and "
                  "memory (time/*, *throughput*, memory/*: they differ run to run, never compared), and whatever the "
                  "deterministic mode does not run (the non-deterministic launch's kernels and rollout backend); "
                  "scheduled runs verify in full at least every {days:g} days, and lane = full trains anyway.")


def lane_config(spec: SuiteSpec) -> dict[str, Any]:
    """The lane's config as the reference key sees it: the deterministic launch, k and the compared fields."""
    assert spec.bitwise is not None
    b = spec.bitwise
    return {"env": dict(sorted(b.env.items())), "args": list(b.args), "steps": b.steps, "exclude": list(b.exclude)}


def evidence_lane_spec(spec: SuiteSpec) -> SuiteSpec:
    """``lane_spec`` for the run that records the lane's executed lines (issue 44): the suite's ``evidence.stop_env``
    set too (``${LANE_LAST_STEP}`` = k - 1), so that it stops itself after the lane's steps when the launch has such
    a count. A launch whose config fixes its count is given another config on the node (``evidence_stop_config``)."""
    launched = lane_spec(spec)
    if spec.evidence is None or not spec.evidence.stop_env or spec.bitwise is None:
        return launched
    last = str(spec.bitwise.steps - 1)
    stop = {k: v.replace("${LANE_LAST_STEP}", last) for k, v in spec.evidence.stop_env.items()}
    return launched.model_copy(update={"launch": launched.launch.model_copy(
        update={"env": {**launched.launch.env, **stop}})})


def evidence_stop_config(spec: SuiteSpec) -> tuple[int, str, int] | None:
    """For the run that records the lane's executed lines of a launch whose config file fixes its step count (issue
    53, the spec's ``evidence.stop_config``): (which of the lane's launch arguments is the config, the attribute the
    config written on the node for that run sets, its value with ``${LANE_LAST_STEP}`` = k - 1); None without one.
    The lane's jobs and the lane's fingerprint are untouched: only that run is given the other config."""
    stop = spec.evidence.stop_config if spec.evidence else None
    if stop is None or spec.bitwise is None:
        return None
    return stop.arg, stop.attribute, stop.resolved(spec.bitwise.steps)


def lane_fingerprint(spec: SuiteSpec) -> str:
    """The lane config's fingerprint, part of a reference's key (``references.others`` finds keys by it)."""
    return bitwise.fingerprint(lane_config(spec))


def lane_spec(spec: SuiteSpec) -> SuiteSpec:
    """``spec`` launched in deterministic mode: the lane's env over the suite's, its args (when given) instead."""
    assert spec.bitwise is not None
    launch = spec.launch.model_copy(update={"env": {**spec.launch.env, **spec.bitwise.env},
                                            "args": tuple(spec.bitwise.args) or spec.launch.args})
    return spec.model_copy(update={"launch": launch})


def covers(spec: SuiteSpec) -> str:
    k = spec.bitwise.steps if spec.bitwise else 0
    return BITWISE_COVERS.format(k=k, last=k - 1, days=settings.FULL_EVERY_DAYS)


def decide(resolved: Mapping[str, Any], environments: Mapping[str, Mapping[str, Any]],
           now: float | None = None) -> dict[str, dict[str, Any]]:
    """Per trained suite with a lane in a ``lane = auto`` run: ``choice`` and ``why`` (``core.lane.choose``), the
    reference ``key``, the ``environment`` fingerprint, the kept ``reference`` (commit, run, report, state; None
    when absent), and ``make_reference`` (whether a full PASS of this run makes one: the lane's job when it ran and
    differed, the full training's otherwise)."""
    if resolved.get("lane", "auto") != "auto":  # full: no lane; skip: the path-aware skip only
        return {}
    out: dict[str, dict[str, Any]] = {}
    now_at = datetime.fromtimestamp(time.time() if now is None else now, timezone.utc)
    for suite in resolved.get("suites") or []:
        if suite in (resolved.get("unchanged") or {}):
            continue
        spec = load_suite(suite)
        conn = suite_node(resolved, suite)[0]
        environment = (environments.get(conn) or {}).get("fingerprint")
        if spec.bitwise is None or not environment:
            continue
        experiment = (resolved.get("suite_fingerprints") or {}).get(suite, "")
        config_facts = lane_config(spec)
        config = bitwise.fingerprint(config_facts)
        key = bitwise.reference_key(suite, experiment, environment, config_facts)
        kept = references.get(key)
        state = references.state(kept)
        facts = {k: v for k, v in (environments.get(conn) or {}).items() if k != "fingerprint"}
        changed = _environment_change(suite, experiment, config, key, facts) if state == "absent" else ""
        since: list[str] | None = None
        problem = ""
        reading: executed.Reading | None = None
        evidence_note = ""
        if state == "trusted":
            since, problem, reading, evidence_note = _changed_since(conn, spec, key, kept, resolved["sha"])
        stale = (resolved.get("stale") or {}).get(suite) or {}
        contradicted = (resolved.get("contradicted") or {}).get(suite, "")
        last_full = (resolved.get("last_full") or {}).get(suite)
        chosen = lane.judge(
            rules_of(spec),  # the experiment's own files (Rules.read) included, as rl-verify shortcut judges
            lane.Facts(requested=resolved.get("lane", "auto"), scheduled=bool(resolved.get("scheduled")),
                       changed_since_reference=since, reference_diff_problem=problem, evidence=reading,
                       stale=stale,  # resolve_commit checked the rules against the tree
                       reference=state,  # type: ignore[arg-type]
                       contradicted=contradicted, blind=references.blind_words(kept),
                       last_full_at=datetime.fromtimestamp(float(last_full), timezone.utc) if last_full else None,
                       now=now_at, environment_change=changed))
        meta = None if kept is None else {k: kept.get(k) for k in ("sha", "run_id", "report", "state", "made_at",
                                                                    "self_check")}
        out[suite] = {"choice": chosen.choice, "why": chosen.why, "key": key, "environment": environment,
                      "facts": facts, "experiment": experiment, "lane_config": config,
                      "steps": spec.bitwise.steps, "reference": meta,
                      # A full PASS makes a reference at its commit, unless the environment does not reproduce: so that
                      # a diff touching bypassed code turns the lane off for that commit only, not for every later one.
                      "make_reference": state != "not reproducible",
                      # The record doubts this commit: the lane job still reads its bits (never a verdict), so that a
                      # FAIL with the reference's bits marks the reference blind to it (``mark_blind``).
                      "read_lane": bool(contradicted) and state == "trusted" and chosen.choice == "full",
                      # what the executed-code evidence said, or why none was used (issue 44)
                      "evidence": evidence_note}
        log.info("%s: %s: %s", suite, "bitwise lane" if chosen.choice == "bitwise" else "full verification",
                 chosen.why)
    return out


def _environment_change(suite: str, experiment: str, config: str, key: str, facts: Mapping[str, Any]) -> str:
    """When the suite's newest reference for the same experiment and lane config was made on another environment:
    "since the reference of <sha> (driver 580.159.04 -> 580.200.01)"; else ""."""
    for other in references.others(suite, experiment, config, key):
        changes = bitwise.environment_changes(other["facts"], facts)
        if changes:
            return f"since the reference of {short_sha(other.get('sha') or '')} ({'; '.join(changes)})"
    return ""


def _changed_since(conn: str, spec: SuiteSpec, key: str, kept: Mapping[str, Any],
                   head: str) -> tuple[list[str] | None, str, executed.Reading | None, str]:
    """What changed since the reference's commit on the node's checkout: (the files, or None with why they are not
    known: a diff that cannot be read keeps the lane off), and with the reference's executed-code evidence (issues
    44, 53) what it says of the diff (``core.evidence.read_diff``; None: no usable evidence), with one sentence saying
    what the evidence said or why it was not used."""
    base = kept["sha"]
    if base == head:
        return [], "", (executed.Reading() if spec.evidence else None), ""
    recorded = references.get_evidence(key, dict(kept)) if spec.evidence else None
    try:
        with ssh_client(conn) as client:
            checkout = node_settings(conn)[settings.NODE_CHECKOUT_KEY]
            if recorded is None:
                changed = node.changed_files(client, checkout, base, head)
                changes = None
            else:
                read = node.changed_lines(client, checkout, base, head)
                changes = None if read is None else executed.read_changes(read)
                changed = None if changes is None else list(changes)
    except (node.NodeError, ValueError) as err:
        return None, f"(the diff since {short_sha(base)} could not be read: {err})", None, ""
    if changed is None:
        return None, f"(the reference's commit {short_sha(base)} is not in the node's checkout)", None, ""
    if spec.evidence is None:
        return changed, "", None, ""
    if recorded is None or changes is None:
        return changed, "", None, "no executed-code evidence kept with the reference: the path rules decide"
    found = executed.Evidence.from_dict(recorded)
    if found.problems:
        return changed, "", None, ("the reference's executed-code evidence is incomplete (" + "; ".join(found.problems)
                                   + "): the path rules decide")
    reading = executed.read_diff(found, changes)
    said = (f"executed-code evidence of {short_sha(base)}: " + (
        f"{len(reading.lane_unseen)} touched line(s) in blocks the lane's steps never ran" if reading.lane_unseen
        else f"every touched block the full run ran, the lane's steps ran too ({len(changes)} file(s) changed)")
        + (f"; {len(reading.unknown)} .py file(s) it cannot judge ({', '.join(reading.unknown[:3])}): the path "
           "rules decide for them" if reading.unknown else ""))
    return changed, "", reading, said


def card_notes(prereq: Mapping[str, Any]) -> list[str]:
    """The card's lines about each suite's lane: which verification applies and why."""
    lines = []
    for suite, entry in (prereq.get("lanes") or {}).items():
        if entry["choice"] == "bitwise":
            ref = entry["reference"] or {}
            lines.append(f"{suite}: bitwise lane first: {entry['steps']} deterministic steps compared with the "
                         f"reference of {short_sha(ref.get('sha') or '')}; the same bits end it {BITWISE}, a "
                         f"difference goes on to the full verification under this approval ({entry['why']}).")
        else:
            lines.append(f"{suite}: full verification ({entry['why']})."
                         + (f" The lane job still reads its first {entry['steps']} deterministic steps for the record "
                            "(never a verdict): a FAIL with the reference's bits marks that reference blind to it."
                            if entry.get("read_lane") else "")
                         + (" A bitwise reference is made after its PASS (2 deterministic runs of "
                            f"{entry['steps']} steps)." if entry["make_reference"] else ""))
    return lines


def evidence(entry: Mapping[str, Any], reading: Mapping[str, Any], seconds: float | None) -> dict[str, Any]:
    """What the lane read, for the record (``lane.json``), the report and ``report.json``."""
    return {"key": entry["key"], "environment": entry["environment"], "reference": entry["reference"],
            "steps": reading.get("steps"), "steps_seen": reading.get("steps_seen"),
            "identical": bool(reading.get("identical")), "difference": reading.get("difference"),
            "compared": [{"step": r.get(bitwise.STEP_FIELD), "metrics": len(r) - 1} for r in reading.get("rows") or []],
            "seconds": None if seconds is None else round(seconds, 1), "why": entry["why"]}


def pass_bitwise(dag_run_id: str, dag_id: str | None, suite: str, found: Mapping[str, Any]) -> None:
    """The suite's result and outcome PASS (bitwise) in the run's record, as a compared and confirmed suite has
    them: fetch, compare and the confirmation see it and skip; the report and the history read it."""
    spec = load_suite(suite)
    record.put_json(dag_run_id, f"{suite}/result.json", SuiteResult.bitwise(suite, dict(found)).to_dict(),
                    dag_id=dag_id)
    ref = found.get("reference") or {}
    record.put_json(dag_run_id, f"{suite}/outcome.json", {
        "suite": suite, "outcome": BITWISE, "runs": [], "bitwise": {**found, "covers": covers(spec)},
        "reason": f"its first {found.get('steps')} deterministic steps are the same bits as the reference of the "
                  f"verified commit {short_sha(ref.get('sha') or '')} on this environment "
                  f"({found.get('environment')})"},
        dag_id=dag_id)


def decided(dag_run_id: str, suite: str, dag_id: str | None = None) -> dict[str, Any] | None:
    """The suite's outcome when the lane already decided it (PASS (bitwise)), else None."""
    outcome = record.get_json(dag_run_id, f"{suite}/outcome.json", dag_id=dag_id)
    return outcome if (outcome or {}).get("outcome") == BITWISE else None


def evidence_of(dag_run_id: str, spec: SuiteSpec, dag_id: str | None = None) -> dict[str, Any] | None:
    """The executed-code evidence this run recorded for ``spec``'s reference (issue 44: its full run's and its lane's
    k steps' readings, ``<suite>/evidence-full.json`` and ``-lane.json``) as ``core.evidence.Evidence``'s dict,
    its ``problems`` naming why it is no evidence (a kind of process of ``spec.evidence.processes`` no process
    proved, a reading that failed, a lane's evidence run that wrote no step or one past k - 1: it must end by itself
    after the lane's steps, ``evidence.stop_env`` or ``evidence.stop_config``); None when the suite declares no
    evidence."""
    if spec.evidence is None:
        return None
    full = record.get_json(dag_run_id, f"{spec.name}/evidence-full.json", dag_id=dag_id) or {}
    lane_read = record.get_json(dag_run_id, f"{spec.name}/evidence-lane.json", dag_id=dag_id) or {}
    problems = [f"full run: {p}" for p in full.get("problems") or []]
    problems += [f"lane's steps: {p}" for p in lane_read.get("problems") or []]
    problems += executed.completeness({"full run": full, "lane's steps": lane_read},
                                      [(p.kind, p.runs) for p in spec.evidence.processes])
    last, k = lane_read.get("last_step"), spec.bitwise.steps if spec.bitwise else 0
    stops = [f"evidence.{name}" for name, on in (("stop_env", spec.evidence.stop_env),
                                                   ("stop_config", spec.evidence.stop_config)) if on]
    if last is None:
        problems.append(f"the lane's evidence run wrote no training step (none read): it recorded less than the "
                        f"lane's steps 0..{k - 1}")
    elif last > k - 1:
        problems.append(f"the lane's evidence run wrote step {last} before it ended, past the lane's steps "
                        f"0..{k - 1}: its lines are more than the compared steps' (" + (
                            f"the launch did not end after them as the spec's {' and '.join(stops)} asks"
                            if stops else "the suite's spec does not stop it after them: evidence.stop_env for a "
                            "launch that reads its step count from the environment, evidence.stop_config for one "
                            "whose config file fixes it") + ")")
    return executed.Evidence(full.get("files") or {}, lane_read.get("files") or {}, full.get("hashes") or {},
                             tuple(full.get("compiled") or ()), tuple(dict.fromkeys(problems)),
                             executed.merged_blocks(full.get("blocks") or {}, lane_read.get("blocks") or {}),
                             tuple(full.get("unparsed") or ())).to_dict()


def candidate(first: Mapping[str, Any], second: Mapping[str, Any], entry: Mapping[str, Any],
              recorded: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A reference made by this run from its two self-check runs' readings (the second compared with the
    first): trusted with the first's rows when they agree bit for bit, else not reproducible with where they
    parted; with ``recorded``, the executed-code evidence kept beside it (``evidence_of``)."""
    same = bool(second.get("identical"))
    return {"key": entry["key"], "environment": entry["environment"], "steps": first.get("steps"),
            **({"evidence": dict(recorded)} if recorded is not None else {}),
            # What finds this reference's successor on a changed environment (``references.others``).
            "facts": entry.get("facts") or {}, "experiment": entry.get("experiment"),
            "lane": entry.get("lane_config"),
            "state": references.TRUSTED if same else references.NOT_REPRODUCIBLE,
            "rows": list(first.get("rows") or []) if same else [],
            "self_check": "2 deterministic runs agreed bit for bit" if same else
            "not reproducible on this environment: " + ((second.get("difference") or {}).get("line")
                                                       or "the second run did not reach its steps")}


def report_notes(run_dir: Any, suites: list[str]) -> list[str]:
    """The report's lines about the lane, per suite: why it was not used, or where a lane that ran parted from
    the reference (the suite was then verified in full). A PASS (bitwise) says its own on the suite's section."""
    lanes = record.read_json(run_dir / LANES_FILE) or {}
    lines = []
    for suite in suites:
        entry, read = lanes.get(suite), record.read_json(run_dir / suite / LANE_FILE)
        if entry and entry.get("evidence"):  # what the executed-code evidence said, or why it was not used
            lines.append(f"{suite}: {entry['evidence']}.")
        if read and not read.get("identical"):
            where = (read.get("difference") or {}).get("line") or f"{read.get('steps_seen')} of {read.get('steps')} " \
                "steps read before the lane job ended"
            lines.append(f"{suite}: bitwise lane: not the same bits as the reference of "
                         f"{short_sha((read.get('reference') or {}).get('sha'))}: {where}; verified in full instead "
                         "(a difference is never a FAIL).")
        elif entry and entry["choice"] == "full":
            lines.append(f"{suite}: bitwise lane not applicable: {entry['why']}."
                         + (f" Its lane job read the same bits as the reference of "
                            f"{short_sha((read.get('reference') or {}).get('sha'))} (for the record only)."
                            if read and read.get("identical") else ""))
    return lines


def mark_blind(dag_run_id: str, suites: Mapping[str, Mapping[str, Any]], sha: str, report: str | None) -> list[str]:
    """Mark blind every reference whose bits a suite of this run had while its outcome doubts the commit (issue
    42): the lane reading of this run (read for the record when the record already doubted the commit) and the
    record's identical readings of the same commit (an earlier PASS (bitwise) of it). Returns one line per
    reference marked."""
    lines = []
    for suite, outcome in suites.items():
        runs = outcome.get("runs") or [{}]
        if outcome.get("outcome") not in verification_history.DOUBTING or \
                is_infrastructure(runs[0].get("failure_class")):
            continue
        readings = verification_history.identical_readings(suite, sha)
        mine = record.get_json(dag_run_id, f"{suite}/{LANE_FILE}")
        if mine and mine.get("identical"):
            readings.insert(0, mine)
        failed = {"sha": sha, "outcome": outcome["outcome"], "run_id": dag_run_id, "report": report}
        for reading in readings:
            ref = reading.get("reference") or {}
            if reading.get("key") and references.mark_blind(reading["key"], ref.get("made_at"),
                                                            {**failed, "steps": reading.get("steps")}):
                lines.append(f"{suite}: the bitwise reference of {short_sha(ref.get('sha') or '')} is blind to this "
                             f"regression ({short_sha(sha)} has its first {reading.get('steps')} steps' bits and "
                             f"ended {outcome['outcome']}): the lane is off for it until a full PASS makes a new one.")
                log.warning("%s", lines[-1])
    return lines


def promote(dag_run_id: str, suites: Mapping[str, Mapping[str, Any]], sha: str, report: str | None) -> list[str]:
    """Keep the candidates of the suites whose outcome is a PASS (plain or not reproduced) as the references of
    their keys; return one line per reference kept."""
    lines = []
    for suite, outcome in suites.items():
        found = record.get_json(dag_run_id, f"{suite}/{CANDIDATE_FILE}")
        if not found or outcome.get("outcome") not in ("PASS", "PASS (not reproduced)"):
            continue
        made_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
        recorded = found.pop("evidence", None)
        kept = {**found, "suite": suite, "sha": sha, "run_id": dag_run_id, "report": report, "made_at": made_at,
                "evidence": None if recorded is None else
                ("complete" if not recorded.get("problems") else "incomplete: " + "; ".join(recorded["problems"]))}
        references.put(found["key"], kept)
        if recorded is not None:  # beside the reference: large, read only when a diff is judged
            references.put_evidence(found["key"], {**recorded, "sha": sha, "made_at": made_at})
        lines.append(f"{suite}: bitwise reference {found['state']} at {short_sha(sha)} ({found['self_check']})"
                     + ("" if found["state"] == references.TRUSTED else
                        f"; the bitwise lane is off on this environment: every later run verifies in full (to try "
                        f"again, remove {references.FOLDER}/{found['key']}.json from the record store)"))
        log.info("%s", lines[-1])
    return lines
