"""The bisection bench's per-probe cost assumption, checked through the DAG (issue 30).

    python -m scripts.bench_bisect_dag [--step-seconds 0.05]

``scripts.bench_bisect`` prices each probe by replaying the engine's live check and early abort: a probe of a
commit that carries the regression costs the share of its run the replay trained. That holds only if a real
probe (an ``rl_accuracy_probe`` run triggered by ``rl_regression_bisect``) runs with its live check on and is
stopped early too: issue 30 found every OPD probe trained to its end and every GRPO probe's abort unseen.

This starts a real Airflow and one simulated node at realistic noise (the demo's seeds) and bisects, per suite,
a one-commit range whose bad end carries a regression:

* OPD: the simulated history's culprit (the bench's regression: the teacher path at 1 threshold from step 10)
  against its parent;
* GRPO: ``sim/regress-mismatch`` against its parent (the bench replays no GRPO bisection: only "early abort on"
  is checked).

It prints, per bad probe, whether its training log says the live check was on and the step its live check
stopped its first run at, beside the replay's mean step for the same regression. Figures to read; exit 1 when
a bad probe trained to its end or ran with its live check off.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from scripts import bench_confirmation as bc
from scripts._startup import fresh_rig
from simulator import node as sim
from simulator.common import BisectLayout

ROOT = Path(__file__).resolve().parents[1]
STATE = ROOT / ".state" / "bench-bisect-dag"
BISECT, PROBE = "rl_regression_bisect", "rl_accuracy_probe"
NOISE_SEED, BASELINE_ERROR_SEED = "2", "46"
STEPS = {"grpo": 45, "opd": 25}


def replayed_abort_steps(runs: bc.Runs, scenario: str, count: int = 40) -> list[int]:
    """The steps the replay (``bench_confirmation``'s runs: live check, early abort) trained in ``count`` first
    runs of an OPD verification of a commit carrying ``scenario``."""
    keys = [("opd", ("dag-check", f"c-{i}"), 0, scenario, "") for i in range(count)]
    runs.get(keys)
    return [int(runs.cache[k]["steps"]) for k in keys]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--step-seconds", type=float, default=0.05)
    args = parser.parse_args(argv)
    from harness.rig import CONN_ID
    from rl_verify.core.names import run_key
    from simulator.checkout import bisect_history

    layout = BisectLayout()
    runs = bc.Runs("realistic", 2)
    replay = replayed_abort_steps(runs, bc.scaled(layout.regression, layout.scale, layout.from_step))
    runs.pool.close()
    rig = fresh_rig(STATE, STATE / "records", step_seconds=args.step_seconds, nodes=1)
    rig.start(extra_env={"RL_VERIFY_BISECT_POLL_S": "1", "RL_VERIFY_JOB_POLL_INTERVAL_S": "1"})
    failures = []
    try:
        root = Path(rig.node["root"])
        sim.set_noise(rig.node_state(CONN_ID), "realistic", baseline_error_seed=BASELINE_ERROR_SEED)
        sim_json = root / "sim.json"
        sim_json.write_text(json.dumps({**json.loads(sim_json.read_text()), "seed": NOISE_SEED}))
        history = bisect_history(root)
        commits = json.loads((root / "state" / "checkout.json").read_text())["commits"]
        for dag_id in (BISECT, PROBE):
            rig.enable_dag(dag_id)
        ranges = {"opd": (history["commits"][layout.culprit - 1], history["culprit"]),
                  "grpo": (commits["good"], commits["regress-mismatch"])}
        print("| suite | range | bisection | bad probe | live check | aborted at (through the DAG) | "
              "replay: first runs' steps, mean (min-max) |\n|---|---|---|---|---|---|---|")
        for suite, (good, bad) in ranges.items():
            run_id = rig.client.trigger(BISECT, conf={"good": good, "bad": bad, "suites": [suite], "nodes": CONN_ID})
            rig.client.wait_for_hitl(BISECT, run_id, task_id="approve", timeout=900)
            rig.client.respond_hitl(BISECT, run_id, "approve", ["Approve"])
            state = rig.client.wait_for_run(BISECT, run_id, timeout=1800)
            result = json.loads((Path(rig.record_root) / BISECT / run_key(run_id) / "bisection.json").read_text())
            bad_rows = [r for r in result["probes"] if r.get("reading") == "bad"]
            if not bad_rows:
                failures.append(f"{suite}: no probe read bad ({result['answer']['reason']})")
            for row in bad_rows:
                task = f"run_{suite}"
                tries = rig.client.task_instance(PROBE, row["run_id"], task)["try_number"]
                on = f"Live check on for {suite}" in rig.client.task_log(PROBE, row["run_id"], task, try_number=tries)
                aborted = (row.get("aborted_at") or {}).get(suite)
                if not on or not aborted:
                    failures.append(f"{suite} probe {row['run_id']}: live check {'on' if on else 'OFF'}, "
                                    f"{'aborted at ' + aborted if aborted else 'trained to its end'}")
                shown = (f"{statistics.mean(replay):.1f} of {STEPS['opd']} ({min(replay)}-{max(replay)})"
                         if suite == "opd" else "not replayed (the bench bisects OPD)")
                print(f"| {suite} | {good[:8]}..{bad[:8]} | {state}, {result['answer']['kind']} | {row['run_id']} | "
                      f"{'on' if on else 'OFF'} | {aborted or 'not aborted'} | {shown} |", flush=True)
    finally:
        rig.stop()
    print("\nper-probe cost assumption (early abort on, for one probe of each suite): "
          + ("HOLDS" if not failures else "BROKEN: " + "; ".join(failures)))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
