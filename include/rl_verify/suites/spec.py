"""Declarative suite specs: one JSON file per suite in the suites folder, its data files in ``data/``.

The suites folder is the package's ``rl_verify/suites`` (``settings.SUITES_DIR`` names another one:
a deployment's copy with a suite of its own). A spec names its comparison engine (``engine``) and
its threshold/golden data file (``data``, under ``<suites folder>/data``). Adding a suite that reuses
an engine means adding its spec and its data file; nothing branches on a suite's name.

This module reads and validates a spec's own shape (:func:`read_spec`); whether its engine exists
and its data file fits that engine is checked one layer up, by ``rl_verify.engines.load_suite``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Literal, Mapping

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from rl_verify import settings
from rl_verify.core import paths
from rl_verify.core.thresholds import field_errors

_VAR = re.compile(r"\$\{([A-Z_][A-Z0-9_]*)\}")


class _Spec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Input(_Spec):
    """A file the suite needs on the node; checked before the card is shown."""

    kind: str = Field(min_length=1)
    path: str = Field(min_length=1)


class LogRule(_Spec):
    """A line of the training log that ends the suite as an infrastructure failure, quoted.

    ``when``: ``seen`` stops the job as soon as the line appears (``count`` times: a wait printing a
    line forever; a run that logged it cannot finish: out of memory, NCCL); ``exit`` acts only when
    the job then ends short of its steps (a
    traceback a healthy run logs and survives is no failure), and quotes the line, or with ``quote:
    block-end`` the end of the block the line opens: the first later line that is not indented (a
    traceback's exception line).
    """

    pattern: str = Field(min_length=1)
    means: str = Field(min_length=1)
    when: Literal["seen", "exit"] = "seen"
    #: What to do about it, in a few words (the report, the verdict and the notification quote it).
    fix: str = ""
    #: ``seen`` rules: act when the line has been seen this many times (a wait that repeats forever).
    count: int = Field(default=1, ge=1)
    #: What an ``exit`` rule quotes: the matching ``line``, or the end of the ``block-end`` it opens (a
    #: traceback's exception line).
    quote: Literal["line", "block-end"] = "line"
    #: ``seen`` rules: stop the job only with ``early_abort`` on, or ``always`` (a wait that can never end:
    #: letting it go on only delays the same infrastructure FAIL to the stall watchdog).
    stop: Literal["early_abort", "always"] = "early_abort"
    #: Whether a training this line ended is tried again (issue 55, ``core.retry``): ``node`` (the node's own
    #: fault: never again on the same node), ``transient``, ``input`` or ``never``; unset: read from the line's
    #: words by the retry policy (``data/infra_retry.json``).
    retry: Literal["transient", "node", "input", "never"] | None = None

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


class NodeNeeds(_Spec):
    """What the suite's launch script needs of the node (facts about the script, xtuner-contract.md),
    checked before the card with the inputs: a node that is not ready fails fast, not after approval."""

    #: The open-files limit the script sets (``ulimit -n N`` under ``set -e``): the SSH user's hard limit
    #: must be at least this.
    nofile: int | None = Field(default=None, ge=1)
    #: The GPU count the script waits for (forever) before it trains.
    gpus: int | None = Field(default=None, ge=1)
    #: The fixed ports of the Ray head it starts (after ``ray stop --force``, which kills any Ray).
    ray_ports: tuple[int, ...] = ()
    #: The interpreter command it calls (``python``, not ``python3``).
    python: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_.+-]{1,40}$")
    #: The shared folder it removes and re-links to its WORK_DIR (``/tmp/ray_log``).
    ray_log: str | None = None

    @field_validator("ray_ports")
    @classmethod
    def _ports(cls, value: tuple[int, ...]) -> tuple[int, ...]:
        bad = [p for p in value if not 0 < p < 65536]
        if bad:
            raise ValueError(f"not TCP ports: {bad}")
        return value


class Launch(_Spec):
    """The launch script (relative to the checkout), its arguments and environment."""

    script: str = Field(min_length=1)
    args: tuple[str, ...] = ()
    env: dict[str, str] = {}


#: What a bitwise lane leaves out by default: fields that differ run to run whatever the numerics.
LANE_EXCLUDE = ("time/*", "*throughput*", "*tokens_per_sec*", "*/time", "memory/*", "*memory*")
#: The launch interpreter's packages whose versions make part of the environment's fingerprint.
LANE_PACKAGES = ("torch", "triton", "sglang", "lmdeploy", "flash_attn", "transformers", "ray")


class BitwiseLane(_Spec):
    """The bitwise-first lane of a suite (issue 33): the suite's first ``steps`` steps launched in deterministic
    mode (``env`` and ``args`` added to the launch) and compared bit for bit with a trusted reference. Identical
    steps are a shortcut to PASS; a difference sends the suite to the full check, never to FAIL.

    ``steps`` must cover the eval at step 0 and at least one update, weight sync and new rollout (>= 2).
    ``exclude``: tracker fields not compared (``fnmatch`` patterns). ``disabled_by``: paths whose change turns
    the lane off (code the deterministic mode bypasses). ``packages``: the launch interpreter's packages whose
    versions are part of the environment's fingerprint.
    """

    #: Where the deterministic launch's settings come from (shown, not used).
    source: str = ""
    env: dict[str, str] = Field(min_length=1)
    #: The deterministic launch's args instead of the suite's (e.g. the SGLang backend); empty: the suite's own.
    args: tuple[str, ...] = ()
    steps: int = Field(ge=2)
    exclude: tuple[str, ...] = LANE_EXCLUDE
    disabled_by: tuple[str, ...] = ()
    packages: tuple[str, ...] = LANE_PACKAGES

    @field_validator("disabled_by")
    @classmethod
    def _usable_disabling_paths(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        problems = paths.pattern_problems(value, "bitwise.disabled_by")
        if problems:
            raise ValueError("; ".join(problems))
        return value

    @field_validator("packages")
    @classmethod
    def _package_names(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        bad = [p for p in value if not re.fullmatch(r"[A-Za-z0-9_.-]{1,60}", p)]
        if bad:
            raise ValueError(f"bitwise.packages: {bad} are not package names (letters, digits, _ . -), "
                             "e.g. 'torch', 'flash_attn'")
        return value


class EvidenceProcess(_Spec):
    """One kind of process the suite's training runs (issue 53): ``kind`` its name (trainer, rollout worker,
    teacher); ``runs`` a function only that kind of process runs, ``<checkout path>.py:<qualname>`` (dotted: a
    method is ``Class.method``). A process proves its kind when its own coverage data holds a line of that body."""

    kind: str = Field(pattern=r"^[a-z][a-z0-9 _-]{0,39}$")
    runs: str

    @field_validator("runs")
    @classmethod
    def _function(cls, value: str) -> str:
        path, _, qualname = value.partition(":")
        if (not path.endswith(".py") or path.startswith("/") or ".." in path.split("/")
                or not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9._/-]*", path)
                or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*", qualname)):
            raise ValueError(f"evidence.processes.runs {value!r} must be <.py path relative to the checkout's root>:"
                             "<function or Class.method>, e.g. xtuner/v1/rl/rollout/worker.py:RolloutWorker.init")
        return value

    @property
    def path(self) -> str:
        return self.runs.partition(":")[0]

    @property
    def qualname(self) -> str:
        return self.runs.partition(":")[2]


#: A config file the lane's evidence run is given in place of the suite's (``StopConfig.arg``): a ``.py`` path
#: relative to the checkout, as the launch script is given it.
_CONFIG_ARG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._/-]*\.py")


class StopConfig(_Spec):
    """The lane's evidence run stopped by its config (issue 53), for a launch whose config file fixes its step count
    (GRPO: XTuner's config builds its ``trainer`` with ``rollout_steps = 45``). For that run only, rl-verify writes a
    config in the job's evidence folder on the node that runs the suite's config file as XTuner's CLI runs a config
    (``Config.fromfile``: the module executed, its top-level names kept) and then sets ``attribute`` to ``value``,
    and passes it as the launch argument ``arg`` instead (``node.evidence_scripts.evidence_config_text``). The
    lane's own jobs run the suite's config as it is."""

    #: Which of the lane's launch arguments (``bitwise.args``, else ``launch.args``; 0-based) is the config file.
    arg: int = Field(ge=0, le=20)
    #: What is set once the config ran: one of its top-level names, then the attribute path on it (dotted).
    attribute: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*){1,4}$")
    #: Its value: ``${LANE_LAST_STEP}`` (k - 1: the tracker's step 0 is the initial eval, steps 1..k-1 the lane's
    #: training steps) or a whole number.
    value: str = Field(pattern=r"^(\$\{LANE_LAST_STEP\}|[0-9]{1,6})$")

    @field_validator("attribute")
    @classmethod
    def _no_dunder(cls, value: str) -> str:
        if any(part.startswith("__") for part in value.split(".")):
            raise ValueError(f"evidence.stop_config.attribute {value!r} names a special attribute (__...): name "
                             "the config's trainer and its step count, e.g. trainer.rollout_steps")
        return value

    def resolved(self, lane_steps: int) -> int:
        """``value`` for a lane of ``lane_steps`` steps."""
        return lane_steps - 1 if self.value == "${LANE_LAST_STEP}" else int(self.value)


class EvidenceSpec(_Spec):
    """Executed-code evidence of the suite's training (issue 44): when a bitwise reference is made, coverage.py
    records in every Python process of its full run and of its lane's k steps the checkout lines that ran.
    ``processes``: every kind of process the training runs (issue 53), each proven by one process's own data file
    that ran its ``runs`` function: a recording in which no process proves a kind missed that process (the
    environment did not reach it) and is no evidence."""

    #: Where the processes come from (shown, not used).
    source: str = ""
    processes: tuple[EvidenceProcess, ...] = Field(min_length=1)
    #: The launch's own step count, set so that the lane's evidence run stops itself after the lane's steps
    #: (``${LANE_LAST_STEP}``: k - 1): its lines are then exactly the compared steps'. Without it or
    #: ``stop_config``, the run the trigger stops counts only when it wrote no step past k - 1.
    stop_env: dict[str, str] = {}
    #: The same for a launch whose config file fixes its step count (GRPO): see ``StopConfig``.
    stop_config: StopConfig | None = None

    @field_validator("processes")
    @classmethod
    def _distinct_kinds(cls, value: tuple[EvidenceProcess, ...]) -> tuple[EvidenceProcess, ...]:
        kinds = [p.kind for p in value]
        twice = sorted({k for k in kinds if kinds.count(k) > 1})
        if twice:
            raise ValueError(f"evidence.processes: the kind(s) {twice} are named more than once")
        return value


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
    #: One run's wall time at the runbook's scale, in minutes (the bisection card's GPU-hours); None: the
    #: wall-time budget stands in, an upper bound.
    runbook_minutes: float | None = Field(default=None, gt=0)
    engine: str
    data: str = Field(min_length=1)
    #: Lines of the training log that mean the run cannot finish (acted on live, with early_abort).
    log_rules: tuple[LogRule, ...] = ()
    #: What the launch script needs of the node (checked with the inputs, before the card).
    node: NodeNeeds = NodeNeeds()
    #: The checkout's paths that can move this suite's numbers, and those that cannot (core.paths patterns):
    #: a diff since the suite's last verified PASS that touches no affecting path needs no training.
    #: Each ``affects`` pattern must match a file of the checkout at the commit under test, or the skip is off for
    #: the suite (issue 42: a rule naming a path the tree no longer has decides nothing).
    affects: tuple[str, ...] = paths.DEFAULT_AFFECTS
    unaffecting: tuple[str, ...] = paths.DEFAULT_UNAFFECTING
    #: Where ``affects``/``unaffecting`` come from (shown, not used): the facts of the checkout they rest on.
    affects_source: str = ""
    #: The bitwise-first lane, when the suite has a deterministic mode (None: every verification is full).
    bitwise: BitwiseLane | None = None
    #: Executed-code evidence recorded with the lane's references (None: the path rules alone decide).
    evidence: EvidenceSpec | None = None
    #: The spec file as written (the experiment fingerprint hashes it).
    raw: dict[str, Any] = Field(default_factory=dict, exclude=True, repr=False)

    @field_validator("affects", "unaffecting")
    @classmethod
    def _usable_path_patterns(cls, value: tuple[str, ...], info: Any) -> tuple[str, ...]:
        problems = paths.pattern_problems(value, info.field_name)
        if problems:
            raise ValueError("; ".join(problems))
        return value

    @model_validator(mode="after")
    def _lane_within_the_run(self) -> "SuiteSpec":
        if self.bitwise and self.bitwise.steps > self.expected_steps:
            raise ValueError(f"bitwise.steps {self.bitwise.steps} is more than the run's expected_steps "
                             f"{self.expected_steps}; the lane covers the first steps of a run")
        return self

    @model_validator(mode="after")
    def _stop_config_names_the_lanes_config(self) -> "SuiteSpec":
        stop = self.evidence.stop_config if self.evidence else None
        if stop is None:
            return self
        if self.bitwise is None:
            raise ValueError("evidence.stop_config needs a bitwise lane: it stops the lane's evidence run")
        args = self.bitwise.args or self.launch.args
        if stop.arg >= len(args):
            raise ValueError(f"evidence.stop_config.arg {stop.arg} is past the lane's {len(args)} launch argument(s)")
        config = args[stop.arg]
        if not _CONFIG_ARG.fullmatch(config) or ".." in config.split("/"):
            raise ValueError(f"evidence.stop_config.arg {stop.arg} is the lane's launch argument {config!r}, not a "
                             ".py config file relative to the checkout (no ${{...}}, no '..')")
        if stop.resolved(self.bitwise.steps) < 1:
            raise ValueError(f"evidence.stop_config.value {stop.value!r} leaves the evidence run no training step")
        return self

    @property
    def run_minutes(self) -> float:
        """One run's wall time in minutes at the runbook's scale (else the wall-time budget's)."""
        return self.runbook_minutes or self.wall_time_budget_s / 60

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


def spec_from_dict(raw: Mapping[str, Any], path: str = "") -> SuiteSpec:
    """The spec's own shape validated; every problem names ``path`` and the field."""
    try:
        spec = SuiteSpec.model_validate({**raw, "raw": dict(raw)})
    except ValidationError as exc:
        raise SpecError(f"{path}: {field_errors(exc)}") from exc
    if not data_file(spec.data).is_file():
        raise SpecError(f"{path}: field 'data': data file {spec.data!r} not found under {suites_dir() / 'data'}; "
                        "add it there or name an existing one")
    contradictions = _launch_contradictions(spec)
    if contradictions:
        raise SpecError(f"{path}: contradicts itself: " + "; ".join(contradictions))
    return spec


def _launch_contradictions(spec: SuiteSpec) -> list[str]:
    steps = spec.env.get("TOTAL_TRAIN_STEPS")
    if steps is not None and steps != "${EXPECTED_STEPS}" and steps != str(spec.expected_steps):
        return [f"launch.env.TOTAL_TRAIN_STEPS is {steps} but expected_steps is {spec.expected_steps} (write "
                "\"${EXPECTED_STEPS}\" to use the spec's step count)"]
    return []


def suites_dir() -> Path:
    """The folder of the suite specs (``<name>.json``) and their data files (``data/``)."""
    return Path(settings.SUITES_DIR).expanduser() if settings.SUITES_DIR else Path(__file__).resolve().parent


def available_suites() -> list[str]:
    """Names of the suite specs in the suites folder, sorted."""
    return sorted(p.name[:-5] for p in suites_dir().iterdir() if p.name.endswith(".json") and p.is_file())


def read_spec(name: str) -> SuiteSpec:
    """The spec of suite ``name``, its own shape validated (SpecError naming the file and every bad field);
    an unknown name raises ValueError listing the known ones."""
    known = available_suites()
    if name not in known:
        raise ValueError(f"unknown suite {name!r}; known suites: {', '.join(known)}")
    path = suites_dir() / f"{name}.json"
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise SpecError(f"{path}: not valid JSON ({exc})") from exc
    return spec_from_dict(raw, str(path))


def data_file(name: str) -> Path:
    """Path of a versioned data file of the suites folder (``<suites folder>/data/<name>``)."""
    return suites_dir() / "data" / name
