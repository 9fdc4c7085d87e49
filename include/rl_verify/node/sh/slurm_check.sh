#!/usr/bin/env bash
# What the Slurm launcher needs of the cluster, asked from the login node before the card (one round trip with
# the inputs' check). Inputs (assigned by launcher.render, validated in Python):
#   partition  the partition        gpus  GPUs per job (0: no GRES)
#   gpu_type   the GRES type a job asks for ("" any)     exclusive  1: a job takes its node whole
#   test_args  array: the sbatch options a job of this run gets (partition, account, QOS, GRES, time)
# Prints "SLURMCMD<TAB>missing<TAB><command>" for a Slurm command not on PATH, then
# "PARTITION<TAB><avail or MISSING>", "SLOTS<TAB><jobs of this size the partition runs at once>",
# "UNUSABLE<TAB><nodes drained, down, ... that count for nothing>" and
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
# Each usable node's GPUs, every GRES entry counted ("gpu:8", "gpu:h100:8(S:0-1),gpu:a100:2"; of gpu_type only where
# it is set), once per node. Drained, draining, down, failed, in maintenance, reserved and not-responding nodes
# (a "*" after the state) start no job: they are no slot. With exclusive, a node runs one job at a time.
slots=0
unusable=0
while IFS='|' read -r node gres nstate; do
  [ -n "$node" ] || continue
  case "$nstate" in
    *'*'* | down* | drain* | drng* | fail* | maint* | resv* | unk* | inval* | boot* | pow* | npc* | reboot*)
      unusable=$((unusable + 1)); continue ;;
  esac
  n=0
  while read -r entry; do
    [ -n "$entry" ] || continue
    entry=${entry%%(*}
    IFS=: read -r kind a b <<<"$entry"
    [ "$kind" = gpu ] || continue
    if [ -n "$b" ]; then type=$a; count=$b; else type=; count=$a; fi
    case "$count" in '' | *[!0-9]*) continue ;; esac
    if [ -n "$gpu_type" ] && [ "$type" != "$gpu_type" ]; then continue; fi
    n=$((n + count))
  done < <(printf '%s\n' "$gres" | tr ',' '\n')
  if [ "$gpus" -gt 0 ]; then per=$((n / gpus)); else per=1; fi
  if [ "$exclusive" -eq 1 ] && [ "$per" -gt 1 ]; then per=1; fi
  slots=$((slots + per))
done < <(sinfo -h -N -p "$partition" -o '%N|%G|%t' 2>/dev/null | sort -u)
printf 'SLOTS\t%s\n' "$slots"
printf 'UNUSABLE\t%s\n' "$unusable"
words=$(sbatch --test-only "${test_args[@]}" --wrap true 2>&1)
rc=$?
printf 'TESTONLY\t%s\t%s\n' "$rc" "$(printf '%s' "$words" | tr '\n\t' '  ' | cut -c1-400)"
exit 0
