"""`make demo`: the whole DAG end to end on the simulated GPU node through a real Airflow.

Starts the simulated node (real sshd on 127.0.0.1) and a local Airflow (api-server, scheduler,
triggerer, dag-processor on SQLite), triggers the DAG for COMMIT (default: the checkout's tip),
approves the experiment card through the human-in-the-loop REST API as the demo user, waits, prints
the verdict and where the report is, stops everything (unless KEEP=1) and exits 0 on PASS.

``--distributed`` (`make demo-distributed`): PostgreSQL, Redis, CeleryExecutor with two workers, the
record in a SeaweedFS S3 bucket, two simulated nodes; GRPO and OPD train on different nodes at once.
Prints which worker ran each task, where the record lives, and the wall time next to the sum of the
two trainings (``--sequential`` also runs both suites on one node, for the comparison).
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

from scripts import make_vars
from scripts._startup import announcer, fresh_rig, start_rig
from simulator import node as sim

if TYPE_CHECKING:
    from harness.rig import Rig


ROOT = Path(__file__).resolve().parents[1]


STATE = ROOT / ".state" / "demo"
DISTRIBUTED_STATE = ROOT / ".state" / "demo-distributed"
#: Where `make demo` moves the record an earlier demo left in records/ (the newest KEPT_RECORDS kept).
EARLIER_RECORDS = ROOT / ".state" / "demo-records"
KEPT_RECORDS = 3
#: Seconds per simulated training step unless STEP_SECONDS says otherwise.
STEP_SECONDS = 1.0


_say = announcer("demo")


def stop_kept() -> int:
    """Stop a demo left running by KEEP=1."""
    info = STATE / "kept.json"
    if not info.exists():
        _say("no kept demo found")
        return 0
    from harness.airflow_stack import stop_from_state

    stop_from_state(STATE / "airflow")
    sim.stop_node(STATE / "node")
    info.unlink()
    _say("stopped")
    return 0


def parse_args(argv: list[str] | None, environ: Mapping[str, str]) -> argparse.Namespace:
    """The demo's settings from the command line, else the make variables in ``environ``.

    Empty variables (the Makefile passes unset ones as ``""``) mean the default; a bad value raises
    ``make_vars.UsageError`` naming the variable and the fix.
    """
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--commit", help="branch, tag or SHA of the simulated checkout (make: COMMIT; default main)")
    parser.add_argument("--suites", help="comma-separated suites (SUITES; default grpo,opd)")
    parser.add_argument("--keep", action="store_true", default=None,
                        help="leave Airflow and the node running (make: KEEP=1)")
    parser.add_argument("--step-seconds", metavar="SECONDS",
                        help=f"seconds per simulated training step (make: STEP_SECONDS; default {STEP_SECONDS:g})")
    parser.add_argument("--stop", action="store_true", help="stop a demo left running by KEEP=1")
    parser.add_argument("--distributed", action="store_true", default=None,
                        help="the distributed stack (make demo-distributed)")
    parser.add_argument("--sequential", action="store_true", default=None,
                        help="distributed: also run both suites on one node and print both wall times (SEQUENTIAL=1)")
    parser.add_argument("--check-args", action="store_true",
                        help="print the settings as JSON and exit without starting anything")
    args = parser.parse_args(argv)
    if args.stop:
        return args
    given = {name: value for name, value in (("COMMIT", args.commit), ("SUITES", args.suites),
                                             ("STEP_SECONDS", args.step_seconds)) if value is not None}
    given.update({name: "1" for name, value in (("KEEP", args.keep), ("DISTRIBUTED", args.distributed),
                                                ("SEQUENTIAL", args.sequential)) if value})
    env = {**environ, **given}
    args.distributed = make_vars.flag(env, "DISTRIBUTED", "demo-distributed")
    target = "demo-distributed" if args.distributed else "demo"
    args.commit = make_vars.commit(env, target)
    args.suites = ",".join(make_vars.suites(env, target))
    args.keep = make_vars.flag(env, "KEEP", target)
    args.sequential = make_vars.flag(env, "SEQUENTIAL", target) if args.distributed else False
    args.step_seconds = make_vars.number(env, "STEP_SECONDS", STEP_SECONDS, target, "seconds per simulated step")
    if args.distributed and args.keep:
        raise make_vars.UsageError("KEEP=1 is not supported by make demo-distributed (it starts PostgreSQL, Redis "
                                   "and S3 too, and stops them all at the end): leave KEEP unset")
    return args


def main(argv: list[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    try:
        args = parse_args(argv, os.environ if environ is None else environ)
    except make_vars.UsageError as err:
        print(f"[demo] {err}", file=sys.stderr, flush=True)
        return 2
    if args.stop:
        return stop_kept()
    if args.check_args:
        print(json.dumps({k: getattr(args, k) for k in ("commit", "suites", "keep", "step_seconds", "distributed",
                                                         "sequential")}))
        return 0
    if args.distributed:
        return distributed(args)
    return single(args)


def set_aside(records: Path, into: Path, keep: int = KEPT_RECORDS) -> Path | None:
    """Move a non-empty ``records`` folder into ``into/<UTC time>`` (the newest ``keep`` kept, older ones removed);
    the folder it was moved to, or None when there was nothing to move."""
    import shutil
    from datetime import datetime, timezone

    if not records.is_dir() or not any(records.iterdir()):
        return None
    into.mkdir(parents=True, exist_ok=True)
    dest = into / datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S%fZ")
    shutil.move(str(records), dest)
    for old in sorted(p for p in into.iterdir() if p.is_dir())[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return dest


def single(args: argparse.Namespace) -> int:
    """`make demo`: one simulated node and a local Airflow on SQLite."""
    from harness.rig import DAG_ID  # the Airflow client: after the arguments are known good

    records = ROOT / "records"
    earlier = set_aside(records, EARLIER_RECORDS)
    if earlier:
        _say(f"the record of an earlier demo was moved to {earlier.relative_to(ROOT)}: a demo starts from an empty "
             "record (a commit it verified before would now be PASS (unchanged) of itself, no story to show)")
    t0 = time.monotonic()
    rig = start_rig(STATE, records, _say, "starting the simulated GPU node (OpenSSH sshd on 127.0.0.1) and Airflow "
                    "(api-server, scheduler, triggerer, dag-processor; SQLite)...", step_seconds=args.step_seconds)
    node = rig.node
    assert node is not None and rig.stack is not None
    _say(f"node: {node['user']}@{node['host']}:{node['port']} (host key pinned), checkout {node['checkout']}")
    _say(f"Airflow ready at {rig.stack.base_url} in {rig.timings['airflow start']:.1f} s")
    conf = {"commit": args.commit, "suites": [s for s in args.suites.split(",") if s], "node": "rl_gpu_node"}
    _say(f"triggering {DAG_ID} with {json.dumps(conf)}")
    _say("the experiment card will be APPROVED through the human-in-the-loop REST API by the demo user "
         f"'{rig.stack.username}' (in production a human approves it in the UI)")
    try:
        outcome = rig.run(conf, decision="Approve", timeout=900)
    except BaseException:
        if not args.keep:
            rig.stop()
        raise
    durations = rig.task_durations(outcome.run_id)
    summary = outcome.summary or {}
    leftovers = sim.node_processes(STATE / "node")
    _say(f"DAG run {outcome.run_id}: {outcome.state}")
    # The details first; the last lines are what a person acts on: the verdict, the report's URL, the time split.
    states: dict[str, int] = {}
    for state in outcome.tasks.values():
        states[str(state)] = states.get(str(state), 0) + 1
    print("\n  tasks: " + ", ".join(f"{n} {s}" for s, n in sorted(states.items()))
          + " (every task's state: the run's grid in the Airflow UI)")
    print(f"  node processes left by the run: {len(leftovers)}")
    verdict = summary.get("verdict", "UNKNOWN (no report)")
    if summary and verdict != "PASS":
        report = json.loads(Path(summary["report"]["json"]).read_text())
        for suite in [s for s in report.get("suites", []) if s.get("verdict") != "PASS"]:  # the failing ones
            breached = sorted({c["metric"] + (f" (first breach at step {c['first_breach_step']})"
                                              if c.get("first_breach_step") is not None else "")
                               for c in suite.get("checks", []) if c.get("passed") is False and not c.get("missing")})
            missing = sorted({c["metric"] for c in suite.get("checks", []) if c.get("missing")})
            said = f" ({suite['failure_class']})" if suite.get("failure_class") else ""
            print(f"  {suite['suite']}: {suite['verdict']}{said}"
                  + (f"; breached: {', '.join(breached)}" if breached else "")
                  + (f"; not measured: {', '.join(missing)}" if missing else ""))
            for step in suite.get("next_steps", [])[:1]:
                print(f"    next step: {step}")
    if summary:
        print(f"  report:  {summary['report'].get('md', summary['record'])}")
        print(f"  record:  {summary['record']}")
    print(f"\n  VERDICT: {verdict}")
    if summary:
        from rl_verify.orchestration import links

        view = links.absolute(rig.stack.base_url, links.report_view_path(DAG_ID, outcome.run_id))
        print(f"  report in the Airflow UI: {view}" + ("" if args.keep else " (while Airflow runs: KEEP=1)"))
    trainings = sum(v for t, v in durations.items() if t.startswith("run_"))  # repeats (run_opd-r1) included
    checks = sum(v for t, v in durations.items() if t.startswith(("fetch_", "compare_", "confirm_", "report")))
    held = [rig.client.xcom(DAG_ID, outcome.run_id, f"run_{suite}", key="worker_seconds") for suite in conf["suites"]]
    started = rig.timings["airflow start"] + rig.timings["node start"]
    print(f"  time: {time.monotonic() - t0:.0f} s in all = start {started:.0f} s"
          f" + until the card {outcome.timings.get('until approval asked', 0):.0f} s + training {trainings:.0f} s"
          f" + fetch/compare/confirm/report {checks:.0f} s (+ the rest: scheduling, cleanup, verdict); "
          f"worker time held by the trainings {sum(float(h) for h in held if h is not None):.1f} s "
          "(deferred time not counted)")
    unchanged_ok = True
    if verdict == "PASS" and conf["commit"] == "main":
        full_s = time.monotonic() - t0 - started
        try:
            unchanged_ok = _docs_only_commit(rig, conf, full_s) and _neutral_commit(rig, conf, full_s)
        except BaseException:  # as after the first run: a failed demo leaves no Airflow or node running
            if not args.keep:
                rig.stop()
            raise
    if args.keep:
        (STATE / "kept.json").write_text(json.dumps({"base_url": rig.stack.base_url}))
        _say(f"KEEP=1: Airflow stays up at {rig.stack.base_url} (user '{rig.stack.username}', password in "
             f"{rig.stack.password_file}); the node stays up too. Stop both with: make demo-stop")
    else:
        rig.stop()
        _say("stopped Airflow and the simulated node")
    return 0 if verdict == "PASS" and unchanged_ok else 1


def _docs_only_commit(rig: Rig, conf: Mapping[str, object], full_s: float) -> bool:
    """Then a commit that changes documentation only, with the path-aware skip (lane auto): PASS (unchanged),
    no training, no approval asked; its time beside the full verification's. True when it ends so."""
    from harness.rig import DAG_ID
    from rl_verify.orchestration import links

    docs = {**conf, "commit": "sim/docs-only", "lane": "auto"}
    _say(f"then a commit that touches documentation only: triggering {DAG_ID} with {json.dumps(docs)} "
         "(no approval expected)")
    t0 = time.monotonic()
    outcome = rig.run(docs, decision=None, timeout=600)
    took = time.monotonic() - t0
    summary = outcome.summary or {}
    outcomes = [s.get("outcome") for s in summary.get("suites") or []]
    trained = [t for t, state in outcome.tasks.items() if t.startswith("run_") and state != "skipped"]
    view = links.absolute(rig.stack.base_url, links.report_view_path(DAG_ID, outcome.run_id))
    print(f"\n  docs-only commit: {summary.get('verdict', 'UNKNOWN')} ({', '.join(map(str, outcomes))}) in "
          f"{took:.0f} s, {len(trained)} training(s), no approval asked; the full verification above took "
          f"{full_s:.0f} s ({took / max(full_s, 1):.2f} of it)")
    print(f"  its report in the Airflow UI: {view}")
    return summary.get("verdict") == "PASS" and not trained and set(outcomes) == {"PASS (unchanged)"}



