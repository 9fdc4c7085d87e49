"""The engine registry: a suite spec's ``engine`` field -> the engine package of that name.

The registry imports no implementation: an engine is the package ``rl_verify.engines.<name>``
holding ``ENGINE`` (an :class:`~rl_verify.engines.base.Engine`), found by listing this package and
imported by name the first time a spec names it. A new engine is one package here plus its suite's
spec and data file, nothing else; a new suite on an existing engine is one spec file plus its data
file (``rl_verify.suites``).

:func:`load_suite` is the validated way to a suite: the spec's own shape (``suites.spec``), its
engine known, its data file fitting that engine, and no contradiction between the two.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Iterable, Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

from rl_verify import settings
from rl_verify.core.errors import InputError
from rl_verify.engines.base import Engine
from rl_verify.suites.spec import SpecError, SuiteSpec, available_suites, data_file, read_spec, suites_dir

def names() -> list[str]:
    """Every engine: the subpackages of this package (but private ones), sorted; its modules (``base``)
    are what the engines share."""
    return sorted(m.name for m in pkgutil.iter_modules(__path__) if m.ispkg and not m.name.startswith("_"))


@lru_cache(maxsize=None)
def get(name: str) -> Engine:
    """The engine called ``name``; ValueError listing the known engines for any other name."""
    known = names()
    if name not in known:
        raise ValueError(f"unknown engine {name!r}; known engines: {', '.join(known)}")
    engine = getattr(importlib.import_module(f"{__name__}.{name}"), "ENGINE", None)
    if not isinstance(engine, Engine) or engine.name != name:
        raise TypeError(f"rl_verify.engines.{name} must define ENGINE, an Engine whose name is {name!r}")
    return engine


def engine_of(spec: SuiteSpec) -> Engine:
    """The engine a spec names (``load_suite`` has already refused an unknown one)."""
    return get(spec.engine)


def validate(spec: SuiteSpec, path: str = "") -> SuiteSpec:
    """``spec`` if its engine exists, its data file fits that engine and the two agree; else SpecError
    naming ``path``, the field and every problem."""
    if spec.engine not in names():
        raise SpecError(f"{path}: field 'engine': unknown engine {spec.engine!r}; known engines: {', '.join(names())}")
    engine = get(spec.engine)
    try:
        data = engine.load_data(data_file(spec.data))
    except InputError as exc:
        raise SpecError(f"{path}: field 'data': {exc}") from exc
    contradictions = engine.contradictions(spec, data)
    if contradictions:
        raise SpecError(f"{path}: contradicts its data file {spec.data}: " + "; ".join(contradictions))
    return spec


def load_suite(name: str) -> SuiteSpec:
    """The validated spec of suite ``name`` (ValueError listing the known suites for an unknown name;
    SpecError naming the file and every bad field otherwise)."""
    spec = read_spec(name)
    return validate(spec, str(spec_path(name)))


def spec_path(name: str) -> str:
    """Where the spec of ``name`` is read from (for messages)."""
    return str(suites_dir() / f"{name}.json")


def known_suites() -> tuple[str, ...]:
    """Every suite spec of the suites folder, sorted by name."""
    return tuple(available_suites())


def default_suites() -> tuple[str, ...]:
    """What a run tests unless its ``suites`` param says otherwise: RL_VERIFY_DEFAULT_SUITES, else every
    suite. ValueError naming the setting when it names a suite that has no spec."""
    known = known_suites()
    chosen = settings.DEFAULT_SUITES_SETTING or known
    unknown = sorted(set(chosen) - set(known))
    if unknown:
        raise ValueError(f"RL_VERIFY_DEFAULT_SUITES names {', '.join(map(repr, unknown))}, which has no suite spec: "
                         f"give a comma-separated subset of {', '.join(known)}")
    return tuple(chosen)


def suite_titles() -> dict[str, str]:
    """``{suite: "grpo: <spec title>"}`` for the trigger form (spec files only: safe at parse time)."""
    return {name: f"{name}: {load_suite(name).title}" for name in known_suites()}


def threshold_choices() -> list[str]:
    """Every threshold set a calibration proposal may offer its approver, over the engines (the runbook's
    first): the approval form's choices."""
    return list(dict.fromkeys(c for name in names() for c in get(name).threshold_choices()))


def criteria(specs: Iterable[SuiteSpec],
             data_path: Callable[[SuiteSpec], Path] | None = None) -> dict[str, list[str]]:
    """Each suite's acceptance criteria for the card, from its engine and the data file it is judged
    with (``data_path``; default: the spec's own data file)."""
    out = {}
    for spec in specs:
        engine = engine_of(spec)
        out[spec.name] = engine.criteria(spec, engine.load_data(data_path(spec) if data_path else data_file(spec.data)))
    return out


def live_config(spec: SuiteSpec, work_dir: str, early_abort: bool, baseline: bytes | None, data: Any,
                baseline_where: str | None, confirms: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The JSON the trigger's ``core.live.LiveWatch`` runs a training's live check from: the spec's step
    count and log rules, and the engine's check in serialised form (``Engine.live`` with the baseline
    tracker's bytes and the data model in use), or ``note`` saying why there is none. A check that
    cannot be built only switches the live check off: the final comparison judges the run. ``confirms``
    (a repeat: ``core.confirm.stop_early``): only a certain FAIL that decides the outcome stops it."""
    config: dict[str, Any] = {"suite": spec.name, "work_dir": work_dir, "tracker_glob": spec.tracker,
                              "expected_steps": spec.expected_steps, "early_abort": bool(early_abort),
                              "log_rules": [rule.model_dump() for rule in spec.log_rules], "check": None,
                              "note": None}
    if confirms:
        config["confirms"] = {str(k): [float(x) for x in v] for k, v in confirms.items()}
    try:
        check = engine_of(spec).live(spec, baseline, data)
    except Exception as err:  # bad data must never stop a training
        config["note"] = str(err)
        return config
    if check is None:
        config["note"] = f"no baseline tracker at {baseline_where} to compare against"
    else:
        config["check"] = list(check.serialize())
    return config
