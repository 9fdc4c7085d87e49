"""Integration fixtures: one SIMULATED GPU node (real sshd on 127.0.0.1) per test session.

SSH uses paramiko with the node's host key PINNED (RejectPolicy: an unknown or different host key is
refused), never AutoAddPolicy. Helpers live in sim_ssh.py.
"""
from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("paramiko")

from sim_ssh import STEP_SECONDS, Node, pinned_client, simnode  # noqa: E402


def _start(state: Path) -> Node:
    info = simnode.start_node(state, step_seconds=STEP_SECONDS)
    assert json.loads((state / "node.json").read_text()) == info
    return Node(state=state, info=info, client=pinned_client(info))


@pytest.fixture(scope="session")
def sim_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    """The session's simulated node (started once, stopped at the end)."""
    if not simnode.SSHD.exists():
        pytest.skip("/usr/sbin/sshd missing: run scripts/ensure_sshd.sh")
    state = tmp_path_factory.mktemp("rlsim-node")
    node = _start(state)
    try:
        yield node
    finally:
        node.client.close()
        simnode.stop_node(state)


@pytest.fixture()
def fresh_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    """A second, private node for tests that must stop the node themselves."""
    if not simnode.SSHD.exists():
        pytest.skip("/usr/sbin/sshd missing: run scripts/ensure_sshd.sh")
    state = tmp_path_factory.mktemp("rlsim-fresh")
    node = _start(state)
    try:
        yield node
    finally:
        node.client.close()
        simnode.stop_node(state)
        shutil.rmtree(state, ignore_errors=True)


@pytest.fixture()
def faults(sim_node: Node) -> Iterator[Node]:
    """The session node, with every fault switched off again after the test."""
    simnode.clear_faults(sim_node.state)
    try:
        yield sim_node
    finally:
        simnode.clear_faults(sim_node.state)
