"""Fault injection through the whole DAG: a real Airflow driving the SIMULATED GPU node.

Each scenario injects one fault into a running DAG run and then checks the same invariants:
the verdict (or failure class) is the right one, exactly ONE training ran for the run and suite
(one 14-digit experiment folder in ``runs/<run key>/work/<suite>``), no process of the run is left
on the node and Ray is stopped, and the record's manifest lists complete files (the tracker
whenever the node had one, the card and the reports). The module ends by scanning every task
log for secrets. Per-fault results are printed (``pytest -s``) and written to
``.state/fault-table.md``.

Two rigs (one at a time, to spare a 2-core machine):
  main    stall watchdog 10 s, default SSH reconnect budget (12), cleanup retried every few s
  budget  stall watchdog off, job timeout = budget x 0.007 (grpo 16 s, opd 25 s), reconnect budget 2
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import pytest

from e2e_rigs import drop_task_logs, require_sshd
from harness.rig import DAG_ID, Rig, RunOutcome
from rl_verify.core.names import run_key
from simulator import node as sim


ROOT = Path(__file__).resolve().parents[2]


pytestmark = pytest.mark.e2e

STEP_SECONDS = 0.1          # default simulated step time (grpo 45 steps, opd 25 steps)
STALL_TIMEOUT_S = 10        # > tracker flush (3 steps) + Ray/teacher start-up at every step time used here
SSHD_OUTAGE_S = 60          # "sshd down 60 s mid-run"
CLEAN_WAIT_S = 20           # how long a clean node may take after the run ended
GONE_WITHIN_S = 60          # issue 54: a run marked failed has no job left within a minute
SUMMARY_MARKER = '"response/rewards/mean"'   # only step-summary rows carry it
EXP_RE = re.compile(r"^\d{14}$")
TABLE_PATH = ROOT / ".state" / "fault-table.md"

RIG_ENV = {
    "main": {
        "RL_VERIFY_STALL_TIMEOUT_S": str(STALL_TIMEOUT_S),
        "RL_VERIFY_SSH_RECONNECT_ATTEMPTS": "12",
        "RL_VERIFY_CLEANUP_RETRIES": "8",
        "RL_VERIFY_CLEANUP_RETRY_DELAY_S": "2",
    },
    "budget": {
        "RL_VERIFY_STALL_TIMEOUT_S": "0",
        "RL_VERIFY_JOB_TIMEOUT_FACTOR": "0.007",
        "RL_VERIFY_SSH_RECONNECT_ATTEMPTS": "2",
        "RL_VERIFY_CLEANUP_RETRIES": "8",
        "RL_VERIFY_CLEANUP_RETRY_DELAY_S": "2",
    },
}


# ----------------------------------------------------------------------------------------------------
# Results table
@dataclass
class FaultResult:
    fault: str
    rig: Rig | None = None
    run_id: str | None = None
    suite: str | None = None
    injected: int = 0
    survived: bool | None = None
    duplicates: int | None = None
    leftovers: int | None = None
    records_lost: int | None = None
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    def expect(self, ok: Any, message: str) -> None:
        """A scenario-specific expectation: recorded (not raised) so the row is still measured."""
        if not ok:
            self.failures.append(message)


RESULTS: list[FaultResult] = []


def _fmt(value: Any) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, bool):
        return "yes" if value else "NO"
    return str(value)


def render_table(results: list[FaultResult]) -> str:
    head = ("| fault | injected | survived | duplicate trainings | leftover processes | records lost "
            "| seconds | notes |\n|---|---|---|---|---|---|---|---|\n")
    rows = "".join(
        f"| {r.fault} | {r.injected} | {_fmt(r.survived)} | {_fmt(r.duplicates)} | {_fmt(r.leftovers)} "
        f"| {_fmt(r.records_lost)} | {r.seconds:.0f} | {'; '.join(r.notes).replace('|', '/')} |\n"
        for r in results)
    return head + rows


@pytest.fixture(scope="module", autouse=True)
def fault_table():
    yield RESULTS
    table = render_table(RESULTS)
    TABLE_PATH.parent.mkdir(parents=True, exist_ok=True)
    TABLE_PATH.write_text("# Fault-injection results (tests/e2e/test_faults.py)\n\n" + table)
    print("\n\nFault-injection results\n" + table + f"(also in {TABLE_PATH})")


# ----------------------------------------------------------------------------------------------------
# Rigs: at most one running at a time; task logs scanned for secrets before a rig goes away
def _secrets_of(rig: Rig) -> dict[str, str]:
    """Every secret that must never reach a task log: client key body, demo password, Airflow keys."""
    assert rig.node and rig.stack
    out: dict[str, str] = {}
    key_lines = [ln.strip() for ln in Path(rig.node["client_key"]).read_text().splitlines()
                 if ln.strip() and not ln.startswith("-----")]
    out["client private key (body)"] = "".join(key_lines)
    for i, ln in enumerate(key_lines):
        if len(ln) >= 16:
            out[f"client private key (line {i + 1})"] = ln
    out["demo password"] = rig.stack.password
    stack_secrets = json.loads((rig.stack.state_dir / "secrets.json").read_text())
    for name in ("fernet_key", "jwt_secret", "api_secret_key"):
        out[name] = stack_secrets[name]
    return out


class Rigs:
    """One running rig at a time; knows every task log it has seen and any secret found in them."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.current: tuple[str, Rig] | None = None
        self.scanned_files = 0
        self.leaks: set[str] = set()

    def get(self, name: str) -> Rig:
        if self.current and self.current[0] == name:
            return self.current[1]
        self.release()
        require_sshd()
        state = self.base / name
        rig = Rig(state, state / "records", step_seconds=STEP_SECONDS, database="postgres")
        try:
            rig.start(extra_env=RIG_ENV[name])
        except BaseException:
            rig.stop()
            raise
        self.current = (name, rig)
        return rig

    def scan(self, rig: Rig) -> None:
        secrets = _secrets_of(rig)
        logs = rig.stack.home / "logs"
        for path in sorted(p for p in logs.rglob("*") if p.is_file()):
            self.scanned_files += 1
            text = path.read_bytes().decode("utf-8", errors="replace")
            for what, value in secrets.items():
                if value and value in text:
                    self.leaks.add(f"{what} in {path.relative_to(logs)}")

    def release(self) -> None:
        if not self.current:
            return
        _, rig = self.current
        self.current = None
        try:
            rig.stop()   # stop_node needs no sshd: a node left in an outage by a failed test stops too
        finally:
            if rig.stack and rig.node:
                self.scan(rig)
                if all(r.survived and not r.failures for r in RESULTS):  # keep the logs of a failure
                    drop_task_logs(rig)


