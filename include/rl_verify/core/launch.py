"""Why a launch died before its tracker, in its own words (pure).

The job runs the launch script under ``bash -x`` with the trace in its own file (``job_trace.log``, the
script's commands as bash ran them) beside what it printed (``job_stdout.log``). Under ``set -e`` the
script ends at the command that failed: the trace's last command, and the last lines it printed (the
command's message), say what happened. The suite spec's log rules with a ``fix`` name the known causes.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

#: Lines of the printed output quoted (the failing command's message is at the end).
TAIL_LINES = 3


def last_command(trace: str) -> str | None:
    """The last command of a bash -x trace (``+ ulimit -n 65536``), without its ``+`` prefix."""
    commands = [line for line in trace.splitlines() if line.startswith("+")]
    return commands[-1].lstrip("+").strip() if commands else None


def last_lines(output: str, count: int = TAIL_LINES) -> list[str]:
    """The last ``count`` non-empty lines a job printed that are not rl-verify's own (``[rl-verify] ...``)."""
    lines = [line.strip() for line in output.splitlines() if line.strip() and not line.startswith("[rl-verify]")]
    return lines[-count:]


def explain(output: str, trace: str, rules: Iterable[Mapping[str, Any]] = ()) -> str | None:
    """"its last command `ulimit -n 65536` printed: `...: cannot modify limit: Operation not permitted`",
    with the fix of the first rule (``pattern``, ``means``, ``fix``) that matches a quoted line; None when
    the job left neither a trace nor output."""
    command, tail = last_command(trace), last_lines(output)
    if command is None and not tail:
        return None
    said = []
    if command:
        said.append(f"its last command `{command[:300]}`")
    if tail:
        said.append("printed: " + " / ".join(f"`{line[:300]}`" for line in tail))
    text = " ".join(said)
    rule = next((r for r in rules if r.get("fix") and any(re.search(r["pattern"], line) for line in tail)), None)
    if rule:
        text += f" ({rule['means']}). Fix: {rule['fix']}"
    return text
