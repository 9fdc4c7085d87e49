"""Running the checkout's own ``check_rl_result`` (runbook section 1) and reading what it says.

It runs in a subprocess (the package's own interpreter, its own working folder inside the output folder,
``GITHUB_RUN_ID``/``GITHUB_STEP_SUMMARY`` pointing inside that folder, a timeout) on sanitised copies of the
trackers; its "Some metric check failed: {...}" message is parsed into the metrics it names and the step
numbers it counts translated into the tracker's.
"""

from __future__ import annotations

import ast
import json
import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rl_verify.core.errors import CheckerError, InputError

CHECKER_FOLDER = "checker"           # the checker's working folder inside the output folder
CHECKER_RUN_ID = "rl-verify"         # GITHUB_RUN_ID given to the checker: its PNG lands in <cwd>/<id>/
STDERR_TAIL_CHARS = 3000
_CHECKER_STEP = re.compile(r"\bstep (\d+)\b")

# Runs inside the subprocess. Kept as a file in the working folder so a human can re-run it.
RUNNER = '''\
"""Runs the checkout's check_rl_result exactly as runbook section 1 shows (written by rl-verify)."""
import json
import sys

checker_dir, base, cur, info_path, result_path, case_name = sys.argv[1:7]
sys.path.insert(0, checker_dir)  # the checkout's autotest/ must come first: it imports utils.*
from utils.check_metric import check_rl_result  # noqa: E402

with open(info_path, encoding="utf-8") as handle:
    assert_info = json.load(handle)
try:
    ok, message = check_rl_result(case_name, base, cur, assert_info)
    result = {"status": "returned", "ok": bool(ok), "message": str(message)}
except AssertionError as exc:  # the checker's way of saying "different number of RL steps"
    result = {"status": "assertion", "ok": False, "message": str(exc)}
with open(result_path, "w", encoding="utf-8") as handle:
    json.dump(result, handle)
'''


@dataclass
class CheckerOutcome:
    """What the checker said. ``step_count`` is True when it raised its step-count AssertionError."""

    ok: bool
    message: str
    status: str
    png: str | None
    workdir: str
    step_summary: str
    stdout: str
    stderr: str

    @property
    def step_count(self) -> bool:
        return self.status == "assertion" and "steps" in self.message.lower()

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "message": self.message, "status": self.status, "png": self.png,
                "workdir": self.workdir, "step_summary": self.step_summary, "stdout": self.stdout,
                "stderr": self.stderr, "reason": "step count" if self.step_count else None}


def checker_file(checker_dir: Path) -> Path:
    """Validate that ``checker_dir`` is a checkout's autotest folder; return check_metric.py."""
    target = checker_dir / "utils" / "check_metric.py"
    if not target.is_file():
        raise InputError("no utils/check_metric.py under the checker dir", checker_dir, None,
                         "the checker dir must be the checkout's autotest folder (<checkout>/autotest)")
    return target


def _tail(path: Path, chars: int = STDERR_TAIL_CHARS) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    return text[-chars:]


