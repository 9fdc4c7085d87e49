#!/usr/bin/env bash
# Create or update the project virtualenv (.venv) with the pinned requirements and the
# rl_verify package installed editable.
#
# Idempotent: a stamp file keyed on the hash of requirements*.txt + pyproject.toml makes a
# second run a no-op (well under a second). Set BOOTSTRAP_FORCE=1 to reinstall anyway.
#
# Installer: uv (pinned, installed into the venv) for speed; falls back to pip if uv fails
# (e.g. no route to PyPI from uv but a local pip index configured).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

VENV="${VENV:-$ROOT/.venv}"
PY="${PYTHON:-python3}"
UV_VERSION="0.13.9"
STAMP="$VENV/.rl-verify-bootstrap.stamp"

hash_inputs() {
    # Content hash of everything that determines the environment, plus the interpreter version.
    {
        for f in requirements.txt requirements-dev.txt pyproject.toml; do
            echo "== $f"
            cat "$f"
        done
        "$PY" -c 'import sys; print(sys.version)'
        echo "uv $UV_VERSION, bytecode compiled"
    } | sha256sum | cut -d' ' -f1
}

want="$(hash_inputs)"
if [[ -z "${BOOTSTRAP_FORCE:-}" && -x "$VENV/bin/python" && -f "$STAMP" && "$(cat "$STAMP")" == "$want" ]]; then
    echo "bootstrap: $VENV is up to date"
    exit 0
fi

start=$(date +%s)
if [[ ! -x "$VENV/bin/python" ]]; then
    echo "bootstrap: creating $VENV"
    "$PY" -m venv "$VENV"
fi
rm -f "$STAMP"

export PIP_DISABLE_PIP_VERSION_CHECK=1
reqs=(-r requirements.txt -r requirements-dev.txt -e .)

installed=""
if "$VENV/bin/python" -m pip install -q "uv==$UV_VERSION"; then
    echo "bootstrap: installing with uv $UV_VERSION"
    # Byte-compiled at install: with PYTHONDONTWRITEBYTECODE set (as on these machines) Python never writes a
    # .pyc, so every Airflow component, task process and checker would compile Airflow, pandas and SciPy from
    # source each time it starts (import airflow.sdk: 8.7 s without, 3.4 s with, on 2 cores).
    if "$VENV/bin/python" -m uv pip install --compile-bytecode --python "$VENV/bin/python" "${reqs[@]}"; then
        installed=uv
    else
        echo "bootstrap: uv failed, falling back to pip" >&2
    fi
else
    echo "bootstrap: could not install uv, falling back to pip" >&2
fi
if [[ -z "$installed" ]]; then
    "$VENV/bin/python" -m pip install "${reqs[@]}"
    installed=pip
fi
# uv compiles only what it installs: packages already in an older venv would stay without bytecode. compileall
# compiles what has none and only checks what has (a few seconds).
"$VENV/bin/python" -m compileall -q -j 0 "$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')" >/dev/null

# Sanity: the things the harness and the DAG need must import.
"$VENV/bin/python" - <<'PY'
import airflow, rl_verify  # noqa: F401
from airflow.providers.standard.operators.hitl import ApprovalOperator  # noqa: F401
from airflow.providers.ssh.hooks.ssh import SSHHook  # noqa: F401
print("bootstrap: airflow", airflow.__version__, "OK")
PY

echo "$want" > "$STAMP"
echo "bootstrap: done with $installed in $(( $(date +%s) - start ))s"
