"""A verification run judged against a baseline version: what each task reads, and what the card
and the report say (issue 9, "Versioned use")."""

from __future__ import annotations

import json

from conftest import GOLDEN
from rl_verify import engines
from rl_verify.core.model import SuiteResult
from rl_verify.core.report import ReportMeta, build_report, render_html, render_markdown
from rl_verify.engines import engine_of, load_suite
from rl_verify.orchestration import nodes
from rl_verify.suites import card
from rl_verify.suites.spec import data_file

VALUES = {"CI_SHARE_BASELINE": "/share/baseline", "CI_SHARE_MODEL": "/share/model", "CI_SHARE_DATA": "/share/data",
          "CHECKOUT": "/runs/x/xtuner"}


def _grpo(versions=None):
    return nodes.expanded_specs(["grpo"], VALUES, "/runs/x/xtuner", versions)[0]


def test_a_grpo_version_holding_its_own_tracker_does_not_read_the_shares():
    share = _grpo()
    assert share.baseline == "/share/baseline/qwen3-rl-lmdeploy/tracker.jsonl"
    assert share.baseline in [i.path for i in share.inputs]
    shipped = _grpo({"grpo": {"version": 1, "files": []}})
    assert shipped == share  # version 1 references the share's tracker
    calibrated = _grpo({"grpo": {"version": 2, "files": ["baseline.jsonl"]}})
    assert calibrated.baseline is None and share.baseline not in [i.path for i in calibrated.inputs]
    assert len(calibrated.inputs) == len(share.inputs) - 1


def test_an_opd_version_replaces_the_golden_table_and_a_grpo_one_never_the_thresholds(tmp_path):
    opd, grpo = load_suite("opd"), load_suite("grpo")
    assert engine_of(opd).data_in_use(opd, {}) == data_file(opd.data)
    assert engine_of(opd).data_in_use(opd, {"golden.json": tmp_path / "golden.json"}) == tmp_path / "golden.json"
    assert engine_of(grpo).data_in_use(grpo, {"baseline.jsonl": tmp_path / "b.jsonl"}) == data_file(grpo.data)


def test_version_files_of_a_pulled_record_leave_out_the_version_record(tmp_path):
    folder = tmp_path / "opd" / "baseline-version"
    folder.mkdir(parents=True)
    (folder / "golden.json").write_text("{}")
    (folder / "version.json").write_text("{}")
    assert nodes.version_files(tmp_path / "opd") == {"golden.json": folder / "golden.json"}
    assert nodes.version_files(tmp_path / "grpo") == {}


def test_the_card_names_the_version_and_shows_its_golden_values(tmp_path):
    data = json.loads(GOLDEN.read_text())
    data["golden"]["25"]["eval/gsm8k/acc"] = 0.7123
    golden = tmp_path / "golden.json"
    golden.write_text(json.dumps(data))
    spec = load_suite("opd")
    sections = card.card_sections([spec], [], "rl_gpu_node", engines.criteria([spec], lambda s: golden),
                                  {"opd": "v2: calibration of commit aaaaaaaaaaaa, N=3, approved by alice"})
    text = "\n".join(sections["判读标准 acceptance criteria"])
    assert "Baseline version: v2: calibration of commit aaaaaaaaaaaa, N=3, approved by alice" in text
    assert "0.7123" in text


def test_the_fingerprint_changes_with_the_baseline_version_even_when_the_data_is_the_same():
    specs = [load_suite("opd")]
    data = lambda s: json.loads(GOLDEN.read_text())  # noqa: E731
    v1 = card.experiment_fingerprint(specs, data, {"opd": 1})
    assert v1 == card.experiment_fingerprint(specs, data, {"opd": 1})
    assert v1 != card.experiment_fingerprint(specs, data, {"opd": 2})


def test_the_report_names_each_suites_baseline_version(tmp_path):
    result = SuiteResult(suite="opd", verdict="PASS", failure_class=None, checks=[], abnormal=[], next_steps=[],
                         trackers={}, plots=[])
    meta = ReportMeta(commit="a" * 40, baselines={"opd": "v2: calibration of commit <b>x</b>, N=3"})
    assert "- baseline opd: `v2: calibration of commit <b>x</b>, N=3`" in render_markdown([result], meta)
    assert "<li>baseline opd: <code>v2: calibration of commit &lt;b&gt;x&lt;/b&gt;, N=3</code></li>" in \
        render_html([result], meta)
    assert build_report([result], meta)["baselines"] == {"opd": "v2: calibration of commit <b>x</b>, N=3"}


def test_the_history_marks_the_run_whose_baseline_version_changed(tmp_path):
    from rl_verify.core import history

    def report(run: str, versions: dict[str, str]) -> None:
        folder = tmp_path / run.replace(":", "_")
        folder.mkdir()
        check = {"metric": "eval/gsm8k/acc", "passed": True, "error": 0.01, "threshold": 0.03}
        (folder / "report.json").write_text(json.dumps({
            "dag_run_id": run, "commit": "a" * 40, "commit_ref": "main", "verdict": "PASS", "baselines": versions,
            "suites": [{"suite": "opd", "verdict": "PASS", "checks": [check]}]}))

    report("manual__2026-12-01T01:00:00+00:00", {})
    report("manual__2026-12-01T02:00:00+00:00", {"opd": "v1: shipped (...)"})
    report("manual__2026-12-01T03:00:00+00:00", {"opd": "v1: shipped (...)"})
    report("manual__2026-12-01T04:00:00+00:00", {"opd": "v2: calibration of commit aaaa, N=3"})
    runs = history.runs(history.table(history.rows(tmp_path)))
    assert [(r["baselines"], r["baselines_changed"]) for r in runs] == [
        ("opd v2", True), ("opd v1", False), ("opd v1", True), ("", False)]
