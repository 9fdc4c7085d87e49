"""The bitwise-first lane, measured (issue 33): time to verdict, GPU-hours over a commit mix, bisections, blind spot.

    python -m scripts.bench_lane [--step-seconds 0.5] [--positions 8] [--no-dag] [--out .state/bench-lane.md]

1. **Time to verdict, through the real DAG** (the ``make demo`` rig, simulated node, realistic noise), per suite:
   ``sim/neutral-refactor`` with lane auto (no reference yet: the full verification, then the reference's two
   deterministic runs), ``sim/neutral-early`` with lane auto (the lane: PASS (bitwise)) and the same commit with
   lane full (one full verification). Measured: approval to verdict, the training task's time, and the steps the
   lane job had written when the trigger stopped it. Projected to the runbook's scale: the measured fixed part plus
   the steps trained x the runbook's step time (GRPO 40 min / 45 steps, OPD 15 min / 25) x the simulator's
   deterministic slowdown (sim.json ``deterministic_slowdown``, 1.3: the anchors' middle), plus one 5 s poll. A
   launch's own start-up (Ray, model load, teachers) is inside the runbook's minutes of a full run; the lane pays
   it again: shown as 0 and as an assumed 3 min.
2. **GPU-hours per verification**: on XTuner's real stream of commits, ``scripts.bench_shortcuts`` (issue 42; it
   uses this module's ``lane_minutes``, ``MEAN_RUNS`` and ``ENV_EVERY``).
3. **Bisections** of 16 and 32 commits, 0/30/70% of them changing numerics, with and without the lane, through
   ``scripts.bench_bisect``'s replay (the real planner, realistic noise, the confirmation rule; OPD). The lane in a
   probe: ``bench_bisect.LaneModel``. The regression shows from step 0 (the lane sees it) and from step 10 (the
   simulated history's culprit: after the lane's steps, so a bisection turns its lane off: see 4).
4. **Blind spot**: every simulated regression kind with its onset at steps 0..20, deterministic rows of the
   simulator (``curves.run_rows``, the same seed healthy and regressed) through ``core.bitwise.read_lane`` with the
   shipped k; and the delay until a full verification catches one the lane passed, under
   ``RL_VERIFY_FULL_EVERY_DAYS`` with one verification a night.
Figures to read, no assertion.
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from collections.abc import Generator
from datetime import datetime
from pathlib import Path
from typing import Any

from rl_verify import settings
from rl_verify.core import bisect, bitwise, confirm
from rl_verify.core.names import run_key
from rl_verify.engines import engine_of, load_suite
from scripts import bench_bisect as bb
from scripts import bench_confirmation as bc

ROOT = Path(__file__).resolve().parents[1]
SLOWDOWN = 1.3  # simulator/xtuner_checkout/xtuner/rlsim/train.py: sim.json deterministic_slowdown's default
PROD_POLL_S = 5.0
ASSUMED_STARTUP_MIN = 3.0
SUITES = ("grpo", "opd")
#: The confirmation's measured mean runs of a healthy verification (issue 33's figures: OPD 1.53, GRPO 1).
MEAN_RUNS = {"grpo": 1.0, "opd": 1.53}
ENV_EVERY = 30


def _when(value: str | None) -> float:
    return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()


def step_minutes(suite: str) -> float:
    spec = load_suite(suite)
    return spec.run_minutes / spec.expected_steps


# --- 1. through the DAG ---------------------------------------------------------------------------------------

def _timed(rig: Any, conf: dict[str, Any], suite: str) -> dict[str, Any]:
    from harness.rig import DAG_ID

    out = rig.run(conf, timeout=900)
    tis = {ti["task_id"]: ti for ti in rig.client.task_instances(DAG_ID, out.run_id)}
    run = tis[f"run_{suite}"]
    report = json.loads(Path(out.summary["report"]["json"]).read_text())
    lane_steps = None
    trackers = sorted((Path(rig.node["root"]) / "runs" / run_key(out.run_id)).glob(
        f"**/{settings.lane_job(suite, 'lane')}/**/tracker.jsonl"))
    if trackers:
        steps = [json.loads(line).get("step") for line in trackers[0].read_text().splitlines() if line.strip()]
        lane_steps = max(s for s in steps if isinstance(s, int))
    return {"verdict": out.summary["verdict"], "outcome": report["suites"][0]["outcome"]["outcome"],
            "to_verdict": _when(tis["verdict"]["end_date"]) - _when(tis["approve"]["end_date"]),
            "training": _when(run["end_date"]) - _when(run["start_date"]), "lane_steps": lane_steps}


def dag_times(step_seconds: float) -> list[str]:
    from scripts._startup import announcer, start_rig

    say = announcer("bench-lane")
    lines = ["| suite | full: approval→verdict s | lane: approval→verdict s | lane outcome | lane job's last step "
             "written (k) | ratio (simulated) | full at scale min | lane at scale min (+3 min start-up) | "
             "ratio at scale (+3 min) | vs the mean full verification |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    with tempfile.TemporaryDirectory(prefix="rl-verify-bench-lane-") as tmp:
        rig = start_rig(Path(tmp) / "state", Path(tmp) / "records", say, "starting the rig",
                        step_seconds=step_seconds)
        try:
            for suite in SUITES:
                conf = {"suites": [suite], "node": "rl_gpu_node", "lane": "auto", "repeats": 0}
                made = _timed(rig, {**conf, "commit": "sim/neutral-refactor"}, suite)
                lane = _timed(rig, {**conf, "commit": "sim/neutral-early"}, suite)
                full = _timed(rig, {**conf, "commit": "sim/neutral-early", "lane": "full"}, suite)
                say(f"{suite}: reference run {made['outcome']}, lane {lane['outcome']}, full {full['outcome']}")
                k = load_suite(suite).bitwise.steps
                minutes = step_minutes(suite)
                fixed_full, fixed_lane = full["to_verdict"] - full["training"], lane["to_verdict"] - lane["training"]
                at_full = fixed_full / 60 + load_suite(suite).run_minutes
                trained = (lane["lane_steps"] or 0) + 1  # the eval at step 0 and steps 1..last, the last one partly
                at_lane = fixed_lane / 60 + trained * minutes * SLOWDOWN + PROD_POLL_S / 60
                mean_full = fixed_full / 60 + load_suite(suite).run_minutes * MEAN_RUNS[suite]
                lines.append(
                    f"| {suite} | {full['to_verdict']:.0f} | {lane['to_verdict']:.0f} | {lane['outcome']} | "
                    f"{lane['lane_steps']} ({k}) | {lane['to_verdict'] / full['to_verdict']:.2f} | {at_full:.1f} | "
                    f"{at_lane:.1f} ({at_lane + ASSUMED_STARTUP_MIN:.1f}) | {at_lane / at_full:.2f} "
                    f"({(at_lane + ASSUMED_STARTUP_MIN) / at_full:.2f}) | {at_lane / mean_full:.2f} "
                    f"({(at_lane + ASSUMED_STARTUP_MIN) / mean_full:.2f}) of {mean_full:.1f} min |")
                print(lines[-1], flush=True)
        finally:
            rig.stop()
    return lines


# --- 2. GPU-hours over a commit mix ----------------------------------------------------------------------------

def lane_minutes(suite: str, steps_read: int | None = None) -> float:
    """One lane job at the runbook's scale: the steps it trains (k, and the step whose row told it was done)."""
    spec = load_suite(suite)
    steps = (steps_read if steps_read is not None else spec.bitwise.steps + 1)
    return steps * step_minutes(suite) * SLOWDOWN + PROD_POLL_S / 60