@pytest.fixture(scope="module")
def rigs(tmp_path_factory):
    pool = Rigs(tmp_path_factory.mktemp("faults"))
    try:
        yield pool
    finally:
        pool.release()


@pytest.fixture()
def main_rig(rigs):
    rig = rigs.get("main")
    _reset_node(rig)
    yield rig
    _reset_node(rig)


@pytest.fixture()
def budget_rig(rigs):
    rig = rigs.get("budget")
    _reset_node(rig)
    yield rig
    _reset_node(rig)


def _node_state(rig: Rig) -> Path:
    return rig.state_dir / "node"


def _reset_node(rig: Rig) -> None:
    state = _node_state(rig)
    sim.sshd_up(state)
    sim.clear_faults(state)
    set_step_seconds(rig, STEP_SECONDS)


def set_step_seconds(rig: Rig, seconds: float) -> None:
    """Simulated step time of the next launches (start_node re-uses the running sshd, rewrites sim.json)."""
    sim.start_node(_node_state(rig), step_seconds=seconds)


# ----------------------------------------------------------------------------------------------------
# Watching a run and the node
def _run_dir(rig: Rig, run_id: str) -> Path:
    return Path(rig.node["root"]) / "runs" / run_key(run_id)


def experiment_folders(rig: Rig, run_id: str, suite: str) -> list[Path]:
    work = _run_dir(rig, run_id) / "work" / suite
    return sorted(p for p in work.iterdir() if p.is_dir() and EXP_RE.match(p.name)) if work.is_dir() else []


def tracked_steps(rig: Rig, run_id: str, suite: str) -> int:
    """Step-summary rows in the newest tracker of the suite (read on the node's disk: works offline)."""
    folders = experiment_folders(rig, run_id, suite)
    tracker = folders[-1] / "logs" / "exp_tracking" / "tracker.jsonl" if folders else None
    if not tracker or not tracker.exists():
        return 0
    return tracker.read_text(errors="replace").count(SUMMARY_MARKER)


