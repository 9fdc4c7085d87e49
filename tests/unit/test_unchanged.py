"""The path-aware skip (orchestration.unchanged, issue 33 item 1): which verified PASS a suite may rest on, which
diffs let it end PASS (unchanged) without a training, and how that reads in the record, report and history."""

from __future__ import annotations

import json
import os
import time

import pytest

from rl_verify import settings
from rl_verify.core import history
from rl_verify.core.bisect import Reading, reading
from rl_verify.core.model import UNCHANGED, SuiteResult
from rl_verify.core.names import run_key
from rl_verify.core.report import ReportMeta, build_report, render_html, render_markdown
from rl_verify.engines import engine_of, load_suite
from rl_verify.orchestration import links, unchanged, verification_history
from rl_verify.suites.spec import data_file
from simulator.checkout import checkout_files

BASE, HEAD, OTHER = "a" * 40, "b" * 40, "c" * 40
#: A checkout's files that every shipped suite's path rule matches: the simulated checkout's.
TREE = checkout_files()


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setattr(settings, "RECORD_ROOT", str(tmp_path))
    return tmp_path


def _verification(store, run_id, sha, outcomes, fingerprints, label="v1", age_s=0.0, dirty=None):
    folder = store / settings.DAG_ID / run_key(run_id)
    folder.mkdir(parents=True)
    rows = [{"suite": s, "verdict": "PASS" if o.startswith("PASS") else "FAIL",
             "outcome": {"outcome": o, "runs": [{}]}, "checks": []} for s, o in outcomes.items()]
    (folder / "report.json").write_text(json.dumps({"commit": sha, "dag_run_id": run_id, "suites": rows,
                                                    "baselines": {s: label for s in outcomes}}))
    (folder / "commit.json").write_text(json.dumps({"sha": sha, "suite_fingerprints": fingerprints,
                                                    "dirty_stat": dirty}))
    when = time.time() - age_s
    os.utime(folder / "report.json", (when, when))
    return folder


def test_a_suites_fingerprint_is_its_spec_data_and_baseline_version_alone():
    spec = load_suite("opd")
    one = unchanged.suite_fingerprint(spec, {}, 1)
    assert one == unchanged.suite_fingerprint(spec, {}, 1)
    assert one != unchanged.suite_fingerprint(spec, {}, 2)
    assert one != unchanged.suite_fingerprint(load_suite("grpo"), {}, 1)
    engine = engine_of(spec)
    assert engine.baseline_is_data  # OPD's baseline version carries its golden table: another table, another run
    golden = json.loads(data_file(spec.data).read_text())
    golden["source"]["note"] = "another golden table"
    assert one != unchanged.suite_fingerprint(spec, {engine.baseline_file: json.dumps(golden).encode()}, 1)


def test_the_base_is_the_newest_full_pass_of_the_same_suite_fingerprint_and_baseline(store):
    _verification(store, "manual__old", OTHER, {"opd": "PASS"}, {"opd": "fp"}, age_s=100)
    _verification(store, "manual__new", BASE, {"opd": "PASS (not reproduced)"}, {"opd": "fp"}, age_s=10)
    _verification(store, "manual__fail", HEAD, {"opd": "FAIL (reproduced)"}, {"opd": "fp"}, age_s=1)
    found = verification_history.verified_passes({"opd": ("fp", "v1")})["opd"]
    assert found["sha"] == BASE and found["run_id"] == "manual__new"
    assert found["report"] == links.report_view_path(settings.DAG_ID, "manual__new")


@pytest.mark.parametrize(("why", "outcome", "fingerprints", "label", "dirty"), [
    ("another experiment", "PASS", {"opd": "other"}, "v1", None),
    ("another baseline version", "PASS", {"opd": "fp"}, "v2", None),
    ("a FAIL", "FAIL", {"opd": "fp"}, "v1", None),
    ("a PASS (unchanged): no training to rest on", UNCHANGED, {"opd": "fp"}, "v1", None),
    ("a record from before the skip", "PASS", {}, "v1", None),
    ("a dirty worktree", "PASS", {"opd": "fp"}, "v1", " 1 file changed"),
])
def test_no_base_is_taken_from(store, why, outcome, fingerprints, label, dirty):
    _verification(store, "manual__x", BASE, {"opd": outcome}, fingerprints, label=label, dirty=dirty)
    assert verification_history.verified_passes({"opd": ("fp", "v1")}) == {}, why


