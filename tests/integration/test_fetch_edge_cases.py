"""Edge cases on the node (real sshd of the simulated node) and the pinned host key.

fetch_suite: an unreadable or missing baseline, no tracker, several experiment folders in one
WORK_DIR (the newest is used, the others listed). Never raises: every problem is listed.

SSH: rl_verify.orchestration.verification.ssh_client (the SSH provider's SSHHook, connection read from an
``AIRFLOW_CONN_<ID>`` variable - the Task SDK resolves those outside a task context in Airflow 3.3)
connects with the right pinned host key and refuses a connection without one or with a wrong one.

Tests run as root, so file modes cannot make a file unreadable; "unreadable" is a baseline path that
is a folder or a dangling symlink. Every test works in its own folder under the node's root and
never changes the shared share roots.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import time
import uuid
from pathlib import Path

import paramiko
from airflow.sdk.exceptions import AirflowFailException
import pytest

from rl_verify.core.names import run_key
from rl_verify.node import ops as node

from rl_verify.orchestration import verification as pipeline

from rl_verify.node import remote
from rl_verify.engines import load_suite

pytestmark = pytest.mark.integration

TRACKER = "logs/exp_tracking/tracker.jsonl"


# ------------------------------------------------------------------------------ helpers

@pytest.fixture()
def run_dir(sim_node) -> str:
    """A private run folder on the node (work/ and jobs/ made over SSH), removed afterwards."""
    path = f"{sim_node.info['root']}/runs/edge-{uuid.uuid4().hex[:8]}"
    rc, _, err = sim_node.run(f"mkdir -p {shlex.quote(path)}/work {shlex.quote(path)}/jobs")
    assert rc == 0, err
    yield path
    sim_node.run(f"rm -rf -- {shlex.quote(path)}")


def _spec(sim_node, suite: str = "grpo", **changes):
    spec = load_suite(suite).expanded({**sim_node.info["env"], "CHECKOUT": sim_node.checkout})
    return spec.model_copy(update=changes) if changes else spec


def _experiment(sim_node, work_dir: str, folder: str, rows: int | None) -> str:
    """Make ``work_dir/folder`` like a launch script does; with ``rows`` write a tracker of that many steps."""
    exp = f"{work_dir}/{folder}"
    script = f"mkdir -p {shlex.quote(exp)}/logs/exp_tracking"
    if rows is not None:
        lines = "\\n".join(json.dumps({"step": i, "response/rewards/mean": 0.5, "folder": folder})
                           for i in range(1, rows + 1))
        script += f" && printf '{lines}\\n' > {shlex.quote(exp)}/{TRACKER}"
    rc, _, err = sim_node.run(script)
    assert rc == 0, err
    return f"{exp}/{TRACKER}"


def _fetch(sim_node, spec, run_dir: str, dest: Path) -> dict:
    return node.fetch_suite(sim_node.client, spec, remote.RunLayout(run_dir), dest)


# ------------------------------------------------------------------------------ baseline

def test_missing_baseline_is_listed_naming_the_path_and_the_rest_is_fetched(sim_node, run_dir, tmp_path):
    missing = f"{sim_node.info['root']}/share/baseline/no-such-{uuid.uuid4().hex[:6]}/tracker.jsonl"
    _experiment(sim_node, f"{run_dir}/work/grpo", "20261101000000", rows=3)
    meta = _fetch(sim_node, _spec(sim_node, baseline=missing), run_dir, tmp_path)
    assert [p for p in meta["problems"] if missing in p and "baseline" in p], meta["problems"]
    assert "baseline" not in meta["files"] and not (tmp_path / "baseline.jsonl").exists()
    assert (tmp_path / "tracker.jsonl").exists()  # what exists is still archived


def test_a_fetch_without_the_baseline_neither_copies_nor_misses_it(sim_node, run_dir, tmp_path):
    """A calibration makes the baseline: its runs are fetched without the one in use."""
    missing = f"{sim_node.info['root']}/share/baseline/no-such-{uuid.uuid4().hex[:6]}/tracker.jsonl"
    _experiment(sim_node, f"{run_dir}/work/grpo", "20261101000000", rows=3)
    meta = node.fetch_suite(sim_node.client, _spec(sim_node, baseline=missing), remote.RunLayout(run_dir), tmp_path,
                            with_baseline=False)
    assert not [p for p in meta["problems"] if "baseline" in p], meta["problems"]
    assert "baseline" not in meta["files"] and (tmp_path / "tracker.jsonl").exists()


def test_dangling_symlink_baseline_is_listed_as_unreadable(sim_node, run_dir, tmp_path):
    link = f"{run_dir}/baseline-link.jsonl"
    rc, _, err = sim_node.run(f"ln -s {shlex.quote(run_dir)}/gone.jsonl {shlex.quote(link)}")
    assert rc == 0, err
    meta = _fetch(sim_node, _spec(sim_node, baseline=link), run_dir, tmp_path)
    assert [p for p in meta["problems"] if link in p and "baseline" in p], meta["problems"]


def test_baseline_that_is_a_folder_is_listed_as_unreadable_not_raised(sim_node, run_dir, tmp_path):
    """The prerequisite check (``[ -r path ]``) passes for a folder; fetch must not crash on it."""
    folder = f"{run_dir}/baseline-is-a-folder"
    rc, _, err = sim_node.run(f"mkdir -p {shlex.quote(folder)}")
    assert rc == 0, err
    _experiment(sim_node, f"{run_dir}/work/grpo", "20261101000000", rows=3)
    meta = _fetch(sim_node, _spec(sim_node, baseline=folder), run_dir, tmp_path)
    assert [p for p in meta["problems"] if folder in p and "baseline" in p], meta["problems"]
    assert (tmp_path / "tracker.jsonl").exists()
    assert not list(tmp_path.rglob("*.part")), "a partial download was left in the record"


def test_the_logs_are_archived_and_listed_by_name_whatever_order_the_server_lists_them(sim_node, run_dir, tmp_path):
    """The launch scripts stamp their logs with the hour (``%m%d%H``); sshd's SFTP lists a folder in the
    filesystem's hash order of the names, so the report's list of logs changed order with the hour."""
    work = f"{run_dir}/work/opd"
    _experiment(sim_node, work, "20261101000000", rows=3)
    names = [f"{kind}_{hour}.log" for hour in ("120300", "120307", "120308", "120313")
             for kind in ("teacher_gsm8k", "teacher_geo3k")] + ["training_log_120307.txt", "training_log_120308.txt"]
    rc, _, err = sim_node.run(" && ".join(f"echo {n} > {shlex.quote(work)}/{n}" for n in names))
    assert rc == 0, err
    listed = [a.filename for a in sim_node.client.open_sftp().listdir_attr(work) if a.filename in names]
    assert listed != sorted(names), "the server listed them in name order: this test shows nothing"
    meta = _fetch(sim_node, _spec(sim_node, "opd"), run_dir, tmp_path)
    fetched = [Path(f["remote"]).name for f in meta["files"]["logs"] if Path(f["remote"]).name in names]
    assert fetched == sorted(names)


# ------------------------------------------------------------------------------ tracker

@pytest.mark.parametrize("layout", ["no work dir", "empty work dir", "folder without tracker",
                                    "tracker outside a 14-digit folder"])
def test_no_tracker_is_listed(sim_node, run_dir, tmp_path, layout):
    work = f"{run_dir}/work/opd"
    if layout == "empty work dir":
        sim_node.run(f"mkdir -p {shlex.quote(work)}")
    elif layout == "folder without tracker":
        _experiment(sim_node, work, "20261101000000", rows=None)
    elif layout == "tracker outside a 14-digit folder":
        _experiment(sim_node, work, "latest", rows=25)
    meta = _fetch(sim_node, _spec(sim_node, "opd"), run_dir, tmp_path)
    assert [p for p in meta["problems"] if p.startswith("no tracker") and work in p], meta["problems"]
    assert "tracker" not in meta["files"] and not (tmp_path / "tracker.jsonl").exists()


def test_several_experiment_folders_newest_is_fetched_and_the_others_listed(sim_node, run_dir, tmp_path):
    work = f"{run_dir}/work/grpo"
    oldest = _experiment(sim_node, work, "20261101080000", rows=1)
    older = _experiment(sim_node, work, "20261101090000", rows=2)
    newest = _experiment(sim_node, work, "20261102070000", rows=3)
    _experiment(sim_node, work, "latest", rows=9)  # not an experiment folder: ignored
    # Creation order differs from name order: the folder name (the launch time) decides.
    sim_node.run(f"touch {shlex.quote(oldest)}")
    meta = _fetch(sim_node, _spec(sim_node), run_dir, tmp_path)
    assert meta["files"]["tracker"]["remote"] == newest
    rows = [json.loads(line) for line in (tmp_path / "tracker.jsonl").read_text().splitlines()]
    assert {r["folder"] for r in rows} == {"20261102070000"} and len(rows) == 3
    assert meta["other_experiments"] == [oldest, older]
    assert not [p for p in meta["problems"] if "tracker" in p], meta["problems"]


def test_several_experiment_folders_by_running_the_launch_script_twice(sim_node, tmp_path):
    """Two real launches into one WORK_DIR (the second after the first finished)."""
    run_id = f"it-twice-{uuid.uuid4().hex[:6]}"
    runs = f"{sim_node.info['root']}/runs"
    resolved = node.resolve_commit(sim_node.client, sim_node.checkout, runs, run_key(run_id), "main")
    layout = remote.RunLayout(resolved["run_dir"])
    spec = load_suite("grpo").expanded({**sim_node.info["env"], "CHECKOUT": layout.worktree})
    env = remote.job_environment(spec.env, layout.work_dir("grpo"), run_key(run_id), "grpo",
                                 sim_node.info["env"])
    exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    argv = " ".join(shlex.quote(a) for a in spec.args)
    for _ in range(2):
        rc, out, err = sim_node.run(f"cd {shlex.quote(layout.worktree)} && mkdir -p {layout.work_dir('grpo')} && "
                                    f"env {exports} bash {shlex.quote(spec.script)} {argv}", timeout=300)
        assert rc == 0, err[-2000:]
        time.sleep(1.1)  # experiment folders are named by the second
    try:
        meta = _fetch(sim_node, spec, resolved["run_dir"], tmp_path)
        folders = sorted(Path(p).parts[-4] for p in [meta["files"]["tracker"]["remote"], *meta["other_experiments"]])
        assert len(folders) == 2 and Path(meta["files"]["tracker"]["remote"]).parts[-4] == folders[-1]
        assert len(meta["other_experiments"]) == 1
    finally:
        node.cleanup(sim_node.client, resolved["run_dir"], run_key(run_id))
        sim_node.run("ray stop --force")


def test_newest_experiment_without_a_tracker_is_not_replaced_by_an_older_one(sim_node, run_dir, tmp_path):
    """If the newest launch wrote no tracker (crashed early), fetching the previous launch's tracker
    would evaluate a stale training as if it were this one: the newest folder is the one used, its
    missing tracker is a problem, and the older folder is listed."""
    work = f"{run_dir}/work/grpo"
    older = _experiment(sim_node, work, "20261101080000", rows=45)
    _experiment(sim_node, work, "20261101090000", rows=None)
    meta = _fetch(sim_node, _spec(sim_node), run_dir, tmp_path)
    assert meta["files"].get("tracker", {}).get("remote") != older, \
        "the tracker of an OLDER experiment folder was fetched as the run's tracker"
    assert [p for p in meta["problems"] if "no tracker" in p and "20261101090000" in p], meta["problems"]
    assert older in meta["other_experiments"]


# ------------------------------------------------------------------------------ pinned host key

def _conn_env(monkeypatch, sim_node, conn_id: str, **extra_changes) -> str:
    info = sim_node.info
    extra = {"key_file": info["client_key"], "host_key": info["host_key"], "no_host_key_check": False}
    extra.update(extra_changes)
    extra = {k: v for k, v in extra.items() if v is not None}
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(
        {"conn_type": "ssh", "host": info["host"], "port": info["port"], "login": info["user"], "extra": extra}))
    return conn_id


def _other_host_key(tmp_path: Path) -> str:
    key = tmp_path / "other_host_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    return " ".join(key.with_suffix(".pub").read_text().split()[:2])


def test_connection_is_read_from_the_environment_outside_a_task(monkeypatch, sim_node):
    from airflow.providers.ssh.hooks.ssh import SSHHook
    from airflow.sdk import BaseHook

    conn_id = _conn_env(monkeypatch, sim_node, "rl_sec_env")
    assert BaseHook.get_connection(conn_id).port == sim_node.info["port"]
    hook = SSHHook(ssh_conn_id=conn_id)
    assert hook.host_key is not None and hook.no_host_key_check is False


def test_pinned_right_host_key_connects(monkeypatch, sim_node):
    conn_id = _conn_env(monkeypatch, sim_node, "rl_sec_right")
    with pipeline.ssh_client(conn_id) as client:
        assert node.run_script(client, "echo pinned-ok")[1].strip() == "pinned-ok"


@pytest.mark.parametrize("changes", [
    {"host_key": None},
    {"host_key": None, "no_host_key_check": None},
    {"host_key": None, "no_host_key_check": True},
    {"host_key": None, "allow_host_key_change": True},
], ids=["no host_key", "no host_key, no no_host_key_check", "no_host_key_check true",
        "allow_host_key_change without host_key"])
def test_connection_without_a_pinned_host_key_is_refused(monkeypatch, sim_node, changes):
    conn_id = _conn_env(monkeypatch, sim_node, "rl_sec_nopin", **changes)
    # Refused without retry (AirflowFailException): a missing pin is configuration, not a glitch.
    with pytest.raises(AirflowFailException, match="no pinned host key"):
        with pipeline.ssh_client(conn_id):
            pass


def test_hook_without_host_key_does_not_trust_an_unknown_host(monkeypatch, sim_node, tmp_path):
    """Below rl_verify: the provider's hook itself rejects an unknown host key (RejectPolicy)."""
    from airflow.providers.ssh.hooks.ssh import SSHHook

    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.ssh/known_hosts of the test machine
    conn_id = _conn_env(monkeypatch, sim_node, "rl_sec_hook_nopin", host_key=None)
    hook = SSHHook(ssh_conn_id=conn_id, conn_timeout=5, conn_retry_attempts=1)
    with pytest.raises(paramiko.SSHException, match="not found in known_hosts"):
        hook.get_conn()


@pytest.mark.parametrize("changes", [{}, {"allow_host_key_change": True}],
                         ids=["wrong host key", "wrong host key with allow_host_key_change"])
def test_wrong_pinned_host_key_is_refused(monkeypatch, sim_node, tmp_path, changes):
    conn_id = _conn_env(monkeypatch, sim_node, "rl_sec_wrong", host_key=_other_host_key(tmp_path), **changes)
    started = time.monotonic()
    # Refused without retry: a changed host key is never transient.
    with pytest.raises(AirflowFailException) as err:
        with pipeline.ssh_client(conn_id) as client:
            node.run_script(client, "echo should-not-run")
    assert isinstance(err.value.__cause__, paramiko.BadHostKeyException), err.value
    print(f"refused after {time.monotonic() - started:.1f} s")
