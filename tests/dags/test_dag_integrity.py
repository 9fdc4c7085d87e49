"""The DAG file imports cleanly, looks nothing up at parse time, and is wired as designed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DAG_ID = "rl_accuracy_verification"
CALIBRATION_DAG_ID = "rl_baseline_calibration"
BISECT_DAG_ID = "rl_regression_bisect"
PROBE_DAG_ID = "rl_accuracy_probe"

# Parses the DAG folder in a fresh interpreter with connection and Variable lookups booby-trapped,
# then prints what the tests check. A fresh process is the only honest way to see parse-time imports.
PROBE = r"""
import json, sys, time
import airflow.sdk
from airflow.sdk import BaseHook, Variable
def boom(*a, **k):
    raise RuntimeError("lookup at parse time")
BaseHook.get_connection = classmethod(boom)
Variable.get = staticmethod(boom)
import socket
socket.socket.connect = boom
from airflow.dag_processing.dagbag import DagBag
t = time.perf_counter()
bag = DagBag(sys.argv[1])
elapsed = time.perf_counter() - t
dag = bag.dags.get("rl_accuracy_verification")
def row(t):
    rule = t.trigger_rule.value if hasattr(t.trigger_rule, "value") else t.trigger_rule
    return {"trigger_rule": str(rule), "teardown": t.is_teardown, "setup": t.is_setup,
            "fails_run": bool(t.is_teardown and t.on_failure_fail_dagrun),
            "retries": t.retries, "pool": t.pool, "upstream": sorted(t.upstream_task_ids)}
tasks = {t.task_id: row(t) for t in (dag.tasks if dag else [])}
heavy = sorted({m.split(".")[0] for m in sys.modules if m.split(".")[0] in ("pandas", "matplotlib", "numpy")})
print(json.dumps({"errors": {k: str(v) for k, v in bag.import_errors.items()}, "tasks": tasks,
                  "tags": sorted(dag.tags) if dag else [], "params": sorted(dag.params.keys()) if dag else [],
                  "max_active_runs": dag.max_active_runs if dag else None, "catchup": dag.catchup if dag else None,
                  "doc_md": bool(dag and dag.doc_md), "heavy": heavy, "seconds": elapsed,
                  "dag_ids": sorted(bag.dag_ids),
                  "calibration": {t.task_id: {"trigger_rule": str(getattr(t.trigger_rule, "value", t.trigger_rule)),
                                              "upstream": sorted(t.upstream_task_ids), "pool": t.pool,
                                              "mapped": type(t).__name__ == "MappedOperator",
                                              "teardown": t.is_teardown,
                                              "fails_run": bool(t.is_teardown and t.on_failure_fail_dagrun)}
                                  for t in bag.dags["rl_baseline_calibration"].tasks}
                                 if "rl_baseline_calibration" in bag.dags else {},
                  "calibration_params": sorted(bag.dags["rl_baseline_calibration"].params.keys())
                                        if "rl_baseline_calibration" in bag.dags else [],
                  "bisect": {t.task_id: {"trigger_rule": str(getattr(t.trigger_rule, "value", t.trigger_rule)),
                                         "upstream": sorted(t.upstream_task_ids), "retries": t.retries,
                                         "outlets": sorted(getattr(o, "name", str(o)) for o in t.outlets),
                                         "standing_offered": getattr(t, "standing_offered", None)}
                             for t in bag.dags["rl_regression_bisect"].tasks}
                            if "rl_regression_bisect" in bag.dags else {},
                  "probe": {t.task_id: row(t) for t in bag.dags["rl_accuracy_probe"].tasks}
                           if "rl_accuracy_probe" in bag.dags else {},
                  "probe_dag": {"params": sorted(bag.dags["rl_accuracy_probe"].params.keys()),
                                "max_active_runs": bag.dags["rl_accuracy_probe"].max_active_runs,
                                "schedule": type(bag.dags["rl_accuracy_probe"].timetable).__name__,
                                "doc_md": bool(bag.dags["rl_accuracy_probe"].doc_md)}
                               if "rl_accuracy_probe" in bag.dags else {},
                  "bisect_dag": {"params": sorted(bag.dags["rl_regression_bisect"].params.keys()),
                                 "schedule": [a.name for a in
                                              bag.dags["rl_regression_bisect"].timetable.asset_condition.objects],
                                 "tags": sorted(bag.dags["rl_regression_bisect"].tags),
                                 "doc_md": bool(bag.dags["rl_regression_bisect"].doc_md),
                                 "max_active_runs": bag.dags["rl_regression_bisect"].max_active_runs}
                                if "rl_regression_bisect" in bag.dags else {},
                  "outlets": {t.task_id: sorted(getattr(o, "name", str(o)) for o in t.outlets)
                              for t in (dag.tasks if dag else []) if t.outlets},
                  "param_help": {k: {"title": p.schema.get("title"), "description": p.description}
                                 for k, p in (dag.params.items() if dag else [])}}))
