"""Security rules of the issue that need no node and no Airflow server.

- Every remote script builder in ``rl_verify.node.remote`` refuses a path (or run key) that did not go
  through validation: remote paths are built only from validated parts.
- The DAG's trigger-time Param schema refuses every bad ``commit`` / ``suites`` of the matrix, and
  anything it lets through is also accepted by ``validate_commit`` (one rule, two places).
- Approval can be restricted to named users (RL_VERIFY_APPROVERS -> the operator's assigned users).
- The record store: a write that cannot happen raises an error naming the path and leaves no
  partial file; a report is replaced whole or not at all.
- The HTML report escapes every run-level string (notes, paths, refs, diff stat), not only metrics.

(validate_commit / validate_suites / validate_path themselves are pinned in test_remote.py.)
"""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rl_verify.core.names import run_key
from rl_verify import engines, settings

from rl_verify.store import record

from rl_verify.node import evidence_scripts, remote
from rl_verify.core.model import Check, SuiteResult
from rl_verify.core.report import ReportMeta, write_report

ROOT = Path(__file__).resolve().parents[2]

# ------------------------------------------------------------------------------ remote builders

BAD_ABSOLUTE_PATHS = {
    "semicolon": "/runs/a;touch /tmp/pwned",
    "command substitution": "/runs/$(touch /tmp/pwned)",
    "backticks": "/runs/`id`",
    "space": "/runs/a b",
    "newline": "/runs/a\ntouch /tmp/pwned",
    "dot-dot": "/runs/../etc",
    "relative": "runs/a",
    "option-like": "-rf",
    "glob": "/runs/*",
    "quote": "/runs/a'b",
}
BAD_RELATIVE_PATHS = {  # the launch script, relative to the worktree
    "semicolon": "examples/run.sh;id",
    "command substitution": "examples/$(id).sh",
    "backticks": "examples/`id`.sh",
    "space": "examples/run me.sh",
    "newline": "examples/run.sh\nid",
    "dot-dot": "../../../bin/sh",
    "absolute": "/bin/sh",
    "option-like": "--rcfile=/tmp/x",
}
BAD_GLOBS = {  # the suite's tracker glob is placed UNQUOTED (it must expand) under WORK_DIR
    "semicolon": "*/tracker.jsonl;id",
    "command substitution": "$(id)/tracker.jsonl",
    "backticks": "`id`/tracker.jsonl",
    "space": "* /tracker.jsonl",
    "newline": "*/tracker.jsonl\nid",
    "dot-dot": "../../*/tracker.jsonl",
    "absolute": "/etc/*",
}
BAD_KEYS = {  # run keys become a folder under the runs root
    "semicolon": "k;id",
    "command substitution": "$(id)",
    "slash": "a/b",
    "dot-dot": "..",
    "empty": "",
    "space": "a b",
    "newline": "k\nid",
}

GOOD = {"abs": "/runs/root", "abs2": "/runs/root/key-1/xtuner", "rel": "examples/v1/scripts/run_rl.sh",
        "key": run_key("manual__2026-11-29T00:00:00+00:00")}

