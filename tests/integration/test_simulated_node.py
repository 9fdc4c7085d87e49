"""The SIMULATED GPU node against its contract: real sshd, pinned host key, XTuner-shaped launches."""
from __future__ import annotations

import json
import re
import shlex
import time
import uuid
from pathlib import Path

import pytest

import paramiko
from sim_ssh import REPO, Node, pinned_client, simnode

from rl_verify.settings import RUN_MARKER_ENV
from rl_verify.suites.spec import available_suites
from rl_verify.engines import load_suite

pytestmark = pytest.mark.integration

MARKER = "response/rewards/mean"
EXP_RE = re.compile(r"^\d{14}$")


# ------------------------------------------------------------------------------------------------
# helpers
def suite_launch(node: Node, suite: str, worktree: str, work_dir: str) -> tuple[str, dict[str, str]]:
    """Command and environment of a suite's launch exactly as its spec file declares them."""
    spec = load_suite(suite).expanded({**node.share_env(), "CHECKOUT": worktree})
    cmd = (f"cd {shlex.quote(worktree)} && bash {shlex.quote(spec.script)} "
           f"{' '.join(shlex.quote(a) for a in spec.args)} > {shlex.quote(work_dir)}/launch.out 2>&1")
    # Marked as an rl-verify job, as every launch rl-verify makes: simulated nodes share this machine's
    # process table, and an unmarked launch script is a hand-started training that makes every node
    # busy for the DAG runs of tests in the other pytest process.
    marker = {RUN_MARKER_ENV: f"it-{uuid.uuid4().hex[:8]}"}
    return cmd, {**node.share_env(), **spec.env, "WORK_DIR": work_dir, **marker}


def run_suite(node: Node, suite: str, ref: str, name: str, extra_env: dict[str, str] | None = None) -> tuple[int, Path]:
    wt = node.worktree(ref, name)
    work_dir = str(node.state / "runs" / name)
    node.run(f"mkdir -p {shlex.quote(work_dir)}")
    cmd, env = suite_launch(node, suite, wt, work_dir)
    env = {**env, **(extra_env or {})}
    if suite == "opd":
        # run_rl.sh leaves its Ray head running and `ray start --head` refuses a second head, so
        # stop it first, as rl-verify's job command does after every launch script.
        cmd = "ray stop --force > /dev/null; " + cmd
    # The launch runs to its end (the call returns when the script exits); the timeout is only an
    # upper bound for a wedged channel, generous for a busy machine.
    rc, _, err = node.run(cmd, env=env, timeout=900)
    return rc, Path(work_dir)


def exp_dirs(work_dir: Path) -> list[Path]:
    return sorted(p for p in work_dir.iterdir() if p.is_dir() and EXP_RE.match(p.name))


def tracker_of(work_dir: Path) -> Path:
    """The newest experiment's tracker; a launch that made none fails naming what it printed."""
    exps = exp_dirs(work_dir) if work_dir.is_dir() else []
    tracker = exps[-1] / "logs" / "exp_tracking" / "tracker.jsonl" if exps else None
    if tracker is None or not tracker.is_file():
        launch = work_dir / "launch.out"
        tail = launch.read_text(errors="replace")[-3000:] if launch.is_file() else "(no launch.out)"
        raise AssertionError(f"no tracker under {work_dir} (experiments: {[p.name for p in exps]}); "
                             f"launch output:\n{tail}")
    return tracker


def parse(text: str) -> tuple[list[dict], str | None]:
    """Complete rows and the partial last line (None when the file ends with a newline)."""
    lines = text.split("\n")
    partial = lines.pop() or None
    return [json.loads(line) for line in lines], partial


def summaries(rows: list[dict]) -> dict[int, dict]:
    return {r["step"]: r for r in rows if MARKER in r}


# ------------------------------------------------------------------------------------------------
def test_host_key_is_pinned(sim_node: Node) -> None:
    # a different (valid) ed25519 key pinned for the node must be refused
    other = Path(sim_node.info["client_key"] + ".pub").read_text().split()
    with pytest.raises(paramiko.BadHostKeyException):
        pinned_client(sim_node.info, host_key=f"{other[0]} {other[1]}")
    # and with no pinned key at all, RejectPolicy refuses the unknown host
    client = paramiko.SSHClient()
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    with pytest.raises(paramiko.SSHException):
        client.connect("127.0.0.1", port=sim_node.info["port"], username=sim_node.info["user"],
                       key_filename=sim_node.info["client_key"], look_for_keys=False, allow_agent=False)
    client.close()