def test_one_pass_over_the_record_finds_each_suites_own_base(store):
    _verification(store, "manual__both", BASE, {"grpo": "PASS", "opd": "PASS"}, {"grpo": "g", "opd": "o"}, age_s=50)
    _verification(store, "manual__opd", OTHER, {"opd": "PASS"}, {"opd": "o"}, age_s=5)
    found = verification_history.verified_passes({"grpo": ("g", "v1"), "opd": ("o", "v1")})
    assert (found["grpo"]["sha"], found["opd"]["sha"]) == (BASE, OTHER)


def test_a_scheduled_run_trains_a_suite_whose_base_is_older_than_full_every_days(monkeypatch):
    fake, _ = _changed({BASE: ["docs/a.md"]})
    monkeypatch.setattr(unchanged.node, "changed_files", fake)
    now = time.time()
    old = {"sha": BASE, "run_id": "r", "report": "", "written_at": now - 8 * 86400}
    spec = [load_suite("opd")]
    manual = unchanged.unchanged_on_node(None, "/c", HEAD, spec, {"opd": old}, now=now, tree=TREE)
    assert list(manual) == ["opd"]
    assert unchanged.unchanged_on_node(None, "/c", HEAD, spec, {"opd": old}, scheduled=True, now=now,
                                       tree=TREE) == {}
    recent = {**old, "written_at": now - 6 * 86400}
    assert list(unchanged.unchanged_on_node(None, "/c", HEAD, spec, {"opd": recent}, scheduled=True, now=now,
                                                tree=TREE)) == [
        "opd"]


def _changed(files_by_base):
    calls = []

    def changed_files(client, checkout, base, head):
        calls.append((base, head))
        return files_by_base.get(base)
    return changed_files, calls


def test_a_diff_touching_only_docs_ends_unchanged_and_one_touching_code_trains(monkeypatch):
    fake, calls = _changed({BASE: ["docs/rl.md", "README.md"], OTHER: ["xtuner/v1/rl/loss.py", "docs/a.md"]})
    monkeypatch.setattr(unchanged.node, "changed_files", fake)
    specs = [load_suite("grpo"), load_suite("opd")]
    base = {"sha": BASE, "run_id": "r1", "report": "/r1"}
    found = {"grpo": {**base, "sha": OTHER}, "opd": base}
    out = unchanged.unchanged_on_node(None, "/ckpt", HEAD, specs, found, tree=TREE)
    assert list(out) == ["opd"] and out["opd"]["files"] == ["docs/rl.md", "README.md"]
    assert out["opd"]["why"] == ("the diff since the verified PASS at aaaaaaaaaaaa touches no path that can affect "
                                 "this suite (2 file(s) changed)")
    assert calls == [(OTHER, HEAD), (BASE, HEAD)]


def test_suites_resting_on_one_commit_share_one_diff_and_a_base_the_node_lacks_skips_nothing(monkeypatch):
    fake, calls = _changed({BASE: []})
    monkeypatch.setattr(unchanged.node, "changed_files", fake)
    base = {"sha": BASE, "run_id": "r1", "report": "/r1"}
    specs = [load_suite("grpo"), load_suite("opd")]
    assert set(unchanged.unchanged_on_node(None, "/c", HEAD, specs, {"grpo": base, "opd": base},
                                                tree=TREE)) == {"grpo", "opd"}
    assert calls == [(BASE, HEAD)]
    missing = {**base, "sha": OTHER}  # _changed answers None: not in the checkout
    assert unchanged.unchanged_on_node(None, "/c", HEAD, specs, {"opd": missing}, tree=TREE) == {}


def test_a_diff_git_cannot_read_skips_nothing_and_fails_nothing(monkeypatch):
    def broken(client, checkout, base, head):
        raise unchanged.node.NodeError("git: fatal: bad object")
    monkeypatch.setattr(unchanged.node, "changed_files", broken)
    base = {"sha": BASE, "run_id": "r", "report": ""}
    assert unchanged.unchanged_on_node(None, "/c", HEAD, [load_suite("opd")], {"opd": base}, tree=TREE) == {}


