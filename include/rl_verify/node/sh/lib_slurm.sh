#!/usr/bin/env bash
# Library prepended (rendered) by node/launcher.py to the Slurm launcher's scripts, which run on the login node.
# Inputs (assigned by launcher.render, from node/slurm_states.py: the one table of Slurm's states):
#   slurm_pending_states slurm_running_states slurm_by_slurm_states slurm_by_body_states   arrays of state names
#   slurm_settle_s  seconds an ended job's exit code is awaited before its end is written without it
#   slurm_ask_s     seconds one squeue/sacct call may take (a frozen slurmctld answers nothing)
#
# A Slurm job's folder (on the shared filesystem) holds slurm_job_id (what sbatch answered), started (written by
# the batch step when it runs), stdout.log and exit_code (the job's own, when its body ended), stopped (written
# before rl-verify cancels it), end_seen (when an end without an exit code was first seen) and scheduler_end
# (what Slurm said of a job that ended without its exit code).
# shellcheck disable=SC2329,SC2154  # called by the template this library is prepended to; inputs from render

# slurm_is STATE KIND: succeeds when the table puts STATE in KIND (pending, running, by_slurm, by_body).
slurm_is() {
  local -n _states="slurm_${2}_states"
  local s
  for s in "${_states[@]}"; do [ "$s" = "$1" ] && return 0; done
  return 1
}

# slurm_ask CMD...: run a Slurm client command with a bound; sets ask_out (its stdout), ask_err (its first stderr
# line) and ask_rc (its status: non-zero for a frozen or absent slurmctld, 124 past the bound). Call it directly,
# not in $( ): it answers through those variables.
slurm_ask() {
  local errf
  ask_out='' ask_err='' ask_rc=1
  errf=$(mktemp) || { ask_err="mktemp failed"; return 0; }
  ask_out=$(timeout "$slurm_ask_s" "$@" 2>"$errf")
  ask_rc=$?
  ask_err=$(head -n 1 "$errf" | tr -d '\r')
  rm -f "$errf"
  return 0
}

# slurm_words TEXT: TEXT as one token of the poll header (letters, digits and _.,:()- only; at most 120 characters).
slurm_words() {
  printf '%s' "$1" | tr -c 'A-Za-z0-9_.,:()-' '_' | cut -c1-120
}

# slurm_of JOB_DIR: "<STATE> <reason>" of the job as Slurm knows it: squeue while it lists the job, then sacct
# (accounting) once it forgot it; "GONE -" once neither knows it (MinJobAge after its end, accounting off),
# "NONE -" when it was never submitted, "UNKNOWN <why>" when Slurm did not answer (slurmctld or slurmdbd down,
# restarting or frozen): never taken for an answer.
slurm_of() {
  local id line
  id=$(cat "$1/slurm_job_id" 2>/dev/null) || { echo "NONE -"; return 0; }
  case "$id" in '' | *[!0-9_]*) echo "NONE -"; return 0 ;; esac
  # -t all: a finished job is still listed (until MinJobAge), with its end state.
  slurm_ask squeue -h -t all -j "$id" -o '%T %r'
  line=${ask_out%%$'\n'*}
  if [ "$ask_rc" = 0 ] && [ -n "$line" ]; then echo "$line"; return 0; fi
  # squeue answers "Invalid job id" for a job slurmctld no longer holds; any other failure is silence.
  if [ "$ask_rc" != 0 ] && [[ $ask_err != *"Invalid job id"* ]]; then
    echo "UNKNOWN squeue_failed:_$(slurm_words "${ask_err:-exit $ask_rc}")"
    return 0
  fi
  slurm_ask sacct -n -P -X -j "$id" -o State,Reason
  line=${ask_out%%$'\n'*}
  if [ "$ask_rc" = 0 ] && [ -n "$line" ]; then
    # "CANCELLED by 0|None": the state's first word, then the reason.
    local state=${line%%|*}
    echo "${state%% *} $(slurm_words "${line#*|}")"
    return 0
  fi
  if [ "$ask_rc" != 0 ] && [[ $ask_err != *"accounting storage is disabled"* ]]; then
    echo "UNKNOWN sacct_failed:_$(slurm_words "${ask_err:-exit $ask_rc}")"
    return 0
  fi
  echo "GONE -"
}

