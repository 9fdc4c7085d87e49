"""Fixtures shared by the end-to-end tests. The rigs themselves stay module-scoped fixtures in each file (each
file its own settings); they are built with ``start_rig`` (see e2e_rigs.py for what every rig shares)."""

from __future__ import annotations

import functools
import time
from pathlib import Path

import pytest

from e2e_rigs import started_rig
from harness.rig import Rig
from simulator import node as sim

#: How long after a test the nodes of its rigs may take to show no process of its runs (issue 54: within a minute).
NOTHING_LEFT_WITHIN_S = 60


@pytest.fixture(scope="session")
def start_rig(tmp_path_factory):
    """``start_rig(name, **settings)``: a context manager giving a started rig in a fresh state folder (see
    :func:`e2e_rigs.started_rig`), stopped and its task logs removed when the block ends."""
    return functools.partial(started_rig, tmp_path_factory)


@pytest.fixture(autouse=True)
def nothing_left_on_the_nodes(request):
    """After every test with an SSH rig (a Slurm rig's test file checks its jobs itself): within a minute no process
    of the simulated nodes is left (launch scripts, trainers, teachers, Ray), and every job folder holds one training
    at most (one tracker: never a second training in a job's folder)."""
    yield
    rigs = [v for v in request.node.funcargs.values() if isinstance(v, Rig) and not v.slurm_gpus and v.nodes]
    for rig in rigs:
        deadline = time.monotonic() + NOTHING_LEFT_WITHIN_S
        left = [p for conn in rig.nodes for p in sim.node_processes(rig.node_state(conn))]
        while left and time.monotonic() < deadline:
            time.sleep(0.5)
            left = [p for conn in rig.nodes for p in sim.node_processes(rig.node_state(conn))]
        for conn in rig.nodes:
            sim.kill_node_processes(rig.node_state(conn))  # the next test starts on a clean node either way
        assert not left, f"processes of the nodes still running {NOTHING_LEFT_WITHIN_S} s after the test: {left}"
        for conn, info in rig.nodes.items():
            for work in (Path(info["root"]) / "runs").glob("*/work/*"):
                trackers = list(work.glob("*/logs/exp_tracking/tracker.jsonl"))
                assert len(trackers) <= 1, f"{work}: {len(trackers)} trainings in one job's folder: {trackers}"
