"""Telling people: the card waiting for approval, the verdict, an infrastructure failure.

Messages are plain text built by small pure functions; ``send`` posts one through the Apprise
provider's notifier, whose single Airflow connection (``settings.NOTIFY_CONN_ID``, type ``apprise``)
holds the target URL(s): Feishu/Lark, DingTalk, WeCom, Slack, e-mail... No connection = nothing
sent, said once per task in its log. A failed delivery is logged, never fails the task: the
verdict stands in the UI whatever the chat says.
"""

from __future__ import annotations

import logging
from typing import Any, Iterable

from airflow.sdk import BaseHook
from airflow.sdk.exceptions import AirflowNotFoundException

from rl_verify import settings
from rl_verify.core.model import SHORTCUTS, is_infrastructure
from rl_verify.core.names import short_sha
from rl_verify.core.spread import DRIFT_WORDS
from rl_verify.orchestration import links
from rl_verify.orchestration.contract import Breach, ReportSummary, SuiteSummary

log = logging.getLogger(__name__)

#: How much of an infrastructure FAIL's cause a verdict line and a notification quote.
CAUSE_CHARS = 600


def _ui(path: str) -> str:
    return links.absolute(links.ui_base_url(), path)


def card_waiting(commit: str, suites: Iterable[str], dag_run_id: str, deadline: str | None,
                 dag_id: str = settings.DAG_ID) -> tuple[str, str]:
    """(title, body) of "a card waits for approval" (``commit``: the commit, or a bisection's range)."""
    where = _ui(links.run_page_path(dag_id, dag_run_id) + "/required_actions")
    body = [f"Commit: {commit}", f"Suites: {', '.join(suites)}", f"Approve or reject: {where}"]
    if deadline:
        body.append(f"Unanswered by {deadline}, the run ends NOT APPROVED.")
    return f"rl-verify: {commit}: experiment card waiting for approval", "\n".join(body)


def verdict(summary: dict[str, Any], commit: str, dag_run_id: str, next_step: str | None) -> tuple[str, str]:
    """(title, body) of the run's verdict: class, what breached, the next step, the report link."""
    report = _ui(links.report_view_path(settings.verification_dag_of(dag_run_id), dag_run_id))
    confirmed = [f"{s['suite']} {s['outcome']} over {s['runs']} runs: {s.get('outcome_reason', '')}"
                 for s in summary.get("suites") or [] if s.get("runs", 1) > 1]
    if summary["verdict"] in ("PASS", "INCONCLUSIVE"):
        suites = ", ".join(s["suite"] for s in summary.get("suites") or [])
        head = (f"Every suite of {suites} passes." if summary["verdict"] == "PASS" else
                "At least one suite is INCONCLUSIVE: its FAIL was neither reproduced nor cleared within the budget.")
        return (f"rl-verify {summary['verdict']}: {commit}",
                "\n".join([head, *_shortcut_lines(summary), *confirmed, *_drift_lines(summary), *_gpu_lines(summary),
                           f"Report: {report}"]))
    classes = " + ".join(summary.get("failure_classes") or ["unknown"])
    lines = [suite_line(s) + f" ({s.get('failure_class')})" for s in summary.get("suites") or []
             if s.get("outcome", s["verdict"]) in ("FAIL", "FAIL (reproduced)")]
    lines += [c for c in confirmed if "FAIL" not in c.split(":")[0]]  # suites whose FAIL was noise
    if next_step:
        lines.append(f"Next step: {next_step}")
    lines += _drift_lines(summary) + _gpu_lines(summary)
    lines.append(f"Report: {report}")
    return f"rl-verify FAIL ({classes}): {commit}", "\n".join(lines)


def _shortcut_lines(summary: dict[str, Any]) -> list[str]:
    """One line per suite a shortcut decided (no full training), with what it rests on: "grpo PASS (bitwise), no
    full training: its first 3 deterministic steps are the same bits as the reference of the verified commit ..."."""
    return [f"{s['suite']} {s['outcome']}, no full training: {s.get('outcome_reason') or 'see the report'}"
            for s in summary.get("suites") or [] if s.get("outcome") in SHORTCUTS]


