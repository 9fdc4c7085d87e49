#!/usr/bin/env bash
# Make sure OpenSSH's server binary exists for the simulated GPU node (simulator/node.py).
# - /usr/sbin/sshd present        -> exit 0
# - missing and we are root        -> install Debian's openssh-server with apt-get, exit 0 on success
# - missing and not root / no apt  -> print what to install and exit 1
# The package's postinst may try to start a system sshd; we do not want one, so the install
# runs with policy-rc.d denying service starts (the simulator runs its own sshd on 127.0.0.1).
set -euo pipefail

SSHD=/usr/sbin/sshd
if [[ -x "$SSHD" ]]; then
    echo "ensure_sshd: $SSHD present"
    exit 0
fi

if [[ "$(id -u)" -ne 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
    echo "ensure_sshd: $SSHD is missing." >&2
    echo "  Install OpenSSH's server, e.g. (Debian/Ubuntu): sudo apt-get install -y openssh-server" >&2
    echo "  The simulated GPU node runs its own sshd on 127.0.0.1; no system service is needed." >&2
    exit 1
fi

policy=/usr/sbin/policy-rc.d
created_policy=0
if [[ ! -e "$policy" ]]; then
    # Deny service starts during the install: we only want the binary.
    printf '#!/bin/sh\nexit 101\n' >"$policy"
    chmod +x "$policy"
    created_policy=1
fi
# shellcheck disable=SC2329  # invoked by the EXIT trap below
cleanup() { if [[ "$created_policy" -eq 1 ]]; then rm -f "$policy"; fi; }
trap cleanup EXIT

export DEBIAN_FRONTEND=noninteractive
apt-get update -q
apt-get install -y -q --no-install-recommends openssh-server

if [[ -x "$SSHD" ]]; then
    echo "ensure_sshd: installed $SSHD"
    exit 0
fi
echo "ensure_sshd: installation finished but $SSHD is still missing" >&2
exit 1
