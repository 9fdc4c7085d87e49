"""Constants and small helpers shared by the simulated node's modules (standard library only)."""
from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from dataclasses import asdict, dataclass, fields
from types import ModuleType
from typing import Any

PKG = Path(__file__).resolve().parent
CHECKOUT_SRC = PKG / "xtuner_checkout"   # files of the simulated XTuner checkout (incl. autotest/ double)
OVERLAY_SRC = PKG / "xtuner_overlay"     # checkout files kept outside xtuner_checkout/autotest (owned by others)
BIN_SRC = PKG / "node_bin"
SSHD = Path("/usr/sbin/sshd")

OPD_SNAPSHOT = "models--Qwen--Qwen3-VL-2B-Instruct/snapshots/89644892e4d85e24eaac8bacfd4f463576704203"
MODELS = {
    "Qwen3-8B": "qwen3",
    OPD_SNAPSHOT: "qwen3_vl",
    "Qwen3-4B-Instruct-2507": "qwen3",
    "Qwen3-VL-4B-Instruct": "qwen3_vl",
}
GRPO_BASELINE = "qwen3-rl-lmdeploy/tracker.jsonl"
OPD_BASELINE = "opd-qwen3-vl-2b-25step/tracker.jsonl"

# Regression branches of the simulated checkout: node.json "commits" key -> (branch, commit message).
REGRESSION_BRANCHES = {
    "regress-init": ("sim/regress-init", "init", "Refactor weight loading (simulated init drift regression)"),
    "regress-divergence": ("sim/regress-divergence", "divergence",
                           "Rework advantage normalisation (simulated gradual divergence regression)"),
    "regress-mismatch": ("sim/regress-mismatch", "mismatch",
                         "Change rollout logprob path (simulated GRPO mismatch regression)"),
    "regress-teacher": ("sim/regress-teacher", "teacher",
                        "Change teacher endpoint batching (simulated OPD teacher-path regression)"),
    "regress-rewards": ("sim/regress-rewards", "rewards",
                        "Change judger answer extraction (simulated OPD rewards-only regression)"),
}
#: The regression kinds of the replay trainer (xtuner/rlsim/curves.py REGRESSIONS).
REGRESSION_KINDS = ("init", "divergence", "mismatch", "teacher", "rewards")
#: A commit on top of main that touches documentation only (the path-aware skip's case, issue 33).
DOCS_ONLY_BRANCH = "sim/docs-only"
DOCS_ONLY_FILES = ("docs/en/rl/grpo.md", "README.md")
#: A code change that leaves the numbers' bits alone (a refactor: deterministic runs give the same bits) and a
#: healthy one that changes them (a reordered reduction: other bits, the same statistics).
NEUTRAL_CODE_BRANCH = "sim/neutral-refactor"
NUMERICS_BRANCH = "sim/numerics-reorder"
#: A second numerics-neutral code commit, on top of ``NEUTRAL_CODE_BRANCH`` (whose tip stays the first one): the
#: bitwise lane's case once a reference exists at its parent.
NEUTRAL_FOLLOWUP_BRANCH = "sim/neutral-followup"
#: A gross regression of both suites whose code first runs at step ``LATE_FROM_STEP`` (the bitwise lane's blind
#: spot: its first steps are main's bits), and a numerics-neutral commit on top of it (the same bits, still
#: regressed): what the record must teach the lane (issue 42).
LATE_BRANCH = "sim/regress-late"
LATE_FOLLOWUP_BRANCH = "sim/regress-late-followup"
LATE_FROM_STEP = 10
#: Commits that edit the trainer's Python (issue 44: executed-code evidence), each on main: a regression in code
#: that first runs at step 10 (xtuner/rlsim/train_loop.py lr_schedule: rewards x0.8), a numerics-neutral edit of code
#: that runs every step (every_step), and an edit of code no process of either suite runs (another model family).
CODE_EDITS = {
    "regress-schedule": ("sim/regress-schedule", "xtuner/rlsim/train_loop.py",
                         ("    row[REWARDS] = row[REWARDS] * 1.0\n    row[LENGTH] = row[LENGTH] * 1.0\n",
                          "    row[REWARDS] = row[REWARDS] * 0.8\n    row[LENGTH] = row[LENGTH] * 1.0\n"),
                         "LR schedule: decay the reward scale after warm-up (simulated regression from step 10)"),
    "neutral-early": ("sim/neutral-early", "xtuner/rlsim/train_loop.py",
                      ("    row[REWARDS] = row[REWARDS] * 1.0 + 0.0\n", "    row[REWARDS] = row[REWARDS] + 0.0\n"),
                      "refactor: simplify the advantage path (simulated, numerics-neutral, runs every step)"),
    # The same kind of edit in the weight sync, verified by one test only (sim/neutral-early is PASSed by others, so
    # in a shared stack it may already be PASS (unchanged) since its own PASS).
    "neutral-sync": ("sim/neutral-sync", "xtuner/rlsim/train_loop.py",
                     ("    row[LENGTH] = row[LENGTH] * scale\n", "    row[LENGTH] = scale * row[LENGTH]\n"),
                     "weight sync: scale first (simulated, numerics-neutral: a product commutes bit for bit)"),
    "unused-change": ("sim/unused-change", "xtuner/v1/model/moe/deepseek_v3.py",
                      ("    return 1.0\n", "    return 0.5\n"),
                      "moe: rescale the DeepSeek-V3 router (simulated: code neither suite runs)"),
    # Issue 53: edits no touched line of which has bytecode, in code every step runs.
    "else-elif": ("sim/else-elif", "xtuner/rlsim/train_loop.py",
                  ("    else:\n        scale = scale * 2.0\n",
                   '    elif mode == "delta":\n        scale = scale * 2.0\n'),
                  "weight sync: a delta mode (simulated regression: the full sync's branch no longer runs, so "
                  "rewards and lengths halve from step 1)"),
    "module-rebind": ("sim/module-rebind", "xtuner/rlsim/train_loop.py",
                      ("    row[REWARDS] = row[REWARDS] * 1.0 + 0.0\n\n\ndef weight_sync",
                       "    row[REWARDS] = row[REWARDS] * 1.0 + 0.0\n\n"
                       "every_step = lambda step, row: row.__setitem__(REWARDS, row[REWARDS] * 0.85)  # noqa: E731\n"
                       "\ndef weight_sync"),
                      "advantage path: rescale rewards (simulated regression: one module-level line between the "
                      "blank lines before a def rebinds every_step, rewards x0.85 from step 1)"),
}
#: The LMDeploy rollout moved to a path no ``bitwise.disabled_by`` pattern names (a rename as XTuner's #1544 did):
#: the lane's rule matches nothing at that commit.
RENAME_BRANCH = "sim/rename-lmdeploy"
RENAMED_FROM, RENAMED_TO = "xtuner/v1/rl/rollout/lmdeploy.py", "xtuner/v1/rl/rollout/turbomind_backend.py"

