#!/usr/bin/env bash
# Read one job's executed-code evidence (issue 44): the lines of the checkout every process of the job ran, combined.
# Inputs (assigned by remote.render before this text, validated in Python):
#   evidence_dir  the job's evidence folder    source  the worktree    py  the launch interpreter (has coverage.py)
#   compiled_re   what in a file's text says its bodies run compiled (core.evidence.COMPILED_BODY)
#   work_dir, tracker_glob  the job's WORK_DIR and its tracker's glob under it (the job's last step)
# Prints one JSON object: files (checkout path -> lines), processes (data files), hashes (checkout path -> git blob
# id of the measured file), compiled (paths), problems, coverage (its version), last_step (the tracker's last
# step-summary row, or null). Exit 0 whatever it found.
# shellcheck disable=SC2154
set -eu
"$py" - "$evidence_dir" "$source" "$compiled_re" "$work_dir" "$tracker_glob" <<'PY'
import glob
import hashlib
import json
import os
import re
import sys

evidence_dir, source, compiled = sys.argv[1], os.path.realpath(sys.argv[2]), re.compile(sys.argv[3])
out = {"files": {}, "processes": 0, "hashes": {}, "compiled": [], "problems": [], "coverage": None,
       "last_step": None}
for tracker in glob.glob(os.path.join(sys.argv[4], sys.argv[5])):
    with open(tracker, errors="replace") as rows:
        for line in rows:
            try:
                row = json.loads(line)
            except ValueError:
                continue  # a partial last line
            if isinstance(row, dict) and "response/rewards/mean" in row and isinstance(row.get("step"), int):
                out["last_step"] = max(out["last_step"] or 0, row["step"])
try:
    with open(os.path.join(evidence_dir, "problems.txt")) as noted:
        out["problems"] += sorted({line.strip() for line in noted if line.strip()})
except OSError:
    pass
try:
    import coverage
    from coverage import CoverageData
except ImportError as err:
    out["problems"].append("coverage.py is not importable in %s (the launch interpreter): %s" % (sys.executable, err))
    print(json.dumps(out))
    sys.exit(0)
out["coverage"] = coverage.__version__
data_dir = os.path.join(evidence_dir, "data")
names = sorted(n for n in os.listdir(data_dir) if n.startswith(".coverage")) if os.path.isdir(data_dir) else []
out["processes"] = len(names)
lines = {}
for name in names:
    data = CoverageData(os.path.join(data_dir, name))
    try:
        data.read()
    except Exception as err:
        out["problems"].append("data file %s unreadable: %s" % (name, err))
        continue
    for path in data.measured_files():
        rel = os.path.relpath(os.path.realpath(path), source)
        if rel.startswith(".."):
            continue
        lines.setdefault(rel, set()).update(data.lines(path) or ())
for rel in sorted(lines):
    out["files"][rel] = sorted(lines[rel])
    try:
        with open(os.path.join(source, rel), "rb") as measured:
            blob = measured.read()
    except OSError:
        continue
    out["hashes"][rel] = hashlib.sha1(b"blob %d\0" % len(blob) + blob).hexdigest()
    if compiled.search(blob.decode("utf-8", "replace")):
        out["compiled"].append(rel)
print(json.dumps(out))
PY
