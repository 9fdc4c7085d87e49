"""What every end-to-end rig shares: the sshd check, a rig started and stopped around a module, its task logs
removed once it is gone. Each test file keeps only its own settings (nodes, step time, environment) and what it
does to the rig once it is up."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import pytest

from harness.rig import Rig
from simulator import node as sim


def require_sshd() -> None:
    """Fails the test (not a skip: ``make test`` installs sshd, so a missing one is a broken setup) when the
    simulated node's sshd is not installed."""
    if not sim.SSHD.exists():
        pytest.fail("/usr/sbin/sshd missing: run scripts/ensure_sshd.sh (make test does)")


def drop_task_logs(rig: Rig) -> None:
    """Removes the stopped rig's Airflow task logs (the bulk of a rig's files; the rest stays for reading)."""
    shutil.rmtree(rig.state_dir / "airflow" / "airflow_home" / "logs", ignore_errors=True)


@contextmanager
def started_rig(tmp_path_factory: pytest.TempPathFactory, name: str, *, records: bool = True,
                extra_env: Mapping[str, str] | Callable[[Rig], Mapping[str, str]] | None = None,
                schedule: str | None = None, **rig_args: Any) -> Iterator[Rig]:
    """A rig in a fresh state folder named ``name``, started with ``extra_env`` and ``schedule``; stopped and its
    task logs removed when the block ends, whether the start, the block or the tests in it failed.

    ``records``: the record in the state folder's ``records`` (False: the rig's default, e.g. the distributed
    rig's S3 bucket). ``rig_args`` go to :class:`Rig` (``step_seconds``, ``nodes``, ``database``, ...).
    """
    require_sshd()
    state = tmp_path_factory.mktemp(name)
    rig = Rig(state, state / "records" if records else None, **rig_args)
    try:
        rig.start(extra_env=extra_env, schedule=schedule)
        yield rig
    finally:
        rig.stop()
        drop_task_logs(rig)
