"""Mutation operators over the simulated checkout's Python (issue 53, item 8), for ``scripts/bench_mutation.py``.

Each mutant is a text edit of one file (and, for ``new-file``, a file added beside it): found with the file's own
AST and tokens, applied to the text, kept only when the result parses (the rest are counted as discarded).
Standard library only; deterministic (a seeded sample per operator and file).

Operators (``Mutant.op``):

* ``const/first``, ``const/cont``: a number or bool changed (n -> n + 1, x -> 1.5 x, True <-> False) on the first
  line of its statement, or on a continuation line of a multi-line one; ``string/first``, ``string/cont``: a
  string constant changed (not a docstring, not an f-string part);
* ``binop/first``, ``binop/cont``: an arithmetic, comparison, boolean or augmented-assignment operator changed
  (+ <-> -, * <-> /, < <-> <=, == <-> !=, and <-> or, += -> -=), by where its token is;
* ``else-elif``: ``else:`` -> ``elif False:`` / ``elif True:`` / ``elif step < 10:`` (when ``step`` is a name of
  the function);
* ``del/module``, ``del/class``, ``del/function``: a statement deleted (``pass`` when it was the body's only one);
* ``ins/module``, ``ins/class``, ``ins/function``: a statement inserted: neutral ones (``pass``, an assignment), a
  ``raise`` (where code runs), an effect on a parameter (``row`` perturbed, an extra ``noise`` draw, ``step``
  shifted); at module level a function rebound (``f = lambda *a, **k: None``, a wrapper, ``every_step = lambda
  step, row: row.__setitem__(...)``), also on the line between the two blank lines before a ``def``; at class level
  a method overridden (after it: effective; before it: shadowed by the original);
* ``decorator``: a decorator added (an identity one, one that makes the function a no-op), an existing one removed
  or its arguments changed;
* ``default``: a parameter's default value changed;
* ``new-file``: a new module imported at run time: a helper module and its import in a function, a rollout backend
  module the worker imports instead, or a file only (named after a standard-library module the scripts of its folder
  import: first on ``sys.path``, it shadows it; with no effect, a changed random draw, a changed ``repr``).

Mutants whose edit lies in a function that a ``multiprocessing`` Pool (or ``Process``, or an executor) runs in a
forked worker carry ``pool=True``; they are always kept by the sample (``POOL_CALLS``).
"""

from __future__ import annotations

import ast
import hashlib
import io
import random
import tokenize
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

#: The methods and keywords that hand a function to another process (a forked worker).
POOL_CALLS = {"map", "imap", "imap_unordered", "starmap", "apply_async", "apply", "map_async", "starmap_async",
              "submit"}
POOL_KEYWORDS = {"initializer", "target", "func"}
BINOPS = {ast.Add: ("+", "-"), ast.Sub: ("-", "+"), ast.Mult: ("*", "/"), ast.Div: ("/", "*"),
          ast.FloorDiv: ("//", "/"), ast.Mod: ("%", "//"), ast.Pow: ("**", "*")}
CMPOPS = {ast.Lt: ("<", "<="), ast.LtE: ("<=", "<"), ast.Gt: (">", ">="), ast.GtE: (">=", ">"),
          ast.Eq: ("==", "!="), ast.NotEq: ("!=", "==")}
