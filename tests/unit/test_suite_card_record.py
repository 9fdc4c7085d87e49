"""Suite specs are data; the card shows the runbook's numbers; the record store writes atomically."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rl_verify import engines
from rl_verify.suites import card

from rl_verify.store import record
from rl_verify.node.ops import parse_prerequisites
from rl_verify.suites.spec import available_suites, data_file
from rl_verify.engines import load_suite

SHARES = {"CI_SHARE_MODEL": "/share/model", "CI_SHARE_DATA": "/share/data",
          "CI_SHARE_BASELINE": "/share/baseline", "CHECKOUT": "/runs/k/xtuner"}


def test_shipped_suites_are_grpo_and_opd():
    assert available_suites() == ["grpo", "opd"]


def test_unknown_suite_names_the_known_ones():
    with pytest.raises(ValueError, match="grpo, opd"):
        load_suite("dapo")


def test_expansion_fills_share_roots_and_checkout():
    spec = load_suite("grpo").expanded(SHARES)
    assert spec.args[2] == "/share/model/Qwen3-8B"
    assert spec.baseline == "/share/baseline/qwen3-rl-lmdeploy/tracker.jsonl"
    assert ("checker", "/runs/k/xtuner/autotest/utils/check_metric.py") in [(i.kind, i.path) for i in spec.inputs]
    assert spec.expected_steps == 45


def test_missing_share_root_is_named():
    with pytest.raises(KeyError, match="CI_SHARE_DATA"):
        load_suite("opd").expanded({"CI_SHARE_MODEL": "/m", "CHECKOUT": "/c"})


def test_opd_spec_carries_the_runbook_environment():
    spec = load_suite("opd").expanded(SHARES)
    assert spec.env["TOTAL_TRAIN_STEPS"] == "25" and spec.env["EVALUATE_STEP"] == "5"
    assert spec.args == (spec.env["MODEL_PATH"], spec.env["DATA_PATH"])
    assert spec.eval_points == (0, 5, 10, 15, 20, 25)


def _sections():
    specs = [load_suite(s).expanded(SHARES) for s in ("grpo", "opd")]
    verified = [{"suite": "grpo", "kind": "model", "path": "/share/model/Qwen3-8B"}]
    return card.card_sections(specs, verified, "rl_gpu_node", engines.criteria(specs))


def test_card_has_the_four_sections_and_runbook_thresholds():
    commit = {"sha": "a" * 40, "commit_ref": "main", "subject": "s", "worktree": "/w", "dirty_stat": None,
              "suites": ["grpo", "opd"]}
    text = card.render_card(commit, _sections(), "manual__1", "f" * 16)
    assert text.startswith("# Experiment card — `main` · grpo, opd\n")  # commit and suites, not the run id
    for title in ("目标", "判读标准", "最小规模", "前置条件"):
        assert f"## {title}" in text
    for number in ("0.0001", "0.05", "12%", "18%", "0.3260", "0.4339", "40 min", "| 45 |", "| 25 |"):
        assert number in text, number
    assert "a" * 40 in text


def _specs(*names):
    return [load_suite(s) for s in names or ("grpo", "opd")]


def test_experiment_fingerprint_is_the_same_for_two_runs_of_the_same_card():
    # Two runs: different run ids, worktrees and resolved share paths; the same experiment.
    run_a = [s.expanded({**SHARES, "CHECKOUT": "/node/runs/manual__1-aaaa/xtuner"}) for s in _specs()]
    other = {"CI_SHARE_MODEL": "/mnt/m", "CI_SHARE_DATA": "/mnt/d", "CI_SHARE_BASELINE": "/mnt/b",
             "CHECKOUT": "/node/runs/scheduled__2-bbbb/xtuner"}
    run_b = [s.expanded(other) for s in _specs()]
    unexpanded = card.experiment_fingerprint(_specs())
    assert card.experiment_fingerprint(run_a) == card.experiment_fingerprint(run_b) == unexpanded
    commit = {"sha": "a" * 40, "commit_ref": "main", "subject": "s", "worktree": "/w", "dirty_stat": None}
    fp = card.experiment_fingerprint(run_a)
    assert f"Experiment fingerprint: `{fp}`" in card.render_card(commit, _sections(), "scheduled__2", fp)


def _changed(spec, path, value):
    raw = json.loads(json.dumps(spec.raw))
    node = raw
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return spec.model_copy(update={"raw": raw})


@pytest.mark.parametrize("what,path,value", [
    ("scale", ("launch", "env", "TOTAL_TRAIN_STEPS"), "50"),
    ("step count", ("expected_steps",), 50),
    ("eval points", ("eval_points",), [0, 10, 20]),
    ("wall-time budget", ("wall_time_budget_s",), 7200),
    ("launch script", ("launch", "script"), "recipe/other.sh"),
    ("input", ("inputs", 0, "path"), "${CI_SHARE_MODEL}/Other-Model"),
])
def test_each_defining_change_of_the_spec_changes_the_fingerprint(what, path, value):
    opd = load_suite("opd")
    assert card.experiment_fingerprint([_changed(opd, path, value)]) != card.experiment_fingerprint([opd]), what


def test_a_changed_threshold_or_golden_version_changes_the_fingerprint():
    opd = load_suite("opd")
    golden = json.loads(data_file(opd.data).read_text())
    tighter = json.loads(json.dumps(golden))
    tighter["thresholds"]["eval/gsm8k/acc"]["threshold"] = 0.02
    newer = json.loads(json.dumps(golden))
    newer["source"]["measured"] = "2026-12-01"
    same = card.experiment_fingerprint([opd], data=lambda s: golden)
    assert card.experiment_fingerprint([opd], data=lambda s: tighter) != same
    assert card.experiment_fingerprint([opd], data=lambda s: newer) != same
    assert card.experiment_fingerprint([opd]) == same
    assert card.experiment_fingerprint([opd, load_suite("grpo")]) != same  # another suite set


def test_parse_prerequisites_collects_every_problem():
    out = ("OK\tgrpo\tmodel\t/m\nMISSING\tgrpo\tdata\t/d1\nMISSING\topd\tteacher\t/t\n"
           "BUSY\t/runs/other-1/jobs/opd\t123\t1700000000\n")
    result = parse_prerequisites(out)
    problems = result.problems()
    assert problems[:2] == ["missing data for grpo: /d1", "missing teacher for opd: /t"]
    assert problems[2].startswith("node busy: run other-1, suite opd, since 2023-11-14T22:13:20Z")


def test_atomic_write_leaves_no_partial_file(tmp_path):
    target = tmp_path / "r" / "report.json"
    record.write_json(target, {"a": 1})
    assert json.loads(target.read_text()) == {"a": 1}
    assert [p.name for p in target.parent.iterdir()] == ["report.json"]


def test_manifest_lists_size_and_sha256(tmp_path):
    (tmp_path / "grpo").mkdir()
    (tmp_path / "grpo" / "tracker.jsonl").write_text('{"step": 1}\n')
    manifest = json.loads(record.write_manifest(tmp_path).read_text())
    (entry,) = manifest["files"]
    assert entry["path"] == "grpo/tracker.jsonl" and entry["bytes"] == 12 and len(entry["sha256"]) == 64


def test_card_shows_an_author_controlled_commit_subject_as_plain_text():
    commit = {"sha": "b" * 40, "commit_ref": "main", "subject": "fix <script>alert(1)</script> [x](javascript:y)",
              "worktree": "/w", "dirty_stat": None}
    text = card.render_card(commit, _sections(), "manual__1", "f" * 16)
    assert "<script>" not in text and "\\<script\\>" in text and "\\[x\\]" in text


@pytest.fixture()
def file_store(tmp_path, monkeypatch):
    """The record store at a ``file://`` URL and this worker's staging folder, both under tmp_path."""
    from rl_verify import settings

    monkeypatch.setattr(settings, "RECORD_ROOT", f"file://{tmp_path / 'store'}")
    monkeypatch.setattr(settings, "STAGING_DIR", str(tmp_path / "staging"))
    return tmp_path / "store" / "rl_accuracy_verification"


