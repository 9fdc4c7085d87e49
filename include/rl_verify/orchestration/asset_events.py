"""The asset events around a bisection: the verification DAG's (a PASS's verified commit, a nightly's
reproduced FAIL that starts a bisection) and the bisection DAG's culprit, with what starts a bisection
from its triggering event.
"""

from __future__ import annotations

import json
import logging
from typing import Any, Mapping

from rl_verify import settings
from rl_verify.orchestration import links
from rl_verify.orchestration.verification_history import folder_fingerprint, last_pass
from rl_verify.store import record
from rl_verify.core.model import is_infrastructure

log = logging.getLogger(__name__)


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
    if not failing or any(is_infrastructure(c) for c in summary.get("failure_classes") or []):
        return None
    report = record.get_json(dag_run_id, "report.json") or {}
    suites = [s["suite"] for s in failing]
    good = last_pass(suites, report.get("commit"))
    if good is None:
        log.info("No bisection: no verified PASS of %s is in the record", ", ".join(suites))
        return None
    metrics = [b["metric"] for s in failing for b in s.get("breached") or [] if b.get("metric")]
    # The first step a failing check breached at: whether a bisection's probes may use the bitwise lane.
    onsets = [c["first_breach_step"] for s in report.get("suites") or [] if s.get("suite") in suites
              for c in s.get("checks") or [] if not c.get("passed") and isinstance(c.get("first_breach_step"), int)]
    folder = record.run_store(dag_run_id)
    return {"good": good, "bad": report.get("commit"), "suites": suites, "metrics": list(dict.fromkeys(metrics))[:1],
            "run_id": dag_run_id, "fingerprint": folder_fingerprint(folder),
            "baselines": {s: v for s, v in (report.get("baselines") or {}).items() if s in suites},
            "report": links.report_view_path(settings.DAG_ID, dag_run_id), "onset": min(onsets, default=None)}
