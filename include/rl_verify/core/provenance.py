"""Where a baseline comes from: the provenance every baseline version records (pure pydantic model).

Engines state the provenance of the baseline that ships (``Engine.shipped``), calibrations that of
the baselines they make; the record store (``rl_verify.store.baselines``) keeps it in ``version.json``.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

SourceKind = Literal["shipped", "calibration"]


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Provenance(_Model):
    """Where a baseline version comes from: what a caller of :func:`add_version` states."""

    source: SourceKind
    #: The reference commit the baseline runs trained (None when unknown, e.g. the share's GRPO tracker).
    commit: str | None = None
    #: N, the number of runs the baseline is the mean of.
    runs: int | None = Field(default=None, ge=1)
    dag_run_ids: tuple[str, ...] = ()
    #: When the runs were measured (ISO dates or timestamps, as recorded).
    dates: tuple[str, ...] = ()
    node: str | None = None
    hardware: str | None = None
    approved_by: str | None = None
    approved_at: datetime | None = None
    #: Summary of the statistics the baseline came from (free form: per-metric max deviation, ...).
    statistics: dict[str, Any] = {}
    note: str = ""
    #: A baseline tracker outside the store (the GPU node's share), as the suite spec writes it.
    baseline_ref: str | None = None

    @model_validator(mode="after")
    def _calibration_is_traceable(self) -> "Provenance":
        if self.source == "calibration":
            if not self.commit:
                raise ValueError("a calibration baseline names its reference commit")
            if self.runs is None or self.runs < 2:
                raise ValueError(f"a calibration baseline is the mean of N >= 2 runs (runs is {self.runs})")
        return self
