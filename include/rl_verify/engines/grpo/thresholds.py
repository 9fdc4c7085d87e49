"""The grpo engine's data file: the checker's ``assert_info``, the percentile metrics and the final eval,
validated (``GrpoThresholds``), and its loader."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field, model_validator

from rl_verify.core.thresholds import DataModel, Rule, load_data


class AssertInfo(DataModel):
    check_metrics: list[Rule] = Field(min_length=1)


class GrpoSource(DataModel):
    """Where the thresholds and the baseline tracker of a grpo-engine suite come from."""

    document: str = Field(min_length=1)
    #: The baseline tracker, in words (path and what it is).
    baseline: str = Field(min_length=1)
    #: N, the runs the baseline tracker averages.
    runs: int = Field(ge=1)
    #: The document's own words for the baseline, quoted in its provenance.
    quote: str = Field(min_length=1)


class GrpoThresholds(DataModel):
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


def load_thresholds(path: str | Path) -> GrpoThresholds:
    """The versioned GRPO thresholds (assert_info, percentile metrics, final eval), validated."""
    return load_data(path, GrpoThresholds, "give a thresholds file in the format of the suite spec's data file "
                                           "(the suites folder's data/, see the suite spec's 'data')")
