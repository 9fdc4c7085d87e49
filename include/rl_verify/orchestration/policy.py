"""Airflow cluster policy of rl-verify: each training takes the pool of the node it actually uses.

Pools are fixed when a DAG is parsed, but the node is a param chosen per run. Airflow's documented
``task_instance_mutation_hook`` runs in the scheduler when a run's task instances are created or
cleared, with the run at hand: it sets ``run_<suite>`` to the pool of the node the run's ``node``
param names for that suite. Scheduled runs carry no conf and keep the default node's
pool that the DAG file set. Registered by ``plugins/airflow_local_settings.py`` (Airflow puts the
plugins folder on ``sys.path``). Not through an ``airflow.policy`` entry point: Airflow 3.3 applies
an entry-point policy when a task instance is cleared but not when a run's task instances are
created (it treats the hook as a no-op unless ``airflow_local_settings`` defines one).
"""

from __future__ import annotations

from typing import Any

from airflow.policies import hookimpl

from rl_verify import settings
from rl_verify.engines import default_suites
from rl_verify.node import placement

#: DAGs whose node tasks are placed by the run's ``node`` param.
PLACED_DAGS = (settings.DAG_ID, settings.PROBE_DAG_ID)


@hookimpl
def task_instance_mutation_hook(task_instance: Any, dag_run: Any) -> None:
    """Route the run's trainings to their nodes' pools; leave every other task alone."""
    if dag_run is not None and task_instance.dag_id == settings.CALIBRATION_DAG_ID:
        _calibration_pool(task_instance, dag_run.conf or {})
    if dag_run is None or task_instance.dag_id not in PLACED_DAGS:
        return
    conf = dag_run.conf or {}
    if "node" not in conf:
        return
    suites = conf.get("suites") or list(default_suites())
    if isinstance(suites, str):
        suites = [s.strip() for s in suites.split(",") if s.strip()]
    pool = placement.task_pool(task_instance.task_id, conf["node"], suites if isinstance(suites, list) else [])
    if pool is not None:
        task_instance.pool = pool


def _calibration_pool(task_instance: Any, conf: dict) -> None:
    """The i-th calibration training takes the pool of the i-th node of ``calibration_nodes``."""
    index = getattr(task_instance, "map_index", -1)
    if task_instance.task_id != settings.CALIBRATION_TRAINING_TASK or index is None or index < 0:
        return
    if "nodes" not in conf:
        return
    try:
        nodes = placement.node_list(conf["nodes"])
    except ValueError:
        return  # the plan task refuses the param and names it; nothing is trained
    task_instance.pool = placement.node_pool(placement.calibration_nodes(nodes, index + 1)[index])
