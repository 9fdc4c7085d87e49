"""The launcher seam (issue 45): a node connection's launcher, the Slurm launcher's options and scripts, what its
check and its poll say, and how a job Slurm ended is classed. The scripts against a real Slurm:
tests/e2e/test_slurm.py."""

from __future__ import annotations

import subprocess

import pytest

from rl_verify.core.model import infrastructure_class, is_infrastructure
from rl_verify.node import launcher as launchers
from rl_verify.node.remote import BadInput
from rl_verify.orchestration.probes import free_slots
from rl_verify.orchestration.triggers import parse_poll, pending_too_long, poll_elapsed, poll_scheduler

SLURM = {"launcher": "slurm", "slurm_partition": "gpu", "slurm_account": "rl-verify", "slurm_qos": "normal"}


def test_a_connection_without_a_launcher_extra_launches_over_ssh_as_before():
    assert launchers.launcher_config({}) == {"kind": "ssh"}
    assert isinstance(launchers.launcher_for(None), launchers.SshLauncher)


def test_a_slurm_connection_gives_its_partition_account_qos_and_the_default_pending_limit():
    config = launchers.launcher_config(SLURM)
    assert config["kind"] == "slurm" and config["partition"] == "gpu" and config["account"] == "rl-verify"
    assert config["qos"] == "normal" and config["time"] is None and config["pending_limit_s"] > 0
    chosen = launchers.launcher_for(config)
    assert isinstance(chosen, launchers.SlurmLauncher)
    assert chosen.sbatch_args(8) == ["--partition=gpu", "--nodes=1", "--ntasks=1", "--no-requeue",
                                     "--account=rl-verify", "--qos=normal", "--gres=gpu:8", "--exclusive"]


def test_every_bad_slurm_field_is_named_at_once_with_its_fix():
    with pytest.raises(BadInput) as err:
        launchers.launcher_config({"launcher": "slurm", "slurm_account": "a;b", "slurm_time": "soon",
                                   "slurm_pending_limit_s": "x"}, "gpu_cluster")
    text = str(err.value)
    for field in ("slurm_partition", "slurm_account", "slurm_time", "slurm_pending_limit_s", "gpu_cluster"):
        assert field in text
    with pytest.raises(BadInput, match="use one of ssh, slurm"):
        launchers.launcher_config({"launcher": "k8s"})


def test_the_slurm_job_name_carries_the_run_key_and_the_job():
    assert launchers.slurm_job_name("manual__2026-12-06", "grpo-r1") == "rlv.manual__2026-12-06.grpo-r1"
    with pytest.raises(BadInput):
        launchers.slurm_job_name("key", "grpo; scancel -u root")


def test_the_submit_script_quotes_every_value_and_submits_with_the_targets_options():
    chosen = launchers.launcher_for(launchers.launcher_config(SLURM))
    env = {"EVIL": "$(touch /tmp/pwned)", "RL_VERIFY_JOB": "k/grpo"}
    script = chosen.run("/runs/k/jobs/grpo", "( true )", env, "k", "grpo", 8)
    prelude = script[script.index("\njob_exports=") + 1:script.index("\njob_command=")]  # one value, two lines
    written = subprocess.run(["bash", "-c", prelude + '\nprintf %s "$job_exports"'], capture_output=True, text=True,
                             check=True).stdout
    assert written == "export EVIL='$(touch /tmp/pwned)'\nexport RL_VERIFY_JOB=k/grpo"  # never run while rendered
    assert ("sbatch_args=(--partition=gpu --nodes=1 --ntasks=1 --no-requeue --account=rl-verify --qos=normal "
            "--gres=gpu:8 --exclusive)") in script
    assert "job_name=rlv.k.grpo" in script and "sbatch --parsable" in script
    with pytest.raises(BadInput):
        chosen.run("/runs/k/jobs/grpo", "( true )", {"BAD NAME": "1"}, "k", "grpo", 8)


