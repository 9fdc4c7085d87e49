"""Integration fixtures: one SIMULATED GPU node (real sshd on 127.0.0.1) per test session.

SSH uses paramiko with the node's host key PINNED (RejectPolicy: an unknown or different host key is
refused), never AutoAddPolicy. Helpers live in sim_ssh.py.
"""
from __future__ import annotations

import json
from contextlib import contextmanager
import shutil
from collections.abc import Iterator

import pytest

pytest.importorskip("paramiko")

from sim_ssh import STEP_SECONDS, Node, pinned_client, simnode  # noqa: E402


@contextmanager
def _running_node(tmp_path_factory: pytest.TempPathFactory, name: str) -> Iterator[Node]:
    """Start a simulated node in a fresh state dir, yield it connected, stop it and remove it."""
    if not simnode.SSHD.exists():
        # A failure, not a skip: `make test` installs sshd, so a missing one is a broken setup.
        pytest.fail("/usr/sbin/sshd missing: run scripts/ensure_sshd.sh (make test does)")
    state = tmp_path_factory.mktemp(name)
    info = simnode.start_node(state, step_seconds=STEP_SECONDS)
    assert json.loads((state / "node.json").read_text()) == info
    node = Node(state=state, info=info, client=pinned_client(info))
    try:
        yield node
    finally:
        node.client.close()
        simnode.stop_node(state)
        shutil.rmtree(state, ignore_errors=True)


@pytest.fixture(scope="session")
def sim_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    """The session's simulated node (started once, stopped at the end)."""
    with _running_node(tmp_path_factory, "rlsim-node") as node:
        yield node


@pytest.fixture()
def fresh_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    """A second, private node for tests that must stop the node themselves."""
    with _running_node(tmp_path_factory, "rlsim-fresh") as node:
        yield node


@pytest.fixture()
def faults(sim_node: Node) -> Iterator[Node]:
    """The session node, with every fault switched off again after the test."""
    simnode.clear_faults(sim_node.state)
    try:
        yield sim_node
    finally:
        simnode.clear_faults(sim_node.state)
