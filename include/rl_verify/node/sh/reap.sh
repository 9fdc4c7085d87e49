#!/usr/bin/env bash
# Remove run folders older than max_age_days that have no live job; unregister their worktrees.
# Inputs (assigned by remote.render before this text, validated in Python):
#   runs          the remote runs root        checkout  the node's xtuner checkout
#   keep          run key never removed (the current run)
#   max_age_days  age in days (integer)
# Prints one "REAPED dir" line per removed folder. job_alive() comes from lib_alive.sh.
# The inputs are assigned by the prelude render() prepends, which shellcheck cannot see:
# shellcheck disable=SC2154
set -u
[ -d "$runs" ] || exit 0
find "$runs" -mindepth 1 -maxdepth 1 -type d -mtime +"$max_age_days" | while read -r dir; do
  [ "$(basename "$dir")" = "$keep" ] && continue
  live=0
  for pidf in "$dir"/jobs/*/pid; do
    [ -f "$pidf" ] || continue
    [ -f "$(dirname "$pidf")/exit_code" ] && continue
    job_alive "$(dirname "$pidf")" && live=1
  done
  [ "$live" = 1 ] && continue
  [ -e "$dir/xtuner/.git" ] && git -C "$checkout" worktree remove --force "$dir/xtuner" 2>/dev/null
  rm -rf -- "$dir" && echo "REAPED $dir"
done
git -C "$checkout" worktree prune 2>/dev/null || true
exit 0
