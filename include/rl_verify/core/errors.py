"""Errors of the verification engine.

``InputError`` means "cannot evaluate": an input is missing or malformed, so no verdict can be
given (the CLI exits 2). Its message always names the file, the line where that applies, and what
to do about it, so the person reading a task log can act without opening the code.
"""

from __future__ import annotations

from pathlib import Path


class InputError(Exception):
    """Bad or missing input: no verdict possible (CLI exit status 2).

    ``str(err)`` reads ``"<file>[:<line>]: <problem>. Fix: <what to do>"``.
    """

    def __init__(self, problem: str, path: str | Path | None = None, line: int | None = None,
                 fix: str | None = None) -> None:
        self.problem = problem
        self.path = str(path) if path is not None else None
        self.line = line
        self.fix = fix
        super().__init__(self._render())

    def _render(self) -> str:
        where = ""
        if self.path is not None:
            where = self.path if self.line is None else f"{self.path}:{self.line}"
            where += ": "
        text = f"{where}{self.problem}"
        if self.fix:
            text += f". Fix: {self.fix}"
        return text


class CheckerError(InputError):
    """The checkout's own checker crashed or timed out (cannot evaluate, CLI exit status 2).

    A subclass of ``InputError`` on purpose: callers that only know ``InputError`` still treat it
    as "no verdict" rather than as a FAIL. ``stderr_tail`` holds the end of the checker's stderr.
    """

    def __init__(self, problem: str, path: str | Path | None = None, line: int | None = None,
                 fix: str | None = None, stderr_tail: str = "") -> None:
        self.stderr_tail = stderr_tail
        super().__init__(problem, path=path, line=line, fix=fix)

    def _render(self) -> str:
        text = super()._render()
        if self.stderr_tail:
            text += f"\n--- checker stderr (tail) ---\n{self.stderr_tail}"
        return text
