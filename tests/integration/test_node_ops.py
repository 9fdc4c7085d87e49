"""rl_verify.node.ops against the real sshd of the simulated node: worktree, prerequisites, job, fetch, cleanup."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from sim_ssh import simnode

from rl_verify import settings
from rl_verify.core.names import run_key
from rl_verify.node import ops as node
from rl_verify.suites.spec import NodeNeeds

from rl_verify.node import remote
from rl_verify.engines import load_suite

pytestmark = pytest.mark.integration


def _runs(sim_node) -> str:
    return f"{sim_node.info['root']}/runs"


def _resolve(sim_node, run_id: str, commit: str = "main") -> dict:
    return node.resolve_commit(sim_node.client, sim_node.checkout, _runs(sim_node), run_key(run_id), commit)


def _specs(sim_node, worktree: str, suites=("grpo", "opd")):
    return [load_suite(s).expanded({**sim_node.info["env"], "CHECKOUT": worktree}) for s in suites]


def _launch(sim_node, resolved: dict, suite: str) -> str:
    """Submit the suite's job as the training operator does; return its job folder."""
    layout = remote.RunLayout(resolved["run_dir"])
    spec = _specs(sim_node, layout.worktree, (suite,))[0]
    key = resolved["run_dir"].rsplit("/", 1)[1]
    command = remote.job_command(layout.worktree, layout.work_dir(suite), spec.script, spec.args,
                                 remote.job_marker(key, suite), 0)
    env = remote.job_environment(spec.env, layout.work_dir(suite), key, suite, sim_node.info["env"])
    status, _, err = node.run_script(sim_node.client,
                                     remote.submit_job_script(layout.job_dir(suite), command, env))
    assert status == 0, err
    return layout.job_dir(suite)


