"""Which changed files of a checkout can move a suite's numbers (issue 33, the path-aware skip).

A suite states, as data, the paths of the checkout that can affect its experiment (``affects``) and the ones
that cannot (``unaffecting``); a diff that touches no affecting path cannot change what the suite measures.
Patterns are matched against the whole path relative to the checkout's root, with ``/`` separators:
``**`` is any number of whole folders (none included), ``*`` any characters but ``/``, ``?`` one such
character, ``[...]`` a class. The defaults are conservative: every path affects, except documentation,
Markdown, CI configuration and tests. Pure; standard library only.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from functools import lru_cache

#: Every path can affect a suite unless a pattern below says it cannot.
DEFAULT_AFFECTS: tuple[str, ...] = ("**",)
#: What cannot change a training's numbers: docs, Markdown, CI configuration, tests.
DEFAULT_UNAFFECTING: tuple[str, ...] = ("docs/**", "**/*.md", ".github/**", "tests/**")


class PatternError(ValueError):
    """A path pattern that cannot be matched as the module says; the message names the pattern and the fix."""


def pattern_problems(patterns: Sequence[str], field: str) -> list[str]:
    """Why each of ``patterns`` (the spec's ``field``) is not a usable pattern, one line each ([] when all are)."""
    problems = []
    for pattern in patterns:
        if not isinstance(pattern, str) or not pattern.strip():
            problems.append(f"{field}: {pattern!r} is empty; give a path pattern such as 'xtuner/**'")
        elif pattern.startswith("/") or "\\" in pattern:
            problems.append(f"{field}: {pattern!r} must be relative to the checkout's root with '/' separators, "
                            "e.g. 'xtuner/v1/rl/**'")
        elif any(part in ("..", ".") for part in pattern.split("/")):
            problems.append(f"{field}: {pattern!r} has a '.' or '..' folder; name the path as git lists it")
        elif pattern.count("[") != pattern.count("]"):
            problems.append(f"{field}: {pattern!r} has an unclosed '[' class")
    return problems


@lru_cache(maxsize=512)
def _regex(pattern: str) -> re.Pattern[str]:
    problems = pattern_problems([pattern], "pattern")
    if problems:
        raise PatternError(problems[0])
    out, i = [], 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out.append("(?:[^/]+/)*")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        elif pattern[i] == "[":
            end = pattern.index("]", i)
            negated = pattern[i + 1] == "!"
            body = pattern[i + 1 + negated:end]
            # Escaped but for '-', so that a range such as [0-9] stays a range.
            out.append("[" + "^" * negated + re.escape(body).replace("\\-", "-") + "]")
            i = end + 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return re.compile("".join(out))


def matches(path: str, patterns: Iterable[str]) -> bool:
    """Whether ``path`` (relative, ``/`` separators) matches one of ``patterns`` as a whole."""
    return any(_regex(p).fullmatch(path) for p in patterns)


#: Python the interpreter imports by name from the checkout's root, whatever a suite's rules say: the launch puts the
#: root first on the module path (XTuner's run_rl.sh: PYTHONPATH=$(pwd)), so a module or package there shadows any
#: import of its name (a new ``subprocess.py`` is every ``import subprocess``; issue 53's mutation benchmark).
SHADOWING: tuple[str, ...] = ("*.py", "*/__init__.py")


def affecting(changed: Iterable[str], affects: Sequence[str] = DEFAULT_AFFECTS,
              unaffecting: Sequence[str] = DEFAULT_UNAFFECTING) -> list[str]:
    """The changed files that can move the suite's numbers: those matching ``affects`` and no ``unaffecting``
    pattern, and every module or package at the checkout's root (``SHADOWING``), in the order given, each once. A
    renamed file is given under both its names by the caller, so a move out of an affecting folder still counts."""
    out = []
    for path in dict.fromkeys(changed):
        if (matches(path, affects) and not matches(path, unaffecting)) or matches(path, SHADOWING):
            out.append(path)
    return out


def stale(patterns: Iterable[str], tree: Iterable[str]) -> list[str]:
    """The ``patterns`` that match no path of ``tree`` (a checkout's files at one commit), in the order given: a
    rule naming paths the checkout does not have (code moved, a recipe not merged) decides nothing (issue 42)."""
    files = tree if isinstance(tree, (set, frozenset)) else set(tree)
    out = []
    for pattern in dict.fromkeys(patterns):
        if not any(c in pattern for c in "*?["):  # a plain path: one lookup
            if pattern not in files:
                out.append(pattern)
        elif not any(_regex(pattern).fullmatch(f) for f in files):
            out.append(pattern)
    return out
