"""The scheduled path end to end: a real Airflow on a one-minute cron, the simulated node.

One scenario, in the order a team lives it (each step waits for states, never for a duration):
  R1  the first scheduled run waits at its card; a person approves it with a standing approval;
  R2  the next scheduled run proceeds without waiting, logged with who granted it and where;
      schedule ticks that could not start meanwhile are named in its card and report;
  R3  a hand-edited (forged) standing approval is refused; nobody answers: the card times out and
      the run ends NOT APPROVED (timed out), node untouched;
  R4  the genuine standing approval restored, the following scheduled run proceeds and names the
      tick that could not start while R3 waited;
  R5  a changed card (a new baseline version promoted) waits for a person again.
The timeline (run ids, logical dates, what each run did at ``approve``, times) is printed and written
to .state/nightly-timeline.md.
"""

from __future__ import annotations

import json
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from harness.airflow_api import StackError
from harness.rig import DAG_ID, Rig
from rl_verify.core.names import run_key


ROOT = Path(__file__).resolve().parents[2]


pytestmark = pytest.mark.e2e

SCHEDULE = "* * * * *"
# Long enough that the timed-out run outlives the next tick by a minute, and the dag processor then has time to
# re-parse the file (see skip_the_tick_r3_outlives): the run after it must name that tick.
APPROVAL_TIMEOUT_S = 160
VARIABLE = "rl_verify_standing_approval"
GOLDEN = ROOT / "include" / "rl_verify" / "suites" / "data" / "opd_golden_2026-10-26.json"
TIMELINE = ROOT / ".state" / "nightly-timeline.md"


@pytest.fixture(scope="module")
def rig(start_rig):
    with start_rig("nightly-rig", step_seconds=0.05, database="postgres", schedule=SCHEDULE,
                   extra_env={"RL_VERIFY_APPROVAL_TIMEOUT_S": str(APPROVAL_TIMEOUT_S),
                              "RL_VERIFY_DEFAULT_SUITES": "opd"}) as rig:
        try:
            yield rig
        finally:
            rig.client.pause(DAG_ID)


def promote_new_opd_baseline(rig: Rig, commit: str) -> int:
    """A person promotes a new OPD baseline version (today's golden values, re-measured) in the rig's
    record store, as a calibration would; returns its number."""
    from rl_verify.store import baselines

    data = json.loads(GOLDEN.read_text())
    data["source"]["note"] = "re-measured (nightly e2e test): a new baseline version"
    provenance = baselines.Provenance(source="calibration", commit=commit, runs=3, note="nightly e2e test")
    version = baselines.add_version("opd", provenance, {"golden.json": json.dumps(data)}, root=str(rig.record_root))
    baselines.promote("opd", version, by="nightly-test", root=str(rig.record_root))
    return version


def scheduled_runs(rig: Rig) -> list[dict[str, Any]]:
    return rig.client.dag_runs(DAG_ID, run_type=["scheduled"], order_by=["logical_date"], limit=100)


