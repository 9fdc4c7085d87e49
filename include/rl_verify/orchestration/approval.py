"""The approval of an experiment card (``CardApprovalOperator``, the ``approve`` tasks of the verification,
probe and bisection DAGs): bounded in time, with verified standing approvals, and a bisection's probes
pre-approved by the bisection's one approval (``preapproval_refusals``).

Imported by the DAG files at parse time: the package modules it imports at module level hold no heavy
import (paramiko, pandas, matplotlib and the SSH provider are imported where they are used).
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any

from airflow.providers.standard.operators.hitl import ApprovalOperator
from airflow.sdk import Param, ParamsDict, Variable
from airflow.sdk.exceptions import AirflowFailException
from airflow.sdk.timezone import utcnow

from rl_verify import engines, settings
from rl_verify.core.model import UNCHANGED
from rl_verify.core.names import short_sha
from rl_verify.orchestration import airflow_api, notify, standing
from rl_verify.orchestration.bisection import PLAN_FILE
from rl_verify.orchestration.contract import Card
from rl_verify.store import record


class CardApprovalOperator(ApprovalOperator):
    """Approval of the experiment card: bounded in time, with verified standing approvals.

    * A person approving a *scheduled* run's card with "standing approval" ticked grants one: later
      scheduled runs with the same experiment fingerprint proceed without waiting, but only after
      the grant has been checked against Airflow's record of that response (``rl_verify.orchestration.standing``);
      any refusal is logged with its reasons and the run waits for a person.
    * A rejected scheduled card revokes a standing approval for that card.
    * Nobody answers within ``settings.approval_timeout`` (default: before the next scheduled run):
      the run ends NOT APPROVED (timed out), downstream skipped, the node untouched. Never approved
      by default: the request has no default options.
    """

    template_fields = (*ApprovalOperator.template_fields, "card")

    def __init__(self, *, card: Any, subject: str | None = None, standing_offered: bool = True,
                 **kwargs: Any) -> None:
        """``card``: ``experiment_card``'s output (an XComArg in the DAG, a ``contract.Card`` when run);
        ``standing_offered``: False for a card no standing approval may cover (a bisection's)."""
        approvers = settings.approvers()
        kwargs.pop("params", None)  # DAG-level params are not form fields of the approval
        self.card = card
        self.standing_offered = standing_offered
        super().__init__(
            subject=subject or
            "{{ params.commit }} ({{ params.suites | join(', ') }}): approve the RL accuracy experiment card",
            body=None,  # the card's Markdown, set once the card is known (execute)
            params={"standing_approval": Param(
                False, type=["boolean", "null"], title="Standing approval for nightly runs (optional)",
                description="Let later scheduled runs with this exact card proceed without waiting (expires "
                            "after RL_VERIFY_STANDING_APPROVAL_DAYS days). Offered on scheduled runs only.")},
            assigned_users=approvers or None,
            **kwargs,
        )

    def execute(self, context: Any) -> Any:
        resolved = context["ti"].xcom_pull(task_ids="resolve_commit") or {}
        skipped = resolved.get("unchanged") or {}
        if resolved.get("suites") and set(resolved["suites"]) <= set(skipped):
            # Nothing would be launched: no person is asked (and a standing approval is not spent).
            self.log.info("No approval needed: every suite is %s (%s); nothing is launched", UNCHANGED,
                          "; ".join(f"{s}: {e['why']}" for s, e in skipped.items()))
            _push_decision(context, [], None, _now().isoformat(timespec="seconds"), standing=False,
                           not_needed=True)
            self._skip_unselected_suites(context)
            return {"chosen_options": [], "not_needed": True}
        approved = self._approve_or_wait(context)
        self._skip_unselected_suites(context)  # reached only when approved without waiting for a person
        return approved

    def _skip_unselected_suites(self, context: Any) -> None:
        """Skip every task of the suites this run does not train, at once: those it does not test and those the
        path-aware skip ended PASS (unchanged); without it each such suite's training and confirmation would take
        a worker (and the node's pool slot) only to skip itself. Ends the task (Airflow's SkipMixin raises); a
        DAG without suite tasks (a bisection's card) skips nothing."""
        resolved = context["ti"].xcom_pull(task_ids="resolve_commit") or {}
        if not resolved.get("suites"):
            return
        unchanged = [s for s in resolved["suites"] if s in (resolved.get("unchanged") or {})]
        unselected = [s for s in engines.known_suites() if s not in resolved["suites"]]
        names = {settings.confirm_task(s) for s in unselected + unchanged} | {
            name for s in unselected + unchanged for name in settings.attempt_tasks(s)}
        tasks = [t for t in context["task"].get_flat_relatives(upstream=False) if t.task_id in names]
        if tasks:
            if unselected:
                self.log.info("Not tested in this run: %s (their tasks are skipped)", ", ".join(unselected))
            if unchanged:
                self.log.info("%s, not trained: %s (their tasks are skipped)", UNCHANGED, ", ".join(unchanged))
            self.skip(ti=context["ti"], tasks=tasks)

    def _approve_or_wait(self, context: Any) -> Any:
        card: Card = self.card
        self.body = card["markdown"]
        params = context.get("params") or {}
        if params.get("bisection"):
            return self._preapproved(context, str(params["bisection"]))
        if context["dag_run"].run_type != "scheduled" or not self.standing_offered:
            self.params = ParamsDict({})  # a standing approval only ever applies to scheduled runs: not offered
        if context["dag_run"].run_type == "scheduled" and self.standing_offered:
            grant = self._verified_grant(card["fingerprint"])
            if grant is not None:
                self.log.info("Standing approval granted by %s at %s in run %s, verified against its approval "
                              "record: proceeding without waiting", grant.granted_by, grant.granted_at,
                              grant.dag_run_id)
                _push_decision(context, [self.APPROVE], grant.granted_by, grant.granted_at, standing=True,
                               granted_in=grant.dag_run_id)
                return {"chosen_options": [self.APPROVE], "standing_approval": json.loads(grant.to_json())}
        self.response_timeout = settings.approval_timeout()
        deadline = None
        if self.response_timeout:
            self.log.info("Waiting for a person for at most %s; unanswered, the run ends NOT APPROVED (timed out)",
                          self.response_timeout)
            deadline = (datetime.now(timezone.utc) + self.response_timeout).strftime("%Y-%m-%d %H:%M UTC")
        what = params.get("commit") or f"{params.get('good')}..{params.get('bad')}"
        notify.send(*notify.card_waiting(str(what), params.get("suites") or [], context["run_id"], deadline,
                                         context["dag_run"].dag_id))
        return super().execute(context)

    def _preapproved(self, context: Any, bisection_run_id: str) -> Any:
        """A bisection's probe: proceed on the bisection's one approval, verified against Airflow's record of
        it and the bisection's plan (the commit in its range, the suites its own); refused, fail at once."""
        resolved = context["ti"].xcom_pull(task_ids="resolve_commit") or {}
        reasons, approval = preapproval_refusals(bisection_run_id, str(resolved.get("sha") or ""),
                                                           list(resolved.get("suites") or []))
        if reasons:
            raise AirflowFailException(f"pre-approval by bisection {bisection_run_id} refused: " + "; ".join(reasons)
                                       + ". Nothing is launched; a person may trigger this commit without the "
                                       "'bisection' param to approve its own card")
        at = approval.responded_at.isoformat() if hasattr(approval.responded_at, "isoformat") else str(
            approval.responded_at)
        self.log.info("Pre-approved by %s at %s through bisection %s (verified against its approval record): "
                      "proceeding without waiting", approval.responded_by, at, bisection_run_id)
        _push_decision(context, [self.APPROVE], approval.responded_by, at, standing=False,
                       bisection=bisection_run_id)
        return {"chosen_options": [self.APPROVE], "bisection": bisection_run_id}

    def _verified_grant(self, fingerprint: str) -> Any:
        """The standing approval if every check passes, else None (every reason logged)."""
        raw = Variable.get(settings.STANDING_APPROVAL_VARIABLE, default=None)
        if not raw:
            self.log.info("No standing approval for card %s: waiting for a person", fingerprint)
            return None
        try:
            grant = standing.parse_grant(raw)
        except standing.MalformedGrant as err:
            self.log.warning("Standing approval refused: the Variable %s is malformed (%s): waiting for a person",
                             settings.STANDING_APPROVAL_VARIABLE, err)
            return None
        try:
            record = airflow_api.approval_record(settings.AIRFLOW_API_CONN_ID, grant.dag_id, grant.dag_run_id,
                                                 grant.task_id)
        except airflow_api.ApiUnavailable as err:
            self.log.warning("Standing approval refused: it cannot be verified (%s): waiting for a person", err)
            return None
        reasons = standing.refusals(grant, record, fingerprint, _now(), settings.standing_approval_max_age(),
                                    [a["name"] for a in settings.approvers()])
        if reasons:
            self.log.warning("Standing approval refused: %s: waiting for a person", "; ".join(reasons))
            return None
        return grant

    def execute_complete(self, context: Any, event: dict[str, Any]) -> Any:
        if event.get("error_type") == "timeout":
            return self._timed_out(context)
        # Recorded before the parent runs: on "Reject" it skips downstream by raising, so nothing
        # after it (not even the return value) would reach XCom.
        user = event.get("responded_by_user") or {}
        who = user.get("name") or user.get("id") or "unknown user"
        chosen = list(event.get("chosen_options") or [])
        at = event.get("responded_at")
        at = at.isoformat() if hasattr(at, "isoformat") else str(at)
        _push_decision(context, chosen, who, at, standing=False)
        scheduled = context["dag_run"].run_type == "scheduled"
        card: Card = self.card
        if self.REJECT in chosen:
            self.log.warning("Experiment card REJECTED by %s: nothing is launched", who)
            if scheduled:
                self._revoke(card["fingerprint"], who, at)
        else:
            self.log.info("Experiment card approved by %s", who)
            if self.standing_offered and (event.get("params_input") or {}).get("standing_approval"):
                self._grant(context, card["fingerprint"], who, at, scheduled)
        approved = super().execute_complete(context=context, event=event)
        self._skip_unselected_suites(context)
        return approved

    def _grant(self, context: Any, fingerprint: str, who: str, at: str, scheduled: bool) -> None:
        if not scheduled:
            self.log.warning("Standing approval NOT granted: only the approval of a scheduled run can grant one "
                             "(this is a %s run)", context["dag_run"].run_type)
            return
        grant = standing.Grant(fingerprint=fingerprint, dag_id=context["dag_run"].dag_id, dag_run_id=context["run_id"],
                      task_id=self.task_id, granted_by=who, granted_at=at)
        Variable.set(settings.STANDING_APPROVAL_VARIABLE, grant.to_json())
        self.log.info("Standing approval for card %s granted by %s (expires after %s days)", fingerprint, who,
                      settings.standing_approval_max_age().days)

    def _revoke(self, fingerprint: str, who: str, at: str) -> None:
        raw = Variable.get(settings.STANDING_APPROVAL_VARIABLE, default=None)
        try:
            grant = standing.parse_grant(raw) if raw else None
        except standing.MalformedGrant:
            grant = None
        if grant is not None and grant.fingerprint == fingerprint and not grant.revoked_by:
            Variable.set(settings.STANDING_APPROVAL_VARIABLE, grant.revoked(who, at).to_json())
            self.log.warning("Standing approval for card %s revoked by %s", fingerprint, who)

    def _timed_out(self, context: Any) -> Any:
        """Nobody answered in time: NOT APPROVED, downstream skipped, nothing launched."""
        context["ti"].xcom_push(key="decision", value={
            "chosen_options": [], "by": None, "at": _now().isoformat(timespec="seconds"), "standing": False,
            "timed_out": True, "timeout": str(self.response_timeout) if self.response_timeout else None})
        self.log.warning("NOT APPROVED (timed out): nobody answered the card in time; nothing is launched")
        tasks = [t for t in context["task"].get_direct_relatives(upstream=False) if not t.is_teardown]
        if tasks:
            self.skip(ti=context["ti"], tasks=tasks)
        return {"chosen_options": [], "timed_out": True}


def _now() -> Any:
    return utcnow()


def _push_decision(context: Any, chosen: list[str], who: str | None, at: str, standing: bool,
                   granted_in: str | None = None, bisection: str | None = None, not_needed: bool = False) -> None:
    context["ti"].xcom_push(key="decision", value={
        "chosen_options": chosen, "by": who, "at": at, "standing": standing, "granted_in": granted_in,
        "bisection": bisection, **({"not_needed": True} if not_needed else {})})


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
