"""Issue 53 item 6 on the simulated node: GRPO's config fixes its step count, so its lane's evidence run is given a
config written in the job's evidence folder (the spec's ``evidence.stop_config``) that runs the suite's config and sets
``trainer.rollout_steps`` to k - 1: the run ends by itself at step k - 1, and its evidence is complete (no step past
the lane's)."""

from __future__ import annotations

import json
import time

import pytest

from rl_verify import settings
from rl_verify.core import evidence
from rl_verify.core.names import run_key
from rl_verify.engines import load_suite
from rl_verify.node import ops as node
from rl_verify.node import remote
from rl_verify.orchestration import bitwise_lane

pytestmark = pytest.mark.integration

CONFIG = "autotest/config/rl_qwen3_gsm8k_grpo.py"


def _run(sim_node, resolved: dict, job: str, lane_evidence: bool) -> dict:
    """One GRPO job with executed-code evidence, launched as the training operator launches it (``_start``): the
    full run, or the lane's evidence run (``evidence_lane_spec``, its config given by ``evidence_stop_config``);
    run to its own end (no trigger stops it), then read."""
    spec = load_suite("grpo")
    layout = remote.RunLayout(resolved["run_dir"])
    launched = (bitwise_lane.evidence_lane_spec(spec) if lane_evidence else spec).expanded(
        {**sim_node.info["env"], "CHECKOUT": layout.worktree})
    key = resolved["run_dir"].rsplit("/", 1)[1]
    python = spec.node.python or "python3"
    env = remote.job_environment(launched.env, layout.work_dir(job), key, job, sim_node.info["env"])
    env.update(node.evidence_setup(sim_node.client, layout.evidence_dir(job), layout.worktree, python))
    args = tuple(launched.args)
    stop = bitwise_lane.evidence_stop_config(spec) if lane_evidence else None
    if stop is not None:
        index, attribute, value = stop
        given = node.evidence_config(sim_node.client, layout.evidence_dir(job), layout.worktree, args[index],
                                     attribute, value)
        args = (*args[:index], given, *args[index + 1:])
    command = remote.job_command(layout.worktree, layout.work_dir(job), launched.script, args,
                                 remote.job_marker(key, job), 0)
    status, _, err = node.run_script(sim_node.client, remote.submit_job_script(layout.job_dir(job), command, env))
    assert status == 0, err
    deadline = time.monotonic() + 180
    while not (code := node.run_script(sim_node.client, f"cat {layout.job_dir(job)}/exit_code 2>/dev/null")[1]
               .strip()):
        assert time.monotonic() < deadline, f"{job} did not end by itself"
        time.sleep(0.3)
    reading = node.evidence_read(sim_node.client, layout.evidence_dir(job), layout.worktree, python,
                                 evidence.COMPILED_BODY.pattern, layout.work_dir(job), spec.tracker,
                                 [(p.kind, p.runs) for p in spec.evidence.processes])
    _, rows, _ = sim_node.run(f"cat {layout.work_dir(job)}/*/logs/exp_tracking/tracker.jsonl")
    _, copied, _ = sim_node.run(f"cat {layout.work_dir(job)}/config.py")  # run_rl.sh copies the config it was given
    return {**reading, "exit": code, "steps": sorted({json.loads(r)["step"] for r in rows.splitlines()}),
            "config_copy": copied}


def test_grpos_lane_evidence_run_ends_by_itself_at_step_k_minus_1_with_complete_evidence(faults, monkeypatch):
    spec = load_suite("grpo")
    k = spec.bitwise.steps
    resolved = node.resolve_commit(faults.client, faults.checkout, f"{faults.info['root']}/runs",
                                   run_key("it-evidence-stop-grpo"), "main")
    lane_job = settings.lane_job("grpo", "ref1")
    lane = _run(faults, resolved, lane_job, lane_evidence=True)
    full = _run(faults, resolved, "grpo", lane_evidence=False)

    assert lane["exit"] == "0" and lane["last_step"] == k - 1 and lane["steps"] == list(range(k)), lane["steps"]
    assert lane["problems"] == [] and lane["config_copy"].startswith('"""rl-verify (issue 53)')
    assert full["exit"] == "0" and full["last_step"] == spec.expected_steps and full["problems"] == []
    assert not full["config_copy"].startswith('"""rl-verify')  # the full run: the suite's config as it is
    # The suite's config ran in both, measured as the checkout's; the written one lies outside the worktree.
    assert lane["files"].get(CONFIG) and set(lane["files"][CONFIG]) == set(full["files"][CONFIG])
    rc, dirty, _ = faults.run(f"git -C {resolved['worktree']} status --porcelain")
    assert rc == 0 and dirty.strip() == ""
    # The lane's steps ran less of the step schedule than the full run (train_loop's code paths from step 3 on).
    loop = "xtuner/rlsim/train_loop.py"
    assert set(lane["files"][loop]) < set(full["files"][loop])

    # What bitwise_lane.evidence_of makes of the two readings: complete, no step past the lane's.
    runs = {"grpo/evidence-full.json": full, "grpo/evidence-lane.json": lane}
    monkeypatch.setattr(bitwise_lane.record, "get_json", lambda run_id, path, dag_id=None: runs.get(path))
    found = bitwise_lane.evidence_of("it-evidence-stop-grpo", spec)
    assert found["problems"] == [], found["problems"]
    assert set(found["lane"][loop]) < set(found["full"][loop])
