#!/usr/bin/env bash
# Submit one training job to Slurm from the login node (the Slurm launcher's run verb).
# Inputs (assigned by launcher.render before this text, validated in Python):
#   job_dir      the job's folder on the shared filesystem
#   job_exports  lines "export NAME='value'" (names validated, values quoted)
#   job_command  the job's command (one compound command, built by remote.job_command)
#   job_name     the Slurm job name (rlv.<run key>.<job>): how a retry finds a job an earlier try submitted
#   job_marker   the job marker value (<run key>/<job>) every process of the job inherits; marked() and
#                marker_env come from lib_marked.sh, rendered before this text
#   sbatch_args  array of sbatch options (partition, account, QOS, GRES, time limit)
# Writes job.sh and batch.sh in job_dir, submits batch.sh, records the job id in slurm_job_id.
# Prints "JOB <id> submitted" or "JOB <id> adopted" (a job of this name Slurm already holds: never a second one).
# Exit 5: sbatch refused the job (its words on stderr).
# shellcheck disable=SC2154  # the inputs are assigned by the prelude render writes
set -eu
mkdir -p "$job_dir"
if [ -s "$job_dir/slurm_job_id" ]; then echo "JOB $(cat "$job_dir/slurm_job_id") adopted"; exit 0; fi
existing=$(squeue -h --name="$job_name" -o '%i' 2>/dev/null | head -n 1)
if [ -n "$existing" ]; then
  echo "$existing" >"$job_dir/slurm_job_id"
  echo "JOB $existing adopted"
  exit 0
fi
: >"$job_dir/stdout.log"
printf '%s\n%s\n' "$job_exports" "$job_command" >"$job_dir/job.sh"
# The batch step carries marked() (lib_marked.sh) and the job's marker: processes that left the job's process
# tree (Ray's daemons, teacher servers started with setsid) escape what Slurm signals where it tracks processes by
# parentage (proctrack/linuxproc), and would hold the node's Ray port against the next job.
{
  echo '#!/usr/bin/env bash'
  printf 'marker_env=%q\njob=%q\n' "$marker_env" "$job_marker"
  declare -f marked
  cat <<'BATCH'
# The job's batch step: the job body with its output in stdout.log, then its exit code (reported, never
# trusted: the tracker decides). A job Slurm ends (scancel, preemption, time limit) writes none: its SIGTERM
# ends every process carrying the job's marker, then the step.
d=$1
end_job() {
  trap - TERM
  for p in $(marked "$job"); do kill -TERM "$p" 2>/dev/null; done
  for _ in 1 2 3 4 5 6 7 8 9 10; do [ -z "$(marked "$job")" ] && break; sleep 0.2; done
  for p in $(marked "$job"); do kill -KILL "$p" 2>/dev/null; done
  exit 143
}
if [ -e "$d/started" ]; then
  # Slurm started this batch step a second time in the job's folder (requeued after a node failure or a
  # preemption, or restarted by an admin): the training is never run twice; the end is recorded instead.
  [ -s "$d/scheduler_end" ] || echo "REQUEUED outside" >"$d/scheduler_end"
  echo "rl-verify: Slurm started job ${SLURM_JOB_ID:-?} again (restart ${SLURM_RESTART_COUNT:-?}): not rerun" >&2
  exit 1
fi
trap end_job TERM
date +%s >"$d/started"
bash "$d/job.sh" >"$d/stdout.log" 2>&1 &
wait "$!"
rc=$?
echo "$rc" >"$d/exit_code.tmp" && mv "$d/exit_code.tmp" "$d/exit_code"
exit "$rc"
BATCH
} >"$job_dir/batch.sh"
if ! id=$(sbatch --parsable "${sbatch_args[@]}" --job-name="$job_name" --output="$job_dir/slurm.out" \
    --chdir="$job_dir" "$job_dir/batch.sh" "$job_dir"); then
  exit 5
fi
id=${id%%;*}
echo "$id" >"$job_dir/slurm_job_id"
echo "JOB $id submitted"