"""


@pytest.fixture(scope="module")
def parsed(tmp_path_factory):
    home = tmp_path_factory.mktemp("airflow_home")
    env = {**os.environ, "AIRFLOW_HOME": str(home), "AIRFLOW__CORE__LOAD_EXAMPLES": "False"}
    out = subprocess.run([sys.executable, "-c", PROBE, str(ROOT / "dags")], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_dag_imports_without_errors_and_without_lookups(parsed):
    assert parsed["errors"] == {}
    assert parsed["dag_ids"] == [PROBE_DAG_ID, DAG_ID, CALIBRATION_DAG_ID, BISECT_DAG_ID]
    assert parsed["tasks"] and parsed["calibration"] and parsed["bisect"]


def test_no_heavy_imports_at_parse_time(parsed):
    assert parsed["heavy"] == [], f"imported at parse time: {parsed['heavy']}"


def test_dag_shape_matches_the_spec(parsed):
    tasks = parsed["tasks"]
    repeats = {f"{kind}_{suite}-r{k}" for suite in ("grpo", "opd") for k in (1, 2, 3)
               for kind in ("repeat", "run", "fetch", "compare")}
    assert set(tasks) == {"resolve_commit", "check_prerequisites", "experiment_card", "approve",
                          "run_grpo", "fetch_grpo", "compare_grpo", "run_opd", "fetch_opd", "compare_opd",
                          "confirm_grpo", "confirm_opd", "report", "verdict", "cleanup", "final_state",
                          "announce_verified", "announce_reproduced_fail"} | repeats
    assert tasks["check_prerequisites"]["upstream"] == ["resolve_commit"]
    assert tasks["approve"]["upstream"] == ["experiment_card"]
    for suite in ("grpo", "opd"):
        # resolve_commit's output is the training operator's input (an XComArg), approval its gate
        assert tasks[f"run_{suite}"]["upstream"] == ["approve", "resolve_commit"]
        assert f"run_{suite}" in tasks[f"fetch_{suite}"]["upstream"]
        assert f"fetch_{suite}" in tasks[f"compare_{suite}"]["upstream"]
        # Each repeat slot: a gate after the previous run's comparison, then the same three tasks.
        previous = f"compare_{suite}"
        for k in (1, 2, 3):
            assert tasks[f"repeat_{suite}-r{k}"]["upstream"] == [previous]
            assert tasks[f"run_{suite}-r{k}"]["upstream"] == sorted(["resolve_commit", f"repeat_{suite}-r{k}"])
            assert f"fetch_{suite}-r{k}" in tasks[f"compare_{suite}-r{k}"]["upstream"]
            previous = f"compare_{suite}-r{k}"
        assert tasks[f"confirm_{suite}"]["upstream"] == [previous]
    assert tasks["report"]["upstream"] == ["cleanup", "confirm_grpo", "confirm_opd"]
    assert tasks["verdict"]["upstream"] == ["report"]
    # The asset events come from the report, whatever the verdict task does with a FAIL.
    assert tasks["announce_verified"]["upstream"] == tasks["announce_reproduced_fail"]["upstream"] == ["report"]
    assert parsed["outlets"] == {"announce_verified": ["x-rl-verify://verified-commit"],
                                 "announce_reproduced_fail": ["x-rl-verify://reproduced-fail"]}


def tasks_of(parsed, task_id):
    return parsed["tasks"][task_id]["upstream"]


def test_trigger_rules_as_designed(parsed):
    rules = {t: v["trigger_rule"] for t, v in parsed["tasks"].items()}
    # The cleanup is a teardown with no setup (all done, as all_done): it always says whether the node is clean (a
    # skipped task has no log), and a run marked failed by hand, which skips every task not yet started, runs it.
    assert rules["cleanup"] == "all_done_setup_success"
    cleanup, final = parsed["tasks"]["cleanup"], parsed["tasks"]["final_state"]
    assert cleanup["teardown"] and not cleanup["fails_run"]
    assert not any(t["setup"] for t in parsed["tasks"].values())
    # The last teardown counts for the run's state (a run ended by hand before its verdict never ends a success)
    # and only it: the verdict and the announcements stay leaves, the run's state theirs.
    assert final["teardown"] and final["fails_run"] and final["upstream"] == ["cleanup"]
    assert not any("final_state" in t["upstream"] for t in parsed["tasks"].values())
    assert rules["report"] == rules["verdict"] == "all_done"  # the report exists whatever failed
    # A fetch runs after a training that ran (success or failed) and is skipped after one that never ran
    # (rejected card, or an earlier task failed); its only upstream is the training.
    assert rules["fetch_grpo"] == rules["fetch_opd-r1"] == "one_done"
    assert tasks_of(parsed, "fetch_grpo") == ["run_grpo"] and tasks_of(parsed, "fetch_opd-r2") == ["run_opd-r2"]
    assert rules["compare_opd"] == rules["compare_grpo-r2"] == "none_skipped"  # a skipped fetch skips it
    assert rules["run_grpo"] == rules["approve"] == rules["run_opd-r1"] == "all_success"
    # A gate runs after a failed comparison (a first run's FAIL) and decides; a skipped comparison skips the
    # gate with no worker (and so every later repeat); a skipped repeat skips its fetch and compare; the
    # outcome is always written.
    assert rules["repeat_opd-r1"] == rules["repeat_grpo-r3"] == "none_skipped"
    assert rules["confirm_opd"] == rules["confirm_grpo"] == "all_done"
    assert set(parsed["tasks"]["cleanup"]["upstream"]) >= {"run_grpo", "run_opd", "fetch_grpo", "fetch_opd",
                                                          "run_opd-r3", "fetch_grpo-r2"}


def test_trainings_take_the_default_nodes_pool_and_are_not_blindly_retried(parsed):
    tasks = parsed["tasks"]
    # The default node's pool; a run that names other nodes gets theirs from rl_verify.orchestration.policy.
    assert tasks["run_grpo"]["pool"] == tasks["run_opd"]["pool"] == tasks["run_opd-r2"]["pool"] == "rl_node_rl_gpu_node"
    assert tasks["cleanup"]["pool"] == "default_pool"  # runs whatever happened, on every node of the run
    assert tasks["run_grpo"]["retries"] <= 1  # a retry re-attaches, never relaunches
    assert tasks["report"]["retries"] == 0 and tasks["verdict"]["retries"] == 0


def test_tags_params_and_scheduling(parsed):
    assert "rl-verify" in parsed["tags"]
    assert parsed["params"] == ["baseline_versions", "bisection", "commit", "early_abort", "lane", "node", "repeats",
                                "suites"]
    # One at a time: a tick that comes while a run waits or trains is skipped and named in the next card.
    assert parsed["max_active_runs"] == 1 and parsed["catchup"] is False and parsed["doc_md"]


def test_a_bisections_probe_is_the_verification_itself_under_a_dag_that_runs_one_probe_per_node_at_once(parsed):
    assert parsed["probe"] == parsed["tasks"]  # the very same tasks, trigger rules, retries, pools and wiring
    probe = parsed["probe_dag"]
    assert probe["params"] == parsed["params"] and probe["doc_md"]
    assert probe["schedule"] == "NullTimetable" and probe["max_active_runs"] == 8  # triggered by bisections only


def test_bisection_dag_is_scheduled_on_a_reproduced_fail_and_asks_one_approval_no_standing_one_covers(parsed):
    tasks, dag = parsed["bisect"], parsed["bisect_dag"]
    assert dag["schedule"] == ["x-rl-verify://reproduced-fail"] and dag["max_active_runs"] == 1 and dag["doc_md"]
    assert "rl-verify" in dag["tags"] and "bisection" in dag["tags"]
    assert dag["params"] == ["bad", "good", "max_commits", "metrics", "nodes", "repeats", "suites"]
    assert set(tasks) == {"plan_range", "bisection_card", "approve", "bisect", "publish_culprit"}
    assert tasks["bisection_card"]["upstream"] == ["plan_range"]
    assert tasks["approve"]["upstream"] == ["bisection_card"]
    assert tasks["bisect"]["upstream"] == ["approve", "plan_range"]
    assert tasks["publish_culprit"]["upstream"] == ["bisect"] and tasks["publish_culprit"]["outlets"] == [
        "x-rl-verify://culprit"]
    # Nothing is probed without a person's approval: a nightly's standing approval is never offered or used.
    assert tasks["approve"]["standing_offered"] is False
    assert tasks["bisect"]["retries"] == 0 and tasks["bisect"]["trigger_rule"] == "all_success"



def test_every_param_of_the_trigger_form_has_a_title_and_a_description_in_plain_words(parsed):
    for name, help_ in parsed["param_help"].items():
        assert help_["title"] and len(help_["description"] or "") > 40, (name, help_)
    assert "grpo: GRPO accuracy run" in parsed["param_help"]["suites"]["description"]
    assert "SSH connection" in parsed["param_help"]["node"]["description"]


def test_every_pulled_task_id_names_a_task_of_the_dag(parsed):
    """A task renamed without its pulls fails here, not at run time."""
    import re

    pulled = re.compile(r"""task_ids\s*=\s*["']([A-Za-z0-9_]+)["']""")
    sources = [*(ROOT / "dags").glob("*.py"), *(ROOT / "include" / "rl_verify").rglob("*.py")]
    named = {(path.name, m.group(1)) for path in sources for m in pulled.finditer(path.read_text())}
    assert named, "the scan found no xcom_pull(task_ids=...) at all"
    calibration = {"rl_baseline_calibration.py", "calibrate.py"}
    bisect = {"rl_regression_bisect.py"}
    assert {(f, t) for f, t in named if t not in (parsed["calibration"] if f in calibration else parsed["bisect"]
                                                  if f in bisect else parsed["tasks"])} == set()


def test_calibration_trains_mapped_runs_and_promotes_only_after_the_approval(parsed):
    tasks = parsed["calibration"]
    assert parsed["calibration_params"] == ["commit", "nodes", "runs", "suites"]
    assert tasks["train"]["mapped"] and tasks["train"]["upstream"] == ["plan"]
    assert tasks["train"]["pool"] == "rl_node_rl_gpu_node"  # the policy gives each run its node's pool
    assert tasks["fetch_runs"]["upstream"] == ["plan", "train"]
    assert tasks["approve_promotion"]["upstream"] == ["propose"]
    assert tasks["promote"]["upstream"] == ["approve_promotion", "propose"]
    # Cleanup runs whatever happened, after everything that touches a node, and when the run is marked failed
    # by hand (a teardown with no setup); final_state keeps such a run failed.
    assert tasks["cleanup"]["trigger_rule"] == "all_done_setup_success" and tasks["cleanup"]["teardown"]
    assert tasks["cleanup"]["upstream"] == ["fetch_runs", "plan", "train"]
    assert tasks["final_state"]["upstream"] == ["cleanup"] and tasks["final_state"]["fails_run"]


def test_every_task_id_the_package_knows_is_one_the_dags_name_their_tasks_with(parsed):
    """The package refers to tasks only through the names in rl_verify.settings, and the DAG files name
    their tasks with them: no package module knows a task id the DAGs do not have."""
    from rl_verify import settings

    tasks, calibration = set(parsed["tasks"]), set(parsed["calibration"])
    known = {settings.REPORT_TASK} | {
        name(suite, k) for suite in ("grpo", "opd") for k in range(settings.MAX_REPEATS + 1)
        for name in (settings.training_task, settings.fetch_task, settings.compare_task)}
    known |= {settings.repeat_gate_task(s, k) for s in ("grpo", "opd") for k in range(1, settings.MAX_REPEATS + 1)}
    known |= {settings.confirm_task(s) for s in ("grpo", "opd")}
    assert known <= tasks, known - tasks
    assert settings.CALIBRATION_TRAINING_TASK in calibration
    assert {settings.suite_of_training_task(t) for t in tasks} - {None} == {"grpo", "opd"}
