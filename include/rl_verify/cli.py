"""The ``rl-verify`` console command.

    rl-verify compare grpo --baseline BASE.jsonl --current CUR.jsonl --checker-dir CHECKOUT/autotest --out DIR
                           [--commit SHA] [--wall-time-s SECONDS] [--timeout-s SECONDS]
    rl-verify compare opd  --current CUR.jsonl --out DIR [--golden FILE] [--baseline BASE.jsonl] [--commit SHA]
    rl-verify baselines list [--suite S] | show [--suite S] VERSION | promote [--suite S] VERSION [--by NAME]
                        | import-shipped [--suite S]          (each also takes --root ROOT)
    rl-verify shortcut --checkout DIR --base SHA --head SHA [--suite S] [--json]

Exit status: 0 PASS, 1 FAIL, 2 cannot evaluate (bad or missing input, crashed or hung checker; the
message names the file, the line where it applies, and what to do). ``baselines`` exits 0, or 2 on
bad input (a missing or broken version, an unknown suite: nothing is promoted). ``shortcut`` exits 0, or 2 when
the checkout or a commit cannot be read.

Subcommands are registered by small ``register_*`` functions on the parser returned by
``build_parser()``; another module adds one with ``register_<name>(subparsers)`` and a handler
stored as ``func`` (handler(args) -> exit status).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any
from pathlib import Path

from rl_verify.core import evidence as executed
from rl_verify.core import lane, paths
from rl_verify.core.errors import InputError
from rl_verify.core.provenance import Provenance
from rl_verify.core.report import ReportMeta, text_table, write_report
from rl_verify.engines import engine_of, known_suites, load_suite
from rl_verify.node import evidence_scripts
from rl_verify.store import baselines
from rl_verify.suites.rules import rules_of

EXIT_PASS, EXIT_FAIL, EXIT_CANNOT_EVALUATE = 0, 1, 2
# argparse's subparsers object (add_parser); its class is private to argparse.
Subparsers = Any
Registrar = Callable[[Subparsers], None]


def _run_compare(args: argparse.Namespace) -> int:
    """Run one comparison, write the report into --out, print a short summary; return the exit status."""
    out = Path(args.out)
    result = args.engine.cli_compare(args, args.spec, out)
    paths = write_report(out, [result], ReportMeta(commit=args.commit, commit_hint="not given (pass --commit SHA)"))
    print(f"{result.suite}: {result.verdict}" + (f" ({result.failure_class})" if result.failure_class else ""))
    for line in result.abnormal:
        print(f"  abnormal: {line}")
    for check in result.checks:
        if check.passed is False:
            print(f"  {'MISSING' if check.missing else 'FAIL'} {check.metric} step={check.step} "
                  f"baseline={check.baseline} current={check.current} "
                  f"error={check.error} threshold={check.operator} {check.threshold} ({check.note})")
    for step in result.next_steps:
        print(f"  {step}")
    print(f"report: {paths['md']} {paths['json']} {paths['html']}")
    return EXIT_PASS if result.verdict == "PASS" else EXIT_FAIL


def register_compare(subparsers: Subparsers) -> None:
    """Add ``compare <suite>``: one subcommand per suite spec, with its engine's options."""
    specs = [load_suite(name) for name in known_suites()]
    compare = subparsers.add_parser("compare", help="compare a run's tracker against its baseline/golden values")
    suites = compare.add_subparsers(dest="suite", metavar="{" + ",".join(s.name for s in specs) + "}", required=True)
    for spec in specs:
        engine = engine_of(spec)
        parser = suites.add_parser(spec.name, help=f"{spec.title}: {engine.describe}")
        engine.cli_args(parser)
        parser.set_defaults(func=_run_compare, spec=spec, engine=engine)


def _when(value: Any) -> str | None:
    return value.strftime("%Y-%m-%d %H:%M:%S %Z").strip() if value is not None else None


def _baseline_suites(args: argparse.Namespace, one: bool) -> list[str]:
    """The suites a ``baselines`` command acts on: --suite, else every suite (``one``: exactly one is needed)."""
    if args.suite:
        return [args.suite]
    known = known_suites()
    if one and len(known) > 1:
        raise InputError(f"which suite? there are several ({', '.join(known)})", None, None,
                         f"give --suite {{{','.join(known)}}}")
    return known


