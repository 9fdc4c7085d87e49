"""Issue 53 item 3, every process recorded and proven so: coverage.py records the children multiprocessing forks or
spawns (``concurrency = multiprocessing``), each measured process leaves a role marker, and the evidence is complete
only when every kind of process the suite expects is proven by one process's own data file (a line of the kind's
function body), never by the lines of a module the driver imported itself."""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
from pathlib import Path

import pytest

from rl_verify.core import blocks, evidence
from rl_verify.engines import load_suite
from rl_verify.node import evidence_scripts, remote
from rl_verify.suites.spec import EvidenceSpec

NODE_PYTHON = "/usr/bin/python3"  # the simulated node's interpreter (Debian's, with python3-coverage)

TRAINER = textwrap.dedent('''\
    import multiprocessing
    import os
    import subprocess
    import sys

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import worker  # the driver imports the worker's module itself, as XTuner's does


    def forked(x):
        return x * 2


    def spawned(x):
        return x + 1


    def main():
        worker.Config()
        for method, function in (("fork", forked), ("spawn", spawned)):
            pool = multiprocessing.get_context(method).Pool(1)
            assert pool.apply(function, (3,)) in (6, 4)
            pool.close()
            pool.join()
        env = dict(os.environ)
        if os.environ.get("SCRUB_WORKER"):  # a worker the job's environment does not reach
            env = {k: v for k, v in env.items() if not k.startswith("COVERAGE")}
        subprocess.run([sys.executable, worker.__file__], env=env, check=True)


    if __name__ == "__main__":
        main()
    ''')
WORKER = textwrap.dedent('''\
    class Config:
        def __init__(self):
            self.backend = "sim"


    class Worker:
        def init(self):
            self.ready = True


    if __name__ == "__main__":
        Worker().init()
    ''')
KINDS = [("trainer", "trainer.py:main"), ("reward worker", "trainer.py:forked"),
         ("spawned worker", "trainer.py:spawned"), ("rollout worker", "worker.py:Worker.init")]


def _line_of(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if needle in line)


def test_body_range_names_the_body_of_a_function_a_method_or_a_nested_one():
    source = TRAINER + "\n\nclass A:\n    @staticmethod\n    def m(\n        a,\n    ):\n        '''doc'''\n" \
                       "        return a\n\n\ndef outer():\n    def inner():\n        return 1\n    return inner\n"
    main = _line_of(source, "def main")
    assert blocks.body_range(source, "main") == (main + 1, _line_of(source, "subprocess.run([sys"))
    assert blocks.body_range(source, "forked") == (_line_of(source, "return x * 2"),) * 2
    m = _line_of(source, "def m(")
    assert blocks.body_range(source, "A.m") == (m + 3, m + 4)  # the docstring on: the signature is the class's
    inner = _line_of(source, "def inner")
    assert blocks.body_range(source, "outer.inner") == (inner + 1, inner + 1)
    assert blocks.body_range(source, "outer.<locals>.inner") == (inner + 1, inner + 1)
    assert blocks.body_range(source, "A") is None and blocks.body_range(source, "nope") is None
    assert blocks.body_range("def (:", "main") is None


def test_the_spec_names_a_function_each_kind_of_process_runs():
    grpo, opd = load_suite("grpo").evidence, load_suite("opd").evidence
    assert [p.kind for p in grpo.processes] == ["trainer", "rollout worker"]
    assert [p.kind for p in opd.processes] == ["trainer", "rollout worker", "teacher"]
    assert grpo.processes[1].path == "xtuner/v1/rl/rollout/worker.py" and grpo.processes[1].qualname == \
        "RolloutWorker.init"
    checkout = Path(__file__).resolve().parents[2] / "simulator" / "xtuner_checkout"
    for process in opd.processes:  # each names a function of the simulated checkout
        assert blocks.body_range((checkout / process.path).read_text(), process.qualname), process.runs
    for bad in ("worker.py", "/abs/worker.py:main", "../worker.py:main", "worker.txt:main", "worker.py:a..b"):
        with pytest.raises(ValueError):
            EvidenceSpec(processes=[{"kind": "worker", "runs": bad}])
    with pytest.raises(ValueError):
        EvidenceSpec(processes=[{"kind": "worker", "runs": "a.py:f"}, {"kind": "worker", "runs": "b.py:g"}])
    with pytest.raises(ValueError):
        EvidenceSpec(entries=["worker.py"])
    with pytest.raises(remote.BadInput):
        evidence_scripts.evidence_read_script("/e", "/s", "python3", "x", "/w", "*.jsonl", [("Bad;kind", "a.py:f")])
    with pytest.raises(remote.BadInput):
        evidence_scripts.evidence_read_script("/e", "/s", "python3", "x", "/w", "*.jsonl", [("worker", "../a.py:f")])


def test_a_kind_no_process_proved_is_named_even_when_the_driver_ran_lines_of_its_module():
    kinds = [("trainer", "xtuner/v1/train/cli/rl.py:main"),
             ("rollout worker", "xtuner/v1/rl/rollout/worker.py:RolloutWorker.init")]
    driver_only = {"processes": 1, "files": {"xtuner/v1/train/cli/rl.py": [1, 12],
                                             "xtuner/v1/rl/rollout/worker.py": [1, 18, 21]},
                   "kinds": {"trainer": [101], "rollout worker": []}}
    both = {**driver_only, "processes": 2, "kinds": {"trainer": [101], "rollout worker": [102]}}
    problems = evidence.completeness({"full run": both, "lane's steps": driver_only}, kinds)
    assert problems == ["the lane's steps: no process of kind 'rollout worker' recorded "
                        "(xtuner/v1/rl/rollout/worker.py:RolloutWorker.init): the environment did not reach it"]
    assert evidence.completeness({"full run": both, "lane's steps": both}, kinds) == []
    assert evidence.completeness({"full run": {"processes": 0}, "lane's steps": both}, kinds) == [
        "the full run recorded nothing (no process wrote coverage data)"]


