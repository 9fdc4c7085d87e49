"""Constants and small helpers shared by the simulated node's modules (standard library only)."""
from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
from pathlib import Path
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


def _load_curves() -> ModuleType:
    """The checkout's curves.py, loaded by path: baselines and the replay trainer share one model."""
    spec = importlib.util.spec_from_file_location("rlsim_curves", CHECKOUT_SRC / "xtuner_sim" / "curves.py")
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

