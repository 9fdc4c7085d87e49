#!/usr/bin/env bash
# Stop one job, or every job of a run, through Slurm (the launcher's stop verb, and the run's cleanup).
# Inputs (assigned by launcher.render, validated in Python):
#   job_dirs   array of job folders whose recorded jobs to cancel
#   name_pre   a job-name prefix (rlv.<run key>.): every job Slurm holds by that name is cancelled too (one
#              whose id was never recorded); empty: none
#   wait_s     seconds to wait until Slurm shows none of them running
#   ended_as   what to record as the end of each job (scheduler_end: "PENDING <reason>" when the run gave up on
#              the queue); empty: the cancel is rl-verify's own stop
# Prints "SCANCEL <id> <name>", then "GONE <id> after <ms> ms" or "LEFT slurm job <id> <STATE>" per job, and
# "SLURMWAIT<TAB><ms>" once.
# shellcheck disable=SC2154  # the inputs are assigned by the prelude render writes
set -u
ids=()
for d in "${job_dirs[@]}"; do
  id=$(cat "$d/slurm_job_id" 2>/dev/null) || continue
  [ -n "$id" ] || continue
  : >"$d/stopped"  # a CANCELLED end is then ours, not someone else's
  if [ -n "$ended_as" ] && [ ! -s "$d/scheduler_end" ]; then echo "$ended_as" >"$d/scheduler_end"; fi
  ids+=("$id")
done
if [ -n "$name_pre" ]; then
  while read -r id name; do
    case "$name" in "$name_pre"*) ids+=("$id") ;; esac
  done < <(squeue -h -o '%i %j' 2>/dev/null)
fi
declare -A seen=()
todo=()
for id in "${ids[@]}"; do
  [ -n "${seen[$id]:-}" ] && continue
  seen[$id]=1
  if slurm_active "$id"; then
    scancel "$id" 2>/dev/null && echo "SCANCEL $id $(squeue -h -t all -j "$id" -o '%j' 2>/dev/null)"
    todo+=("$id")
  fi
done
t0=$(date +%s%N)
deadline=$((t0 + wait_s * 1000000000))
left=("${todo[@]}")
while [ "${#left[@]}" -gt 0 ] && [ "$(date +%s%N)" -lt "$deadline" ]; do
  still=()
  for id in "${left[@]}"; do
    if slurm_active "$id"; then still+=("$id"); else echo "GONE $id after $((($(date +%s%N) - t0) / 1000000)) ms"; fi
  done
  left=("${still[@]}")
  [ "${#left[@]}" -gt 0 ] && sleep 0.25
done
for id in "${left[@]}"; do
  echo "LEFT slurm job $id $(squeue -h -t all -j "$id" -o '%T' 2>/dev/null)"
done
printf 'SLURMWAIT\t%s\n' "$((($(date +%s%N) - t0) / 1000000))"
exit 0
