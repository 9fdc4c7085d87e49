#!/usr/bin/env bash
# Make sure the simulated GPU node (simulator/node.py) has what a real node needs of this machine:
# - OpenSSH's server binary (/usr/sbin/sshd): Debian's openssh-server;
# - coverage.py in the node's interpreter (/usr/bin/python3), to record the checkout lines a training runs when a
#   bitwise reference is made (issue 44: executed-code evidence): Debian's python3-coverage.
# Each present -> nothing to do; missing and we are root -> installed with apt-get; missing and not root / no apt ->
# print what to install and exit 1.
# The sshd package's postinst may try to start a system sshd; we do not want one, so the install
# runs with policy-rc.d denying service starts (the simulator runs its own sshd on 127.0.0.1).
set -euo pipefail

SSHD=/usr/sbin/sshd
NODE_PYTHON=/usr/bin/python3
need=()
if [[ -x "$SSHD" ]]; then
    echo "ensure_sshd: $SSHD present"
else
    need+=(openssh-server)
fi
if [[ -x "$NODE_PYTHON" ]] && ! "$NODE_PYTHON" -c 'import coverage' >/dev/null 2>&1; then
    need+=(python3-coverage)
fi
((${#need[@]})) || exit 0

# shellcheck source=scripts/lib_apt.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib_apt.sh"
apt_install_binaries ensure_sshd "${need[@]}"

if [[ ! -x "$SSHD" ]]; then
    echo "ensure_sshd: installation finished but $SSHD is still missing" >&2
    exit 1
fi
if [[ -x "$NODE_PYTHON" ]] && ! "$NODE_PYTHON" -c 'import coverage' >/dev/null 2>&1; then
    echo "ensure_sshd: installation finished but $NODE_PYTHON cannot import coverage" >&2
    exit 1
fi
echo "ensure_sshd: installed ${need[*]}"
