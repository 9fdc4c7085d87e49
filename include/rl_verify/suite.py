"""Declarative suite specs: one JSON file per suite under ``rl_verify/suites``.

A spec names its comparison engine (``engine``, see ``rl_verify.engines``) and its threshold/golden
data file (``data``, under ``rl_verify/data``). Adding a suite that reuses an engine means adding
its spec and data file; nothing branches on a suite's name. ``load_suite`` refuses a spec whose
engine is unknown or whose data file is missing, naming the file and the field.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Mapping

_VAR = re.compile(r"\$\{([A-Z_][A-Z0-9_]*)\}")


@dataclass(frozen=True)
class Input:
    kind: str
    path: str


@dataclass(frozen=True)
class SuiteSpec:
    """One suite's launch command, inputs, tracker location, baseline, scale and budget."""

    name: str
    title: str
    source: str
    script: str
    args: tuple[str, ...]
    env: Mapping[str, str]
    inputs: tuple[Input, ...]
    tracker: str
    logs: tuple[str, ...]
    baseline: str | None
    expected_steps: int
    eval_points: tuple[int, ...]
    wall_time_budget_s: int
    engine: str
    data: str
    checker_dir: str | None = None
    #: Optional tracker giving baseline values the golden table lacks; absent is not an error.
    reference_baseline: str | None = None
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False)

    def expanded(self, values: Mapping[str, str]) -> "SuiteSpec":
        """Return a copy with every ``${VAR}`` replaced from ``values``.

        Raises KeyError naming the variable and the suite when a value is missing, so that a
        deployment without e.g. ``CI_SHARE_MODEL`` fails before anything reaches the node.
        """
        env = {k: expand(v, values, self.name) for k, v in self.env.items()}
        merged = {**values, **env}
        return SuiteSpec(
            name=self.name, title=self.title, source=self.source, script=self.script,
            args=tuple(expand(a, merged, self.name) for a in self.args), env=env,
            inputs=tuple(Input(i.kind, expand(i.path, merged, self.name)) for i in self.inputs),
            tracker=self.tracker, logs=self.logs,
            baseline=expand(self.baseline, merged, self.name) if self.baseline else None,
            expected_steps=self.expected_steps, eval_points=self.eval_points,
            wall_time_budget_s=self.wall_time_budget_s, engine=self.engine, data=self.data,
            checker_dir=expand(self.checker_dir, merged, self.name) if self.checker_dir else None,
            reference_baseline=(expand(self.reference_baseline, merged, self.name)
                                if self.reference_baseline else None),
            raw=self.raw,
        )


def expand(text: str, values: Mapping[str, str], suite: str = "?") -> str:
    """Replace ``${VAR}`` in ``text``; a missing variable raises KeyError with a fix."""

    def sub(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in values or values[name] in (None, ""):
            raise KeyError(f"suite {suite!r}: ${{{name}}} is not set; export {name} "
                           f"(or set it in the node connection's extras) and retry")
        return str(values[name])

    return _VAR.sub(sub, text)


class SpecError(ValueError):
    """A suite spec that cannot be used; the message names the file, the field and the fix."""


def _checked(raw: Mapping[str, Any], path: str) -> None:
    from rl_verify.engines import ENGINES

    engine = raw.get("engine")
    if engine not in ENGINES:
        raise SpecError(f"{path}: field 'engine': unknown engine {engine!r}; known engines: {', '.join(ENGINES)}")
    data = raw.get("data")
    if not isinstance(data, str) or not data or not data_file(data).is_file():
        raise SpecError(f"{path}: field 'data': data file {data!r} not found under rl_verify/data; add it "
                        "there or name an existing one")
    contradictions = _contradictions(raw, json.loads(data_file(data).read_text(encoding="utf-8")), data)
    if contradictions:
        raise SpecError(f"{path}: contradicts itself or its data file: " + "; ".join(contradictions))


def _contradictions(raw: Mapping[str, Any], data: Mapping[str, Any], data_name: str) -> list[str]:
    """Every fact the spec and its data file (or its launch environment) state differently."""
    out = []
    steps = raw.get("expected_steps")
    if "expected_steps" in data and data["expected_steps"] != steps:
        out.append(f"expected_steps is {steps} but {data_name} says {data['expected_steps']}")
    budget = (data.get("wall_time") or {}).get("threshold_s")
    if budget is not None and budget != raw.get("wall_time_budget_s"):
        out.append(f"wall_time_budget_s is {raw.get('wall_time_budget_s')} but {data_name} wall_time.threshold_s "
                   f"says {budget}")
    if "eval_points" in data and list(data["eval_points"]) != list(raw.get("eval_points") or []):
        out.append(f"eval_points are {raw.get('eval_points')} but {data_name} says {data['eval_points']}")
    env = (raw.get("launch") or {}).get("env") or {}
    if "TOTAL_TRAIN_STEPS" in env and str(env["TOTAL_TRAIN_STEPS"]) != str(steps):
        out.append(f"launch.env.TOTAL_TRAIN_STEPS is {env['TOTAL_TRAIN_STEPS']} but expected_steps is {steps}")
    total = (data.get("source") or {}).get("total_train_steps")
    if total is not None and total != steps:
        out.append(f"expected_steps is {steps} but {data_name} was measured at total_train_steps {total}")
    return out


def _from_dict(raw: Mapping[str, Any], path: str = "") -> SuiteSpec:
    _checked(raw, path)
    launch = raw["launch"]
    return SuiteSpec(
        name=raw["name"], title=raw["title"], source=raw.get("source", ""),
        script=launch["script"], args=tuple(launch.get("args", [])), env=dict(launch.get("env", {})),
        inputs=tuple(Input(i["kind"], i["path"]) for i in raw.get("inputs", [])),
        tracker=raw["tracker"], logs=tuple(raw.get("logs", [])), baseline=raw.get("baseline"),
        expected_steps=int(raw["expected_steps"]), eval_points=tuple(raw.get("eval_points", [])),
        wall_time_budget_s=int(raw["wall_time_budget_s"]), engine=raw["engine"],
        data=raw["data"], checker_dir=raw.get("checker_dir"),
        reference_baseline=raw.get("reference_baseline"), raw=raw,
    )


def available_suites() -> list[str]:
    """Names of the suite specs shipped in the package, sorted."""
    folder = resources.files("rl_verify") / "suites"
    return sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".json"))


def load_suite(name: str) -> SuiteSpec:
    """Load the spec of suite ``name``; unknown names raise ValueError listing the known ones."""
    known = available_suites()
    if name not in known:
        raise ValueError(f"unknown suite {name!r}; known suites: {', '.join(known)}")
    path = resources.files("rl_verify") / "suites" / f"{name}.json"
    return _from_dict(json.loads(path.read_text(encoding="utf-8")), str(path))


def data_file(name: str) -> Path:
    """Path of a versioned data file shipped in ``rl_verify/data``."""
    return Path(str(resources.files("rl_verify") / "data" / name))
