"""The opd engine's data file, the golden table: thresholds per metric and golden values per eval point,
validated (``OpdGolden``), its loader, and the rule its thresholds are set by."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from rl_verify.core.thresholds import DataModel, Rule, load_data

#: The file of a stored baseline version that holds the golden table (``OpdEngine.baseline_file``).
GOLDEN_FILE = "golden.json"
#: The runbook's rule for the thresholds of a golden table: measured max run-to-run deviation x this.
MARGIN = 1.5
#: The approver's choices of thresholds for a calibrated golden table (``Proposal.choices``).
RUNBOOK_CHOICE = "runbook: max deviation x 1.5"
#: The proposal's golden table with the thresholds that hold a stated false-alarm rate.
FALSE_ALARM_FILE = "golden-false-alarm.json"
FALSE_ALARM_CHOICE = "5% false alarm per verification"


class GoldenSource(BaseModel):
    """Where the golden values come from; ``total_train_steps`` is the calibrated range."""

    model_config = ConfigDict(frozen=True, extra="allow")
    document: str
    measured: str
    commit: str
    runs: int = Field(ge=1)
    total_train_steps: int = Field(ge=1)


class OpdGolden(DataModel):
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


def load_golden(path: str | Path) -> OpdGolden:
    """Load and validate a golden file (the format of the OPD suite spec's data file)."""
    return load_data(path, OpdGolden, "give a golden file in the format of the OPD suite spec's data file "
                                      "(the suites folder's data/, see the suite spec's 'data')")