def _drift_lines(summary: dict[str, Any]) -> list[str]:
    """One line per suite whose learned spread left its prior's range for some metric: "<suite>: Drift alarm ..."."""
    return [f"{s['suite']}: {DRIFT_WORDS}: {'; '.join(s['drift'])}" for s in summary.get("suites") or []
            if s.get("drift")]


def _gpu_lines(summary: dict[str, Any]) -> list[str]:
    """"Node after cleanup: GPUs free ..." or "...: GPU memory still held by pid P (N MiB) ...", one per node."""
    return [f"Node after cleanup: {line}" for line in summary.get("gpus") or []]


def bisection(result: dict[str, Any]) -> tuple[str, str]:
    """(title, body) of a bisection's answer: the culprit (SHA, subject, author, date) or why there is none,
    the probes it took and the link to its page."""
    answer = result["answer"]
    page = _ui(result["link"])
    culprit = answer.get("culprit")
    head = f"{result['good']}..{result['bad']} ({', '.join(result['suites'])})"
    lines = [answer["reason"]]
    if culprit:
        lines = [f"Culprit: {short_sha(culprit['sha'])} {culprit['subject']}", f"Author: {culprit['author']}",
                 f"Date: {culprit['date']}"]
    elif answer.get("range"):
        lines.append("Culprit range: " + ", ".join(f"{short_sha(c['sha'])} {c['subject']}" for c in answer["range"]))
    if answer.get("skipped"):
        lines.append("Skipped (could not be checked out or launched): "
                     + ", ".join(short_sha(c["sha"]) for c in answer["skipped"]))
    lines += [f"Probes: {len(result['probes'])} verification(s), {result['runs']} training run(s)",
              f"Bisection: {page}"]
    title = (f"rl-verify bisection: culprit {short_sha(culprit['sha'])} for {head}" if culprit else
             f"rl-verify bisection of {head}: {answer['kind']}")
    return title, "\n".join(lines)


def infrastructure(failed_tasks: list[str], commit: str, dag_run_id: str, cleanup_lines: list[str],
                   node_clean: bool) -> tuple[str, str]:
    """(title, body) of an infrastructure failure: which tasks failed and whether the node is clean."""
    run = _ui(links.run_page_path(settings.verification_dag_of(dag_run_id), dag_run_id))
    state = ("the node is clean: no process of this run is left, Ray stopped if this run started it"
             if node_clean else "the node is NOT clean: " + "; ".join(line for line in cleanup_lines
                                                                     if line.startswith("LEFT")))
    gpus = [line for line in cleanup_lines if line.startswith(("GPUs free", "GPU memory still held", "GPUs not read"))]
    body = [f"Failed task(s): {', '.join(failed_tasks) or 'unknown'}", f"Cleanup: {state}",
            *(f"GPUs: {line}" for line in gpus), f"Run: {run}"]
    return f"rl-verify: infrastructure failure in the run of {commit}", "\n".join(body)


def suite_summary(result: Any, outcome: dict[str, Any] | None = None) -> SuiteSummary:
    """Verdict, class, breached and unmeasured metrics of one suite's first run, and its outcome over its
    runs (small: it travels through XCom)."""
    breached: dict[str, Breach] = {}
    for c in result.checks:
        if c.breached and c.metric not in breached:
            breached[c.metric] = {"metric": c.metric, "first_breach_step": c.first_breach_step,
                                  "steps": c.breach_steps}
    return {"suite": result.suite, "verdict": result.verdict, "failure_class": result.failure_class,
            "breached": list(breached.values()),
            "missing": sorted({c.metric for c in result.checks if c.missing}),
            "outcome": (outcome or {}).get("outcome") or result.verdict,
            # A suite a shortcut decided (PASS (unchanged), PASS (bitwise)) had no full training; any other one or more.
            "runs": len((outcome or {}).get("runs") or []) or (0 if (outcome or {}).get("outcome") in SHORTCUTS else 1),
            "outcome_reason": (outcome or {}).get("reason", ""),
            "cause": _cause(result), "drift": list(((outcome or {}).get("spread") or {}).get("drift") or [])}


