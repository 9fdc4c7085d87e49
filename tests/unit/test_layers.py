"""The package's layers are a contract (docs/ARCHITECTURE.md): checked by import-linter, with no import
circle, imports inside functions included, and only a few of those, each with its reason."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

import rl_verify

PACKAGE = Path(rl_verify.__file__).parent
REPO = PACKAGE.parents[1]
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"
#: In-function imports of package modules allowed at most (each keeps a heavy module out of DAG parsing).
MAX_LAZY_IMPORTS = 15


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(root: Path = PACKAGE) -> list[tuple[str, str, int, bool]]:
    """(importer, imported package module, line, inside a function) for every import statement of the
    package, ``if TYPE_CHECKING`` blocks included."""
    modules = {_module_name(p, root): p for p in root.rglob("*.py")}
    out = []
    for name, path in modules.items():
        tree = ast.parse(path.read_text())
        functions = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
        nested = {id(child) for f in functions for child in ast.walk(f)}
        for node in ast.walk(tree):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module
                           for a in node.names]
            for target in targets:
                while target not in modules and "." in target:
                    target = target.rsplit(".", 1)[0]
                if target in modules and target != name:
                    out.append((name, target, node.lineno, id(node) in nested))
    return out


def _cycles(edges: list[tuple[str, str, int, bool]]) -> list[list[str]]:
    graph = defaultdict(set)
    for a, b, _, _ in edges:
        graph[a].add(b)
    found, state = [], {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = "open"
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                found.append(path[path.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = "done"

    for start in sorted(graph):
        if start not in state:
            visit(start, [start])
    return found


def _lint_imports(root: Path, config: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(root.parent)}  # precedes the editable install's path
    return subprocess.run([str(LINT_IMPORTS), "--config", str(config), "--no-cache"], capture_output=True,
                          text=True, timeout=300, cwd=root.parent, env=env)


def test_the_layer_contract_holds():
    done = _lint_imports(PACKAGE, REPO / "pyproject.toml")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "0 broken" in done.stdout


@pytest.mark.parametrize("module,upward", [
    ("core/model.py", "from rl_verify.orchestration import nodes  # noqa"),
    ("engines/opd/compare.py", "def _late():\n    from rl_verify.store import baselines  # noqa\n"),
    ("engines/grpo/live.py", "from rl_verify.engines.opd.compare import wanted_at  # noqa"),
    ("engines/opd/__init__.py", "def _late():\n    from rl_verify.engines import grpo  # noqa\n"),
    ("core/calibration.py", "def _late():\n    from rl_verify.engines.opd import calibration  # noqa\n"),
    ("node/remote.py", "from rl_verify.store import record  # noqa"),
])
def test_an_import_of_a_higher_or_sibling_layer_breaks_the_contract(tmp_path, module, upward):
    copy = tmp_path / "include" / "rl_verify"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    with (copy / module).open("a") as fh:
        fh.write("\n" + upward + "\n")
    done = _lint_imports(copy, REPO / "pyproject.toml")
    assert done.returncode != 0 and "BROKEN" in done.stdout, done.stdout[-3000:]


def test_no_import_circle_with_imports_inside_functions_counted():
    assert _cycles(_imports()) == []


def test_in_function_package_imports_are_few_and_each_says_why():
    lazy = [(a, b, line) for a, b, line, nested in _imports() if nested]
    assert len(lazy) <= MAX_LAZY_IMPORTS, lazy
    for importer, _, line in lazy:
        path = PACKAGE.parent / importer.replace(".", "/")
        source = (path / "__init__.py" if path.is_dir() else path.with_suffix(".py")).read_text().splitlines()
        here, above = source[line - 1], source[line - 2]
        assert "#" in here or above.strip().startswith("#"), f"{importer}:{line} has no reason: {here.strip()}"


def test_the_engine_registry_imports_no_engine_implementation():
    from rl_verify import engines

    implementations = tuple(f"rl_verify.engines.{name}" for name in engines.names())

    def inside(module: str) -> bool:
        return module.startswith(tuple(f"{i}." for i in implementations)) or module in implementations

    imported = {b for a, b, _, _ in _imports() if a == "rl_verify.engines"}
    assert implementations and not [m for m in imported if inside(m)]
    # ... and no engine module imports the registry (it would be a circle through the dynamic import).
    assert not [a for a, b, _, _ in _imports() if inside(a) and b == "rl_verify.engines"]


def test_the_trigger_only_watches_it_imports_no_engine_spec_or_record_store():
    imported = {b for a, b, _, _ in _imports() if a == "rl_verify.orchestration.triggers"}
    assert not {m for m in imported if m.startswith(("rl_verify.engines", "rl_verify.store", "rl_verify.suites"))}


def test_settings_is_a_leaf_that_reads_no_file_and_never_raises_at_import(tmp_path):
    assert not [b for a, b, _, _ in _imports() if a == "rl_verify.settings"]
    source = (PACKAGE / "settings.py").read_text()
    assert not [word for word in ("open(", "read_text", "read_bytes", "json.load") if word in source]
    env = {**os.environ, "RL_VERIFY_JOB_POLL_INTERVAL_S": "soon", "RL_VERIFY_CLEANUP_RETRIES": "-2"}
    probe = ("import rl_verify.settings as s; "
             "print(s.JOB_POLL_INTERVAL_S, s.CLEANUP_RETRIES, len(s.PROBLEMS))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0 and done.stdout.split() == ["5", "6", "2"], done.stderr


def test_a_malformed_setting_is_the_dags_import_error_naming_it_and_the_fix(tmp_path):
    env = {**os.environ, "RL_VERIFY_JOB_POLL_INTERVAL_S": "soon", "AIRFLOW_HOME": str(tmp_path / "home"),
           "AIRFLOW__CORE__LOAD_EXAMPLES": "False"}
    probe = ("import json; from airflow.dag_processing.dagbag import DagBag; "
             f"bag = DagBag({str(REPO / 'dags')!r}); print(json.dumps(list(bag.import_errors.values())))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    errors = done.stdout.strip().splitlines()[-1]
    dag_files = len(list((REPO / "dags").glob("*.py")))
    assert dag_files == 4 and errors.count("RL_VERIFY_JOB_POLL_INTERVAL_S='soon': give an integer") == dag_files, errors
