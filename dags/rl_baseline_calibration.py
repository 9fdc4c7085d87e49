"""
# RL baseline calibration (GRPO + OPD)

Makes a new baseline from N runs of a reference commit, the way the runbook's baselines were made by
hand (GRPO: "Average of 5 historical runs."; OPD: a 3-run mean, thresholds = measured max run-to-run
deviation x 1.5), and promotes it only when a person approves:

1. **plan** — params checked, one clean worktree of `commit` per run on its node, every input checked;
   the runs are spread round robin over `nodes`.
2. **train** — N deferrable trainings per suite with the verification DAG's operator, each with its
   own seed (`RL_VERIFY_SEED`); one training per node at a time (the node's pool), nodes in parallel.
3. **fetch_runs** — every run's tracker and logs archived in the record (`calibration/<suite>/run<i>/`);
   a missing or short run stops the calibration (nothing is proposed).
4. **propose** — per step and eval point: mean, std, min, max, max deviation; the proposal (GRPO:
   a baseline tracker of the per-step means; OPD: golden values and x1.5 thresholds) side by side with
   the current version, with warnings, and a plot of the N curves, their band and the current baseline.
5. **approve_promotion** — a person reads the proposal. Approved: **promote** writes it as a new
   baseline version with its provenance (commit, N, run, dates, nodes, GPUs, who approved, statistics)
   and makes it current. Rejected: nothing changes.
6. **cleanup** — whatever the runs left on their nodes is stopped: a teardown, so it runs also when the run is
   marked failed by hand while it trains; **final_state** then keeps such a run failed (Airflow would call a run
   whose every leaf was skipped a success).

Params: `commit`, `suites`, `runs` (N per suite; empty: GRPO 5, OPD 3), `nodes` (one or more SSH
connection ids, comma separated). `rl-verify baselines list` shows the versions.
"""

from __future__ import annotations

import logging

import pendulum
from airflow.providers.standard.operators.hitl import ApprovalOperator
from airflow.sdk import Param, chain, dag, task

from rl_verify import engines, settings
from rl_verify.node import placement
from rl_verify.orchestration import calibration, hand_end, operators

log = logging.getLogger(__name__)

# A malformed RL_VERIFY_* setting or suite spec is this DAG's import error, naming each one and its fix.
settings.raise_problems()
# The default node's pool; each run's own node comes from the cluster policy rl_verify.policy.
POOL = placement.node_pool(settings.DEFAULT_NODE_CONN_ID)


@dag(
    dag_id=settings.CALIBRATION_DAG_ID,
    schedule=None,
    start_date=pendulum.datetime(*settings.DAGS_START_DATE, tz=settings.TIMEZONE),
    catchup=False,
    max_active_runs=1,
    tags=settings.CALIBRATION_TAGS,
    doc_md=__doc__,
    # The one line the DAG list shows (issue 35); doc_md is the whole story on the DAG's page.
    description=("Make a new baseline version: train a reference commit N times, propose means and thresholds, a "
                 "person approves the promotion."),
    default_args=settings.DEFAULT_ARGS,
    params={
        "commit": Param(settings.DEFAULT_COMMIT, type="string", title="Reference commit",
                        description="The commit whose runs become the baseline: branch, tag or SHA in the nodes' "
                                    "XTuner checkout (letters, digits and . _ / + -).",
                        minLength=1, maxLength=200, pattern=r"^[A-Za-z0-9][A-Za-z0-9._/+-]*(?![\s\S])"),
        "suites": Param(list(engines.default_suites()), type="array", title="Suites",
                        description="The suites to calibrate.",
                        items={"type": "string", "enum": list(engines.known_suites())},
                        values_display=engines.suite_titles(), minItems=1, uniqueItems=True),
        "runs": Param(None, type=["null", "integer"], title="Runs per suite (N)",
                      description="How many runs each suite's baseline averages: at least 2. Empty: the N of "
                                  "the suite's shipped baseline (the runbook's: GRPO 5, OPD 3).", minimum=2,
                      maximum=20),
        "nodes": Param(settings.DEFAULT_NODE_CONN_ID, type="string", title="GPU node(s) (SSH connection ids)",
                       description="One or more Airflow SSH connection ids, comma separated, e.g. node_a,node_b: "
                                   "the runs are spread over them, one training per node at a time.",
                       maxLength=1000, pattern=placement.NODE_LIST_PATTERN),
    },
)
def rl_baseline_calibration():
    @task(**settings.SHORT_SSH_TASK_ARGS)
    def plan(params=None, run_id=None):
        return calibration.plan(params, run_id)

    @task(**settings.SHORT_SSH_TASK_ARGS)
    def fetch_runs(trainings, run_id=None):
        return calibration.fetch_runs(trainings, run_id)

    @task(**settings.LOCAL_TASK_ARGS)
    def propose(trainings, run_id=None):
        return calibration.propose(trainings, run_id)

    @task(**settings.LOCAL_TASK_ARGS)
    def promote(proposal, run_id=None, ti=None):
        return calibration.promote(proposal, ti.xcom_pull(task_ids="approve_promotion"), run_id)

    # A teardown (see rl_accuracy_verification): it also runs when the run is marked failed by hand.
    @task(**settings.CLEANUP_TASK_ARGS)
    def cleanup(run_id=None, ti=None):
        # Pulled, not passed: cleanup also runs when plan failed (nothing to clean then).
        return calibration.cleanup(ti.xcom_pull(task_ids="plan"), run_id)

    # A run ended by hand before its promotion never reads success (hand_end: Airflow would call it one).
    @task(task_id=settings.FINAL_STATE_TASK, **settings.LOCAL_TASK_ARGS)
    def final_state(ti=None):
        log.info("%s", hand_end.final_state(hand_end.run_task_states(ti), ("fetch_runs", "propose",
                                                                          "approve_promotion"),
                                            approvals=[("approve_promotion", "promote")]))

    trainings = plan()
    train = operators.SuiteTrainingOperator.partial(task_id=settings.CALIBRATION_TRAINING_TASK, pool=POOL,
                                                     **settings.TRAINING_TASK_ARGS).expand_kwargs(trainings)
    fetched = fetch_runs(trainings)
    proposal = propose(trainings)
    choices = engines.threshold_choices()
    approve = ApprovalOperator(task_id="approve_promotion", subject="Promote the calibrated baseline?",
                               body="{{ ti.xcom_pull(task_ids='propose')['markdown'] }}",
                               params={"thresholds": Param(
                                   choices[0] if choices else None, type=["string", "null"], enum=[*choices, None],
                                   title="Thresholds of the new version",
                                   description="Which thresholds a golden-table proposal is promoted with: the "
                                               "runbook's (max deviation x 1.5) or those that hold a 5% false "
                                               "alarm per verification for these N runs (see the proposal).")})
    chain(train, fetched, proposal, approve, promote(proposal))
    cleaned = cleanup().as_teardown()
    chain([trainings, train, fetched], cleaned)
    chain(cleaned, final_state().as_teardown(on_failure_fail_dagrun=True))


rl_baseline_calibration()
