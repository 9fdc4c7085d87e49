"""Issue 53 item 3 on the simulated node: every process of a training records (the trainer, its rollout worker, its
reward-scoring Pool worker forked by multiprocessing, OPD's teachers), and each kind of process the suite expects is
proven by a process of its own; a rollout worker the job's environment does not reach is named, though the driver
imported its module."""

from __future__ import annotations

import time

import pytest
from sim_ssh import simnode

from rl_verify.core import blocks, evidence
from rl_verify.core.names import run_key
from rl_verify.engines import load_suite
from rl_verify.node import ops as node
from rl_verify.node import remote

pytestmark = pytest.mark.integration

LOOP = "xtuner/rlsim/train_loop.py"


def _read(sim_node, run_id: str, suite: str) -> dict:
    """One job of ``suite`` (main) with executed-code evidence, as the training operator launches and reads it."""
    resolved = node.resolve_commit(sim_node.client, sim_node.checkout, f"{sim_node.info['root']}/runs",
                                   run_key(run_id), "main")
    layout = remote.RunLayout(resolved["run_dir"])
    spec = load_suite(suite)
    expanded = spec.expanded({**sim_node.info["env"], "CHECKOUT": layout.worktree})
    key = resolved["run_dir"].rsplit("/", 1)[1]
    command = remote.job_command(layout.worktree, layout.work_dir(suite), expanded.script, expanded.args,
                                 remote.job_marker(key, suite), 0)
    env = remote.job_environment(expanded.env, layout.work_dir(suite), key, suite, sim_node.info["env"])
    env.update(node.evidence_setup(sim_node.client, layout.evidence_dir(suite), layout.worktree, "python3"))
    job = layout.job_dir(suite)
    status, _, err = node.run_script(sim_node.client, remote.submit_job_script(job, command, env))
    assert status == 0, err
    deadline = time.monotonic() + 180
    while not node.run_script(sim_node.client, f"cat {job}/exit_code 2>/dev/null")[1].strip():
        assert time.monotonic() < deadline, "job did not finish"
        time.sleep(0.3)
    reading = node.evidence_read(sim_node.client, layout.evidence_dir(suite), layout.worktree, "python3",
                                 evidence.COMPILED_BODY.pattern, layout.work_dir(suite), spec.tracker,
                                 [(p.kind, p.runs) for p in spec.evidence.processes])
    _, source, _ = sim_node.run(f"cat {layout.worktree}/{LOOP}")
    return {**reading, "loop_source": source}


def _kinds(suite: str) -> list[tuple[str, str]]:
    return [(p.kind, p.runs) for p in load_suite(suite).evidence.processes]


def test_every_kind_of_process_is_proven_by_its_own_and_the_forked_reward_worker_records(faults):
    grpo = _read(faults, "it-processes-grpo", "grpo")
    assert evidence.completeness({"full run": grpo}, _kinds("grpo")) == [], grpo["kinds"]
    trainer, worker = set(grpo["kinds"]["trainer"]), set(grpo["kinds"]["rollout worker"])
    assert len(trainer) == 1 and len(worker) == 1 and not trainer & worker
    assert "rl.py" in grpo["argv"][str(min(trainer))] and "worker.py" in grpo["argv"][str(min(worker))]
    # train_loop.score_rewards runs only in the trainer's forked Pool worker, every step: recorded by that process.
    first, last = blocks.body_range(grpo["loop_source"], "score_rewards")
    assert set(grpo["files"][LOOP]) & set(range(first, last + 1)), grpo["files"][LOOP]

    opd = _read(faults, "it-processes-opd", "opd")
    assert evidence.completeness({"full run": opd}, _kinds("opd")) == [], (opd["kinds"], opd["problems"])
    assert len(opd["kinds"]["teacher"]) == 2  # the gsm8k and geo3k teachers, each a process of its own
    assert not set(opd["kinds"]["teacher"]) & set(opd["kinds"]["trainer"])


def test_a_rollout_worker_the_environment_did_not_reach_is_a_named_missing_kind(faults):
    simnode.set_worker_env(faults.state, scrubbed=True)
    try:
        reading = _read(faults, "it-processes-scrubbed", "grpo")
    finally:
        simnode.set_worker_env(faults.state, scrubbed=False)
    assert reading["files"].get("xtuner/v1/rl/rollout/worker.py")  # the driver imported the worker's module
    assert reading["kinds"]["rollout worker"] == [] and reading["kinds"]["trainer"]
    assert evidence.completeness({"full run": reading}, _kinds("grpo")) == [
        "the full run: no process of kind 'rollout worker' recorded (xtuner/v1/rl/rollout/worker.py:RolloutWorker.init)"
        ": the environment did not reach it"]
