"""Suites are data: a new suite that reuses an engine is one spec file and its data file in the suites
folder (no package file is edited); a spec naming an unknown engine or a missing data file is refused,
naming the file and the field."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import rl_verify
from rl_verify import engines, settings
from rl_verify.cli import main
from rl_verify.engines import load_suite, validate
from rl_verify.suites import card
from rl_verify.suites.spec import SpecError, available_suites, spec_from_dict

PACKAGE = Path(rl_verify.__file__).parent
SUITES = PACKAGE / "suites"
REPO = PACKAGE.parents[1]
NEW = "dapo"


def _package_files() -> dict[str, bytes]:
    return {str(p.relative_to(PACKAGE)): p.read_bytes() for p in sorted(PACKAGE.rglob("*"))
            if p.is_file() and "__pycache__" not in p.parts}


@pytest.fixture()
def suites_copy(tmp_path, monkeypatch):
    """A copy of the package's suites folder (specs and data files) that the loader reads
    (RL_VERIFY_SUITES_DIR), so no package file is touched: another pytest process parses the package."""
    folder = tmp_path / "suites"
    shutil.copytree(SUITES, folder, ignore=shutil.ignore_patterns("__pycache__", "*.py"))
    monkeypatch.setattr(settings, "SUITES_DIR", str(folder))
    return folder


@pytest.fixture()
def dapo(suites_copy):
    """DAPO on the grpo engine: one spec file and one data file, nothing else."""
    spec = json.loads((SUITES / "grpo.json").read_text())
    spec.update(name=NEW, title="DAPO accuracy run (on the grpo engine; test only)", data="dapo_thresholds.json",
                runbook_minutes=25)
    data = json.loads((SUITES / "data" / "grpo_thresholds.json").read_text())
    data.update(suite=NEW, case_name="dapo-gsm8k")
    (suites_copy / f"{NEW}.json").write_text(json.dumps(spec, indent=2))
    (suites_copy / "data" / "dapo_thresholds.json").write_text(json.dumps(data, indent=2))
    return suites_copy


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, **extra}


def test_dapo_on_the_grpo_engine_is_one_spec_and_one_data_file_seen_by_the_dag_the_card_and_the_cli(
        dapo, tmp_path, checker_dir):
    from conftest import dump_rows, grpo_rows

    before = _package_files()
    # The DAG, parsed in a fresh interpreter that reads the suites folder copy.
    probe = ("import json, importlib.util; spec = importlib.util.spec_from_file_location('d', "
             f"{str(REPO / 'dags' / 'rl_accuracy_verification.py')!r}); "
             "m = importlib.util.module_from_spec(spec); "
             "spec.loader.exec_module(m); d = m.rl_accuracy_verification(); "
             "enum = d.params.get_param('suites').schema['items']['enum']; "
             "print(json.dumps({'tasks': sorted(d.task_ids), 'enum': enum}))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                         env=_env(RL_VERIFY_SUITES_DIR=str(dapo), AIRFLOW_HOME=str(tmp_path / "airflow_home")))
    assert out.returncode == 0, out.stderr[-2000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert {f"run_{NEW}", f"fetch_{NEW}", f"compare_{NEW}"} <= set(seen["tasks"]) and NEW in seen["enum"]
    # The card lists it with the grpo engine's criteria.
    spec = load_suite(NEW)
    engine = engines.engine_of(spec)
    criteria = {NEW: engine.criteria(spec, engine.load_data(dapo / "data" / spec.data))}
    sections = card.card_sections([spec], [], "rl_gpu_node", criteria)
    accept = sections["判读标准 acceptance criteria"]
    assert any("DAPO accuracy run" in line for line in accept)
    assert any("`mismatch/mismatch_k3_kl`" in line for line in accept)
    # The CLI compares with it, through the checker with the data file's own case name.
    base = dump_rows(tmp_path / "b.jsonl", grpo_rows())
    cur = dump_rows(tmp_path / "c.jsonl", grpo_rows())
    assert main(["compare", NEW, "--baseline", str(base), "--current", str(cur), "--checker-dir", str(checker_dir),
                 "--out", str(tmp_path / "out")]) == 0
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["suite"] == NEW and report["details"]["case_name"] == "dapo-gsm8k"
    # Its calibration N and its shipped provenance come from its data file.
    assert engine.calibration_runs(spec) == 5
    # A bisection's card prices its runs at the spec's own scale.
    from rl_verify.orchestration import bisection
    assert bisection.run_scale([load_suite(NEW), load_suite("opd")]) == {NEW: {"minutes": 25, "gpus": 8},
                                                                        "opd": {"minutes": 15, "gpus": 8}}
    assert _package_files() == before  # no package file was edited


def test_a_spec_naming_an_unknown_engine_fails_dag_import_naming_the_file_and_the_engine(suites_copy, tmp_path):
    raw = json.loads((SUITES / "grpo.json").read_text())
    path = suites_copy / "dapo.json"
    path.write_text(json.dumps({**raw, "name": "dapo", "engine": "dapo"}))
    dags = REPO / "dags"
    probe = ("import json; from airflow.dag_processing.dagbag import DagBag; "
             f"bag = DagBag({str(dags)!r}); "
             "print(json.dumps({k: str(v) for k, v in bag.import_errors.items()}))")
    env = _env(RL_VERIFY_SUITES_DIR=str(suites_copy), AIRFLOW_HOME=str(tmp_path / "airflow_home"),
               AIRFLOW__CORE__LOAD_EXAMPLES="False")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120,
                         cwd=tmp_path, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    errors = json.loads(out.stdout.strip().splitlines()[-1])
    # Every DAG that builds suite tasks at parse time (the bisection reads specs only when it runs).
    assert sorted(errors) == [str(dags / "rl_accuracy_probe.py"), str(dags / "rl_accuracy_verification.py"),
                              str(dags / "rl_baseline_calibration.py")]
    assert all(f"{path}: field 'engine': unknown engine 'dapo'" in e for e in errors.values())


def test_an_unknown_engine_is_refused_naming_the_file_and_the_engine():
    raw = json.loads((SUITES / "grpo.json").read_text())
    expected = r"/x/dapo\.json: field 'engine': unknown engine 'dapo'; known engines: grpo, opd"
    with pytest.raises(SpecError, match=expected):
        validate(spec_from_dict({**raw, "engine": "dapo"}, "/x/dapo.json"), "/x/dapo.json")


def test_a_missing_data_file_is_refused_naming_the_file_and_the_field():
    raw = json.loads((SUITES / "opd.json").read_text())
    with pytest.raises(SpecError, match=r"/x/opd\.json: field 'data': data file 'nope\.json' not found"):
        spec_from_dict({**raw, "data": "nope.json"}, "/x/opd.json")


def test_no_suite_or_engine_name_branch_outside_the_engine_modules():
    branch = re.compile(r"""(==|!=|\bin)\s*[\(\[{]?\s*["'](grpo|opd)["']""")
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.relative_to(PACKAGE).parts[:2] in {("engines", name) for name in engines.names()}:
            continue  # an engine's package may name itself
        for number, line in enumerate(path.read_text().splitlines(), 1):
            assert not branch.search(line), f"{path.relative_to(PACKAGE)}:{number}: {line.strip()}"


@pytest.mark.parametrize("suite,change,said", [
    ("opd", {"expected_steps": 50}, "expected_steps is 50 but opd_golden_2026-10-26.json was measured at "
                                    "total_train_steps 25"),
    ("opd", {"eval_points": [0, 10, 20]}, "eval_points are [0, 10, 20] but opd_golden_2026-10-26.json has golden "
                                          "values at steps [0, 5, 10, 15, 20, 25]"),
])
def test_a_spec_contradicting_its_data_is_refused_naming_both(suite, change, said):
    raw = json.loads((SUITES / f"{suite}.json").read_text())
    with pytest.raises(SpecError, match=re.escape(said)):
        validate(spec_from_dict({**raw, **change}, f"/x/{suite}.json"), f"/x/{suite}.json")


def test_a_spec_contradicting_its_launch_environment_is_refused_naming_both():
    raw = json.loads((SUITES / "grpo.json").read_text())
    change = {"launch": {"script": "run.sh", "env": {"TOTAL_TRAIN_STEPS": "40"}}}
    with pytest.raises(SpecError, match=re.escape("launch.env.TOTAL_TRAIN_STEPS is 40 but expected_steps is 45")):
        spec_from_dict({**raw, **change}, "/x/grpo.json")


@pytest.mark.parametrize("change,said", [
    ({"expected_steps": 0}, "expected_steps: Input should be greater than or equal to 1"),
    ({"launch": {"args": ["x"]}}, "launch.script: Field required"),
    ({"eval_points": "0,15"}, "eval_points: Input should be a valid tuple"),
    ({"wall_time_budget": 2400}, "wall_time_budget: Extra inputs are not permitted"),
])
def test_a_malformed_spec_is_refused_naming_the_file_and_every_bad_field(change, said):
    raw = {**json.loads((SUITES / "grpo.json").read_text()), **change}
    with pytest.raises(SpecError, match=re.escape("/x/grpo.json: ") + ".*" + re.escape(said)):
        spec_from_dict(raw, "/x/grpo.json")


def test_a_malformed_data_file_is_refused_naming_the_field(suites_copy):
    path = suites_copy / "data" / "grpo_thresholds.json"
    bad = json.loads(path.read_text())
    bad["assert_info"]["check_metrics"][1]["operator"] = ">"
    bad["percentile_metrics"]["eval/unknown"] = 80
    path.write_text(json.dumps(bad))
    with pytest.raises(SpecError) as err:
        load_suite("grpo")
    assert "field 'data'" in str(err.value) and "assert_info.check_metrics.1.operator" in str(err.value)


def test_each_fact_is_written_once():
    """Step counts, eval points and budgets live in the spec; the data files hold thresholds only."""
    for name in available_suites():
        spec = load_suite(name)
        data = json.loads((SUITES / "data" / spec.data).read_text())
        assert not {"expected_steps", "eval_points", "calibrated_max_step", "wall_time"} & set(data), spec.data
        assert spec.env.get("TOTAL_TRAIN_STEPS") in (None, "${EXPECTED_STEPS}"), name