def _cause(result: Any) -> str:
    """An infrastructure FAIL's first finding without its "Infrastructure failure: " label, cut to a
    message's length; "" otherwise."""
    if not is_infrastructure(result.failure_class) or not result.abnormal:
        return ""
    text = result.abnormal[0].removeprefix("Infrastructure failure: ")
    return text if len(text) <= CAUSE_CHARS else text[:CAUSE_CHARS - 1] + "…"


def _outcome_words(suite: SuiteSummary) -> str:
    """", reproduced over 2 runs" for a repeated suite; "" for a suite judged by one run."""
    if suite.get("runs", 1) < 2:
        return ""
    return f" ({suite.get('outcome')} over {suite['runs']} runs)"

def suite_line(suite: SuiteSummary) -> str:
    """What failed in one suite, in a few words: "grpo mismatch/mismatch_k3_kl breached at steps 1-45"."""
    said = []
    for b in suite.get("breached", []):
        steps = b.get("steps") or (str(b["first_breach_step"]) if b.get("first_breach_step") is not None else "")
        where = f" at step{'s' if any(c in steps for c in '-,') else ''} {steps}" if steps else ""
        said.append(f"{b['metric']} breached{where}")
    if suite.get("missing"):
        said.append("not measured: " + ", ".join(suite["missing"]))
    if not said and suite.get("cause"):
        said.append(suite["cause"])
    return (f"{suite['suite']} " + ("; ".join(said) if said else "did not reach a measured verdict (see its tasks)")
            + _outcome_words(suite))

def verdict_message(summary: ReportSummary, report_link: str | None = None) -> str:
    """One line: "FAIL (accuracy): grpo mismatch/mismatch_k3_kl breached at steps 1-45; report: <link>".

    With several failure classes, each suite names its own. ``report_link`` defaults to the record.
    """
    classes = summary.get("failure_classes") or ["unknown"]
    failed = [s for s in summary.get("suites") or [] if s.get("outcome", s["verdict"]) in ("FAIL", "FAIL (reproduced)")]
    parts = [suite_line(s) + (f" ({s.get('failure_class') or 'unknown'})" if len(classes) > 1 else "")
             for s in failed] or [f"suite(s) {', '.join(summary.get('failed_suites', []))}"]
    return f"FAIL ({' + '.join(classes)}): {'; '.join(parts)}; report: {report_link or summary['record']}"


def send(title: str, body: str, failure: bool = False) -> bool:
    """Post one message through the Apprise connection; True when it was handed to Apprise.

    Without the connection nothing is sent (logged); a delivery error is logged, not raised.
    """
    try:
        BaseHook.get_connection(settings.NOTIFY_CONN_ID)
    except AirflowNotFoundException:
        log.info("No notification target (Airflow connection %r of type apprise): nothing sent. To post the "
                 "card, the verdict and infrastructure failures to a chat, add it with the chat's Apprise URL.",
                 settings.NOTIFY_CONN_ID)
        return False
    # The provider and Apprise (dozens of notification plugins): imported only when a message is sent.
    from airflow.providers.apprise.notifications.apprise import AppriseNotifier
    from apprise import NotifyType

    try:
        AppriseNotifier(title=title, body=body, apprise_conn_id=settings.NOTIFY_CONN_ID,
                        notify_type=NotifyType.FAILURE if failure else NotifyType.INFO).notify({})
    except Exception as err:  # the verdict stands in the UI whatever the chat says
        log.warning("Notification %r could not be sent through %r: %s", title, settings.NOTIFY_CONN_ID, err)
        return False
    log.info("Notification sent through %r: %s", settings.NOTIFY_CONN_ID, title)
    return True
