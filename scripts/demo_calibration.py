"""`make demo-calibration`: the baseline calibration story end to end on two simulated GPU nodes.

1. ``rl_baseline_calibration`` of COMMIT (default main), N runs of OPD on ONE node; the proposal is
   REJECTED: the current baseline stays as it is.
2. The same calibration on TWO nodes (runs spread over them, one per node at a time); APPROVED: it
   becomes a new current baseline version with its provenance.
3. ``rl_accuracy_verification`` of main, judged against the new version (PASS, the report names it),
   and of ``sim/regress-teacher`` (FAIL).

Prints the proposal table, the version in use and both calibrations' wall times. Approvals go through
the human-in-the-loop REST API as the demo user (in production a person answers in the UI).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from rl_verify import settings
from rl_verify.store import baselines
from scripts import make_vars
from scripts._startup import announcer, start_rig

if TYPE_CHECKING:
    from harness.rig import Rig

ROOT = Path(__file__).resolve().parents[1]
STATE = ROOT / ".state" / "demo-calibration"
CAL = settings.CALIBRATION_DAG_ID
TARGET = "demo-calibration"
#: Seconds per simulated training step unless STEP_SECONDS says otherwise (N runs: shorter than `make demo`'s).
STEP_SECONDS = 0.2


_say = announcer("demo-calibration")


def calibrate(rig: Rig, conf: dict, decision: str) -> tuple[str, str, dict, float]:
    """Trigger, answer the proposal with ``decision``, wait; the wall time excludes the wait for the answer."""
    client = rig.client
    t0 = time.monotonic()
    run_id = client.trigger(CAL, conf=conf)
    detail = client.wait_for_hitl(CAL, run_id, task_id="approve_promotion", timeout=900)
    asked = time.monotonic()
    client.respond_hitl(CAL, run_id, "approve_promotion", [decision])
    answered = time.monotonic()
    state = client.wait_for_run(CAL, run_id, timeout=600)
    wall = (asked - t0) + (time.monotonic() - answered)
    return run_id, state, detail, wall


def parse_args(argv: list[str] | None, environ: Mapping[str, str]) -> argparse.Namespace:
    """COMMIT, RUNS and STEP_SECONDS from ``environ`` (the Makefile passes unset ones as ``""``: the default);
    a bad value raises ``make_vars.UsageError`` naming the variable and the fix."""
    from rl_verify.engines import engine_of, load_suite
    from rl_verify.orchestration.calibration import MAX_RUNS

    opd = load_suite("opd")
    default_runs = engine_of(opd).calibration_runs(opd)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="Settings: make variables COMMIT (default main), RUNS (N, default "
                                     f"{default_runs}), STEP_SECONDS (default {STEP_SECONDS:g}).")
    parser.add_argument("--check-args", action="store_true",
                        help="print the settings as JSON and exit without starting anything")
    args = parser.parse_args(argv)
    args.commit = make_vars.commit(environ, TARGET)
    args.runs = make_vars.integer(environ, "RUNS", default_runs, TARGET,
                                  "calibration runs (N)", 2, MAX_RUNS)
    args.step_seconds = make_vars.number(environ, "STEP_SECONDS", STEP_SECONDS, TARGET, "seconds per simulated step")
    return args


def main(argv: list[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    try:
        args = parse_args(argv, os.environ if environ is None else environ)
    except make_vars.UsageError as err:
        print(f"[demo-calibration] {err}", file=sys.stderr, flush=True)
        return 2
    if args.check_args:
        print(json.dumps({"commit": args.commit, "runs": args.runs, "step_seconds": args.step_seconds}))
        return 0
    from harness.rig import CONN_ID  # the Airflow client: after the arguments are known good

    commit, runs, step = args.commit, args.runs, args.step_seconds
    node_b = f"{CONN_ID}_2"
    rig = start_rig(STATE, STATE / "records", _say, f"starting two simulated GPU nodes and Airflow ({step} s "
                    "simulated steps)...", step_seconds=step, nodes=2)
    try:
        rig.enable_dag(CAL)
        root = str(rig.record_root)
        conf = {"commit": commit, "suites": ["opd"], "runs": runs, "nodes": CONN_ID}
        _say(f"1. calibrating opd of {commit}: N={runs} runs on one node ({CONN_ID}); the proposal will be REJECTED")
        run1, state1, detail, wall1 = calibrate(rig, conf, "Reject")
        print("\n" + detail["body"] + "\n")
        _say(f"   {run1}: {state1}; current opd baseline still v{baselines.current('opd', root).version}")
        conf = {**conf, "nodes": f"{CONN_ID},{node_b}"}
        _say(f"2. calibrating again on two nodes ({CONN_ID}, {node_b}); the proposal will be APPROVED")
        run2, state2, detail, wall2 = calibrate(rig, conf, "Approve")
        used = baselines.in_use(["opd"], {}, root)["opd"]
        _say(f"   {run2}: {state2}; opd baseline in use: {used['label']}")
        rec = baselines.show("opd", used["version"], root)
        print(f"   provenance: commit {rec.commit}, N={rec.runs}, run {', '.join(rec.dag_run_ids)}, nodes {rec.node}, "
              f"GPUs {rec.hardware}, approved by {rec.approved_by} at {rec.approved_at:%Y-%m-%d %H:%M:%S}Z")
        print(f"   stored at {baselines.location('opd', used['version'], root=root)}")
        print(f"\n   calibration wall time (answer excluded), {runs} runs at {step} s steps: "
              f"one node {wall1:.1f} s, two nodes {wall2:.1f} s (ratio {wall2 / wall1:.2f})\n")
        # The verification reruns calibration run 1's seed: its curves are one of the N by construction.
        # A fresh seed may breach an N=3, x1.5 tolerance (the runbook's rule): see the proposal's warnings.
        sim_json = Path(rig.node["root"]) / "sim.json"
        sim_json.write_text(json.dumps({**json.loads(sim_json.read_text()), "seed": "1"}))
        verdicts = {}
        for ref in ("main", "sim/regress-teacher"):
            _say(f"3. verifying {ref} against the baseline in use (card approved by the demo user)")
            out = rig.run({"commit": ref, "suites": ["opd"], "node": CONN_ID}, decision="Approve", timeout=900)
            summary = out.summary or {}
            report = json.loads(Path(summary["report"]["json"]).read_text()) if summary else {}
            verdicts[ref] = summary.get("verdict")
            print(f"   {ref}: {summary.get('verdict')} {summary.get('failure_classes') or ''}; judged against "
                  f"{(report.get('baselines') or {}).get('opd')}")
        ok = state1 == state2 == "success" and verdicts == {"main": "PASS", "sim/regress-teacher": "FAIL"} \
            and used["version"] == 2
        _say("PASS: rejected changed nothing, approved became v2, main passes and the regression fails against it"
             if ok else f"UNEXPECTED: {state1}, {state2}, {verdicts}, v{used['version']}")
        return 0 if ok else 1
    finally:
        rig.stop()
        _say("stopped Airflow and the simulated nodes")


if __name__ == "__main__":
    sys.exit(main())
