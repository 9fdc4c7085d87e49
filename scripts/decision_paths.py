"""The shortcut decision as the DAG takes it and as ``rl-verify shortcut --evidence`` says it, for one commit of a local
checkout (issue 53: the two must agree on every case of the mutation benchmark; ``scripts.bench_mutation`` counts
their disagreements, ``tests/unit/test_shortcut_paths_agree.py`` pins a sample of every operator).

The DAG's side runs its own functions, ``orchestration.unchanged.unchanged_on_node`` (PASS (unchanged): the path rules
since the verified PASS, or the trusted reference's executed-code evidence) then ``orchestration.bitwise_lane.decide``
(bitwise or full), over a record store in a temporary folder that holds the base as the suite's verified PASS and as
its trusted bitwise reference with the evidence. Only the transport is replaced: the node's scripts
(``sh/changed_files.sh``, ``sh/changed_lines.sh``, ...) run here with bash instead of over SSH, and the node's settings
name the local checkout. The CLI's side is ``rl_verify.cli.main`` with ``--json``, its output read back.
"""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
from collections.abc import Iterator, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any
from unittest import mock

from rl_verify import cli, settings
from rl_verify.core import bitwise
from rl_verify.engines import load_suite
from rl_verify.node import ops
from rl_verify.orchestration import bitwise_lane, unchanged
from rl_verify.store import references

#: The node's environment (what ``node.ops.read_environment`` would read) and the experiment's fingerprint.
ENVIRONMENT = {"gpu": "NVIDIA H100 80GB HBM3", "gpu_count": 8, "driver": "580.159.04", "cuda": "13.0",
               "packages": {"torch": "2.8.0"}}
EXPERIMENT = "mutation-bench"
CONN = "bench_node"
MADE_AT = "2026-12-01T00:00:00+00:00"


def _bash(client: Any, script: str, timeout: float = 120) -> tuple[int, str, str]:
    """``node.ops.run_script`` here: the same script, bash on this machine instead of the node's."""
    done = subprocess.run(["bash", "-s"], input=script, capture_output=True, text=True, timeout=timeout)
    return done.returncode, done.stdout, done.stderr


@contextlib.contextmanager
def dag_offline(repo: Path, record_root: Path) -> Iterator[None]:
    """The DAG's decision functions with the node reached through this machine's bash and the record store in
    ``record_root``."""
    @contextlib.contextmanager
    def no_ssh(conn: str) -> Iterator[None]:
        yield None

    with mock.patch.object(ops, "run_script", _bash), \
            mock.patch.object(bitwise_lane, "ssh_client", no_ssh), \
            mock.patch.object(bitwise_lane, "node_settings", lambda conn: {settings.NODE_CHECKOUT_KEY: str(repo)}), \
            mock.patch.object(settings, "RECORD_ROOT", str(record_root)):
        yield


def keep_base(suite: str, base: str, recorded: Mapping[str, Any]) -> None:
    """The base as ``suite``'s trusted bitwise reference on ``ENVIRONMENT``, its executed-code evidence beside it
    (``recorded``: ``core.evidence.Evidence.to_dict()``), in the record store ``dag_offline`` set."""
    spec = load_suite(suite)
    key = bitwise.reference_key(suite, EXPERIMENT, bitwise.fingerprint(ENVIRONMENT), bitwise_lane.lane_config(spec))
    references.put(key, {"state": references.TRUSTED, "sha": base, "made_at": MADE_AT, "rows": [], "suite": suite,
                         "environment": bitwise.fingerprint(ENVIRONMENT), "evidence": "complete"})
    references.put_evidence(key, {**dict(recorded), "sha": base, "made_at": MADE_AT})


def dag_choice(repo: Path, suite: str, base: str, head: str) -> str:
    """What the DAG's ``resolve_commit`` and ``check_prerequisites`` decide for ``suite`` at ``head`` (inside
    ``dag_offline``, after ``keep_base``): ``unchanged``, ``bitwise`` or ``full``."""
    spec = load_suite(suite)
    tree = ops.tree_files(None, str(repo), head)
    now = datetime.fromisoformat(MADE_AT).timestamp() + 3600
    found = {suite: {"sha": base, "run_id": "bench", "report": None, "written_at": now - 1800}}
    skipped = unchanged.unchanged_on_node(None, str(repo), head, [spec], found, now=now, tree=tree,
                                          fingerprints={suite: EXPERIMENT}, environment=lambda: ENVIRONMENT)
    if suite in skipped:
        return "unchanged"
    resolved = {"suites": [suite], "sha": head, "lane": "auto", "node": CONN, "run_dir": "/", "worktree": "/",
                "suite_fingerprints": {suite: EXPERIMENT}}
    environments = {CONN: {**ENVIRONMENT, "fingerprint": bitwise.fingerprint(ENVIRONMENT)}}
    entry = bitwise_lane.decide(resolved, environments, now=now).get(suite)
    return "full" if entry is None else str(entry["choice"])


def cli_choice(repo: Path, suite: str, base: str, head: str, evidence_file: Path) -> str:
    """What ``rl-verify shortcut --evidence`` says for ``suite`` at ``head`` (``--base``: the base, standing for the
    verified PASS and the trusted reference)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status = cli.main(["shortcut", "--checkout", str(repo), "--base", base, "--head", head, "--suite", suite,
                           "--evidence", str(evidence_file), "--json"])
    if status != 0:
        return f"error (exit {status})"
    return str(json.loads(out.getvalue())["suites"][suite]["choice"])


def write_evidence(folder: Path, suite: str, base: str, recorded: Mapping[str, Any]) -> Path:
    """The evidence JSON as the record store keeps it beside a reference (what ``--evidence`` takes)."""
    path = folder / f"evidence-{suite}.json"
    path.write_text(json.dumps({**dict(recorded), "sha": base, "made_at": MADE_AT}))
    return path