def test_the_slurm_poll_carries_the_schedulers_word_on_the_header():
    script = launchers.launcher_for(launchers.launcher_config(SLURM)).log("/runs/k/jobs/grpo", 0, 4096)
    assert "slurm_settle" in script and script.index("scheduler=") < script.index("set -u")
    out = b"- 0 0 0 pending:Resources\n"
    assert parse_poll(out)[0] is None and poll_elapsed(out) == 0.0
    assert poll_scheduler(out) == {"state": "pending", "detail": "Resources"}
    assert poll_scheduler(b"0 10 10 42\nlog\n") is None  # an SSH job's poll: no scheduler


def test_a_job_pending_past_the_limit_is_given_up_and_no_limit_waits():
    pending = {"state": "pending", "detail": "Resources"}
    assert pending_too_long(pending, 61, 60) and not pending_too_long(pending, 59, 60)
    assert not pending_too_long(pending, 10_000, 0)
    assert not pending_too_long({"state": "running", "detail": ""}, 10_000, 60)


@pytest.mark.parametrize("detail,named", [
    ("PREEMPTED outside", "preempted"), ("NODE_FAIL outside", "node failure"), ("TIMEOUT outside", "time limit"),
    ("OUT_OF_MEMORY outside", "out of memory"), ("CANCELLED outside", "cancelled outside rl-verify"),
    ("CANCELLED ours", "stopped by rl-verify"), ("PENDING Resources", "never scheduled"),
    ("SPECIAL_EXIT outside", "held by Slurm after a special exit"),
    ("REQUEUED outside", "requeued by Slurm: not rerun"),
    ("BURST_BUFFER_LOST outside", "ended BURST_BUFFER_LOST in Slurm")])
def test_each_end_slurm_gives_a_job_has_its_own_name(detail, named):
    assert launchers.end_class(detail) == named


def test_a_named_infrastructure_class_is_still_an_infrastructure_failure():
    named = infrastructure_class("preempted")
    assert named == "infrastructure (preempted)" and is_infrastructure(named) and is_infrastructure("infrastructure")
    assert not is_infrastructure("accuracy") and not is_infrastructure(None)


def test_the_check_names_the_field_slurm_refuses_and_counts_the_slots():
    config = launchers.launcher_config(SLURM)
    problems, slots = launchers.parse_check(
        "PARTITION\tup\nSLOTS\t2\nTESTONLY\t1\tsbatch: error: Batch job submission failed: Invalid account or "
        "account/partition combination specified\n", config, 8, "slurm_node")
    assert slots == 2 and len(problems) == 1
    assert "slurm_account" in problems[0] and "'rl-verify'" in problems[0] and "Fix:" in problems[0]
    problems, _ = launchers.parse_check("PARTITION\tMISSING\n", config, 8, "slurm_node")
    assert "does not exist" in problems[0] and "slurm_partition" in problems[0]
    problems, _ = launchers.parse_check("PARTITION\tdown\nSLOTS\t2\nTESTONLY\t0\tok\n", config, 8, "n")
    assert "is down" in problems[0]
    problems, _ = launchers.parse_check("SLURMCMD\tmissing\tsbatch\n", config, 8, "n")
    assert "`sbatch` is not on the SSH user's PATH" in problems[0]
    problems, _ = launchers.parse_check("PARTITION\tup\nSLOTS\t2\nTESTONLY\t1\tsbatch: error: Invalid qos "
                                        "specification\n", config, 8, "n")
    assert "slurm_qos" in problems[0]


def test_a_slurm_target_offers_as_many_probe_slots_as_its_partition_runs_jobs():
    plan = {"nodes": ["slurm", "ssh_a"], "slots": {"slurm": 2}}
    assert free_slots(plan, []) == ["slurm", "slurm", "ssh_a"]
    assert free_slots(plan, ["slurm", "ssh_a"]) == ["slurm"]
    assert free_slots({"nodes": ["a", "b"]}, ["a"]) == ["b"]  # a plan made before issue 45: one slot a node
