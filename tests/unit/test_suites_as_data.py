"""Suites are data: a new suite that reuses an engine is one spec file and its data file; a spec
naming an unknown engine or a missing data file is refused, naming the file and the field."""

from __future__ import annotations

import importlib.resources
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

import rl_verify
from rl_verify import card
from rl_verify import suite as suite_module
from rl_verify.cli import main
from rl_verify.suite import SpecError, _from_dict, available_suites, load_suite

PACKAGE = Path(rl_verify.__file__).parent
REPO = PACKAGE.parents[1]
NEW = "grpo_smoke"


@pytest.fixture()
def project_copy(tmp_path, monkeypatch):
    """dags/ and the rl_verify package copied under tmp_path, and the suite loader reading the copy.

    Tests that add a suite spec change the copy: the package itself is being parsed meanwhile by the
    Airflow stacks of end-to-end tests in the other pytest process, whose DAG a stray spec would break.
    """
    root = tmp_path / "project"
    shutil.copytree(PACKAGE, root / "include" / "rl_verify", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPO / "dags", root / "dags", ignore=shutil.ignore_patterns("__pycache__"))
    package = root / "include" / "rl_verify"
    monkeypatch.setattr(suite_module, "resources", SimpleNamespace(
        files=lambda name: package if name == "rl_verify" else importlib.resources.files(name)))
    return root


def _env(project: Path, **extra: str) -> dict[str, str]:
    """The environment of a subprocess that imports rl_verify from the copy (PYTHONPATH precedes the
    editable install's path)."""
    return {**os.environ, "PYTHONPATH": str(project / "include"), **extra}


@pytest.fixture()
def new_suite(project_copy):
    """A suite reusing the GRPO engine under another name, in the copied package."""
    raw = json.loads((PACKAGE / "suites" / "grpo.json").read_text())
    raw.update(name=NEW, title="GRPO smoke suite (temporary, test only)")
    (project_copy / "include" / "rl_verify" / "suites" / f"{NEW}.json").write_text(json.dumps(raw))
    return project_copy


def test_a_new_suite_is_one_spec_file_seen_by_the_loader_the_card_and_the_cli(new_suite, tmp_path, checker_dir):
    from conftest import dump_rows, grpo_rows

    assert NEW in available_suites()
    spec = load_suite(NEW)
    sections = card.card_sections([spec], [], "rl_gpu_node")
    assert any("GRPO smoke suite" in line for line in sections["判读标准 acceptance criteria"])
    base = dump_rows(tmp_path / "b.jsonl", grpo_rows())
    cur = dump_rows(tmp_path / "c.jsonl", grpo_rows())
    assert main(["compare", NEW, "--baseline", str(base), "--current", str(cur), "--checker-dir", str(checker_dir),
                 "--out", str(tmp_path / "out")]) == 0
    assert json.loads((tmp_path / "out" / "report.json").read_text())["suite"] == NEW