def _files(folder: Path) -> list[str]:
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())


def test_a_task_workspace_pulls_its_part_of_the_record_and_pushes_back_what_it_wrote(file_store, tmp_path):
    from rl_verify.core.names import run_key

    record.put_json("manual__1", "grpo/fetch.json", {"steps": 45})
    record.put_json("manual__1", "opd/fetch.json", {"steps": 25})
    with record.workspace("manual__1", parts=["grpo"]) as local:
        assert _files(local) == ["grpo/fetch.json"]  # only the part asked for
        assert local.parts[-2:] == ("rl_accuracy_verification", run_key("manual__1"))
        (local / "grpo" / "result.json").write_text('{"verdict": "PASS"}\n')
    stored = file_store / run_key("manual__1")
    assert _files(stored) == ["grpo/fetch.json", "grpo/result.json", "opd/fetch.json"]
    assert json.loads((stored / "grpo" / "result.json").read_text()) == {"verdict": "PASS"}
    assert list((tmp_path / "staging").iterdir()) == []  # nothing of the task is left on the worker


def test_what_a_failing_task_wrote_is_kept_in_the_store(file_store):
    with pytest.raises(RuntimeError, match="tracker too short"):
        with record.workspace("manual__2") as local:
            record.write_json(local / "grpo" / "fetch.json", {"problems": ["wrong step count"]})
            raise RuntimeError("tracker too short")
    assert record.get_json("manual__2", "grpo/fetch.json") == {"problems": ["wrong step count"]}


