"""The simulated node's trainings run on this machine as the node runs them (issues 44, 53), for the benchmarks that
record executed-code evidence or run commits of the simulated checkout for real (``scripts/bench_mutation.py``; the
pieces ``scripts/bench_evidence.py`` has of its own can come from here).

A launch is the Python the suite's launch script starts, without the script's node plumbing (Ray, GPUs, ports):
the trainer ``xtuner/v1/train/cli/rl.py`` of the checkout with the node's interpreter (``/usr/bin/python3``), its
rollout worker in a process of its own, and for OPD the two rollout teachers ``xtuner/rlsim/teacher_server.py`` of
the same checkout, started and stopped (SIGTERM) as ``run_sampled_token_mopd.sh`` does, or a stand-in ``/health``.
The suite's launch env comes from its spec (the lane's: ``bitwise.env`` over it), placeholders dropped. Recording
goes through the package's own node scripts (``evidence_setup.sh``, ``evidence_read.sh``, run with bash), so the
teachers record too, as on the node (they inherit the job's environment).
"""

from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from rl_verify.core import evidence
from rl_verify.node import evidence_scripts

NODE_PYTHON = "/usr/bin/python3"
#: The config each suite's launch passes (spec ``launch.args`` / ``OPD_CONFIG_PATH``).
CONFIG = {"grpo": "autotest/config/rl_qwen3_gsm8k_grpo.py",
          "opd": "recipe/on_policy_distillation/config/rl_qwen3_vl_2b_sampled_token_mopd_rollout_teacher.py"}
#: OPD's rollout teachers (the launch script's start_teacher calls).
TEACHERS = ("gsm8k", "geo3k")
TRAINER = "xtuner/v1/train/cli/rl.py"
TEACHER_SERVER = "xtuner/rlsim/teacher_server.py"
#: GRPO: 3 epochs x (1000 prompts // 64) = 45 steps, as the share's train-mini.jsonl.
GRPO_PROMPTS = 1000


class Healthy(BaseHTTPRequestHandler):
    """A teacher's ``/health`` stand-in (200 ok)."""

    def do_GET(self) -> None:  # noqa: N802 (the server's own name)
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args: Any) -> None:
        pass


@contextmanager
def standin_teacher() -> Iterator[str]:
    """A local stand-in for OPD's teachers' ``/health``: its URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), Healthy)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def node_env(**extra: str) -> dict[str, str]:
    """This machine's environment as the node's launch sees it: no Python or coverage settings of this process, no
    simulated node root (no Ray, faults or sim.json), no simulated step time."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("COVERAGE", "PYTHON", "VIRTUAL_ENV", "RLSIM_", "XTUNER_", "TOTAL_TRAIN_STEPS",
                                "EVALUATE_STEP"))}
    env["PATH"] = f"{Path(NODE_PYTHON).parent}:{env.get('PATH', '')}"
    env["RLSIM_STEP_SECONDS"] = "0"
    env.update(extra)
    return env


def suite_env(spec: Any, lane: bool) -> dict[str, str]:
    """The suite's launch env from its spec (values naming a placeholder dropped, ``TOTAL_TRAIN_STEPS`` the expected
    steps); ``lane``: the deterministic launch's (``bitwise.env`` over it, as ``bitwise_lane.lane_spec``)."""
    env = {}
    for key, value in spec.launch.env.items():
        if value == "${EXPECTED_STEPS}":
            env[key] = str(spec.expected_steps)
        elif "${" not in value:
            env[key] = value
    if lane:
        env.update(spec.bitwise.env)
    return env


def inputs(work: Path, suite: str) -> tuple[Path, Path]:
    """Placeholder model (a config.json) and dataset for a launch under ``work``."""
    model, data = work / "model", work / ("data.jsonl" if suite == "grpo" else "data.json")
    model.mkdir(parents=True, exist_ok=True)
    (model / "config.json").write_text("{}")
    if suite == "grpo":
        data.write_text("".join(json.dumps({"prompt": str(i)}) + "\n" for i in range(GRPO_PROMPTS)))
    else:
        data.write_text(json.dumps([{"prompt": str(i)} for i in range(64)]))
    return model, data


def trainer_argv(repo: Path, suite: str, work: Path, config: Path | None = None) -> list[str]:
    """The trainer's command line as the suite's launch script writes it (``config``: another config file in place
    of the suite's, as the lane's evidence run of a ``stop_config`` suite is given)."""
    model, data = inputs(work, suite)
    argv = [NODE_PYTHON, str(repo / TRAINER), "--rlsim-train", suite, "--config", str(config or repo / CONFIG[suite]),
            "--model", str(model), "--data", str(data), "--eval-data", "", "--work-dir", str(work / "work")]
    if suite == "grpo":
        argv += ["--lmdeploy-log", str(work / "lmdeploy_log.txt"), "--batch-hint", "64"]
    else:
        argv += ["--batch-hint", "128"]
    return argv


def _kill(proc: subprocess.Popen, sig: int = signal.SIGKILL) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