AUGOPS = {ast.Add: ("+=", "-="), ast.Sub: ("-=", "+="), ast.Mult: ("*=", "/="), ast.Div: ("/=", "*=")}
#: Standard-library modules a new file can shadow, by the folder it lands in: that folder is sys.path[0] of a
#: script run from it (the trainer's cli/rl.py, the rollout worker, the teacher server), or is put first on
#: sys.path by train.py before it imports its siblings.
SHADOWS = {
    "xtuner/v1/train/cli": ("json", "queue", "argparse", "datetime", "threading", "runpy", "pathlib", "ast"),
    "xtuner/rlsim": ("functools", "random", "subprocess", "multiprocessing", "json", "argparse"),
    "xtuner/v1/rl/rollout": ("pathlib",),
    "": ("multiprocessing", "subprocess"),  # the checkout's root: train.py puts it on sys.path (XTuner's PYTHONPATH)
}
#: What a shadowing file does besides loading the real module: nothing, every random draw (``random.Random.uniform``,
#: the simulated noise's) changed, the draws after the LATE_DRAWS-th changed (a run's rows are drawn in step order,
#: about 10 draws a step: from step 5 or so), ``repr`` of floats changed (the rollout worker prints its factor with it).
SHADOW_EFFECTS = ("none", "rng", "rng-late", "repr")
LATE_DRAWS = 60
_SHADOW_HEAD = '''"""mutant: a new file named after the standard library's {name}: first on sys.path for the scripts
of this folder, it loads the real module in its place{what}."""
import _frozen_importlib as _bootstrap
import _frozen_importlib_external as _external
import os as _os
import sys as _sys

_here = _os.path.dirname(_os.path.abspath(__file__))
_spec = _external.PathFinder.find_spec(__name__, [p for p in _sys.path if _os.path.abspath(p or ".") != _here])
_real = _bootstrap.module_from_spec(_spec)
_sys.modules[__name__] = _real
_spec.loader.exec_module(_real)
'''
_SHADOW_RNG = '''import random as _random

_uniform = _random.Random.uniform
_calls = [0]


def _patched(self, a, b):
    _calls[0] += 1
    value = _uniform(self, a, b)
    return value * (1.0 + 1e-9) if _calls[0] > {after} else value


_random.Random.uniform = _patched
'''
_SHADOW_REPR = '''import builtins as _builtins

_repr = _builtins.repr
_builtins.repr = lambda o: _repr(o * 1.01) if type(o) is float else _repr(o)
'''
HELPER = "_mutant_helper"
_HELPER_TEXT = '''"""mutant: a helper module imported at run time."""


def touch(row):
    for key, value in list(row.items()):
        if isinstance(value, float):
            row[key] = value * {factor}
'''
BACKEND = "_mutant_backend"
_BACKEND_TEXT = '''"""mutant: a rollout backend module the worker imports at run time."""


def response_length_factor(step: int) -> float:
    return {expr}
'''


@dataclass(frozen=True)
class Mutant:
    """One mutant: ``files`` the new contents ((path, text), a new file included), ``line`` the edited line of
    ``path`` at the base (1-based), ``text`` what changed (one line)."""

    op: str
    path: str
    line: int
    text: str
    files: tuple[tuple[str, str], ...]
    pool: bool = False
    key: str = field(default="", compare=False)


def pool_targets(tree: ast.AST) -> set[str]:
    """The names of the functions a file hands to another process (``pool.apply(f, ...)``, ``Process(target=f)``,
    ``executor.submit(f)``, ``mod.f`` by its attribute): matched by name in every file mutated."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        if isinstance(node.func, ast.Attribute) and node.func.attr in POOL_CALLS and node.args:
            target = node.args[0]
            if isinstance(target, ast.Name):
                names.add(target.id)
            elif isinstance(target, ast.Attribute):
                names.add(target.attr)
        callee = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        if callee.endswith(("Pool", "Process", "Executor")):  # not a thread's target
            for kw in node.keywords:
                if kw.arg in POOL_KEYWORDS and isinstance(kw.value, (ast.Name, ast.Attribute)):
                    names.add(kw.value.id if isinstance(kw.value, ast.Name) else kw.value.attr)
    return names


class Source:
    """A file's text with AST positions (UTF-8 byte columns) turned into text offsets."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.lines = text.splitlines(keepends=True)
        self.starts = [0]
        for line in self.lines:
            self.starts.append(self.starts[-1] + len(line))

    def offset(self, lineno: int, col: int, byte_col: bool = True) -> int:
        line = self.lines[lineno - 1] if lineno - 1 < len(self.lines) else ""
        chars = len(line.encode()[:col].decode(errors="ignore")) if byte_col else col
        return self.starts[lineno - 1] + chars

    def node_span(self, node: ast.AST) -> tuple[int, int]:
        return (self.offset(node.lineno, node.col_offset),  # type: ignore[attr-defined]
                self.offset(node.end_lineno, node.end_col_offset))  # type: ignore[attr-defined]

    def line_text(self, lineno: int) -> str:
        return self.lines[lineno - 1].rstrip("\n") if 0 < lineno <= len(self.lines) else ""

    def replaced(self, start: int, end: int, new: str) -> str:
        return self.text[:start] + new + self.text[end:]


def _short(text: str, most: int = 100) -> str:
    text = " ".join(text.split())
    return text if len(text) <= most else text[: most - 3] + "..."