def test_node_json_and_session_environment(sim_node: Node) -> None:
    info = sim_node.info
    assert info["host"] == "127.0.0.1" and info["host_key"].startswith("ssh-ed25519 AAAA")
    assert set(info["env"]) == {"CI_SHARE_MODEL", "CI_SHARE_DATA", "CI_SHARE_BASELINE"}
    assert {"good", "initial", "regress-init", "regress-divergence", "regress-mismatch", "regress-teacher",
            "regress-rewards"} <= set(info["commits"])
    assert len(set(info["commits"].values())) == len(info["commits"])
    rc, out, _ = sim_node.run('echo "$RLSIM_NODE"; command -v ray; nvidia-smi -L | wc -l; ray status')
    lines = out.split()
    assert lines[0] == info["root"] and lines[1] == f"{info['root']}/bin/ray" and lines[2] == "8"
    assert rc == 1  # no Ray head yet
    rc, out, _ = sim_node.run(f"git -C {info['checkout']} rev-parse main sim/regress-mismatch")
    assert out.split() == [info["commits"]["good"], info["commits"]["regress-mismatch"]]


def test_every_suite_input_exists_on_the_node(sim_node: Node) -> None:
    for name in available_suites():
        spec = load_suite(name).expanded({**sim_node.share_env(), "CHECKOUT": sim_node.checkout})
        paths = [i.path for i in spec.inputs] + ([spec.baseline] if spec.baseline else [])
        rc, out, _ = sim_node.run(" ; ".join(f"test -r {shlex.quote(p)} || echo MISSING {shlex.quote(p)}"
                                             for p in paths))
        assert "MISSING" not in out, out


def test_grpo_run_in_worktree_writes_45_step_tracker(sim_node: Node) -> None:
    rc, work_dir = run_suite(sim_node, "grpo", sim_node.info["commits"]["good"], "grpo-good")
    assert rc == 0, (work_dir / "launch.out").read_text()[-2000:]
    [exp] = exp_dirs(work_dir)
    rows, partial = parse(tracker_of(work_dir).read_text())
    assert partial is None
    assert all(isinstance(r["step"], int) for r in rows)
    assert rows[0] == {"step": 0, "eval/accuracy": rows[0]["eval/accuracy"]}  # eval-only row first
    summ = summaries(rows)
    assert sorted(summ) == list(range(1, 46))
    assert len(rows) > 46  # mini-batch rows without the marker are there too
    assert [s for s, r in summ.items() if "eval/accuracy" in r] == [15, 30, 45]
    assert abs(summ[45]["eval/accuracy"] - 0.9007) < 0.02
    for r in summ.values():
        assert {"response/response_len/mean", "mismatch/mismatch_k3_kl", "time/step"} <= set(r)
    assert list(work_dir.glob("training_log_*.txt")) and list(work_dir.glob("lmdeploy_log_*.txt"))
    assert list(work_dir.glob("ray_*/"))
    assert simnode.ray_running(sim_node.state)  # run_rl.sh leaves its Ray head running
    log = (sim_node.root / "state" / "ray.log").read_text()
    assert "stop --force" in log and "start --head" in log

    # SFTP reads the same tracker
    sftp = sim_node.client.open_sftp()
    with sftp.open(str(tracker_of(work_dir))) as f:
        sftp_rows, _ = parse(f.read().decode())
    sftp.close()
    assert sftp_rows == rows

    # a relaunch in the same WORK_DIR adds a second timestamp folder
    wt = str(sim_node.state / "worktrees" / "grpo-good")
    cmd, env = suite_launch(sim_node, "grpo", wt, str(work_dir))
    rc, _, _ = sim_node.run(cmd, env=env, timeout=180)
    assert rc == 0
    assert len(exp_dirs(work_dir)) == 2 and exp_dirs(work_dir)[0] == exp
    # the launch leaves the worktree clean (work dirs and bytecode are outside / ignored)
    _, out, _ = sim_node.run(f"git -C {shlex.quote(wt)} status --porcelain")
    assert out == ""


def test_crash_fault_exits_zero_with_short_partial_tracker(faults: Node) -> None:
    simnode.set_fault(faults.state, "grpo", "crash", at_step=7)
    rc, work_dir = run_suite(faults, "grpo", "main", "grpo-crash")
    assert rc == 0  # set -ex without pipefail: tee's status wins
    text = tracker_of(work_dir).read_text()
    rows, partial = parse(text)
    assert partial is not None and not text.endswith("\n")
    with pytest.raises(json.JSONDecodeError):
        json.loads(partial)
    assert max(summaries(rows)) < 45
    log = next(work_dir.glob("training_log_*.txt")).read_text()
    assert "Traceback" in log and "simulated crash fault at step 7" in log