def test_a_suite_whose_spec_narrows_what_affects_it_skips_a_diff_outside(monkeypatch):
    fake, _ = _changed({BASE: ["xtuner/v1/model/moe.py"]})
    monkeypatch.setattr(unchanged.node, "changed_files", fake)
    spec = load_suite("opd").model_copy(update={"affects": ("xtuner/v1/rl/**", "recipe/**")})
    out = unchanged.unchanged_on_node(None, "/c", HEAD, [spec], {"opd": {"sha": BASE, "run_id": "r", "report": ""}},
                                      tree=TREE)
    assert list(out) == ["opd"]


def _entry():
    return {"sha": BASE, "run_id": "manual__r1", "report": "/rl-verify/r1", "files": ["docs/a.md", "x<y>.md"],
            "why": "the diff since the verified PASS at aaaaaaaaaaaa (2 file(s)) touches no path that can affect "
                   "this suite"}


def test_an_unchanged_suite_reads_as_a_pass_in_the_report_with_its_base_files_and_what_it_covers(tmp_path):
    unchanged.write_outcomes(tmp_path, {"opd": _entry()})
    result = SuiteResult.from_dict(json.loads((tmp_path / "opd" / "result.json").read_text()))
    outcome = json.loads((tmp_path / "opd" / "outcome.json").read_text())
    meta = ReportMeta(commit=HEAD, outcomes={"opd": outcome})
    data = build_report([result], meta)
    assert data["verdict"] == "PASS" and data["suites"][0]["outcome"]["outcome"] == UNCHANGED
    assert data["suites"][0]["outcome"]["unchanged"]["sha"] == BASE
    md = render_markdown([result], meta)
    assert md.startswith("# RL accuracy verification: PASS\n\n**PASS**: opd PASS (unchanged)")
    assert f"Verified PASS: `{BASE}` ([its report](/rl-verify/r1))" in md and "`x<y>.md`" in md
    assert "What it does not cover: anything outside the checkout" in md
    page = render_html([result], meta)
    assert "<code>x&lt;y&gt;.md</code>" in page and "x<y>.md" not in page  # escaped
    assert '<a href="/rl-verify/r1">its report</a>' in page


def test_the_history_lists_an_unchanged_run_and_marks_it(tmp_path):
    unchanged.write_outcomes(tmp_path / "w", {"opd": _entry()})
    result = SuiteResult.from_dict(json.loads((tmp_path / "w" / "opd" / "result.json").read_text()))
    outcome = json.loads((tmp_path / "w" / "opd" / "outcome.json").read_text())
    report = build_report([result], ReportMeta(commit=HEAD, dag_run_id="manual__2026-12-05T03:00:00+00:00",
                                               outcomes={"opd": outcome}))
    (tmp_path / "rec" / "r2").mkdir(parents=True)
    (tmp_path / "rec" / "r2" / "report.json").write_text(json.dumps(report))
    rows = history.rows(tmp_path / "rec")
    assert len(rows) == 1 and rows[0]["suite_verdict"] == "PASS" and rows[0]["metric"] == ""
    assert rows[0]["confirmation"] == f"opd: {UNCHANGED} since aaaaaaaaaa, no training"
    assert history.runs(history.table(rows))[0]["verdict"] == "PASS"


def test_a_bisection_reads_an_unchanged_pass_as_good():
    assert reading(UNCHANGED) is Reading.GOOD


def test_the_card_says_which_suites_need_no_training_and_when_nothing_is_launched():
    resolved = {"suites": ["grpo", "opd"], "unchanged": {"opd": _entry()}}
    lines = unchanged.card_notes(resolved)
    assert lines == [f"opd: {UNCHANGED}, no training: {_entry()['why']}; files: docs/a.md, x<y>.md"]
    everything = unchanged.card_notes({**resolved, "suites": ["opd"]})
    assert everything[-1].startswith("Nothing to launch: every suite is unchanged")
    assert unchanged.card_notes({"suites": ["opd"]}) == []