@contextmanager
def teachers(repo: Path, work: Path, env: Mapping[str, str], timeout: float = 30.0) -> Iterator[dict[str, str] | None]:
    """OPD's two rollout teachers of ``repo`` started as the launch script starts them (own session, the job's
    environment), stopped with SIGTERM (its EXIT trap); yields their endpoints, or None when one did not come up
    (the launch script then exits 1 before the training)."""
    work.mkdir(parents=True, exist_ok=True)
    model = inputs(work, "opd")[0]
    procs: dict[str, subprocess.Popen] = {}
    try:
        for name in TEACHERS:
            procs[name] = subprocess.Popen(
                [NODE_PYTHON, str(repo / TEACHER_SERVER), "--rlsim-teacher", name, "--model", str(model),
                 "--port-file", str(work / f"teacher_{name}.port"), "--pid-file", str(work / f"teacher_{name}.pid")],
                cwd=repo, env=dict(env), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=open(work / f"teacher_{name}.log", "wb"), start_new_session=True)
        urls: dict[str, str] | None = {}
        deadline = time.monotonic() + timeout
        for name in TEACHERS:
            port = work / f"teacher_{name}.port"
            while True:
                text = port.read_text() if port.exists() else ""
                if text.endswith("\n") and text.strip().isdigit():  # written whole: the server listens
                    urls[name] = f"http://127.0.0.1:{text.strip()}"
                    break
                if procs[name].poll() is not None or time.monotonic() > deadline:
                    urls = None
                    break
                time.sleep(0.005)
            if urls is None:
                break
        yield urls
    finally:
        for proc in procs.values():
            _kill(proc, signal.SIGTERM)
        for proc in procs.values():
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                _kill(proc)
                proc.wait()


@dataclass(frozen=True)
class Launched:
    """One launch: exit status (None: stopped at its time limit), wall seconds, the tracker's bytes."""

    returncode: int | None
    seconds: float
    tracker: bytes
    stderr: str


def launch(repo: Path, work: Path, env: Mapping[str, str], suite: str, *, endpoints: Mapping[str, str] | None = None,
           timeout: float = 60.0, config: Path | None = None) -> Launched:
    """One launch of ``suite``'s trainer in ``repo`` (work files under ``work``; ``config``: see
    :func:`trainer_argv`). OPD: the teachers at ``endpoints``, else the checkout's own started for it."""
    work.mkdir(parents=True, exist_ok=True)
    if suite == "opd" and endpoints is None:
        with teachers(repo, work / "teachers", env) as urls:
            if urls is None:
                return Launched(1, 0.0, b"", "a teacher did not come up (the launch script exits 1)")
            return launch(repo, work, env, suite, endpoints=urls, timeout=timeout, config=config)
    run_env = dict(env)
    if suite == "opd":
        run_env["XTUNER_OPD_TEACHER_ENDPOINTS_JSON"] = json.dumps(dict(endpoints or {}))
    t0 = time.perf_counter()
    proc = subprocess.Popen(trainer_argv(repo, suite, work, config), cwd=repo, env=run_env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    try:
        _, err = proc.communicate(timeout=timeout)
        code: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        _kill(proc)
        _, err = proc.communicate()
        code = None
    _kill(proc)  # the rollout worker, should the trainer have left it behind
    seconds = time.perf_counter() - t0
    trackers = sorted(glob.glob(str(work / "work" / "*" / "logs" / "exp_tracking" / "tracker.jsonl")))
    tracker = Path(trackers[-1]).read_bytes() if trackers else b""
    return Launched(code, seconds, tracker, err.decode(errors="replace")[-2000:])


def bash(script: str) -> str:
    """A node script run with bash on this machine, the node's python3 first on the PATH (as on the simulated node):
    its stdout (CalledProcessError when it fails)."""
    return subprocess.run(["bash", "-c", f"PATH={Path(NODE_PYTHON).parent}:$PATH\n" + script], check=True,
                          capture_output=True, text=True).stdout


def record(repo: Path, folder: Path, env: Mapping[str, str], suite: str, tracker_glob: str,
           processes: Sequence[tuple[str, str]] = (), endpoints: Mapping[str, str] | None = None,
           stop_config: tuple[str, str, int] | None = None) -> tuple[dict[str, Any], Launched]:
    """One launch under the node scripts' recording (``evidence_setup.sh``, then ``evidence_read.sh`` with the node's
    python3 first on the PATH): its reading (the script's JSON) and the launch. ``repo`` must be a git checkout
    (``evidence_read.sh`` lists its tracked files); ``processes``: the suite's expected kinds (kind, runs);
    ``stop_config``: (the suite's config, attribute, value) of a spec's ``evidence.stop_config``: the launch is given
    the config ``evidence_config.sh`` writes in the evidence folder instead."""
    setup = evidence_scripts.evidence_setup_script(str(folder / "evidence"), str(repo))
    kv = dict(line.split("=", 1) for line in bash(setup).splitlines() if "=" in line)
    config = None
    if stop_config is not None:
        written = bash(evidence_scripts.evidence_config_script(str(folder / "evidence"), str(repo), *stop_config))
        config = Path(dict(line.split("=", 1) for line in written.splitlines() if "=" in line)["CONFIG"])
    launched = launch(repo, folder, {**env, "PYTHONPATH": kv["SITE"], "COVERAGE_PROCESS_START": kv["CONFIG"],
                                     "COVERAGE_CORE": "sysmon"}, suite, endpoints=endpoints, config=config)
    script = evidence_scripts.evidence_read_script(str(folder / "evidence"), str(repo), "python3",
                                                   evidence.COMPILED_BODY.pattern, str(folder / "work"), tracker_glob,
                                                   processes)
    reading = json.loads(bash(script).strip().splitlines()[-1])
    return reading, launched