def _neutral_commit(rig: Rig, conf: Mapping[str, object], full_s: float) -> bool:
    """Then the bitwise-first lane (lane auto): a code commit is verified in full and its PASS makes each suite's
    bitwise reference (two deterministic runs of k steps); the next, numerics-neutral commit runs k deterministic
    steps per suite, the same bits: PASS (bitwise), no full training; its time beside the full verification's.
    True when it ends so."""
    from harness.rig import DAG_ID
    from rl_verify.orchestration import links

    first = {**conf, "commit": "sim/neutral-refactor", "lane": "auto"}
    _say(f"then the bitwise lane: {json.dumps(first)} (no reference yet: full verification, then the references)")
    made = rig.run(first, timeout=900)
    md = Path(made.summary["report"]["md"]).read_text() if made.summary else ""
    refs = [line.lstrip("> ") for line in md.splitlines() if "bitwise reference trusted" in line]
    print(f"\n  {first['commit']}: {(made.summary or {}).get('verdict', 'UNKNOWN')}" + (f"; {'; '.join(refs)}"
                                                                                      if refs else ""))
    neutral = {**conf, "commit": "sim/neutral-early", "lane": "auto"}
    _say(f"a numerics-neutral change of code the lane's steps run: {json.dumps(neutral)}")
    outcome = rig.run(neutral, timeout=900)
    summary = outcome.summary or {}
    report = json.loads(Path(summary["report"]["json"]).read_text()) if summary else {}
    outcomes = [(s.get("outcome") or {}) for s in report.get("suites") or []]
    after = outcome.timings.get("after approval until end", 0.0)
    view = links.absolute(rig.stack.base_url, links.report_view_path(DAG_ID, outcome.run_id))
    print(f"\n  neutral commit: {summary.get('verdict', 'UNKNOWN')} ("
          + ", ".join(f"{o.get('outcome')} after {(o.get('bitwise') or {}).get('steps_seen')} deterministic steps"
                      for o in outcomes) + f") in {after:.0f} s from the approval to the end; the full verification "
          f"of main took {full_s:.0f} s ({after / max(full_s, 1):.2f} of it)")
    print(f"  its report in the Airflow UI: {view}")
    return summary.get("verdict") == "PASS" and {o.get("outcome") for o in outcomes} == {"PASS (bitwise)"}