# builder -> (kwargs that build a script, {param: kind of value}) where kind is abs|rel|key|checks.
# Every builder that emits text for a remote shell must appear here (checked below).
BUILDERS = {
    "resolve_commit_script": (
        dict(checkout=GOOD["abs"], runs_root=GOOD["abs"], key=GOOD["key"], commit="main"),
        {"checkout": "abs", "runs_root": "abs", "key": "key"}),
    "prerequisites_script": (
        dict(checks=[("grpo", "model", "/share/model/Qwen3-8B")], runs_root=GOOD["abs"], key=GOOD["key"]),
        {"checks": "checks", "runs_root": "abs", "key": "key"}),
    "job_command": (
        dict(worktree=GOOD["abs2"], work_dir=GOOD["abs2"] + "/work/grpo", script=GOOD["rel"], args=["a"],
             job_marker=remote.job_marker(GOOD["key"], "grpo"), stall_timeout_s=600,
             tracker_glob="*/logs/exp_tracking/tracker.jsonl"),
        {"worktree": "abs", "work_dir": "abs", "script": "rel", "tracker_glob": "glob"}),
    "kill_job_script": (
        dict(job_dir=GOOD["abs2"] + "/jobs/grpo", marker_value=remote.job_marker(GOOD["key"], "grpo")),
        {"job_dir": "abs"}),
    "cleanup_script": (
        dict(run_dir=GOOD["abs2"], key=GOOD["key"]),
        {"run_dir": "abs", "key": "key"}),
    "submit_job_script": (
        dict(job_dir=GOOD["abs2"] + "/jobs/grpo", command="( true )", environment={"A": "b c"}),
        {"job_dir": "abs"}),
    "job_poll_script": (dict(job_dir=GOOD["abs2"] + "/jobs/grpo", offset=0, max_bytes=100), {"job_dir": "abs"}),
    "job_state_script": (dict(job_dir=GOOD["abs2"] + "/jobs/grpo"), {"job_dir": "abs"}),
    "tracker_poll_script": (dict(work_dir=GOOD["abs2"] + "/work/grpo", tracker_glob="*/t.jsonl", known="", offset=0,
                                 max_bytes=100), {"work_dir": "abs"}),
    "read_file_script": (dict(path=GOOD["abs2"] + "/baseline.jsonl", max_bytes=100), {"path": "abs"}),
    "commit_range_script": (
        dict(checkout=GOOD["abs"], good="main", bad="v1.2", limit=64), {"checkout": "abs"}),
    "changed_files_script": (
        dict(checkout=GOOD["abs"], base="a" * 40, head="b" * 40), {"checkout": "abs"}),
    "tree_files_script": (dict(checkout=GOOD["abs"], sha="a" * 40), {"checkout": "abs"}),
    "evidence_setup_script": (dict(evidence_dir=GOOD["abs2"] + "/evidence/grpo", source=GOOD["abs2"]),
                              {"evidence_dir": "abs", "source": "abs"}),
    "evidence_config_script": (dict(evidence_dir=GOOD["abs2"] + "/evidence/grpo-ref1", worktree=GOOD["abs2"],
                                    config="autotest/config/rl_qwen3_gsm8k_grpo.py", attribute="trainer.rollout_steps",
                                    value=2),
                               {"evidence_dir": "abs", "worktree": "abs", "config": "rel"}),
    "evidence_read_script": (dict(evidence_dir=GOOD["abs2"] + "/evidence/grpo", source=GOOD["abs2"], python="python",
                                  compiled_re="triton\\.jit", work_dir=GOOD["abs2"] + "/work/grpo",
                                  tracker_glob="*/logs/exp_tracking/tracker.jsonl"),
                             {"evidence_dir": "abs", "source": "abs", "work_dir": "abs", "tracker_glob": "glob"}),
    "changed_lines_script": (dict(checkout=GOOD["abs"], base="a" * 40, head="b" * 40), {"checkout": "abs"}),
    "reap_script": (
        dict(runs_root=GOOD["abs"], checkout=GOOD["abs"], keep_key=GOOD["key"], max_age_days=7),
        {"runs_root": "abs", "checkout": "abs", "keep_key": "key"}),
}


#: The modules whose public ``*_script`` / ``*_command`` functions build remote shell text.
BUILDER_MODULES = (remote, evidence_scripts)


def _builders() -> set[str]:
    """Public functions of the builder modules that return remote shell text."""
    return {name for module in BUILDER_MODULES for name, fn in inspect.getmembers(module, inspect.isfunction)
            if fn.__module__ == module.__name__ and not name.startswith("_")
            and (name.endswith("_script") or name.endswith("_command"))}


def _builder(name: str):
    return next(getattr(m, name) for m in BUILDER_MODULES if hasattr(m, name))


def test_every_remote_builder_is_covered_by_the_property_table():
    assert _builders() == set(BUILDERS), "add the new builder to BUILDERS with its path parameters"


@pytest.mark.parametrize("builder", sorted(BUILDERS))
def test_builders_accept_validated_parts(builder):
    kwargs, _ = BUILDERS[builder]
    script = _builder(builder)(**kwargs)
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0


def _cases():
    for builder, (_, params) in sorted(BUILDERS.items()):
        for param, kind in params.items():
            yield pytest.param(builder, param, kind, id=f"{builder}-{param}")


_BAD = {"abs": BAD_ABSOLUTE_PATHS, "rel": BAD_RELATIVE_PATHS, "key": BAD_KEYS, "checks": BAD_ABSOLUTE_PATHS,
        "glob": BAD_GLOBS}


@pytest.mark.parametrize("builder,param,kind", list(_cases()))
def test_builders_refuse_unvalidated_parts(builder, param, kind):
    """Quoting alone is not enough: a path that never passed validation must not become a script.

    (``..``, ``/`` in a key, a relative or option-like script path escape the run's folder or
    change what runs even when quoted; the tracker glob is placed unquoted so that it expands.)
    """
    accepted = []
    for label, value in _BAD[kind].items():
        kwargs = dict(BUILDERS[builder][0])
        kwargs[param] = [("grpo", "model", value)] if kind == "checks" else value
        try:
            _builder(builder)(**kwargs)
        except remote.BadInput:
            continue
        accepted.append(f"{label}: {value!r}")
    assert not accepted, f"remote.{builder} built a script from unvalidated {param}: " + "; ".join(accepted)


