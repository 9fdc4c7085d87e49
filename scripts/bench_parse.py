"""Parse time of the DAG file next to a minimal DAG using the same SSH operators (one run, side by side).

Uses `airflow dags report` (what the issue measures) in a throwaway AIRFLOW_HOME; prints figures,
asserts nothing (machines are noisy).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MINIMAL = '''
import pendulum
from airflow.sdk import dag
from airflow.providers.ssh.operators.ssh import SSHOperator
from airflow.providers.ssh.operators.ssh_remote_job import SSHRemoteJobOperator
from airflow.providers.standard.operators.hitl import ApprovalOperator

@dag(dag_id="minimal_ssh", schedule=None, start_date=pendulum.datetime(2026, 1, 1))
def minimal_ssh():
    ok = ApprovalOperator(task_id="approve", subject="s")
    job = SSHRemoteJobOperator(task_id="job", ssh_conn_id="c", command="true")
    ok >> job >> SSHOperator(task_id="cmd", ssh_conn_id="c", command="true")

minimal_ssh()
'''


def report(dags: Path, home: Path) -> dict[str, float]:
    env = {**os.environ, "AIRFLOW_HOME": str(home), "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
           "AIRFLOW__CORE__LOAD_EXAMPLES": "False"}
    subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"], env=env, capture_output=True, check=True)
    out = subprocess.run([sys.executable, "-m", "airflow", "dags", "report"], env=env, capture_output=True,
                         text=True, check=True).stdout
    times = {}
    for line in out.splitlines():
        m = re.match(r"\s*(\S+\.py)\s*\|\s*(\d+):(\d+):([\d.]+)", line)
        if m:
            times[m.group(1)] = int(m.group(2)) * 3600 + int(m.group(3)) * 60 + float(m.group(4))
    return times


def main() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="bench-parse-"))
    try:
        # One folder per file: each parse pays its own imports, as in a fresh dag-processor.
        ours_dir, minimal_dir = tmp / "ours", tmp / "minimal"
        ours_dir.mkdir()
        minimal_dir.mkdir()
        shutil.copy(ROOT / "dags" / "rl_accuracy_verification.py", ours_dir)
        (minimal_dir / "minimal_ssh.py").write_text(MINIMAL)
        ours = [report(ours_dir, tmp / f"o{i}")["rl_accuracy_verification.py"] for i in range(3)]
        minimal = [report(minimal_dir, tmp / f"m{i}")["minimal_ssh.py"] for i in range(3)]
        print("airflow dags report parse time (s), 3 rounds")
        print(f"  {'file':<32} {'min':>7} {'max':>7}")
        print(f"  {'rl_accuracy_verification.py':<32} {min(ours):7.3f} {max(ours):7.3f}")
        print(f"  {'minimal DAG with the SSH operators':<32} {min(minimal):7.3f} {max(minimal):7.3f}")
        print(f"  ratio (ours / minimal, best of 3): {min(ours) / min(minimal):.2f}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
