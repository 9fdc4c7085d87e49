"""Approval to verdict, measured through the real DAG: each simulated regression with and without early abort.

    python -m scripts.bench_verdict_time [--step-seconds 0.5] [--out .state/bench-verdict-time.md]

Starts the simulated node and a local Airflow (the ``make demo`` rig), then for every simulated
regression of each suite triggers two runs of that suite, ``early_abort`` on and off, approves the
card through the REST API and reads from the API's task instances:

* **approval to verdict**: the ``approve`` task's end to the ``verdict`` task's end (wall clock);
* **training**: the ``run_<suite>`` task's start to its end (launch, the deferred watch, the kill);
* **fixed**: the rest (fetch, compare, report, scheduling); the table shows the full run's;
* the triggerer's warnings that its event loop was blocked (its own 0.2 s watchdog) over the runs.

The simulated node trains ``--step-seconds`` per step; the runbook's runs take ~40 s per step, so
the measured ratio is dominated by the fixed part. The last columns project the same run to the
runbook's scale: the measured fixed part plus the simulated tracker's own ``time/step`` sum up to
the step where the run ended (plus one 5 s poll for an abort). No assertion: figures to read.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from datetime import datetime
from pathlib import Path

from harness.rig import DAG_ID, Rig
from rl_verify.engines import load_suite
from scripts.bench_early_abort import REGRESSIONS, _curves, run_rows

ROOT = Path(__file__).resolve().parents[1]
PROD_POLL_S = 5.0  # settings' default poll interval of a deployment


def _when(value: str | None) -> float:
    return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()


def measure(rig: Rig, suite: str, regression: str, early_abort: bool) -> dict:
    """One run of ``suite`` at ``sim/regress-<regression>``: its timings and where it ended."""
    out = rig.run({"commit": f"sim/regress-{regression}", "suites": [suite], "node": "rl_gpu_node",
                   "early_abort": early_abort}, timeout=900)
    tis = {ti["task_id"]: ti for ti in rig.client.task_instances(DAG_ID, out.run_id)}
    approved, verdict = _when(tis["approve"]["end_date"]), _when(tis["verdict"]["end_date"])
    run = tis[f"run_{suite}"]
    training = _when(run["end_date"]) - _when(run["start_date"])
    report = json.loads(Path(out.summary["report"]["json"]).read_text()) if out.summary else {}
    (entry,) = report.get("suites") or [{}]
    aborted = (entry.get("details") or {}).get("early_abort") or {}
    return {"run_id": out.run_id, "verdict": (out.summary or {}).get("verdict"),
            "class": entry.get("failure_class"), "to_verdict": verdict - approved, "training": training,
            "ended_at": aborted.get("step") if aborted.get("applied") else None}


def at_scale(suite: str, regression: str, step: int | None) -> float:
    """Training seconds at the runbook's step times up to ``step`` (None: the whole run)."""
    steps = load_suite(suite).expected_steps
    rows = run_rows(_curves(), suite, regression, "bench", steps)
    upto = steps if step is None else step
    poll = 0.0 if step is None else PROD_POLL_S
    return sum(r.get("time/step", 0.0) for r in rows if 1 <= r["step"] <= upto) + poll


def triggerer_blocked(rig: Rig) -> list[str]:
    """The triggerer's own warnings that its event loop was blocked (a trigger doing sync work)."""
    log = rig.stack.log_dir / "triggerer.log"
    text = log.read_text(errors="replace") if log.exists() else ""
    return [line.strip()[:160] for line in text.splitlines() if "async thread was blocked" in line]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--step-seconds", type=float, default=0.5)
    parser.add_argument("--out", type=Path, default=ROOT / ".state" / "bench-verdict-time.md")
    args = parser.parse_args(argv)
    lines = [
        f"Simulated step time {args.step_seconds} s; times in seconds unless marked.",
        "",
        "| regression | suite | verdict (early abort on) | ended at step | approval→verdict on | off | ratio | "
        "fixed part | at runbook scale on | off | ratio |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    print("\n".join(lines), flush=True)
    with tempfile.TemporaryDirectory(prefix="rl-verify-bench-") as tmp:
        rig = Rig(Path(tmp) / "state", Path(tmp) / "records", step_seconds=args.step_seconds)
        t0 = time.monotonic()
        rig.start()
        try:
            for suite, regressions in REGRESSIONS.items():
                steps = load_suite(suite).expected_steps
                for regression in regressions:
                    on = measure(rig, suite, regression, True)
                    off = measure(rig, suite, regression, False)
                    fixed = off["to_verdict"] - off["training"]
                    scale_on = on["to_verdict"] - on["training"] + at_scale(suite, regression, on["ended_at"])
                    scale_off = fixed + at_scale(suite, regression, None)
                    ended = f"{on['ended_at']} of {steps}" if on["ended_at"] is not None else f"end ({steps})"
                    line = (f"| {regression} | {suite} | {on['verdict']} ({on['class']}) | {ended} | "
                            f"{on['to_verdict']:.0f} | {off['to_verdict']:.0f} | "
                            f"{on['to_verdict'] / off['to_verdict']:.2f} | {fixed:.0f} | "
                            f"{scale_on / 60:.1f} min | {scale_off / 60:.1f} min | {scale_on / scale_off:.2f} |")
                    lines.append(line)
                    print(line, flush=True)
            blocked = triggerer_blocked(rig)
        finally:
            rig.stop()
        lines += ["", f"triggerer: {len(blocked)} 'async thread was blocked' warnings (threshold 0.2 s) while it "
                      f"watched these {2 * sum(map(len, REGRESSIONS.values()))} trainings with the live check"
                  + (": " + "; ".join(blocked[:5]) if blocked else ""),
                  f"bench wall time {time.monotonic() - t0:.0f} s"]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")
    print(f"\nwritten to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
