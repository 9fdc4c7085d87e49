"""The test stacks' migrated SQLite template (harness.airflow_stack): made once by a real ``airflow db migrate``,
then copied by every new SQLite stack instead of migrating its own."""
from __future__ import annotations

import sqlite3

import pytest

from harness import airflow_stack
from harness.airflow_stack import AirflowStack, copy_sqlite, migrated_sqlite_template

pytestmark = pytest.mark.integration


def _alembic_head(db) -> str:
    with sqlite3.connect(db) as conn:
        return conn.execute("select version_num from alembic_version").fetchone()[0]


def test_a_new_sqlite_stack_copies_one_template_migrated_once(tmp_path, monkeypatch):
    monkeypatch.setattr(airflow_stack, "DB_TEMPLATES", tmp_path / "templates")
    stack = AirflowStack(tmp_path / "state")
    stack.home.mkdir(parents=True)
    env = stack.build_env()
    log = tmp_path / "db.log"
    first = migrated_sqlite_template(stack.python, env, log)
    again = migrated_sqlite_template(stack.python, env, log)
    assert first == again and log.read_text().count("Database migration done") == 1
    assert sorted(p.name for p in first.parent.iterdir()) == [".lock", first.name]  # no partial copy left
    head = _alembic_head(first)
    for name in ("a.db", "b.db"):
        copy_sqlite(first, tmp_path / name)
        assert _alembic_head(tmp_path / name) == head
    with sqlite3.connect(tmp_path / "a.db") as conn:  # each copy is its own database
        conn.execute("delete from alembic_version")
    assert _alembic_head(tmp_path / "b.db") == head and _alembic_head(first) == head