def run_checker(checker_dir: Path, workdir: Path, base_copy: Path, cur_copy: Path,
                assert_info: dict[str, Any], timeout_s: float, case_name: str) -> CheckerOutcome:
    """Run ``check_rl_result`` in a subprocess with ``workdir`` as its cwd; never raises for a
    FAIL. Raises ``CheckerError`` when the checker crashes, writes no result, or times out (the
    whole process group is killed)."""
    # The subprocess runs with cwd=workdir: every path handed to it must be absolute.
    workdir, base_copy, cur_copy = workdir.resolve(), base_copy.resolve(), cur_copy.resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    runner = workdir / "run_checker.py"
    runner.write_text(RUNNER, encoding="utf-8")
    info = workdir / "assert_info.json"
    info.write_text(json.dumps(assert_info, indent=1), encoding="utf-8")
    result_path = workdir / "checker_result.json"
    result_path.unlink(missing_ok=True)
    summary = workdir / "step_summary.md"
    stdout_path, stderr_path = workdir / "checker.stdout.log", workdir / "checker.stderr.log"
    env = dict(os.environ)
    env.update({"GITHUB_RUN_ID": CHECKER_RUN_ID, "GITHUB_STEP_SUMMARY": str(summary), "MPLBACKEND": "Agg"})
    cmd = [sys.executable, str(runner), str(checker_dir.resolve()), str(base_copy), str(cur_copy), str(info),
           str(result_path), case_name]
    with open(stdout_path, "wb") as out, open(stderr_path, "wb") as err:
        # Own session: on timeout the whole group (checker + anything it spawned) is killed.
        proc = subprocess.Popen(cmd, cwd=workdir, env=env, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                start_new_session=True)
        try:
            code = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            raise CheckerError(f"checker timed out after {timeout_s:g} s and was killed", checker_dir / "utils"
                               / "check_metric.py", None, "check the checkout's checker (hang?) or raise the timeout",
                               stderr_tail=_tail(stderr_path)) from None
    if code != 0 or not result_path.is_file():
        raise CheckerError(f"checker crashed (exit status {code})", checker_dir / "utils" / "check_metric.py", None,
                           f"read the traceback below / {stderr_path}; fix the checkout or the inputs",
                           stderr_tail=_tail(stderr_path))
    result = json.loads(result_path.read_text(encoding="utf-8"))
    png: Path | None = workdir / CHECKER_RUN_ID / f"{case_name}_comparison.png"
    if not png.is_file():
        # A checkout whose checker names its plot differently: keep whatever PNG it left in <cwd>/<run id>/.
        plots = workdir / CHECKER_RUN_ID
        png = next(iter(sorted(plots.glob("*.png"))), None) if plots.is_dir() else None
    return CheckerOutcome(ok=bool(result["ok"]), message=str(result["message"]), status=result["status"],
                          png=str(png) if png is not None else None, workdir=str(workdir),
                          step_summary=str(summary), stdout=str(stdout_path), stderr=str(stderr_path))


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def checker_reasons(message: str) -> dict[str, str]:
    """{metric: reason} from the checker's "Some metric check failed: {...}" message ({} if unparsable)."""
    _, sep, tail = message.partition("failed:")
    if sep:
        try:
            parsed = ast.literal_eval(tail.strip())
        except (ValueError, SyntaxError):
            return {}
        if isinstance(parsed, dict):
            return {str(k): str(v) for k, v in parsed.items()}
    return {}


def translate_checker_step(reason: str, breach_index: int | None, breach_step: int | None) -> str | None:
    """Say which tracker step the checker's own "step N" in ``reason`` is, or None when it needs no saying.

    The checker counts the step-summary rows itself (the real one from 0); the report speaks in the
    tracker's step numbers. ``breach_index`` is the 0-based row index of the first breaching row,
    ``breach_step`` that row's tracker step.
    """
    match = _CHECKER_STEP.search(reason)
    if match is None or breach_index is None or breach_step is None:
        return None
    number = int(match.group(1))
    if number == breach_step:
        return None
    if number == breach_index:
        return f"checker index {number} (counted from 0) = step {breach_step}"
    if number == breach_index + 1:
        return f"checker row {number} (counted from 1) = step {breach_step}"
    return f"checker's own step {number}; the first breaching tracker step is {breach_step}"


def failed_metrics(message: str, metrics: list[str]) -> set[str] | None:
    """Metric names the checker's "Some metric check failed: {metric: reason, ...}" message names.

    Parses the dict when it is a Python literal (``checker_reasons``), else falls back to the
    checked names found in the text. None when nothing can be identified.
    """
    reasons = checker_reasons(message)
    if reasons:
        return set(reasons)
    found = {m for m in metrics if m in message}
    return found or None
