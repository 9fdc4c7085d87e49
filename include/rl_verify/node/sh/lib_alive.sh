#!/usr/bin/env bash
# Library prepended (rendered) by remote.py to the scripts that ask whether a job still runs.
# group_alive PGID succeeds while a process of group PGID is alive. A detached job's wrapper is
# reaped by the node's init; until then an exited wrapper is a zombie that still answers
# `kill -0`, which would keep the node "busy" after its job was stopped. Zombies do not count.
# shellcheck disable=SC2329  # called by the template this library is prepended to
group_alive() {
  case "$1" in '' | *[!0-9]* | 0 | 1) return 1 ;; esac
  ps -e -o pgid=,stat= | awk -v g="$1" '$1 == g && $2 !~ /^Z/ { found = 1 } END { exit !found }'
}
