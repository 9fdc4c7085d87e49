"""The verification DAG's task graph, built by the DAGs that verify one commit: ``rl_accuracy_verification``
(the nightly and manual runs, one at a time) and ``rl_accuracy_probe`` (a bisection's probes, one per node
at once). One definition, two DAG ids: a probe is a normal verification, not a copy of it.

Called inside a ``@dag`` function at parse time. The task bodies' modules import nothing heavy at module level
(paramiko, pandas, matplotlib and the providers are imported where they are used), so parsing stays fast.
"""

from __future__ import annotations

import logging

from airflow.sdk import Asset, Param, chain, task

from rl_verify import engines, settings
from rl_verify.node import placement
from rl_verify.orchestration import (airflow_api, approval, asset_events, comparison, confirmation, hand_end,
                                     operators, reporting, verification)

log = logging.getLogger(__name__)


def params() -> dict[str, Param]:
    """The verification's params (its trigger form): commit, suites, node(s), early abort, repeats, baseline
    versions and, for a bisection's probes, the bisection."""
    titles = engines.suite_titles()
    return {
        "commit": Param(settings.DEFAULT_COMMIT, type="string", title="Commit under test",
                        description="Branch, tag or SHA in the node's XTuner checkout, e.g. main, v1.2.0 or "
                                    "4e7db028. Up to 200 characters: letters, digits and . _ / + - (no spaces), "
                                    "starting with a letter or digit.",
                        minLength=1, maxLength=200, pattern=r"^[A-Za-z0-9][A-Za-z0-9._/+-]*(?![\s\S])"),
        "suites": Param(list(engines.default_suites()), type="array", title="Suites",
                        description="One or more trainings to verify: " + "; ".join(titles.values())
                                    + ". Each needs a whole 8-GPU node: on one node they run one after the other.",
                        items={"type": "string", "enum": list(engines.known_suites())},
                        values_display=titles, minItems=1, uniqueItems=True),
        "node": Param(settings.DEFAULT_NODE_CONN_ID, type="string", title="GPU node(s) (SSH connection id)",
                      description="The id of the Airflow SSH connection (Admin > Connections) of the 8-GPU node "
                                  f"to train on, e.g. {settings.DEFAULT_NODE_CONN_ID}, or one per suite to train them "
                                  "at the same time, e.g. grpo=node_a,opd=node_b. Each node's host key must be "
                                  "pinned in its connection, and each node has a one-slot pool rl_node_<id>. "
                                  "Letters, digits and _ . - only.",
                      maxLength=1000, pattern=placement.NODE_PARAM_PATTERN),
        "early_abort": Param(True, type="boolean", title="Early abort",
                             description="End a suite's training as soon as its FAIL is certain (the live check "
                                         "uses the final comparison's rules). Off: train to the end; the report "
                                         "says where it would have stopped."),
        # Optional (null allowed): an empty required text field would keep the form's Trigger button disabled.
        "repeats": Param(settings.DEFAULT_REPEATS, type="integer", minimum=0, maximum=settings.MAX_REPEATS,
                         title="Extra runs to confirm a doubtful FAIL",
                         description="A suite whose FAIL run-to-run noise could have produced is repeated at the same "
                                     "commit with a new seed, up to this many times, and ends FAIL (reproduced), PASS "
                                     "(not reproduced) or INCONCLUSIVE. 0: the first run's verdict is final. Scheduled "
                                     "runs use RL_VERIFY_SCHEDULED_REPEATS."),
        "baseline_versions": Param(None, type=["null", "string"], title="Baseline versions",
                                   description="Empty: each suite is judged against its current baseline version "
                                               "(rl-verify baselines list). To pin other versions, give suite=version "
                                               "pairs, e.g. opd=2 or grpo=1,opd=3.",
                                   maxLength=500, pattern=settings.BASELINE_PIN_PATTERN),
        "lane": Param(settings.DEFAULT_LANE, type="string", enum=list(settings.LANES), title="Verification",
                      description="auto: a suite whose diff since its last verified PASS (same experiment, same "
                                  "baseline version) touches no path its spec says can move its numbers ends PASS "
                                  "(unchanged) without training, and a suite with a trusted bitwise reference first "
                                  "runs a few deterministic steps: the same bits end it PASS (bitwise); skip: the "
                                  "path-aware skip only; full: train every suite in full whatever the diff."),
        "bisection": Param(None, type=["null", "string"], title="Bisection (set by a bisection's probes)",
                           description="Empty for a normal run. A bisection's probes carry its run id: their card is "
                                       "then approved by the bisection's one approval, verified against Airflow's "
                                       "record of it, and refused for a commit outside its range.",
                           maxLength=250, pattern=r"^[A-Za-z0-9_.:+-]*$"),
    }


