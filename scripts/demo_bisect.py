"""`make demo-bisect`: a reproduced FAIL bisected to its culprit on two simulated GPU nodes.

0. The nights before: 20 healthy nightly runs per node in the record store's spread history, as nightly
   verifications leave them (``harness.nights``): the confirmation and the probes decide with the spread
   learned from them (issue 34; a cold 8-df prior asks for more repeats).
1. The last verified PASS: ``rl_accuracy_verification`` of ``sim/bisect-good`` (OPD).
2. The nightly FAIL: the same of ``sim/bisect-bad``, 16 commits later (FAIL (reproduced)).
3. ``rl_regression_bisect`` of that range on both nodes: its one approval (the card lists every commit,
   the probes at most and the GPU-hours), then probes in parallel, the ends taken from the record. The culprit's
   first launch on each node dies at launch once (the simulated node's one-off fault, issue 55): its probe
   trains again in a new job folder and the bisection still names the culprit; the evidence table shows both
   attempts.

Prints the card, the evidence table and the culprit with the link to its page. The simulator runs at
its realistic noise. Approvals go through the human-in-the-loop REST API as the demo user.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from rl_verify.core.names import short_sha
from scripts import make_vars
from scripts._startup import announcer, start_rig
from simulator import node as sim

ROOT = Path(__file__).resolve().parents[1]
STATE = ROOT / ".state" / "demo-bisect"
TARGET = "demo-bisect"
BISECT = "rl_regression_bisect"
PROBE = "rl_accuracy_probe"
#: Seconds per simulated training step unless STEP_SECONDS says otherwise (many short probes).
STEP_SECONDS = 0.1
#: Noise and reference seeds for which the demo's story holds (the bench measures the error rates).
NOISE_SEED, BASELINE_ERROR_SEED = "2", "46"
#: Healthy nights per node in the spread history before the story starts.
HEALTHY_NIGHTS = 20


_say = announcer("demo-bisect")


def parse_args(argv: list[str] | None, environ: Mapping[str, str]) -> argparse.Namespace:
    """STEP_SECONDS and NODES from ``environ`` (empty: the default); a bad value raises ``make_vars.UsageError``."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=f"Settings: make variables STEP_SECONDS (default {STEP_SECONDS:g}), NODES "
                                     "(1 or 2, default 2).")
    parser.add_argument("--check-args", action="store_true",
                        help="print the settings as JSON and exit without starting anything")
    args = parser.parse_args(argv)
    args.step_seconds = make_vars.number(environ, "STEP_SECONDS", STEP_SECONDS, TARGET, "seconds per simulated step")
    args.nodes = make_vars.integer(environ, "NODES", 2, TARGET, "GPU nodes the bisection probes on", 1, 2)
    return args