# ----------------------------------------------------------------------------------------------------
# The linear history for bisection (issue 22): ``sim/bisect-good`` (= main, the known-good commit) and
# ``commits`` commits after it on the branch ``sim/bisect`` (tip tagged ``sim/bisect-bad``), first-parent
# linear. Positions count from the good commit: 0 = good, 1 = its child, ..., ``commits`` = the bad tip.
BISECT_BRANCH = "sim/bisect"
BISECT_GOOD_TAG = "sim/bisect-good"
BISECT_BAD_TAG = "sim/bisect-bad"
#: The helper the launch-failing commit sources from both launch scripts before it exists (the next commit adds it).
LAUNCH_HELPER = "scripts/launch_env.sh"


@dataclass(frozen=True)
class BisectLayout:
    """Where things are in the simulated bisection history (positions 1..``commits`` after the good commit).

    * ``culprit``: the commit that introduces the regression; it and every later commit carry it (their
      ``xtuner/rlsim/behaviour.json``: ``regression``, ``scale``, ``from_step``), every earlier one is healthy.
    * ``regression`` / ``scale`` / ``from_step``: the regression's kind (curves.REGRESSIONS), its size as a
      fraction of that kind's shifts, and the first training step it shows at. Default: the OPD teacher
      path at 1/3 of ``sim/regress-teacher``'s shifts - distillation KL +0.030 and abs loss +0.0267, one
      runbook threshold (0.03) - from step 10 (eval points 10..25); GRPO stays healthy on every commit.
    * ``launch_fails``: the commit whose launch scripts (both suites) source ``LAUNCH_HELPER`` before the
      file exists: under ``set -e`` they exit 1 ("No such file or directory") before Ray, teachers or any
      tracker; the next commit adds the file. 0: no such commit.

    Default layout: 16 commits, launch failure at 4, culprit at 11, from step 10. Configure a node with
    ``sim.json`` ``"bisect": {"commits": N, "culprit": C, "launch_fails": L, "from_step": S, "scale": X,
    "regression": K}`` (any subset; ``start_node(state, bisect={...})`` writes it) before the checkout is built;
    a changed layout rebuilds the checkout.
    """

    commits: int = 16
    culprit: int = 11
    launch_fails: int = 4
    regression: str = "teacher"
    scale: float = 1 / 3
    from_step: int = 10

    def __post_init__(self) -> None:
        def bad(what: str) -> None:
            raise ValueError(f"sim.json bisect: {what} (layout {asdict(self)})")
        if not 2 <= self.commits <= 64:
            bad("commits must be 2..64")
        if not 1 <= self.culprit <= self.commits:
            bad("culprit must be a position 1..commits")
        if not 0 <= self.launch_fails < self.commits or (self.launch_fails and self.launch_fails == self.culprit):
            bad("launch_fails must be 0 (none) or a position 1..commits-1 other than the culprit")
        if self.regression not in REGRESSION_KINDS:
            bad(f"regression must be one of {', '.join(REGRESSION_KINDS)}")
        if not 0 < self.scale <= 10 or self.from_step < 0:
            bad("scale must be in (0, 10] and from_step >= 0")

    @classmethod
    def from_sim(cls, sim: dict[str, Any]) -> "BisectLayout":
        """The layout ``sim.json`` asks for (its ``"bisect"`` object; missing keys take the defaults)."""
        given = dict(sim.get("bisect") or {})
        unknown = set(given) - {f.name for f in fields(cls)}
        if unknown:
            raise ValueError(f"sim.json bisect: unknown key(s) {', '.join(sorted(unknown))}")
        return cls(**given)

    def carries_regression(self, position: int) -> bool:
        """True for the culprit and every later commit."""
        return position >= self.culprit


