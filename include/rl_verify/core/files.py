"""Writing files so that a reader never sees half of one: the record's and the reports' files.

Plain local files (no Airflow, no object store): the record store (``rl_verify.store.record``) and the
report writer (``rl_verify.core.report``) both write through these.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

RECORD_FILE_MODE = 0o644


def write_atomic(path: Path, data: str | bytes) -> Path:
    """Write ``data`` to ``path`` so a reader sees the old file or the whole new one, never half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as fh:
            # mkstemp makes 0600; a record is read by the UI plugin and the team, like any file written.
            os.fchmod(fh.fileno(), RECORD_FILE_MODE)
            fh.write(data.encode("utf-8") if isinstance(data, str) else data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_json(path: Path, value: Any) -> Path:
    return write_atomic(path, json.dumps(value, indent=2, sort_keys=True, default=str) + "\n")


def read_json(path: Path) -> Any | None:
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else None