# --- 3. bisections ----------------------------------------------------------------------------------------------

def bisections(positions: int, seed: int) -> list[str]:
    lines = ["| onset | n | numerics-changing | lane | positions | right culprit | probes mean | full runs mean | "
             "GPU h mean | wall h mean | GPU h ratio (lane / none) | of which probes read BAD |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    runs = bc.Runs("realistic", 2)
    rule = confirm.Rule()
    spec = load_suite(bb.SUITE)
    provenance, _ = engine_of(spec).shipped(spec)
    spreads = {bb.SUITE: engine_of(spec).spread(spec, provenance.model_dump(mode="json"))}
    k = spec.bitwise.steps
    rng = random.Random(seed)
    for onset in (0, 10):
        scenario = bc.scaled("teacher", 1 / 3, onset)
        for n in (16, 32):
            chosen = sorted(rng.sample(range(1, n + 1), min(positions, n)))
            commits = [str(i) for i in range(n + 1)]
            record = {commits[0]: bisect.Reading.GOOD, commits[-1]: bisect.Reading.BAD}
            for share in (0.0, 0.3, 0.7):
                gens: list[Generator] = []
                for c in chosen:
                    base = f"lane-s{seed}-o{onset}-n{n}-c{c}"
                    gens.append(bb.bisection(n, c, 1, base, scenario, record, runs))
                    mask = random.Random(f"{base}-{share}")
                    numerics = frozenset(p for p in range(1, n + 1) if mask.random() < share)
                    # A bisection knows where the regression showed (its bad end's first breach): a lane whose k
                    # steps end before it cannot see it, so the bisection turns its lane off (no wrong GOOD).
                    usable = onset < k
                    lane = bb.LaneModel(numerics, True, lane_minutes(bb.SUITE), lane_minutes(bb.SUITE, 1),
                                        2 * lane_minutes(bb.SUITE)) if usable else None
                    gens.append(bb.bisection(n, c, 1, base, scenario, record, runs, lane=lane))
                results = bb.drive(gens, runs, rule, spreads)
                without, with_lane = results[0::2], results[1::2]
                ratio = sum(r.gpu_min for r in with_lane) / sum(r.gpu_min for r in without)
                # What a shortcut to GOOD cannot touch: the GPU-hours of the probes that read BAD.
                whole = sum(r.gpu_min for r in without)
                bad_share = {id(rs): sum(r.extra["bad_gpu_min"] for r in rs) / whole for rs in (without, with_lane)}
                for name, rs in (("none", without), ("lane" if onset < k else "off (onset after k)", with_lane)):
                    m = len(rs)
                    lines.append(f"| step {onset} | {n} | {share:.0%} | {name} | {m} | "
                                 f"{sum(r.right for r in rs)}/{m} | {sum(r.probes for r in rs) / m:.1f} | "
                                 f"{sum(r.runs for r in rs) / m:.1f} | {sum(r.gpu_min for r in rs) / m / 60:.1f} | "
                                 f"{sum(r.wall_min for r in rs) / m / 60:.1f} | "
                                 f"{1.0 if name == 'none' else ratio:.2f} | {bad_share[id(rs)]:.2f} |")
                    print(lines[-1], flush=True)
    runs.pool.close()
    lines += ["", "Of which probes read BAD: the GPU-hours of that arm's probes that read BAD, over the GPU-hours "
              "without the lane. The lane is only a shortcut to GOOD (a difference runs the full check, never BAD): "
              "these hours are a floor that no lane, however cheap, goes below, and above 0.5 a 2x saving cannot "
              "come from the lane."]
    return lines


# --- 4. blind spot ----------------------------------------------------------------------------------------------

def blind_spot() -> list[str]:
    from simulator.common import load_curves

    curves = load_curves()
    lines = ["| suite | regression | onset step | lane (k steps) | first differing step |", "|---|---|---|---|---|"]
    missed = total = 0
    for suite in SUITES:
        spec = load_suite(suite)
        k, steps = spec.bitwise.steps, spec.expected_steps
        eval_every = spec.eval_points[1] - spec.eval_points[0]
        seed = "deterministic:v1:bench:0"
        healthy = curves.run_rows(suite, seed, None, "realistic", steps=steps, eval_every=eval_every)
        ref = bitwise.LaneFeed(spec.bitwise.exclude)
        ref.feed(b"".join(json.dumps(r).encode() + b"\n" for r in healthy))
        kinds = [kind for kind in curves.REGRESSIONS if _applies(curves, suite, kind)]
        for kind in kinds:
            for onset in (0, 1, 2, 3, 5, 10, 20):
                rows = curves.run_rows(suite, seed, kind, "realistic", steps=steps, eval_every=eval_every,
                                       regression_from=onset)
                cur = bitwise.LaneFeed(spec.bitwise.exclude)
                cur.feed(b"".join(json.dumps(r).encode() + b"\n" for r in rows))
                lane = bitwise.read_lane(ref.rows(), cur.rows(), k)
                full = bitwise.read_lane(ref.rows(), cur.rows(), steps + 1)
                total += 1
                missed += lane.identical
                said = "PASS (bitwise): missed" if lane.identical else "differs"
                lines.append(f"| {suite} | {kind} | {onset} | {said} | "
                             f"{full.difference.step if full.difference else 'none'} |")
    days = settings.FULL_EVERY_DAYS
    nights = [d + 0.5 for d in range(int(days))]  # a regression landing on each night of the cycle, equally likely
    delays = [days - d for d in nights]
    lines += ["", f"{missed} of {total} (kind, onset) cases pass the lane: exactly those whose onset is at or after "
                  "step k (bit-identical before it). Under the full-every policy (one verification a night, a full one "
                  f"at least every {days:g} days) such a regression is caught by the next full verification: delay "
                  f"mean {sum(delays) / len(delays):.1f} days, at most {days:g} days (then a bisection)."]
    return lines


def _applies(curves: Any, suite: str, kind: str) -> bool:
    try:
        rows = curves.run_rows(suite, "probe", kind, "realistic", steps=3, eval_every=1)
        return rows != curves.run_rows(suite, "probe", None, "realistic", steps=3, eval_every=1)
    except (KeyError, ValueError):
        return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--step-seconds", type=float, default=0.5)
    parser.add_argument("--positions", type=int, default=8, help="culprit positions per bisection range")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-dag", action="store_true", help="skip part 1 (the DAG runs)")
    parser.add_argument("--out", type=Path, default=ROOT / ".state" / "bench-lane.md")
    args = parser.parse_args(argv)
    t0 = time.monotonic()
    lines = ["## 1. Time to verdict, numerics-neutral commit: lane against a full run (through the DAG)", "",
             f"Simulated step time {args.step_seconds} s; deterministic slowdown {SLOWDOWN}x (the simulator's; "
             f"the anchors' middle); runbook scale GRPO {load_suite('grpo').run_minutes:g} min / 45 steps, OPD "
             f"{load_suite('opd').run_minutes:g} min / 25 steps; assumed extra start-up of a lane launch "
             f"{ASSUMED_STARTUP_MIN:g} min in brackets.", ""]
    print("\n".join(lines), flush=True)
    if not args.no_dag:
        lines += dag_times(args.step_seconds)
    lines += ["", "## 2. Mean GPU-hours per verification: on XTuner's real commits, "
              "`python -m scripts.bench_shortcuts`"]
    lines += ["", "## 3. Bisections (OPD, P = 1 node, realistic noise, the regression 1 threshold)", ""]
    print("\n".join(lines[-2:]), flush=True)
    lines += bisections(args.positions, args.seed)
    lines += ["", "## 4. Blind spot of the lane", ""] + blind_spot()
    print("\n".join(lines[-30:]), flush=True)
    lines += ["", f"bench wall time {time.monotonic() - t0:.0f} s"]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")
    print(f"\nwritten to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
