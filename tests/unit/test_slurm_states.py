"""Slurm's states, once (issue 54): the table in ``node/slurm_states.py`` is what the rendered shell library
answers, and a Slurm that does not answer is "unknown", never "gone". squeue and sacct are stand-ins here that say
what the real ones say (their words and exit statuses were read off Slurm 22.05: a frozen slurmctld, a stopped one,
a purged job id, accounting off); the scripts against the real Slurm: tests/e2e/test_slurm.py."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from rl_verify.node import launcher as launchers
from rl_verify.node import slurm_states
from rl_verify.node.slurm_states import BY_BODY, BY_SLURM, PENDING, RUNNING, STATES

SLURM = {"launcher": "slurm", "slurm_partition": "gpu"}
STAND_IN = """#!/usr/bin/env bash
# {name} as the test sets it: FAKE_{up}_OUT printed, FAKE_{up}_ERR on stderr, exit FAKE_{up}_RC.
[ -n "${{FAKE_{up}_OUT:-}}" ] && printf '%s\\n' "$FAKE_{up}_OUT"
[ -n "${{FAKE_{up}_ERR:-}}" ] && printf '%s\\n' "$FAKE_{up}_ERR" >&2
exit "${{FAKE_{up}_RC:-0}}"
"""
TIMED_OUT = "slurm_load_jobs error: Socket timed out on send/recv operation"
NO_CONTROLLER = "slurm_load_jobs error: Unable to contact slurm controller (connect failure)"
PURGED = "slurm_load_jobs error: Invalid job id specified"
NO_ACCOUNTING = "Slurm accounting storage is disabled"


@pytest.fixture()
def slurm_bin(tmp_path: Path) -> Path:
    folder = tmp_path / "bin"
    folder.mkdir()
    for name in ("squeue", "sacct"):
        (folder / name).write_text(STAND_IN.format(name=name, up=name.upper()))
        (folder / name).chmod(0o755)
    return folder


def _job(tmp_path: Path, **files: str) -> Path:
    job = tmp_path / "job"
    job.mkdir(parents=True, exist_ok=True)
    (job / "slurm_job_id").write_text("42\n")
    for name, text in files.items():
        (job / name).write_text(text)
    return job


def _lib(monkeypatch: pytest.MonkeyPatch, settle_s: int) -> str:
    monkeypatch.setattr(launchers.settings, "SLURM_SETTLE_S", settle_s)
    return launchers.slurm_library()


def _bash(slurm_bin: Path, script: str, **fake: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": f"{slurm_bin}:{os.environ['PATH']}", **fake}
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env, timeout=60)


def _settle(slurm_bin: Path, lib: str, job: Path, **fake: str) -> str:
    out = _bash(slurm_bin, f'{lib}\nslurm_settle {job}', **fake)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_the_table_names_every_state_the_old_lists_named_and_its_kinds_do_not_overlap():
    kinds = {kind for kind, _ in STATES.values()}
    assert kinds == {PENDING, RUNNING, BY_SLURM, BY_BODY}
    # The four lists issue 54 found in disagreement, now one table: each of their states has one kind.
    for state in ("REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD", "FAILED", "COMPLETING", "PENDING", "SPECIAL_EXIT",
                  "REVOKED", "STOPPED", "SIGNALING", "STAGE_OUT", "RESIZING"):
        assert state in STATES
    assert slurm_states.ACTIVE == set(slurm_states.states_of(PENDING)) | set(slurm_states.states_of(RUNNING))
    assert slurm_states.kind_of("NEVER_HEARD_OF") == BY_SLURM


@pytest.mark.parametrize("state", sorted(STATES))
def test_the_rendered_library_answers_each_state_as_the_table_says(state, tmp_path, slurm_bin, monkeypatch):
    kind = STATES[state][0]
    job = _job(tmp_path)
    said = _settle(slurm_bin, _lib(monkeypatch, 0), job, FAKE_SQUEUE_OUT=f"{state} Priority")
    expected = {PENDING: "pending Priority", RUNNING: "running"}.get(kind, f"ended {state} outside")
    assert said == expected
    active = _bash(slurm_bin, f"{_lib(monkeypatch, 0)}\nslurm_active 42", FAKE_SQUEUE_OUT=state)
    assert (active.returncode == 0) == (state in slurm_states.ACTIVE)


def test_a_job_slurm_shows_ended_without_its_exit_code_settles_before_its_end_is_written(tmp_path, slurm_bin,
                                                                                         monkeypatch):
    job = _job(tmp_path)
    lib = _lib(monkeypatch, 600)
    assert _settle(slurm_bin, lib, job, FAKE_SQUEUE_OUT="COMPLETED None") == "settling COMPLETED"
    assert not (job / "scheduler_end").exists()  # nothing written for good from one look
    (job / "exit_code").write_text("0\n")  # the shared filesystem shows it late
    assert _settle(slurm_bin, lib, job, FAKE_SQUEUE_OUT="COMPLETED None") == "finished"


def test_a_later_exit_code_corrects_an_end_written_without_it(tmp_path, slurm_bin, monkeypatch):
    job = _job(tmp_path, scheduler_end="COMPLETED outside\n", exit_code="0\n")
    fake = {"FAKE_SQUEUE_ERR": PURGED, "FAKE_SQUEUE_RC": "1", "FAKE_SACCT_ERR": NO_ACCOUNTING, "FAKE_SACCT_RC": "1"}
    assert _settle(slurm_bin, _lib(monkeypatch, 0), job, **fake) == "finished"
    # A body killed by Slurm's signal (143) after a time limit is still Slurm's end.
    (job / "scheduler_end").write_text("TIMEOUT outside\n")
    (job / "exit_code").write_text("143\n")
    assert _settle(slurm_bin, _lib(monkeypatch, 0), job, **fake) == "ended TIMEOUT outside"


@pytest.mark.parametrize("words", [TIMED_OUT, NO_CONTROLLER, ""], ids=["frozen", "stopped", "silent"])
def test_a_slurm_that_does_not_answer_is_unknown_never_gone_and_a_stop_still_cancels(words, tmp_path, slurm_bin,
                                                                                    monkeypatch):
    job = _job(tmp_path)
    lib = _lib(monkeypatch, 0)
    said = _settle(slurm_bin, lib, job, FAKE_SQUEUE_ERR=words, FAKE_SQUEUE_RC="1")
    assert said.startswith("unknown squeue_failed:") and " " not in said.removeprefix("unknown "), said
    assert not (job / "scheduler_end").exists()
    assert _bash(slurm_bin, f"{lib}\nslurm_active 42", FAKE_SQUEUE_ERR=words, FAKE_SQUEUE_RC="1").returncode == 0
    # A body that ended by itself while Slurm is silent has finished; one killed by a signal waits for Slurm's word.
    (job / "exit_code").write_text("0\n")
    assert _settle(slurm_bin, lib, job, FAKE_SQUEUE_ERR=words, FAKE_SQUEUE_RC="1") == "finished"
    (job / "exit_code").write_text("137\n")
    assert _settle(slurm_bin, lib, job, FAKE_SQUEUE_ERR=words, FAKE_SQUEUE_RC="1").startswith("unknown ")


def test_a_job_slurm_forgot_is_read_from_accounting_and_else_named_dead(tmp_path, slurm_bin, monkeypatch):
    job = _job(tmp_path)
    lib = _lib(monkeypatch, 0)
    purged = {"FAKE_SQUEUE_ERR": PURGED, "FAKE_SQUEUE_RC": "1"}
    assert _settle(slurm_bin, lib, job, **purged, FAKE_SACCT_OUT="NODE_FAIL|None") == "ended NODE_FAIL outside"
    job = _job(tmp_path / "other")
    assert _settle(slurm_bin, lib, job, **purged, FAKE_SACCT_OUT="CANCELLED by 0|None") == "ended CANCELLED outside"
    job = _job(tmp_path / "third")
    said = _settle(slurm_bin, lib, job, **purged, FAKE_SACCT_ERR=NO_ACCOUNTING, FAKE_SACCT_RC="1")
    assert said.startswith("dead Slurm no longer knows job 42"), said
    # slurmdbd down: accounting's silence is no answer either.
    said = _settle(slurm_bin, lib, job, **purged, FAKE_SACCT_ERR="sacct: error: slurmdbd: Connection refused",
                   FAKE_SACCT_RC="1")
    assert said.startswith("unknown sacct_failed:"), said
    assert _bash(slurm_bin, f"{lib}\nslurm_active 42", **purged).returncode == 1  # a purged id is not active


def test_a_second_start_of_the_batch_step_never_trains_again(tmp_path, slurm_bin):
    sbatch = slurm_bin / "sbatch"
    sbatch.write_text('#!/usr/bin/env bash\necho "$@" >"${FAKE_SBATCH_ARGS}"\necho 7\n')
    sbatch.chmod(0o755)
    job = tmp_path / "job"
    script = launchers.launcher_for(launchers.launcher_config(SLURM)).run(
        str(job), "( echo trained >>\"$TRAININGS\" )", {"RL_VERIFY_JOB": "k/grpo"}, "k", "grpo", 8)
    args = tmp_path / "sbatch.args"
    out = _bash(slurm_bin, script, FAKE_SQUEUE_OUT="", FAKE_SBATCH_ARGS=str(args))
    assert out.returncode == 0 and "JOB 7 submitted" in out.stdout, out.stderr
    assert "--no-requeue" in args.read_text().split()
    trainings = tmp_path / "trainings"
    first = _bash(slurm_bin, f"bash {job}/batch.sh {job}", TRAININGS=str(trainings))
    assert first.returncode == 0 and (job / "exit_code").read_text().strip() == "0"
    (job / "exit_code").unlink()  # as after a node failure: the first start wrote none
    again = _bash(slurm_bin, f"bash {job}/batch.sh {job}", TRAININGS=str(trainings))
    assert again.returncode == 1 and "not rerun" in again.stderr
    assert trainings.read_text() == "trained\n"  # one training
    assert (job / "scheduler_end").read_text().strip() == "REQUEUED outside"
    assert launchers.end_class("REQUEUED outside") == "requeued by Slurm: not rerun"


def test_an_unreachable_limit_comes_from_the_connection_and_a_bad_one_is_named():
    assert launchers.launcher_config(SLURM)["unreachable_s"] == launchers.settings.SLURM_UNREACHABLE_S
    assert launchers.launcher_for(launchers.launcher_config({**SLURM, "slurm_unreachable_s": "90"})).unreachable_s == 90
    with pytest.raises(launchers.BadInput, match="slurm_unreachable_s"):
        launchers.launcher_config({**SLURM, "slurm_unreachable_s": "soon"})


def test_the_watch_waits_out_a_silent_slurm_up_to_its_limit_then_gives_the_job_up():
    import asyncio

    from rl_verify.orchestration.triggers import RLJobTrigger

    config = launchers.launcher_config({**SLURM, "slurm_unreachable_s": "60"})
    trigger = RLJobTrigger(ssh_conn_id="n", job_dir="/r/k/jobs/grpo", job_marker="k/grpo", launcher=config)
    sent: list[str] = []

    async def script(conn, text):
        sent.append(text)
        return 0, b"SCANCEL 42 rlv.k.grpo\nSLURMWAIT\t10\n"

    trigger._script = script
    silent = {"state": "unknown", "detail": "squeue_failed: Unable to contact slurm controller"}

    async def watch() -> list:
        ends = []
        trigger._note_scheduler({"state": "running", "detail": ""})
        trigger._note_scheduler(silent)
        ends.append(await trigger._scheduler_end(None, None))  # silent for a moment: still running
        trigger._note_scheduler({"state": "running", "detail": ""})  # Slurm answers again: the silence is over
        ends.append(trigger._unknown_since)
        trigger._note_scheduler(silent)
        trigger._unknown_since -= 61  # silent past the connection's limit
        ends.append(await trigger._scheduler_end(None, None))
        return ends

    first, cleared, given_up = asyncio.run(watch())
    assert first is None and cleared is None and not sent[:-1]
    assert given_up.payload["status"] == "scheduler" and "did not answer for" in given_up.payload["message"]
    assert "slurm_unreachable_s" in given_up.payload["message"] and "scancel" in sent[-1]
    assert trigger._scheduler == {"state": "running", "detail": ""}  # the silence never replaced the last answer


def test_placement_extras_reach_sbatch_and_each_bad_one_is_named():
    chosen = launchers.launcher_for(launchers.launcher_config(
        {**SLURM, "slurm_gpu_type": "h200", "slurm_constraint": "h200&ib", "slurm_cpus_per_task": "96",
         "slurm_mem": "512G"}))
    args = chosen.sbatch_args(8)
    assert "--gres=gpu:h200:8" in args and "--constraint=h200&ib" in args and "--exclusive" in args
    assert "--cpus-per-task=96" in args and "--mem=512G" in args
    shared = launchers.launcher_for(launchers.launcher_config({**SLURM, "slurm_exclusive": "false"}))
    assert "--exclusive" not in shared.sbatch_args(8) and "--gres=gpu:8" in shared.sbatch_args(8)
    with pytest.raises(launchers.BadInput) as err:
        launchers.launcher_config({**SLURM, "slurm_gpu_type": "h200:8", "slurm_constraint": "a;b",
                                   "slurm_exclusive": "maybe", "slurm_cpus_per_task": "0", "slurm_mem": "lots"})
    for field in ("slurm_gpu_type", "slurm_constraint", "slurm_exclusive", "slurm_cpus_per_task", "slurm_mem"):
        assert field in str(err.value)


def _check(slurm_bin: Path, config: dict, nodes: str, gpus: int = 8) -> tuple[list[str], int | None]:
    sinfo = slurm_bin / "sinfo"
    # -s / -o %a: the partition is up; -N: one line per node (name|GRES|state), as the test gives them.
    sinfo.write_text('#!/usr/bin/env bash\ncase "$*" in *-N*) printf "%s" "$FAKE_NODES" ;; *) echo up ;; esac\n')
    sinfo.chmod(0o755)
    for name in ("sbatch", "scancel"):
        (slurm_bin / name).write_text("#!/usr/bin/env bash\nexit 0\n")
        (slurm_bin / name).chmod(0o755)
    chosen = launchers.launcher_for(launchers.launcher_config(config))
    out = _bash(slurm_bin, chosen.check(gpus), FAKE_NODES=nodes)
    return launchers.parse_check(out.stdout, launchers.launcher_config(config), gpus, "c")


def test_slots_count_usable_nodes_every_gpu_entry_and_the_asked_type(slurm_bin):
    nodes = ("n1|gpu:h200:8(S:0-1)|idle\nn2|gpu:h100:4,gpu:h100:4|mix\nn3|gpu:16|alloc\n"
             "n4|gpu:h200:8|drain\nn5|gpu:h200:8|idle*\nn6|gpu:h200:8|down\nn7|(null)|idle\n")
    shared = {**SLURM, "slurm_exclusive": "false"}
    assert _check(slurm_bin, shared, nodes) == ([], 4)  # n1 1, n2 1 (two entries), n3 2; drained/down/silent none
    assert _check(slurm_bin, SLURM, nodes) == ([], 3)  # exclusive: one job a node
    assert _check(slurm_bin, {**shared, "slurm_gpu_type": "h200"}, nodes) == ([], 1)
    problems, slots = _check(slurm_bin, {**SLURM, "slurm_gpu_type": "a100"}, nodes)
    assert slots == 0 and "no usable node" in problems[0] and "'a100'" in problems[0]
    assert "3 of its nodes are drained, down or not responding" in problems[0]
