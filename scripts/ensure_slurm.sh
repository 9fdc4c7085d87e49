#!/usr/bin/env bash
# Make sure the binaries of the private single-node Slurm exist (harness/slurm.py runs its own munged,
# slurmctld and slurmd as root with every file in a state folder; no system service is used):
# - slurmctld, slurmd, the clients (sbatch, squeue, scancel, sinfo, scontrol, sacct), munged and mungekey
#   (or munge 0.5.13's create-munge-key), and for accounting slurmdbd with MariaDB's server (mariadbd,
#   mariadb-install-db) present                     -> exit 0 (fast, no apt)
# - missing and we are root                        -> install Debian's slurmctld, slurmd, slurm-client, munge,
#                                                     slurmdbd, mariadb-server
# - missing and not root / no apt                  -> print what to install and exit 1
# The packages' postinst would start system munged/slurmctld/slurmd; policy-rc.d denies that during the install.
set -euo pipefail

BINARIES=(slurmctld slurmd sbatch squeue scancel sinfo scontrol sacct munged slurmdbd mariadbd mariadb-install-db)

# Print each missing binary (none: all present). The daemons live in /usr/sbin, which a non-root PATH may lack.
missing_binaries() {
    local bin
    for bin in "${BINARIES[@]}"; do
        have "$bin" || echo "$bin"
    done
    have mungekey || have create-munge-key || echo "mungekey"
}

have() {
    command -v "$1" >/dev/null 2>&1 || [[ -x "/usr/sbin/$1" ]] || [[ -x "/usr/bin/$1" ]]
}

mapfile -t missing < <(missing_binaries)
if ((${#missing[@]} == 0)); then
    echo "ensure_slurm: slurmctld, slurmd, slurm clients, munge, slurmdbd and MariaDB present"
    exit 0
fi

echo "ensure_slurm: missing ${missing[*]}"
# shellcheck source=scripts/lib_apt.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib_apt.sh"
apt_install_binaries ensure_slurm slurmctld slurmd slurm-client munge slurmdbd mariadb-server

mapfile -t missing < <(missing_binaries)
for bin in "${BINARIES[@]}" mungekey create-munge-key; do
    if have "$bin"; then
        echo "ensure_slurm: $bin: $(command -v "$bin" || echo "/usr/sbin/$bin")"
    fi
done
if ((${#missing[@]} == 0)); then
    echo "ensure_slurm: installed slurmctld slurmd slurm-client munge slurmdbd mariadb-server"
    exit 0
fi
echo "ensure_slurm: installation finished but still missing: ${missing[*]}" >&2
exit 1
