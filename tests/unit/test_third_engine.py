"""A new engine is its own package plus its suite's spec and data file: nothing else of the package is edited.

A toy third engine (every step of each judged metric against a reference in its data file) is added to a
temporary copy of the package: ``engines/toy/`` (two modules) and ``suites/toy.json`` with its data file. A
fresh interpreter that imports the copy then finds it the way the DAG does (the registry, the suites, the
approval card), compares tiny trackers through the :class:`~rl_verify.engines.base.Engine` interface the way
the orchestration does (the archived comparison, the confirmation's points, the live check in the trigger's
``LiveWatch`` with its early abort turned into the suite's result and whole table), through the CLI with its
report, and parses the verification DAG with the toy's tasks. Afterwards the copy differs from the package
only by the toy's files.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import rl_verify

PACKAGE = Path(rl_verify.__file__).parent
REPO = PACKAGE.parents[1]
REWARDS = "response/rewards/mean"

TOY_MODEL = '''\
"""The toy engine's data file (test only): a reference value and a rule per judged metric."""

from __future__ import annotations

from pydantic import Field

from rl_verify.core.thresholds import DataModel, Rule


class ToyData(DataModel):
    """A toy data file: the reference value of each judged metric, and how it is judged."""

    suite: str
    reference: dict[str, float]
    rules: list[Rule] = Field(min_length=1)
