#!/usr/bin/env bash
# What the Slurm launcher needs of the cluster, asked from the login node before the card (one round trip with
# the inputs' check). Inputs (assigned by launcher.render, validated in Python):
#   partition  the partition        gpus  GPUs per job (0: no GRES)
#   test_args  array: the sbatch options a job of this run gets (partition, account, QOS, GRES, time)
# Prints "SLURMCMD<TAB>missing<TAB><command>" for a Slurm command not on PATH, then
# "PARTITION<TAB><avail or MISSING>", "SLOTS<TAB><jobs of this size the partition runs at once>" and
# "TESTONLY<TAB><sbatch's exit status><TAB><its words, one line>".
# shellcheck disable=SC2154  # the inputs are assigned by the prelude render writes
set -u
for c in sbatch squeue scancel sinfo; do
  command -v "$c" >/dev/null 2>&1 || printf 'SLURMCMD\tmissing\t%s\n' "$c"
done
command -v sinfo >/dev/null 2>&1 || exit 0
avail=$(sinfo -h -p "$partition" -o '%a' 2>/dev/null | sort -u | head -n 1)
printf 'PARTITION\t%s\n' "${avail:-MISSING}"
[ -n "$avail" ] || exit 0
# Each node's GPUs (GRES "gpu:16", "gpu:h100:8(S:0-1)"), counted once per node.
slots=0
while read -r node gres; do
  [ -n "$node" ] || continue
  n=$(printf '%s' "$gres" | tr ',' '\n' | sed -n 's/^gpu:\([^(]*:\)\{0,1\}\([0-9][0-9]*\).*/\2/p' | head -n 1)
  if [ "$gpus" -gt 0 ]; then slots=$((slots + ${n:-0} / gpus)); else slots=$((slots + 1)); fi
done < <(sinfo -h -N -p "$partition" -o '%N %G' 2>/dev/null | sort -u)
printf 'SLOTS\t%s\n' "$slots"
words=$(sbatch --test-only "${test_args[@]}" --wrap true 2>&1)
rc=$?
printf 'TESTONLY\t%s\t%s\n' "$rc" "$(printf '%s' "$words" | tr '\n\t' '  ' | cut -c1-400)"
exit 0
