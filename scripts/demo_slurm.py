"""`make demo-slurm`: the verification and a bisection with GPU jobs through Slurm (issue 45).

A real single-node Slurm starts on this machine (Debian's munged, slurmctld and slurmd, as root; 16 GPUs as device
files, two simulated 8-GPU compute nodes), the simulated GPU node is its login node, and the node connection says
``launcher: slurm`` with its partition and account. Then:

1. ``rl_accuracy_verification`` of ``main`` (GRPO): one Slurm job, ends PASS.
2. ``rl_regression_bisect`` of a 3-commit range (OPD) whose culprit is the second commit: its probes run as Slurm
   jobs, two at once (the partition runs two 8-GPU jobs at once), and the bisection names the culprit.

Prints every Slurm job id it used (from ``squeue``, sampled while the runs train) and ends with the verdict and the
culprit. Approvals go through the human-in-the-loop REST API as the demo user.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

from scripts._startup import announcer, start_rig
from simulator import node as sim

ROOT = Path(__file__).resolve().parents[1]
STATE = ROOT / ".state" / "demo-slurm"
STEP_SECONDS = 0.1
#: The bisection's history: the culprit at 2 of 3 commits after good, the OPD teacher regression at full size.
LAYOUT = {"commits": 3, "culprit": 2, "launch_fails": 0, "scale": 1.0}
BISECT, PROBE = "rl_regression_bisect", "rl_accuracy_probe"

_say = announcer("demo-slurm")


class JobWatch:
    """Samples ``squeue`` while the demo runs: every rl-verify job id seen, and the most running at once."""

    def __init__(self, slurm) -> None:
        self.slurm, self.seen, self.most = slurm, {}, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "JobWatch":
        self._before = {j["id"] for j in self.slurm.jobs()}  # squeue -t all still lists earlier, ended jobs
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            jobs = [j for j in self.slurm.jobs() if j["name"].startswith("rlv.") and j["id"] not in self._before]
            for job in jobs:
                self.seen.setdefault(job["id"], job["name"])
            self.most = max(self.most, sum(j["state"] == "RUNNING" for j in jobs))
            time.sleep(0.2)


def main() -> int:
    from harness.rig import CONN_ID
    from rl_verify.core.names import run_key, short_sha
    from simulator.checkout import bisect_history

    rig = start_rig(STATE, STATE / "records", _say, "starting a private Slurm (16 GPUs, two 8-GPU compute nodes), "
                    "the simulated login node and Airflow...",
                    extra_env={"RL_VERIFY_BISECT_POLL_S": "2", "RL_VERIFY_JOB_POLL_INTERVAL_S": "1"},
                    step_seconds=STEP_SECONDS, nodes=2, slurm_gpus=16, database="postgres")
    try:
        rig.nodes[CONN_ID] = sim.start_node(rig.node_state(), step_seconds=STEP_SECONDS, bisect=LAYOUT,
                                            login_env=rig.slurm.env)
        for dag_id in (BISECT, PROBE):
            rig.enable_dag(dag_id)
        history = bisect_history(Path(rig.node["root"]))
        _say(f"Slurm is up (slurm.conf {rig.slurm.conf_path}); connection {CONN_ID}: launcher slurm, partition gpu, "
             "account rl-verify")
        with JobWatch(rig.slurm) as verification_jobs:
            _say("1. verifying main (grpo) through Slurm")
            out = rig.run({"commit": "main", "suites": ["grpo"], "node": CONN_ID}, timeout=900)
        verdict = (out.summary or {}).get("verdict")
        _say(f"   {out.run_id}: {verdict}; Slurm job(s): " + ", ".join(
            f"{i} ({n})" for i, n in verification_jobs.seen.items()))
        good, bad = history["commits"][0], history["commits"][-1]
        _say(f"2. bisecting {short_sha(good)}..{short_sha(bad)} (opd) with probes as Slurm jobs")
        with JobWatch(rig.slurm) as probe_jobs:
            run_id = rig.client.trigger(BISECT, conf={"good": good, "bad": bad, "suites": ["opd"], "nodes": CONN_ID})
            detail = rig.client.wait_for_hitl(BISECT, run_id, task_id="approve", timeout=900)
            print("\n" + detail["body"] + "\n")
            rig.client.respond_hitl(BISECT, run_id, "approve", ["Approve"])
            state = rig.client.wait_for_run(BISECT, run_id, timeout=2400)
        result_file = Path(rig.record_root) / BISECT / run_key(run_id) / "bisection.json"
        result = json.loads(result_file.read_text()) if result_file.exists() else {}
        culprit = (result.get("answer") or {}).get("culprit") or {}
        _say(f"   {run_id}: {state}; {len(result.get('probes') or [])} probe(s); Slurm job(s): " + ", ".join(
            f"{i} ({n})" for i, n in probe_jobs.seen.items()))
        _say(f"   at most {probe_jobs.most} probe job(s) ran at once")
        _say(f"culprit: {short_sha(culprit.get('sha')) or '?'} {culprit.get('subject', '')}")
        ok = verdict == "PASS" and state == "success" and culprit.get("sha") == history["culprit"] \
            and probe_jobs.most >= 2
        _say(f"verdict: {verdict} (main, through Slurm); culprit {short_sha(culprit.get('sha')) or '?'}"
             + ("" if ok else f" - UNEXPECTED (expected PASS, culprit {short_sha(history['culprit'])}, 2 probes at "
                              f"once; saw {probe_jobs.most})"))
        return 0 if ok else 1
    finally:
        rig.stop()
        _say("stopped Airflow, the simulated nodes and Slurm")


if __name__ == "__main__":
    sys.exit(main())