@pytest.mark.parametrize("kind", ["truncated", "nan"])
def test_truncated_and_nan_faults(faults: Node, kind: str) -> None:
    simnode.set_fault(faults.state, "grpo", kind, at_step=10)
    rc, work_dir = run_suite(faults, "grpo", "main", f"grpo-{kind}")
    assert rc == 0
    rows, partial = parse(tracker_of(work_dir).read_text())
    if kind == "truncated":
        assert partial is not None and sorted(summaries(rows)) == list(range(1, 45))
    else:
        assert partial is None
        summ = summaries(rows)
        assert summ[9]["mismatch/mismatch_k3_kl"] == summ[9]["mismatch/mismatch_k3_kl"]
        assert summ[10]["mismatch/mismatch_k3_kl"] != summ[10]["mismatch/mismatch_k3_kl"]  # NaN


def test_missing_input_fault_hides_and_restores(faults: Node) -> None:
    model = faults.root / "share" / "model" / "Qwen3-8B"
    simnode.set_fault(faults.state, "grpo", "missing-input")
    assert not model.exists()
    rc, work_dir = run_suite(faults, "grpo", "main", "grpo-missing")
    assert rc == 0 and exp_dirs(work_dir) == []  # the trainer fails, the script still exits 0
    assert "FileNotFoundError" in next(work_dir.glob("training_log_*.txt")).read_text()
    simnode.clear_faults(faults.state)
    assert (model / "config.json").exists()


def test_opd_normal_exit_leaves_no_teacher_or_ray(sim_node: Node) -> None:
    rc, work_dir = run_suite(sim_node, "opd", "main", "opd-good")
    assert rc == 0, (work_dir / "launch.out").read_text()[-2000:]
    rows, partial = parse(tracker_of(work_dir).read_text())
    assert partial is None
    assert set(rows[0]) == {"step", "eval/gsm8k/acc", "eval/geo3k/acc"}
    summ = summaries(rows)
    assert sorted(summ) == list(range(1, 26))
    assert [s for s, r in summ.items() if "eval/gsm8k/acc" in r] == [5, 10, 15, 20, 25]
    for r in summ.values():
        assert r["distillation/opd_reverse_kl"] == r["distillation/reduced_distillation_kl"]
        assert r["distillation/opd_abs_logprob_loss"] == r["distillation/reduced_distillation_abs_loss"]
    launch = (work_dir / "launch.out").read_text()
    assert "STUDENT_CUDA_VISIBLE_DEVICES=2,3,4,5,6,7" in launch and "XTUNER_OPD_TEACHER_ENDPOINTS_JSON" in launch
    assert sim_node.wait_no_processes("rlsim-teacher") == []
    assert not simnode.ray_running(sim_node.state)  # the EXIT trap ran `ray stop --force`


def test_opd_sigkill_leaves_teachers_and_ray_until_stop_node(fresh_node: Node) -> None:
    simnode.set_fault(fresh_node.state, "opd", "hang", at_step=3)
    wt = fresh_node.worktree("main", "opd-kill")
    work_dir = str(fresh_node.state / "runs" / "opd-kill")
    fresh_node.run(f"mkdir -p {shlex.quote(work_dir)}")
    cmd, env = suite_launch(fresh_node, "opd", wt, work_dir)
    # detached in its own process group, like a remote job runner would do
    rc, out, _ = fresh_node.run(f"setsid bash -c {shlex.quote(cmd)} < /dev/null > /dev/null 2>&1 & echo $!", env=env)
    pgid = int(out.strip())
    deadline = time.monotonic() + 30
    while not fresh_node.processes("--rlsim-train") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert fresh_node.processes("--rlsim-train"), "training did not start"
    assert len(fresh_node.processes("rlsim-teacher")) == 2 and simnode.ray_running(fresh_node.state)

    rc, _, _ = fresh_node.run(f"kill -KILL -- -{pgid}")
    assert rc == 0
    assert fresh_node.wait_no_processes("--rlsim-train") == []
    time.sleep(0.3)
    # no EXIT trap on SIGKILL: the teachers and Ray (own sessions) stay behind
    assert len(fresh_node.processes("rlsim-teacher")) == 2
    assert simnode.ray_running(fresh_node.state)

    simnode.stop_node(fresh_node.state)
    assert simnode.node_processes(fresh_node.state) == []


def test_regression_branches_change_the_curves(sim_node: Node) -> None:
    good = summaries(parse(tracker_of(sim_node.state / "runs" / "grpo-good").read_text())[0]) \
        if (sim_node.state / "runs" / "grpo-good").exists() else None
    if good is None:
        rc, wd = run_suite(sim_node, "grpo", "main", "grpo-good2")
        good = summaries(parse(tracker_of(wd).read_text())[0])
    rc, wd = run_suite(sim_node, "grpo", "sim/regress-mismatch", "grpo-mismatch")
    bad = summaries(parse(tracker_of(wd).read_text())[0])
    assert max(r["mismatch/mismatch_k3_kl"] for r in good.values()) < 5e-5
    assert min(r["mismatch/mismatch_k3_kl"] for r in bad.values()) > 3e-4

    rc, wd = run_suite(sim_node, "opd", "sim/regress-teacher", "opd-teacher")
    teacher = summaries(parse(tracker_of(wd).read_text())[0])
    golden = json.loads((REPO / "include/rl_verify/suites/data/opd_golden_2026-10-26.json").read_text())["golden"]
    for step in (5, 10, 15, 20, 25):
        g = golden[str(step)]
        assert teacher[step]["distillation/reduced_distillation_kl"] - g["distillation/reduced_distillation_kl"] > 0.05
        assert abs(teacher[step]["response/rewards/mean"] - g["response/rewards/mean"]) < 0.04  # rewards healthy


