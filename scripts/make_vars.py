"""The `make` targets' variables, read the way a person means them.

The Makefile hands every documented variable to the scripts whether it was given or not
(``STEP_SECONDS="$(STEP_SECONDS)"``), so an unset variable arrives as an empty string. Here an
empty (or blank) value always means "the default", and a bad value is one line naming the variable,
what it must be and how to give it: a ``UsageError``, printed by the script, exit status 2, no
traceback and nothing started.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

TRUE = ("1", "true", "yes", "on")
FALSE = ("0", "false", "no", "off")


class UsageError(ValueError):
    """A make variable (or its command-line option) has a value the script cannot use."""


def value(env: Mapping[str, str], name: str) -> str | None:
    """The variable's value stripped, or None when it is unset or empty."""
    text = (env.get(name) or "").strip()
    return text or None


def text(env: Mapping[str, str], name: str, default: str) -> str:
    """A string variable; empty = ``default``."""
    return value(env, name) or default


def flag(env: Mapping[str, str], name: str, target: str) -> bool:
    """A yes/no variable: empty, 0, false, no, off = no; 1, true, yes, on = yes; anything else is refused."""
    raw = value(env, name)
    if raw is None or raw.lower() in FALSE:
        return False
    if raw.lower() in TRUE:
        return True
    raise UsageError(f"{name}={raw!r} is not a yes/no value: give {name}=1 (make {target} {name}=1), "
                     f"or leave it unset (or {name}=0) for no")


def number(env: Mapping[str, str], name: str, default: float, target: str, what: str,
           minimum: float = 0.0) -> float:
    """A number of ``what`` greater than ``minimum``; empty = ``default``."""
    raw = value(env, name)
    if raw is None:
        return default
    try:
        out = float(raw)
    except ValueError:
        out = math.nan
    if not math.isfinite(out) or out <= minimum:
        raise UsageError(f"{name}={raw!r} is not a number of {what} greater than {minimum:g}: give e.g. "
                         f"make {target} {name}={default:g}, or leave it unset for the default ({default:g})")
    return out


def integer(env: Mapping[str, str], name: str, default: int, target: str, what: str,
            low: int, high: int) -> int:
    """A whole number of ``what`` in ``low``..``high``; empty = ``default``."""
    raw = value(env, name)
    if raw is None:
        return default
    try:
        out = int(raw)
    except ValueError:
        out = low - 1
    if not low <= out <= high:
        raise UsageError(f"{name}={raw!r} is not a whole number of {what} from {low} to {high}: give e.g. "
                         f"make {target} {name}={default}, or leave it unset for the default ({default})")
    return out


def commit(env: Mapping[str, str], target: str, default: str = "main") -> str:
    """COMMIT: a branch, tag or SHA, checked by the DAG's own rule before anything starts; empty = ``default``."""
    from rl_verify.node.remote import BadInput, validate_commit

    raw = value(env, "COMMIT") or default
    try:
        return validate_commit(raw)
    except BadInput as err:
        raise UsageError(f"COMMIT={raw!r}: {err} (e.g. make {target} COMMIT=sim/regress-mismatch, or leave it "
                         f"unset for {default})") from None


def suites(env: Mapping[str, str], target: str, default: str = "grpo,opd") -> list[str]:
    """SUITES: comma-separated suite names, checked by the DAG's own rule; empty = ``default``."""
    from rl_verify.node.remote import BadInput, validate_suites

    raw = value(env, "SUITES") or default
    try:
        return validate_suites(raw)
    except BadInput as err:
        raise UsageError(f"SUITES={raw!r}: {err} (e.g. make {target} SUITES=opd, or leave it unset for "
                         f"{default})") from None
