#!/usr/bin/env bash
# Check every input of the selected suites and whether the node is busy, in one round trip.
# Inputs (assigned by remote.render before this text, validated in Python):
#   runs        the remote runs root          key  the run key
#   own_suite   the suite about to launch, or empty (then every job of this run is ours)
#   checks      one "suite<TAB>kind<TAB>path" line per input (a path may start with ~/)
#   marker_env  name of the run marker variable every rl-verify job exports
# Prints OK|MISSING<TAB>suite<TAB>kind<TAB>path per input, BUSY<TAB>job_dir<TAB>pid<TAB>since
# for a live job of another run, PROC<TAB>pid<TAB>cmdline for a launch script run outside rl-verify.
# group_alive() comes from lib_alive.sh, rendered before this text.
# The inputs are assigned by the prelude render() prepends, which shellcheck cannot see:
# shellcheck disable=SC2154
set -u
# Before launching suite S only S's own job is "ours": another suite of the same run that is
# still live (e.g. a cleared task) keeps the node busy too.
mine="$runs/$key/"
if [ -n "$own_suite" ]; then mine="${mine}jobs/$own_suite/"; fi

while IFS=$'\t' read -r suite kind path; do
  [ -n "$suite" ] || continue
  case "$path" in \~/*) path="$HOME/${path#\~/}";; esac
  if [ -r "$path" ]; then s=OK; else s=MISSING; fi
  printf '%s\t%s\t%s\t%s\n' "$s" "$suite" "$kind" "$path"
done <<< "$checks"

for pidf in "$runs"/*/jobs/*/pid; do
  [ -f "$pidf" ] || continue
  job=$(dirname "$pidf")
  case "$job/" in "$mine"*) continue;; esac
  [ -f "$job/exit_code" ] && continue
  p=$(cat "$pidf" 2>/dev/null)
  case "$p" in ''|*[!0-9]*) continue;; esac
  if group_alive "$p"; then printf 'BUSY\t%s\t%s\t%s\n' "$job" "$p" "$(stat -c %Y "$pidf")"; fi
done
# A launch script started by hand (or by another tool) also makes the node busy. The bracket
# keeps the pattern from matching this script's own command line.
# Jobs of rl-verify runs carry the run marker and are reported above as BUSY.
pgrep -af '^([^ ]*/)?(ba)?sh( -[a-z]+)* [^ ]*(run_[r]l|run_[s]ampled_token_mopd)\.sh' | while read -r pid cmd; do
  if ! { tr '\0' '\n' < "/proc/$pid/environ"; } 2>/dev/null | grep -q "^$marker_env="; then
    printf 'PROC\t%s\t%s\n' "$pid" "$cmd"
  fi
done
exit 0
