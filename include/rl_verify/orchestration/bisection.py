"""The task bodies of the bisection DAG (``dags/rl_regression_bisect.py``): its params, its range and worst
case (``plan_range``), its card, and its result once the probes have answered (``finish``).

A bisection names the commit of ``good..bad`` (first-parent history) that caused a reproduced FAIL. Its
probes are normal verification runs (``rl_accuracy_verification``), triggered through the REST API with
the param ``bisection`` = this run's id (``orchestration.probes``): their card is pre-approved by this
bisection's one approval, checked against Airflow's record of it (``orchestration.approval``). What to
probe next is the pure planner's answer (``core.bisect.plan``), asked again whenever a probe ends. The
asset events that start one are ``orchestration.asset_events``'.
"""

from __future__ import annotations

import logging
import re
from typing import Any, Iterable, Mapping

from rl_verify import engines, settings
from rl_verify.core import bisect, bisect_report, lane
from rl_verify.core.names import short_sha
from rl_verify.node import ops as node
from rl_verify.node import remote
from rl_verify.orchestration import airflow_api, links, notify, verification_history
from rl_verify.orchestration.nodes import no_retry_on, node_launcher, node_problems, node_settings, ssh_client
from rl_verify.orchestration.verification_history import fingerprint_of, recorded_readings
from rl_verify.store import record
from rl_verify.suites.spec import SuiteSpec, data_file

log = logging.getLogger(__name__)

#: The bisection's plan (range, suites, nodes, worst case), in its record: probes check their commit in it.
PLAN_FILE = "plan.json"
#: The bisection's result (answer, evidence rows), in its record; a copy of its link in the nightly's.
RESULT_FILE = "bisection.json"
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


def _unknown_metrics(metrics: list[str], specs: Iterable[SuiteSpec]) -> list[str]:
    """The metrics no one of the suites of ``specs`` judges (by its shipped thresholds data)."""
    known: set[str] = set()
    for spec in specs:
        engine = engines.engine_of(spec)
        known |= set(engine.judged_metrics(engine.load_data(data_file(spec.data))))
    return [m for m in metrics if m not in known]


# --- plan ---------------------------------------------------------------------------------------

