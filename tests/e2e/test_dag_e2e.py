"""The whole DAG through a real Airflow (scheduler, triggerer, dag-processor, API server) on the
simulated GPU node (real sshd): PASS, FAIL with a full report, reject, a missing input.
A crashed run (exit 0, short tracker, cleanup leaving no Ray or teacher) is in test_faults.py.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from e2e_rigs import require_sshd
from harness.rig import DAG_ID
from rl_verify.core.names import run_key, short_sha
from simulator import node as sim
from simulator.noise import DEFAULT_ENVIRONMENT


ROOT = Path(__file__).resolve().parents[2]


pytestmark = pytest.mark.e2e
STEP_SECONDS = 0.1


@pytest.fixture(scope="module")
def rig(start_rig):
    from harness.receiver import Receiver

    require_sshd()  # before the receiver starts
    receiver = Receiver().start()  # the team's chat: every notification of the module's runs lands here
    try:
        with start_rig("e2e-rig", step_seconds=STEP_SECONDS, database="postgres",
                       extra_env=receiver.connection_env()) as rig:
            rig.receiver = receiver
            yield rig
    finally:
        receiver.stop()


@pytest.fixture()
def node_state(rig):
    state = rig.state_dir / "node"
    sim.clear_faults(state)
    yield state
    sim.clear_faults(state)


def _report(summary: dict) -> dict:
    return json.loads(Path(summary["report"]["json"]).read_text())


def _checks(report: dict, suite: str) -> list[dict]:
    (entry,) = [s for s in report["suites"] if s["suite"] == suite]
    return entry["checks"]


def _assert_node_clean(node_state: Path) -> None:
    assert sim.node_processes(node_state) == []
    assert not sim.ray_running(node_state)


def test_healthy_commit_passes_with_a_full_record_and_a_clean_node(rig, node_state, finished_runs):
    out = finished_runs["pass"]
    assert out.state == "success", json.dumps(out.tasks)
    assert out.tasks["cleanup"] == "success"
    assert "the node is clean: no process of this run is left" in rig.client.task_log(DAG_ID, out.run_id, "cleanup")
    assert out.summary["verdict"] == "PASS"
    report = _report(out.summary)
    assert report["verdict"] == "PASS"
    assert report["commit"] == rig.node["commits"]["good"]
    grpo = _checks(report, "grpo")
    assert {c["source"] for c in grpo} >= {"checker", "final-eval", "wall-time"}
    opd_steps = {c["step"] for c in _checks(report, "opd") if c["source"] == "golden"}
    assert {0, 5, 10, 15, 20, 25} <= opd_steps
    record = Path(out.summary["record"])
    manifest = json.loads((record / "manifest.json").read_text())
    archived = {f["path"] for f in manifest["files"]}
    assert {"card.md", "report.md", "report.html", "grpo/tracker.jsonl", "opd/tracker.jsonl"} <= archived
    # Judged against each suite's current baseline version (version 1: what ships, imported on first use),
    # kept in the record and named by the card and the report.
    assert {"opd/baseline-version/golden.json", "opd/baseline-version/version.json",
            "grpo/baseline-version/version.json"} <= archived
    assert report["baselines"]["opd"].startswith("v1: shipped") and report["baselines"]["grpo"].startswith("v1: ")
    assert "Baseline version: v1: shipped" in (record / "card.md").read_text()
    # Cleanup waited until no process of the run held GPU memory: the report and the verdict's message say so.
    assert "> Node after cleanup: GPUs free: no compute process on the node's 8 GPU(s)" in \
        Path(out.summary["report"]["md"]).read_text()
    assert out.summary["gpus"][0].startswith("GPUs free")
    # Deferred, not sleeping: the training tasks held a worker for a small part of their run.
    for suite in ("grpo", "opd"):
        held = rig.client.xcom(DAG_ID, out.run_id, f"run_{suite}", key="worker_seconds")
        assert held is not None and float(held) < rig.task_durations(out.run_id)[f"run_{suite}"]
    _assert_node_clean(node_state)


@pytest.mark.parametrize("commit,suite,metric,hint", [
    ("sim/regress-mismatch", "grpo", "mismatch/mismatch_k3_kl", "train/inference"),
    ("sim/regress-teacher", "opd", "distillation/reduced_distillation_kl", "teacher"),
])
def test_regressed_commit_fails_after_a_full_report(rig, node_state, commit, suite, metric, hint):
    # One run (repeats 0): confirming a FAIL by repeats has its own tests (test_confirmation.py).
    out = rig.run({"commit": commit, "suites": [suite], "node": "rl_gpu_node", "early_abort": False, "repeats": 0})
    assert out.state == "failed"
    assert out.tasks["report"] == "success" and out.tasks["verdict"] == "failed"
    assert out.summary["verdict"] == "FAIL" and out.summary["failure_classes"] == ["accuracy"]
    report = _report(out.summary)
    failed = {c["metric"] for c in _checks(report, suite) if c["passed"] is False}
    assert metric in failed
    (entry,) = report["suites"]
    assert any(hint in s for s in entry["next_steps"]), entry["next_steps"]
    assert all(s.startswith("Inference") for s in entry["next_steps"])
    # One class everywhere: the run's summary, report.json, report.md and the verdict task's message.
    assert entry["failure_class"] == "accuracy" and report["failure_class"] == "accuracy"
    assert f"**FAIL**: {suite} FAIL (accuracy)" in Path(out.summary["report"]["md"]).read_text()
    log = rig.client.task_log(DAG_ID, out.run_id, "verdict")
    assert f"FAIL (accuracy): {suite} {metric} breached at step" in log and "Traceback" not in log.split("FAIL (")[0]
    note = rig.client.dag_run(DAG_ID, out.run_id)["note"]  # the run page says it at a glance
    assert note.startswith(f"FAIL (accuracy): {suite} {metric} breached at step")
    assert "/plugin/verification-report" in note
    assert out.tasks[f"compare_{suite}"] == "failed"  # the grid shows which suite failed
    # Every breach carries its shape and tracker step; the first suggestion states the shape.
    breach = next(c for c in _checks(report, suite) if c["metric"] == metric and c["passed"] is False)
    assert breach["shape"] and breach["first_breach_step"] is not None
    assert breach["shape_text"] in " ".join(entry["next_steps"])
    # The live check watched the whole run and says where it would have stopped it.
    assert any(a.startswith("Live check: this run would have been aborted at step") for a in entry["abnormal"])
    _assert_node_clean(node_state)


@pytest.mark.parametrize("commit,fault,suite,metric,certain_at,hint", [
    ("sim/regress-mismatch", None, "grpo", "mismatch/mismatch_k3_kl", 1, "train/inference"),
    ("sim/regress-init", None, "opd", "eval/gsm8k/acc", 0, "initialisation"),
    ("sim/regress-teacher", None, "opd", "distillation/reduced_distillation_kl", 5, "teacher"),
    # The healthy first commit, not main: a FAIL of main's code would rightly keep later tests' shortcuts off.
    ("initial", "nan", "grpo", "mismatch/mismatch_k3_kl", 3, "NaN"),
], ids=["mismatch-grpo", "init-opd", "teacher-opd", "nan-fault-grpo"])
def test_a_regression_that_shows_early_is_aborted_early_with_a_full_report(rig, node_state, commit, fault, suite,
                                                                           metric, certain_at, hint):
    expected = 45 if suite == "grpo" else 25
    # A regression commit's trainer holds (alive) before its last step: only the early abort can end
    # it there, however slow the poll is on a busy machine.
    sim.set_fault(node_state, suite, fault or "hold", at_step=certain_at if fault else expected - 1)
    # early_abort defaults on; one run (repeats 0): the repeats have their own tests (test_confirmation.py).
    commit = rig.node["commits"].get(commit, commit)  # a commit without a branch: its SHA
    out = rig.run({"commit": commit, "suites": [suite], "node": "rl_gpu_node", "repeats": 0})
    # Stopped on purpose (issue 35): the training succeeds, the FAIL is the comparison's red.
    assert out.state == "failed" and out.tasks[f"run_{suite}"] == "success", json.dumps(out.tasks)
    assert out.tasks[f"fetch_{suite}"] == out.tasks["report"] == "success" and out.tasks[f"compare_{suite}"] == "failed"
    run_log = rig.client.task_log(DAG_ID, out.run_id, f"run_{suite}")
    assert "Stopped on purpose" in run_log and "Traceback" not in run_log, run_log[-3000:]
    assert out.summary["verdict"] == "FAIL" and out.summary["failure_classes"] == ["accuracy"]
    (entry,) = _report(out.summary)["suites"]
    aborted = entry["details"]["early_abort"]
    # Stopped before its end (how many steps ran depends on the poll interval against the simulated
    # 0.1 s steps); the FAIL was certain at the step where the regression first shows.
    assert aborted["applied"] and aborted["step"] < expected, aborted
    assert entry["abnormal"][0].startswith(f"Aborted at step {aborted['step']} of {expected}")
    (row,) = [c for c in entry["checks"] if c["metric"] == metric and c["passed"] is False]
    assert row["step"] == certain_at and row["source"] == "live", row
    assert any(hint in s for s in entry["next_steps"]), entry["next_steps"]
    log = rig.client.task_log(DAG_ID, out.run_id, f"run_{suite}")
    assert f"FAIL is certain at step {aborted['step']} of {expected}" in log
    assert re.search(rf"step \d+/{expected}.* \| ", log), "no live progress line in the task log"
    _assert_node_clean(node_state)


def test_a_docs_only_commit_after_a_verified_pass_ends_unchanged_with_no_training_and_no_approval(
        rig, node_state, finished_runs):
    from simulator.common import DOCS_ONLY_FILES

    good = rig.node["commits"]["good"]
    conf = {"commit": "sim/docs-only", "suites": ["grpo", "opd"], "node": "rl_gpu_node", "lane": "auto"}
    out = rig.run(conf, decision=None)  # None: the run must not wait for a person
    assert out.state == "success", json.dumps(out.tasks)
    assert rig.client.hitl_details(DAG_ID, out.run_id, task_id="approve") == []  # nobody was asked
    assert "No approval needed: every suite is PASS (unchanged)" in rig.client.task_log(DAG_ID, out.run_id, "approve")
    for suite in ("grpo", "opd"):
        for task in (f"run_{suite}", f"fetch_{suite}", f"compare_{suite}", f"confirm_{suite}"):
            assert out.tasks[task] == "skipped", (task, out.tasks)
    assert out.tasks["verdict"] == "success" and out.summary["verdict"] == "PASS"
    report = _report(out.summary)
    for row in report["suites"]:
        outcome = row["outcome"]
        assert outcome["outcome"] == "PASS (unchanged)" and outcome["runs"] == []
        assert outcome["unchanged"]["sha"] == good and sorted(outcome["unchanged"]["files"]) == sorted(DOCS_ONLY_FILES)
        assert outcome["unchanged"]["run_id"] == finished_runs["pass"].run_id
    report_md = Path(out.summary["report"]["md"]).read_text()
    assert f"Verified PASS: `{good}`" in report_md and "No approval was asked" in report_md
    assert "What it does not cover: anything outside the checkout" in report_md
    assert "PASS (unchanged), no training" in rig.client.dag_run(DAG_ID, out.run_id)["note"]
    run_dir = Path(rig.node["root"]) / "runs" / run_key(out.run_id)
    assert not list(run_dir.glob("jobs/*"))  # nothing launched
    _assert_node_clean(node_state)
    # A change that can move a number trains as before, under the same param (its card waits for a person).
    code = rig.run({**conf, "commit": "sim/regress-mismatch", "suites": ["grpo"], "repeats": 0}, decision="Reject")
    assert code.summary["verdict"] == "REJECTED"
    assert "PASS (unchanged)" not in rig.client.hitl_detail(DAG_ID, code.run_id, "approve")["body"]


def test_the_bitwise_lane_passes_a_neutral_commit_in_k_steps_and_sends_a_numerics_change_to_the_full_check(
        rig, node_state):
    from rl_verify.store import references

    commits = rig.node["commits"]
    conf = {"suites": ["grpo"], "node": "rl_gpu_node", "lane": "auto", "repeats": 0}
    run_dir = Path(rig.node["root"]) / "runs"

    def kept(sha: str) -> list[dict]:
        root = Path(rig.record_root) / references.FOLDER
        found = [json.loads(p.read_text()) for p in root.glob("*.json")] if root.is_dir() else []
        return [r for r in found if r["suite"] == "grpo" and r["sha"] == sha]

    # 1. No reference yet for this environment: verified in full; its PASS makes the reference (2 runs of k steps).
    first = rig.run({**conf, "commit": "sim/neutral-refactor"})
    assert first.state == "success" and first.summary["verdict"] == "PASS", json.dumps(first.tasks)
    assert "A bitwise reference is made after its PASS" in (Path(first.summary["record"]) / "card.md").read_text()
    (made,) = kept(commits["neutral-refactor"])
    assert made["state"] == "trusted" and [r["step"] for r in made["rows"]] == [0, 1, 2]
    assert "bitwise reference trusted" in Path(first.summary["report"]["md"]).read_text()

    # 2. A numerics-neutral code commit: k deterministic steps, the same bits, PASS (bitwise); no full training.
    neutral = rig.run({**conf, "commit": "sim/neutral-early"})
    assert neutral.state == "success", json.dumps(neutral.tasks)
    assert neutral.tasks["run_grpo"] == "success" and neutral.tasks["fetch_grpo"] == "skipped"
    assert neutral.tasks["compare_grpo"] == "skipped" and neutral.summary["verdict"] == "PASS"
    outcome = _report(neutral.summary)["suites"][0]["outcome"]
    assert outcome["outcome"] == "PASS (bitwise)" and outcome["runs"] == []
    found = outcome["bitwise"]
    assert found["identical"] and found["steps_seen"] == found["steps"] == 3
    assert found["reference"]["sha"] == commits["neutral-refactor"] and found["reference"]["report"]
    assert [c["step"] for c in found["compared"]] == [0, 1, 2] and found["compared"][1]["metrics"] > 5
    report_md = Path(neutral.summary["report"]["md"]).read_text()
    assert "PASS (bitwise), no full training" in report_md and "What it does not cover: the steps after step 2" in \
        report_md
    jobs = sorted(p.name for p in (run_dir / run_key(neutral.run_id) / "jobs").iterdir())
    assert jobs == ["grpo-lane"]  # the lane job only: no full training, no new reference
    assert "Stopped the lane job" in rig.client.task_log(DAG_ID, neutral.run_id, "run_grpo")
    assert "grpo PASS (bitwise), no full training" in rig.client.dag_run(DAG_ID, neutral.run_id)["note"]
    _assert_node_clean(node_state)

    # 3. A healthy numerics change: the lane parts at step 0, the full verification PASSes, a new reference is kept.
    changed = rig.run({**conf, "commit": "sim/numerics-reorder"})
    assert changed.state == "success" and changed.summary["verdict"] == "PASS", json.dumps(changed.tasks)
    lane = json.loads((Path(changed.summary["record"]) / "grpo" / "lane.json").read_text())
    assert not lane["identical"] and lane["difference"]["step"] == 0
    assert outcome_of(changed)["outcome"] == "PASS"
    assert "not the same bits as the reference" in Path(changed.summary["report"]["md"]).read_text()
    assert kept(commits["numerics-reorder"])[0]["state"] == "trusted"
    assert sorted(p.name for p in (run_dir / run_key(changed.run_id) / "jobs").iterdir()) == [
        "grpo", "grpo-lane", "grpo-ref1", "grpo-ref2"]
    _assert_node_clean(node_state)

    # 4. A regression: the lane differs, and the full verification FAILs as today (the lane never FAILs a run).
    regressed = rig.run({**conf, "commit": "sim/regress-mismatch"})
    assert regressed.summary["verdict"] == "FAIL"
    lane = json.loads((Path(regressed.summary["record"]) / "grpo" / "lane.json").read_text())
    assert not lane["identical"] and outcome_of(regressed)["outcome"] == "FAIL"
    assert not kept(commits["regress-mismatch"])  # no reference from a FAIL
    _assert_node_clean(node_state)

    # 5. A driver upgrade on a node whose deterministic mode does not reproduce: the lane is not applicable (no
    # reference for this environment; the report names what changed), the full verification PASSes, and the
    # self-check's two runs differ: that environment's reference is "not reproducible" and the lane is off on it.
    sim.set_determinism(node_state, reproducible=False,
                        environment={**DEFAULT_ENVIRONMENT, "driver": "580.200.01"})
    try:
        upgraded = rig.run({**conf, "commit": "sim/neutral-followup"})
    finally:
        sim.set_determinism(node_state, reproducible=True, environment=DEFAULT_ENVIRONMENT)
    assert upgraded.state == "success" and upgraded.summary["verdict"] == "PASS", json.dumps(upgraded.tasks)
    assert outcome_of(upgraded)["outcome"] == "PASS"
    report_md = Path(upgraded.summary["report"]["md"]).read_text()
    assert ("grpo: bitwise lane not applicable: the environment changed since the reference of "
            f"{short_sha(commits['numerics-reorder'])} (driver 580.159.04 -> 580.200.01): no bitwise reference "
            "for this environment yet") in report_md, report_md
    assert f"grpo: bitwise reference not reproducible at {short_sha(commits['neutral-followup'])}" in report_md
    assert "the bitwise lane is off on this environment" in report_md
    (off,) = kept(commits["neutral-followup"])
    assert off["state"] == "not reproducible" and off["facts"]["driver"] == "580.200.01"
    assert sorted(p.name for p in (run_dir / run_key(upgraded.run_id) / "jobs").iterdir()) == [
        "grpo", "grpo-ref1", "grpo-ref2"]  # no lane job: nothing to compare with on this environment
    _assert_node_clean(node_state)


def outcome_of(out) -> dict:
    return _report(out.summary)["suites"][0]["outcome"]


def test_rejected_card_launches_nothing_and_names_the_rejecter(rig, node_state):
    out = rig.run({"commit": "main", "suites": ["grpo", "opd"], "node": "rl_gpu_node"}, decision="Reject")
    assert out.state == "success", json.dumps(out.tasks)
    for task in ("run_grpo", "run_opd", "fetch_grpo", "compare_grpo", "verdict"):
        assert out.tasks[task] == "skipped", out.tasks
    assert out.summary["verdict"] == "REJECTED"
    report_md = Path(out.summary["report"]["md"]).read_text()
    assert "Rejected by demo" in report_md
    assert "REJECTED by demo" in rig.client.task_log(DAG_ID, out.run_id, "approve")
    run_dir = Path(rig.node["root"]) / "runs" / run_key(out.run_id)
    assert run_dir.exists() and not list(run_dir.glob("jobs/*/pid"))  # worktree made, nothing launched
    _assert_node_clean(node_state)


def test_missing_inputs_fail_prerequisites_listing_every_path(rig, node_state):
    sim.set_fault(node_state, "grpo", "missing-input")
    sim.set_fault(node_state, "opd", "missing-input")
    out = rig.run({"commit": "main", "suites": ["grpo", "opd"], "node": "rl_gpu_node"}, decision=None)
    assert out.state == "failed"
    assert out.tasks["check_prerequisites"] == "failed"
    assert out.tasks["approve"] == "upstream_failed" and out.tasks["run_grpo"] == "upstream_failed"
    log = rig.client.task_log(DAG_ID, out.run_id, "check_prerequisites")
    assert "missing model for grpo" in log and "Qwen3-8B" in log
    assert "missing teacher for opd" in log and "Qwen3-VL-4B-Instruct" in log
    assert out.summary and out.summary["verdict"] == "FAIL"
    _assert_node_clean(node_state)


# ----------------------------------------------------------------------------------------------------
# A node that is not ready for the launch scripts (xtuner-contract.md's traps)
def _untouched(node_state: Path) -> tuple:
    """What a refused run must leave as it was: the node's processes, Ray, its /tmp (ray_log), and every
    job or training folder (resolve_commit's worktree and empty folders of the run are not a launch)."""
    root = Path(rig_root(node_state))
    launched = sorted(str(p.relative_to(root)) for pattern in ("runs/*/jobs/*", "runs/*/work/*")
                      for p in root.glob(pattern))
    return (sorted(cmd for _, cmd in sim.node_processes(node_state)), sim.ray_running(node_state),
            sorted(str(p.relative_to(root)) for p in (root / "tmp").rglob("*")), launched)


def _task_error(log: str) -> str:
    """The message of the exception a task failed with, as its log records it (one JSON line)."""
    (line,) = [line for line in log.splitlines() if "Task failed with exception" in line]
    return json.loads(line[line.index("{"):])["error_detail"][0]["exc_value"]


def rig_root(node_state: Path) -> str:
    return sim.node_status(node_state)["node"]["root"]


def test_a_node_not_ready_is_refused_before_the_card_naming_every_problem_with_its_fix(rig, node_state):
    for trap in ("low-nofile", "hidden-gpu", "foreign-ray", "no-python", "gpu-foreign"):
        sim.set_fault(node_state, "node", trap)
    foreign = sim.node_status(node_state)["traps"]["foreign_ray_pid"]
    gpu_user = sim.node_status(node_state)["traps"]["faults"]["gpu-foreign"]["user"]
    gpu_foreign = sim.node_status(node_state)["traps"]["gpu_foreign_pid"]  # another user's CUDA job: 21 GiB on GPU 0
    before = _untouched(node_state)
    out = rig.run({"commit": "main", "suites": ["grpo", "opd"], "node": "rl_gpu_node"}, decision=None)
    assert out.state == "failed"
    assert out.tasks["check_prerequisites"] == "failed"
    assert out.tasks["approve"] == "upstream_failed" and out.tasks["run_grpo"] == "upstream_failed"
    log = rig.client.task_log(DAG_ID, out.run_id, "check_prerequisites")
    error = _task_error(log)
    assert "prerequisite problem(s) on the node; nothing was launched" in error.splitlines()[0]
    unready = [line for line in error.splitlines() if line.startswith("  - not ready:")]
    assert [line for line in error.splitlines() if line.startswith("  - ")] == unready, error  # nothing else
    # open files, GPUs, both Ray ports, python, the GPU in use: each named once, each with its fix
    assert len(unready) == 6 and all("Fix:" in line for line in unready), error
    for words in ("hard open-files limit is 20000, below the 65536", "shows 7 GPU(s)",
                  f"held by process {foreign} of", "`ray stop --force` would kill it", "`python` does not resolve",
                  "GPU 0 (00000000:18:00.0) is in use by a process that is not this run's: "
                  f"pid {gpu_foreign} of user {gpu_user} (python3 /home/other/finetune/train.py",
                  "holding 21504 MiB of 143771 MiB", f"Fix: ask {gpu_user} to stop it"):
        assert words in error, words
    assert _untouched(node_state) == before
    assert sim.node_status(node_state)["traps"]["foreign_ray_pid"] == foreign  # the other user's Ray lives on
    assert sim.node_status(node_state)["traps"]["gpu_foreign_pid"] == gpu_foreign  # and so does their CUDA job


def test_gpu_memory_still_held_after_cleanup_is_reported_and_the_next_run_is_refused_with_the_fix(rig, node_state):
    # The driver never releases the training's GPU memory (gpu-held): listed under the job's pid once it is gone.
    sim.set_fault(node_state, "node", "gpu-held", mib=30720)
    rig.receiver.messages.clear()
    out = rig.run({"commit": "main", "suites": ["grpo"], "node": "rl_gpu_node", "repeats": 0})
    assert out.state == "success" and out.summary["verdict"] == "PASS", json.dumps(out.tasks)
    job_pid = int((Path(rig_root(node_state)) / "runs" / run_key(out.run_id) / "jobs" / "grpo" / "pid").read_text())
    held = f"GPU memory still held by pid {job_pid} (30720 MiB), on GPU 0"
    assert f"> Node after cleanup: {held}" in Path(out.summary["report"]["md"]).read_text()
    assert held in rig.client.task_log(DAG_ID, out.run_id, "cleanup")
    got = rig.receiver.wait_for(lambda ms: any("rl-verify PASS" in m["title"] for m in ms))
    (verdict,) = [m for m in got if "rl-verify PASS" in m["title"]]
    assert f"Node after cleanup: {held}" in verdict["message"]
    # The next run: not ready before its card, the pid, its memory and the fix named.
    refused = rig.run({"commit": "main", "suites": ["grpo"], "node": "rl_gpu_node"}, decision=None)
    assert refused.tasks["check_prerequisites"] == "failed" and refused.tasks["approve"] == "upstream_failed"
    error = _task_error(rig.client.task_log(DAG_ID, refused.run_id, "check_prerequisites"))
    assert f"pid {job_pid} (python, no process of the node now" in error and "holding 30720 MiB" in error
    assert "Fix: find it with nvidia-smi on the host" in error and "nvidia-smi --gpu-reset -i 0" in error


def test_a_gpu_lost_after_the_prerequisites_ends_the_run_within_the_rule_count_quoting_the_line(rig, node_state):
    sim.set_fault(node_state, "node", "gpu-lost", gpus=7)  # the check still sees 8; the next ray start loses one
    out = rig.run({"commit": "main", "suites": ["grpo"], "node": "rl_gpu_node"})
    assert out.state == "failed" and out.tasks["run_grpo"] == "failed", json.dumps(out.tasks)
    assert out.summary["failure_classes"] == ["infrastructure"]
    run_log = rig.client.task_log(DAG_ID, out.run_id, "run_grpo")
    assert "log line seen 15 times: Waiting for GPU count to be 8, current: 7" in run_log
    waits = re.findall(r"Waiting for GPU count to be 8, current: 7", run_log)
    assert 15 <= len(waits) <= 16 * 2, len(waits)  # ended at the 15th (each line is in the log and the event)
    # The reason leads what the task logged after the job (issue 35): its first mention is the operator's own line,
    # not the last line of Airflow's traceback.
    said = [line for line in run_log.splitlines() if re.search(r"grpo (stopped: |ended at step )", line)]
    assert said and "operators.py" in said[0] and "log line seen 15 times" in said[0], said[:3]
    report = _report(out.summary)
    (grpo,) = report["suites"]
    assert grpo["failure_class"] == "infrastructure"
    first = grpo["abnormal"][0]
    assert "Waiting for GPU count to be 8, current: 7" in first and "Fix: check nvidia-smi" in first
    assert "stalled" not in json.dumps(report)  # the rule, not the stall watchdog
    assert out.tasks["cleanup"] == "success"
    _assert_node_clean(node_state)


def test_a_launch_that_exits_1_before_its_tracker_is_explained_in_its_own_words(rig, node_state):
    rig.receiver.messages.clear()
    # The node changes after the prerequisites passed: new SSH sessions get a hard limit of 20000.
    out = rig.run({"commit": "main", "suites": ["grpo"], "node": "rl_gpu_node"},
                  on_card=lambda run_id: sim.set_fault(node_state, "node", "low-nofile"))
    assert out.state == "failed" and out.summary["failure_classes"] == ["infrastructure"]
    report = _report(out.summary)
    (grpo,) = report["suites"]
    first = grpo["abnormal"][0]
    assert first.startswith("Infrastructure failure: the launch ended before any tracker (exit code 1): "
                            "its last command `ulimit -n 65536` printed: "), first
    assert "ulimit: open files: cannot modify limit: Operation not permitted" in first
    assert "Fix: raise the SSH user's hard nofile limit" in first
    assert "cannot modify limit" in (Path(out.summary["report"]["json"]).with_suffix(".md").read_text())
    verdict_log = rig.client.task_log(DAG_ID, out.run_id, "verdict")
    assert "FAIL (infrastructure): grpo the launch ended before any tracker" in verdict_log
    got = rig.receiver.wait_for(lambda ms: any("rl-verify FAIL" in m["title"] for m in ms))
    (verdict,) = [m for m in got if "rl-verify FAIL" in m["title"]]
    assert "`ulimit -n 65536`" in verdict["message"] and "cannot modify limit" in verdict["message"]
    _assert_node_clean(node_state)


# ----------------------------------------------------------------------------------------------------
# What a person sees: the UI plugin's report and history views (HTTP, then a real browser)
@pytest.fixture(scope="module")
def finished_runs(rig):
    """A PASS run (grpo and opd at main) and a FAIL run (grpo at sim/regress-mismatch, aborted early), made
    once for the tests that read them."""
    sim.clear_faults(rig.state_dir / "node")
    passed = rig.run({"commit": "main", "suites": ["grpo", "opd"], "node": "rl_gpu_node"})
    failed = rig.run({"commit": "sim/regress-mismatch", "suites": ["grpo"], "node": "rl_gpu_node", "repeats": 0})
    assert passed.summary["verdict"] == "PASS" and failed.summary["verdict"] == "FAIL"
    return {"pass": passed, "fail": failed}


def _token(rig, user: str) -> str:
    import httpx

    from harness.airflow_stack import USERNAME

    password = rig.stack.password if user == USERNAME else rig.stack.password_of(user)
    r = httpx.post(f"{rig.stack.base_url}/auth/token", json={"username": user, "password": password}, timeout=30)
    assert r.status_code in (200, 201), r.text
    return r.json()["access_token"]


def test_the_views_need_airflow_auth_and_never_serve_a_path_outside_the_run(rig, finished_runs):
    import httpx

    from harness.airflow_stack import OUTSIDER, USERNAME
    from rl_verify.orchestration import links

    run_id = finished_runs["fail"].run_id
    report = rig.stack.base_url + links.report_path(DAG_ID, run_id)
    history = rig.stack.base_url + links.history_path(DAG_ID)
    member = {"Authorization": f"Bearer {_token(rig, USERNAME)}"}
    outsider = {"Authorization": f"Bearer {_token(rig, OUTSIDER)}"}
    with httpx.Client(timeout=60) as http:
        for url in (report, history):
            assert http.get(url).status_code == 401, url                      # anonymous
            assert http.get(url, headers=outsider).status_code == 403, url    # no access to the DAG
            assert http.get(url, cookies={"_token": "forged"}).status_code in (401, 403), url
        page = http.get(report, headers=member)
        assert page.status_code == 200 and "FAIL" in page.text and "mismatch/mismatch_k3_kl" in page.text
        assert "data:image/png;base64," in page.text  # the plots travel inside the report
        assert http.get(report.replace("/report", "/report.json"), headers=member).json()["verdict"] == "FAIL"
        base = f"{rig.stack.base_url}{links.APP_PREFIX}/dags/{DAG_ID}/runs"
        for bad in ("..%2F..%2F..%2Fetc%2Fpasswd", "%2e%2e", "..", "%252e%252e%252fetc", "manual__nope",
                    run_id.replace("manual", "scheduled")):
            r = http.get(f"{base}/{bad}/report", headers=member)
            assert r.status_code == 404 and "root:" not in r.text, (bad, r.status_code)
        assert http.get(f"{rig.stack.base_url}{links.APP_PREFIX}/dags/other_dag/history",
                        headers=member).status_code == 404
        trend = http.get(history, headers=member)
        assert trend.status_code == 200 and "sim/regress-mismatch" in trend.text and trend.text.count("<img") >= 2


def test_a_person_logs_in_and_reads_the_report_and_the_history_in_the_airflow_ui(rig, finished_runs):
    from urllib.parse import quote

    from harness import browser as hb
    from harness.airflow_stack import USERNAME

    failed = finished_runs["fail"].run_id
    run_page = f"{rig.stack.base_url}/dags/{DAG_ID}/runs/{quote(failed, safe='')}"
    with hb.browser() as chromium:
        page = hb.login(chromium, rig.stack.base_url, USERNAME, rig.stack.password)
        page.goto(run_page)
        page.get_by_role("tab", name="Verification report").or_(page.get_by_text("Verification report")).first.click()
        report = page.frame_locator("iframe[title='Verification report']")
        report.get_by_text("FAIL", exact=False).first.wait_for()
        assert "mismatch/mismatch_k3_kl" in report.locator("body").inner_text()
        assert report.locator("img").count() >= 1
        hb.shot(page, "ui-report-view-fail")

        # The report task's extra link (on its Details tab) leads to the same view.
        page.goto(f"{run_page}/tasks/report/details")
        link = page.get_by_role("link", name="Verification report")
        link.wait_for()
        assert link.get_attribute("href").endswith(f"/runs/{quote(failed, safe='')}/plugin/verification-report")
        hb.shot(page, "ui-report-task-extra-link")
        page.goto(link.get_attribute("href"))
        page.frame_locator("iframe[title='Verification report']").get_by_text("FAIL").first.wait_for()

        page.goto(f"{rig.stack.base_url}/dags/{DAG_ID}/plugin/verification-history")
        history = page.frame_locator("iframe[title='Verification history']")
        history.get_by_text("Verification history").first.wait_for()
        assert history.locator("img").count() >= 2 and "sim/regress-mismatch" in history.locator("body").inner_text()
        hb.shot(page, "ui-history-view")

        anonymous = chromium.new_page()
        answer = anonymous.goto(rig.stack.base_url + f"/rl-verify/dags/{DAG_ID}/history")
        assert answer.status == 401


def test_people_are_told_the_card_waits_the_verdict_and_the_infrastructure_failure(rig, node_state):
    sim.set_fault(node_state, "opd", "crash", at_step=3)
    rig.receiver.messages.clear()
    out = rig.run({"commit": "main", "suites": ["opd"], "node": "rl_gpu_node"})
    assert out.summary["verdict"] == "FAIL" and out.summary["failure_classes"] == ["infrastructure"]
    got = rig.receiver.wait_for(lambda ms: len(ms) >= 3)
    assert len(got) == 3, [m["title"] for m in got]  # one of each kind, nothing twice
    card, verdict, infra = (next(m for m in got if key in m["title"]) for key in
                            ("card waiting for approval", "rl-verify FAIL (infrastructure)", "infrastructure failure"))
    assert card["title"].startswith("rl-verify: main") and "Suites: opd" in card["message"]
    assert "/required_actions" in card["message"] and card["message"].count("http") == 1
    assert "opd" in verdict["message"] and "/plugin/verification-report" in verdict["message"]
    assert "Next step: " in verdict["message"]
    assert "run_opd" in infra["message"] and "the node is clean" in infra["message"]
    secrets = [rig.stack.password, json.loads((rig.stack.state_dir / "secrets.json").read_text())["jwt_secret"]]
    for message in got:
        assert not any(s in json.dumps(message) for s in secrets), message["title"]
