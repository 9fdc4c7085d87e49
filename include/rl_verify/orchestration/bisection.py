"""The task bodies of the bisection DAG (``dags/rl_regression_bisect.py``) and what the verification DAG
needs of a bisection (its probes' pre-approval, the asset events that start one).

A bisection names the commit of ``good..bad`` (first-parent history) that caused a reproduced FAIL. Its
probes are normal verification runs (``rl_accuracy_verification``), triggered through the REST API with
the param ``bisection`` = this run's id: their card is pre-approved by this bisection's one approval,
checked against Airflow's record of it (``preapproval_refusals``). What to probe next is the pure
planner's answer (``core.bisect.plan``), asked again whenever a probe ends.
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any, Iterable, Mapping

from airflow.sdk.exceptions import AirflowFailException

from rl_verify import engines, settings
from rl_verify.core import bisect, bisect_report
from rl_verify.core.names import run_key, short_sha
from rl_verify.node import ops as node
from rl_verify.node import remote
from rl_verify.orchestration import airflow_api, links, notify
from rl_verify.orchestration.nodes import no_retry_on, node_problems, node_settings, ssh_client
from rl_verify.orchestration.standing import card_fingerprint
from rl_verify.store import record
from rl_verify.suites.spec import data_file

log = logging.getLogger(__name__)

#: The bisection's plan (range, suites, nodes, worst case), in its record: probes check their commit in it.
PLAN_FILE = "plan.json"
#: The bisection's result (answer, evidence rows), in its record; a copy of its link in the nightly's.
RESULT_FILE = "bisection.json"
DECIDED = ("PASS", "PASS (not reproduced)", "FAIL (reproduced)")
_METRIC = re.compile(r"^[A-Za-z0-9_./-]{1,120}$")


class BisectParamError(ValueError):
    """A bisection param refused before anything is launched: the message names the param and the fix."""


# --- params -------------------------------------------------------------------------------------

def _nodes(value: Any) -> list[str]:
    items = [v.strip() for v in (value or "").split(",")] if isinstance(value, str) else list(value or [])
    nodes = [v for v in items if v]
    bad = [n for n in nodes if not re.fullmatch(r"[A-Za-z0-9_.-]{1,200}", str(n))]
    if not nodes or bad:
        raise BisectParamError(f"param 'nodes': {', '.join(map(repr, bad)) or 'no node'}. Fix: give one or more SSH "
                               f"connection ids separated by commas, e.g. {settings.DEFAULT_NODE_CONN_ID},node_b")
    if len(set(nodes)) != len(nodes):
        raise BisectParamError("param 'nodes' names a node twice. Fix: list each node once")
    return nodes


def validated_params(params: Mapping[str, Any], event: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """good, bad, suites, metrics, nodes, max_commits and repeats, validated before anything reaches a shell;
    ``event``: the extra of the reproduced-FAIL asset event that started the run (its good, bad, suites
    and metrics win over the params' defaults). Every problem is collected, then raised once."""
    source = dict(params)
    if event:
        source.update({k: event[k] for k in ("good", "bad", "suites", "metrics") if event.get(k)})
    problems: list[str] = []
    out: dict[str, Any] = {"source": dict(event or {})}
    for end in ("good", "bad"):
        try:
            out[end] = remote.validate_commit(source.get(end), end)
        except remote.BadInput as err:
            problems.append(f"{err}. Fix: give a branch, tag or SHA of the node's checkout")
    try:
        out["suites"] = remote.validate_suites(source.get("suites"), engines.known_suites())
    except remote.BadInput as err:
        problems.append(f"param 'suites': {err}. Fix: choose among {', '.join(engines.known_suites())}")
    metrics = source.get("metrics") or []
    if isinstance(metrics, str):
        metrics = [m.strip() for m in metrics.split(",") if m.strip()]
    bad_metrics = [m for m in metrics if not isinstance(m, str) or not _METRIC.match(m)]
    if bad_metrics:
        problems.append(f"param 'metrics': {bad_metrics!r} are not metric names. Fix: give tracker metric names, e.g. "
                        "eval/gsm8k/acc, or leave it empty to follow each suite's first breached metric")
    out["metrics"] = [m for m in metrics if m not in bad_metrics]
    try:
        out["nodes"] = _nodes(source.get("nodes"))
    except BisectParamError as err:
        problems.append(str(err))
    limit = source.get("max_commits", settings.BISECT_MAX_COMMITS)
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= settings.BISECT_MAX_COMMITS:
        problems.append(f"param 'max_commits': {limit!r}. Fix: a whole number from 1 to {settings.BISECT_MAX_COMMITS}")
    out["max_commits"] = limit
    repeats = source.get("repeats", settings.SCHEDULED_REPEATS)
    if isinstance(repeats, bool) or not isinstance(repeats, int) or not 0 <= repeats <= settings.MAX_REPEATS:
        problems.append(f"param 'repeats': {repeats!r}. Fix: 0 to {settings.MAX_REPEATS} extra runs per probe")
    out["repeats"] = repeats
    if not problems and out["good"] == out["bad"]:
        problems.append(f"params 'good' and 'bad' are the same commit ({out['good']}). Fix: give the failing commit "
                        "as bad and an older, passing commit (the last verified PASS) as good")
    if problems:
        raise BisectParamError(f"{len(problems)} problem(s) with the bisection's params; nothing was launched:\n"
                               + "\n".join(f"  - {p}" for p in problems))
    return out


def _unknown_metrics(metrics: list[str], suites: list[str]) -> list[str]:
    """The metrics no one of ``suites`` judges (by its shipped thresholds data)."""
    known: set[str] = set()
    for suite in suites:
        spec = engines.load_suite(suite)
        engine = engines.engine_of(spec)
        known |= set(engine.judged_metrics(engine.load_data(data_file(spec.data))))
    return [m for m in metrics if m not in known]


# --- plan ---------------------------------------------------------------------------------------

def plan_range(params: Mapping[str, Any], dag_run_id: str, event: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Validate the params, list the range on the first node (good an ancestor of bad, at most
    ``max_commits`` commits), find ends the record already decided, and keep the plan in the record."""
    with no_retry_on(BisectParamError, ValueError):
        p = validated_params(params, event)
        unknown = _unknown_metrics(p["metrics"], p["suites"])
        if unknown:
            raise BisectParamError(f"param 'metrics': {', '.join(unknown)} is not a metric of "
                                   f"{', '.join(p['suites'])}. Fix: give metric names from the suites' reports, "
                                   "or leave it empty")
        problems = [line for conn in p["nodes"] for line in node_problems(conn)]
        if problems:
            raise BisectParamError(f"param 'nodes': {len(problems)} problem(s); nothing was launched:\n"
                                   + "\n".join(f"  - {line}" for line in problems))
        conn = p["nodes"][0]
        with ssh_client(conn) as client:
            try:
                count, commits = node.commit_range(client, node_settings(conn)[settings.NODE_CHECKOUT_KEY], p["good"],
                                                   p["bad"], p["max_commits"])
            except node.RangeError as err:
                raise BisectParamError(f"param {err.param!r}: {err}. Fix: {err.fix}; nothing was launched") from err
        if count == 0:
            raise BisectParamError(f"params 'good' and 'bad': {p['good']} and {p['bad']} are the same commit. Fix: "
                                   "give the failing commit as bad and an older, passing commit as good")
        if count > p["max_commits"]:
            raise BisectParamError(
                f"param 'good': {count} commits lie between {p['good']} and {p['bad']}, more than the maximum of "
                f"{p['max_commits']} (param 'max_commits'). Fix: give as good a later verified PASS, or raise "
                f"max_commits (at most {settings.BISECT_MAX_COMMITS})")
        shas = [c["sha"] for c in commits]
        bisect.check_range(shas, p["max_commits"])
    fingerprint = p["source"].get("fingerprint") or _fingerprint_of(shas[-1], p["suites"])
    recorded = recorded_readings(shas, p["suites"], fingerprint, p["source"].get("baselines"))
    free = len(p["nodes"])
    scale = run_scale(p["suites"])
    worst = promised_worst(len(shas) - 1, free, shas[0] in recorded, shas[-1] in recorded, 1 + p["repeats"], scale)
    plan = {**p, "commits": commits, "fingerprint": fingerprint, "recorded": {c: r.value for c, r in recorded.items()},
            "scale": scale, "worst": worst, "dag_run_id": dag_run_id}
    record.put_json(dag_run_id, PLAN_FILE, plan, dag_id=settings.BISECT_DAG_ID)
    log.info("Range %s..%s: %d commit(s) after good on %s; worst case %d probe(s) in %d round(s) on %d node(s); "
             "ends taken from the record: %s", short_sha(shas[0]), short_sha(shas[-1]), len(shas) - 1, conn,
             worst["probes"], worst["rounds"], free,
             ", ".join(f"{short_sha(c)} {r.value}" for c, r in recorded.items()) or "none")
    return plan


def promised_worst(n_commits: int, free: int, good_known: bool, bad_known: bool, runs_per_probe: int,
                   scale: Mapping[str, Mapping[str, float]]) -> dict[str, Any]:
    """The most a bisection of ``n_commits`` commits after good on ``free`` nodes can spend, as its card promises
    it: the planner's own worst case (``core.bisect.worst_case``) with one commit that cannot be checked out or
    launched anywhere in the range (the planner probes around it, at a cost), and without; its training runs,
    GPU-hours and wall hours at the runbook's ``scale`` (``run_scale``). Conflicting or INCONCLUSIVE readings and
    a second unlaunchable commit can add probes: the card says so."""
    worst = bisect.worst_case(n_commits, free, good_known=good_known, bad_known=bad_known, skips=1)
    clean = bisect.worst_case(n_commits, free, good_known=good_known, bad_known=bad_known)
    minutes = sum(s["minutes"] for s in scale.values())
    gpu_minutes = sum(s["minutes"] * s["gpus"] for s in scale.values())
    return {"probes": worst.probes, "rounds": worst.rounds, "runs": worst.probes * runs_per_probe,
            "probes_no_skip": clean.probes, "skips": 1,
            "gpu_hours": round(worst.probes * runs_per_probe * gpu_minutes / 60, 1),
            "wall_hours": round(worst.rounds * runs_per_probe * minutes / 60, 1)}


def _verification_reports() -> Iterable[tuple[str, dict[str, Any], Any]]:
    """(run folder name, report.json, folder) of every verification run in the record store."""
    root = record.dag_store(settings.DAG_ID)
    if not root.exists():
        return
    for folder in root.iterdir():
        path = folder / "report.json"
        try:
            yield folder.name, json.loads(path.read_bytes()), folder
        except (OSError, ValueError):
            continue


def _fingerprint_of(sha: str, suites: list[str]) -> str | None:
    """The experiment fingerprint of the newest recorded verification of ``sha`` with these suites (newest by
    when its report was written, as in ``last_pass``: probes' run ids carry no time)."""
    newest_first = sorted(_verification_reports(), key=lambda r: _written_at(r[2] / "report.json"), reverse=True)
    for _, report, folder in newest_first:
        if report.get("commit") == sha and sorted(s.get("suite") for s in report.get("suites") or []) == sorted(suites):
            return _card_fingerprint(folder)
    return None


def _card_fingerprint(folder: Any) -> str | None:
    card = folder / "card.md"
    try:
        return card_fingerprint(card.read_text()) if card.exists() else None
    except OSError:
        return None


def recorded_readings(shas: list[str], suites: list[str], fingerprint: str | None,
                      baselines: Mapping[str, str] | None = None) -> dict[str, bisect.Reading]:
    """The ends of ``shas`` that the record already decided: a verification of that exact commit with the same
    experiment fingerprint (suites, specs, thresholds, golden data, baseline versions, repeats) whose every
    suite ended PASS, PASS (not reproduced) or FAIL (reproduced). None without a fingerprint to match."""
    if not fingerprint:
        return {}
    ends = {shas[0], shas[-1]}
    found: dict[str, bisect.Reading] = {}
    for _, report, folder in _verification_reports():
        sha = report.get("commit")
        if sha not in ends or sha in found:
            continue
        rows = report.get("suites") or []
        if sorted(r.get("suite") for r in rows) != sorted(suites) or _card_fingerprint(folder) != fingerprint:
            continue
        if baselines and any((report.get("baselines") or {}).get(s) != v for s, v in baselines.items()):
            continue
        outcomes = [suite_outcome(r) for r in rows]
        if all(o in DECIDED for o in outcomes):
            found[sha] = bisect.Reading.BAD if "FAIL (reproduced)" in outcomes else bisect.Reading.GOOD
    return found


def run_scale(suites: Iterable[str]) -> dict[str, dict[str, float]]:
    """Per suite, one run at the runbook's scale: its minutes and GPUs, from the suite spec (``runbook_minutes``,
    ``node.gpus``; without them the wall-time budget, an upper bound, and ``settings.GPUS_PER_RUN``)."""
    out = {}
    for suite in suites:
        spec = engines.load_suite(suite)
        out[suite] = {"minutes": spec.run_minutes, "gpus": spec.node.gpus or settings.GPUS_PER_RUN}
    return out


def suite_outcome(row: Mapping[str, Any]) -> str:
    """A report.json suite row's outcome over its runs (its one run's verdict when it was not repeated)."""
    return str((row.get("outcome") or {}).get("outcome") or row.get("verdict") or "FAIL")


# --- the card -----------------------------------------------------------------------------------

def card(plan: Mapping[str, Any]) -> dict[str, Any]:
    """The bisection's card (Markdown): the range with each commit's SHA and subject, the probes at most,
    the nodes and the GPU-hours at the runbook's scale."""
    commits, worst = plan["commits"], plan["worst"]
    scale = plan.get("scale") or run_scale(plan["suites"])
    minutes = " + ".join(f"{s} {scale[s]['minutes']:g} min" for s in plan["suites"])
    gpus = sorted({int(scale[s]["gpus"]) for s in plan["suites"]})
    lines = [f"# Bisection of {plan['bad']} against {plan['good']}", "",
             f"Suites: {', '.join(plan['suites'])}; followed metric(s): "
             f"{', '.join(plan['metrics']) or 'each suite’s first breach'}.",
             "", "| # | commit | subject | author | date |", "|---|---|---|---|---|"]
    for i, c in enumerate(commits):
        tag = " (good end)" if i == 0 else " (bad end)" if i == len(commits) - 1 else ""
        lines.append(f"| {i} | `{short_sha(c['sha'])}`{tag} | {_cell(c['subject'])} | {_cell(c['author'])} "
                     f"| {c['date'][:10]} |")
    recorded = plan.get("recorded") or {}
    no_skip = worst.get("probes_no_skip", worst["probes"])
    skip_note = (f"; {no_skip} if every commit launches, {worst['probes']} with one commit that cannot be checked "
                 "out or launched, each further such commit can add probes" if worst.get("skips") else "")
    lines += ["", f"**Probes at most: {worst['probes']}** (verifications{skip_note}; {worst['rounds']} round(s) on "
              f"{len(plan['nodes'])} node(s): {', '.join(plan['nodes'])}), each up to {1 + plan['repeats']} run(s) "
              f"(the confirmation's repeats): at most **{worst['runs']} training runs, "
              f"{worst['gpu_hours']} GPU-hours** "
              f"at the runbook's scale ({minutes} per run, {' or '.join(map(str, gpus))} GPUs), about "
              f"{worst['wall_hours']} h of wall time. Early abort usually ends a FAILing probe sooner.",
              "", "Ends: " + "; ".join(
                  f"{'good' if i == 0 else 'bad'} {short_sha(commits[i]['sha'])}: "
                  + (f"taken from the record ({recorded[commits[i]['sha']]})" if commits[i]["sha"] in recorded
                     else "re-checked") for i in (0, len(commits) - 1)),
              "", "Approving starts every probe of this bisection without asking again: each probe's card is "
              "pre-approved by this approval (checked against Airflow's record of it). A standing approval of the "
              "nightly does not cover a bisection.", "",
              f"Bisection fingerprint: `{plan.get('fingerprint') or 'none'}` (the experiment's)"]
    return {"markdown": "\n".join(lines), "fingerprint": plan.get("fingerprint") or ""}


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")[:100]


# --- probes ----------------------------------------------------------------------------------------

def probe_run_id(dag_run_id: str, sha: str, attempt: int) -> str:
    """The id of a probe run: the bisection's key, the commit and the how-manieth probe of it."""
    return f"{settings.PROBE_RUN_PREFIX}{run_key(dag_run_id)[:60]}__{short_sha(sha)}__{attempt}"


def probe_conf(plan: Mapping[str, Any], sha: str, conn: str) -> dict[str, Any]:
    """The verification params of one probe: the commit, the bisection's suites on one node, early abort on."""
    return {"commit": sha, "suites": list(plan["suites"]), "node": conn, "early_abort": True,
            "repeats": plan["repeats"], "bisection": plan["dag_run_id"]}


def trigger_probe(plan: Mapping[str, Any], sha: str, conn: str, attempt: int, why: str) -> str:
    run_id = probe_run_id(plan["dag_run_id"], sha, attempt)
    airflow_api.trigger_run(settings.AIRFLOW_API_CONN_ID, settings.PROBE_DAG_ID, run_id, probe_conf(plan, sha, conn),
                            note=f"probe of bisection {plan['dag_run_id']}: {why}")
    return run_id


def probe_reading(run_id: str, plan: Mapping[str, Any]) -> tuple[bisect.Reading, dict[str, Any]]:
    """A finished probe's reading and its evidence row (outcome, runs, the followed metric's error at its first
    breach, the report link). No report: the commit could not be checked out or launched (SKIP)."""
    report = record.get_json(run_id, "report.json") or {}
    rows = [r for r in report.get("suites") or [] if r.get("suite") in plan["suites"]]
    row: dict[str, Any] = {"run_id": run_id, "report": links.report_path(settings.PROBE_DAG_ID, run_id),
                           "outcome": "SKIP", "runs": 0, "metric": None, "error": None, "threshold": None,
                           "step": None, "why": ""}
    if not rows:
        row["why"] = "no report: the commit could not be checked out or its run ended before comparing"
        return bisect.Reading.SKIP, row
    if report.get("verdict") in ("REJECTED", "NOT APPROVED"):
        raise AirflowFailException(f"probe {run_id} was {report['verdict']}: its pre-approval by this bisection was "
                                   "refused (see the probe's approve log)")
    readings = []
    for r in rows:
        outcome = suite_outcome(r)
        readings.append(bisect.reading(outcome, r.get("failure_class") if outcome == "FAIL" else None))
    reading = (bisect.Reading.BAD if bisect.Reading.BAD in readings else
               bisect.Reading.SKIP if bisect.Reading.SKIP in readings else
               bisect.Reading.UNSURE if bisect.Reading.UNSURE in readings else bisect.Reading.GOOD)
    first = rows[0]
    row.update(outcome="; ".join(f"{r['suite']} {suite_outcome(r)}" for r in rows),
               runs=sum(len((r.get("outcome") or {}).get("runs") or [0]) for r in rows),
               why=(first.get("outcome") or {}).get("reason") or first.get("verdict") or "")
    row.update(followed_error(rows, plan.get("metrics") or []))
    row["aborted_at"] = aborted_at(rows)
    return reading, row


def aborted_at(rows: list[Mapping[str, Any]]) -> dict[str, str]:
    """Per suite of a probe's report whose first run the live check stopped early: "step N of M"."""
    out = {}
    for r in rows:
        abort = (r.get("details") or {}).get("early_abort") or {}
        if abort.get("applied") and abort.get("step") is not None:
            out[str(r["suite"])] = f"step {abort['step']} of {abort.get('expected_steps', '?')}"
    return out


def followed_error(rows: list[Mapping[str, Any]], metrics: list[str]) -> dict[str, Any]:
    """The followed metric (the first of ``metrics`` a suite checks, else the suite's first breached one) and its
    error at its first breach (else its largest error as a fraction of its threshold)."""
    checks = [c for r in rows for c in r.get("checks") or [] if isinstance(c.get("error"), (int, float))]
    wanted = [m for m in metrics if any(c["metric"] == m for c in checks)]
    breached = [c["metric"] for c in checks if c.get("passed") is False]
    metric = (wanted or breached or [c["metric"] for c in checks] or [None])[0]
    mine = [c for c in checks if c["metric"] == metric]
    if not mine:
        return {"metric": None, "error": None, "threshold": None, "step": None, "fraction": None}
    failing = [c for c in mine if c.get("passed") is False]
    pick = failing[0] if failing else max(mine, key=lambda c: abs(c["error"]) / (c.get("threshold") or 1))
    threshold = pick.get("threshold")
    return {"metric": metric, "error": pick["error"], "threshold": threshold, "step": pick.get("step"),
            "fraction": abs(pick["error"]) / threshold if threshold else None}


def stop_probe(run_id: str, bisection_run_id: str, why: str) -> list[str]:
    """Stop a probe whose outcome can no longer change the answer: its repeats are cancelled (a marker its
    repeat gates read) and its unfinished trainings marked failed, so that its cleanup stops its jobs."""
    record.put_json(run_id, settings.STOPPED_BY_BISECTION_FILE, {"bisection": bisection_run_id, "why": why})
    stopped = []
    states = airflow_api.task_states(settings.AIRFLOW_API_CONN_ID, settings.PROBE_DAG_ID, run_id)
    for task_id, state in states.items():
        if settings.suite_of_training_task(task_id) and state in ("none", "scheduled", "queued", "running",
                                                                  "deferred", "up_for_retry", "restarting"):
            try:
                airflow_api.fail_task(settings.AIRFLOW_API_CONN_ID, settings.PROBE_DAG_ID, run_id, task_id,
                                      f"stopped by bisection {bisection_run_id}: {why}")
            except Exception as err:  # stopping early only saves GPU time: the probe's answer is already known
                log.warning("Could not stop %s of probe %s (%s: %s): it trains to its end; its repeats are "
                            "cancelled", task_id, run_id, type(err).__name__, str(err).splitlines()[0][:200])
                continue
            stopped.append(task_id)
    return stopped


def stopped_probe_evidence(run_id: str) -> dict[str, Any]:
    """What a probe stopped by its bisection has produced so far: its report link and training runs when it
    reached its report, else none (the row then says "stopped: no report"); always its run page."""
    report = record.get_json(run_id, "report.json") or {}
    rows = report.get("suites") or []
    return {"report": links.report_path(settings.PROBE_DAG_ID, run_id) if rows else None,
            "runs": sum(len((r.get("outcome") or {}).get("runs") or [0]) for r in rows),
            "run_page": links.run_page_path(settings.PROBE_DAG_ID, run_id)}


def stopped_by_bisection(dag_run_id: str) -> dict[str, Any] | None:
    """The stop marker of a probe its bisection stopped, else None (the repeat gate asks)."""
    return record.get_json(dag_run_id, settings.STOPPED_BY_BISECTION_FILE)


# --- the probes' pre-approval (checked by the verification DAG's approve task) -----------------------

def preapproval_refusals(bisection_run_id: str, sha: str, suites: list[str]) -> tuple[list[str], Any]:
    """Every reason a probe of ``sha`` may not proceed on the approval of ``bisection_run_id``; empty = proceed.
    Also returns Airflow's record of that approval (who, when)."""
    reasons: list[str] = []
    plan = record.get_json(bisection_run_id, PLAN_FILE, dag_id=settings.BISECT_DAG_ID)
    if not plan:
        return [f"bisection {bisection_run_id!r} has no plan in the record store"], None
    if sha not in [c["sha"] for c in plan.get("commits") or []]:
        reasons.append(f"commit {short_sha(sha)} is not in the approved range {short_sha(plan['commits'][0]['sha'])}.."
                       f"{short_sha(plan['commits'][-1]['sha'])}")
    if not set(suites) <= set(plan.get("suites") or []):
        reasons.append(f"suites {', '.join(suites)} are not the approved {', '.join(plan.get('suites') or [])}")
    try:
        approval = airflow_api.approval_record(settings.AIRFLOW_API_CONN_ID, settings.BISECT_DAG_ID,
                                               bisection_run_id, settings.BISECT_APPROVE_TASK)
    except airflow_api.ApiUnavailable as err:
        return reasons + [f"the bisection's approval cannot be verified ({err})"], None
    if approval is None or not approval.responded_by:
        reasons.append("nobody approved the bisection's card")
    elif "Approve" not in approval.chosen_options:
        reasons.append(f"the bisection's card was not approved ({', '.join(approval.chosen_options) or 'no option'})")
    else:
        allowed = [a["name"] for a in settings.approvers()]
        if allowed and approval.responded_by not in allowed:
            reasons.append(f"{approval.responded_by} is not one of the approvers ({', '.join(allowed)})")
    return reasons, approval


# --- the result -------------------------------------------------------------------------------------

def answer_summary(plan: Mapping[str, Any], answer: bisect.Answer) -> dict[str, Any]:
    """The answer with the culprit's SHA, subject, author and date (or its range)."""
    by_sha = {c["sha"]: c for c in plan["commits"]}
    out: dict[str, Any] = {"kind": answer.kind, "reason": answer.reason, "culprit": None, "range": [], "skipped": []}
    if answer.culprit is not None:
        out["range"] = [by_sha[s] for s in answer.culprit.commits]
        out["skipped"] = [by_sha[s] for s in answer.culprit.skipped]
        out["culprit"] = by_sha[answer.culprit.commits[-1]] if answer.culprit.exact else None
        out["last_good"] = by_sha[answer.culprit.last_good]
    return out


def finish(plan: Mapping[str, Any], rows: list[dict[str, Any]], answer: dict[str, Any], wall_s: float,
           dag_run_id: str) -> dict[str, Any]:
    """Keep the result in the record (bisection.json, report.md/.html with the plot), link it from the
    nightly FAIL's record, tell the team; return the summary."""
    result = {"schema": 1, "dag_run_id": dag_run_id, "good": plan["good"], "bad": plan["bad"],
              "suites": plan["suites"], "metrics": plan["metrics"], "nodes": plan["nodes"],
              "commits": plan["commits"], "answer": answer, "probes": rows, "wall_s": round(wall_s, 1),
              "runs": sum(r.get("runs") or 0 for r in rows), "source": plan.get("source") or {},
              "link": links.bisection_path(settings.BISECT_DAG_ID, dag_run_id)}
    with record.workspace(dag_run_id, dag_id=settings.BISECT_DAG_ID) as run_dir:
        record.write_json(run_dir / RESULT_FILE, result)
        bisect_report.write(run_dir, result)
        record.write_manifest(run_dir, shown_as=record.location(dag_run_id, dag_id=settings.BISECT_DAG_ID))
    nightly = (plan.get("source") or {}).get("run_id")
    if nightly:
        record.put_json(nightly, RESULT_FILE, {"bisection": dag_run_id, "link": result["link"],
                                               "answer": answer["reason"]})
    log.info("Bisection: %s; %d probe(s), %d run(s), %.0f s; report: %s", answer["reason"], len(rows), result["runs"],
             wall_s, result["link"])
    try:  # the answer (or why there is none) on the run's page in the grid
        airflow_api.set_run_note(settings.AIRFLOW_API_CONN_ID, settings.BISECT_DAG_ID, dag_run_id,
                                 bisect_report.headline(result))
    except Exception as err:  # the page, the notification and this log say the same
        log.warning("Could not set the run's note through %r (%s)", settings.AIRFLOW_API_CONN_ID, err)
    notify.send(*notify.bisection(result), failure=answer["kind"] != bisect.CULPRIT)
    return {"answer": answer, "link": result["link"], "probes": len(rows), "runs": result["runs"],
            "suites": plan["suites"], "dag_run_id": dag_run_id}


# --- asset events of the verification DAG -------------------------------------------------------------

def announce(outlet_events: Any, asset: Any, extra: dict[str, Any] | None) -> None:
    """Emit ``asset``'s event with ``extra``; None: no event (the task is skipped, which emits none)."""
    from airflow.sdk.exceptions import AirflowSkipException

    if extra is None:
        raise AirflowSkipException(f"no {asset.name} event for this run")
    outlet_events[asset].extra = extra
    log.info("Asset event %s: %s", asset.name, json.dumps(extra, sort_keys=True))


def triggering_extra(events: Any) -> dict[str, Any] | None:
    """The extra of the newest reproduced-FAIL asset event that started this run (None for a manual run)."""
    if not events:
        return None
    newest = None
    for asset, found in events.items():
        names = (getattr(asset, "name", None), str(getattr(asset, "uri", "")).rstrip("/"))
        if settings.REPRODUCED_FAIL_ASSET in names and found:
            newest = found[-1]
    return dict(newest.extra or {}) if newest is not None else None


def culprit_extra(result: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The culprit asset event's extra (None when the bisection named no single culprit)."""
    culprit = ((result or {}).get("answer") or {}).get("culprit")
    if not culprit:
        return None
    return {**culprit, "suites": result.get("suites"), "bisection": result.get("link"),
            "dag_run_id": result.get("dag_run_id")}


def verified_commit_extra(summary: Mapping[str, Any] | None, dag_run_id: str) -> dict[str, Any] | None:
    """The verified-commit asset event's extra for a PASS verification (None for any other verdict)."""
    if not summary or summary.get("verdict") != "PASS":
        return None
    report = record.get_json(dag_run_id, "report.json") or {}
    return {"sha": report.get("commit"), "commit_ref": report.get("commit_ref"),
            "suites": [s["suite"] for s in summary.get("suites") or []], "baselines": report.get("baselines") or {},
            "report": links.report_view_path(settings.verification_dag_of(dag_run_id), dag_run_id),
            "dag_id": settings.verification_dag_of(dag_run_id), "dag_run_id": dag_run_id}


def reproduced_fail_extra(summary: Mapping[str, Any] | None, dag_run_id: str, run_type: str) -> dict[str, Any] | None:
    """The reproduced-FAIL asset event's extra that starts a bisection, or None: only a scheduled run whose FAIL
    reproduced in the accuracy class, with a verified PASS of the same suites in the record (the good end)."""
    if run_type != "scheduled" or not summary or summary.get("verdict") != "FAIL":
        return None
    failing = [s for s in summary.get("suites") or [] if s.get("outcome") == "FAIL (reproduced)"
               and s.get("failure_class") == "accuracy"]
    if not failing or "infrastructure" in (summary.get("failure_classes") or []):
        return None
    report = record.get_json(dag_run_id, "report.json") or {}
    suites = [s["suite"] for s in failing]
    good = last_pass(suites, report.get("commit"))
    if good is None:
        log.info("No bisection: no verified PASS of %s is in the record", ", ".join(suites))
        return None
    metrics = [b["metric"] for s in failing for b in s.get("breached") or [] if b.get("metric")]
    folder = record.run_store(dag_run_id)
    return {"good": good, "bad": report.get("commit"), "suites": suites, "metrics": list(dict.fromkeys(metrics))[:1],
            "run_id": dag_run_id, "fingerprint": _card_fingerprint(folder),
            "baselines": {s: v for s, v in (report.get("baselines") or {}).items() if s in suites},
            "report": links.report_view_path(settings.DAG_ID, dag_run_id)}


def last_pass(suites: list[str], not_sha: str | None) -> str | None:
    """The commit of the newest verification in the record whose every one of ``suites`` PASSed."""
    best: tuple[float, str] | None = None
    for _, report, folder in _verification_reports():
        rows = {r.get("suite"): r for r in report.get("suites") or []}
        if report.get("commit") in (None, not_sha) or not all(s in rows for s in suites):
            continue
        if all(suite_outcome(rows[s]) in ("PASS", "PASS (not reproduced)") for s in suites):
            when = _written_at(folder / "report.json")
            if best is None or when > best[0]:
                best = (when, report["commit"])
    return best[1] if best else None


def _written_at(path: Any) -> float:
    """When the record file was written (0 when the store cannot say): run ids of probes carry no time."""
    try:
        return float(path.stat().st_mtime)
    except (OSError, AttributeError, TypeError, ValueError):
        return 0.0
