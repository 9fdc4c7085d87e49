"""The test run's own guard (tests/conftest.py): a hanging test fails at its deadline with the line it hung at, the
run goes on to the next test, and a failure is printed when it happens, not only at the end."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

CONFTEST = Path(__file__).resolve().parents[1] / "conftest.py"

HANGING = '''
import time

def test_hangs_in_a_sleep():
    time.sleep(600)

def test_swallows_exceptions_in_a_retry_loop():
    while True:
        try:
            time.sleep(600)
        except Exception:
            pass

def test_runs_after_the_hang():
    assert True
'''


@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["in-process", "xdist"])
def test_a_hanging_test_fails_at_its_deadline_and_the_run_goes_on(tmp_path, workers):
    (tmp_path / "tests" / "unit").mkdir(parents=True)
    shutil.copy(CONFTEST, tmp_path / "tests" / "conftest.py")
    (tmp_path / "tests" / "unit" / "test_hang.py").write_text(HANGING)
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *workers,
                           "--rootdir", str(tmp_path), "tests"], cwd=tmp_path, capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", "RL_VERIFY_TEST_DEADLINE_S": "2"}, timeout=120)
    took = time.monotonic() - started
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    assert "2 failed, 1 passed" in out, out
    assert took < 60, f"took {took:.0f} s"
    assert out.count("passed its deadline of 2 s") >= 2, out
    assert "time.sleep(600)" in out  # the line it hung at
    # printed as it happened: before pytest's own summary of failures
    assert out.index("FAILED (call) tests/unit/test_hang.py::test_hangs_in_a_sleep") < out.index("= FAILURES =")


def test_a_test_that_swallows_its_deadline_has_its_worker_ended_with_the_stacks_shown(tmp_path):
    (tmp_path / "tests" / "unit").mkdir(parents=True)
    shutil.copy(CONFTEST, tmp_path / "tests" / "conftest.py")
    (tmp_path / "tests" / "unit" / "test_hang.py").write_text(
        "import time\n\n"
        "def test_swallows_everything():\n"
        "    while True:\n"
        "        try:\n"
        "            time.sleep(600)\n"
        "        except BaseException:\n"
        "            pass\n\n"
        "def test_runs_after_the_hang():\n"
        "    assert True\n")
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2",
                           "--rootdir", str(tmp_path), "tests"], cwd=tmp_path, capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", "RL_VERIFY_TEST_DEADLINE_S": "2",
                               "RL_VERIFY_TEST_UNWIND_S": "2"}, timeout=120)
    out = done.stdout + done.stderr
    assert "1 failed, 1 passed" in out, out
    assert "crashed while running 'tests/unit/test_hang.py::test_swallows_everything'" in out
    assert 'test_hang.py", line 6 in test_swallows_everything' in out  # its stack, printed by the controller