def _baselines_list(args: argparse.Namespace) -> int:
    for n, suite in enumerate(_baseline_suites(args, one=False)):
        print(("\n" if n else "") + f"{suite}: {baselines.location(suite, root=args.root)}")
        entries = baselines.list_versions(suite, args.root)
        if not entries:
            print("  no versions yet (rl-verify baselines import-shipped makes version 1 from what ships)")
            continue
        rows = []
        for e in entries:
            r = e.record
            if r is None:
                rows.append([f"v{e.version}", "*" if e.current else "", "UNUSABLE", None, None, None, None, None,
                             e.problem])
                continue
            data = ", ".join(sorted(r.files)) or (f"share: {r.baseline_ref}" if r.baseline_ref else None)
            rows.append([f"v{r.version}", "*" if e.current else "", r.source, r.commit, r.runs,
                         ", ".join(r.dates), r.approved_by, _when(r.created_at), data])
        print(text_table(["version", "current", "source", "commit", "N", "dates", "approved_by", "created_at", "data"],
                     rows))
        try:
            pointer = baselines.current(suite, args.root)
        except InputError as exc:
            print(f"  current: UNREADABLE: {exc}")
            continue
        if pointer is None:
            print("  current: none (promote a version: rl-verify baselines promote --suite "
                  f"{suite} VERSION)")
        else:
            was = f"v{pointer.previous}" if pointer.previous else "none"
            print(f"  current: v{pointer.version}, promoted by {pointer.promoted_by} at {_when(pointer.promoted_at)} "
                  f"(previous: {was})")
    return EXIT_PASS


def _baselines_show(args: argparse.Namespace) -> int:
    import json

    suite = _baseline_suites(args, one=True)[0]
    rec = baselines.show(suite, args.version, args.root)
    try:
        pointer = baselines.current(suite, args.root)
    except InputError:
        pointer = None
    is_current = pointer is not None and pointer.version == rec.version
    fields = [
        ("suite", rec.suite), ("version", f"v{rec.version}" + (" (current)" if is_current else "")),
        ("source", rec.source), ("commit", rec.commit), ("runs (N)", rec.runs),
        ("dag runs", ", ".join(rec.dag_run_ids)), ("dates", ", ".join(rec.dates)), ("node", rec.node),
        ("hardware", rec.hardware), ("approved by", rec.approved_by), ("approved at", _when(rec.approved_at)),
        ("created at", _when(rec.created_at)), ("baseline ref", rec.baseline_ref), ("note", rec.note),
        ("location", baselines.location(suite, rec.version, root=args.root)),
    ]
    print(text_table(["field", "value"], fields))
    print("\nfiles:")
    print(text_table(["file", "sha256"], [[name, digest] for name, digest in sorted(rec.files.items())])
          if rec.files else "  none")
    print("\nstatistics:")
    for key, value in sorted(rec.statistics.items()):
        print(f"  {key}: {value if isinstance(value, str) else json.dumps(value, sort_keys=True)}")
    if not rec.statistics:
        print("  none")
    print()
    engine = engine_of(load_suite(suite))
    if engine.baseline_is_data and engine.baseline_file in rec.files:
        print("\n".join(engine.data_lines(baselines.load_version_data(suite, rec.version, args.root))))
    elif engine.baseline_file in rec.files:
        print(f"baseline tracker: {baselines.location(suite, rec.version, engine.baseline_file, args.root)}")
    elif rec.baseline_ref:
        print(f"baseline tracker: {rec.baseline_ref} (on the GPU node's share, not in the record store)")
    return EXIT_PASS


def _baselines_promote(args: argparse.Namespace) -> int:
    suite = _baseline_suites(args, one=True)[0]
    try:
        before = baselines.current(suite, args.root)
    except InputError:  # promote replaces an unreadable pointer and says so in its note
        before = None
    pointer = baselines.promote(suite, args.version, args.by, args.root)
    if before is not None and pointer == before:
        print(f"{suite}: v{pointer.version} is already the current baseline (promoted by {pointer.promoted_by} at "
              f"{_when(pointer.promoted_at)}); nothing changed")
    else:
        was = f"v{pointer.previous}" if pointer.previous else "none"
        print(f"{suite}: current baseline is now v{pointer.version} (was {was}), promoted by {pointer.promoted_by} "
              f"at {_when(pointer.promoted_at)}")
    if pointer.note:
        print(f"  note: {pointer.note}")
    return EXIT_PASS


def _baselines_import(args: argparse.Namespace) -> int:
    for suite in _baseline_suites(args, one=False):
        done = baselines.import_shipped(suite, args.root)
        r = done.record
        what = "imported" if done.created else "already present, unchanged"
        print(f"{suite}: v1 {what} (shipped: commit {r.commit or '-'}, N={r.runs}, "
              f"dates {', '.join(r.dates) or '-'}){'; made current' if done.made_current else ''}")
    return EXIT_PASS


