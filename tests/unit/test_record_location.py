"""Where a run's record lives is decided in one place (``store.record.record_dag``): a bisection's probe keeps
its record with the verification's, keyed by its run key, whatever code path reads or writes it. Issue 30: the
training operator built a probe's record path from ``dag_run.dag_id`` (``rl_accuracy_probe``), so its
``abort.json`` landed where compare never looks and its live check found no golden table."""

from __future__ import annotations

import ast
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from rl_verify import settings
from rl_verify.core.names import run_key
from rl_verify.engines import load_suite
from rl_verify.orchestration import operators, training_job
from rl_verify.store import record
from rl_verify.store.baselines import RECORD_FOLDER

REPO = Path(__file__).resolve().parents[2]
PROBE_RUN = f"{settings.PROBE_RUN_PREFIX}manual__bisect__{'a' * 12}__0"


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setattr(settings, "RECORD_ROOT", str(tmp_path))
    return tmp_path


def _context(dag_id: str, run_id: str = PROBE_RUN) -> dict:
    return {"run_id": run_id, "dag_run": SimpleNamespace(dag_id=dag_id, run_type="manual")}


@pytest.mark.parametrize("dag_id, folder", [
    (settings.PROBE_DAG_ID, settings.DAG_ID), (settings.DAG_ID, settings.DAG_ID), (None, settings.DAG_ID),
    (settings.BISECT_DAG_ID, settings.BISECT_DAG_ID), (settings.CALIBRATION_DAG_ID, settings.CALIBRATION_DAG_ID)])
def test_every_record_path_of_a_run_is_in_the_folder_its_dag_keeps_records_in(store, dag_id, folder):
    key = run_key(PROBE_RUN)
    assert record.record_dag(dag_id) == folder
    assert str(record.run_store(PROBE_RUN, dag_id=dag_id).path).endswith(f"/{folder}/{key}")
    assert record.location(PROBE_RUN, dag_id=dag_id) == f"{store.resolve()}/{folder}/{key}"
    with record.workspace(PROBE_RUN, parts=[], dag_id=dag_id) as local:
        assert local.parts[-2:] == (folder, key)


def test_a_probe_writes_and_reads_the_same_files_as_the_verification_tasks_of_its_run(store):
    record.put_json(PROBE_RUN, "grpo/abort.json", {"certain": True}, dag_id=settings.PROBE_DAG_ID)
    assert record.get_json(PROBE_RUN, "grpo/abort.json") == {"certain": True}  # compare's default: the verification's
    assert not (store / settings.PROBE_DAG_ID).exists()


def test_a_probes_early_abort_is_recorded_where_its_comparison_reads_it(store):
    training_job.record_early_abort(_context(settings.PROBE_DAG_ID), "grpo", {"certain": True, "step": 18},
                                  applied=True)
    path = store / settings.DAG_ID / run_key(PROBE_RUN) / "grpo" / "abort.json"
    assert json.loads(path.read_text()) == {"certain": True, "step": 18, "applied": True}


def test_a_repeat_inside_a_probe_reads_the_stop_early_its_gate_wrote(store):
    op = operators.SuiteTrainingOperator(task_id="run_grpo__r1", suite="grpo", resolved={}, attempt=1)
    record.put_json(PROBE_RUN, f"{op.job_name}/{settings.STOP_EARLY_FILE}", {"mismatch/mismatch_k3_kl": [1.0]})
    assert op._confirms(_context(settings.PROBE_DAG_ID)) == {"mismatch/mismatch_k3_kl": [1.0]}


def test_a_probes_live_check_reads_the_golden_table_of_its_runs_baseline_version(store, monkeypatch):
    spec = load_suite("opd")
    monkeypatch.setattr(training_job.node, "read_file", lambda client, where, limit: (1, b""))  # no baseline tracker
    golden = (REPO / "include/rl_verify/suites/data" / spec.data).read_bytes()
    folder = store / settings.DAG_ID / run_key(PROBE_RUN) / "opd" / RECORD_FOLDER
    folder.mkdir(parents=True)
    (folder / "golden.json").write_bytes(golden)
    live = training_job.live_check_config(spec, client=None, version={"files": ["golden.json"], "label": "v1"},
                                  work_dir="/w", early_abort=True, context=_context(settings.PROBE_DAG_ID))
    assert live["check"] is not None, live["note"]


def _record_api_calls(tree: ast.AST) -> list[ast.Call]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
            and isinstance(n.func.value, ast.Name) and n.func.value.id == "record"]


def _names_a_dag(node: ast.AST) -> bool:
    return any(str(getattr(n, "id", getattr(n, "attr", ""))).lower().endswith("dag_id") for n in ast.walk(node))


def _joins_root_with_a_dag(node: ast.AST) -> bool:
    """``store_root(...) / <anything naming a DAG id>``: a run's record path built by hand."""
    return (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div) and isinstance(node.left, ast.Call)
            and getattr(node.left.func, "attr", getattr(node.left.func, "id", None)) == "store_root"
            and _names_a_dag(node.right))


def test_no_code_path_builds_a_record_path_of_its_own():
    """Only ``store/record.py`` joins the store's root with a DAG's folder; every other module names the run's DAG
    to the record API, which maps it (``record_dag``). A path built from ``dag_run.dag_id`` by hand, or a DAG id
    chosen by a module of its own (``X if dag_id == PROBE_DAG_ID else Y``), fails here."""
    offenders = []
    for path in [*(REPO / "include").rglob("*.py"), *(REPO / "dags").glob("*.py"), *(REPO / "plugins").glob("*.py")]:
        if path == REPO / "include/rl_verify/store/record.py":
            continue
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if _joins_root_with_a_dag(node):
                offenders.append(f"{path.relative_to(REPO)}:{node.lineno} joins store_root() with a DAG's folder")
        for call in _record_api_calls(tree):
            for kw in call.keywords:
                if kw.arg == "dag_id" and isinstance(kw.value, ast.IfExp):
                    offenders.append(f"{path.relative_to(REPO)}:{call.lineno} chooses the record's DAG itself")
    assert offenders == []


def test_the_scan_above_finds_a_hand_built_record_path():
    bad = ast.parse("p = record.store_root() / context['dag_run'].dag_id / key\n"
                    "record.put_json(r, 'x', {}, dag_id=settings.DAG_ID if d == P else d)\n")
    joins = [n for n in ast.walk(bad) if _joins_root_with_a_dag(n)]
    chooses = [kw for c in _record_api_calls(bad) for kw in c.keywords if isinstance(kw.value, ast.IfExp)]
    assert joins and chooses
