"""Executed-code evidence through the whole DAG (issue 44; real Airflow, the simulated node, real sshd): a reference's
full run and its lane's steps record the checkout lines every process ran (coverage.py through the job's
environment), and the shortcuts read them: a regression in code that first runs at step 10 turns the lane off (the
card names the line) and FAILs in full; a neutral change in code the lane's steps run is PASS (bitwise); a change to
code no process ran is PASS (unchanged) with no training; evidence missing a worker process falls back to the path
rules, and the report says so. OPD: its recipe reads TOTAL_TRAIN_STEPS, so its evidence run stops itself after the
lane's steps.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.rig import DAG_ID
from rl_verify.core.names import run_key
from simulator import node as sim
from simulator.common import CHECKOUT_SRC, CODE_EDITS
from simulator.noise import DEFAULT_ENVIRONMENT

pytestmark = pytest.mark.e2e
STEP_SECONDS = 0.1
CONF = {"suites": ["opd"], "node": "rl_gpu_node", "lane": "auto", "repeats": 0}


def edited_line(key: str) -> tuple[str, int]:
    """The file and first line a simulated code-edit commit changes (simulator.common.CODE_EDITS)."""
    _, rel, (before, _), _ = CODE_EDITS[key]
    text = (CHECKOUT_SRC / rel).read_text()
    return rel, text[:text.index(before)].count("\n") + 1


#: The line sim/regress-schedule changes: lr_schedule's, first run at step 10; the one sim/unused-change changes.
LATE_FILE, LATE = edited_line("regress-schedule")
UNUSED_FILE, UNUSED = edited_line("unused-change")


@pytest.fixture(scope="module")
def rig(start_rig):
    with start_rig("e2e-evidence", step_seconds=STEP_SECONDS) as rig:
        yield rig


def _report(out) -> dict:
    return json.loads(Path(out.summary["report"]["json"]).read_text())


def _outcome(out) -> dict:
    (row,) = _report(out)["suites"]
    return row["outcome"]


def _jobs(rig, out) -> list[str]:
    folder = Path(rig.node["root"]) / "runs" / run_key(out.run_id) / "jobs"
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


def _evidence(rig) -> list[dict]:
    folder = Path(rig.record_root) / "bitwise-references"
    return [json.loads(p.read_text()) for p in folder.glob("*.evidence.json")]


def test_executed_code_evidence_decides_the_shortcuts_and_incomplete_evidence_falls_back(rig):
    node_state = rig.state_dir / "node"
    commits = rig.node["commits"]
    # 1. The reference of main, made after its full PASS, with the lines its full run and its lane's steps ran.
    made = rig.run({**CONF, "commit": "main"})
    assert made.summary["verdict"] == "PASS", json.dumps(made.tasks)
    (found,) = _evidence(rig)
    assert found["problems"] == [] and found["sha"] == commits["good"], found["problems"]
    assert LATE in found["full"][LATE_FILE] and LATE not in found["lane"][LATE_FILE]
    assert "xtuner/v1/rl/rollout/lmdeploy.py" in found["full"] and "xtuner/v1/rl/rollout/sglang.py" in found["lane"]
    assert "xtuner/v1/model/moe/deepseek_v3.py" not in found["full"]

    # 2. A regression in code that first runs at step 10: its first steps are main's bits, but the evidence says the
    # lane's steps never ran the changed line: no lane (the card names it), the full verification FAILs.
    late = rig.run({**CONF, "commit": "sim/regress-schedule"})
    assert late.summary["verdict"] == "FAIL" and _outcome(late)["outcome"] == "FAIL", json.dumps(late.tasks)
    card = (Path(late.summary["record"]) / "card.md").read_text()
    assert f"the lane's deterministic steps never ran {LATE_FILE}:{LATE}, which the reference's full run ran" in card
    assert "opd-lane" not in _jobs(rig, late)

    # 3. A numerics-neutral change in code the lane's steps run: the lane applies, the same bits, PASS (bitwise).
    early = rig.run({**CONF, "commit": "sim/neutral-early"})
    assert _outcome(early)["outcome"] == "PASS (bitwise)", json.dumps(early.tasks)
    assert "every touched line the full run ran, the lane's steps ran too" in \
        (Path(early.summary["record"]) / "report.md").read_text()

    # 4. A change to code no process of the full run ran: PASS (unchanged), no training and no approval asked.
    unused = rig.run({**CONF, "commit": "sim/unused-change"}, decision=None)
    outcome = _outcome(unused)
    assert outcome["outcome"] == "PASS (unchanged)" and outcome["unchanged"]["sha"] == commits["good"]
    assert outcome["unchanged"]["evidence"]["lines"] == [f"{UNUSED_FILE}:{UNUSED}"]
    md = Path(unused.summary["report"]["md"]).read_text()
    assert "Changed lines, none of which ran in any process of the reference's full run (1): " \
           f"{UNUSED_FILE}:{UNUSED}" in md
    assert _jobs(rig, unused) == []

    # 5. A new environment whose reference's evidence misses the rollout worker (the job's environment did not reach
    # it): no evidence, the path rules decide (a change to the package trains), and the report says why.
    sim.set_worker_env(node_state, scrubbed=True)
    sim.set_determinism(node_state, environment={**DEFAULT_ENVIRONMENT, "driver": "580.200.01"})
    try:  # a commit that trains (main itself would be unchanged since its PASS) makes this environment's reference
        again = rig.run({**CONF, "commit": "sim/neutral-early"})
        assert again.summary["verdict"] == "PASS" and _outcome(again)["outcome"] == "PASS", json.dumps(again.tasks)
        fallback = rig.run({**CONF, "commit": "sim/unused-change"})
    finally:
        sim.set_worker_env(node_state, scrubbed=False)
        sim.set_determinism(node_state, environment=DEFAULT_ENVIRONMENT)
    assert _outcome(fallback)["outcome"] in ("PASS", "PASS (bitwise)"), json.dumps(fallback.tasks)
    md = (Path(fallback.summary["record"]) / "report.md").read_text()
    assert "executed-code evidence is incomplete" in md and "xtuner/v1/rl/rollout/worker.py" in md
    assert rig.client.hitl_details(DAG_ID, fallback.run_id, task_id="approve")  # it trained, so it asked
