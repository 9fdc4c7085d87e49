#!/usr/bin/env bash
# Body of one training job, run detached by job_submit.sh (remote.job_command wraps it in ( )).
# Inputs (assigned by remote.render before this text, validated in Python):
#   worktree   the run's worktree             work_dir  the suite's WORK_DIR
#   script     launch script, relative to the worktree
#   args       array of the launch script's arguments
#   job        the job marker value (<run key>/<suite>)
#   stall      seconds without tracker growth before the watchdog kills the job (0: off)
#   glob       tracker glob under work_dir (validated: no spaces, must expand)
# marked() comes from lib_marked.sh, rendered before this text.
# The launch script's exit status is reported, never trusted; a stalled job exits 124.
# The inputs are assigned by the prelude render() prepends, which shellcheck cannot see:
# shellcheck disable=SC2154
{ cd "$worktree" && mkdir -p "$work_dir"; } || exit 97
# The launch script's bash -x trace goes to its own file beside stdout.log (archived as the job's trace):
# the task log streams what the training prints, and a launch that dies early is explained by the
# trace's last command with the last lines it printed.
trace="$(dirname "$0")/trace.log"
BASH_XTRACEFD=3 bash -x "$script" "${args[@]}" 3>>"$trace" &
launch=$!
if [ "$stall" -gt 0 ]; then
  ( last=-1; since=$(date +%s)
    while kill -0 "$launch" 2>/dev/null; do
      # shellcheck disable=SC2086  # $glob is validated (no spaces) and must expand
      size=$(stat -c %s "$work_dir"/$glob 2>/dev/null | awk '{s+=$1} END {print s+0}')
      now=$(date +%s)
      if [ "$size" != "$last" ]; then last=$size; since=$now
      elif [ $((now - since)) -ge "$stall" ]; then
        # shellcheck disable=SC2086  # $glob is validated (no spaces) and must expand
        newest=$(printf '%s\n' "$work_dir"/$glob | sort | tail -n 1)
        steps=$(grep -c '"response/rewards/mean"' "$newest" 2>/dev/null)
        steps=${steps:-0}
        echo "$steps" > "$work_dir/.rl-verify-stalled"
        echo "[rl-verify] STALLED at step $steps: the tracker did not grow for $stall s; killing the job"
        for p in $(marked "$job"); do kill -TERM "$p" 2>/dev/null; done
        sleep 5
        for p in $(marked "$job"); do kill -KILL "$p" 2>/dev/null; done
        break
      fi
      sleep 2
    done ) &
  watch=$!
fi
wait "$launch"
rc=$?
[ -n "${watch:-}" ] && kill "$watch" 2>/dev/null
ray stop --force >/dev/null 2>&1 || true
echo "[rl-verify] launch script exited $rc (not trusted: the tracker decides)"
[ -f "$work_dir/.rl-verify-stalled" ] && exit 124
exit "$rc"