def _baselines_propose(args: argparse.Namespace) -> int:
    import tempfile
    from datetime import date

    suite = _baseline_suites(args, one=True)[0]
    spec = load_suite(suite)
    engine = engine_of(spec)
    trackers = {f"run{i}": Path(p) for i, p in enumerate(args.trackers, 1)}
    against = baselines.in_use([suite], {suite: baselines.parse_version(args.against)} if args.against else {},
                               args.root)[suite]
    with tempfile.TemporaryDirectory(prefix="rl-verify-propose-") as tmp:
        written = {}
        for name, data in baselines.version_files(suite, against["version"], args.root).items():
            (Path(tmp) / name).write_bytes(data)
            written[name] = Path(tmp) / name
        proposal = engine.propose(spec, trackers, engine.data_in_use(spec, written), args.commit)
    print(f"{suite}: proposal from {len(trackers)} runs of commit {args.commit}, against {against['label']}\n")
    print("\n".join(f"  {run}: {path}" for run, path in trackers.items()) + "\n")
    print(proposal.markdown)
    if proposal.warnings:
        print("Warnings:\n" + "\n".join(f"  - {w}" for w in proposal.warnings) + "\n")
    if not args.add:
        print("(not stored: add --add to write it as a new version, then rl-verify baselines promote)")
        return EXIT_PASS
    provenance = Provenance(source="calibration", commit=args.commit, runs=len(trackers),
                                      dates=(date.today().isoformat(),), statistics=proposal.statistics,
                                      note=f"proposed by rl-verify baselines propose from {len(trackers)} trackers "
                                           f"against {against['label']}")
    version = baselines.add_version(suite, provenance, proposal.files, args.root)
    print(f"{suite}: added v{version} (not current; make it current with: rl-verify baselines promote --suite "
          f"{suite} {version})")
    return EXIT_PASS