#: The commits' authors (name, email), taken in turn; every commit is dated one hour after its parent.
BISECT_AUTHORS = (
    ("Wei Lin", "wei.lin@example.com"), ("Priya Raman", "priya.raman@example.com"),
    ("Jonas Becker", "jonas.becker@example.com"), ("Mei Tanaka", "mei.tanaka@example.com"),
    ("Carlos Ortega", "carlos.ortega@example.com"),
)
#: Subjects of the ordinary commits (no accuracy effect), taken in turn (numbered past the end of the list).
BISECT_SUBJECTS = (
    "rollout: reuse tokenizer across workers", "docs: describe MOPD teacher endpoints",
    "config: expose eval temperature", "logging: add step time breakdown to tracker",
    "ray: raise object store memory default", "tests: cover empty eval batches",
    "judger: normalise whitespace before comparing answers", "data: skip empty prompts in the loader",
    "trainer: move checkpoint saving to a helper", "lmdeploy: pin backend session length",
    "rollout: log dropped samples", "refactor: rename advantage helpers",
    "ci: cache pip downloads", "docs: fix the GRPO quick start", "eval: report sample counts",
    "trainer: free rollout buffers after each step", "config: document TRAIN_BATCH_SIZE",
    "utils: faster JSONL writer", "rollout: retry a lost teacher connection once", "deps: bump transformers pin",
)
BISECT_CULPRIT_SUBJECT = "teacher: batch rollout-teacher logprob requests per sample group"
BISECT_LAUNCH_FAIL_SUBJECT = "launch: source shared launch environment from scripts/launch_env.sh"
BISECT_FIX_SUBJECT = "launch: add the forgotten scripts/launch_env.sh"

FAULT_KINDS = ("crash", "hang", "truncated", "nan", "missing-input", "slow", "hold", "oom")
# What a missing-input fault hides by default, per suite (relative to ROOT).
DEFAULT_MISSING = {"grpo": "share/model/Qwen3-8B", "opd": "share/model/Qwen3-VL-4B-Instruct"}
HIDDEN_SUFFIX = ".rlsim-hidden"
# Fixed dates make the checkout's SHAs reproducible for identical sources.
GIT_DATE = "2026-10-26T09:00:00+00:00"


# ----------------------------------------------------------------------------------------------------
# Small helpers
def _root(state: Path) -> Path:
    return Path(state).resolve() / "node"


def _write_json(path: Path, data: Any) -> None:
    """Atomic JSON write (readers on the node never see a half-written file)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)


def _read_json(path: Path, default: Any) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return default


def _run(cmd: list[str], cwd: Path | None = None, env: dict[str, str] | None = None) -> str:
    res = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({res.returncode}): {res.stderr.strip() or res.stdout.strip()}")
    return res.stdout


def _node_python() -> str:
    """The interpreter for the node's bin/ scripts: the system python3 (stdlib only) if present."""
    return "/usr/bin/python3" if Path("/usr/bin/python3").exists() else sys.executable


def load_curves() -> ModuleType:
    """The checkout's curves.py, loaded by path: baselines and the replay trainer share one model."""
    spec = importlib.util.spec_from_file_location("rlsim_curves", CHECKOUT_SRC / "xtuner" / "rlsim" / "curves.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return not _is_zombie(pid)


def _is_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return False

