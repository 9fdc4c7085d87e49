"""
# RL accuracy verification (GRPO + OPD)

Verifies that a commit of the XTuner checkout on the GPU node keeps GRPO and OPD RL training
accuracy aligned with the baselines, following the team's runbook:

1. **resolve_commit** — clean per-run git worktree at `commit` on the node; full SHA recorded.
2. **check_prerequisites** — every input of every selected suite checked in one SSH round trip.
3. **experiment_card** + **approve** — a human approves the card (目标 / 判读标准 / 最小规模 / 前置条件).
   Scheduled runs proceed on a standing approval of the same card, verified against the recorded
   human response that granted it; an unanswered card ends the run NOT APPROVED (timed out) before
   the next scheduled run is due.
4. **run_grpo / run_opd** — detached, deferrable SSH jobs, one training per node at a time (the node's
   pool, chosen per run by the cluster policy `rl_verify.orchestration.policy`); suites on different nodes in parallel.
5. **fetch_* / compare_*** — trackers archived, compared per metric (GRPO through the checkout's own
   `check_rl_result`; OPD at every eval point against the golden table).
6. **report** then **verdict** — PASS/FAIL report in the record store; the run fails on FAIL.
7. **cleanup** — after the node's tasks end: on any failure `ray stop --force`, the run's processes
   killed (Slurm jobs cancelled), logs kept; on success it checks and says that the node is clean. A teardown:
   a run marked failed by hand, even while no trigger watches its jobs, still stops them; **final_state** then
   keeps that run failed (it has no verdict; Airflow would call a run whose every leaf was skipped a success).

Params: `commit` (branch, tag or SHA), `suites`, `node` (SSH connection id with a pinned host key, or
one per suite: `grpo=node_a,opd=node_b`),
`early_abort` (default on: a suite whose FAIL is certain while it trains is stopped there),
`repeats`, `baseline_versions`, and `bisection` (set only by a bisection's probes).

Asset events: a PASS emits `x-rl-verify://verified-commit` (sha, suites, baseline versions, report link);
a scheduled run whose FAIL reproduced in the accuracy class, with a verified PASS of its suites in the
record, emits `x-rl-verify://reproduced-fail`, on which `rl_regression_bisect` is scheduled.
"""

from __future__ import annotations

import pendulum
from airflow.sdk import CronTriggerTimetable, dag

from rl_verify import settings
from rl_verify.orchestration import verification_dag

# A malformed RL_VERIFY_* setting or suite spec is this DAG's import error, naming each one and its fix.
settings.raise_problems()


@dag(
    dag_id=settings.DAG_ID,
    schedule=CronTriggerTimetable(settings.SCHEDULE, timezone=settings.TIMEZONE) if settings.SCHEDULE else None,
    start_date=pendulum.datetime(*settings.DAGS_START_DATE, tz=settings.TIMEZONE),
    catchup=False,
    # One at a time: a tick that comes while a run waits or trains is skipped and named in the next card.
    max_active_runs=1,
    tags=settings.TAGS,
    doc_md=__doc__,
    # The one line the DAG list shows (issue 35); doc_md is the whole story on the DAG's page.
    description=("Does an XTuner commit keep GRPO and OPD RL accuracy on the baselines? Card, approval, training on "
                 "the GPU node, report with verdict and next step. Nightly and on demand."),
    default_args=settings.DEFAULT_ARGS,
    params=verification_dag.params(),
)
def rl_accuracy_verification():
    verification_dag.build()


rl_accuracy_verification()