def _node_coverage() -> None:
    if subprocess.run([NODE_PYTHON, "-c", "import coverage"], capture_output=True).returncode != 0:
        pytest.skip(f"{NODE_PYTHON} has no coverage.py (the simulated node's python3-coverage)")


def _record(tmp_path: Path, scrub_worker: bool) -> dict:
    """The two evidence scripts as remote.render makes them, run with bash here, around one run of the trainer."""
    src, bin_dir, folder = tmp_path / "src", tmp_path / "bin", tmp_path / "evidence"
    src.mkdir()
    bin_dir.mkdir()
    (src / "trainer.py").write_text(TRAINER)
    (src / "worker.py").write_text(WORKER)
    (bin_dir / "python3").symlink_to(NODE_PYTHON)
    path = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path)}
    for git in (["init", "-q"], ["add", "-A"], ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x"]):
        subprocess.run(["git", "-C", str(src), *git], check=True, env=path, capture_output=True)
    setup = subprocess.run(["bash", "-c", evidence_scripts.evidence_setup_script(str(folder), str(src))], env=path,
                           check=True, capture_output=True, text=True).stdout
    kv = dict(line.split("=", 1) for line in setup.splitlines() if "=" in line)
    env = {**path, "PYTHONPATH": kv["SITE"], "COVERAGE_PROCESS_START": kv["CONFIG"],
           **({"SCRUB_WORKER": "1"} if scrub_worker else {})}
    ran = subprocess.run(["python3", str(src / "trainer.py")], env=env, cwd=tmp_path, capture_output=True, text=True,
                         timeout=120)
    assert ran.returncode == 0, ran.stderr
    read = evidence_scripts.evidence_read_script(str(folder), str(src), "python3", evidence.COMPILED_BODY.pattern,
                                       str(tmp_path / "work"), "*.jsonl", KINDS)
    out = subprocess.run(["bash", "-c", read], env=path, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def test_a_function_only_a_forked_or_spawned_pool_worker_runs_is_recorded_by_that_process(tmp_path):
    _node_coverage()
    reading = _record(tmp_path, scrub_worker=False)
    assert reading["problems"] == [], reading
    lines = set(reading["files"]["trainer.py"])
    assert _line_of(TRAINER, "return x * 2") in lines and _line_of(TRAINER, "return x + 1") in lines
    kinds = reading["kinds"]
    assert all(kinds[kind] for kind, _ in KINDS), kinds
    trainer = set(kinds["trainer"])
    for kind in ("reward worker", "spawned worker", "rollout worker"):  # each a process of its own
        assert not set(kinds[kind]) & trainer, kinds
    assert all(str(pid) in reading["argv"] for pids in kinds.values() for pid in pids), reading["argv"]
    assert "trainer.py" in reading["argv"][str(kinds["trainer"][0])]
    assert evidence.completeness({"full run": reading}, KINDS) == []


def test_a_rollout_worker_the_environment_did_not_reach_is_named_though_the_driver_imported_its_module(tmp_path):
    _node_coverage()
    reading = _record(tmp_path, scrub_worker=True)
    assert reading["files"].get("worker.py"), reading  # the driver ran the module's lines and Config's
    assert reading["kinds"]["rollout worker"] == [] and reading["kinds"]["trainer"]
    assert evidence.completeness({"full run": reading}, KINDS) == [
        "the full run: no process of kind 'rollout worker' recorded (worker.py:Worker.init): the environment did "
        "not reach it"]


def test_the_ini_records_forked_and_spawned_children_and_patches_subprocesses_only_where_coverage_has_it(tmp_path):
    folder = tmp_path / "e"
    for version, patched in (("(7, 9, 2)", False), ("(7, 10, 0)", True), ("(6, 5, 0)", False)):
        fake = tmp_path / f"py{patched}{version[1:3].strip(',')}"
        (fake / "coverage").mkdir(parents=True)
        (fake / "coverage" / "__init__.py").write_text(f"version_info = {version}\n")
        bin_dir = tmp_path / f"bin{fake.name}"
        bin_dir.mkdir()
        (bin_dir / "python3").write_text(f"#!/bin/sh\nPYTHONPATH={fake} exec {NODE_PYTHON} \"$@\"\n")
        (bin_dir / "python3").chmod(0o755)
        subprocess.run(["bash", "-c", evidence_scripts.evidence_setup_script(str(folder), str(tmp_path))], check=True,
                       env={"PATH": f"{bin_dir}:/usr/bin:/bin"}, capture_output=True)
        ini = (folder / "coverage.ini").read_text()
        assert "concurrency = multiprocessing,thread" in ini and "sigterm = True" in ini and "parallel = True" in ini
        assert ("patch = subprocess" in ini) == patched, (version, ini)
    assert os.path.isfile(folder / "site" / "sitecustomize.py")
