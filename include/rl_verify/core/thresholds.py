"""Typed, validated threshold data: the GRPO thresholds file and the OPD golden table.

One model per data file (pydantic, which Airflow ships), loaded by :func:`load_data`: a file that
does not fit is refused with every problem listed, each naming the file and the field. A
threshold rule ``(metric, method, operator, threshold)`` is parsed here once and applied through
:meth:`Rule.error` / :meth:`Rule.holds`. What the suite spec states (step count, eval points,
wall-time budget) is not repeated in these files. No Airflow import: this is the engine layer.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from rl_verify.core.errors import InputError
from rl_verify.core.model import metric_error, within

Method = Literal["absolute", "relative", "slowdown", "value"]
Operator = Literal["<", "<="]


class _Data(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Rule(_Data):
    """How one metric is judged: ``error(reference, current) <operator> threshold``."""

    metric: str = Field(min_length=1)
    method: Method = "absolute"
    operator: Operator = "<"
    threshold: float = Field(ge=0, allow_inf_nan=False)
    #: Largest run-to-run deviation measured when the threshold was set (provenance of the margin).
    measured_max_dev: float | None = None
    #: Shown with its would-be result, never judged (machine-dependent metrics such as time/step).
    reference_only: bool = False

    def error(self, reference: float, current: float) -> float:
        return metric_error(reference, current, self.method)

    def holds(self, error: float | None) -> bool:
        return within(error, self.operator, self.threshold)

    def checker_entry(self) -> dict[str, Any]:
        """The rule in the checker's ``assert_info`` format."""
        return {"metric": self.metric, "threshold": self.threshold, "method": self.method,
                "operator": self.operator}


class AssertInfo(_Data):
    check_metrics: list[Rule] = Field(min_length=1)


class GrpoSource(_Data):
    """Where the thresholds and the baseline tracker of a grpo-engine suite come from."""

    document: str = Field(min_length=1)
    #: The baseline tracker, in words (path and what it is).
    baseline: str = Field(min_length=1)
    #: N, the runs the baseline tracker averages.
    runs: int = Field(ge=1)
    #: The document's own words for the baseline, quoted in its provenance.
    quote: str = Field(min_length=1)


class GrpoThresholds(_Data):
    """A grpo-engine data file: the checker's ``assert_info``, percentile metrics, the final eval."""

    suite: str
    source: GrpoSource
    #: The ``case_name`` the checker is called with (names its comparison PNG).
    case_name: str = Field(min_length=1)
    assert_info: AssertInfo
    #: Metrics the checker judges by a percentile of per-step errors (runbook: p80), by name.
    percentile_metrics: dict[str, float] = {}
    final_eval: Rule

    @model_validator(mode="after")
    def _percentiles_name_checked_metrics(self) -> "GrpoThresholds":
        checked = {r.metric for r in self.assert_info.check_metrics}
        unknown = sorted(set(self.percentile_metrics) - checked)
        if unknown:
            raise ValueError(f"percentile_metrics names {', '.join(unknown)}, which assert_info.check_metrics "
                             "does not check")
        bad = {m: q for m, q in self.percentile_metrics.items() if not 0 < q <= 100}
        if bad:
            raise ValueError(f"percentile_metrics must be in (0, 100]: {bad}")
        return self

    @property
    def rules(self) -> list[Rule]:
        return list(self.assert_info.check_metrics)

    def checker_assert_info(self) -> dict[str, Any]:
        """``assert_info`` exactly as the checkout's ``check_rl_result`` reads it."""
        return {"check_metrics": [r.checker_entry() for r in self.rules]}


class GoldenSource(BaseModel):
    """Where the golden values come from; ``total_train_steps`` is the calibrated range."""

    model_config = ConfigDict(frozen=True, extra="allow")
    document: str
    measured: str
    commit: str
    runs: int = Field(ge=1)
    total_train_steps: int = Field(ge=1)


class OpdGolden(_Data):
    """An opd-engine data file (golden table): thresholds per metric and golden values per eval point."""

    suite: str
    source: GoldenSource
    thresholds: dict[str, Rule]
    golden: dict[int, dict[str, float]]

    @field_validator("thresholds", mode="before")
    @classmethod
    def _metric_from_key(cls, value: Any) -> Any:
        # The file keys rules by metric name; the rule carries it too once loaded.
        if isinstance(value, dict):
            return {k: {"metric": k, **v} if isinstance(v, dict) else v for k, v in value.items()}
        return value

    @model_validator(mode="after")
    def _golden_values_are_judged_metrics(self) -> "OpdGolden":
        problems = [f"golden step {step}: {metric} has no threshold" for step, row in self.golden.items()
                    for metric in row if metric not in self.thresholds]
        problems += [f"golden step {step}: {metric} is not finite" for step, row in self.golden.items()
                     for metric, value in row.items() if not math.isfinite(value)]
        if problems:
            raise ValueError("; ".join(problems))
        return self

    @property
    def calibrated_max_step(self) -> int:
        """The last step the golden values were measured at."""
        return self.source.total_train_steps

    @property
    def eval_points(self) -> list[int]:
        return sorted(self.golden)

    def value(self, step: int, metric: str) -> float | None:
        return self.golden.get(step, {}).get(metric)


Data = TypeVar("Data", bound=BaseModel)


def load_data(path: str | Path, model: type[Data], fix: str) -> Data:
    """Load ``path`` as ``model``; any problem raises InputError listing every field that is wrong."""
    path = Path(path)
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise InputError(f"cannot read the {model.__name__} data file ({exc.strerror or exc})", path, None,
                         fix) from exc
    except UnicodeDecodeError as exc:
        raise InputError("data file is not UTF-8", path, None, fix) from exc
    except ValueError as exc:
        raise InputError(f"data file is not valid JSON ({exc})", path, getattr(exc, "lineno", None), fix) from exc
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        raise InputError(f"data file does not fit {model.__name__}: {field_errors(exc)}", path, None, fix) from exc


def parse_json(data: bytes, where: str, what: str, fix: str) -> Any:
    """``data`` as JSON; InputError naming ``where`` (and the line) when it is not UTF-8 JSON."""
    try:
        return json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise InputError(f"{what} is not UTF-8", where, None, fix) from exc
    except ValueError as exc:
        raise InputError(f"{what} is not valid JSON ({exc})", where, getattr(exc, "lineno", None), fix) from exc


def field_errors(exc: ValidationError) -> str:
    """Every error of a validation, ``field.path: message``, joined by ``; ``."""
    return "; ".join(f"{'.'.join(str(p) for p in e['loc']) or '(top level)'}: {e['msg']}" for e in exc.errors())
