"""The blocks Python executes as a unit (issue 53): a file's module body, each class body and each function body,
read from the file's own AST and the code the interpreter compiles from it. Standard library only: the node runs
this very source (``evidence_read.sh``) in the training's interpreter, so that what counts as observable is that
interpreter's own line table.

Why blocks and not lines: CPython reports a line only where it has bytecode, so ``else:``, ``try:``, ``finally:``,
blank lines, closing brackets and most continuation lines never appear in coverage data even when their code runs.
A block ran when any line inside it ran (a nested block ran only if its enclosing one did, so the enclosing one's
range includes it). Definition-time code (decorators, default values, annotations, the ``def``/``class`` line and a
signature's continuation lines) belongs to the enclosing block, which runs it at import or at definition. A block
whose body has no line the interpreter can report (a docstring-only function) is *unobservable*: a touched line in
it is judged by its enclosing block, up to the module (an unobservable module: the file cannot be judged).
"""

from __future__ import annotations

import ast
import types

#: One block: (first line, last line, index of the enclosing block or -1 for the module, observable).
#: Index 0 is always the module: (1, last line of the file, -1, observable).
Block = tuple[int, int, int, bool]


def blocks_of(source: str, filename: str = "<evidence>") -> list[Block] | None:
    """The file's blocks, the module first, each after its enclosing block; None when the source does not parse or
    compile (no evidence can be read for it)."""
    try:
        tree = ast.parse(source, filename)
        code = compile(source, filename, "exec", dont_inherit=True)
    except (SyntaxError, ValueError):
        return None
    reported = _reported_lines(code)
    last = max(len(source.splitlines()), 1)
    out: list[Block] = [(1, last, -1, bool(reported))]

    def visit(node: ast.AST, parent: int) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and child.body:
                start, end = child.body[0].lineno, child.end_lineno or child.body[-1].lineno
                out.append((start, end, parent, any(start <= n <= end for n in reported)))
                visit(child, len(out) - 1)
            else:
                visit(child, parent)

    visit(tree, 0)
    return out


def _reported_lines(code: types.CodeType) -> set[int]:
    """Every line some code object of the file can report to a tracer (its line table), nested code included."""
    lines = {n for _, _, n in code.co_lines() if n}
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            lines |= _reported_lines(const)
    return lines


def innermost(blocks: list[Block], line: int) -> int:
    """The index of the innermost block whose range holds ``line`` (0, the module, when none does)."""
    best = 0
    for i, (start, end, _, _) in enumerate(blocks[1:], 1):
        if start <= line <= end and (end - start) <= (blocks[best][1] - blocks[best][0]):
            best = i
    return best


def judged_block(blocks: list[Block], line: int) -> int | None:
    """The block whose run decides a change at ``line``: the innermost one, or the nearest enclosing observable one;
    None when not even the module is observable (the file cannot be judged)."""
    i = innermost(blocks, line)
    while i >= 0 and not blocks[i][3]:
        i = blocks[i][2]
    return i if i >= 0 else None


def body_range(source: str, qualname: str) -> tuple[int, int] | None:
    """The lines of the body of the function or method ``qualname`` (dotted: ``Class.method``, ``outer.inner``;
    a ``<locals>`` part is skipped) in ``source``: its first body line .. its last line, as ``blocks_of`` counts a
    block (the ``def`` line, decorators and signature are the enclosing block's). Where a name is defined more than
    once, the last definition (the one the name is bound to). None: no such function, or the source does not
    parse."""
    try:
        tree: ast.AST = ast.parse(source)
    except (SyntaxError, ValueError):
        return None
    parts = [p for p in qualname.split(".") if p and p != "<locals>"]
    node: ast.AST | None = tree
    for i, part in enumerate(parts):
        kinds: tuple[type, ...] = (ast.FunctionDef, ast.AsyncFunctionDef) if i == len(parts) - 1 else \
            (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
        found = [d for d in _definitions(node) if isinstance(d, kinds) and d.name == part] if node else []
        node = found[-1] if found else None
    if node is None or node is tree or not getattr(node, "body", None):
        return None
    body = node.body  # type: ignore[attr-defined]
    return body[0].lineno, node.end_lineno or body[-1].lineno  # type: ignore[attr-defined]


def _definitions(node: ast.AST) -> list[ast.AST]:
    """The functions and classes defined directly in ``node``'s body (inside ``if``/``try``/``with`` blocks too, not
    inside another function or class), in source order."""
    out: list[ast.AST] = []
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.append(child)
        elif isinstance(child, ast.stmt):
            out += _definitions(child)
    return out
