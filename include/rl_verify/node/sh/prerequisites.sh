#!/usr/bin/env bash
# Check every input of the selected suites and whether the node is busy, in one round trip.
# Inputs (assigned by remote.render before this text, validated in Python):
#   runs        the remote runs root          key  the run key
#   own_suite   the suite about to launch, or empty (then every job of this run is ours)
#   checks      one "suite<TAB>kind<TAB>path" line per input (a path may start with ~/)
#   marker_env  name of the run marker variable every rl-verify job exports
#   need_nofile the open-files limit a launch script sets (0: not checked)
#   need_gpus   the GPU count a launch script waits for (0: not checked)
#   ray_ports   the fixed Ray ports a launch script binds (space separated; empty: not checked)
#   python_cmd  the interpreter command a launch script calls (empty: not checked)
#   ray_log     the shared folder a launch script removes and re-links (empty: not checked)
#   gpu_check   1: read the GPUs' memory and compute processes (lib_gpu.sh's gpu_state; own: this run's marker;
#               another run's job marker read against its job folder under runs)
#   env_check   1: print the environment (ENV and PKG lines below); 0: not (the launch's own busy check)
#   env_python  the launch interpreter whose packages make the environment's fingerprint
#   env_packages (array) those packages' names
# Prints OK|MISSING<TAB>suite<TAB>kind<TAB>path per input, BUSY<TAB>job_dir<TAB>pid<TAB>since
# for a live job of another run, PROC<TAB>pid<TAB>cmdline for a launch script run outside rl-verify,
# and the node's readiness: NOFILE<TAB>hard limit, GPUS<TAB>count<TAB>CUDA_VISIBLE_DEVICES or <unset>,
# PYTHON<TAB>path or empty, PORT<TAB>port<TAB>user<TAB>pid or -<TAB>ours|other<TAB>cmdline per listened
# Ray port, RAYLOG<TAB>link target<TAB>live job dir or -, and with gpu_check the GPUMEM/GPUAPP/GPUERR lines
# of lib_gpu.sh; and the environment (issue 33's fingerprint): ENV<TAB>gpu|gpu_count|driver|cuda<TAB>value
# (- when nvidia-smi cannot say) and PKG<TAB>name<TAB>version or - per package of the launch interpreter.
# job_alive() comes from lib_alive.sh, gpu_state() from lib_gpu.sh, rendered before this text.
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
  if job_alive "$job"; then printf 'BUSY\t%s\t%s\t%s\n' "$job" "$p" "$(stat -c %Y "$pidf")"; fi
done
# A launch script started by hand (or by another tool) also makes the node busy. The bracket
# keeps the pattern from matching this script's own command line.
# Jobs of rl-verify runs carry the run marker and are reported above as BUSY.
# A script that exits between pgrep and the read of its environment (a launch that fails at once, on this
# node or on another node of the same machine) is gone, not busy: only a process still there is reported.
pgrep -af '^([^ ]*/)?(ba)?sh( -[a-z]+)* [^ ]*(run_[r]l|run_[s]ampled_token_mopd)\.sh' | while read -r pid cmd; do
  if ! { tr '\0' '\n' < "/proc/$pid/environ"; } 2>/dev/null | grep -q "^$marker_env="; then
    # (/proc files have no size: an exiting process's command line reads empty.)
    if [ -n "$(tr -d '\0' < "/proc/$pid/cmdline" 2>/dev/null)" ]; then printf 'PROC\t%s\t%s\n' "$pid" "$cmd"; fi
  fi
done

# --- readiness: what the launch scripts need of the node (their specs' "node"), seen as they see it ---
# ulimit, command -v: bash builtins, as the launch script itself runs them.
if [ "$need_nofile" -gt 0 ]; then printf 'NOFILE\t%s\n' "$(ulimit -Hn)"; fi
if [ "$need_gpus" -gt 0 ]; then
  gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
  printf 'GPUS\t%s\t%s\n' "${gpus:-0}" "${CUDA_VISIBLE_DEVICES-<unset>}"