def _baselines_guard(handler: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        try:
            return handler(args)
        except InputError as exc:
            print(f"rl-verify baselines: {exc}", file=sys.stderr)
            return EXIT_CANNOT_EVALUATE
    return run


def _default_user() -> str:
    import getpass

    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return ""


def register_baselines(subparsers: Subparsers) -> None:
    """Add ``baselines list|show|promote|import-shipped``: the versioned baselines of the record store."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--suite", choices=known_suites(), default=None,
                        help="the suite (list and import-shipped: default every suite)")
    common.add_argument("--root", default=None,
                        help="record store root (default: RL_VERIFY_RECORD_ROOT): a folder or s3://conn@bucket/prefix")
    parser = subparsers.add_parser("baselines", help="versioned baselines: list, show, promote, import-shipped")
    commands = parser.add_subparsers(dest="baselines_command", metavar="{list,show,promote,propose,import-shipped}",
                                     required=True)
    commands.add_parser("list", parents=[common], help="every version of each suite and the current one"
                        ).set_defaults(func=_baselines_guard(_baselines_list))
    show = commands.add_parser("show", parents=[common], help="one version: provenance, files, values")
    show.add_argument("version", help="version number, e.g. 2 or v2")
    show.set_defaults(func=_baselines_guard(_baselines_show))
    promote = commands.add_parser("promote", parents=[common],
                                  help="make a version current (going back = promoting an older one)")
    promote.add_argument("version", help="version number, e.g. 2 or v2")
    promote.add_argument("--by", default=_default_user(), help="who promotes (default: the login name)")
    promote.set_defaults(func=_baselines_guard(_baselines_promote))
    propose = commands.add_parser("propose", parents=[common],
                                  help="a baseline proposed from N runs' trackers, against the current version")
    propose.add_argument("trackers", nargs="+", help="tracker.jsonl of each run of the reference commit (N >= 2)")
    propose.add_argument("--commit", required=True, help="the reference commit the runs trained (full SHA)")
    propose.add_argument("--against", default=None, help="the version to compare with (default: the current one)")
    propose.add_argument("--add", action="store_true", help="store the proposal as a new version (not current)")
    propose.set_defaults(func=_baselines_guard(_baselines_propose))
    commands.add_parser("import-shipped", parents=[common],
                        help="version 1 of each suite from what ships (idempotent); current if none is"
                        ).set_defaults(func=_baselines_guard(_baselines_import))


def _git(checkout: Path, *args: str) -> list[str]:
    """The lines git prints in ``checkout`` (names quoted as the node's scripts quote them); InputError when it
    fails. No shell: the arguments reach git as they are."""
    import subprocess

    done = subprocess.run(["git", "-C", str(checkout), "-c", "core.quotePath=true", *args], capture_output=True,
                          text=True)
    if done.returncode != 0:
        raise InputError(f"git {' '.join(args[:2])} failed: {done.stderr.strip() or f'exit {done.returncode}'}",
                         checkout, None, "give a clone of XTuner (--checkout) and commits it has (--base, --head)")
    return [line for line in done.stdout.splitlines() if line]


def _commit(checkout: Path, rev: str, flag: str) -> str:
    if rev.startswith("-"):
        raise InputError(f"{flag} {rev!r} is not a commit", checkout, None, f"give a SHA, branch or tag as {flag}")
    try:
        return _git(checkout, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")[0]
    except (InputError, IndexError):
        raise InputError(f"{flag} {rev!r} is not a commit of this checkout", checkout, None,
                         f"give a SHA, branch or tag the checkout has as {flag} (git fetch first)") from None


def _read_evidence(path: str, base: str) -> Any:
    """The evidence JSON a reference keeps (``bitwise-references/evidence/<key>.json``) as ``core.evidence.Evidence``;
    InputError naming the file when it is not one, or is another commit's."""
    where = Path(path).expanduser()
    try:
        data = json.loads(where.read_text(encoding="utf-8"))
        found = executed.Evidence.from_dict(data)
    except (OSError, ValueError, TypeError, AttributeError, IndexError) as exc:
        raise InputError(f"not an evidence file: {exc}", where, None, "give the JSON a reference keeps beside it in "
                         "the record store (bitwise-references/evidence/<key>.json)") from None
    if data.get("sha") and data["sha"] != base:
        raise InputError(f"the evidence was recorded at {data['sha'][:9]}, not at --base {base[:9]}", where, None,
                         "give --base the reference's commit (the evidence's 'sha')")
    return found


def _diff_on_checkout(checkout: Path, base: str, head: str) -> Any:
    """The diff read by the node's own script (``sh/changed_lines.sh``, run here with bash) and parsed as the DAG
    parses it."""
    import subprocess

    done = subprocess.run(["bash", "-c", evidence_scripts.changed_lines_script(str(checkout.resolve()), base, head,
                                                                     Path(sys.executable).name)],
                          capture_output=True, text=True, env={**os.environ, "PATH": f"{Path(sys.executable).parent}"
                                                               f":{os.environ.get('PATH', '')}"})
    if done.returncode != 0:
        raise InputError(f"reading the diff failed: {done.stderr.strip()}", checkout, None,
                         "give a clone of XTuner that has both commits")
    return executed.read_changes(done.stdout)


def _not_yet(checkout: Path, head: str, rules: lane.Rules, tree: list[str]) -> list[str]:
    """The suite's patterns that match no file at ``head`` but do at the checkout's HEAD, a descendant of it: the
    rules name files added after ``head`` (its rules are newer than it), not files that are gone."""
    stale = [p for group in lane.stale_rules(rules, tree) for p in group]
    if not stale or _git_status(checkout, "merge-base", "--is-ancestor", head, "HEAD") != 0:
        return []
    newest = _git(checkout, "ls-tree", "-r", "--name-only", "HEAD")
    return [p for p in stale if not paths.stale([p], newest)]


def _git_status(checkout: Path, *args: str) -> int:
    """git's exit status alone (a question git answers with it, such as ``merge-base --is-ancestor``)."""
    import subprocess

    return subprocess.run(["git", "-C", str(checkout), *args], capture_output=True).returncode


def _run_shortcut(args: argparse.Namespace) -> int:
    """What a verification would do with the diff ``--base``..``--head`` per suite (``core.lane.judge``, the DAG's own
    decision): unchanged, bitwise or full, the rule and the files that decided, and every stale pattern; with
    ``--evidence``, what the reference's executed-code evidence says of the diff (read as the DAG reads it)."""
    checkout = Path(args.checkout).expanduser()
    if not (checkout / ".git").exists() and not _git(checkout, "rev-parse", "--git-dir"):
        raise InputError("not a git checkout", checkout, None, "give a clone of XTuner as --checkout")
    base, head = _commit(checkout, args.base, "--base"), _commit(checkout, args.head, "--head")
    found = _read_evidence(args.evidence, base) if args.evidence else None
    changes = _diff_on_checkout(checkout, base, head) if found is not None else None
    changed = list(changes) if changes is not None else \
        _git(checkout, "diff", "--name-only", "--no-renames", base, head, "--")
    tree = _git(checkout, "ls-tree", "-r", "--name-only", head)
    suites = [args.suite] if args.suite else known_suites()
    out: dict[str, Any] = {}
    for name in suites:
        spec = load_suite(name)
        reading = None if found is None or changes is None else executed.read_diff(found, changes)
        rules = rules_of(spec)
        judged = lane.judge(rules, lane.Facts(
            verified_pass=base, changed_since_pass=changed, changed_since_reference=changed, tree=tree,
            reference="trusted", reference_sha=base, evidence=reading,
            not_yet=_not_yet(checkout, head, rules, tree))).to_dict()
        judged["evidence"] = "none given (--evidence): the path rules alone" if reading is None else \
            ("not used: " + "; ".join(reading.problems)) if reading.problems else reading.to_dict()
        out[name] = judged
    assumes = ("--base stands for each suite's last verified PASS and its trusted bitwise reference on the node's "
               "environment" + (" (the evidence's)" if found is not None else "")
               + "; the record (a FAIL of --head) and the environment are the DAG's to read")
    if args.json:
        print(json.dumps({"checkout": str(checkout), "base": base, "head": head, "files": changed,
                          "suites": out, "assumes": assumes}, indent=1))
        return EXIT_PASS
    print(f"{base[:9]}..{head[:9]} in {checkout}: {len(changed)} file(s) changed")
    for name, judged in out.items():
        print(f"{name}: {judged['choice']} (rule: {judged['rule']}): {judged['why']}")
        deciding = judged["disabling"] if judged["rule"] == "bitwise.disabled_by" else judged["affecting"]
        if deciding:
            print(f"  files: {', '.join(deciding[:10])}" + (f" and {len(deciding) - 10} more" if len(deciding) > 10
                                                             else ""))
        for field, stale in (("affects", judged["stale_affects"]), ("bitwise.disabled_by", judged["stale_lane"])):
            if stale:
                print(f"  stale: {field} {', '.join(stale)} (matches no file at {head[:9]})")
        said = judged["evidence"]
        if isinstance(said, str):
            print(f"  evidence: {said}")
        else:
            print(f"  evidence: {len(said['ran'])} touched line(s) in blocks that ran ({', '.join(said['ran'][:5])}), "
                  f"{len(said['lane_unseen'])} the lane's steps never ran, {len(said['unrun'])} in blocks no process "
                  f"ran; cannot judge: {', '.join(said['unknown']) or 'none'}")
    print(f"Assumes: {assumes}.")
    return EXIT_PASS


def register_shortcut(subparsers: Subparsers) -> None:
    """Add ``shortcut``: the shortcut a verification would take for a diff, per suite, on a local clone."""
    parser = subparsers.add_parser(
        "shortcut", help="what a verification would do with a diff, per suite (unchanged, bitwise or full) and why")
    parser.add_argument("--checkout", required=True, help="a clone of XTuner")
    parser.add_argument("--base", required=True, help="the verified commit (a suite's last verified PASS)")
    parser.add_argument("--head", required=True, help="the commit to verify")
    parser.add_argument("--suite", choices=known_suites(), help="one suite (default: every suite)")
    parser.add_argument("--evidence", metavar="FILE", help="the executed-code evidence a reference keeps (its JSON in "
                        "the record store, recorded at --base): judge the diff with it, as the DAG does")
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    parser.set_defaults(func=_run_shortcut)


REGISTRARS: list[Registrar] = [register_compare, register_baselines, register_shortcut]


def build_parser(registrars: Sequence[Registrar] | None = None) -> argparse.ArgumentParser:
    """The ``rl-verify`` parser with every registered subcommand."""
    parser = argparse.ArgumentParser(prog="rl-verify", description="RL accuracy verification of XTuner code changes")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for register in registrars if registrars is not None else REGISTRARS:
        register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` and run the command; returns the exit status (0 PASS, 1 FAIL, 2 cannot evaluate)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse exits 2 on usage errors: keep that meaning, but return it
        return int(exc.code) if isinstance(exc.code, int) else EXIT_CANNOT_EVALUATE
    try:
        return args.func(args)
    except InputError as exc:
        print(f"rl-verify: cannot evaluate: {exc}", file=sys.stderr)
        return EXIT_CANNOT_EVALUATE
    except OSError as exc:  # e.g. an output folder that cannot be written: still no verdict
        print(f"rl-verify: cannot evaluate: {exc.filename or ''}: {exc.strerror or exc}. "
              "Fix: check the path and its permissions", file=sys.stderr)
        return EXIT_CANNOT_EVALUATE


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