def test_a_new_suite_gets_its_tasks_and_param_value_in_the_dag(new_suite):
    probe = ("import json, importlib.util; spec = importlib.util.spec_from_file_location('d', "
             f"{str(new_suite / 'dags' / 'rl_accuracy_verification.py')!r}); "
             "m = importlib.util.module_from_spec(spec); "
             "spec.loader.exec_module(m); d = m.rl_accuracy_verification(); "
             "enum = d.params.get_param('suites').schema['items']['enum']; "
             "print(json.dumps({'tasks': sorted(d.task_ids), 'enum': enum}))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, cwd=new_suite,
                         env=_env(new_suite))
    assert out.returncode == 0, out.stderr[-2000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert {f"run_{NEW}", f"fetch_{NEW}", f"compare_{NEW}"} <= set(seen["tasks"]) and NEW in seen["enum"]


def test_a_spec_naming_an_unknown_engine_fails_dag_import_naming_the_file_and_the_engine(project_copy, tmp_path):
    raw = json.loads((PACKAGE / "suites" / "grpo.json").read_text())
    path = project_copy / "include" / "rl_verify" / "suites" / "dapo.json"
    path.write_text(json.dumps({**raw, "name": "dapo", "engine": "dapo"}))
    dags = project_copy / "dags"
    probe = ("import json; from airflow.dag_processing.dagbag import DagBag; "
             f"bag = DagBag({str(dags)!r}); "
             "print(json.dumps({k: str(v) for k, v in bag.import_errors.items()}))")
    env = _env(project_copy, AIRFLOW_HOME=str(tmp_path / "airflow_home"), AIRFLOW__CORE__LOAD_EXAMPLES="False")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120,
                         cwd=project_copy, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    errors = json.loads(out.stdout.strip().splitlines()[-1])
    assert sorted(errors) == [str(dags / "rl_accuracy_verification.py"), str(dags / "rl_baseline_calibration.py")]
    assert all(f"{path}: field 'engine': unknown engine 'dapo'" in e for e in errors.values())


def test_an_unknown_engine_is_refused_naming_the_file_and_the_engine():
    raw = json.loads((PACKAGE / "suites" / "grpo.json").read_text())
    expected = r"/x/dapo\.json: field 'engine': unknown engine 'dapo'; known engines: grpo, opd"
    with pytest.raises(SpecError, match=expected):
        _from_dict({**raw, "engine": "dapo"}, "/x/dapo.json")


def test_a_missing_data_file_is_refused_naming_the_file_and_the_field():
    raw = json.loads((PACKAGE / "suites" / "opd.json").read_text())
    with pytest.raises(SpecError, match=r"/x/opd\.json: field 'data': data file 'nope\.json' not found"):
        _from_dict({**raw, "data": "nope.json"}, "/x/opd.json")


def test_no_suite_name_branch_outside_the_engines():
    allowed = {"engines.py"}  # the registry: a suite's engine name maps to code there only
    branch = re.compile(r"""(==|!=)\s*["'](grpo|opd)["']""")
    for path in sorted(PACKAGE.glob("*.py")):
        if path.name in allowed:
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            assert not branch.search(line), f"{path.name}:{number}: {line.strip()}"


@pytest.mark.parametrize("suite,change,said", [
    ("opd", {"expected_steps": 50}, "expected_steps is 50 but opd_golden_2026-10-26.json was measured at "
                                    "total_train_steps 25"),
    ("opd", {"eval_points": [0, 10, 20]}, "eval_points are [0, 10, 20] but opd_golden_2026-10-26.json has golden "
                                          "values at steps [0, 5, 10, 15, 20, 25]"),
    ("grpo", {"launch": {"script": "run.sh", "env": {"TOTAL_TRAIN_STEPS": "40"}}},
     "launch.env.TOTAL_TRAIN_STEPS is 40 but expected_steps is 45"),
])
def test_a_spec_contradicting_its_data_or_environment_is_refused_naming_both(suite, change, said):
    raw = json.loads((PACKAGE / "suites" / f"{suite}.json").read_text())
    with pytest.raises(SpecError, match=re.escape(said)):
        _from_dict({**raw, **change}, f"/x/{suite}.json")


@pytest.mark.parametrize("change,said", [
    ({"expected_steps": 0}, "expected_steps: Input should be greater than or equal to 1"),
    ({"launch": {"args": ["x"]}}, "launch.script: Field required"),
    ({"eval_points": "0,15"}, "eval_points: Input should be a valid tuple"),
    ({"wall_time_budget": 2400}, "wall_time_budget: Extra inputs are not permitted"),
])
def test_a_malformed_spec_is_refused_naming_the_file_and_every_bad_field(change, said):
    raw = {**json.loads((PACKAGE / "suites" / "grpo.json").read_text()), **change}
    with pytest.raises(SpecError, match=re.escape("/x/grpo.json: ") + ".*" + re.escape(said)):
        _from_dict(raw, "/x/grpo.json")


def test_a_malformed_data_file_is_refused_naming_the_field(tmp_path, monkeypatch):
    bad = json.loads((PACKAGE / "data" / "grpo_thresholds.json").read_text())
    bad["assert_info"]["check_metrics"][1]["operator"] = ">"
    bad["percentile_metrics"]["eval/unknown"] = 80
    (tmp_path / "grpo_thresholds.json").write_text(json.dumps(bad))
    monkeypatch.setattr(suite_module, "data_file", lambda name: tmp_path / name)
    raw = json.loads((PACKAGE / "suites" / "grpo.json").read_text())
    with pytest.raises(SpecError) as err:
        _from_dict(raw, "/x/grpo.json")
    assert "field 'data'" in str(err.value) and "assert_info.check_metrics.1.operator" in str(err.value)


def test_each_fact_is_written_once():
    """Step counts, eval points and budgets live in the spec; the data files hold thresholds only."""
    for name in available_suites():
        spec = load_suite(name)
        data = json.loads((PACKAGE / "data" / spec.data).read_text())
        assert not {"expected_steps", "eval_points", "calibrated_max_step", "wall_time"} & set(data), spec.data
        assert spec.env.get("TOTAL_TRAIN_STEPS") in (None, "${EXPECTED_STEPS}"), name