fi
# Every compute process on the GPUs and the memory in use: another user's job or a leftover holding memory
# would make the training run out of memory or run slow, after the approval. A process of another rl-verify run
# is told live or ended by its job's folder under $runs, as the BUSY lines above are.
if [ "$gpu_check" = 1 ]; then gpu_state "$key" "" "$runs"; fi
if [ -n "$python_cmd" ]; then printf 'PYTHON\t%s\n' "$(command -v "$python_cmd" 2>/dev/null)"; fi
me=$(id -un)
for port in $ray_ports; do
  hex=$(printf '%04X' "$port")
  # A listening socket (state 0A) on the port, IPv4 or IPv6: its owner's uid and inode.
  read -r uid inode < <(awk -v hex="$hex" 'FNR > 1 && $4 == "0A" { n = split($2, a, ":"); if (a[n] == hex) { print $8, $10; exit } }' /proc/net/tcp /proc/net/tcp6 2>/dev/null)
  [ -n "${uid:-}" ] || continue
  user=$(getent passwd "$uid" | cut -d: -f1)
  pid=-
  for fd in /proc/[0-9]*/fd/*; do
    if [ "$(readlink "$fd" 2>/dev/null)" = "socket:[$inode]" ]; then pid=${fd#/proc/}; pid=${pid%%/*}; break; fi
  done
  cmd=-
  if [ "$pid" != - ]; then cmd=$(tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null | cut -c1-200); fi
  if [ "${user:-$uid}" = "$me" ]; then whose=ours; else whose=other; fi
  printf 'PORT\t%s\t%s\t%s\t%s\t%s\n' "$port" "${user:-$uid}" "$pid" "$whose" "$cmd"
done
if [ -n "$ray_log" ] && [ -L "$ray_log" ]; then
  target=$(readlink -f "$ray_log" 2>/dev/null || readlink "$ray_log")
  live=-
  for pidf in "$runs"/*/jobs/*/pid; do
    [ -f "$pidf" ] || continue
    job=$(dirname "$pidf"); run=${job%/jobs/*}
    [ -f "$job/exit_code" ] && continue
    case "$target/" in "$run"/*) if job_alive "$job"; then live=$job; fi;; esac
  done
  printf 'RAYLOG\t%s\t%s\n' "$target" "$live"
fi

# --- the environment: what a deterministic run's bits depend on beyond the checkout ---
if [ "$env_check" != 1 ]; then exit 0; fi
gpu_names=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null)
printf 'ENV\tgpu\t%s\n' "$(printf '%s\n' "$gpu_names" | head -n1 | cut -d, -f1 | sed 's/^ *//; s/ *$//')"
printf 'ENV\tgpu_count\t%s\n' "$(printf '%s\n' "$gpu_names" | grep -c .)"
printf 'ENV\tdriver\t%s\n' "$(printf '%s\n' "$gpu_names" | head -n1 | cut -d, -f2 | sed 's/^ *//; s/ *$//')"
printf 'ENV\tcuda\t%s\n' "$(nvidia-smi 2>/dev/null | grep -o 'CUDA Version: *[0-9.]*' | head -n1 | sed 's/.*: *//')"
if [ "${#env_packages[@]}" -gt 0 ] && command -v "$env_python" >/dev/null 2>&1; then
  "$env_python" - "${env_packages[@]}" 2>/dev/null <<'PY'
import re
import sys
from importlib import metadata


def version(name):
    dist = metadata.distribution(name)
    # The build's own version file keeps what the metadata drops: torch 2.11.0's +cu130 (its CUDA build).
    try:
        text = dist.locate_file(f"{name}/version.py").read_text()
        local = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)['\"]", text, re.M)
        if local and local.group(1).startswith(dist.version):
            return local.group(1)
    except OSError:
        pass
    return dist.version


for name in sys.argv[1:]:
    try:
        found = version(name)
    except Exception:  # not installed (or unreadable metadata): no version
        found = "-"
    print(f"PKG\t{name}\t{found}")
PY
fi
exit 0