@dataclass
class _Scope:
    kind: str  # module, class, function
    func: ast.AST | None  # the innermost function (for its parameter names)


def _params(func: ast.AST | None) -> list[str]:
    if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return []
    a = func.args
    return [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs]


def _bodies(node: ast.AST) -> Iterator[list[ast.stmt]]:
    for name in ("body", "orelse", "finalbody"):
        body = getattr(node, name, None)
        if isinstance(body, list) and body and isinstance(body[0], ast.stmt):
            yield body
    for handler in getattr(node, "handlers", []) or []:
        yield handler.body
    for case in getattr(node, "cases", []) or []:
        yield case.body


def _first_line(stmt: ast.stmt) -> int:
    decorators = getattr(stmt, "decorator_list", None) or []
    return min([stmt.lineno] + [d.lineno for d in decorators])


def _is_docstring(stmt: ast.stmt, body: list[ast.stmt]) -> bool:
    return (stmt is body[0] and isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)
            and isinstance(stmt.value.value, str))


class FileMutants:
    """Every candidate mutant of one file (before sampling), and how many did not parse per operator."""

    def __init__(self, path: str, text: str, pool_targets: set[str] = frozenset()) -> None:  # type: ignore[assignment]
        self.path = path
        self.src = Source(text)
        self.tree = ast.parse(text)
        self.tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
        self.out: list[Mutant] = []
        self.pool_ranges = [(n.lineno, n.end_lineno or n.lineno) for n in ast.walk(self.tree)
                            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name in pool_targets]
        #: statement -> scope, expression node -> its statement
        self.stmt_of: dict[int, ast.stmt] = {}
        self.scope_of: dict[int, _Scope] = {}
        self.blocks: list[tuple[list[ast.stmt], _Scope]] = []
        self._index(self.tree, _Scope("module", None))

    # ------------------------------------------------------------------------------------------------
    def _index(self, node: ast.AST, scope: _Scope) -> None:
        for body in _bodies(node):
            self.blocks.append((body, scope))
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.stmt):
                self.scope_of[id(child)] = scope
                self._index_exprs(child, child)
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    self._index(child, _Scope("function", child))
                elif isinstance(child, ast.ClassDef):
                    self._index(child, _Scope("class", scope.func))
                else:
                    self._index(child, scope)

    def _index_exprs(self, node: ast.AST, stmt: ast.stmt) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.stmt):
                continue
            self.stmt_of[id(child)] = stmt
            self._index_exprs(child, stmt)

    def in_pool(self, line: int) -> bool:
        return any(a <= line <= b for a, b in self.pool_ranges)

    def add(self, op: str, line: int, new_text: str, what: str, extra: tuple[tuple[str, str], ...] = ()) -> None:
        """A candidate (whether it parses is checked when the sample takes it: :func:`parses`)."""
        if new_text == self.src.text and not extra:
            return
        self.out.append(Mutant(op, self.path, line, _short(what), ((self.path, new_text),) + extra,
                               self.in_pool(line)))

    # ------------------------------------------------------------------------------------------------
    def all(self) -> list[Mutant]:
        self.constants()
        self.operators()
        self.else_elif()
        self.deletions()
        self.insertions()
        self.decorators()
        self.defaults()
        self.new_files()
        return self.out

    def _where(self, node: ast.AST, line: int) -> str:
        stmt = self.stmt_of.get(id(node))
        return "cont" if stmt is not None and line > stmt.lineno else "first"

    def _def_parts(self) -> tuple[set[int], set[int]]:
        """The ids of expression nodes inside default values and inside decorators."""
        defaults: set[int] = set()
        decorators: set[int] = set()
        for node in ast.walk(self.tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                for d in list(node.args.defaults) + [d for d in node.args.kw_defaults if d is not None]:
                    defaults.update(id(n) for n in ast.walk(d))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                for d in node.decorator_list:
                    decorators.update(id(n) for n in ast.walk(d))
        return defaults, decorators

    def _docstrings(self) -> set[int]:
        out = set()
        for body, _ in self.blocks:
            if _is_docstring(body[0], body):
                out.add(id(body[0].value))  # type: ignore[attr-defined]
        if self.tree.body and _is_docstring(self.tree.body[0], self.tree.body):
            out.add(id(self.tree.body[0].value))  # type: ignore[attr-defined]
        return out

    @staticmethod
    def changed_constant(value: object) -> object | None:
        if isinstance(value, bool):
            return not value
        if isinstance(value, int):
            return value + 1
        if isinstance(value, float):
            return value * 1.5 if value else 0.5
        if isinstance(value, str):
            return value + "_m"
        if value is None:
            return 0
        return None

    def constants(self) -> None:
        defaults, decorators = self._def_parts()
        docstrings = self._docstrings()
        in_fstring = {id(n) for j in ast.walk(self.tree) if isinstance(j, ast.JoinedStr) for n in ast.walk(j)}
        for node in ast.walk(self.tree):
            if not isinstance(node, ast.Constant) or id(node) in docstrings or id(node) in in_fstring:
                continue
            if id(node) in defaults:
                continue  # the default operator's
            new = self.changed_constant(node.value)
            if new is None or node.value is None:
                continue
            start, end = self.src.node_span(node)
            segment = self.src.text[start:end]
            if "\n" in segment:
                continue
            try:
                if ast.literal_eval(segment) != node.value:
                    continue  # implicit concatenation or another spelling
            except (ValueError, SyntaxError):
                continue
            kind = "string" if isinstance(node.value, str) else "const"
            op = "decorator" if id(node) in decorators else f"{kind}/{self._where(node, node.lineno)}"
            self.add(op, node.lineno, self.src.replaced(start, end, repr(new)), f"{segment} -> {new!r}")

    def _token_between(self, start: tuple[int, int], end: tuple[int, int],
                       strings: set[str]) -> tokenize.TokenInfo | None:
        for tok in self.tokens:
            if tok.type in (tokenize.OP, tokenize.NAME) and tok.string in strings and start <= tok.start and \
                    tok.end <= end:
                return tok
        return None

    def _char_pos(self, lineno: int, col: int) -> tuple[int, int]:
        return lineno, self.src.offset(lineno, col) - self.src.starts[lineno - 1]

    def _swap(self, node: ast.AST, left: ast.AST, right: ast.AST, old: str, new: str, family: str = "binop") -> None:
        tok = self._token_between(self._char_pos(left.end_lineno, left.end_col_offset),  # type: ignore[attr-defined]
                                  self._char_pos(right.lineno, right.col_offset), {old})  # type: ignore[attr-defined]
        if tok is None:
            return
        start = self.src.starts[tok.start[0] - 1] + tok.start[1]
        end = self.src.starts[tok.end[0] - 1] + tok.end[1]
        line = tok.start[0]
        self.add(f"{family}/{self._where(node, line)}", line, self.src.replaced(start, end, new),
                 f"{self.src.line_text(line).strip()}: {old} -> {new}")

    def operators(self) -> None:
        for node in ast.walk(self.tree):
            if isinstance(node, ast.BinOp) and type(node.op) in BINOPS:
                old, new = BINOPS[type(node.op)]
                self._swap(node, node.left, node.right, old, new)
            elif isinstance(node, ast.Compare):
                left = node.left
                for op, right in zip(node.ops, node.comparators):
                    if type(op) in CMPOPS:
                        old, new = CMPOPS[type(op)]
                        self._swap(node, left, right, old, new)
                    left = right
            elif isinstance(node, ast.BoolOp):
                old, new = ("and", "or") if isinstance(node.op, ast.And) else ("or", "and")
                self._swap(node, node.values[0], node.values[1], old, new)
            elif isinstance(node, ast.AugAssign) and type(node.op) in AUGOPS:
                old, new = AUGOPS[type(node.op)]
                self._swap(node, node.target, node.value, old, new)

    def else_elif(self) -> None:
        for node in ast.walk(self.tree):
            if not isinstance(node, ast.If) or not node.orelse:
                continue
            last, first = node.body[-1], node.orelse[0]
            tok = self._token_between(self._char_pos(last.end_lineno, last.end_col_offset),
                                      self._char_pos(_first_line(first), 0), {"else"})
            if tok is None:
                continue  # an elif
            start = self.src.starts[tok.start[0] - 1] + tok.start[1]
            end = start + len("else")
            scope = self.scope_of.get(id(node))
            conds = ["False", "True"]
            func = scope.func if scope else None
            if func is not None and "step" in {n.id for n in ast.walk(func) if isinstance(n, ast.Name)} | \
                    set(_params(func)):
                conds.append("step < 10")
            for cond in conds:
                self.add("else-elif", tok.start[0], self.src.replaced(start, end, f"elif {cond}"),
                         f"else: -> elif {cond}:")

    def _lines_of(self, stmt: ast.stmt) -> tuple[int, int]:
        return _first_line(stmt), stmt.end_lineno or stmt.lineno

    def _shares_line(self, stmt: ast.stmt, body: list[ast.stmt]) -> bool:
        a, b = self._lines_of(stmt)
        for other in body:
            if other is stmt:
                continue
            c, d = self._lines_of(other)
            if not (d < a or c > b):
                return True
        # a compound header on the same line (if x: stmt)
        line = self.src.line_text(a)
        return not line[: stmt.col_offset].strip() == "" if stmt.col_offset else False

    def deletions(self) -> None:
        for body, scope in self.blocks:
            for stmt in body:
                if self._shares_line(stmt, body):
                    continue
                a, b = self._lines_of(stmt)
                start, end = self.src.starts[a - 1], self.src.starts[b]
                new = " " * stmt.col_offset + "pass\n" if len(body) == 1 else ""
                self.add(f"del/{scope.kind}", a, self.src.replaced(start, end, new),
                         f"deleted: {self.src.line_text(a).strip()}")

    def _insert(self, op: str, line: int, at: int, indent: int, stmt_text: str, where: str) -> None:
        """``stmt_text`` (one or more lines, unindented) inserted before line ``at`` (1-based; len + 1: at the end);
        ``line``: the base line it is reported at."""
        block = "".join(" " * indent + part + "\n" for part in stmt_text.split("\n"))
        offset = self.src.starts[at - 1] if at - 1 < len(self.src.starts) else len(self.src.text)
        self.add(op, line, self.src.text[:offset] + block + self.src.text[offset:], f"{where}: + {stmt_text}")

    def _effects(self, func: ast.AST | None) -> list[str]:
        params = _params(func)
        out = ["pass", 'raise RuntimeError("mutant")']
        if "row" in params:
            out.append("row.update({_k: _v * 1.01 for _k, _v in row.items() if isinstance(_v, float)})")
        if "noise" in params:
            out.append("noise.u(1.0)")
        if "step" in params:
            out.append("step = step + 1")
        return out

    def insertions(self) -> None:
        module_funcs = [s for s in self.tree.body if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef))]
        for body, scope in self.blocks:
            if body is self.tree.body:
                continue
            if scope.kind == "class":
                continue
            kind = "function" if scope.kind == "function" else "module"
            templates = self._effects(scope.func) if kind == "function" else ["_mutant = 0"]
            positions = [(s, _first_line(s), s.col_offset) for s in body]
            last = body[-1]
            positions.append((last, (last.end_lineno or last.lineno) + 1, last.col_offset))
            for stmt, at, indent in positions:
                for text in templates:
                    self._insert(f"ins/{kind}", min(at, len(self.src.lines)), at, indent, text,
                                 f"line {at}")
        # class level: a neutral attribute, a method overridden after (effective) or before (shadowed) its def
        for node in ast.walk(self.tree):
            if not isinstance(node, ast.ClassDef):
                continue
            methods = [s for s in node.body if isinstance(s, ast.FunctionDef)]
            first = node.body[0]
            indent = first.col_offset
            end_at = (node.end_lineno or node.lineno) + 1
            self._insert("ins/class", _first_line(first), _first_line(first), indent, "_mutant = 0", "class start")
            for m in methods:
                text = f"def {m.name}(self, *args, **kwargs):\n    return None"
                self._insert("ins/class", end_at - 1, end_at, indent, text, f"after {node.name}.{m.name}")
                self._insert("ins/class", _first_line(m), _first_line(m), indent, text, f"before {node.name}.{m.name}")
        # module level: neutral statements, functions rebound after their def (also between the blank lines)
        for stmt in self.tree.body:
            self._insert("ins/module", _first_line(stmt), _first_line(stmt), 0, "_mutant = 0",
                         f"before line {_first_line(stmt)}")
        names = {n.id for n in ast.walk(self.tree) if isinstance(n, ast.Name)}
        for i, stmt in enumerate(self.tree.body):
            if not isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) or i == 0:
                continue
            first = _first_line(stmt)
            blank = [n for n in (first - 2, first - 1) if n >= 1 and not self.src.line_text(n).strip()]
            earlier = [f for f in module_funcs if (f.end_lineno or 0) < first]
            if len(blank) != 2 or not earlier:
                continue
            for f in earlier[-3:]:  # the functions just above: rebound between the two blank lines
                for text in self._rebinds(f, names):
                    self._insert("ins/module", first - 1, first - 1, 0, text, f"between the blank lines before "
                                 f"line {first}")
        for f in module_funcs:
            at = (f.end_lineno or f.lineno) + 1
            for text in self._rebinds(f, names):
                self._insert("ins/module", min(at, len(self.src.lines)), at, 0, text, f"after def {f.name}")

    def _rebinds(self, f: ast.FunctionDef | ast.AsyncFunctionDef, names: set[str]) -> list[str]:
        params = _params(f)
        out = [f"{f.name} = lambda *a, **k: None",
               f"{f.name} = (lambda _f: lambda *a, **k: _f(*a, **k))({f.name})",
               f"{f.name} = (lambda _f: lambda *a, **k: (lambda _r: _r * 1.01 if isinstance(_r, float) else _r)"
               f"(_f(*a, **k)))({f.name})"]
        if "row" in params:
            i = params.index("row")
            out.append(f"{f.name} = (lambda _f: lambda *a, **k: (_f(*a, **k), a[{i}].update({{_k: _v * 1.01 for _k, "
                       f"_v in a[{i}].items() if isinstance(_v, float)}}))[0])({f.name})")
            if params[:2] == ["step", "row"] and "REWARDS" in names:
                out.append(f"{f.name} = lambda step, row: row.__setitem__(REWARDS, row[REWARDS] * 1.01)")
        return out

    def decorators(self) -> None:
        for node in ast.walk(self.tree):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            at, indent = _first_line(node), node.col_offset
            for deco in ("@(lambda f: f)", "@(lambda f: lambda *a, **k: None)"):
                self._insert("decorator", node.lineno, at, indent, deco, f"def {node.name}")
            for d in node.decorator_list:
                a, b = d.lineno, d.end_lineno or d.lineno
                start, end = self.src.starts[a - 1], self.src.starts[b]
                self.add("decorator", a, self.src.replaced(start, end, ""),
                         f"removed @{self.src.line_text(a).strip().lstrip('@')}")

    def defaults(self) -> None:
        for node in ast.walk(self.tree):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                continue
            for d in list(node.args.defaults) + [d for d in node.args.kw_defaults if d is not None]:
                start, end = self.src.node_span(d)
                segment = self.src.text[start:end]
                if isinstance(d, ast.Constant):
                    new = self.changed_constant(d.value)
                    if new is None:
                        continue
                    text = repr(new)
                else:
                    text = "None"
                self.add("default", d.lineno, self.src.replaced(start, end, text), f"default {segment} -> {text}")

    def new_files(self) -> None:
        folder = str(Path(self.path).parent)
        if self.path.startswith("xtuner/rlsim/") and self.path.endswith(".py"):
            for body, scope in self.blocks:
                func = scope.func
                if scope.kind != "function" or "row" not in _params(func) or body is not getattr(func, "body", None):
                    continue
                stmt = body[1] if _is_docstring(body[0], body) and len(body) > 1 else body[0]
                for factor in ("1.0", "1.01"):
                    helper = (f"{folder}/{HELPER}.py", _HELPER_TEXT.format(factor=factor))
                    self._insert_with("new-file", stmt, f"import {HELPER}\n{HELPER}.touch(row)", (helper,),
                                      f"new {HELPER}.py (x{factor}), imported in {func.name}")  # type: ignore
        if self.path.endswith("rollout/worker.py"):
            for node in ast.walk(self.tree):
                if isinstance(node, ast.Import) and node.names[0].asname == "backend":
                    for expr in ("1.0", "1.01", "1.01 if step >= 10 else 1.0"):
                        extra = ((f"{folder}/{BACKEND}.py", _BACKEND_TEXT.format(expr=expr)),)
                        start, end = self.src.node_span(node)
                        self.add("new-file", node.lineno,
                                 self.src.replaced(start, end, f"import {BACKEND} as backend"),
                                 f"import {node.names[0].name} -> new {BACKEND}.py returning {expr}", extra)

    def _insert_with(self, op: str, stmt: ast.stmt, text: str, extra: tuple[tuple[str, str], ...], what: str) -> None:
        at, indent = _first_line(stmt), stmt.col_offset
        block = "".join(" " * indent + part + "\n" for part in text.split("\n"))
        offset = self.src.starts[at - 1]
        self.add(op, at, self.src.text[:offset] + block + self.src.text[offset:], what, extra)