def test_baselines_match_the_runbook(sim_node: Node) -> None:
    base = sim_node.root / "share" / "baseline"
    rows, partial = parse((base / "qwen3-rl-lmdeploy" / "tracker.jsonl").read_text())
    assert partial is None and len(summaries(rows)) == 45
    evals = [(r["step"], r["eval/accuracy"]) for r in rows if "eval/accuracy" in r]
    assert evals == [(45, 0.9007)]
    rows, _ = parse((base / "opd-qwen3-vl-2b-25step" / "tracker.jsonl").read_text())
    assert sorted(summaries(rows)) == list(range(1, 26))


def test_cli_fault_status_and_clear(faults: Node) -> None:
    import subprocess
    import sys

    def cli(*args: str) -> str:
        res = subprocess.run([sys.executable, "-m", "simulator.node", *args, "--state", str(faults.state)],
                             cwd=REPO, capture_output=True, text=True, check=True)
        return res.stdout

    cli("fault", "--suite", "opd", "--kind", "missing-input", "--path", "share/data/on_policy_distillation")
    status = json.loads(cli("status"))
    assert status["faults"]["opd"]["hidden"] == ["share/data/on_policy_distillation"]
    assert status["node"]["port"] == faults.info["port"] and status["sshd_pid"]
    assert not (faults.root / "share/data/on_policy_distillation").exists()
    cli("clear-faults")
    assert (faults.root / "share/data/on_policy_distillation/gsm8k_geo3k_eval.json").exists()
    # start again on a running node: reused, same port and host key
    again = json.loads(cli("start", "--step-seconds", "0.05"))
    assert again["port"] == faults.info["port"] and again["host_key"] == faults.info["host_key"]


#: A deterministic launch as XTuner's own e2e CI makes it: deterministic algorithms, the SGLang rollout (the one
#: backend with a deterministic mode), FA3 off.
DETERMINISTIC = {"XTUNER_DETERMINISTIC": "true", "XTUNER_USE_SGLANG": "1", "XTUNER_USE_LMDEPLOY": "0",
                 "XTUNER_USE_FA3": "0"}


def test_deterministic_mode_gives_the_same_bits_only_where_the_numerics_and_environment_are_the_same(
        fresh_node: Node) -> None:
    from rl_verify.core import bitwise
    from rl_verify.suites.spec import LANE_EXCLUDE

    commits, steps = fresh_node.info["commits"], 46  # the eval at step 0 and 45 steps

    def rows(ref: str, name: str, env: dict[str, str] | None = DETERMINISTIC) -> list[dict]:
        rc, work_dir = run_suite(fresh_node, "grpo", commits[ref], name, env)
        assert rc == 0, (work_dir / "launch.out").read_text()[-2000:]
        return parse(tracker_of(work_dir).read_text())[0]

    def lane(reference: list[dict], current: list[dict]) -> bitwise.LaneReading:
        return bitwise.read_lane(reference, current, steps, LANE_EXCLUDE)

    reference = rows("good", "det-1")
    assert lane(reference, rows("good", "det-2")).identical  # reproducible on this node
    assert lane(reference, rows("docs-only", "det-docs")).identical
    assert lane(reference, rows("neutral-refactor", "det-neutral")).identical
    reordered = lane(reference, rows("numerics-reorder", "det-numerics"))
    assert reordered.difference is not None and reordered.difference.step == 0  # other bits from the first step
    regressed = lane(reference, rows("regress-mismatch", "det-regress"))
    assert regressed.difference is not None and regressed.difference.step <= 1
    # Without deterministic mode (LMDeploy, as the suite launches today) every launch draws its own bits.
    assert not lane(rows("good", "nondet-1", {}), rows("good", "nondet-2", {})).identical
    # A changed environment (driver upgrade) gives other bits; a node where the mode does not reproduce, too.
    simnode.set_determinism(fresh_node.state, environment={"driver": "580.200.01", "torch": "2.8.0",
                                                           "sglang": "0.5.3"})
    assert not lane(reference, rows("good", "det-driver")).identical
    simnode.set_determinism(fresh_node.state, reproducible=False)
    assert not lane(rows("good", "unrepro-1"), rows("good", "unrepro-2")).identical
