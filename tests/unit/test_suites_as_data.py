"""Suites are data: a new suite that reuses an engine is one spec file and its data file; a spec
naming an unknown engine or a missing data file is refused, naming the file and the field."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import rl_verify
from rl_verify import card
from rl_verify.cli import main
from rl_verify.suite import SpecError, _from_dict, available_suites, load_suite

PACKAGE = Path(rl_verify.__file__).parent
REPO = PACKAGE.parents[1]
NEW = "grpo_smoke"


@pytest.fixture()
def new_suite():
    """A temporary suite reusing the GRPO engine under another name (removed afterwards)."""
    raw = json.loads((PACKAGE / "suites" / "grpo.json").read_text())
    raw.update(name=NEW, title="GRPO smoke suite (temporary, test only)")
    path = PACKAGE / "suites" / f"{NEW}.json"
    path.write_text(json.dumps(raw))
    try:
        yield path
    finally:
        path.unlink()


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
             f"{str(REPO / 'dags' / 'rl_accuracy_verification.py')!r}); m = importlib.util.module_from_spec(spec); "
             "spec.loader.exec_module(m); d = m.rl_accuracy_verification(); "
             "enum = d.params.get_param('suites').schema['items']['enum']; "
             "print(json.dumps({'tasks': sorted(d.task_ids), 'enum': enum}))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert out.returncode == 0, out.stderr[-2000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert {f"run_{NEW}", f"fetch_{NEW}", f"compare_{NEW}"} <= set(seen["tasks"]) and NEW in seen["enum"]


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
    allowed = {"engines.py", "grpo.py", "opd.py", "nextsteps.py"}
    branch = re.compile(r"""(==|!=)\s*["'](grpo|opd)["']""")
    for path in sorted(PACKAGE.glob("*.py")):
        if path.name in allowed:
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            assert not branch.search(line), f"{path.name}:{number}: {line.strip()}"


@pytest.mark.parametrize("suite,change,said", [
    ("grpo", {"expected_steps": 46}, "expected_steps is 46 but grpo_thresholds.json says 45"),
    ("grpo", {"wall_time_budget_s": 3000}, "wall_time_budget_s is 3000 but grpo_thresholds.json wall_time.threshold_s"),
    ("opd", {"eval_points": [0, 10, 20]}, "eval_points are [0, 10, 20] but opd_golden_2026-10-26.json says"),
    ("opd", {"expected_steps": 50}, "launch.env.TOTAL_TRAIN_STEPS is 25 but expected_steps is 50"),
])
def test_a_spec_contradicting_its_data_or_environment_is_refused_naming_both(suite, change, said):
    raw = json.loads((PACKAGE / "suites" / f"{suite}.json").read_text())
    with pytest.raises(SpecError, match=re.escape(said)):
        _from_dict({**raw, **change}, f"/x/{suite}.json")
