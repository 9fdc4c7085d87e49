#!/usr/bin/env python3
"""SIMULATED XTuner RL trainer (rl-verify simulator). It trains nothing and needs no GPU.

It replays realistic GRPO / OPD metric curves (see curves.py) into an XTuner-shaped tracker:
``$WORK_DIR/<YYYYMMDDHHMMSS>/logs/exp_tracking/tracker.jsonl`` (a new folder per launch), written
asynchronously through a queue by a writer thread that flushes every few steps and on close, with
block-buffered writes, so a live tracker lags and can end in a partial line - as the real one does.

Inputs it honours (all optional outside a simulated node):
- ``--config``: run as XTuner's CLI runs a config (the module executed); GRPO's step count is its
  ``trainer.rollout_steps``, as XTuner's trainer takes it (a config that runs another and sets it is honoured);
- ``RLSIM_NODE`` (the node root): ``sim.json`` (step_seconds, flush_steps, gpus, seed, and the noise
  mode ``noise`` with its ``baseline_error_seed``, see curves.py) and ``faults.json`` (per-suite
  fault: crash | hang | truncated | nan | slow, with ``at_step``; crash at step 0 dies at launch, before any tracker;
  ``commit`` and ``times`` narrow it to launches of a commit and to the first ``times`` of them);
- ``xtuner/rlsim/behaviour.json`` of the checkout it runs from: the regression the commit carries
  (``regression``: a kind of curves.REGRESSIONS or null; optional ``scale`` and ``from_step``: its size and
  the first step it shows at, see curves.regression_applier);
- ``RLSIM_SEED``, else ``RL_VERIFY_SEED`` (a calibration run's seed, as a launch config would read it):
  fixes the noise (otherwise every launch draws its own);
- ``XTUNER_DETERMINISTIC=true`` with the rollout backend that has a deterministic mode (``XTUNER_USE_SGLANG=1``,
  not LMDeploy) and FA3 off: deterministic mode (issue 33). On a node whose environment is deterministic (sim.json
  ``deterministic``, default true) a run's values are then a pure function of the checkout's numerics
  (behaviour.json ``numerics``), the node's environment (sim.json ``environment``) and the seed (default 0): a
  docs or non-numerics change gives the same bits, a reordered reduction other bits with the same statistics, a
  regression other bits from the step it starts at. ``deterministic: false`` (the node fault "deterministic mode
  not reproducible") draws every launch's own noise. Steps take ``deterministic_slowdown`` (default 1.3) times
  as long.
The metric rows are ``curves.run_rows(...)``'s, exactly (a benchmark calling it gets the same rows);
the trainer adds only what the node does to them (faults, step time). Standard library only.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import queue
import runpy
import sys
import threading
import time
import urllib.request
from pathlib import Path

sys.dont_write_bytecode = True  # keep the per-run git worktree clean
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import curves  # noqa: E402  (sibling module of the simulated checkout)
import train_loop  # noqa: E402  (the code paths a real trainer runs at given steps)

REPO = HERE.parents[1]
WORKER = REPO / "xtuner" / "v1" / "rl" / "rollout" / "worker.py"
sys.path.insert(1, str(REPO))
# As XTuner's driver does (rl_trainer.py imports RolloutConfig from it): the worker's module runs in the trainer too.
from xtuner.v1.rl.rollout.worker import RolloutConfig  # noqa: E402

BLOCK = 1024  # emulated write-buffer size: a full block is written even if it cuts a line
_STOP = object()


class SimulatedCrash(RuntimeError):
    """Raised to end the simulated training like a real crash (partial last line, exit 1)."""


class TrackerWriter:
    """Asynchronous JSONL writer: ``log`` enqueues, a thread writes blocks and flushes periodically.

    Promises: complete rows reach the file at the latest ``flush_seconds`` after being logged, or on
    ``close``; between flushes whole BLOCK-sized chunks may be written, so the file can end mid-line.
    """

    def __init__(self, path: Path, flush_seconds: float) -> None:
        self.path = path
        self._flush_seconds = flush_seconds
        self._q: queue.Queue = queue.Queue()
        self._pending = b""
        self._last_row = b""
        self._f = open(path, "ab", buffering=0)
        self._thread = threading.Thread(target=self._run, name="tracker-writer", daemon=True)
        self._thread.start()

    def log(self, row: dict) -> None:
        """Queue one row (one JSON object, NaN written bare like Python's json does)."""
        self._q.put(json.dumps(row) + "\n")

    def close(self, cut_last_row: bool = False) -> None:
        """Write everything queued and close; ``cut_last_row`` leaves the last row half-written."""
        self._q.put((_STOP, cut_last_row))
        self._thread.join()

    def _run(self) -> None:
        next_flush = time.monotonic() + self._flush_seconds
        while True:
            try:
                item = self._q.get(timeout=max(0.0, next_flush - time.monotonic()))
            except queue.Empty:
                item = None
            if isinstance(item, tuple) and item[0] is _STOP:
                data = self._pending
                if item[1] and self._last_row and data.endswith(self._last_row):
                    data = data[: len(data) - len(self._last_row) // 2]
                elif item[1]:
                    # the last row already went out in a block: cut the file itself
                    self._f.truncate(max(0, self._f.seek(0, 2) - len(self._last_row) // 2))
                self._f.write(data)
                self._f.close()
                return
            if item is not None:
                self._last_row = item.encode()
                self._pending += self._last_row
                while len(self._pending) >= BLOCK:
                    self._f.write(self._pending[:BLOCK])
                    self._pending = self._pending[BLOCK:]
            if time.monotonic() >= next_flush:
                self._f.write(self._pending)
                self._pending = b""
                next_flush = time.monotonic() + self._flush_seconds


# ------------------------------------------------------------------------------------------------
def _read_json(path: Path, default: dict) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return default


def _config_values(path: Path) -> dict:
    """The config file run as XTuner's CLI runs one (xtuner-contract.md: the module executed, its top-level names
    not starting with ``__`` are the config): a config that runs another and then changes its ``trainer`` (the
    lane's evidence run's, issue 53) is honoured as on a real node."""
    return {k: v for k, v in runpy.run_path(str(path)).items() if not k.startswith("__")}


def _require(path: str, what: str) -> Path:
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"{what} not found: {path}")
    return p


def _pid_alive(pid: int, needle: str) -> bool:
    try:
        return needle in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return False


def deterministic_mode(env: dict[str, str] | os._Environ) -> bool:
    """Whether the launch asks for deterministic mode where it exists: XTUNER_DETERMINISTIC on, the SGLang rollout
    (LMDeploy has no deterministic mode) and FA3 off (its kernels are not batch-invariant)."""
    on = str(env.get("XTUNER_DETERMINISTIC", "")).lower() in ("1", "true")
    sglang = str(env.get("XTUNER_USE_SGLANG", "")) == "1" and str(env.get("XTUNER_USE_LMDEPLOY", "")) != "1"
    return on and sglang and str(env.get("XTUNER_USE_FA3", "")) != "1"


def deterministic_seed(numerics: str, environment: dict, seed: str) -> str:
    """The noise seed of a deterministic run: the checkout's numerics, the node's environment and the run's seed."""
    return f"deterministic:{numerics}:{json.dumps(environment, sort_keys=True)}:{seed}"


class Node:
    """What the trainer sees of the simulated node: settings, faults, Ray head, teachers."""

    def __init__(self, suite: str) -> None:
        root = os.environ.get("RLSIM_NODE")
        self.root = Path(root) if root else None
        sim = _read_json(self.root / "sim.json", {}) if self.root else {}
        self.step_seconds = float(os.environ.get("RLSIM_STEP_SECONDS", sim.get("step_seconds", 1.0)))
        self.flush_steps = float(sim.get("flush_steps", 3.0))
        #: A node-wide seed (tests): every launch without its own seed draws the same noise.
        self.seed = sim.get("seed")
        #: The noise mode and the seed of the baseline's own error (curves.py); an unknown mode fails
        #: the launch like a bad config would.
        self.noise = curves.check_noise_mode(sim.get("noise", curves.DEFAULT_NOISE))
        self.baseline_error_seed = str(sim.get("baseline_error_seed", curves.DEFAULT_BASELINE_ERROR_SEED))
        #: The node's true run-to-run spread over the assumed one (curves.check_spread_ratio): a noisier node.
        self.spread_ratio = curves.check_spread_ratio(sim.get("spread_ratio", 1.0))
        #: The step-to-step correlation of a run's training-metric noise (curves.check_correlation): 0 independent.
        self.correlation = curves.check_correlation(sim.get("correlation", 0.0))
        #: What the share's baseline trackers were last written for (simulator/checkout.py).
        self.share_noise = _read_json(self.root / "state" / "baseline_noise.json", {}) if self.root else {}
        #: Whether deterministic mode reproduces on this node, its environment (driver, packages: part of the
        #: bits) and what deterministic mode costs per step.
        self.deterministic = bool(sim.get("deterministic", True))
        # The default is simulator.noise.DEFAULT_ENVIRONMENT (the checkout cannot import the simulator).
        self.environment = sim.get("environment") or {"driver": "580.159.04", "torch": "2.8.0", "sglang": "0.5.3"}
        self.deterministic_slowdown = float(sim.get("deterministic_slowdown", 1.3))
        #: "scrubbed": the rollout worker starts without the launch's COVERAGE_* variables (RolloutWorker).
        self.worker_env = str(sim.get("worker_env", "inherited"))
        faults = _read_json(self.root / "faults.json", {}) if self.root else {}
        self.fault = faults.get(suite) or {}
        if self.fault and not self._fault_applies(suite):
            self.fault = {}
        self.ray_pid: int | None = None

    def _fault_applies(self, suite: str) -> bool:
        """A fault with ``commit`` strikes only launches of that commit (a prefix of the checkout's HEAD); with
        ``times``, only the first ``times`` such launches (a one-off fault: a retry then trains)."""
        commit = str(self.fault.get("commit") or "")
        if commit:
            import subprocess

            head = subprocess.run(["git", "-C", str(HERE), "rev-parse", "HEAD"], capture_output=True, text=True,
                                  check=False).stdout.strip()
            if not head.startswith(commit):
                return False
        times = self.fault.get("times")
        if times is None or self.root is None:
            return True
        # One line per launch the fault matched, appended (O_APPEND): the count survives concurrent launches.
        counter = self.root / "state" / f"fault-launches-{suite}"
        counter.parent.mkdir(parents=True, exist_ok=True)
        with open(counter, "a") as fh:
            fh.write(f"{os.getpid()}\n")
        return len(counter.read_text().splitlines()) <= int(times)

    def connect_ray(self) -> None:
        """Like ray.init(address='auto'): fail when no head of this node runs."""
        if self.root is None:
            return
        try:
            pid = int((self.root / "state" / "ray_head.pid").read_text().strip())
        except (OSError, ValueError):
            pid = -1
        if not _pid_alive(pid, "rlsim-ray-head"):
            raise ConnectionError("Could not find any running Ray instance. Please specify the one to "
                                  "connect to by setting `--address` flag or `RAY_ADDRESS` environment variable.")
        self.ray_pid = pid

    def check_ray(self) -> None:
        if self.ray_pid is not None and not _pid_alive(self.ray_pid, "rlsim-ray-head"):
            raise SimulatedCrash("ray.exceptions.RaySystemError: GCS server died (ray head gone; "
                                 "was `ray stop --force` run on the node?)")


def _check_teachers(endpoints: dict[str, str]) -> None:
    for name, url in endpoints.items():
        try:
            with urllib.request.urlopen(url.rstrip("/") + "/health", timeout=5) as resp:
                resp.read()
        except OSError as exc:
            raise SimulatedCrash(f"teacher {name!r} at {url} unreachable: {exc}") from exc


def _new_exp_dir(work_dir: Path) -> Path:
    """A fresh 14-digit timestamp folder; waits for the next second rather than reusing one."""
    while True:
        exp = work_dir / _dt.datetime.now().strftime("%Y%m%d%H%M%S")
        try:
            exp.mkdir(parents=True)
            return exp
        except FileExistsError:
            time.sleep(0.2)


def _hold(node: Node, suite: str, step: int, writer: TrackerWriter, tick: float) -> None:
    """The "hold" fault: stay at ``step`` (alive, still logging mini-batch rows so the tracker grows)
    until the node's release file for the suite appears; lets a test act on a training that is
    certainly running, however slow the machine."""
    release = node.root / f"release-{suite}" if node.root else None
    _log(f"step {step}: held until {release} exists")
    while release is not None and not release.exists():
        time.sleep(max(tick, 0.05))
        node.check_ray()
        writer.log({"step": step, "train/mini_batch": -1, "held": 1})
    _log(f"step {step}: released")


class RolloutWorker:
    """The rollout worker process (xtuner/v1/rl/rollout/worker.py): asked once a step for its backend's factor.
    ``scrubbed`` (sim.json "worker_env": "scrubbed") starts it without the launch's COVERAGE_* variables: a
    process the environment does not reach, as a Ray worker started before the job's environment would be."""

    def __init__(self, scrubbed: bool = False) -> None:
        import subprocess

        self.config = RolloutConfig()  # built by the driver; the worker builds its own
        env = {k: v for k, v in os.environ.items() if not (scrubbed and k.startswith("COVERAGE"))}
        self._proc = subprocess.Popen([sys.executable, str(WORKER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      text=True, env=env)

    def factor(self, step: int) -> float:
        assert self._proc.stdin is not None and self._proc.stdout is not None
        self._proc.stdin.write(f"{step}\n")
        self._proc.stdin.flush()
        return float(self._proc.stdout.readline())

    def stop(self) -> None:
        try:
            if self._proc.stdin is not None:
                self._proc.stdin.write("\n")
                self._proc.stdin.close()
            self._proc.wait(timeout=30)
        except Exception:
            self._proc.kill()


class RewardPool:
    """The trainer's reward-scoring worker: a multiprocessing Pool of one process, forked (before the tracker's writer
    thread starts), asked once a training step to score the step's rewards (train_loop.score_rewards, which leaves
    their bits as they are). Its lines run only in that forked child."""

    def __init__(self) -> None:
        import multiprocessing

        self._pool = multiprocessing.get_context("fork").Pool(1)

    def score(self, step: int, rewards: float) -> float:
        return self._pool.apply(train_loop.score_rewards, (step, rewards))

    def stop(self) -> None:
        try:
            self._pool.close()
            self._pool.join()  # the worker ends its own way: its evidence is saved
        except Exception:
            self._pool.terminate()


def _log(msg: str) -> None:
    print(f"[XTuner][{_dt.datetime.now():%Y-%m-%d %H:%M:%S}][RL] {msg}", flush=True)


# ------------------------------------------------------------------------------------------------
def run(args: argparse.Namespace) -> int:
    suite = args.suite
    node = Node(suite)
    behaviour = _read_json(HERE / "behaviour.json", {})
    regression = behaviour.get("regression")

    # Inputs first, like the real trainer: a missing model or dataset is a traceback, exit 1.
    cfg = _config_values(_require(args.config, "config"))
    _require(args.model, "model path")
    if not (Path(args.model) / "config.json").exists():
        raise FileNotFoundError(f"{args.model} does not look like a HF model: config.json missing")
    data = _require(args.data, "dataset")
    if args.eval_data:
        _require(args.eval_data, "eval dataset")

    teachers: dict[str, str] = {}
    if suite == "grpo":
        # As XTuner's trainer: the step count is its config's (``trainer.rollout_steps``); a config without one
        # gets the runbook's shape, epochs over the dataset.
        trainer = cfg.get("trainer")
        total = getattr(trainer, "rollout_steps", None)
        if total is None:
            n_prompts = sum(1 for line in data.read_text().splitlines() if line.strip())
            epochs, batch = int(cfg.get("total_epochs", 3)), int(cfg.get("global_batch_size", 64))
            total = epochs * (n_prompts // batch)
        total = int(total)
        eval_every = int(getattr(trainer, "evaluate_step", None) or cfg.get("evaluate_step", 15))
    else:
        total = int(os.environ.get("TOTAL_TRAIN_STEPS", cfg.get("total_train_steps", 25)))
        eval_every = int(os.environ.get("EVALUATE_STEP", cfg.get("evaluate_step", 5)))
        raw = os.environ.get("XTUNER_OPD_TEACHER_ENDPOINTS_JSON")
        if not raw:
            raise RuntimeError("XTUNER_OPD_TEACHER_ENDPOINTS_JSON is not set: rollout teachers are required")
        teachers = json.loads(raw)
        _check_teachers(teachers)

    if node.fault.get("kind") == "crash" and int(node.fault.get("at_step") or 0) == 0:
        # at launch: before Ray, before any tracker (what a broken environment or a dead teacher does)
        print("Traceback (most recent call last):\n  File \"xtuner/v1/train/rl_trainer.py\", line 1, in fit\n"
              "RuntimeError: NCCL error: unhandled system error (simulated crash fault at launch)",
              file=sys.stderr, flush=True)
        return 1
    node.connect_ray()
    work_dir = Path(args.work_dir).resolve()
    exp = _new_exp_dir(work_dir)
    tracker_dir = exp / "logs" / "exp_tracking"
    tracker_dir.mkdir(parents=True)
    scorer = RewardPool()  # forked before any thread of the trainer starts
    writer = TrackerWriter(tracker_dir / "tracker.jsonl", flush_seconds=node.flush_steps * node.step_seconds)
    seed = os.environ.get("RLSIM_SEED") or os.environ.get("RL_VERIFY_SEED") or node.seed or exp.name
    deterministic = deterministic_mode(os.environ)
    step_seconds = node.step_seconds
    if deterministic:
        step_seconds *= node.deterministic_slowdown
        given = os.environ.get("RLSIM_SEED") or os.environ.get("RL_VERIFY_SEED") or node.seed or "0"
        # Reproducible only where the node's environment is: otherwise each launch still draws its own noise.
        seed = deterministic_seed(str(behaviour.get("numerics", "v1")), node.environment, str(given)) \
            if node.deterministic else f"nondeterministic:{exp.name}"
    rows = curves.run_rows(suite, seed, regression, node.noise, steps=total, eval_every=eval_every,
                           baseline_error_seed=node.baseline_error_seed,
                           regression_scale=float(behaviour.get("scale", 1.0)),
                           regression_from=int(behaviour.get("from_step", 0)), spread_ratio=node.spread_ratio,
                           correlation=node.correlation)
    by_step: dict[int, list[dict]] = {}
    for r in rows:
        by_step.setdefault(r["step"], []).append(r)
    lmdeploy_log = open(args.lmdeploy_log, "a") if args.lmdeploy_log else None
    fault = node.fault
    kind, at_step = fault.get("kind"), int(fault.get("at_step") or 0)
    shape = "".join(text for key, text in (("scale", f" x{behaviour.get('scale')}"),
                                             ("from_step", f" from step {behaviour.get('from_step')}"))
                    if key in behaviour)
    _log(f"SIMULATED {suite} run: {total} steps, exp dir {exp}, regression={regression}{shape}, fault={fault or None}, "
         f"noise={node.noise}, seed={seed}" + (", deterministic mode" if deterministic else ""))
    wanted = {"noise": node.noise,
              "baseline_error_seed": None if node.noise == "bounded" else node.baseline_error_seed,
              **({"correlation": node.correlation} if node.correlation else {})}
    if node.root is not None and node.share_noise and node.share_noise != wanted:
        # A hand-edited sim.json: the runs and the share's baselines disagree (simulator.node.set_noise fixes it).
        _log(f"WARNING: share baselines were written for {node.share_noise}, this run uses {wanted}")

    worker = RolloutWorker(scrubbed=node.worker_env == "scrubbed")
    try:
        [first] = by_step[0]
        train_loop.apply(0, first, eval_every)
        writer.log(first)
        _log(f"step 0 eval: {json.dumps(first)}")
        for step in range(1, total + 1):
            slow = float(fault.get("factor", 3.0)) if kind == "slow" and step >= max(at_step, 1) else 1.0
            time.sleep(step_seconds * slow)
            node.check_ray()
            if teachers:
                _check_teachers(teachers)
            if kind == "hang" and step == at_step:
                _log(f"step {step}: waiting for rollout workers ...")
                while True:  # the simulated deadlock: nothing is logged any more
                    time.sleep(3600)
            if kind == "oom" and step == at_step:
                print("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 3 has a total "
                      "capacity of 79.11 GiB of which 1.02 GiB is free. (simulated oom fault)", file=sys.stderr,
                      flush=True)
                while True:  # the other ranks wait in a collective until NCCL times out
                    time.sleep(3600)
            *minibatch, summary = by_step[step]
            for mb_row in minibatch:  # mini-batch rows: no step-summary marker
                writer.log(mb_row)
            row = {k: v for k, v in summary.items() if k != "step"}
            train_loop.apply(step, row, eval_every, worker.factor(step))
            row[train_loop.REWARDS] = scorer.score(step, row[train_loop.REWARDS])
            row["time/step"] *= slow * (node.deterministic_slowdown if deterministic else 1.0)
            if kind == "nan" and step >= max(at_step, 1):
                default = "mismatch/mismatch_k3_kl" if suite == "grpo" else "distillation/reduced_distillation_kl"
                row[fault.get("metric", default)] = math.nan
            writer.log({"step": step, **row})
            if kind == "hold" and step == at_step:
                _hold(node, suite, step, writer, node.step_seconds)
            if kind == "crash" and step == at_step:
                # the process dies while this row is in the write buffer: it ends up half-written
                raise SimulatedCrash("RuntimeError: CUDA error: an illegal memory access was encountered "
                                     f"(simulated crash fault at step {step})")
            _log(f"step {step}/{total} rewards={row['response/rewards/mean']:.4f} "
                 f"len={row['response/response_len/mean']:.1f} time={row['time/step']:.1f}s")
            if lmdeploy_log:
                lmdeploy_log.write(f"[lmdeploy-sim] step {step}: generated {args.batch_hint} rollouts\n")
                lmdeploy_log.flush()
    except SimulatedCrash as exc:
        worker.stop()
        scorer.stop()
        writer.close(cut_last_row=True)
        print(f"Traceback (most recent call last):\n  File \"xtuner/v1/train/rl_trainer.py\", line 1, in fit\n{exc}",
              file=sys.stderr, flush=True)
        return 1
    worker.stop()
    scorer.stop()
    writer.close(cut_last_row=(kind == "truncated"))
    _log(f"training finished: {total} steps; tracker {writer.path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="SIMULATED XTuner RL trainer (rl-verify simulator)")
    p.add_argument("--rlsim-train", dest="suite", choices=["grpo", "opd"], required=True)
    p.add_argument("--config", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--eval-data", default="")
    p.add_argument("--work-dir", required=True)
    p.add_argument("--lmdeploy-log", default="")
    p.add_argument("--batch-hint", default="64")
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