def test_run_keys_are_always_valid_builder_input():
    for run_id in ("manual__2026-11-29T23:54:51.123+00:00", "scheduled__x", "a;b$(c)`d`\n../e", "", "." * 300):
        key = run_key(run_id)
        assert key and "/" not in key and key not in (".", "..")
        remote.cleanup_script(f"/runs/{key}", key)  # never refused


def test_run_layout_paths_stay_under_the_run_dir():
    layout = remote.RunLayout("/runs/k-1")
    for suite in engines.known_suites():
        for path in (layout.work_dir(suite), layout.job_dir(suite), layout.worktree):
            assert path.startswith("/runs/k-1/") and ".." not in path.split("/")
            remote.validate_path(path, "layout path")


# ------------------------------------------------------------------------------ DAG Param schema

# The matrix: each value must be refused at trigger time by the DAG's Params.
BAD_COMMIT_MATRIX = {
    "semicolon": "main; rm -rf /",
    "command substitution": "$(reboot)",
    "backticks": "`id`",
    "newline inside": "main\nid",
    "trailing newline": "main\n",
    "space": "main branch",
    "leading dash": "--upload-pack=evil",
    "over 200 characters": "a" * 201,
    "empty": "",
}
BAD_SUITES_MATRIX = {"unknown": ["dapo"], "one unknown": ["grpo", "nope"], "empty": [], "not a list": "grpo"}
GOOD_COMMITS = ["main", "v1.2.3", "feature/opd-fix", "4e7db028", "sim/regress-init", "a" * 200, "0" * 40]

# Parses the DAG in a fresh interpreter (as the DAG integrity tests do) and prints the Params' schemas.
_PARAMS_PROBE = r"""
import json, sys
from airflow.dag_processing.dagbag import DagBag
bag = DagBag(sys.argv[1])
dag = bag.dags["rl_accuracy_verification"]
print(json.dumps({k: dag.params.get_param(k).schema for k in dag.params.keys()}))
"""


