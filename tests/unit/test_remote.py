"""Every value that reaches a remote shell is validated first and quoted; scripts are well-formed."""

from __future__ import annotations

import os
import shlex
import subprocess
import time

import pytest

from rl_verify.core.names import run_key
from rl_verify.node import remote

BAD_COMMITS = {
    "semicolon": "main; rm -rf /",
    "command substitution": "$(reboot)",
    "backticks": "`id`",
    "newline": "main\nid",
    "space": "main branch",
    "leading dash": "--upload-pack=evil",
    "too long": "a" * 201,
    "empty": "",
    "dot-dot": "main..evil",
    "pipe": "main|id",
}


@pytest.mark.parametrize("name", sorted(BAD_COMMITS))
def test_bad_commit_is_rejected_naming_the_field(name):
    with pytest.raises(remote.BadInput) as err:
        remote.validate_commit(BAD_COMMITS[name])
    assert "'commit'" in str(err.value)


@pytest.mark.parametrize("good", ["main", "v1.2.3", "feature/opd-fix", "4e7db028",
                                  "0123456789abcdef0123456789abcdef01234567", "sim/regress-init", "a" * 200])
def test_good_commit_is_accepted(good):
    assert remote.validate_commit(good) == good


@pytest.mark.parametrize("bad", [[], "", ["dapo"], ["grpo", "nope"], None, 3])
def test_unknown_or_empty_suites_are_rejected(bad):
    with pytest.raises(remote.BadInput) as err:
        remote.validate_suites(bad)
    assert "'suites'" in str(err.value)


def test_suites_keep_known_order_and_drop_duplicates():
    assert remote.validate_suites(["opd", "grpo", "opd"]) == ["grpo", "opd"]
    assert remote.validate_suites("opd") == ["opd"]


@pytest.mark.parametrize("bad", ["relative/path", "/a/../etc", "/a b", "/a;b", "~user/x", "/a$(id)"])
def test_unsafe_paths_are_rejected(bad):
    with pytest.raises(remote.BadInput):
        remote.validate_path(bad, "CI_SHARE_MODEL")


def test_home_relative_path_stays_expandable_but_quoted():
    assert remote.q("~/x y") == "\"$HOME\"/'x y'"
    assert remote.q("/plain/path") == "/plain/path"


def test_run_key_is_deterministic_and_shell_safe():
    key = run_key("manual__2026-11-29T23:54:51.123+00:00")
    assert key == run_key("manual__2026-11-29T23:54:51.123+00:00")
    assert key != run_key("manual__2026-11-29T23:54:51.124+00:00")
    assert all(c.isalnum() or c in "._-" for c in key)


def _bash_syntax_ok(script: str) -> bool:
    return subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0


def test_generated_scripts_are_valid_bash():
    assert _bash_syntax_ok(remote.resolve_commit_script("~/xtuner", "~/runs", "k-1", "main"))
    assert _bash_syntax_ok(remote.prerequisites_script([("grpo", "model", "/m/Qwen3-8B")], "/runs", "k"))
    assert _bash_syntax_ok(remote.cleanup_script("/runs/k", "k"))
    assert _bash_syntax_ok(remote.job_command("/wt", "/wt/w", "run.sh", ["a b", "$(x)"], "k/grpo", 900))
    assert _bash_syntax_ok(remote.kill_job_script("/runs/k/jobs/grpo", "k/grpo"))
    assert _bash_syntax_ok(remote.reap_script("~/runs", "~/xtuner", "k", 7))


def test_job_command_quotes_every_argument():
    cmd = remote.job_command("/wt", "/w", "examples/run.sh", ["$(touch /tmp/pwned)", "a;b"], "k/grpo", 0)
    assert "'$(touch /tmp/pwned)'" in cmd and "'a;b'" in cmd


def test_prerequisites_script_reports_missing_and_present(tmp_path):
    present = tmp_path / "model"
    present.mkdir()
    script = remote.prerequisites_script(
        [("grpo", "model", str(present)), ("opd", "teacher", str(tmp_path / "absent"))], str(tmp_path), "k")
    out = subprocess.run(["bash", "-s"], input=script, text=True, capture_output=True).stdout
    assert f"OK\tgrpo\tmodel\t{present}" in out
    assert f"MISSING\topd\tteacher\t{tmp_path / 'absent'}" in out