def shadow_mutants(present: set[str]) -> list[Mutant]:
    """New files only (no other edit): a standard-library module's name in a folder whose scripts import it."""
    out = []
    for folder, modules in SHADOWS.items():
        for name in modules:
            path = f"{folder}/{name}.py" if folder else f"{name}.py"
            if path in present:
                continue
            for effect in SHADOW_EFFECTS:
                what = {"none": "", "rng": ", and changes every random draw",
                        "rng-late": f", and changes random draws after the {LATE_DRAWS}th",
                        "repr": ", and changes repr() of floats"}[effect]
                text = _SHADOW_HEAD.format(name=name, what=what)
                if effect.startswith("rng"):
                    text += "\n\n" + _SHADOW_RNG.format(after=LATE_DRAWS if effect == "rng-late" else 0)
                elif effect == "repr":
                    text += "\n" + _SHADOW_REPR
                ast.parse(text)
                out.append(Mutant("new-file", path, 1, f"new file {path} ({effect})", ((path, text),)))
    return out


def parses(m: Mutant) -> bool:
    """Whether every Python file the mutant writes parses."""
    try:
        for path, text in m.files:
            if path.endswith(".py"):
                ast.parse(text)
    except SyntaxError:
        return False
    return True


def generate(root: Path, files: Sequence[str], seed: int = 0, per_group: int | None = 60, limit: int | None = None,
             shadows: bool = True) -> tuple[list[Mutant], dict[str, int], dict[str, int]]:
    """Mutants of ``files`` (checkout-relative) under ``root`` and (``shadows``) the shadowing new files: per
    (operator, file) a seeded sample of at most ``per_group`` (None: all; those in a Pool worker's function all
    kept), of which ``limit`` (a seeded sample of the whole, for quick runs); a candidate that does not parse is
    counted as discarded and replaced by its group's next. Each mutant's key is a hash of its files (stable across
    runs). Returns the mutants (by file and line), the discarded and the candidates per operator."""
    rng = random.Random(seed)
    groups: dict[tuple[str, str], list[Mutant]] = {}
    targets: set[str] = set()
    for rel in files:
        targets |= pool_targets(ast.parse((root / rel).read_text()))
    for rel in files:
        for m in FileMutants(rel, (root / rel).read_text(), targets).all():
            groups.setdefault((m.op, m.path), []).append(m)
    present = {str(p.relative_to(root)) for p in root.rglob("*.py")}
    for m in shadow_mutants(present) if shadows else []:
        groups.setdefault((m.op, m.path), []).append(m)
    candidates: dict[str, int] = {}
    order: dict[tuple[str, str], list[Mutant]] = {}
    taken: list[tuple[tuple[str, str], int]] = []
    for group, ms in sorted(groups.items()):
        candidates[group[0]] = candidates.get(group[0], 0) + len(ms)
        unique = list({m.files: m for m in ms}.values())  # two operators' identical edits count once
        pool = [m for m in unique if m.pool]
        rest = [m for m in unique if not m.pool]
        rng.shuffle(rest)
        order[group] = pool + rest
        cap = len(order[group]) if per_group is None else min(len(order[group]), len(pool) + per_group)
        taken += [(group, i) for i in range(cap)]
    if limit is not None and limit < len(taken):
        taken = rng.sample(taken, limit)
    following = {group: max([i for g, i in taken if g == group], default=-1) + 1 for group in order}
    discarded: dict[str, int] = {}
    chosen: list[Mutant] = []
    queue = sorted(taken, reverse=True)
    while queue:
        group, i = queue.pop()
        m = order[group][i]
        if parses(m):
            chosen.append(m)
            continue
        discarded[m.op] = discarded.get(m.op, 0) + 1
        if following[group] < len(order[group]):
            queue.append((group, following[group]))
            following[group] += 1
    chosen.sort(key=lambda m: (m.path, m.line, m.op, m.text))
    out = []
    for m in chosen:
        digest = hashlib.sha1(repr(m.files).encode()).hexdigest()[:10]
        out.append(Mutant(m.op, m.path, m.line, m.text, m.files, m.pool, key=f"m{digest}"))
    return out, discarded, candidates
