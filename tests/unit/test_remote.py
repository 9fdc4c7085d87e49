"""Every value that reaches a remote shell is validated first and quoted; scripts are well-formed."""

from __future__ import annotations

import subprocess

import pytest

from rl_verify import remote

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
    key = remote.run_key("manual__2026-11-29T23:54:51.123+00:00")
    assert key == remote.run_key("manual__2026-11-29T23:54:51.123+00:00")
    assert key != remote.run_key("manual__2026-11-29T23:54:51.124+00:00")
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