def main(argv: list[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    try:
        args = parse_args(argv, os.environ if environ is None else environ)
    except make_vars.UsageError as err:
        print(f"[{TARGET}] {err}", file=sys.stderr, flush=True)
        return 2
    if args.check_args:
        print(json.dumps({"step_seconds": args.step_seconds, "nodes": args.nodes}))
        return 0
    from harness.nights import keep_nights  # the engine and the simulator's curves: likewise
    from harness.rig import CONN_ID  # the Airflow client: after the arguments are known good
    from rl_verify import settings
    from rl_verify.core import bisect_report
    from rl_verify.core.names import run_key
    from simulator.checkout import bisect_history

    rig = start_rig(STATE, STATE / "records", _say,
                    f"starting two simulated GPU nodes and Airflow ({args.step_seconds} s simulated steps, "
                    "realistic noise)...",
                    extra_env={"RL_VERIFY_BISECT_POLL_S": "2", "RL_VERIFY_JOB_POLL_INTERVAL_S": "1"},
                    step_seconds=args.step_seconds, nodes=2)
    try:
        for conn in rig.nodes:
            sim.set_noise(rig.node_state(conn), "realistic", baseline_error_seed=BASELINE_ERROR_SEED)
            sim_json = Path(rig.nodes[conn]["root"]) / "sim.json"
            sim_json.write_text(json.dumps({**json.loads(sim_json.read_text()), "seed": NOISE_SEED}))
        _say(f"0. the nights before: {HEALTHY_NIGHTS} healthy nightly runs per node in the spread history")
        settings.RECORD_ROOT = str(rig.record_root)  # this process writes them where the stack reads them
        for conn in rig.nodes:
            keep_nights("opd", {"baselines": {"opd": {"version": 1}}, "suite_nodes": {"opd": conn}}, HEALTHY_NIGHTS,
                        BASELINE_ERROR_SEED, tag=f"night-{conn}")
        history = bisect_history(Path(rig.node["root"]))
        for dag_id in (BISECT, "rl_accuracy_probe"):
            rig.enable_dag(dag_id)
        verdicts = {}
        for step, ref in (("1. the last verified PASS", "sim/bisect-good"), ("2. the nightly FAIL", "sim/bisect-bad")):
            _say(f"{step}: verifying {ref} (opd)")
            out = rig.run({"commit": ref, "suites": ["opd"], "node": CONN_ID}, timeout=900)
            verdicts[ref] = (out.summary or {}).get("verdict")
            _say(f"   {ref}: {verdicts[ref]}")
        nodes = [CONN_ID, f"{CONN_ID}_2"][:args.nodes]
        for conn in rig.nodes:  # a transient infrastructure failure the retry policy absorbs
            sim.set_fault(rig.node_state(conn), "opd", "crash", at_step=0, commit=history["culprit"], times=1)
        _say(f"   the culprit {short_sha(history['culprit'])}'s first OPD launch on each node will die at launch once "
             "(a one-off infrastructure fault): its probe trains again")
        _say(f"3. bisecting sim/bisect-good..sim/bisect-bad on {', '.join(nodes)}")
        t0 = time.monotonic()
        run_id = rig.client.trigger(BISECT, conf={"good": "sim/bisect-good", "bad": "sim/bisect-bad", "suites": ["opd"],
                                                  "nodes": ",".join(nodes)})
        detail = rig.client.wait_for_hitl(BISECT, run_id, task_id="approve", timeout=900)
        asked = time.monotonic()
        print("\n" + detail["body"] + "\n")
        rig.client.respond_hitl(BISECT, run_id, "approve", ["Approve"])
        answered = time.monotonic()
        state = rig.client.wait_for_run(BISECT, run_id, timeout=3600)
        wall = (asked - t0) + (time.monotonic() - answered)
        result_file = Path(rig.record_root) / BISECT / run_key(run_id) / "bisection.md"
        if result_file.exists():
            print("\n" + result_file.read_text())
        result = json.loads((result_file.parent / "bisection.json").read_text()) if result_file.exists() else {}
        culprit = (result.get("answer") or {}).get("culprit") or {}
        link = f"{rig.stack.base_url}{result.get('link', '')}"
        _say(f"bisection {run_id}: {state}; {len(result.get('probes') or [])} probe(s) on {len(nodes)} node(s), "
             f"wall time {wall:.0f} s (answer excluded)")
        _say(f"culprit: {short_sha(culprit.get('sha')) or '?'} {culprit.get('subject', '')} "
             f"({culprit.get('author', '')}, {culprit.get('date', '')}); page: {link}")
        trained = [r for r in result.get("probes") or [] if r.get("reading") in ("good", "bad")]
        live_on = [r for r in trained if _live_check_on(rig, r["run_id"], result.get("suites") or ["opd"])]
        _say(f"live check on in {len(live_on)} of {len(trained)} probe(s)' training logs (probes that read good "
             "or bad); "
             f"{bisect_report.early_aborts(result) if result else 'no result'}")
        retried = [r for r in result.get("probes") or [] if r.get("sha") == history["culprit"] and r.get("attempts")]
        _say(f"probes of the culprit that trained again after the one-off fault: {len(retried)}"
             + "".join(f"\n   {line}" for r in retried for line in r["attempts"]))
        ok = (state == "success" and culprit.get("sha") == history["culprit"] and len(live_on) == len(trained)
              and verdicts == {"sim/bisect-good": "PASS", "sim/bisect-bad": "FAIL"} and bool(retried))
        _say("PASS: the culprit is the commit that introduced the regression" if ok else
             f"UNEXPECTED: {state}, culprit {culprit.get('sha')} vs {history['culprit']}, {verdicts}")
        return 0 if ok else 1
    finally:
        rig.stop()
        _say("stopped Airflow and the simulated nodes")


def _live_check_on(rig, probe_run: str, suites: list[str]) -> bool:
    """Whether every training task of the probe logged "Live check on" (its first run's try that trained)."""
    for suite in suites:
        task = f"run_{suite}"
        tries = rig.client.task_instance(PROBE, probe_run, task)["try_number"]
        if f"Live check on for {suite}" not in rig.client.task_log(PROBE, probe_run, task, try_number=tries):
            return False
    return True


if __name__ == "__main__":
    sys.exit(main())