def plan_range(params: Mapping[str, Any], dag_run_id: str, event: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Validate the params, list the range on the first node (good an ancestor of bad, at most
    ``max_commits`` commits), find ends the record already decided, and keep the plan in the record."""
    with no_retry_on(BisectParamError, ValueError):
        p = validated_params(params, event)
        specs = [engines.load_suite(suite) for suite in p["suites"]]  # read once: the metrics and the scale
        unknown = _unknown_metrics(p["metrics"], specs)
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
        fingerprint = p["source"].get("fingerprint") or fingerprint_of(shas[-1], p["suites"])
        recorded = recorded_readings(shas, p["suites"], fingerprint, p["source"].get("baselines"))
        unmoved: list[str] = []
        if recorded.get(shas[0]) == bisect.Reading.GOOD:  # only a good end the record decided vouches for them
            with ssh_client(conn) as client:
                unmoved = unmoved_commits(client, node_settings(conn)[settings.NODE_CHECKOUT_KEY], shas, specs)
    for sha in unmoved:  # as good as the good end: nothing that can move a number changed since it
        recorded[sha] = bisect.Reading.GOOD
    slots = node_slots(p["nodes"], specs)
    free = sum(slots.values())
    scale = run_scale(specs)
    worst = promised_worst(len(shas) - 1, free, shas[0] in recorded, shas[-1] in recorded, 1 + p["repeats"], scale)
    probe_lane, lane_why = lane.for_bisection(p["source"].get("onset"),
                                              [s.bitwise.steps for s in specs if s.bitwise is not None])
    plan = {**p, "commits": commits, "fingerprint": fingerprint, "recorded": {c: r.value for c, r in recorded.items()},
            "scale": scale, "worst": worst, "dag_run_id": dag_run_id, "lane": probe_lane, "lane_why": lane_why,
            "unmoved": unmoved, "slots": slots}
    if unmoved:
        log.info("%d commit(s) of the range are good without a probe: their diff from the good end touches no path "
                 "that can move the suites' numbers: %s", len(unmoved), ", ".join(short_sha(s) for s in unmoved))
    log.info("Probes run with lane = %s: %s", probe_lane, lane_why)
    record.put_json(dag_run_id, PLAN_FILE, plan, dag_id=settings.BISECT_DAG_ID)
    log.info("Range %s..%s: %d commit(s) after good on %s; worst case %d probe(s) in %d round(s), %d at once; "
             "ends taken from the record: %s", short_sha(shas[0]), short_sha(shas[-1]), len(shas) - 1, conn,
             worst["probes"], worst["rounds"], free,
             ", ".join(f"{short_sha(c)} {r.value}" for c, r in recorded.items()) or "none")
    return plan


def node_slots(nodes: list[str], specs: list[Any]) -> dict[str, int]:
    """How many probes each node runs at once: an SSH node one; a Slurm target (issue 45) as many jobs of the suites'
    GPU count as its partition runs at once, asked of Slurm (a refused field fails the plan, naming it)."""
    out: dict[str, int] = {}
    gpus = max((int(s.node.gpus or 0) for s in specs), default=0)
    for conn in nodes:
        launcher = node_launcher(conn)
        if launcher["kind"] != "slurm":
            out[conn] = 1
            continue
        with ssh_client(conn) as client:
            try:
                out[conn] = node.slurm_slots(client, launcher, gpus, conn)
            except node.PrerequisitesError as err:
                raise BisectParamError(f"param 'nodes': {err}; nothing was launched") from err
        log.info("%s: Slurm partition %s runs %d probe(s) at once", conn, launcher["partition"], out[conn])
    return out


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


def unmoved_commits(client: Any, checkout: str, shas: list[str], specs: list[SuiteSpec]) -> list[str]:
    """The commits of the range (ends excluded) whose diff from the good end ``shas[0]`` touches no path that can
    move any of the suites' numbers: as good as the good end (issue 33, item 3), as ``core.lane.judge`` decides
    the path-aware skip (issue 42: the suites' ``affects`` rules checked against the bad end's tree, and a commit
    whose full verdict in the record doubts it is probed). A diff git cannot give counts as touching everything."""
    try:
        tree = node.tree_files(client, checkout, shas[-1])
    except node.NodeError as err:
        log.info("The files of the bad end could not be listed (%s): every commit is probed", err)
        return []
    verdicts = verification_history.suite_verdicts([s.name for s in specs])
    out = []
    for sha in shas[1:-1]:
        try:
            changed = node.changed_files(client, checkout, shas[0], sha)
        except node.NodeError as err:
            log.info("The diff %s..%s could not be read (%s): probed as usual", short_sha(shas[0]), short_sha(sha), err)
            continue
        if changed is None:
            continue
        choices = [lane.judge(lane.Rules(s.affects, s.unaffecting, None), lane.Facts(
            requested="skip", verified_pass=shas[0], changed_since_pass=changed, tree=tree,
            contradicted=_doubt(verdicts, s.name, sha))) for s in specs]
        if all(c.choice == "unchanged" for c in choices):
            out.append(sha)
        elif not any(c.affecting for c in choices):
            log.info("%s touches no path that can move a number but is probed: %s", short_sha(sha),
                     "; ".join(c.why for c in choices if c.choice != "unchanged"))
    return out


def _doubt(verdicts: list[dict[str, Any]], suite: str, sha: str) -> str:
    doubt = verification_history.doubted(verdicts, suite, sha)
    return verification_history.doubt_words(doubt) if doubt else ""


def run_scale(specs: Iterable[SuiteSpec]) -> dict[str, dict[str, float]]:
    """Per suite, one run at the runbook's scale: its minutes and GPUs, from the suite spec (``runbook_minutes``,
    ``node.gpus``; without them the wall-time budget, an upper bound, and ``settings.GPUS_PER_RUN``)."""
    out = {}
    for spec in specs:
        out[spec.name] = {"minutes": spec.run_minutes, "gpus": spec.node.gpus or settings.GPUS_PER_RUN}
    return out


# --- the card -----------------------------------------------------------------------------------

def card(plan: Mapping[str, Any]) -> dict[str, Any]:
    """The bisection's card (Markdown): the range with each commit's SHA and subject, the probes at most,
    the nodes and the GPU-hours at the runbook's scale."""
    commits, worst = plan["commits"], plan["worst"]
    scale = plan.get("scale") or run_scale(engines.load_suite(s) for s in plan["suites"])
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
              f"{len(plan['nodes'])} node(s): {_slots_text(plan)}), each up to {1 + plan['repeats']} run(s) "
              f"(the confirmation's repeats): at most **{worst['runs']} training runs, "
              f"{worst['gpu_hours']} GPU-hours** "
              f"at the runbook's scale ({minutes} per run, {' or '.join(map(str, gpus))} GPUs), about "
              f"{worst['wall_hours']} h of wall time. Early abort usually ends a FAILing probe sooner.",
              "", "Ends: " + "; ".join(
                  f"{'good' if i == 0 else 'bad'} {short_sha(commits[i]['sha'])}: "
                  + (f"taken from the record ({recorded[commits[i]['sha']]})" if commits[i]["sha"] in recorded
                     else "re-checked") for i in (0, len(commits) - 1)),
              "", f"Good without a probe (their diff from the good end touches no path that can move a suite's "
              f"numbers): {', '.join(short_sha(s) for s in plan.get('unmoved') or []) or 'none'}. Probes verify with "
              f"lane = {plan.get('lane', 'full')}"
              + (": a probe whose first deterministic steps are a verified PASS's bits is good in those steps"
                 if plan.get("lane") == "auto" else "") + f" ({plan.get('lane_why') or 'no bitwise lane'}).",
              "", "Approving starts every probe of this bisection without asking again: each probe's card is "
              "pre-approved by this approval (checked against Airflow's record of it). A standing approval of the "
              "nightly does not cover a bisection.", "",
              f"Bisection fingerprint: `{plan.get('fingerprint') or 'none'}` (the experiment's)"]
    return {"markdown": "\n".join(lines), "fingerprint": plan.get("fingerprint") or ""}


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")[:100]


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


def _slots_text(plan: Mapping[str, Any]) -> str:
    """The plan's nodes, a Slurm target with the probes it runs at once: ``slurm_gpu (2 at once)``."""
    slots = plan.get("slots") or {}
    return ", ".join(n + (f" ({slots[n]} at once, Slurm)" if slots.get(n, 1) > 1 else "") for n in plan["nodes"])
