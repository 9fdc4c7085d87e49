#!/usr/bin/env bash
# Read one job's executed-code evidence (issue 44): the lines of the checkout every process of the job ran, combined.
# Inputs (assigned by remote.render before this text, validated in Python):
#   evidence_dir  the job's evidence folder    source  the worktree    py  the launch interpreter (has coverage.py)
#   compiled_re   what in a file's text says its bodies run compiled (core.evidence.COMPILED_BODY)
#   work_dir, tracker_glob  the job's WORK_DIR and its tracker's glob under it (the job's last step)
#   kinds  JSON [[kind, path, qualname], ...]: the kinds of process the suite expects and a function only each runs
#   blocks_py  the source of rl_verify/core/blocks.py (its body_range finds each function's body lines)
# Prints one JSON object: files (checkout path -> lines), processes (data files), hashes (checkout path -> git blob
# id of the measured file), compiled (paths), problems, coverage (its version), last_step (the tracker's last
# step-summary row, or null); issue 53: kinds (kind -> the pids whose own data file holds a line of the kind's
# function body: each proves one process of that kind ran and recorded) and argv (pid -> its role marker's command
# line, short). Exit 0 whatever it found.
# shellcheck disable=SC2154
set -eu
RL_VERIFY_BLOCKS_PY="$blocks_py" "$py" - "$evidence_dir" "$source" "$compiled_re" "$work_dir" "$tracker_glob" "$kinds" <<'PY'
import glob
import hashlib
import json
import os
import re
import sys

evidence_dir, source, compiled = sys.argv[1], os.path.realpath(sys.argv[2]), re.compile(sys.argv[3])
out = {"files": {}, "processes": 0, "hashes": {}, "compiled": [], "problems": [], "coverage": None,
       "last_step": None, "kinds": {}, "argv": {}}
blocks = {"__name__": "rl_verify_blocks"}
exec(compile(os.environ.get("RL_VERIFY_BLOCKS_PY", ""), "rl_verify_blocks", "exec"), blocks)
bodies = {}  # kind -> (checkout path, first body line, last line)
for kind, path, qualname in json.loads(sys.argv[6]):
    out["kinds"][kind] = []
    try:
        with open(os.path.join(source, path), encoding="utf-8", errors="replace") as text:
            found = blocks["body_range"](text.read(), qualname)
    except OSError:
        found = None
    if found is None:
        out["problems"].append("the checkout has no function %s in %s (the process kind %r cannot be proven): "
                               "fix the suite's evidence.processes" % (qualname, path, kind))
    else:
        bodies[kind] = (path, found[0], found[1])
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
for marker in sorted(glob.glob(os.path.join(data_dir, "role.*.json"))):
    try:
        with open(marker) as held:
            role = json.load(held)
        # short: a path in the checkout relative to it, any other path by its name
        short = [os.path.relpath(os.path.realpath(a), source) if str(a).startswith("/") else str(a)
                 for a in role.get("argv") or []]
        out["argv"][str(int(role["pid"]))] = " ".join(os.path.basename(a) if a.startswith("..") else a
                                                      for a in short)[:160]
    except (OSError, ValueError, KeyError, TypeError):
        continue
lines = {}
for name in names:
    # .coverage.<host>.<pid>.<random> (coverage.py 6 and 7; a host name may hold dots): this data file's process
    pid = name.rsplit(".", 2)[-2] if name.count(".") >= 3 else ""
    pid = int(pid) if pid.isdigit() else name
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
        ran = data.lines(path) or ()
        lines.setdefault(rel, set()).update(ran)
        for kind, (body_path, first, last) in bodies.items():
            if rel == body_path and pid not in out["kinds"][kind] and any(first <= n <= last for n in ran):
                out["kinds"][kind].append(pid)
out["kinds"] = {kind: sorted(pids, key=str) for kind, pids in out["kinds"].items()}
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
# Issue 53: every tracked .py file's blob id and blocks at this commit, as this interpreter compiles them (the
# package's core/blocks.py, shipped as RL_VERIFY_BLOCKS_PY): a file no process ran keeps only its module's block.
import subprocess
blocks_code = blocks  # the module exec'd above
listed = subprocess.run(["git", "-C", source, "ls-files", "-z", "--", "*.py"], capture_output=True)
if listed.returncode != 0 or "blocks_of" not in blocks_code:
    out["problems"].append("the checkout's Python files could not be listed (git ls-files exit %d): %s"
                           % (listed.returncode, listed.stderr.decode(errors="replace").strip()[-200:]))
out["blocks"], out["unparsed"] = {}, []
for rel in sorted(p.decode("utf-8", "surrogateescape") for p in listed.stdout.split(b"\0") if p):
    try:
        with open(os.path.join(source, rel), "rb") as tracked:
            blob = tracked.read()
    except OSError:
        continue  # a symlink to nowhere, a file removed: no account of it, so never judged by evidence
    out["hashes"][rel] = hashlib.sha1(b"blob %d\0" % len(blob) + blob).hexdigest()
    found = blocks_code["blocks_of"](blob.decode("utf-8", "surrogateescape"), rel) if "blocks_of" in blocks_code else None
    if found is None:
        out["unparsed"].append(rel)
    else:
        out["blocks"][rel] = found if rel in lines else found[:1]
print(json.dumps(out))
PY
