#!/usr/bin/env bash
# Library prepended (rendered) by remote.py to the scripts that ask whether a job still runs.
#
# A job's folder holds pid (its leader's pid = its process group id) and pid.start (the leader's start
# time, clock ticks after boot, /proc/PID/stat field 22). A job stopped by a signal never writes its
# exit_code, and its pid number is free again once the whole group is gone: a process started later
# (an SSH session's shell, another tool's daemon) may lead a group of the same number. The start time
# tells the two apart. Linux never gives out a pid while a process group of that number has a member,
# so a live process numbered PGID that started at another time proves the job's group is gone.
# shellcheck disable=SC2329  # called by the template this library is prepended to

# proc_start PID: the start time of process PID (empty when there is none). The command name in
# parentheses may hold spaces: the fields are counted after its closing parenthesis.
proc_start() {
  local stat fields
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 0
  read -r -a fields <<< "${stat##*) }"
  printf '%s' "${fields[19]:-}"
}

# group_alive PGID [LEADER_START] succeeds while a non-zombie process of group PGID lives and, when
# LEADER_START is given, the group is still the job's: no process numbered PGID that started at
# another time. A detached job's wrapper is reaped by the node's init; until then an exited wrapper is a
# zombie that still answers `kill -0`, which would keep the node "busy" after its job was stopped.
group_alive() {
  case "$1" in '' | *[!0-9]* | 0 | 1) return 1 ;; esac
  if [ -n "${2:-}" ]; then
    local now
    now=$(proc_start "$1")
    if [ -n "$now" ] && [ "$now" != "$2" ]; then return 1; fi
  fi
  ps -e -o pgid=,stat= | awk -v g="$1" '$1 == g && $2 !~ /^Z/ { found = 1 } END { exit !found }'
}

# job_alive JOB_DIR: the job of this folder (its pid and pid.start) has a live process.
job_alive() {
  group_alive "$(cat "$1/pid" 2>/dev/null)" "$(cat "$1/pid.start" 2>/dev/null)"
}

# job_leader JOB_DIR: the job's pid when its leader is alive and is the job's own (same start time);
# empty otherwise. Only such a group is signalled as a whole: a reused number is someone else's.
job_leader() {
  local p s
  p=$(cat "$1/pid" 2>/dev/null)
  case "$p" in '' | *[!0-9]* | 0 | 1) return 0 ;; esac
  s=$(cat "$1/pid.start" 2>/dev/null)
  if [ -z "$s" ] || [ "$(proc_start "$p")" = "$s" ]; then printf '%s' "$p"; fi
}