def next_scheduled_run(rig: Rig, after: str | None, timeout: float = 240) -> dict[str, Any]:
    """The first scheduled run whose logical date is after ``after`` (waits for the scheduler to make it)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        later = [r for r in scheduled_runs(rig) if after is None or _at(r["logical_date"]) > _at(after)]
        if later:
            return later[0]
        time.sleep(1)
    raise AssertionError(f"no scheduled run after {after} within {timeout} s: {scheduled_runs(rig)}")


def _at(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def variable(rig: Rig) -> str | None:
    return rig.client.variable(VARIABLE)


def set_variable(rig: Rig, value: str) -> None:
    rig.client.set_variable(VARIABLE, value)


def approve_log(rig: Rig, run_id: str) -> str:
    return rig.client.task_log(DAG_ID, run_id, "approve")


def summary(rig: Rig, run_id: str) -> dict[str, Any]:
    return rig.client.xcom(DAG_ID, run_id, "report") or {}


def skip_the_tick_r3_outlives(rig: Rig, r3: dict[str, Any]) -> datetime:
    """Make Airflow skip the tick after R3's (the one R3's wait outlives); returns the earliest tick R4 can have.

    Airflow 3.3 sets a scheduled run's successor (its next tick) when the run is made, and moves it on to the
    latest tick (catchup off) only when the dag processor re-parses the DAG file. Whether R4 skipped the tick
    after R3 therefore depended on whether a once-a-minute parse fell between the tick after that one and R3's
    end: CI once saw none, and R4 was the late run of R3's next tick, not a skip. Once that later tick has come
    (the clock, an event), the test asks for the re-parse through the REST API and waits for its effect (the
    DAG's next logical date), while R3 still waits at its card."""
    client = rig.client
    later_tick = _at(r3["logical_date"]) + timedelta(minutes=2)
    while datetime.now(timezone.utc) < later_tick:
        assert client.dag_run(DAG_ID, r3["dag_run_id"])["state"] == "running", "R3 ended before its next tick"
        time.sleep(1)
    client.reparse(DAG_ID)
    while True:
        next_date = client.dag(DAG_ID)["next_dagrun_logical_date"]
        if next_date and _at(next_date) >= later_tick:
            return _at(next_date)
        state = client.dag_run(DAG_ID, r3["dag_run_id"])["state"]
        assert state == "running", (
            f"R3 ended ({state}) before the dag processor re-parsed the DAG (next logical date still {next_date}, "
            f"not {later_tick}): APPROVAL_TIMEOUT_S ({APPROVAL_TIMEOUT_S}) is too short for this machine")
        time.sleep(1)


def test_the_nightly_runs_unattended_only_on_a_verified_standing_approval(rig):
    client = rig.client
    timeline: list[tuple[str, str, str, float]] = []
    t0 = time.monotonic()

    def note(run: dict[str, Any], what: str) -> None:
        timeline.append((run["dag_run_id"], run["logical_date"], what, time.monotonic() - t0))
        print(f"[{time.monotonic() - t0:6.1f} s] {run['dag_run_id']}: {what}", flush=True)

    # R1: the first scheduled run waits; a person approves it with a standing approval.
    r1 = next_scheduled_run(rig, None)
    detail = client.wait_for_hitl(DAG_ID, r1["dag_run_id"], "approve", timeout=180)
    assert "Experiment fingerprint:" in detail["body"]
    client.respond_hitl(DAG_ID, r1["dag_run_id"], "approve", ["Approve"], params_input={"standing_approval": True})
    note(r1, "waited at approve; approved by demo with standing approval")
    assert client.wait_for_run(DAG_ID, r1["dag_run_id"], timeout=300) == "success"
    genuine = variable(rig)
    grant = json.loads(genuine)
    assert grant["dag_run_id"] == r1["dag_run_id"] and grant["granted_by"] == "demo"
    note(r1, f"success; standing approval granted for card {grant['fingerprint']}")

    # R2: proceeds without waiting; says who granted it and where; names ticks that never started.
    r2 = next_scheduled_run(rig, r1["logical_date"])
    assert client.wait_for_run(DAG_ID, r2["dag_run_id"], timeout=300) == "success"
    log = approve_log(rig, r2["dag_run_id"])
    assert f"Standing approval granted by demo at {grant['granted_at']} in run {r1['dag_run_id']}" in log
    assert client.hitl_details(DAG_ID, r2["dag_run_id"], task_id="approve") == []  # nobody was asked
    s2 = summary(rig, r2["dag_run_id"])
    report_md = Path(s2["report"]["md"]).read_text()
    assert s2["verdict"] == "PASS" and f"standing approval granted in scheduled run {r1['dag_run_id']}" in report_md
    note(r2, "proceeded on the standing approval without waiting; PASS")

    # R3: a forged standing approval is refused; the unanswered card times out as NOT APPROVED.
    forged = {**grant, "dag_run_id": r2["dag_run_id"], "granted_by": "mallory"}
    set_variable(rig, json.dumps(forged))
    r3 = next_scheduled_run(rig, r2["logical_date"])
    client.wait_for_hitl(DAG_ID, r3["dag_run_id"], "approve", timeout=180)
    log = approve_log(rig, r3["dag_run_id"])
    assert "Standing approval refused" in log
    assert f"no approval record for {DAG_ID} run {r2['dag_run_id']} task approve" in log
    note(r3, "forged standing approval (mallory) refused; waiting; nobody answers")
    r4_tick = skip_the_tick_r3_outlives(rig, r3)
    note(r3, f"two ticks later, re-parsed: Airflow's next scheduled run is now {r4_tick.isoformat()}")
    # The genuine grant restored while R3 still waits (its card read the Variable when it opened; a timeout does not
    # read it again): R4 is made the moment R3 ends and must find it.
    set_variable(rig, genuine)
    assert client.wait_for_run(DAG_ID, r3["dag_run_id"], timeout=APPROVAL_TIMEOUT_S + 240) == "success"
    tasks = client.task_states(DAG_ID, r3["dag_run_id"])
    assert tasks["approve"] == "success" and tasks["run_opd"] == "skipped" and tasks["verdict"] == "skipped", tasks
    s3 = summary(rig, r3["dag_run_id"])
    assert s3["verdict"] == "NOT APPROVED"
    assert "NOT APPROVED (timed out)" in Path(s3["report"]["md"]).read_text()
    run_dir = Path(rig.node["root"]) / "runs" / run_key(r3["dag_run_id"])
    assert not list(run_dir.glob("jobs/*/pid")), "a timed-out card must launch nothing"
    note(r3, f"NOT APPROVED (timed out after {APPROVAL_TIMEOUT_S} s); nothing launched")

    # R4: on the restored genuine grant, the following scheduled run proceeds.
    r4 = next_scheduled_run(rig, r3["logical_date"])
    assert _at(r4["logical_date"]) >= r4_tick, (r4["logical_date"], r4_tick)
    assert client.wait_for_run(DAG_ID, r4["dag_run_id"], timeout=300) == "success"
    assert "verified against its approval record: proceeding without waiting" in approve_log(rig, r4["dag_run_id"])
    s4 = summary(rig, r4["dag_run_id"])
    assert s4["verdict"] == "PASS"
    gap = round((_at(r4["logical_date"]) - _at(r3["logical_date"])).total_seconds() / 60) - 1
    assert gap >= 1, "R3 waited past the next tick, so the scheduler skipped at least one"
    since = _at(r3["logical_date"]).isoformat(timespec="minutes")
    said = f"{gap} schedule tick(s) since the previous scheduled run ({since})"
    assert said in Path(s4["report"]["md"]).read_text()
    assert said in (Path(s4["record"]) / "card.md").read_text()
    note(r4, f"proceeded on the restored genuine standing approval; PASS; card and report name {gap} tick(s) "
             "that never started")

    # R5: a changed card (a new baseline version promoted) waits for a person again. A run the scheduler made as
    # R4 ended (its tick already due) may have resolved its baselines before the promotion: it rightly proceeds
    # on the standing approval, and the next scheduled run is the one that must wait.
    promoted = promote_new_opd_baseline(rig, json.loads((Path(s4["record"]) / "commit.json").read_text())["sha"])
    promoted_at = datetime.now(timezone.utc)
    r5 = next_scheduled_run(rig, r4["logical_date"])
    while True:
        try:
            client.wait_for_hitl(DAG_ID, r5["dag_run_id"], "approve", timeout=180)
            break
        except StackError as err:
            if "without a pending HITL request" not in str(err):
                raise
        resolved_at = _at(client.task_instance(DAG_ID, r5["dag_run_id"], "resolve_commit")["start_date"])
        assert resolved_at < promoted_at, f"{r5['dag_run_id']} resolved after the promotion and did not wait"
        note(r5, "made as R4 ended, baselines resolved before the promotion: proceeded on the old card")
        r5 = next_scheduled_run(rig, r5["logical_date"])
    assert "(the card changed)" in approve_log(rig, r5["dag_run_id"])
    assert f"Baseline version: v{promoted}: calibration of commit" in client.hitl_detail(
        DAG_ID, r5["dag_run_id"], "approve")["body"]
    client.respond_hitl(DAG_ID, r5["dag_run_id"], "approve", ["Reject"])
    assert client.wait_for_run(DAG_ID, r5["dag_run_id"], timeout=180) == "success"
    note(r5, f"card changed (OPD baseline v{promoted} promoted): refused the standing approval and waited; "
             "rejected by demo")
    assert json.loads(variable(rig)).get("revoked_by") is None  # a reject of another card revokes nothing

    TIMELINE.parent.mkdir(parents=True, exist_ok=True)
    rows = "".join(f"| {t:.0f} | {run} | {ld} | {what} |\n" for run, ld, what, t in timeline)
    TIMELINE.write_text("# Nightly e2e timeline (tests/e2e/test_nightly.py)\n\n"
                        "| t (s) | run | logical date | at approve |\n|---|---|---|---|\n" + rows)
