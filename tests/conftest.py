"""The order test files are handed to pytest-xdist workers (``make test``: ``--dist loadfile
--no-loadscope-reorder``): the longest files first, so that the two workers finish together.

xdist's default order (most tests first) put the many-case unit files first and the long end-to-end
files, each one Airflow stack, last: one worker then ran the last long file alone. The weights are the
files' measured seconds on 2 cores (make test, 2026-12-02); a file not listed weighs by its kind.
"""

from __future__ import annotations

#: Measured seconds of the longest files (rounded); the order matters, not the figures.
FILE_SECONDS = {
    "tests/e2e/test_dag_e2e.py": 900,
    "tests/e2e/test_faults.py": 740,
    "tests/e2e/test_bisection.py": 500,
    "tests/e2e/test_calibration_dag.py": 480,
    "tests/e2e/test_nightly.py": 440,
    "tests/e2e/test_ui_reading.py": 400,
    "tests/e2e/test_distributed.py": 350,
    "tests/e2e/test_confirmation.py": 310,
    "tests/e2e/test_bad_input_and_security.py": 260,
    "tests/e2e/test_airflow_stack.py": 90,
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