def test_resolve_commit_script_refuses_a_bad_commit_before_building():
    with pytest.raises(remote.BadInput):
        remote.resolve_commit_script("~/xtuner", "~/runs", "k", "main;id")


def test_job_command_is_one_compound_command_whose_status_and_output_are_kept(tmp_path):
    # The remote-job wrapper appends ">>log 2>&1" and reads "$?": both must cover the whole body.
    script = tmp_path / "launch.sh"
    script.write_text("echo training; exit 3\n")
    body = remote.job_command(str(tmp_path), str(tmp_path / "w"), script.name, [], "k/grpo", 0)
    log = tmp_path / "log"
    status = subprocess.run(["bash", "-c", f"{body} >>{log} 2>&1; echo $? > {tmp_path / 'ec'}"]).returncode
    assert status == 0 and (tmp_path / "ec").read_text().strip() == "3"
    assert "training" in log.read_text() and "launch script exited 3" in log.read_text()


def test_stall_watchdog_kills_a_job_whose_tracker_stops_growing(tmp_path):
    # A launch script that writes two step rows, then hangs: the watchdog must kill it and say where.
    work = tmp_path / "w"
    tracker = work / "20261129000000" / "logs" / "exp_tracking" / "tracker.jsonl"
    script = tmp_path / "launch.sh"
    script.write_text(f"mkdir -p {tracker.parent}\n"
                      f"echo '{{\"step\": 1, \"response/rewards/mean\": 0.5}}' >> {tracker}\n"
                      f"echo '{{\"step\": 2, \"response/rewards/mean\": 0.5}}' >> {tracker}\n"
                      "exec sleep 600\n")
    body = remote.job_command(str(tmp_path), str(work), script.name, [], "k/grpo", 2)
    # Exported inside the shell, as the remote-job wrapper does: only exec'd children carry it.
    done = subprocess.run(["bash", "-c", f"export RL_VERIFY_JOB=k/grpo\n{body}"], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 124
    assert "STALLED at step 2" in done.stdout
    assert (work / ".rl-verify-stalled").read_text().strip() == "2"
    assert subprocess.run(["pgrep", "-f", "^sleep 600$"]).returncode == 1  # nothing left running


def test_watchdog_leaves_a_healthy_job_alone(tmp_path):
    script = tmp_path / "launch.sh"
    script.write_text("exit 0\n")
    body = remote.job_command(str(tmp_path), str(tmp_path / "w"), script.name, [], "k/grpo", 2)
    done = subprocess.run(["bash", "-c", body], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "STALLED" not in done.stdout


# ------------------------------------------------------------------------------ templates


@pytest.mark.parametrize("name", ["Upper", "1st", "a-b", "a b", "x;id", "$(id)", ""])
def test_render_refuses_a_bad_variable_name(name):
    with pytest.raises(ValueError, match="lower-case shell name"):
        remote.render("job_state", **{name: "/x"})


@pytest.mark.parametrize("value", [True, 1.5, None, ["a", 1], {"a": "b"}])
def test_render_refuses_a_value_that_is_not_str_int_or_list_of_str(value):
    with pytest.raises(TypeError):
        remote.render("job_state", job_dir=value)


def test_render_quotes_values_before_the_template():
    script = remote.render("job_state", job_dir="~/a b", n=3, argv=["$(id)", "~/x"])
    prelude = script.split("#!/usr/bin/env bash", 1)[0]
    assert prelude == "job_dir=\"$HOME\"/'a b'\nn=3\nargv=('$(id)' '~/x')\n"


def _every_script() -> dict[str, str]:
    """One rendered script per public builder (the job body as the wrapper would run it)."""
    return {
        "resolve_commit": remote.resolve_commit_script("~/xtuner", "~/runs", "k-1", "main"),
        "prerequisites": remote.prerequisites_script([("grpo", "model", "~/m/Qwen3-8B")], "/runs", "k",
                                                     own_suite="grpo"),
        "prerequisites_none": remote.prerequisites_script([], "/runs", "k"),
        "job": remote.job_command("/wt", "/wt/w", "run.sh", ["a b", "$(x)", "it's"], "k/grpo", 900),
        "submit": remote.submit_job_script("/runs/k/jobs/grpo", "( echo submitted )", {"A": "b c", "B": "$(x)"}),
        "poll": remote.job_poll_script("/runs/k/jobs/grpo", 10, 65536),
        "kill_job": remote.kill_job_script("/runs/k/jobs/grpo", "k/grpo"),
        "cleanup": remote.cleanup_script("~/runs/k", "k"),
        "reap": remote.reap_script("~/runs", "~/xtuner", "k", 7),
        "job_state": remote.job_state_script("/runs/k/jobs/grpo"),
    }


@pytest.mark.parametrize("name", sorted(_every_script()))
def test_every_rendered_script_runs_under_bash_n(name):
    script = _every_script()[name]
    done = subprocess.run(["bash", "-n"], input=script, text=True, capture_output=True)
    assert done.returncode == 0, done.stderr


def test_every_template_starts_with_its_bash_shebang():
    from importlib.resources import files

    for path in files("rl_verify.node").joinpath("sh").iterdir():
        if path.name.endswith(".sh"):
            assert path.read_text().startswith("#!/usr/bin/env bash\n"), path.name


def test_the_marked_function_is_defined_once_per_script():
    for name, script in _every_script().items():
        assert script.count("marked() {") == (1 if name in ("job", "kill_job", "cleanup") else 0), name


def test_prerequisites_expand_a_home_path_and_refuse_tabs(tmp_path, monkeypatch):
    (tmp_path / "model").mkdir()
    monkeypatch.setenv("HOME", str(tmp_path))
    script = remote.prerequisites_script([("grpo", "model", "~/model")], str(tmp_path / "runs"), "k")
    out = subprocess.run(["bash", "-s"], input=script, text=True, capture_output=True).stdout
    assert f"OK\tgrpo\tmodel\t{tmp_path}/model" in out.splitlines()
    for bad in [("gr\tpo", "model", "/m"), ("grpo", "mo\ndel", "/m"), ("", "model", "/m")]:
        with pytest.raises(remote.BadInput):
            remote.prerequisites_script([bad], "/runs", "k")


def test_prerequisites_report_a_live_job_of_another_run_as_busy(tmp_path):
    job = tmp_path / "other-run" / "jobs" / "grpo"
    job.mkdir(parents=True)
    sleeper = subprocess.Popen(["sleep", "60"], start_new_session=True)  # a job leads its own group
    try:
        (job / "pid").write_text(str(sleeper.pid))
        mine = remote.prerequisites_script([], str(tmp_path), "other-run")
        theirs = remote.prerequisites_script([], str(tmp_path), "this-run")
        run = lambda s: subprocess.run(["bash", "-s"], input=s, text=True, capture_output=True).stdout  # noqa: E731
        assert not [line for line in run(mine).splitlines() if line.startswith("BUSY")]
        busy = [line.split("\t") for line in run(theirs).splitlines() if line.startswith("BUSY")]
        assert busy and busy[0][:3] == ["BUSY", str(job), str(sleeper.pid)]
    finally:
        sleeper.kill()
        sleeper.wait()


def _job_state(job_dir) -> str:
    done = subprocess.run(["bash", "-s"], input=remote.job_state_script(str(job_dir)), text=True,
                          capture_output=True, timeout=30)
    assert done.returncode == 0 and done.stderr == ""
    return done.stdout


def test_job_state_script_prints_each_state(tmp_path):
    job = tmp_path / "jobs" / "grpo"
    assert _job_state(job) == "absent\n"
    job.mkdir(parents=True)
    assert _job_state(job) == "dead\n"  # started (folder made), no pid, no exit code
    sleeper = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        (job / "pid").write_text(str(sleeper.pid))
        assert _job_state(job) == "running\n"
    finally:
        sleeper.kill()
        sleeper.wait()
    assert _job_state(job) == "dead\n"  # pid file of a process that is gone
    (job / "exit_code").write_text("0")
    assert _job_state(job) == "finished\n"


def _stat(pid: int) -> list[str]:
    """Fields 3 on of /proc/PID/stat (after the command name, which may hold spaces)."""
    return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()


def _start_time(pid: int) -> str:
    return _stat(pid)[19]  # field 22: clock ticks after boot


def test_a_submitted_job_records_its_leaders_start_time_beside_its_pid(tmp_path):
    job = tmp_path / "runs" / "k" / "jobs" / "grpo"
    script = remote.submit_job_script(str(job), "exec sleep 60", {"RL_VERIFY_JOB": "k/grpo"})
    done = subprocess.run(["bash", "-s"], input=script, text=True, capture_output=True, timeout=30)
    assert done.returncode == 0, done.stderr
    pid = int((job / "pid").read_text())
    try:
        assert (job / "pid.start").read_text().strip() == _start_time(pid)
        assert _job_state(job) == "running\n"
        # The submit returns once the pid is written; the job's own `sleep` comes a moment later.
        deadline = time.monotonic() + 30
        while not (found := subprocess.run(["pgrep", "-g", str(pid), "-x", "sleep"], text=True,
                                           capture_output=True).stdout.split()):
            assert time.monotonic() < deadline, "the job's sleep never started"
            time.sleep(0.01)
        (sleeper,) = [int(p) for p in found]
        environ = open(f"/proc/{sleeper}/environ", "rb").read().split(b"\0")
        assert b"RL_VERIFY_JOB=k/grpo" in environ and not [e for e in environ if b"proc_start" in e]
    finally:
        os.killpg(pid, 9)


def test_a_job_number_now_leading_a_later_process_group_is_not_that_job(tmp_path):
    # A job stopped by a signal writes no exit code, and its pid number is free once its group is gone: a later
    # process (an SSH session's shell) may lead a group of that number. Its start time tells it from the job.
    # (Once made the node "busy" for a minute in CI, where pids wrap every few minutes.)
    job = tmp_path / "other-run" / "jobs" / "grpo"
    job.mkdir(parents=True)
    later = subprocess.Popen(["sleep", "60"], start_new_session=True)  # leads group `later.pid`
    try:
        (job / "pid").write_text(str(later.pid))
        (job / "pid.start").write_text(str(int(_start_time(later.pid)) - 1))  # the job started earlier
        assert _job_state(job) == "dead\n"
        out = subprocess.run(["bash", "-s"], input=remote.prerequisites_script([], str(tmp_path), "this-run"),
                             text=True, capture_output=True).stdout
        assert [line for line in out.splitlines() if line.startswith("BUSY")] == []
        stop = subprocess.run(["bash", "-s"], input=remote.kill_job_script(str(job), "other-run/grpo"),
                              text=True, capture_output=True, timeout=60)
        assert "TERM group" not in stop.stdout and later.poll() is None  # someone else's group is left alone
        (job / "pid.start").write_text(_start_time(later.pid))  # the same process: the job's own leader
        assert _job_state(job) == "running\n"
        stop = subprocess.run(["bash", "-s"], input=remote.kill_job_script(str(job), "other-run/grpo"),
                              text=True, capture_output=True, timeout=60)
        assert f"TERM group {later.pid}" in stop.stdout and later.wait(timeout=30) == -15
    finally:
        later.kill()
        later.wait()


def _zombie() -> subprocess.Popen:
    """A group leader that has exited but is not reaped yet (it still answers ``kill -0``)."""
    child = subprocess.Popen(["true"], start_new_session=True)
    deadline = time.monotonic() + 30
    while _stat(child.pid)[0] != "Z":
        assert time.monotonic() < deadline, "the child did not exit"
        time.sleep(0.01)  # waits for a state, not a duration: the child exits at once
    return child


def test_a_stopped_job_whose_wrapper_is_not_reaped_yet_is_dead_and_does_not_make_the_node_busy(tmp_path):
    job = tmp_path / "other-run" / "jobs" / "opd"
    job.mkdir(parents=True)
    zombie = _zombie()
    try:
        (job / "pid").write_text(str(zombie.pid))
        assert _job_state(job) == "dead\n"
        out = subprocess.run(["bash", "-s"], input=remote.prerequisites_script([], str(tmp_path), "this-run"),
                             text=True, capture_output=True).stdout
        assert [line for line in out.splitlines() if line.startswith("BUSY")] == []
    finally:
        zombie.wait()


def test_a_launch_script_that_exits_while_the_node_is_checked_does_not_make_it_busy(tmp_path):
    # Two probes on two simulated nodes of one machine: one's launch fails at once while the other checks
    # whether its node is busy. pgrep lists the script, which is gone before its environment is read; a
    # foreign launch script still running is reported. A pgrep shim lists both, so the overlap is certain.
    gone = subprocess.Popen(["true"])
    gone.wait()
    foreign = subprocess.Popen(["sleep", "60"], env={"PATH": "/usr/bin:/bin"})  # no run marker
    try:
        shim = tmp_path / "bin"
        shim.mkdir()
        launch = "bash -x recipe/on_policy_distillation/scripts/run_sampled_token_mopd.sh"
        (shim / "pgrep").write_text(f"#!/bin/sh\necho '{gone.pid} {launch}'\necho '{foreign.pid} {launch}'\n")
        (shim / "pgrep").chmod(0o755)
        script = remote.prerequisites_script([], str(tmp_path / "runs"), "this-run")
        out = subprocess.run(["bash", "-s"], input=script, text=True, capture_output=True,
                             env={**os.environ, "PATH": f"{shim}:{os.environ['PATH']}"}).stdout
        procs = [line.split("\t")[1] for line in out.splitlines() if line.startswith("PROC")]
        assert procs == [str(foreign.pid)], out
    finally:
        foreign.kill()
        foreign.wait()


@pytest.mark.parametrize("value", ["k-1/grpo", "manual__2026-12-03T10:00/grpo", "k.2/opd-r1", "k/grpo-lane",
                                   "k/opd-ref2", "../etc/jobs/x", "k/grpo/x", "k/GRPO", "k/grpo-r123", ".k/grpo",
                                   "k/", "/grpo", "k/grpo\nx", ""])
def test_the_node_reads_another_processs_job_marker_with_the_shape_remote_validates(value):
    """sh/lib_gpu.sh names another rl-verify run from the job marker a GPU process carries, and builds the path of
    its job folder from it: only a value validate_marker would accept is read as one."""
    script = f"job_re={shlex.quote(remote._MARKER_ERE)}\n[[ $1 =~ $job_re ]]"
    done = subprocess.run(["bash", "-c", script, "bash", value], timeout=30)
    assert (done.returncode == 0) == bool(remote._MARKER_RE.fullmatch(value)), value


def test_job_state_script_refuses_an_unvalidated_folder():
    with pytest.raises(remote.BadInput):
        remote.job_state_script("/runs/$(id)")


def test_kill_job_script_stops_the_marked_processes_and_its_group(tmp_path):
    job = tmp_path / "jobs" / "grpo"
    job.mkdir(parents=True)
    marker = f"kill-test-{os.getpid()}/grpo"  # unique: never touches a job of a concurrent test run
    marked = subprocess.Popen(["sleep", "61"], env={"PATH": "/usr/bin:/bin", "RL_VERIFY_JOB": marker})
    group = subprocess.Popen(["sleep", "62"], start_new_session=True)
    try:
        (job / "pid").write_text(str(group.pid))
        out = subprocess.run(["bash", "-s"], input=remote.kill_job_script(str(job), marker), text=True,
                             capture_output=True, timeout=60).stdout
        assert f"TERM group {group.pid}" in out and "LEFT" not in out
        assert marked.wait(timeout=10) is not None and group.wait(timeout=10) is not None
    finally:
        for p in (marked, group):
            p.kill()
            p.wait()
