"""Test-run plumbing shared by every test: the order files are handed to workers, a deadline per test, and
failures printed the moment they happen.

The order test files are handed to pytest-xdist workers (``make test``: ``--dist loadfile
--no-loadscope-reorder``): the longest files first, so that the two workers finish together.

xdist's default order (most tests first) put the many-case unit files first and the long end-to-end
files, each one Airflow stack, last: one worker then ran the last long file alone. The weights are the
files' measured seconds on 2 cores (make test, 2026-12-04, e2e stacks on PostgreSQL); a file not listed
weighs by its kind.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import threading

import pytest

#: Measured seconds of the longest files (rounded); the order matters, not the figures.
FILE_SECONDS = {
    "tests/e2e/test_bisection.py": 880,
    "tests/e2e/test_dag_e2e.py": 870,
    "tests/e2e/test_faults.py": 740,
    "tests/e2e/test_ui_reading.py": 560,
    "tests/e2e/test_calibration_dag.py": 480,
    "tests/e2e/test_nightly.py": 455,
    "tests/e2e/test_confirmation.py": 520,
    "tests/e2e/test_shortcuts.py": 560,
    "tests/e2e/test_slurm.py": 420,
    "tests/e2e/test_distributed.py": 275,
    "tests/e2e/test_bad_input_and_security.py": 160,
    "tests/e2e/test_airflow_stack.py": 150,
}
KIND_SECONDS = {"e2e": 300, "integration": 20, "dags": 5, "unit": 5}


def _weight(path: str) -> int:
    if path in FILE_SECONDS:
        return FILE_SECONDS[path]
    kind = path.split("/")[1] if path.count("/") >= 2 else ""
    return KIND_SECONDS.get(kind, 5)


def pytest_collection_modifyitems(session, config, items) -> None:
    """Heaviest files first; a file's tests keep their order (a stable sort by file weight only)."""
    items.sort(key=lambda item: -_weight(item.nodeid.split("::", 1)[0]))


# ----------------------------------------------------------------------------- a deadline per test
#: Longest one test may take, its setup and teardown included (a module's Airflow stack starts in its first test's
#: setup), by kind. Far above the longest measured (2 cores, loaded: an e2e test at most ~400 s): only a hang
#: reaches it. A hang once held a CI run until its 5400 s were spent, with no word of which test it was.
DEADLINE_S = {"e2e": 1200, "integration": 300, "dags": 180, "unit": 180}
#: After the deadline's exception, how long the test may take to unwind before its worker is ended.
UNWIND_S = 180


class TestDeadlineExceeded(BaseException):
    """Raised in a test that passed its deadline. A BaseException: a retry loop's ``except Exception`` must not
    swallow it (pytest still reports it as the test's failure, with the stack where it hung)."""

    __test__ = False  # not a test class, despite its name


def deadline_s(nodeid: str) -> int:
    """The test's deadline in seconds: RL_VERIFY_TEST_DEADLINE_S when set, else its kind's."""
    if os.environ.get("RL_VERIFY_TEST_DEADLINE_S"):
        return int(os.environ["RL_VERIFY_TEST_DEADLINE_S"])
    path = nodeid.split("::", 1)[0]
    kind = path.split("/")[1] if path.count("/") >= 2 else ""
    return DEADLINE_S.get(kind, DEADLINE_S["unit"])


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Arms SIGALRM for the test's whole protocol: on expiry the test fails where it hangs. If it still does not
    return, faulthandler prints every thread's stack and ends the worker (xdist reports the crash, goes on)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    limit = deadline_s(item.nodeid)

    def expired(signum, frame):
        raise TestDeadlineExceeded(f"{item.nodeid} passed its deadline of {limit} s (setup, call and teardown "
                                   "together; tests/conftest.py DEADLINE_S): it hung at the line above")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(limit)
    unwind = int(os.environ.get("RL_VERIFY_TEST_UNWIND_S") or UNWIND_S)
    faulthandler.dump_traceback_later(limit + unwind, exit=True, file=_stack_dump_file(item.config))
    try:
        yield
    finally:
        signal.alarm(0)
        faulthandler.cancel_dump_traceback_later()
        signal.signal(signal.SIGALRM, previous)


#: Where a worker ended by faulthandler leaves its threads' stacks (its stderr reaches no one under xdist).
STACK_DUMPS = ".state/test-hangs"
_DUMP_FILES: dict[str, object] = {}


def _worker_id(config: pytest.Config) -> str:
    return getattr(config, "workerinput", {}).get("workerid", "main")


def _stack_dump_file(config: pytest.Config):
    """This process's stack-dump file, opened once and kept open (faulthandler writes to its descriptor)."""
    if "file" not in _DUMP_FILES:
        folder = config.rootpath / STACK_DUMPS
        folder.mkdir(parents=True, exist_ok=True)
        _DUMP_FILES["file"] = open(folder / f"{_worker_id(config)}-{os.getpid()}.txt", "w")  # noqa: SIM115
    return _DUMP_FILES["file"]


def _stack_dumps(config: pytest.Config, worker: str) -> list[str]:
    """The non-empty stack dumps a worker of this name left."""
    folder = config.rootpath / STACK_DUMPS
    return [p.read_text() for p in sorted(folder.glob(f"{worker}-*.txt")) if p.stat().st_size] if folder.is_dir() \
        else []


# ----------------------------------------------------------------------------- failures as they happen
def pytest_runtest_logreport(report) -> None:
    """Prints a failure's report the moment it arrives, not only in the summary at the end: a run stopped from
    outside (a CI time limit) still shows what failed and why."""
    if not report.failed or (report.when == "call" and hasattr(report, "wasxfail")):
        return
    config = _CONFIG.get("config")
    if config is None or hasattr(config, "workerinput"):
        return  # an xdist worker: its controller prints
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None:
        return
    text = report.longreprtext.splitlines()
    shown = text[-80:]
    reporter.write_line("")
    reporter.write_line(f"FAILED ({report.when}) {report.nodeid}"
                        + (f"  [last 80 of {len(text)} lines]" if len(text) > 80 else ""), red=True, bold=True)
    for line in shown:
        reporter.write_line(line)
    worker = getattr(report, "node", None) and report.node.gateway.id
    if worker and "crashed while running" in report.longreprtext:
        for dump in _stack_dumps(config, worker):
            reporter.write_line(f"{worker}'s threads when it was ended ({STACK_DUMPS}):")
            reporter.write_line(dump[-6000:])


_CONFIG: dict[str, pytest.Config] = {}


def pytest_configure(config: pytest.Config) -> None:
    _CONFIG["config"] = config
    if not hasattr(config, "workerinput"):  # the controller: last run's dumps are not this run's
        for old in (config.rootpath / STACK_DUMPS).glob("*.txt"):
            old.unlink()
