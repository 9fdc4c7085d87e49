"""Declarative suite specs: one JSON file per suite under ``rl_verify/suites``.

A spec names its comparison engine (``engine``, see ``rl_verify.engines``) and its threshold/golden
data file (``data``, under ``rl_verify/data``). Adding a suite that reuses an engine means adding
its spec and data file; nothing branches on a suite's name. ``load_suite`` refuses a spec whose
engine is unknown or whose data file is missing, naming the file and the field.
"""

from __future__ import annotations

import json
import re
from importlib import resources
from pathlib import Path
from typing import Any, Literal, Mapping

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

_VAR = re.compile(r"\$\{([A-Z_][A-Z0-9_]*)\}")


class _Spec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Input(_Spec):
    """A file the suite needs on the node; checked before the card is shown."""

    kind: str = Field(min_length=1)
    path: str = Field(min_length=1)


class LogRule(_Spec):
    """A line of the training log that ends the suite as an infrastructure failure, quoted.

    ``when``: ``seen`` stops the job as soon as the line appears (a run that logged it cannot
    finish: out of memory, NCCL); ``exit`` acts only when the job then ends short of its steps (a
    traceback a healthy run logs and survives is no failure), and quotes the end of the block the
    line opens: the first later line that is not indented (a traceback's exception line).
    """

    pattern: str = Field(min_length=1)
    means: str = Field(min_length=1)
    when: Literal["seen", "exit"] = "seen"

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, value: str) -> str:
        try:
            re.compile(value)
        except re.error as err:
            raise ValueError(f"not a regular expression ({err})") from err
        return value

    def match(self, line: str) -> bool:
        return re.search(self.pattern, line) is not None


class Launch(_Spec):
    """The launch script (relative to the checkout), its arguments and environment."""

    script: str = Field(min_length=1)
    args: tuple[str, ...] = ()
    env: dict[str, str] = {}


class SuiteSpec(_Spec):
    """One suite's launch command, inputs, tracker location, baseline, scale and budget.

    The single source of the suite's step count, eval points and wall-time budget: its data file
    holds thresholds and provenance only. ``${VAR}`` in paths and the launch environment are filled
    in by :meth:`expanded`; ``${EXPECTED_STEPS}`` is the spec's own step count.
    """

    name: str = Field(pattern=r"^[a-z0-9_]{1,40}$")
    title: str = Field(min_length=1)
    source: str = ""
    launch: Launch
    inputs: tuple[Input, ...] = ()
    tracker: str = Field(min_length=1)
    logs: tuple[str, ...] = ()
    baseline: str | None = None
    #: Optional tracker giving baseline values the golden table lacks; absent is not an error.
    reference_baseline: str | None = None
    reference_baseline_note: str | None = None
    checker_dir: str | None = None
    expected_steps: int = Field(ge=1)
    eval_points: tuple[int, ...] = ()
    wall_time_budget_s: int = Field(gt=0)
    engine: str
    data: str = Field(min_length=1)
    #: Lines of the training log that mean the run cannot finish (acted on live, with early_abort).
    log_rules: tuple[LogRule, ...] = ()
    #: The spec file as written (the experiment fingerprint hashes it).
    raw: dict[str, Any] = Field(default_factory=dict, exclude=True, repr=False)

    @property
    def script(self) -> str:
        return self.launch.script

    @property
    def args(self) -> tuple[str, ...]:
        return self.launch.args

    @property
    def env(self) -> Mapping[str, str]:
        return self.launch.env

    def expanded(self, values: Mapping[str, str]) -> "SuiteSpec":
        """Return a copy with every ``${VAR}`` replaced from ``values`` (and ``EXPECTED_STEPS``).

        Raises KeyError naming the variable and the suite when a value is missing, so that a
        deployment without e.g. ``CI_SHARE_MODEL`` fails before anything reaches the node.
        """
        values = {**values, "EXPECTED_STEPS": str(self.expected_steps)}
        env = {k: expand(v, values, self.name) for k, v in self.env.items()}
        merged = {**values, **env}

        def opt(text: str | None) -> str | None:
            return expand(text, merged, self.name) if text else None

        launch = self.launch.model_copy(update={"env": env,
                                                "args": tuple(expand(a, merged, self.name) for a in self.args)})
        inputs = tuple(Input(kind=i.kind, path=expand(i.path, merged, self.name)) for i in self.inputs)
        return self.model_copy(update={"launch": launch, "inputs": inputs, "baseline": opt(self.baseline),
                                       "checker_dir": opt(self.checker_dir),
                                       "reference_baseline": opt(self.reference_baseline)})


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


def _from_dict(raw: Mapping[str, Any], path: str = "") -> SuiteSpec:
    """The validated spec; every problem (shape, engine, data file, contradiction) names ``path``."""
    from rl_verify.engines import ENGINES

    try:
        spec = SuiteSpec.model_validate({**raw, "raw": dict(raw)})
    except ValidationError as exc:
        from rl_verify.thresholds import field_errors

        raise SpecError(f"{path}: {field_errors(exc)}") from exc
    if spec.engine not in ENGINES:
        raise SpecError(f"{path}: field 'engine': unknown engine {spec.engine!r}; known engines: {', '.join(ENGINES)}")
    if not data_file(spec.data).is_file():
        raise SpecError(f"{path}: field 'data': data file {spec.data!r} not found under rl_verify/data; add it "
                        "there or name an existing one")
    from rl_verify.errors import InputError

    try:
        data = ENGINES[spec.engine].load_data(data_file(spec.data))
    except InputError as exc:
        raise SpecError(f"{path}: field 'data': {exc}") from exc
    contradictions = _launch_contradictions(spec) + ENGINES[spec.engine].contradictions(spec, data)
    if contradictions:
        raise SpecError(f"{path}: contradicts itself or its data file {spec.data}: " + "; ".join(contradictions))
    return spec


def _launch_contradictions(spec: SuiteSpec) -> list[str]:
    steps = spec.env.get("TOTAL_TRAIN_STEPS")
    if steps is not None and steps != "${EXPECTED_STEPS}" and steps != str(spec.expected_steps):
        return [f"launch.env.TOTAL_TRAIN_STEPS is {steps} but expected_steps is {spec.expected_steps} (write "
                "\"${EXPECTED_STEPS}\" to use the spec's step count)"]
    return []


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
