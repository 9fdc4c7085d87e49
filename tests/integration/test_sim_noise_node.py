"""The SIMULATED node in realistic noise mode: its trainer writes exactly curves.run_rows' rows and its
share's baselines are curves.baseline_rows' (so a benchmark replaying seeds without SSH and the node
agree), and switching back restores bounded mode."""
from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
from sim_ssh import Node, simnode
from test_simulated_node import parse, suite_launch, tracker_of

from simulator.common import load_curves

pytestmark = pytest.mark.integration
curves = load_curves()


def launch(node: Node, suite: str, ref: str, name: str, extra_env: dict[str, str]) -> tuple[int, Path]:
    """Launch ``suite`` at ``ref`` as its spec declares (test_simulated_node.run_suite), plus ``extra_env``."""
    wt = node.worktree(ref, name)
    work_dir = str(node.state / "runs" / name)
    node.run(f"mkdir -p {shlex.quote(work_dir)}")
    cmd, env = suite_launch(node, suite, wt, work_dir)
    # a GRPO launch before may have left its Ray head running: `ray start --head` refuses a second one
    rc, _, _ = node.run("ray stop --force > /dev/null; " + cmd, env={**env, **extra_env}, timeout=900)
    return rc, Path(work_dir)


def test_realistic_node_writes_the_generators_rows(faults: Node) -> None:
    base = faults.root / "share" / "baseline"
    try:
        assert simnode.set_noise(faults.state, "realistic", "it-7") == {"noise": "realistic",
                                                                       "baseline_error_seed": "it-7",
                                                                       "spread_ratio": 1.0, "correlation": 0.0}
        for suite, rel in (("grpo", "qwen3-rl-lmdeploy/tracker.jsonl"),
                           ("opd", "opd-qwen3-vl-2b-25step/tracker.jsonl")):
            rows, partial = parse((base / rel).read_text())
            assert partial is None
            assert rows == curves.baseline_rows(suite, "realistic", baseline_error_seed="it-7")

        rc, work_dir = launch(faults, "opd", "main", "opd-realistic", {"RLSIM_SEED": "noise-it"})
        assert rc == 0, (work_dir / "launch.out").read_text()[-2000:]
        rows, partial = parse(tracker_of(work_dir).read_text())
        assert partial is None
        expected = curves.run_rows("opd", "noise-it", None, "realistic", steps=25, eval_every=5,
                                   baseline_error_seed="it-7")
        assert rows == json.loads(json.dumps(expected))  # the tracker's JSON round trip, nothing else
        logs = "".join(p.read_text(errors="replace") for p in work_dir.rglob("*")
                       if p.is_file() and p.suffix in (".out", ".txt", ".log"))
        assert "noise=realistic, seed=noise-it" in logs
        assert "WARNING: share baselines" not in logs
    finally:
        simnode.set_noise(faults.state, "bounded")
    assert simnode.noise_settings(faults.state)["noise"] == "bounded"
    rows, _ = parse((base / "opd-qwen3-vl-2b-25step" / "tracker.jsonl").read_text())
    assert rows == curves.baseline_rows("opd")
