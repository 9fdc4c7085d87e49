#!/usr/bin/env bash
# Library prepended (rendered) by node/launcher.py to the Slurm launcher's scripts, which run on the login node.
#
# A Slurm job's folder (on the shared filesystem) holds slurm_job_id (what sbatch answered), started (written by
# the batch step when it runs), stdout.log and exit_code (the job's own, when its body ended), stopped (written
# before rl-verify cancels it) and scheduler_end (what Slurm said of a job that ended without its exit code).
# shellcheck disable=SC2329  # called by the template this library is prepended to

# slurm_of JOB_DIR: "<STATE> <reason>" of the job as Slurm knows it, "GONE -" once Slurm forgot it (MinJobAge
# after its end, accounting off), "NONE -" when it was never submitted.
slurm_of() {
  local id line
  id=$(cat "$1/slurm_job_id" 2>/dev/null) || { echo "NONE -"; return 0; }
  case "$id" in '' | *[!0-9_]*) echo "NONE -"; return 0 ;; esac
  # -t all: a finished job is still listed (until MinJobAge), with its end state.
  line=$(squeue -h -t all -j "$id" -o '%T %r' 2>/dev/null | head -n 1)
  echo "${line:-GONE -}"
}

# slurm_settle JOB_DIR: the job's state for rl-verify, one word then Slurm's words:
#   absent | pending <reason> | running | finished | ended <STATE> <ours|outside> | dead <why>
# A job Slurm ended without the exit code its batch step writes (cancelled, preempted, timed out, out of memory,
# its node failed) is recorded once in scheduler_end, so its end stays known after Slurm forgets the job.
slurm_settle() {
  local d=$1 state reason who
  read -r state reason <<<"$(slurm_of "$d")"
  if slurm_body_ended "$d" "$state"; then echo finished; return 0; fi
  case "$state" in
    NONE) if [ -d "$d" ]; then echo "dead never submitted"; else echo absent; fi ;;
    PENDING | CONFIGURING | REQUEUED | REQUEUE_HOLD | REQUEUE_FED | RESV_DEL_HOLD) echo "pending ${reason:-None}" ;;
    RUNNING | COMPLETING | SUSPENDED | STAGE_OUT | SIGNALING | RESIZING | STOPPED) echo running ;;
    GONE)
      if [ -s "$d/scheduler_end" ]; then echo "ended $(cat "$d/scheduler_end")"
      else echo "dead Slurm no longer knows job $(cat "$d/slurm_job_id") and it left no exit code"; fi ;;
    *)
      # The batch step may still be writing its exit code as Slurm records the end: look once more.
      sleep 1
      if slurm_body_ended "$d" "$state"; then echo finished; return 0; fi
      who=outside
      [ -f "$d/stopped" ] && who=ours
      [ -s "$d/scheduler_end" ] || echo "$state $who" >"$d/scheduler_end"
      echo "ended $(cat "$d/scheduler_end")" ;;
  esac
}

# slurm_body_ended JOB_DIR STATE: succeeds when the job's body ended by itself: its exit code is recorded and Slurm
# (in STATE, slurm_of's first word) did not end the job. Slurm's signal can reach the body before the batch step,
# which then records the body's death by signal (128+n) as its exit code: where Slurm ended the job, its end wins,
# and while Slurm still completes a job whose body died by a signal (COMPLETING), its end is awaited.
slurm_body_ended() {
  local d=$1 code
  [ -f "$d/exit_code" ] || return 1
  code=$(cat "$d/exit_code")
  case "$2" in
    CANCELLED | PREEMPTED | TIMEOUT | OUT_OF_MEMORY | NODE_FAIL | BOOT_FAIL | DEADLINE | COMPLETING)
      [ "$code" -le 128 ] 2>/dev/null ;;
    GONE) [ ! -s "$d/scheduler_end" ] ;;
    *) return 0 ;;
  esac
}

# slurm_active ID: succeeds while Slurm still runs or holds job ID (not yet ended).
slurm_active() {
  local state
  state=$(squeue -h -t all -j "$1" -o '%T' 2>/dev/null | head -n 1)
  case "$state" in
    PENDING | CONFIGURING | RUNNING | COMPLETING | SUSPENDED | REQUEUED | STAGE_OUT | SIGNALING | RESIZING | STOPPED) return 0 ;;
  esac
  return 1
}
