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

# shellcheck source=scripts/lib_apt.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib_apt.sh"
apt_install_binaries ensure_sshd openssh-server

if [[ -x "$SSHD" ]]; then
    echo "ensure_sshd: installed $SSHD"
    exit 0
fi
echo "ensure_sshd: installation finished but $SSHD is still missing" >&2
exit 1