def _wall(rig: Rig, run_id: str) -> dict[str, float]:
    """Seconds from the first training's start to the run's end (the approval excluded), each training's
    duration, and the orchestration overhead (wall minus the longest training)."""
    from datetime import datetime

    from harness.rig import DAG_ID

    def at(text: str) -> datetime:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))

    tis = {ti["task_id"]: ti for ti in rig.client.task_instances(DAG_ID, run_id)}
    runs = [tis[t] for t in ("run_grpo", "run_opd") if tis.get(t, {}).get("start_date")]
    end = max(at(ti["end_date"]) for ti in tis.values() if ti.get("end_date"))
    start = min(at(ti["start_date"]) for ti in runs)
    trainings = {ti["task_id"]: (at(ti["end_date"]) - at(ti["start_date"])).total_seconds() for ti in runs}
    wall = (end - start).total_seconds()
    return {"wall": wall, **trainings, "sum": sum(trainings.values()),
            "overhead": wall - max(trainings.values())}


def distributed(args: argparse.Namespace) -> int:
    """The distributed stack on this machine: two workers, S3 record store, two nodes in parallel."""
    from harness.rig import DAG_ID

    rig = fresh_rig(DISTRIBUTED_STATE, None, step_seconds=args.step_seconds, nodes=2, distributed=True)
    _say("starting PostgreSQL, Redis, SeaweedFS S3, two simulated GPU nodes and Airflow with CeleryExecutor "
         "(api-server, scheduler, triggerer, dag-processor, two Celery workers)...")
    try:
        rig.start()
        assert rig.stack is not None
        _say(f"Airflow ready at {rig.stack.base_url}; services {rig.timings['services start']:.1f} s, "
             f"Airflow {rig.timings['airflow start'] - rig.timings['services start']:.1f} s")
        _say(f"record store: {rig.record_root} (credentials only in the Airflow connection)")
        suites = [s for s in args.suites.split(",") if s]
        placed = ",".join(f"{s}={c}" for s, c in zip(suites, rig.nodes))
        runs = [("parallel, one node per suite", {"commit": args.commit, "suites": suites, "node": placed})]
        if args.sequential:
            runs.append(("sequential, one node", {"commit": args.commit, "suites": suites, "node": "rl_gpu_node"}))
        verdicts, walls = [], []
        for label, conf in runs:
            _say(f"triggering {DAG_ID} ({label}) with {json.dumps(conf)}; the demo user approves the card")
            outcome = rig.run(conf, decision="Approve", timeout=900)
            summary = outcome.summary or {}
            verdicts.append(summary.get("verdict", "UNKNOWN (no report)"))
            tis = rig.client.task_instances(DAG_ID, outcome.run_id)
            print(f"\n  DAG run {outcome.run_id}: {outcome.state}, VERDICT: {verdicts[-1]}")
            print("  task -> worker (hostname Airflow recorded), pool:")
            for ti in sorted(tis, key=lambda t: t.get("start_date") or ""):
                if ti.get("hostname"):
                    print(f"    {ti['task_id']:<20} {ti['hostname']:<10} {ti.get('pool')}")
            workers = sorted({ti["hostname"] for ti in tis if ti.get("hostname")})
            print(f"  workers used: {', '.join(workers)}")
            print(f"  record:  {summary.get('record')}")
            wall = _wall(rig, outcome.run_id)
            walls.append((label, wall))
            print(f"  wall time (first training start -> run end, approval excluded): {wall['wall']:.1f} s; "
                  f"trainings: " + ", ".join(f"{k} {v:.1f} s" for k, v in wall.items() if k.startswith("run_"))
                  + f"; sum of the trainings {wall['sum']:.1f} s; orchestration overhead (wall - longest "
                  f"training) {wall['overhead']:.1f} s")
        if len(walls) > 1:
            (a, pa), (b, pb) = walls
            print(f"\n  {a}: {pa['wall']:.1f} s   vs   {b}: {pb['wall']:.1f} s   (ratio {pa['wall'] / pb['wall']:.2f})")
    finally:
        rig.stop()
        _say("stopped Airflow, the workers, the services and the simulated nodes")
    return 0 if verdicts and all(v == "PASS" for v in verdicts) else 1


if __name__ == "__main__":
    sys.exit(main())