'''

TOY_ENGINE = '''\
"""The toy engine (test only): every step of each judged metric against its reference."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rl_verify.core.livecheck import BREACHED, WAITING, WITHIN, Certain, LiveCheck, LiveResult, Status
from rl_verify.core.model import Check, SuiteResult, failure_class_of, missing_findings, verdict_of
from rl_verify.core.nextsteps import EngineRules, suggest
from rl_verify.core.provenance import Provenance
from rl_verify.core.thresholds import load_data
from rl_verify.core.tracker import Tracker, read_tracker
from rl_verify.engines.base import Engine
from rl_verify.engines.toy.model import ToyData
from rl_verify.suites.spec import SuiteSpec, data_file


def compare_toy(spec: SuiteSpec, data: ToyData, current: Path) -> SuiteResult:
    """The verdict: every step of each judged metric against its reference (the row of its first breach,
    else of its last step)."""
    tracker = read_tracker(current, [r.metric for r in data.rules])
    checks = []
    for rule in data.rules:
        ref, series = data.reference[rule.metric], tracker.series(rule.metric)
        row = dict(metric=rule.metric, baseline=ref, threshold=rule.threshold, operator=rule.operator,
                   method=rule.method, source="toy")
        if not series:
            checks.append(Check(step=None, current=None, error=None, passed=False, missing=True,
                                note="missing: no value in the tracker", **row))
            continue
        point = next((p for p in series if not rule.holds(rule.error(ref, p.value))), series[-1])
        error = rule.error(ref, point.value)
        checks.append(Check(step=point.step, current=point.value, error=error, passed=rule.holds(error),
                            first_breach_step=None if rule.holds(error) else point.step,
                            note="every step against the reference", **row))
    verdict = verdict_of(checks)
    result = SuiteResult(suite=spec.name, verdict=verdict, failure_class=failure_class_of(checks, verdict),
                         checks=checks, abnormal=list(tracker.abnormal) + missing_findings(checks))
    result.next_steps = suggest(ToyEngine.rules, checks, verdict, result.failure_class)
    return result


class ToyLive(LiveCheck):
    """Certain FAIL as soon as a judged metric leaves its bound at any step (the toy judges every step live)."""

    def __init__(self, data: dict[str, Any]) -> None:
        self._data, self.data = data, ToyData.model_validate(data)

    def kwargs(self) -> dict[str, Any]:
        return {"data": self._data}

    def check(self, cur: Tracker, elapsed_s: float | None = None) -> LiveResult:
        result = LiveResult(steps=cur.steps)
        for rule in self.data.rules:
            ref = self.data.reference[rule.metric]
            bad = next((p for p in cur.series(rule.metric) if not rule.holds(rule.error(ref, p.value))), None)
            if bad is None:
                result.status.append(Status(rule.metric, WITHIN if cur.series(rule.metric) else WAITING, ""))
                continue
            text = f"{rule.metric} {bad.value:g} at step {bad.step} breaks {rule.operator} {rule.threshold:g}"
            result.certain.append(Certain(rule.metric, bad.step, "every-step", text, ref, bad.value,
                                          rule.error(ref, bad.value), rule.threshold, rule.operator, rule.method))
            result.status.append(Status(rule.metric, BREACHED, text))
        return result


class ToyEngine(Engine):
    """Judged against a reference value per metric (test only)."""

    name = "toy"
    describe = "every step against a reference (test only)"
    baseline_file = "toy.json"
    baseline_is_data = True
    rules = EngineRules()

    def load_data(self, path: Path) -> ToyData:
        return load_data(path, ToyData, "give a toy data file")

    def judged_metrics(self, data: ToyData) -> list[str]:
        return [r.metric for r in data.rules]

    def criteria(self, spec: SuiteSpec, data: ToyData) -> list[str]:
        return [f"| `{r.metric}` | {r.operator} {r.threshold:g} of {data.reference[r.metric]:g} |" for r in data.rules]

    def compare_archived(self, spec: SuiteSpec, suite_dir: Path, out: Path, meta: Mapping[str, Any],
                         node_name: str | None, version: Mapping[str, Path], plot: bool = True) -> SuiteResult:
        return compare_toy(spec, self.load_data(self.data_in_use(spec, version)), suite_dir / "tracker.jsonl")

    def cli_args(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--current", required=True)
        parser.add_argument("--out", required=True)
        parser.add_argument("--commit", default=None)

    def cli_compare(self, args: argparse.Namespace, spec: SuiteSpec, out: Path) -> SuiteResult:
        return compare_toy(spec, self.load_data(data_file(spec.data)), Path(args.current))

    def live(self, spec: SuiteSpec, baseline: bytes | None, data: Any) -> ToyLive:
        return ToyLive((data or self.load_data(data_file(spec.data))).model_dump(mode="json"))

    def shipped(self, spec: SuiteSpec) -> tuple[Provenance, dict[str, bytes]]:
        return Provenance(source="shipped", runs=1, note="toy"), {self.baseline_file: data_file(spec.data).read_bytes()}

    def propose(self, spec: SuiteSpec, trackers: Mapping[str, Path], current_data: Path, commit: str | None) -> Any:
        raise NotImplementedError("the toy engine does not calibrate")


ENGINE = ToyEngine()
'''

TOY_DATA = {"suite": "toy", "reference": {REWARDS: 0.6},
            "rules": [{"metric": REWARDS, "method": "absolute", "operator": "<", "threshold": 0.05}]}
TOY_SPEC = {"name": "toy", "title": "Toy accuracy run (a third engine; test only)", "source": "tests",
            "launch": {"script": "examples/toy.sh"}, "tracker": "*/tracker.jsonl", "expected_steps": 3,
            "wall_time_budget_s": 600, "engine": "toy", "data": "toy_reference.json"}
#: The toy's files, relative to the package: all that adding the engine and its suite writes.
TOY_FILES = {"engines/toy/__init__.py": TOY_ENGINE, "engines/toy/model.py": TOY_MODEL,
             "suites/toy.json": json.dumps(TOY_SPEC, indent=2) + "\n",
             "suites/data/toy_reference.json": json.dumps(TOY_DATA, indent=2) + "\n"}

# Runs in a fresh interpreter on the copy (argv: the copy's package folder, a work folder); prints JSON.
PROBE = textwrap.dedent('''\
    import json, sys
    from pathlib import Path

    import rl_verify
    from rl_verify import engines
    from rl_verify.cli import main
    from rl_verify.core.live import LiveWatch, aborted_result, full_aborted_checks
    from rl_verify.suites import card

    package, work = Path(sys.argv[1]), Path(sys.argv[2])
    assert Path(rl_verify.__file__).resolve().parent == package.resolve(), rl_verify.__file__
    out = {"names": engines.names(), "suites": list(engines.known_suites()),
           "defaults": list(engines.default_suites()), "titles": engines.suite_titles()}
    spec = engines.load_suite("toy")
    engine = engines.engine_of(spec)
    criteria = engines.criteria([spec])
    out["card"] = card.card_sections([spec], [], "rl_gpu_node", criteria)["判读标准 acceptance criteria"]
    out["runs"] = {}
    for name, values in {"pass": [0.58, 0.6, 0.62], "fail": [0.6, 0.7, 0.61]}.items():
        folder = work / name
        folder.mkdir()
        rows = [{"step": i + 1, "response/rewards/mean": v} for i, v in enumerate(values)]
        (folder / "tracker.jsonl").write_text("".join(json.dumps(r) + "\\n" for r in rows))
        result = engine.compare_archived(spec, folder, folder / "out", {}, "rl_gpu_node", {})
        points = engine.run_points(spec, folder, result, {})
        watch = LiveWatch(engines.live_config(spec, "/work", True, None, None, "nowhere"))
        lines, body = [watch.start()], b""
        for row in rows:  # the tracker as the trigger's polls read it, one step at a time
            chunk = (json.dumps(row) + "\\n").encode()
            watch.take(f"t.jsonl {len(body)} {len(body) + len(chunk)}\\n".encode() + chunk)
            body += chunk
            lines += watch.report(None)
        run = {"verdict": result.verdict, "class": result.failure_class, "next": result.next_steps[:1],
               "breached": sorted(points.breached), "watch": lines}
        if watch.doomed is not None:
            abort = {**watch.summary(), "expected_steps": spec.expected_steps}
            aborted = aborted_result(spec.name, json.loads(json.dumps(abort)), engine.rules)
            data = engine.load_data(engine.data_in_use(spec, {}))
            table = full_aborted_checks(aborted.checks, engine.partial_checks(spec, folder, {}),
                                        engine.judged_metrics(data), int(abort["step"]), spec.expected_steps)
            run["aborted"] = {"verdict": aborted.verdict, "abnormal": aborted.abnormal[0],
                              "table": [(c.metric, c.step, c.passed) for c in table]}
        run["cli"] = main(["compare", "toy", "--current", str(folder / "tracker.jsonl"), "--out", str(work / "cli")])
        run["report"] = json.loads((work / "cli" / "report.json").read_text())["verdict"]
        out["runs"][name] = run
    # The verification DAG, parsed from the repository's dags/ against the copy: the toy's tasks are there.
    from importlib import util
    dag_file = util.spec_from_file_location("dag", sys.argv[3])
    module = util.module_from_spec(dag_file)
    dag_file.loader.exec_module(module)
    dag = module.rl_accuracy_verification()
    out["tasks"] = sorted(t for t in dag.task_ids if t.endswith("_toy"))
    out["enum"] = dag.params.get_param("suites").schema["items"]["enum"]
    print(json.dumps(out))
''')


def _snapshot(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and "__pycache__" not in p.parts}


def test_a_third_engine_is_its_own_package_and_its_suite_data_nothing_else(tmp_path):
    # The copy is written from one reading of the package (other work may edit the checkout meanwhile): the
    # tree compared at the end is that reading.
    original = _snapshot(PACKAGE)
    copy = tmp_path / "include" / "rl_verify"
    for rel, data in original.items():
        (copy / rel).parent.mkdir(parents=True, exist_ok=True)
        (copy / rel).write_bytes(data)
    for rel, text in TOY_FILES.items():
        (copy / rel).parent.mkdir(parents=True, exist_ok=True)
        (copy / rel).write_text(text)
    work = tmp_path / "work"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RL_VERIFY_")}
    env.update(PYTHONPATH=str(copy.parent), AIRFLOW_HOME=str(tmp_path / "airflow_home"), MPLBACKEND="Agg",
               AIRFLOW__CORE__LOAD_EXAMPLES="False")
    done = subprocess.run([sys.executable, "-c", PROBE, str(copy), str(work),
                           str(REPO / "dags" / "rl_accuracy_verification.py")],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])

    assert seen["names"] == ["grpo", "opd", "toy"] and "toy" in seen["suites"] and "toy" in seen["defaults"]
    assert seen["titles"]["toy"] == "toy: Toy accuracy run (a third engine; test only)"
    assert f"| `{REWARDS}` | < 0.05 of 0.6 |" in seen["card"]
    passed, failed = seen["runs"]["pass"], seen["runs"]["fail"]
    assert (passed["verdict"], passed["class"], passed["cli"], passed["report"]) == ("PASS", None, 0, "PASS")
    assert "aborted" not in passed and not any(line.startswith("FAIL is certain") for line in passed["watch"])
    assert passed["watch"][0] == "Live check on for toy: every new step is checked with the final rules; aborts " \
                                 "the run as soon as its FAIL is certain"
    assert (failed["verdict"], failed["class"], failed["cli"], failed["report"]) == ("FAIL", "accuracy", 1, "FAIL")
    assert failed["breached"] == [REWARDS] and failed["next"][0].startswith("Inference: first, ")
    assert f"FAIL is certain at step 2 of 3: [every-step] {REWARDS} 0.7 at step 2 breaks < 0.05" in failed["watch"]
    assert failed["aborted"]["verdict"] == "FAIL"
    assert failed["aborted"]["abnormal"].startswith("Aborted at step 2 of 3: the final verdict could no longer be "
                                                    "PASS")
    assert failed["aborted"]["table"] == [[REWARDS, 2, False]]
    assert {"run_toy", "fetch_toy", "compare_toy"} <= set(seen["tasks"]) and "toy" in seen["enum"]

    # The engine took nothing but its own package and its suite's spec and data file.
    after = _snapshot(copy)
    changed = sorted(rel for rel in set(original) | set(after) if original.get(rel) != after.get(rel))
    assert changed == sorted(TOY_FILES), changed