def test_paths_written_in_another_tasks_workspace_are_read_in_this_one(tmp_path):
    here = tmp_path / "task-b" / "rl_accuracy_verification" / "manual__1"
    written = {"plots": ["/tmp/worker-a/task-x/rl_accuracy_verification/manual__1/grpo/compare/plot.png"],
               "note": "a/rl_accuracy_verification/manual__1/ stays as it is", "steps": 45}
    assert record.relocate(written, here) == {"plots": [f"{here}/grpo/compare/plot.png"],
                                              "note": written["note"], "steps": 45}


def test_a_cached_result_is_computed_once_per_key_and_again_for_another_or_a_damaged_entry(file_store):
    calls = []

    def compute(value):
        calls.append(value)
        return {"false_alarm": value}

    key = {"code": "abc", "sigma": {"eval/gsm8k/acc": 0.01}, "budget": 2}
    assert record.cached_json("estimates", key, lambda: compute(0.005)) == {"false_alarm": 0.005}
    assert record.cached_json("estimates", dict(key), lambda: compute(0.5)) == {"false_alarm": 0.005}
    assert calls == [0.005]  # the second run with equal inputs read the store
    assert record.cached_json("estimates", {**key, "budget": 3}, lambda: compute(0.007)) == {"false_alarm": 0.007}
    (entry,) = [p for p in (file_store.parent / "cache" / "estimates").iterdir()
                if json.loads(p.read_text())["key"]["budget"] == 2]
    entry.write_text('{"key": ')  # a writer that crashed half-way
    assert record.cached_json("estimates", key, lambda: compute(0.006)) == {"false_alarm": 0.006}
    assert calls == [0.005, 0.007, 0.006]


def test_a_store_that_cannot_keep_the_cache_still_gives_the_result(tmp_path, monkeypatch):
    from rl_verify import settings

    blocked = tmp_path / "store"
    blocked.write_text("a file where the store's folder should be")
    monkeypatch.setattr(settings, "RECORD_ROOT", str(blocked))
    assert record.cached_json("estimates", {"k": 1}, lambda: [1, 2]) == [1, 2]


def test_an_object_store_that_cannot_be_written_names_the_setting_and_the_connection():
    with pytest.raises(OSError) as err:
        record.ensure_store_writable("manual__1", root="s3://no_such_conn@bucket/records")
    text = str(err.value)
    assert "RL_VERIFY_RECORD_ROOT=s3://no_such_conn@bucket/records" in text
    assert "check the Airflow connection 'no_such_conn'" in text


def test_record_files_are_readable_by_the_record_stores_users(tmp_path):
    from rl_verify.store import record

    path = record.write_json(tmp_path / "run" / "report.json", {"verdict": "PASS"})
    assert path.stat().st_mode & 0o777 == 0o644


def test_the_estimates_cache_key_changes_with_the_code_that_computes_them(monkeypatch):
    from rl_verify.orchestration import confirmation

    confirmation._confirm_code.cache_clear()
    shipped = confirmation._confirm_code()

    def estimate(layout, spread, budget):  # the same name, other samples: must not reuse the cached figures
        return {"samples": 10}

    monkeypatch.setattr(confirmation, "estimate", estimate)
    confirmation._confirm_code.cache_clear()
    try:
        assert confirmation._confirm_code() != shipped
    finally:
        confirmation._confirm_code.cache_clear()