@pytest.fixture(scope="module")
def param_schemas(tmp_path_factory):
    home = tmp_path_factory.mktemp("airflow_home")
    env = {**os.environ, "AIRFLOW_HOME": str(home), "AIRFLOW__CORE__LOAD_EXAMPLES": "False"}
    out = subprocess.run([sys.executable, "-c", _PARAMS_PROBE, str(ROOT / "dags")], env=env,
                         capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def _resolve(schema: dict, value):
    from airflow.sdk import Param

    return Param(None, schema=schema).resolve(value)


@pytest.mark.parametrize("label", sorted(BAD_COMMIT_MATRIX))
def test_dag_param_refuses_every_bad_commit_naming_the_rule(param_schemas, label):
    from airflow.sdk.exceptions import ParamValidationError

    with pytest.raises(ParamValidationError):
        _resolve(param_schemas["commit"], BAD_COMMIT_MATRIX[label])
    with pytest.raises(remote.BadInput):  # and the task-side rule agrees
        remote.validate_commit(BAD_COMMIT_MATRIX[label])


@pytest.mark.parametrize("label", sorted(BAD_SUITES_MATRIX))
def test_dag_param_refuses_unknown_or_empty_suites(param_schemas, label):
    from airflow.sdk.exceptions import ParamValidationError

    with pytest.raises(ParamValidationError):
        _resolve(param_schemas["suites"], BAD_SUITES_MATRIX[label])


@pytest.mark.parametrize("good", GOOD_COMMITS)
def test_dag_param_and_validate_commit_accept_the_same_good_refs(param_schemas, good):
    assert _resolve(param_schemas["commit"], good) == good
    assert remote.validate_commit(good) == good


def test_node_param_refuses_a_trailing_newline(param_schemas):
    from airflow.sdk.exceptions import ParamValidationError

    with pytest.raises(ParamValidationError):
        _resolve(param_schemas["node"], "rl_gpu_node\n")


# ------------------------------------------------------------------------------ approvers

def test_approvers_come_from_the_environment(monkeypatch):
    monkeypatch.setenv("RL_VERIFY_APPROVERS", " alice, bob ,,")
    assert settings.approvers() == [{"id": "alice", "name": "alice"}, {"id": "bob", "name": "bob"}]
    monkeypatch.setenv("RL_VERIFY_APPROVERS", "")
    assert settings.approvers() == []
    monkeypatch.delenv("RL_VERIFY_APPROVERS")
    assert settings.approvers() == []


def test_approval_operator_is_assigned_to_the_named_approvers_only(monkeypatch):
    from rl_verify.orchestration.approval import CardApprovalOperator

    monkeypatch.setenv("RL_VERIFY_APPROVERS", "alice,bob")
    op = CardApprovalOperator(task_id="approve", card={"markdown": "card", "fingerprint": "f"})
    assert [u["id"] for u in op.assigned_users] == ["alice", "bob"]
    monkeypatch.setenv("RL_VERIFY_APPROVERS", "")
    anyone = CardApprovalOperator(task_id="approve", card={"markdown": "card", "fingerprint": "f"})
    assert not anyone.assigned_users  # empty = any user with access


# ------------------------------------------------------------------------------ record store

def _blocked_dir(tmp_path: Path) -> Path:
    """A folder nobody, root included, can create: its parent is a regular file."""
    blocker = tmp_path / "blocker"
    blocker.write_text("a regular file, not a folder\n")
    return blocker / "rl_accuracy_verification" / "run-1"


def _files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_write_atomic_into_an_unwritable_store_names_the_path_and_leaves_nothing(tmp_path):
    target = _blocked_dir(tmp_path) / "report.json"
    with pytest.raises(OSError) as err:
        record.write_atomic(target, "{}")
    assert str(tmp_path / "blocker") in str(err.value)
    assert _files(tmp_path) == ["blocker"]


def test_write_report_into_an_unwritable_store_raises_and_writes_nothing(tmp_path):
    out = _blocked_dir(tmp_path)
    with pytest.raises(OSError) as err:
        write_report(out, [_suite()], ReportMeta())
    assert str(tmp_path / "blocker") in str(err.value)
    assert _files(tmp_path) == ["blocker"]


def test_write_atomic_failing_mid_write_keeps_the_old_file_whole_and_no_temp(tmp_path, monkeypatch):
    target = record.write_json(tmp_path / "report.json", {"verdict": "PASS"})

    def disk_full(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", disk_full)
    with pytest.raises(OSError, match="No space left"):
        record.write_json(target, {"verdict": "FAIL", "pad": "x" * 100_000})
    assert json.loads(target.read_text()) == {"verdict": "PASS"}
    assert _files(tmp_path) == ["report.json"]


def test_write_report_failing_mid_write_keeps_old_reports_whole_and_leaves_no_temp(tmp_path, monkeypatch):
    """A report is replaced whole or not at all, and no half-written temp file stays in the record
    (the record folder is published file by file, hidden files included)."""
    write_report(tmp_path, [_suite(passed=True)], ReportMeta())
    before = {name: (tmp_path / name).read_text() for name in ("report.json", "report.md", "report.html")}

    def disk_full(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", disk_full)
    with pytest.raises(OSError, match="No space left"):
        write_report(tmp_path, [_suite(passed=False)], ReportMeta())
    assert {name: (tmp_path / name).read_text() for name in before} == before
    assert _files(tmp_path) == sorted(before), "a temp file of the failed write was left in the record"


# ------------------------------------------------------------------------------ HTML escaping

def _suite(passed: bool = False, text: str = "ok") -> SuiteResult:
    check = Check(metric=f"eval/{text}", step=5, baseline=0.5, current=0.4, error=0.1, threshold=0.03,
                  operator="<", method="absolute", passed=passed, source="golden", note=text)
    return SuiteResult(suite="opd", verdict="PASS" if passed else "FAIL",
                       failure_class=None if passed else "accuracy", checks=[check],
                       abnormal=[] if passed else [text], next_steps=[f"Inference: {text}"],
                       trackers={"current": f"/runs/{text}/tracker.jsonl"})


def test_html_escapes_every_run_level_string(tmp_path):
    evil = "<script>alert(document.cookie)</script>"
    meta = ReportMeta(commit=evil, commit_ref=evil, diff_stat=evil, dag_run_id=evil, node=evil,
                      paths={evil: {evil: evil}}, notes=[f"Rejected by {evil} at now"], overall=None)
    suite = _suite(text=evil)
    suite.checker = {"ok": False, "message": evil, "reason": evil, "workdir": evil}
    page = write_report(tmp_path, [suite], meta)["html"].read_text()
    assert "<script" not in page.lower()
    assert page.count("&lt;script&gt;") >= 10
