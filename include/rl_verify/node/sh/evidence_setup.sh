#!/usr/bin/env bash
# Prepare one job's executed-code evidence (issue 44): coverage.py started in every Python process of the job through
# a sitecustomize.py on its PYTHONPATH, measuring the checkout's own source only, one data file per process, saved on
# exit and on SIGTERM (a lane job is stopped after its k steps).
# Inputs (assigned by remote.render before this text, validated in Python):
#   evidence_dir  this job's evidence folder (created)     source  the worktree (what is measured)
# Prints SITE=<folder for PYTHONPATH> and CONFIG=<COVERAGE_PROCESS_START file>.
# shellcheck disable=SC2154
set -eu
rm -rf "$evidence_dir"
mkdir -p "$evidence_dir/site" "$evidence_dir/data"
cat > "$evidence_dir/coverage.ini" <<INI
[run]
parallel = True
data_file = $evidence_dir/data/.coverage
source = $source
sigterm = True
disable_warnings = module-not-measured, no-data-collected, module-not-imported, couldnt-parse
INI
cat > "$evidence_dir/site/sitecustomize.py" <<'PY'
"""rl-verify (issue 44): record the checkout's lines this process runs with coverage.py when the job asks for it
(COVERAGE_PROCESS_START), then run the interpreter's own sitecustomize, which this one shadows."""
import os
import sys


def _note(text):
    try:
        folder = os.path.dirname(os.environ["COVERAGE_PROCESS_START"])
        with open(os.path.join(folder, "problems.txt"), "a") as out:
            out.write(text + "\n")
    except (KeyError, OSError):
        pass


def _start():
    if not os.environ.get("COVERAGE_PROCESS_START"):
        return
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