def wait_until(what: str, predicate: Callable[[], Any], timeout: float, poll: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(poll)


def ti(rig: Rig, run_id: str, task_id: str) -> dict[str, Any]:
    return rig.client.task_instance(DAG_ID, run_id, task_id)


def wait_job_running(rig: Rig, run_id: str, suite: str, min_steps: int = 1, timeout: float = 180) -> int:
    """Wait until run_<suite> is deferred on a live job whose tracker has ``min_steps`` rows."""
    task = f"run_{suite}"

    def ready() -> bool:
        state = ti(rig, run_id, task)["state"]
        if state in ("success", "failed", "upstream_failed", "skipped"):
            raise AssertionError(f"{task} ended ({state}) before the fault could be injected: "
                                 + rig.client.task_log(DAG_ID, run_id, task)[-3000:])
        return state == "deferred" and tracked_steps(rig, run_id, suite) >= min_steps

    wait_until(f"{task} deferred with >= {min_steps} tracked steps", ready, timeout)
    return tracked_steps(rig, run_id, suite)


def training_processes(rig: Rig) -> list[tuple[int, str]]:
    return sim.trainers(_node_state(rig))


def wait_node_clean(rig: Rig, timeout: float = CLEAN_WAIT_S) -> list[tuple[int, str]]:
    """Poll until no process of the node is left and Ray is stopped; return what is still there."""
    state = _node_state(rig)
    deadline = time.monotonic() + timeout
    while True:
        left = sim.node_processes(state)
        if not left and not sim.ray_running(state):
            return []
        if time.monotonic() > deadline:
            return left or [(0, "ray still running")]
        time.sleep(0.5)


def all_logs(rig: Rig, run_id: str, task_id: str) -> str:
    """Every try's log of a task, concatenated."""
    tries = int(ti(rig, run_id, task_id).get("try_number") or 1)
    return "\n".join(rig.client.task_log(DAG_ID, run_id, task_id, try_number=n) for n in range(1, tries + 1))


# ----------------------------------------------------------------------------------------------------
# The invariants every scenario ends with
def manifest_problems(summary: dict[str, Any] | None, rig: Rig, run_id: str, suite: str) -> list[str]:
    """What the record lacks: unlisted expected files, listed files missing or not matching."""
    if not summary:
        return ["no report summary (report task did not succeed)"]
    record = Path(summary["record"])
    path = record / "manifest.json"
    if not path.exists():
        return [f"no manifest.json in {record}"]
    listed = {f["path"]: f for f in json.loads(path.read_text())["files"]}
    problems = []
    for rel, entry in listed.items():
        f = record / rel
        if not f.is_file():
            problems.append(f"listed but absent: {rel}")
        elif f.stat().st_size != entry["bytes"] or hashlib.sha256(f.read_bytes()).hexdigest() != entry["sha256"]:
            problems.append(f"size/sha256 mismatch: {rel}")
    expected = {"card.md", "report.json", "report.md", "report.html", "commit.json"}
    folders = experiment_folders(rig, run_id, suite)
    if folders and (folders[-1] / "logs" / "exp_tracking" / "tracker.jsonl").exists():
        expected.add(f"{suite}/tracker.jsonl")   # the node had a tracker: it must be archived
    problems += [f"not archived: {rel}" for rel in sorted(expected - set(listed))]
    for kind, report_path in (summary.get("report") or {}).items():
        if not Path(report_path).is_file():
            problems.append(f"report {kind} missing: {report_path}")
    return problems


def report_json(summary: dict[str, Any]) -> dict[str, Any]:
    return json.loads(Path(summary["report"]["json"]).read_text())


def measure(row: FaultResult, rig: Rig, run_id: str, suite: str, summary: dict[str, Any] | None) -> dict[str, Any]:
    """Fill the row's duplicate trainings, leftover processes and records lost; return the details."""
    leftovers = wait_node_clean(rig)
    folders = experiment_folders(rig, run_id, suite)
    lost = manifest_problems(summary, rig, run_id, suite)
    row.duplicates = max(0, len(folders) - 1)
    row.leftovers = len(leftovers)
    row.records_lost = len(lost)
    with contextlib.suppress(Exception):
        tries = {t: int(ti(rig, run_id, t).get("try_number") or 0)
                 for t in (f"run_{suite}", f"fetch_{suite}", "cleanup")}
        row.notes.append("tries " + " ".join(f"{k.split('_')[0]}={v}" for k, v in tries.items()))
    if lost:
        row.notes.append("; ".join(lost))
    return {"leftovers": leftovers, "folders": folders, "lost": lost}


def class_agreement(rig: Rig, out: RunOutcome, failure_classes: list[str]) -> list[str]:
    """Problems with the failure class: the run's summary, report.json, report.md and the verdict
    task's message must all say the same class."""
    if not out.summary or out.summary.get("verdict") != "FAIL":
        return []
    problems = []
    report = report_json(out.summary)
    if sorted({s["failure_class"] for s in report["suites"] if s["failure_class"]}) != failure_classes:
        problems.append(f"report.json classes {[s['failure_class'] for s in report['suites']]} != {failure_classes}")
    md = Path(out.summary["report"]["md"]).read_text()
    for suite in report["suites"]:
        if suite["failure_class"] and f"{suite['suite']} FAIL ({suite['failure_class']})" not in md:
            problems.append(f"report.md does not say '{suite['suite']} FAIL ({suite['failure_class']})'")
    log = rig.client.task_log(DAG_ID, out.run_id, "verdict")
    said = re.search(r"FAIL \(([a-z +]+)\): ", log)
    for cls in failure_classes:
        if not said or cls not in said.group(1).split(" + "):
            problems.append(f"the verdict task's one-line message does not say 'FAIL ({cls})'")
    return problems


def report_gist(out: RunOutcome) -> str:
    """Headline, class and first suggested next step of the run's report (for the fault table)."""
    if not out.summary:
        return "no report"
    md = Path(out.summary["report"]["md"]).read_text().splitlines()
    headline = next((line.replace("**", "") for line in md if line.startswith("**")), "?")
    report = report_json(out.summary)
    first = next((s for suite in report["suites"] for s in suite["next_steps"]), "-")
    return f"report: {headline} / first next step: {first[:160]}"


def conclude(rig: Rig, row: FaultResult, out: RunOutcome, suite: str, *, state: str, verdict: str,
             failure_classes: list[str]) -> None:
    """Record the scenario's row, then assert verdict, class agreement, one training, clean node,
    complete record and every expectation the scenario recorded."""
    row.failures += class_agreement(rig, out, failure_classes)
    with contextlib.suppress(Exception):
        row.notes.append(report_gist(out))
    got = measure(row, rig, out.run_id, suite, out.summary)
    got_verdict = (out.summary or {}).get("verdict")
    got_classes = (out.summary or {}).get("failure_classes")
    row.survived = out.state == state and got_verdict == verdict and got_classes == failure_classes
    row.notes.insert(0, f"{out.state}: {got_verdict} {'+'.join(got_classes or []) or '-'}")
    row.notes += row.failures
    assert out.state == state, json.dumps(out.tasks)
    assert got_verdict == verdict and got_classes == failure_classes, out.summary
    found = [f.name for f in got["folders"]]
    assert len(found) == 1, f"expected exactly one training of {suite}, found {found}"
    assert got["leftovers"] == [], f"left on the node {CLEAN_WAIT_S}s after the run: {got['leftovers']}"
    assert got["lost"] == [], got["lost"]
    assert row.failures == [], row.failures


@pytest.fixture()
def result(request):
    """The scenario's row of the fault table (filled in by the test and by conclude).

    A scenario that failed before ``conclude`` leaves its DAG run possibly stuck (e.g. a deferred
    task watching a job that died): the run is marked failed here, so the next scenario can start
    (max_active_runs=1), and the row gets what can still be measured.
    """
    row = FaultResult(fault=request.node.name)
    t0 = time.monotonic()
    yield row
    row.seconds = time.monotonic() - t0
    if row.survived is None:
        row.survived = False
        row.notes.append("test failed before the run ended (see its failure)")
        row.notes += row.failures
        if row.rig and row.run_id:
            end_stuck_run(row.rig, row.run_id, row)
    RESULTS.append(row)


def end_stuck_run(rig: Rig, run_id: str, row: FaultResult) -> None:
    """Force-fail a DAG run a failed scenario left running, measure the row, then clean the node."""
    client = rig.client
    with contextlib.suppress(Exception):
        sim.sshd_up(_node_state(rig))
        if client.dag_run(DAG_ID, run_id)["state"] not in ("success", "failed"):
            client.set_run_state(DAG_ID, run_id, "failed")
            row.notes.append("DAG run force-failed by the test")
    if row.suite:
        with contextlib.suppress(Exception):
            forced = "DAG run force-failed by the test" in row.notes
            summary = client.xcom(DAG_ID, run_id, "report")
            measure(row, rig, run_id, row.suite, summary)
            if forced:   # no report was ever going to be written: not a record loss of the runtime
                row.records_lost = None
                row.notes = [n for n in row.notes if not n.startswith("no report summary")]
    sim.kill_node_processes(_node_state(rig))   # a clean node for the next scenario


def run_scenario(rig: Rig, row: FaultResult, suite: str, during: Callable[[str], Any] | None = None,
                 timeout: float = 400) -> RunOutcome:
    """Trigger a one-suite run of the healthy commit, approve it, call ``during(run_id)``, wait."""
    row.rig, row.suite = rig, suite

    def hook(run_id: str) -> None:
        row.run_id = run_id
        if during is not None:
            during(run_id)

    return rig.run({"commit": "main", "suites": [suite], "node": "rl_gpu_node"}, during=hook, timeout=timeout)


# ----------------------------------------------------------------------------------------------------
# Scenarios on the main rig
def test_retry_of_a_running_suite_reattaches_to_the_live_job(main_rig, result):
    result.fault = "retry of a running suite (clear while deferred)"
    suite = "grpo"
    # Held at step 3 until released: the job is certainly alive when the cleared task comes back,
    # however slow the machine (no race between the clear and the training's end).
    sim.set_fault(_node_state(main_rig), suite, "hold", at_step=3)
    seen: dict[str, Any] = {}

    def clear_mid_run(run_id: str) -> None:
        seen["steps"] = wait_job_running(main_rig, run_id, suite, min_steps=2)
        seen["pid"] = (_run_dir(main_rig, run_id) / "jobs" / suite / "pid").read_text().strip()
        main_rig.client.clear_task(DAG_ID, run_id, [f"run_{suite}"])
        result.injected += 1

        def rerun_deferred() -> bool:
            t = ti(main_rig, run_id, f"run_{suite}")
            return int(t["try_number"]) >= 2 and t["state"] == "deferred"

        wait_until("the cleared task to be deferred again", rerun_deferred, 120)
        # The re-run is deferred on the job: had the clear killed the training, the job would have
        # an exit code by the time its kill had run (the kill waits for the processes to go).
        seen["trainers"] = len(training_processes(main_rig))
        seen["exit_code"] = (_run_dir(main_rig, run_id) / "jobs" / suite / "exit_code").exists()
        sim.release(_node_state(main_rig), suite)

    out = run_scenario(main_rig, result, suite, during=clear_mid_run)
    result.notes.append(f"cleared at step {seen.get('steps')}")
    result.expect(seen.get("trainers") == 1 and not seen.get("exit_code"),
                  f"clearing run_{suite} killed the running training ({seen.get('trainers')} trainers, "
                  f"exit code written: {seen.get('exit_code')}); the re-run re-attached to a dying job")
    log = all_logs(main_rig, out.run_id, f"run_{suite}")
    result.expect("Re-attaching" in log, "the re-run did not say it re-attached")
    pid_now = (_run_dir(main_rig, out.run_id) / "jobs" / suite / "pid").read_text().strip()
    result.expect(pid_now == seen["pid"], f"job pid changed {seen['pid']} -> {pid_now}: a second launch")
    conclude(main_rig, result, out, suite, state="success", verdict="PASS", failure_classes=[])


def test_triggerer_restart_while_deferred_keeps_the_single_training(main_rig, result):
    result.fault = "triggerer restart while deferred"
    suite = "opd"
    # Held at step 2 until released: the training is certainly alive around the restart, however
    # long the restart takes on a busy machine (no race between the restart and the training's end).
    sim.set_fault(_node_state(main_rig), suite, "hold", at_step=2)
    seen: dict[str, Any] = {}

    def restart_mid_run(run_id: str) -> None:
        seen["steps"] = wait_job_running(main_rig, run_id, suite, min_steps=2)
        seen["restart_s"] = main_rig.stack.restart_component("triggerer")
        result.injected += 1
        seen["trainers"] = len(training_processes(main_rig))
        sim.release(_node_state(main_rig), suite)

    out = run_scenario(main_rig, result, suite, during=restart_mid_run)
    result.notes.append(f"restarted at step {seen.get('steps')} in {seen.get('restart_s', 0):.0f}s")
    result.expect(seen["trainers"] == 1, "the restart stopped the training")
    result.expect(int(ti(main_rig, out.run_id, f"run_{suite}")["try_number"]) == 1, "the restart cost a retry")
    conclude(main_rig, result, out, suite, state="success", verdict="PASS", failure_classes=[])


def test_sshd_down_60s_mid_run_job_goes_on_and_monitoring_reconnects(main_rig, result):
    result.fault = f"sshd down {SSHD_OUTAGE_S} s mid-run"
    suite = "grpo"
    # Held at step 3 until the node is unreachable, then released: the training certainly runs
    # across the outage start and goes on during it, however slow the machine.
    sim.set_fault(_node_state(main_rig), suite, "hold", at_step=3)
    seen: dict[str, Any] = {}

    def outage(run_id: str) -> None:
        state = _node_state(main_rig)
        wait_job_running(main_rig, run_id, suite, min_steps=2)
        sim.sshd_down(state)
        result.injected += 1
        try:
            t0 = time.monotonic()
            seen["trainers_during"] = len(training_processes(main_rig))
            seen["steps_before"] = tracked_steps(main_rig, run_id, suite)
            sim.release(state, suite)
            wait_until("the training to go on while sshd is down",
                       lambda: tracked_steps(main_rig, run_id, suite) > seen["steps_before"], SSHD_OUTAGE_S)
            time.sleep(max(0.0, SSHD_OUTAGE_S - (time.monotonic() - t0)))  # the outage lasts its 60 s
            seen["steps_after"] = tracked_steps(main_rig, run_id, suite)
            seen["ti_state_during"] = ti(main_rig, run_id, f"run_{suite}")["state"]
        finally:
            sim.sshd_up(state)

    out = run_scenario(main_rig, result, suite, during=outage)
    result.notes.append(f"steps {seen.get('steps_before')}->{seen.get('steps_after')} during the outage")
    result.expect(seen["trainers_during"] == 1, "the outage stopped the training")
    result.expect(seen["steps_after"] > seen["steps_before"], "the training did not go on while sshd was down")
    result.expect(seen["ti_state_during"] == "deferred", f"run_{suite} was {seen['ti_state_during']} at the "
                  "end of the outage: the monitor gave up within the reconnect budget")
    result.expect(int(ti(main_rig, out.run_id, f"run_{suite}")["try_number"]) == 1,
                  "the outage cost a retry instead of a reconnect")
    log = all_logs(main_rig, out.run_id, f"run_{suite}").lower()
    result.expect("reconnect" in log or "retrying in" in log, "no reconnect attempt in the task log")
    conclude(main_rig, result, out, suite, state="success", verdict="PASS", failure_classes=[])


def test_kill_from_the_api_stops_the_job_teachers_and_ray(main_rig, result):
    result.fault = "kill from the API (mark run_opd failed)"
    suite = "opd"
    # Held at step 3 (never released): the training is alive when it is killed, however slow the machine.
    sim.set_fault(_node_state(main_rig), suite, "hold", at_step=3)
    seen: dict[str, Any] = {}

    def kill(run_id: str) -> None:
        seen["steps"] = wait_job_running(main_rig, run_id, suite, min_steps=2)
        state = _node_state(main_rig)
        assert any("rlsim-teacher" in c for _, c in sim.node_processes(state)) and sim.ray_running(state)
        main_rig.client.mark_task_failed(DAG_ID, run_id, f"run_{suite}")
        result.injected += 1
        t0 = time.monotonic()
        # The kill's promise is a clean node once the run's cleanup has ended (a state), not within a guessed
        # time of the kill: on a loaded machine the stop script was seen still waiting 20 s after it.
        main_rig.client.wait_for_task(DAG_ID, run_id, "cleanup")
        seen["left"] = wait_node_clean(main_rig)
        seen["kill_s"] = time.monotonic() - t0

    out = run_scenario(main_rig, result, suite, during=kill)
    result.notes.append(f"killed at step {seen.get('steps')}, node clean after {seen.get('kill_s', 0):.0f}s")
    result.expect(seen["left"] == [], f"still running {CLEAN_WAIT_S}s after the cleanup: {seen['left']}")
    result.expect(out.tasks[f"run_{suite}"] == "failed" and out.tasks["cleanup"] == "success",
                  f"task states {out.tasks}")
    result.expect(tracked_steps(main_rig, out.run_id, suite) < 25, "the job was not killed mid-run")
    conclude(main_rig, result, out, suite, state="failed", verdict="FAIL", failure_classes=["infrastructure"])


def test_a_run_marked_failed_while_no_triggerer_runs_has_its_job_stopped_by_the_cleanup_teardown(main_rig, result):
    """Issue 54: the run is marked failed while its training is deferred and no triggerer runs (so no trigger can
    stop the job, as before a triggerer's first look): the cleanup, a teardown, still runs and stops it within a
    minute, and the run ends failed (final_state), never success. Before the teardown the cleanup (all_done) was
    skipped by the marking and the job trained on to its time limit."""
    result.fault = "run marked failed while no triggerer runs"
    suite = "grpo"
    # Held at step 3 (never released): the training is alive when the run is marked, however slow the machine.
    sim.set_fault(_node_state(main_rig), suite, "hold", at_step=3)
    seen: dict[str, Any] = {}

    def mark_failed_without_triggerer(run_id: str) -> None:
        # The approval resumes through the triggerer: stop it only once the approval has been taken.
        main_rig.client.wait_for_task(DAG_ID, run_id, "approve", timeout=300)
        main_rig.stack.stop_component("triggerer")
        try:
            seen["steps"] = wait_job_running(main_rig, run_id, suite, min_steps=2)
            main_rig.client.set_run_state(DAG_ID, run_id, "failed")
            result.injected += 1
            t0 = time.monotonic()
            main_rig.client.wait_for_task(DAG_ID, run_id, "cleanup", timeout=300)
            seen["left"] = wait_node_clean(main_rig, timeout=max(1.0, GONE_WITHIN_S - (time.monotonic() - t0)))
            seen["stop_s"] = time.monotonic() - t0
        finally:
            main_rig.stack.start_component("triggerer")

    out = run_scenario(main_rig, result, suite, during=mark_failed_without_triggerer)
    result.notes.append(f"marked at step {seen.get('steps')}, node clean {seen.get('stop_s', 0):.0f}s later")
    print(f"run marked failed with no triggerer: node clean {seen.get('stop_s', 0):.1f} s after the marking")
    got = measure(result, main_rig, out.run_id, suite, None)
    result.survived = out.state == "failed" and seen.get("left") == []
    assert out.state == "failed", json.dumps(out.tasks)
    assert (out.tasks[f"run_{suite}"], out.tasks["cleanup"], out.tasks["final_state"], out.tasks["report"]) == \
        ("failed", "success", "failed", "skipped"), json.dumps(out.tasks)
    assert seen["left"] == [] and seen["stop_s"] < GONE_WITHIN_S, seen
    assert tracked_steps(main_rig, out.run_id, suite) < 25, "the job was not stopped mid-run"
    assert len(got["folders"]) == 1 and got["leftovers"] == [], got
    log = all_logs(main_rig, out.run_id, "cleanup")
    assert "ended by hand" in log and "No infrastructure message" in log, log[-3000:]
    assert "has no verdict" in all_logs(main_rig, out.run_id, "final_state")


def test_stalled_tracker_is_killed_and_reported_as_stalled_at_step_n(main_rig, result):
    result.fault = f"stalled tracker (hang, stall timeout {STALL_TIMEOUT_S} s)"
    suite, at_step = "grpo", 6
    sim.set_fault(_node_state(main_rig), suite, "hang", at_step=at_step)
    result.injected += 1
    out = run_scenario(main_rig, result, suite)
    stalled = f"stalled at step {at_step - 1}"
    report = json.dumps(report_json(out.summary)) if out.summary else ""
    result.expect(stalled in report, f"report does not say {stalled!r}")
    result.expect(stalled in all_logs(main_rig, out.run_id, f"run_{suite}").lower(),
                  f"run_{suite} log does not say {stalled!r}")
    result.expect("FAIL (infrastructure): " in main_rig.client.task_log(DAG_ID, out.run_id, "verdict"),
                  "verdict log does not name an infrastructure failure")
    conclude(main_rig, result, out, suite, state="failed", verdict="FAIL", failure_classes=["infrastructure"])


def test_crash_with_exit_zero_is_an_infrastructure_failure(main_rig, result):
    result.fault = "crash with exit 0"
    suite = "opd"
    sim.set_fault(_node_state(main_rig), suite, "crash", at_step=8)
    result.injected += 1
    out = run_scenario(main_rig, result, suite)
    # The launch script exited 0: not trusted. The traceback's log rule ends the suite quoting the
    # exception; the tracker says how far it came.
    exception = "RuntimeError: CUDA error: an illegal memory access was encountered (simulated crash fault at step 8)"
    result.expect(out.tasks[f"run_{suite}"] == "failed", f"task states {out.tasks}")
    run_log = main_rig.client.task_log(DAG_ID, out.run_id, f"run_{suite}")
    result.expect(f"(exit code 0) after the trainer raised an exception (log line: {exception})" in run_log,
                  f"run_{suite} log does not quote the exception after a zero exit code")
    fetch_log = main_rig.client.task_log(DAG_ID, out.run_id, f"fetch_{suite}")
    result.expect("wrong step count" in fetch_log and exception in fetch_log,
                  f"fetch_{suite} log does not give both the step count and the exception")
    result.expect("FAIL (infrastructure): " in main_rig.client.task_log(DAG_ID, out.run_id, "verdict"),
                  "verdict log does not name an infrastructure failure")
    # Issue 55: the crash is on every launch, so the retry policy's one more attempt crashes too, in a job folder
    # of its own (one training each); the FAIL names both attempts.
    report = Path(out.summary["report"]["md"]).read_text() if out.summary else ""
    for said in (f"attempt 1 on rl_gpu_node (job {suite}): infrastructure (transient)",
                 f"attempt 2 on rl_gpu_node (job {suite}-t2): infrastructure (transient)", "spent"):
        result.expect(said in report, f"the report does not say {said!r}")
    result.expect(len(experiment_folders(main_rig, out.run_id, f"{suite}-t2")) == 1,
                  "the second attempt did not train once in its own folder")
    conclude(main_rig, result, out, suite, state="failed", verdict="FAIL", failure_classes=["infrastructure"])


def test_a_crash_at_launch_once_trains_again_in_a_new_job_and_passes_naming_both_attempts(main_rig, result):
    """Issue 55: the first GRPO launch dies before any tracker; the failed attempt's processes are proven gone,
    the same run trains again as job grpo-t2 in the same task, and the verification ends PASS with both attempts
    in its report, the record and the training task's note in the grid."""
    result.fault = "crash at launch, once (retried)"
    suite = "grpo"
    sim.set_fault(_node_state(main_rig), suite, "crash", at_step=0, times=1)
    result.injected += 1
    out = run_scenario(main_rig, result, suite)
    record = Path(out.summary["record"]) if out.summary else None
    attempts = json.loads((record / suite / "attempts.json").read_text()) if record else []
    result.expect([(a["job"], a["kind"], a["retried"]) for a in attempts]
                  == [(suite, "transient", True), (f"{suite}-t2", None, False)], f"attempts {attempts}")
    result.expect("simulated crash fault at launch" in (attempts[0]["why"] if attempts else ""),
                  "the first attempt's why does not quote the crash")
    report = Path(out.summary["report"]["md"]).read_text() if out.summary else ""
    for said in (f"attempt 1 on rl_gpu_node (job {suite}): infrastructure (transient)",
                 f"attempt 2 on rl_gpu_node (job {suite}-t2): ran; its training decides the suite"):
        result.expect(said in report, f"the report does not say {said!r}")
    note = ti(main_rig, out.run_id, f"run_{suite}").get("note") or ""
    result.expect(f"(job {suite}-t2)" in note, f"the training task's note does not name the attempts: {note!r}")
    run_dir = _run_dir(main_rig, out.run_id)
    result.expect((run_dir / "jobs" / suite).is_dir() and (run_dir / "jobs" / f"{suite}-t2").is_dir(),
                  "each attempt has no job folder of its own")
    first, second = (experiment_folders(main_rig, out.run_id, job) for job in (suite, f"{suite}-t2"))
    result.expect(first == [] and len(second) == 1, f"trainings: first attempt {first}, second {second}")
    result.expect(int(ti(main_rig, out.run_id, f"run_{suite}").get("try_number") or 0) == 1,
                  "the retry was an Airflow try, not an attempt inside the task")
    result.notes.append(f"attempts: {len(attempts)}")
    leftovers = wait_node_clean(main_rig)
    result.leftovers, result.duplicates = len(leftovers), 0
    result.records_lost = len(manifest_problems(out.summary, main_rig, out.run_id, suite))
    result.expect(record and (record / suite / "tracker.jsonl").is_file(), "the deciding attempt's tracker is not "
                                                                          "in the record")
    result.survived = out.state == "success" and (out.summary or {}).get("verdict") == "PASS"
    result.notes.insert(0, f"{out.state}: {(out.summary or {}).get('verdict')}")
    result.notes += result.failures
    assert out.state == "success" and out.summary["verdict"] == "PASS", (out.tasks, out.summary)
    assert leftovers == [], leftovers
    assert result.failures == [], result.failures


# ----------------------------------------------------------------------------------------------------
# Scenarios on the budget rig (no stall watchdog, tiny job timeout, reconnect budget 2)
def test_sshd_down_past_the_budget_fails_the_task_and_cleans_up_when_the_node_is_back(budget_rig, result):
    result.fault = "sshd down past the reconnect budget"
    suite = "opd"
    # Held at step 3 (never released): still training when the node comes back, however slow the machine.
    sim.set_fault(_node_state(budget_rig), suite, "hold", at_step=3)
    seen: dict[str, Any] = {}

    def outage(run_id: str) -> None:
        state = _node_state(budget_rig)
        seen["steps_before"] = wait_job_running(budget_rig, run_id, suite, min_steps=2)
        sim.sshd_down(state)
        result.injected += 1
        t0 = time.monotonic()
        try:
            # Down until the training task has failed for good and cleanup has failed once on the node.
            wait_until("run_opd to fail for good",
                       lambda: ti(budget_rig, run_id, f"run_{suite}")["state"] == "failed", 120)
            wait_until("cleanup to fail while the node is down and wait for a retry",
                       lambda: ti(budget_rig, run_id, "cleanup")["state"] in ("up_for_retry", "failed"), 90)
        finally:
            seen["trainers_during"] = len(training_processes(budget_rig))
            seen["outage_s"] = time.monotonic() - t0
            sim.sshd_up(state)

    out = run_scenario(budget_rig, result, suite, during=outage)
    result.notes.append(f"down {seen.get('outage_s', 0):.0f}s from step {seen.get('steps_before')}")
    result.expect(out.tasks[f"run_{suite}"] == "failed" and out.tasks["cleanup"] == "success",
                  f"task states {out.tasks}")
    result.expect(seen["trainers_during"] == 1, "the training did not outlive the outage (nothing left to kill)")
    result.expect(tracked_steps(budget_rig, out.run_id, suite) < 25, "cleanup did not stop the job")
    # the record keeps what was fetched once the node was back
    record = Path(out.summary["record"]) if out.summary else None
    result.expect(record and (record / suite / "tracker.jsonl").exists(), "no tracker in the record")
    conclude(budget_rig, result, out, suite, state="failed", verdict="FAIL", failure_classes=["infrastructure"])


def test_hang_past_the_timeout_fails_the_task_and_cleanup_kills_the_job(budget_rig, result):
    result.fault = "hang past the job timeout (watchdog off)"
    suite, at_step = "grpo", 4
    sim.set_fault(_node_state(budget_rig), suite, "hang", at_step=at_step)
    result.injected += 1
    out = run_scenario(budget_rig, result, suite)
    result.expect(out.tasks[f"run_{suite}"] == "failed" and out.tasks["cleanup"] == "success",
                  f"task states {out.tasks}")
    result.expect(tracked_steps(budget_rig, out.run_id, suite) == at_step - 1, "the tracker moved past the hang")
    conclude(budget_rig, result, out, suite, state="failed", verdict="FAIL", failure_classes=["infrastructure"])


# ----------------------------------------------------------------------------------------------------
def test_no_secret_in_any_task_log(rigs):
    """Last: every task log of both rigs (the running one is scanned now) holds no secret."""
    if rigs.current:
        rigs.scan(rigs.current[1])
    assert rigs.scanned_files > 0, "no task log was scanned"
    assert not rigs.leaks, sorted(rigs.leaks)