# slurm_settle JOB_DIR: the job's state for rl-verify, one word then Slurm's words:
#   absent | pending <reason> | running | unknown <why> | settling <STATE> | finished | ended <STATE> <ours|outside>
#   | dead <why>
# A job Slurm ended without the exit code its batch step writes (cancelled, preempted, timed out, out of memory,
# its node failed) is recorded in scheduler_end, so its end stays known after Slurm forgets the job; the exit code
# is awaited for slurm_settle_s first (the shared filesystem may show it late), and one that shows up later still
# wins where the body's own end is possible.
slurm_settle() {
  local d=$1 state reason who seen now
  read -r state reason <<<"$(slurm_of "$d")"
  if slurm_body_ended "$d" "$state"; then echo finished; return 0; fi
  if [ "$state" = NONE ]; then
    if [ -d "$d" ]; then echo "dead never submitted"; else echo absent; fi
    return 0
  fi
  if [ "$state" = UNKNOWN ]; then echo "unknown ${reason:-}"; return 0; fi
  if slurm_is "$state" pending; then echo "pending ${reason:-None}"; return 0; fi
  if slurm_is "$state" running; then echo running; return 0; fi
  if [ "$state" = GONE ]; then
    if [ -s "$d/scheduler_end" ]; then echo "ended $(cat "$d/scheduler_end")"
    else echo "dead Slurm no longer knows job $(cat "$d/slurm_job_id") (nor does its accounting) and it left no exit code"; fi
    return 0
  fi
  if [ -s "$d/scheduler_end" ]; then echo "ended $(cat "$d/scheduler_end")"; return 0; fi
  now=$(date +%s)
  [ -s "$d/end_seen" ] || echo "$now" >"$d/end_seen"
  seen=$(cat "$d/end_seen")
  case "$seen" in '' | *[!0-9]*) seen=$now ;; esac
  # An exit code already there (a body Slurm's signal killed: 128+n) leaves nothing to await.
  if [ $((now - seen)) -lt "$slurm_settle_s" ] && [ ! -f "$d/exit_code" ]; then
    echo "settling $state"
    return 0
  fi
  who=outside
  [ -f "$d/stopped" ] && who=ours
  echo "$state $who" >"$d/scheduler_end"
  echo "ended $state $who"
}

# slurm_body_ended JOB_DIR STATE: succeeds when the job's body ended by itself: its exit code is recorded and Slurm
# (in STATE, slurm_of's first word) did not end the job. Slurm's signal can reach the body before the batch step,
# which then records the body's death by signal (128+n) as its exit code: where Slurm ended the job (or may have:
# it does not answer), its end wins, and while Slurm still completes a job (COMPLETING), its end is awaited. A job
# Slurm forgot is judged by the end recorded for it, if any.
slurm_body_ended() {
  local d=$1 state=$2 code
  [ -f "$d/exit_code" ] || return 1
  code=$(cat "$d/exit_code")
  if [ "$state" = GONE ] || [ "$state" = UNKNOWN ]; then
    if [ -s "$d/scheduler_end" ]; then read -r state _ <"$d/scheduler_end"; fi
  fi
  if [ "$state" = COMPLETING ] || [ "$state" = UNKNOWN ] || slurm_is "$state" by_slurm; then
    [ "$code" -le 128 ] 2>/dev/null
    return
  fi
  return 0
}

# slurm_active ID: succeeds while Slurm still runs or holds job ID (not yet ended), and when Slurm does not answer
# (a stop must then try scancel rather than take the silence for an end).
slurm_active() {
  local state
  slurm_ask squeue -h -t all -j "$1" -o '%T'
  if [ "$ask_rc" != 0 ]; then
    [[ $ask_err == *"Invalid job id"* ]] && return 1
    return 0
  fi
  state=${ask_out%%$'\n'*}
  [ -n "$state" ] || return 1
  slurm_is "$state" pending || slurm_is "$state" running
}
