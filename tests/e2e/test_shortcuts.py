"""The shortcuts through the whole DAG (real Airflow, the simulated node, real sshd): what the record and the tree say
against a shortcut (issue 42), and executed-code evidence (issue 44).

Issue 42: a commit the record knows FAILs is verified in full (its lane job reads its bits for the record only) and
the reference that shared them goes blind; a rule naming a path the commit does not have turns the lane off (card).

Issue 53: edits whose touched lines have no bytecode (`else` -> `elif`, a module-level line between functions) in
code every step runs, and a regression in code that first runs after the lane's steps, FAIL in full for both suites.

Issue 44: a reference's
full run and its lane's steps record the checkout lines every process ran (coverage.py through the job's
environment), and the shortcuts read them: a regression in code that first runs at step 10 turns the lane off (the
card names the line) and FAILs in full; a neutral change in code the lane's steps run is PASS (bitwise); a change to
code no process ran is PASS (unchanged) with no training; evidence missing a worker process falls back to the path
rules, and the report says so. OPD: its recipe reads TOTAL_TRAIN_STEPS, so its evidence run stops itself after the
lane's steps.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from harness.rig import DAG_ID
from rl_verify.core.names import run_key, short_sha
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


def _assert_node_clean(rig) -> None:
    state = rig.state_dir / "node"
    assert sim.node_processes(state) == []
    assert not sim.ray_running(state)


def outcome_of(out) -> dict:
    return _report(out)["suites"][0]["outcome"]


def _evidence(rig) -> list[dict]:
    folder = Path(rig.record_root) / "bitwise-references" / "evidence"
    return [json.loads(p.read_text()) for p in folder.glob("*.json")]


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
    assert "every touched block the full run ran, the lane's steps ran too" in \
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


def _complete_reference(rig, suite: str) -> bool:
    folder = Path(rig.record_root) / "bitwise-references"
    kept = [json.loads(p.read_text()) for p in folder.glob("*.json")] if folder.is_dir() else []
    return any(r.get("suite") == suite and r.get("evidence") == "complete" for r in kept)


@pytest.mark.parametrize("suite", ["opd", "grpo"])
def test_edits_whose_touched_lines_have_no_bytecode_or_run_after_the_lane_are_verified_in_full(rig, suite):
    """Issue 53, through the DAG, for GRPO as for OPD: a change to code no process ran is PASS (unchanged) and a
    neutral edit of code the lane's steps run PASS (bitwise); `else:` turned into `elif` and a module-level line
    between the blank lines before a def (each in code every step runs), and a regression in code that first runs at
    step 10, end in a full verification that FAILs, never a shortcut PASS; the evidence judged each (no fallback)."""
    conf = {**CONF, "suites": [suite]}
    if not _complete_reference(rig, suite):  # main's full PASS makes its reference with evidence
        made = rig.run({**conf, "commit": "main"})
        assert made.summary["verdict"] == "PASS", json.dumps(made.tasks)
        assert _complete_reference(rig, suite), "the reference of main kept no complete evidence"
    # What no process ran is PASS (unchanged), no training; a neutral edit of code the lane's steps run PASS (bitwise).
    unused = rig.run({**conf, "commit": "sim/unused-change"}, decision=None)
    assert _outcome(unused)["outcome"] == "PASS (unchanged)" and _jobs(rig, unused) == [], json.dumps(unused.tasks)
    early = rig.run({**conf, "commit": "sim/neutral-sync"})  # no other test verifies it: never PASSed before
    assert _outcome(early)["outcome"] == "PASS (bitwise)", json.dumps(early.tasks)
    for commit in ("sim/else-elif", "sim/module-rebind", "sim/regress-schedule"):
        out = rig.run({**conf, "commit": commit})
        assert _outcome(out)["outcome"] == "FAIL", (commit, json.dumps(out.tasks))
        report = (Path(out.summary["record"]) / "report.md").read_text()
        assert f"{suite}: executed-code evidence of" in report and "incomplete" not in report, (commit, report)
    _assert_node_clean(rig)


def test_a_fail_in_the_record_turns_the_shortcuts_off_and_the_reference_it_shared_bits_with_goes_blind(
        rig):
    """Issue 42: a commit the record knows FAILs is never PASS (bitwise), and a later commit with its bits neither."""
    from simulator.common import LATE_FROM_STEP

    commits = rig.node["commits"]
    conf = {"suites": ["grpo"], "node": "rl_gpu_node", "repeats": 0}
    run_dir = Path(rig.node["root"]) / "runs"
    # 0. A trusted reference with main's numerics on this environment: made by this PASS, or already kept. (Not the
    # newest verified PASS of the module, so its diff trains: the neutral follow-up PASSed after it.)
    base = rig.run({**conf, "commit": "sim/neutral-refactor", "lane": "auto"})
    assert base.summary["verdict"] == "PASS", json.dumps(base.tasks)
    # 1. A regression whose code first runs at step 10, verified in full: FAIL.
    full = rig.run({**conf, "commit": "sim/regress-late", "lane": "full"})
    assert full.summary["verdict"] == "FAIL" and outcome_of(full)["outcome"] == "FAIL"
    # 2. The same commit with lane auto: its first 3 steps are the reference's bits (the lane's blind spot), but the
    # record says FAIL: full verification, FAIL, and the card and the report say why the lane was off.
    again = rig.run({**conf, "commit": "sim/regress-late", "lane": "auto"})
    assert again.summary["verdict"] == "FAIL", json.dumps(again.tasks)
    assert outcome_of(again)["outcome"] == "FAIL"
    said = f"the record contradicts a shortcut: grpo ended FAIL, accuracy at this commit in run {full.run_id}"
    card = (Path(again.summary["record"]) / "card.md").read_text()
    assert f"grpo: full verification ({said}" in card and "never a verdict" in card
    report_md = Path(again.summary["report"]["md"]).read_text()
    assert f"grpo: bitwise lane not applicable: {said}" in report_md
    assert "Its lane job read the same bits as the reference" in report_md
    assert "is blind to this regression" in report_md
    lane = json.loads((Path(again.summary["record"]) / "grpo" / "lane.json").read_text())
    assert lane["identical"] and lane["steps_seen"] == 3 < LATE_FROM_STEP
    assert sorted(p.name for p in (run_dir / run_key(again.run_id) / "jobs").iterdir()) == ["grpo", "grpo-lane"]
    # 3. A later commit with the same first-k bits (a neutral change on top): the reference is blind, no lane.
    later = rig.run({**conf, "commit": "sim/regress-late-followup", "lane": "auto"})
    assert later.summary["verdict"] == "FAIL" and outcome_of(later)["outcome"] == "FAIL", json.dumps(later.tasks)
    lanes = json.loads((Path(later.summary["record"]) / "lanes.json").read_text())
    assert lanes["grpo"]["choice"] == "full" and "blind to a regression the record knows" in lanes["grpo"]["why"]
    assert short_sha(commits["regress-late"])[:9] in lanes["grpo"]["why"]
    assert sorted(p.name for p in (run_dir / run_key(later.run_id) / "jobs").iterdir()) == ["grpo"]
    _assert_node_clean(rig)


def test_a_rule_naming_a_path_the_commit_does_not_have_turns_the_lane_off_and_the_card_says_so(rig):
    from simulator.common import RENAMED_FROM

    out = rig.run({"commit": "sim/rename-lmdeploy", "suites": ["grpo"], "node": "rl_gpu_node", "lane": "auto"},
                  decision="Reject")
    assert out.summary["verdict"] == "REJECTED"
    card = (Path(out.summary["record"]) / "card.md").read_text()
    stale = f"bitwise.disabled_by pattern(s) '{RENAMED_FROM}' match no file of the checkout at this commit"
    assert f"grpo: no bitwise lane ({stale}; fix: name the checkout's current paths" in card
    assert f"grpo: full verification (the lane's rule cannot be trusted: {stale}" in card
    assert not re.search(r"\{[a-z_]+\[", card)  # no raw placeholder on what a person approves
    _assert_node_clean(rig)
