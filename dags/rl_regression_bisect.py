"""
# Bisection of a reproduced FAIL to its culprit commit

Names the commit of `good..bad` (first-parent history of the node's XTuner checkout) that caused a
reproduced FAIL, with probes in parallel over the GPU nodes:

1. **plan_range**: params validated; the range listed on the first node (good must be an ancestor of
   bad, at most `max_commits` commits); ends the record already decided (same commit, baseline version
   and experiment fingerprint) are not re-checked.
2. **bisection_card** + **approve**: one approval for the whole bisection: the range (each commit's SHA
   and subject), the probes at most, the nodes and the GPU-hours at the runbook's scale. A standing
   approval of the nightly does **not** cover a bisection: its cost (up to a dozen trainings) is a
   different decision. Unanswered, the run ends NOT APPROVED and nothing is launched.
3. **bisect**: each probe is a normal `rl_accuracy_verification` run of one commit (early abort, the
   confirmation's repeats, its own report and cleanup), pre-approved by this approval. With P nodes,
   P probes split the open range into P+1 parts; a commit that cannot be checked out or launched is
   skipped (the culprit is then a range); probes that can no longer change the answer are stopped.
4. **publish_culprit**: the culprit's asset event `x-rl-verify://culprit`; the result page (culprit,
   evidence table, plot) is the run's "Bisection" view.

Started automatically by a scheduled verification's reproduced FAIL (asset `x-rl-verify://reproduced-fail`,
when the record holds a verified PASS of the suite), or by hand with `good`, `bad`, `suites`, `nodes`.
"""

from __future__ import annotations

import pendulum
from airflow.sdk import Asset, Param, chain, dag, task

from rl_verify import engines, settings
from rl_verify.orchestration import approval, asset_events, bisection, probes

settings.raise_problems()
SUITES = engines.known_suites()


@dag(
    dag_id=settings.BISECT_DAG_ID,
    schedule=[Asset(settings.REPRODUCED_FAIL_ASSET)],
    start_date=pendulum.datetime(*settings.DAGS_START_DATE, tz=settings.TIMEZONE),
    catchup=False,
    max_active_runs=1,
    tags=settings.BISECT_TAGS,
    doc_md=__doc__,
    # The one line the DAG list shows (issue 35); doc_md is the whole story on the DAG's page.
    description=("Which commit broke it: bisect between a verified PASS and a reproduced FAIL with verification probes"
                 " on the GPU nodes, one approval."),
    default_args=settings.DEFAULT_ARGS,
    params={
        "good": Param("", type="string", title="Good commit (the last verified PASS)",
                      description="Branch, tag or SHA of the node's checkout that passes; an ancestor of bad.",
                      maxLength=200),
        "bad": Param("", type="string", title="Bad commit (the reproduced FAIL)",
                     description="Branch, tag or SHA of the node's checkout that fails.", maxLength=200),
        "suites": Param([], type="array", title="Suites", items={"type": "string", "enum": list(SUITES)},
                        description="The failing suite(s) to probe each commit with.", uniqueItems=True),
        "metrics": Param([], type="array", title="Metric(s) to follow (optional)", items={"type": "string"},
                         description="Tracker metrics whose error the evidence table and plot follow, e.g. "
                                     "eval/gsm8k/acc; empty: each probe's first breached metric."),
        "nodes": Param(settings.BISECT_NODES, type="string", title="GPU nodes (SSH connection ids)",
                       description="Comma-separated SSH connection ids, one probe at a time on each, e.g. "
                                   "rl_gpu_node,rl_gpu_node_b.", maxLength=1000),
        "max_commits": Param(settings.BISECT_MAX_COMMITS, type="integer", minimum=1,
                             maximum=settings.BISECT_MAX_COMMITS, title="Most commits after good"),
        "repeats": Param(settings.SCHEDULED_REPEATS, type="integer", minimum=0, maximum=settings.MAX_REPEATS,
                         title="Extra runs per probe to confirm a doubtful FAIL"),
    },
)
def rl_regression_bisect():
    @task(**settings.SHORT_SSH_TASK_ARGS)
    def plan_range(params=None, run_id=None, triggering_asset_events=None):
        return bisection.plan_range(params, run_id, asset_events.triggering_extra(triggering_asset_events))

    @task(**settings.LOCAL_TASK_ARGS)
    def bisection_card(plan):
        return bisection.card(plan)

    @task(outlets=[Asset(settings.CULPRIT_ASSET)], **settings.LOCAL_TASK_ARGS)
    def publish_culprit(result, outlet_events=None):
        asset_events.announce(outlet_events, Asset(settings.CULPRIT_ASSET), asset_events.culprit_extra(result))

    plan = plan_range()
    card = bisection_card(plan)
    approve = approval.CardApprovalOperator(task_id=settings.BISECT_APPROVE_TASK, card=card, standing_offered=False,
                                   subject="Bisection {{ ti.xcom_pull(task_ids='plan_range')['good'] }}.."
                                           "{{ ti.xcom_pull(task_ids='plan_range')['bad'] }}: approve its probes")
    result = probes.BisectOperator(task_id=settings.BISECT_TASK, plan=plan, **settings.BISECT_TASK_ARGS)
    chain(approve, result)
    publish_culprit(result.output)


rl_regression_bisect()
