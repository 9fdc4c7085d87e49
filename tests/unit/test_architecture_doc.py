"""docs/ARCHITECTURE.md stays true: every DAG, module, function and task it names exists (issue 31: it once said
two DAG files where there were four, and named none of the bisection's modules)."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

from rl_verify import settings

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "include" / "rl_verify"
DOC = (REPO / "docs" / "ARCHITECTURE.md").read_text()
#: Where a dotted name of the page is looked up, in this order (the page drops the package's prefix).
PREFIXES = ("rl_verify.", "rl_verify.orchestration.", "rl_verify.core.", "rl_verify.engines.",
            "rl_verify.engines.base.", "rl_verify.node.", "rl_verify.store.", "rl_verify.suites.")
#: Backticked words of the page that are not the package's names (Airflow's, files, settings, placeholders).
NOT_OURS = re.compile(r"^(ObjectStoragePath|ApprovalOperator|RL_VERIFY_\w+|\[.*\]|\S*\.(json|md|toml|sh|py)|"
                      r"ray stop --force|\|)$")


def _ticked(text: str) -> list[str]:
    return re.findall(r"`([^`]+)`", text)


def _resolves(name: str) -> bool:
    for prefix in PREFIXES:
        parts = (prefix + name).split(".")
        for cut in range(len(parts), 1, -1):
            try:
                obj = importlib.import_module(".".join(parts[:cut]))
            except ImportError:
                continue
            try:
                for attr in parts[cut:]:
                    obj = getattr(obj, attr)
            except AttributeError:
                break
            return True
    return False


def test_every_dag_the_page_names_is_a_dag_file_and_every_dag_file_is_named():
    named = {w for w in _ticked(DOC) if re.fullmatch(r"rl_(accuracy|regression|baseline)_\w+", w)}
    files = {p.stem for p in (REPO / "dags").glob("rl_*.py")}
    assert named == files, (named, files)
    assert "four thin DAG files" in DOC and len(files) == 4


def test_every_module_of_the_layer_table_exists_in_its_folder():
    missing = []
    for row in DOC.splitlines():
        for folder, listed in re.findall(r"`(\w+)/`: ([^|]+)", row):
            for module in re.findall(r"`(\w+)`", re.sub(r"\([^)]*\)", "", listed)):
                if module == "__init__":
                    continue
                path = PACKAGE / folder / module
                if not (path.with_suffix(".py").exists() or (path / "__init__.py").exists()):
                    missing.append(f"{folder}/{module}")
    assert not missing, missing


def test_every_module_of_the_package_is_on_the_page():
    modules = {p.stem for sub in ("orchestration", "core", "store", "node", "engines")
               for p in (PACKAGE / sub).glob("*.py") if p.stem != "__init__"}
    ticked = {w.split(".")[0] for w in _ticked(DOC)} | {w.rsplit(".", 1)[-1] for w in _ticked(DOC)}
    assert not sorted(modules - ticked), sorted(modules - ticked)


def test_every_dotted_name_on_the_page_resolves_in_the_package():
    dotted = {w for w in _ticked(DOC) if re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+", w) and not NOT_OURS.match(w)}
    assert len(dotted) > 20
    assert not sorted(w for w in dotted if not _resolves(w)), sorted(w for w in dotted if not _resolves(w))


@pytest.mark.parametrize("suite", ["grpo", "opd"])
def test_every_task_of_the_run_table_is_a_task_of_the_verification_dag(suite):
    source = (PACKAGE / "orchestration" / "verification_dag.py").read_text()
    defined = set(re.findall(r"\bdef (\w+)\(", source)) | set(re.findall(r'task_id="(\w+)"', source))
    known = defined | settings.attempt_tasks(suite) | {settings.confirm_task(suite), settings.REPORT_TASK}
    table = DOC.split("## One verification run, task by task", 1)[1].split("\n## ", 1)[0]
    tasks = [w for row in table.splitlines() if row.startswith("| `")
             for w in _ticked(row.split("|")[1])]
    assert len(tasks) >= 14
    unknown = [t for t in tasks if t.replace("<suite>", suite).replace("-rK", "-r1") not in known]
    assert not unknown, unknown
