#!/usr/bin/env bash
# Prepare one job's executed-code evidence (issue 44): coverage.py started in every Python process of the job through
# a sitecustomize.py on its PYTHONPATH, measuring the checkout's own source only, one data file per process, saved on
# exit and on SIGTERM (a lane job is stopped after its k steps). Issue 53: the children multiprocessing forks or
# spawns (a Pool, DataLoader or reward workers) record too (concurrency = multiprocessing), and with coverage.py 7.10
# or later (asked of the launch interpreter) its own subprocess patch hands the config on; each measured process
# leaves a role marker beside the data files, data/role.<pid>.json (pid, ppid, argv, executable).
# Inputs (assigned by remote.render before this text, validated in Python):
#   evidence_dir  this job's evidence folder (created)     source  the worktree (what is measured)
#   py  the launch interpreter (its coverage.py's version decides patch = subprocess)
# Prints SITE=<folder for PYTHONPATH> and CONFIG=<COVERAGE_PROCESS_START file>.
# shellcheck disable=SC2154
set -eu
rm -rf "$evidence_dir"
mkdir -p "$evidence_dir/site" "$evidence_dir/data"
patch=""
if "$py" -c 'import sys, coverage; sys.exit(0 if tuple(coverage.version_info[:2]) >= (7, 10) else 1)' 2>/dev/null; then
  patch="patch = subprocess"
fi
cat > "$evidence_dir/coverage.ini" <<INI
[run]
parallel = True
data_file = $evidence_dir/data/.coverage
source = $source
sigterm = True
concurrency = multiprocessing,thread
$patch
disable_warnings = module-not-measured, no-data-collected, module-not-imported, couldnt-parse
INI
cat > "$evidence_dir/site/sitecustomize.py" <<'PY'
"""rl-verify (issues 44, 53): record the checkout's lines this process runs with coverage.py when the job asks for
it (COVERAGE_PROCESS_START, or the config coverage.py 7.10's subprocess patch hands on), leave this process's role
marker beside the data files (again in each child forked from it), then run the interpreter's own sitecustomize,
which this one shadows."""
import json
import os
import sys

_EVIDENCE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _note(text):
    try:
        with open(os.path.join(_EVIDENCE, "problems.txt"), "a") as out:
            out.write(text + "\n")
    except OSError:
        pass


def _mark(how):
    """data/role.<pid>.json: which process this is (the reading names each data file's process by it)."""
    try:
        role = {"pid": os.getpid(), "ppid": os.getppid(), "how": how, "executable": sys.executable,
                "argv": [str(a)[:200] for a in list(getattr(sys, "orig_argv", None) or sys.argv)[:12]]}
        with open(os.path.join(_EVIDENCE, "data", "role.%d.json" % os.getpid()), "w") as out:
            json.dump(role, out)
    except Exception:  # never stop the training for its evidence
        pass


def _start():
    if not (os.environ.get("COVERAGE_PROCESS_START") or os.environ.get("COVERAGE_PROCESS_CONFIG")):
        return
    _mark("started")
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=lambda: _mark("forked"))
    try:
        import coverage
    except ImportError as err:
        _note("coverage.py is not importable in %s: %s" % (sys.executable, err))
        return
    try:
        coverage.process_startup()
    except Exception as err:  # never stop the training for its evidence
        _note("coverage.process_startup failed in %s: %s" % (sys.executable, err))


def _chain():
    import importlib.util
    here = os.path.dirname(os.path.abspath(__file__))
    for entry in sys.path:
        if not entry or os.path.abspath(entry) == here:
            continue
        candidate = os.path.join(entry, "sitecustomize.py")
        if os.path.isfile(candidate):
            spec = importlib.util.spec_from_file_location("_rl_verify_chained_sitecustomize", candidate)
            try:
                spec.loader.exec_module(importlib.util.module_from_spec(spec))
            except Exception:
                pass
            return


_start()
_chain()
PY
echo "SITE=$evidence_dir/site"
echo "CONFIG=$evidence_dir/coverage.ini"
