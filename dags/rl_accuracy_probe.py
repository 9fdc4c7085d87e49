"""
# RL accuracy verification: a bisection's probe

The verification of one commit (`rl_accuracy_verification`'s very tasks: resolve_commit,
check_prerequisites, experiment_card + approve, the trainings with early abort and the confirmation's
repeats, fetch, compare, report, verdict, cleanup), run by a bisection (`rl_regression_bisect`) for each
commit it probes. A DAG of its own so that probes run at once, one per node (each node's one-slot pool
keeps one training per node), while the nightly stays one run at a time.

Its card is approved by the bisection's one approval (param `bisection`, its run id), verified against
Airflow's record of that approval and the bisection's plan; a probe of a commit outside the approved
range is refused before anything is launched. Its record, report and history live with the
verification's: a probe is a verification.
"""

from __future__ import annotations

import pendulum
from airflow.sdk import dag

from rl_verify import settings
from rl_verify.orchestration import verification_dag

settings.raise_problems()


@dag(
    dag_id=settings.PROBE_DAG_ID,
    schedule=None,
    start_date=pendulum.datetime(*settings.DAGS_START_DATE, tz=settings.TIMEZONE),
    catchup=False,
    max_active_runs=settings.MAX_ACTIVE_PROBES,
    tags=settings.PROBE_TAGS,
    doc_md=__doc__,
    # The one line the DAG list shows (issue 35); doc_md is the whole story on the DAG's page.
    description=("One probe of a bisection: a verification of one commit (early abort, repeats, report, cleanup), "
                 "started by rl_regression_bisect, never by hand."),
    default_args=settings.DEFAULT_ARGS,
    params=verification_dag.params(),
)
def rl_accuracy_probe():
    verification_dag.build()


rl_accuracy_probe()
