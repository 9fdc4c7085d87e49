"""Where each suite trains (the ``node`` param) and the pool each run's training takes (cluster policy)."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest

from rl_verify.node import placement
from rl_verify.node.remote import BadInput

SUITES = ["grpo", "opd"]


def test_one_connection_id_places_every_suite_on_that_node():
    assert placement.suite_nodes("rl_gpu_node", SUITES) == {"grpo": "rl_gpu_node", "opd": "rl_gpu_node"}
    assert placement.describe({"grpo": "a", "opd": "a"}) == "a"


def test_one_node_per_suite_places_each_suite_on_its_own_node_in_suite_order():
    chosen = placement.suite_nodes("opd=gpu_b,grpo=gpu_a", SUITES)
    assert list(chosen.items()) == [("grpo", "gpu_a"), ("opd", "gpu_b")]
    assert placement.describe(chosen) == "grpo on gpu_a, opd on gpu_b"
    assert placement.nodes_in_order(chosen) == ["gpu_a", "gpu_b"]


@pytest.mark.parametrize("value,said", [
    ("grpo=gpu_a", "no node for selected suite 'opd'"),
    ("grpo=gpu_a,opd=gpu_b,sft=gpu_c", "'sft' is not a selected suite"),
    ("grpo=gpu_a,grpo=gpu_b", "'grpo' is given twice"),
    ("grpo=gpu a,opd=gpu_b", "'gpu a' is not a connection id"),
    ("gpu;id", "must be an Airflow connection id"),
    ("", "param 'node' is empty"),
])
def test_a_bad_node_param_is_refused_naming_the_problem_and_the_form(value, said):
    with pytest.raises(BadInput) as err:
        placement.suite_nodes(value, SUITES)
    assert said in str(err.value) and "grpo=node_a,opd=node_b" in str(err.value)


@pytest.mark.parametrize("value", ["rl_gpu_node", "grpo=a,opd=b.c-1", "opd=x"])
def test_the_forms_pattern_accepts_what_the_task_accepts(value):
    assert re.match(placement.NODE_PARAM_PATTERN, value)


@pytest.mark.parametrize("value", ["a b", "grpo=a;id", "grpo=", "=a", "a\n", "grpo=a,,opd=b"])
def test_the_forms_pattern_refuses_unsafe_values(value):
    assert not re.match(placement.NODE_PARAM_PATTERN, value)


def test_each_training_takes_the_pool_of_the_node_its_suite_uses():
    value = "grpo=gpu_a,opd=gpu.b"
    assert placement.task_pool("run_grpo", value, SUITES) == "rl_node_gpu_a"
    assert placement.task_pool("run_opd", value, SUITES) == "rl_node_gpu_b"
    assert placement.task_pool("cleanup", value, SUITES) is None  # runs whatever happened, even for a bad node
    assert placement.task_pool("report", value, SUITES) is None
    assert placement.task_pool("run_opd", "grpo=gpu_a", SUITES) is None  # unparsable: resolve_commit fails the run


def _ti(task_id, pool="rl_node_rl_gpu_node", dag_id="rl_accuracy_verification"):
    return SimpleNamespace(task_id=task_id, pool=pool, dag_id=dag_id)


def test_the_cluster_policy_routes_a_runs_training_to_its_nodes_pool_and_nothing_else():
    from rl_verify.orchestration.policy import task_instance_mutation_hook

    run = SimpleNamespace(conf={"node": "grpo=gpu_a,opd=gpu_b", "suites": SUITES})
    tis = {t: _ti(t) for t in ("run_grpo", "run_opd", "fetch_opd", "cleanup")}
    for ti in tis.values():
        task_instance_mutation_hook(task_instance=ti, dag_run=run)
    assert {t: ti.pool for t, ti in tis.items()} == {
        "run_grpo": "rl_node_gpu_a", "run_opd": "rl_node_gpu_b",
        "fetch_opd": "rl_node_rl_gpu_node", "cleanup": "rl_node_rl_gpu_node"}
    scheduled, other_dag, early = _ti("run_opd"), _ti("run_opd", dag_id="other"), _ti("run_opd")
    task_instance_mutation_hook(task_instance=scheduled, dag_run=SimpleNamespace(conf={}))
    task_instance_mutation_hook(task_instance=other_dag, dag_run=run)
    task_instance_mutation_hook(task_instance=early, dag_run=None)
    assert scheduled.pool == other_dag.pool == early.pool == "rl_node_rl_gpu_node"


def test_airflow_loads_the_policy_from_the_local_settings_in_the_plugins_folder():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "plugins" / "airflow_local_settings.py"
    spec = importlib.util.spec_from_file_location("airflow_local_settings", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    from rl_verify.orchestration.policy import task_instance_mutation_hook

    assert module.task_instance_mutation_hook is task_instance_mutation_hook
    assert module.__all__ == ["task_instance_mutation_hook"]


# ----------------------------------------------------------------------------- calibration

@pytest.mark.parametrize("value,nodes", [("gpu_a", ["gpu_a"]), ("gpu_a,gpu_b", ["gpu_a", "gpu_b"]),
                                         ("gpu_a, gpu_b,gpu_a", ["gpu_a", "gpu_b"])])
def test_the_calibration_nodes_param_is_one_or_more_connection_ids(value, nodes):
    assert placement.node_list(value) == nodes


@pytest.mark.parametrize("value", ["", None, "gpu_a;id", "gpu a", "gpu_a,,gpu_b"])
def test_a_bad_calibration_nodes_param_names_the_param_and_the_form(value):
    with pytest.raises(BadInput, match=r"param 'nodes'.*comma"):
        placement.node_list(value)


def test_calibration_runs_go_round_robin_over_the_nodes_and_the_policy_gives_each_its_pool():
    from rl_verify.orchestration.policy import task_instance_mutation_hook

    assert placement.calibration_nodes(["a", "b"], 5) == ["a", "b", "a", "b", "a"]
    assert placement.calibration_nodes(["a"], 3) == ["a", "a", "a"]
    run = SimpleNamespace(conf={"nodes": "gpu_a,gpu_b"})
    pools = []
    for index in range(3):
        ti = _ti("train", dag_id="rl_baseline_calibration")
        ti.map_index = index
        task_instance_mutation_hook(task_instance=ti, dag_run=run)
        pools.append(ti.pool)
    assert pools == ["rl_node_gpu_a", "rl_node_gpu_b", "rl_node_gpu_a"]
    other = _ti("plan", dag_id="rl_baseline_calibration")
    other.map_index = -1
    task_instance_mutation_hook(task_instance=other, dag_run=run)
    assert other.pool == "rl_node_rl_gpu_node"