def _wait_exit(sim_node, job_dir: str, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status, out, _ = node.run_script(sim_node.client, f"cat {job_dir}/exit_code 2>/dev/null")
        if out.strip():
            return out.strip()
        time.sleep(0.3)
    raise AssertionError("job did not finish")


def test_resolve_commit_makes_a_clean_worktree_at_the_full_sha(sim_node):
    resolved = _resolve(sim_node, "it-resolve", "sim/regress-init")
    assert resolved["sha"] == sim_node.info["commits"]["regress-init"]
    assert resolved["dirty_stat"] is None
    rc, out, _ = sim_node.run(f"git -C {resolved['worktree']} rev-parse HEAD")
    assert out.strip() == resolved["sha"]
    # The same run resolves to the same worktree (a retried task does not fail or re-create it).
    assert _resolve(sim_node, "it-resolve", "sim/regress-init")["worktree"] == resolved["worktree"]


def test_resolve_commit_reads_the_commits_files_in_the_same_round_trip_and_tree_files_lists_any_commit(sim_node):
    """Issue 42: the suites' path rules are checked against the tree they judge, read with the worktree."""
    from rl_verify.core import lane
    from rl_verify.engines import load_suite
    from simulator.common import RENAMED_FROM, RENAMED_TO

    main = _resolve(sim_node, "it-tree-main", "main")
    renamed = _resolve(sim_node, "it-tree-rename", "sim/rename-lmdeploy")
    assert RENAMED_FROM in main["tree"] and RENAMED_FROM not in renamed["tree"] and RENAMED_TO in renamed["tree"]
    rc, out, _ = sim_node.run(f"git -C {main['worktree']} ls-files")
    assert sorted(main["tree"]) == sorted(out.split())
    grpo = load_suite("grpo")
    rules = lane.Rules(grpo.affects, grpo.unaffecting, grpo.bitwise.disabled_by)
    assert lane.stale_rules(rules, main["tree"]) == ((), ())  # every shipped rule names a file of the checkout
    assert lane.stale_rules(rules, renamed["tree"]) == ((), (RENAMED_FROM,))
    assert node.tree_files(sim_node.client, sim_node.checkout, renamed["sha"]) == renamed["tree"]
    assert node.tree_files(sim_node.client, sim_node.checkout, "0" * 40) is None


def test_unknown_ref_is_an_error_naming_the_ref(sim_node):
    with pytest.raises(node.NodeError, match="'no-such-branch' does not exist"):
        _resolve(sim_node, "it-badref", "no-such-branch")


def test_prerequisites_list_every_missing_input_in_one_error(sim_node):
    resolved = _resolve(sim_node, "it-prereq")
    specs = _specs(sim_node, resolved["worktree"])
    ok = node.check_prerequisites(sim_node.client, specs, _runs(sim_node), run_key("it-prereq"))
    assert len(ok.ok) == sum(len(s.inputs) for s in specs) and not ok.missing
    simnode.set_fault(sim_node.state, "grpo", "missing-input")
    simnode.set_fault(sim_node.state, "opd", "missing-input")
    try:
        with pytest.raises(node.PrerequisitesError) as err:
            node.check_prerequisites(sim_node.client, specs, _runs(sim_node), run_key("it-prereq"))
    finally:
        simnode.clear_faults(sim_node.state)
    text = str(err.value)
    assert "missing model for grpo" in text and "Qwen3-8B" in text
    assert text.count("missing ") >= 2, text


def test_job_runs_detached_and_fetch_archives_tracker_logs_baseline_and_checker(sim_node, tmp_path):
    resolved = _resolve(sim_node, "it-fetch")
    job_dir = _launch(sim_node, resolved, "grpo")
    assert _wait_exit(sim_node, job_dir) == "0"
    spec = _specs(sim_node, resolved["worktree"], ("grpo",))[0]
    meta = node.fetch_suite(sim_node.client, spec, remote.RunLayout(resolved["run_dir"]), tmp_path)
    assert meta["problems"] == []
    assert (tmp_path / "tracker.jsonl").stat().st_size > 0
    assert (tmp_path / "baseline.jsonl").exists()
    assert (tmp_path / "checker" / "autotest" / "utils" / "check_metric.py").exists()
    assert any(Path(f["local"]).name.startswith("training_log_") for f in meta["files"]["logs"])
    assert meta["exit_code"] == 0 and meta["wall_time_s"] is not None


def test_cleanup_kills_every_process_of_the_run_and_stops_ray(sim_node):
    resolved = _resolve(sim_node, "it-cleanup")
    simnode.set_fault(sim_node.state, "opd", "hang", at_step=2)
    try:
        _launch(sim_node, resolved, "opd")
        deadline = time.monotonic() + 20
        while not sim_node.processes("rlsim-teacher") and time.monotonic() < deadline:
            time.sleep(0.2)
        assert sim_node.processes("rlsim-teacher"), "teachers never started"
        # Another run's readiness sees the training's GPU processes as that run's live training (beside the busy
        # node), never as a leftover to kill (issue 43).
        with pytest.raises(node.PrerequisitesError) as err:
            node.check_prerequisites(sim_node.client, [], _runs(sim_node), run_key("another-run"),
                                     needs=NodeNeeds(gpus=8))
        key = resolved["run_dir"].rsplit("/", 1)[1]
        gpu_lines = [line for line in str(err.value).splitlines() if " is in use by " in line]
        assert gpu_lines and all(f"the live training of rl-verify run {key}, suite opd: " in line
                                 and "kill" not in line for line in gpu_lines), str(err.value)
        lines = node.cleanup(sim_node.client, resolved["run_dir"], resolved["run_dir"].rsplit("/", 1)[1])
    finally:
        simnode.clear_faults(sim_node.state)
    assert "ray stopped" in lines
    assert lines[-1].startswith("GPUs free: no compute process on the node's 8 GPU(s)"), lines
    assert sim_node.wait_no_processes(timeout=10) == []
    assert not simnode.ray_running(sim_node.state)


def test_gpu_memory_the_driver_keeps_after_cleanup_is_reported_and_refuses_the_next_run(sim_node, monkeypatch):
    """The gpu-held fault: the job's memory stays listed under its pid once its processes are gone. Cleanup waits
    its bound, names the pid and the memory; the next run's readiness is refused with the fix; cleared, free."""
    monkeypatch.setattr(settings, "GPU_RELEASE_WAIT_S", 1)
    resolved = _resolve(sim_node, "it-gpu-held")
    key = resolved["run_dir"].rsplit("/", 1)[1]
    simnode.set_fault(sim_node.state, "node", "gpu-held", mib=30720)
    simnode.set_fault(sim_node.state, "grpo", "hang", at_step=2)
    try:
        job = _launch(sim_node, resolved, "grpo")
        pid = int(sim_node.run(f"cat {job}/pid")[1])
        deadline = time.monotonic() + 30
        while not sim_node.processes("--rlsim-train") and time.monotonic() < deadline:
            time.sleep(0.2)
        t0 = time.monotonic()
        lines = node.cleanup(sim_node.client, resolved["run_dir"], key)
        assert time.monotonic() - t0 >= 1  # waited its bound for the memory
        assert lines[-1].startswith(f"GPU memory still held by pid {pid} (30720 MiB), on GPU 0"), lines
        with pytest.raises(node.PrerequisitesError) as err:
            node.check_prerequisites(sim_node.client, [], _runs(sim_node), run_key("the-next-run"),
                                     needs=NodeNeeds(gpus=8))
        text = str(err.value)
        assert f"pid {pid} (python, no process of the node now" in text and "holding 30720 MiB" in text
        assert "nvidia-smi --gpu-reset -i 0" in text
    finally:
        simnode.clear_faults(sim_node.state)
    assert node.check_prerequisites(sim_node.client, [], _runs(sim_node), run_key("after-reset"),
                                    needs=NodeNeeds(gpus=8)).unready == []


def test_reaper_removes_old_idle_run_folders_but_keeps_live_and_recent_ones(sim_node):
    old = _resolve(sim_node, "it-reap-old")
    recent = _resolve(sim_node, "it-reap-recent")
    sim_node.run(f"touch -d '10 days ago' {old['run_dir']}")
    reaped = node.reap(sim_node.client, _runs(sim_node), sim_node.checkout, "unrelated-key", 7)
    assert old["run_dir"] in reaped and recent["run_dir"] not in reaped
    rc, out, _ = sim_node.run(f"git -C {sim_node.checkout} worktree list")
    assert old["worktree"] not in out and recent["worktree"] in out


def test_a_live_job_of_another_suite_of_the_same_run_keeps_the_node_busy(sim_node):
    resolved = _resolve(sim_node, "it-same-run")
    key = resolved["run_dir"].rsplit("/", 1)[1]
    simnode.set_fault(sim_node.state, "grpo", "hang", at_step=2)
    try:
        _launch(sim_node, resolved, "grpo")  # hangs at step 2: live for the whole test
        # Another run sees the node as busy, naming this run and suite (right after submission).
        with pytest.raises(node.PrerequisitesError, match=r"node busy: run it-same-run-\w+, suite grpo"):
            node.check_prerequisites(sim_node.client, [], _runs(sim_node), run_key("another-run"))
        script = remote.prerequisites_script([], _runs(sim_node), key, own_suite="opd")
        busy = node.parse_prerequisites(node.run_script(sim_node.client, script)[1]).busy
        assert any("suite grpo" in b for b in busy), busy
        # ...while the grpo task itself (re-attaching) does not see its own job as foreign.
        script = remote.prerequisites_script([], _runs(sim_node), key, own_suite="grpo")
        assert node.parse_prerequisites(node.run_script(sim_node.client, script)[1]).busy == []
    finally:
        node.cleanup(sim_node.client, resolved["run_dir"], key)
        simnode.clear_faults(sim_node.state)


def test_a_live_job_of_a_run_airflow_says_has_ended_is_stopped_by_the_next_check_and_named(sim_node):
    """Issue 54: a job whose run has ended (its marker names the run, Airflow's record says it ended) is stopped by
    the next run's readiness check, which says so and goes on; while Airflow cannot say, nothing is stopped."""
    from rl_verify.orchestration import nodes

    ended = _resolve(sim_node, "it-ended-run")
    key = ended["run_dir"].rsplit("/", 1)[1]
    simnode.set_fault(sim_node.state, "grpo", "hang", at_step=2)
    try:
        _launch(sim_node, ended, "grpo")  # hangs: live until stopped

        def check():
            return node.check_prerequisites(sim_node.client, [], _runs(sim_node), run_key("it-next-run"))

        with pytest.raises(node.PrerequisitesError) as busy:
            check()

        def silent(*_):
            raise ConnectionError("the API server does not answer")

        assert nodes.stop_jobs_of_ended_runs(sim_node.client, "node", None, busy.value.result, run_key("it-next-run"),
                                             lookup=silent) == []
        still = {key: {"dag_id": "rl_accuracy_verification", "run_id": "it-ended-run", "state": "running"}}
        assert nodes.stop_jobs_of_ended_runs(sim_node.client, "node", None, busy.value.result, run_key("it-next-run"),
                                             lookup=lambda *_: still) == []
        with pytest.raises(node.PrerequisitesError):
            check()  # a run still running keeps its job, and the node busy

        seen = {key: {**still[key], "state": "failed"}}
        said = nodes.stop_jobs_of_ended_runs(sim_node.client, "node", None, busy.value.result, run_key("it-next-run"),
                                             lookup=lambda conn, dags, keys: seen if key in keys else {})
        assert len(said) == 1 and "run it-ended-run of rl_accuracy_verification ended failed" in said[0], said
        assert check().busy == []  # stopped: the node is free for the next run
    finally:
        node.cleanup(sim_node.client, ended["run_dir"], key)
        simnode.clear_faults(sim_node.state)


def test_a_run_ending_while_another_runs_job_trains_leaves_that_jobs_ray_alone(sim_node):
    """Probes of a bisection and the nightly share a node one training at a time (its pool): a run whose
    cleanup comes after the next run's training started must not stop that training's Ray."""
    done, live = _resolve(sim_node, "it-ray-done"), _resolve(sim_node, "it-ray-live")
    simnode.set_fault(sim_node.state, "opd", "hang", at_step=2)
    try:
        _wait_exit(sim_node, _launch(sim_node, done, "grpo"), timeout=300)
        _launch(sim_node, live, "opd")
        deadline = time.monotonic() + 30
        while not simnode.ray_running(sim_node.state) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert simnode.ray_running(sim_node.state), "the live job's Ray never started"
        lines = node.cleanup(sim_node.client, done["run_dir"], done["run_dir"].rsplit("/", 1)[1])
        assert "ray stopped" not in lines and any(line.startswith("ray left running: job") for line in lines), lines
        assert simnode.ray_running(sim_node.state)
        lines = node.cleanup(sim_node.client, live["run_dir"], live["run_dir"].rsplit("/", 1)[1])
    finally:
        simnode.clear_faults(sim_node.state)
    assert "ray stopped" in lines  # the last run on the node stops Ray as before
    assert sim_node.wait_no_processes(timeout=10) == []


def test_the_bisection_range_lists_good_then_each_first_parent_commit_with_author_date_and_subject(sim_node):
    from simulator.checkout import bisect_history

    history = bisect_history(Path(sim_node.info["root"]))
    count, commits = node.commit_range(sim_node.client, sim_node.checkout, "sim/bisect-good", "sim/bisect-bad", 64)
    assert count == len(history["commits"]) - 1 >= 16
    assert [c["sha"] for c in commits] == history["commits"]
    assert [c["subject"] for c in commits] == history["subjects"]
    assert all(c["author"] and "@" in c["author"] and c["date"][:2] == "20" for c in commits), commits[:2]
    # More than the limit: only the count; good after bad, an end that does not exist: the param named.
    assert node.commit_range(sim_node.client, sim_node.checkout, "sim/bisect-good", "sim/bisect-bad", 4) == (count, [])
    with pytest.raises(node.RangeError, match="is not an ancestor of bad") as err:
        node.commit_range(sim_node.client, sim_node.checkout, "sim/bisect-bad", "sim/bisect-good", 64)
    assert err.value.param == "good"
    with pytest.raises(node.RangeError, match="does not exist") as err:
        node.commit_range(sim_node.client, sim_node.checkout, "sim/bisect-good", "no-such-ref", 64)
    assert err.value.param == "bad"
    with pytest.raises(remote.BadInput):
        node.commit_range(sim_node.client, sim_node.checkout, "good;rm -rf /", "sim/bisect-bad", 64)


def test_the_files_changed_between_two_commits_are_listed_from_the_node_checkout(sim_node):
    from simulator.checkout import bisect_history

    history = bisect_history(Path(sim_node.info["root"]))
    good, first, culprit = history["commits"][0], history["commits"][1], history["culprit"]
    # An ordinary commit of the history touches the changelog only; the culprit also the trainer's behaviour.
    assert node.changed_files(sim_node.client, sim_node.checkout, good, first) == ["CHANGELOG.md"]
    assert "xtuner/rlsim/behaviour.json" in node.changed_files(sim_node.client, sim_node.checkout, good, culprit)
    assert node.changed_files(sim_node.client, sim_node.checkout, good, good) == []
    # A verified commit the checkout does not have: nothing can be said (None), not an error.
    assert node.changed_files(sim_node.client, sim_node.checkout, "0" * 40, good) is None
    with pytest.raises(node.NodeError, match="is not in"):
        node.changed_files(sim_node.client, sim_node.checkout, good, "0" * 40)
    for bad in ("main", "a" * 39, "$(reboot)" + "a" * 31):
        with pytest.raises(remote.BadInput, match="is not a full SHA"):
            node.changed_files(sim_node.client, sim_node.checkout, bad, good)


def test_the_simulated_docs_only_commit_changes_documentation_only(sim_node):
    from simulator.common import DOCS_ONLY_FILES

    commits = sim_node.info["commits"]
    changed = node.changed_files(sim_node.client, sim_node.checkout, commits["good"], commits["docs-only"])
    assert sorted(changed) == sorted(DOCS_ONLY_FILES)


def test_the_prerequisites_round_trip_reads_the_nodes_environment_and_sees_a_driver_upgrade(fresh_node):
    from rl_verify.core import bitwise

    resolved = _resolve(fresh_node, "it-env")
    specs = _specs(fresh_node, resolved["worktree"])
    env = node.check_prerequisites(fresh_node.client, specs, _runs(fresh_node), run_key("it-env")).environment
    assert (env["gpu"], env["gpu_count"], env["driver"], env["cuda"]) == ("NVIDIA H200 (SIMULATED)", 8,
                                                                          "580.159.04", "13.0")
    assert set(env["packages"]) >= {"torch", "sglang", "flash_attn"}  # asked of the launch interpreter
    simnode.set_determinism(fresh_node.state, environment={"driver": "580.200.01", "torch": "2.8.0",
                                                           "sglang": "0.5.3"})
    after = node.check_prerequisites(fresh_node.client, specs, _runs(fresh_node), run_key("it-env")).environment
    assert after["driver"] == "580.200.01" and bitwise.fingerprint(after) != bitwise.fingerprint(env)


def _launch_with_evidence(sim_node, resolved: dict, suite: str, job: str, extra_env: dict | None = None) -> str:
    """Submit the suite's job with executed-code evidence switched on, as the training operator does."""
    layout = remote.RunLayout(resolved["run_dir"])
    spec = _specs(sim_node, layout.worktree, (suite,))[0]
    key = resolved["run_dir"].rsplit("/", 1)[1]
    command = remote.job_command(layout.worktree, layout.work_dir(job), spec.script, spec.args,
                                 remote.job_marker(key, job), 0)
    env = remote.job_environment({**spec.env, **(extra_env or {})}, layout.work_dir(job), key, job,
                                 sim_node.info["env"])
    env.update(node.evidence_setup(sim_node.client, layout.evidence_dir(job), layout.worktree))
    status, _, err = node.run_script(sim_node.client, remote.submit_job_script(layout.job_dir(job), command, env))
    assert status == 0, err
    return layout.job_dir(job)


def test_the_evidence_records_the_lines_every_process_of_a_training_ran(sim_node):
    """Issue 44: coverage.py in the trainer and its rollout worker (a process of its own), through the job's
    environment; the LMDeploy backend runs in the full launch, the SGLang one in the deterministic lane's."""
    from rl_verify.core import evidence

    resolved = _resolve(sim_node, "it-evidence")
    layout = remote.RunLayout(resolved["run_dir"])
    lane = {"XTUNER_DETERMINISTIC": "true", "XTUNER_USE_SGLANG": "1", "XTUNER_USE_LMDEPLOY": "0",
            "XTUNER_USE_FA3": "0"}
    readings = {}
    for job, extra in (("grpo", None), ("grpo-ref1", lane)):
        assert _wait_exit(sim_node, _launch_with_evidence(sim_node, resolved, "grpo", job, extra), 120) == "0"
        readings[job] = node.evidence_read(sim_node.client, layout.evidence_dir(job), layout.worktree, "python",
                                           evidence.COMPILED_BODY.pattern, layout.work_dir(job),
                                           load_suite("grpo").tracker)
    full, lane_read = readings["grpo"], readings["grpo-ref1"]
    assert full["problems"] == [] and full["processes"] >= 2, full  # the trainer and its worker
    assert full["last_step"] == 45
    for process in load_suite("grpo").evidence.processes:
        assert full["files"].get(process.path), process.path
    assert full["files"].get("xtuner/v1/rl/rollout/lmdeploy.py") and "xtuner/v1/rl/rollout/sglang.py" not in \
        full["files"]
    assert lane_read["files"].get("xtuner/v1/rl/rollout/sglang.py")
    assert "xtuner/v1/model/moe/deepseek_v3.py" not in full["files"]  # code no process imports
    loop = full["files"]["xtuner/rlsim/train_loop.py"]
    assert loop and len(full["hashes"]["xtuner/rlsim/train_loop.py"]) == 40
    rc, blob, _ = sim_node.run(f"git -C {layout.worktree} rev-parse HEAD:xtuner/rlsim/train_loop.py")
    assert blob.strip() == full["hashes"]["xtuner/rlsim/train_loop.py"]  # the git blob id of what was measured
    # The lane job ran every step too here (not stopped after k): its train_loop lines are the full run's.
    assert set(lane_read["files"]["xtuner/rlsim/train_loop.py"]) == set(loop)
