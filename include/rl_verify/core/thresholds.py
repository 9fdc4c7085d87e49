"""What every engine's data file shares: the threshold rule, the strict model base and the loader.

Each engine owns the model of its own data file (``rl_verify.engines.<name>.thresholds``), built on
:class:`DataModel` (pydantic, which Airflow ships) and loaded by :func:`load_data`: a file that does
not fit is refused with every problem listed, each naming the file and the field. A threshold rule
``(metric, method, operator, threshold)`` is parsed here once and applied through :meth:`Rule.error` /
:meth:`Rule.holds`. What the suite spec states (step count, eval points, wall-time budget) is not
repeated in these files. No Airflow import.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from rl_verify.core.errors import InputError
from rl_verify.core.model import metric_error, within

Method = Literal["absolute", "relative", "slowdown", "value"]
Operator = Literal["<", "<="]


class DataModel(BaseModel):
    """A data file's model: frozen, and an unknown field is an error (a typo never passes silently)."""

    model_config = ConfigDict(frozen=True, extra="forbid")


class Rule(DataModel):
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