def skip_repeat(ti, tasks: list[str], why: str) -> None:
    """Skip ``tasks`` (a repeat's later tasks) and then the calling gate itself, so that a repeat that never ran
    reads "skipped" in the grid, gate included (issue 35). Airflow's public ``SkipMixin.skip`` would end the gate
    "success"; here the tasks are skipped through the REST API (the package's API connection, as a bisection
    stops its probes) and the gate raises ``AirflowSkipException``. When the API cannot skip them, ``skip`` does
    (the grid then shows the gate green; the run is the same)."""
    from airflow.sdk.exceptions import AirflowSkipException

    if tasks:
        try:
            airflow_api.skip_tasks(settings.AIRFLOW_API_CONN_ID, ti.dag_id, ti.run_id, tasks, why)
        except Exception as err:
            log.warning("Could not skip the later repeats through the API (%s: %s); skipping them from this gate",
                        type(err).__name__, str(err).splitlines()[0][:200] if str(err) else "")
            ti.task.skip(ti=ti, tasks=[ti.task.dag.get_task(t) for t in tasks])
    raise AirflowSkipException(why)


def build() -> None:
    """Add the verification's tasks to the DAG being defined (see the DAG files' docs for what each does)."""
    suites = engines.known_suites()
    # The default node's pool; a run that names other nodes gets theirs from the cluster policy rl_verify.policy.
    pool = placement.node_pool(settings.DEFAULT_NODE_CONN_ID)

    @task(**settings.SHORT_SSH_TASK_ARGS)
    def resolve_commit(params=None, run_id=None, dag_run=None):
        return verification.resolve_commit(params, run_id, dag_run.run_type)

    @task(**settings.SHORT_SSH_TASK_ARGS)
    def check_prerequisites(resolved, run_id=None):
        return verification.check_prerequisites(resolved, run_id)

    @task(**settings.LOCAL_TASK_ARGS)
    def experiment_card(resolved, prereq, run_id=None, dag_run=None):
        gaps = verification.schedule_gaps(dag_run.run_type, dag_run.logical_date)
        return verification.experiment_card(resolved, prereq, run_id, gaps)

    # one_done, the training its only upstream: after a training that ran (success or failed) it archives what
    # there is; after one that never ran (skipped, or upstream_failed by an earlier task) it is skipped with no
    # worker, and so are the comparison and the repeats after it (not ~20 task processes that each fail).
    @task(trigger_rule="one_done", **settings.SHORT_SSH_TASK_ARGS)
    def fetch(suite, attempt=0, run_id=None, ti=None):
        # Pulled, not passed: an XComArg would make resolve_commit a second upstream that one_done fires on.
        return comparison.fetch(suite, ti.xcom_pull(task_ids="resolve_commit"), run_id, attempt)

    @task(trigger_rule="none_skipped", **settings.LOCAL_TASK_ARGS)
    def compare(suite, attempt=0, run_id=None):
        return comparison.compare(suite, run_id, attempt)

    # none_skipped: a first run's FAIL fails its compare task and the gate still decides; a skipped comparison
    # (suite not selected, card rejected, no repeat before this one) skips the gate without a worker.
    # False skips the repeat's training, fetch and compare and every later repeat (the trigger rules would too,
    # one scheduler loop per task); the confirmation (all_done) always runs.
    @task.short_circuit(ignore_downstream_trigger_rules=False, trigger_rule="none_skipped",
                        **settings.LOCAL_TASK_ARGS)
    def repeat_gate(suite, attempt, run_id=None, ti=None):
        if confirmation.repeat_gate(suite, attempt, run_id):
            return True
        # No: every later run of the suite is skipped at once, not one task per scheduler loop down the chain,
        # and so is the gate itself: in the grid an unrun repeat is all skipped, never a green "success" gate.
        later = settings.attempt_tasks(suite, attempt) - {ti.task_id}
        skip_repeat(ti, sorted(t.task_id for t in ti.task.get_flat_relatives(upstream=False) if t.task_id in later),
                    f"no repeat {attempt} of {suite}: the confirmation needs no more runs (see the lines above)")
        return False

    @task(trigger_rule="all_done", **settings.LOCAL_TASK_ARGS)
    def confirm(suite, run_id=None):
        return confirmation.confirm_outcome(suite, run_id)

    @task(task_id=settings.REPORT_TASK, trigger_rule="all_done", **settings.LOCAL_TASK_ARGS)
    def report(params=None, run_id=None, ti=None):
        # Pulled, not passed: the report is written after any failure, when these may not exist.
        card = ti.xcom_pull(task_ids="experiment_card") or {}
        return reporting.report(run_id, params, ti.xcom_pull(task_ids="approve", key="decision"), card.get("gaps"))

    @task(task_id=settings.VERDICT_TASK, trigger_rule="all_done", **settings.LOCAL_TASK_ARGS)
    def verdict(run_id=None, ti=None):
        # Pulled, not passed: a failed report task must still reach this task as "no report".
        return reporting.verdict(ti.xcom_pull(task_ids=settings.REPORT_TASK), run_id)

    # A teardown with no setup (Airflow runs it once everything upstream is done, as all_done): it runs after
    # every outcome, a skipped cleanup having no log while a person must read that the node is clean, and also
    # when the run is marked failed by hand, which skips every other task that has not started: the jobs of a
    # run ended while no trigger watched them are stopped all the same (issue 54).
    # No node pool: it runs after this run's trainings, whatever happened, on every node the run used.
    @task(**settings.CLEANUP_TASK_ARGS)
    def cleanup(run_id=None, ti=None):
        # Pulled, not passed: cleanup also runs when resolve_commit itself failed (nothing to clean).
        failed, by_hand = verification.cleanup_scope(ti)
        return verification.cleanup(ti.xcom_pull(task_ids="resolve_commit"), run_id, failed, by_hand=by_hand)

    # The last teardown, one that counts for the run's state: marking a run failed leaves it running until its
    # teardowns end, and Airflow then calls it a success (every leaf skipped) unless this one fails.
    @task(task_id=settings.FINAL_STATE_TASK, **settings.LOCAL_TASK_ARGS)
    def final_state(ti=None):
        log.info("%s", hand_end.final_state(hand_end.run_task_states(ti), verification.NEVER_SKIPPED))

    # Asset events for downstream DAGs: a PASS's verified commit, a nightly's reproduced FAIL (a bisection's start).
    @task(outlets=[Asset(settings.VERIFIED_COMMIT_ASSET)], trigger_rule="all_done", **settings.LOCAL_TASK_ARGS)
    def announce_verified(run_id=None, ti=None, outlet_events=None):
        asset_events.announce(outlet_events, Asset(settings.VERIFIED_COMMIT_ASSET),
                              asset_events.verified_commit_extra(ti.xcom_pull(task_ids=settings.REPORT_TASK), run_id))

    @task(outlets=[Asset(settings.REPRODUCED_FAIL_ASSET)], trigger_rule="all_done", **settings.LOCAL_TASK_ARGS)
    def announce_reproduced_fail(run_id=None, ti=None, dag_run=None, outlet_events=None):
        asset_events.announce(outlet_events, Asset(settings.REPRODUCED_FAIL_ASSET), asset_events.reproduced_fail_extra(
            ti.xcom_pull(task_ids=settings.REPORT_TASK), run_id, dag_run.run_type))

    resolved = resolve_commit()
    prereq = check_prerequisites(resolved)
    card = experiment_card(resolved, prereq)
    approve = approval.CardApprovalOperator(task_id="approve", card=card)

    confirmed = []
    watched = [resolved, prereq]
    for suite in suites:
        last = approve
        # The suite's run, then the repeat slots its confirmation may use (settings.MAX_REPEATS; the run's
        # 'repeats' says how many), then its outcome over all its runs.
        for attempt in range(settings.MAX_REPEATS + 1):
            run = operators.SuiteTrainingOperator(task_id=settings.training_task(suite, attempt), suite=suite,
                                                  resolved=resolved, attempt=attempt, pool=pool,
                                                  **settings.TRAINING_TASK_ARGS)
            fetched = fetch.override(task_id=settings.fetch_task(suite, attempt))(suite, attempt=attempt)
            result = compare.override(task_id=settings.compare_task(suite, attempt))(suite, attempt=attempt)
            if attempt:
                chain(last, repeat_gate.override(task_id=settings.repeat_gate_task(suite, attempt))(suite, attempt),
                      run)
            else:
                chain(last, run)
            chain(run, fetched, result)
            watched += [run, fetched]
            last = result
        outcome = confirm.override(task_id=settings.confirm_task(suite))(suite)
        chain(last, outcome)
        confirmed.append(outcome)

    summary = report()
    cleaned = cleanup().as_teardown()
    chain(watched, cleaned)
    chain(cleaned, final_state().as_teardown(on_failure_fail_dagrun=True))
    # The report comes after the cleanup: it lists (and its manifest holds) what cleanup archived.
    chain([*confirmed, cleaned], summary)
    chain(summary, [verdict(), announce_verified(), announce_reproduced_fail()])
