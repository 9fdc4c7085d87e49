"""The ``rl-verify`` console command.

    rl-verify compare grpo --baseline BASE.jsonl --current CUR.jsonl --checker-dir CHECKOUT/autotest --out DIR
                           [--commit SHA] [--wall-time-s SECONDS] [--timeout-s SECONDS]
    rl-verify compare opd  --current CUR.jsonl --out DIR [--golden FILE] [--baseline BASE.jsonl] [--commit SHA]

Exit status: 0 PASS, 1 FAIL, 2 cannot evaluate (bad or missing input, crashed or hung checker; the
message names the file, the line where it applies, and what to do).

Subcommands are registered by small ``register_*`` functions on the parser returned by
``build_parser()``; another module adds one with ``register_<name>(subparsers)`` and a handler
stored as ``func`` (handler(args) -> exit status).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from rl_verify.errors import InputError

EXIT_PASS, EXIT_FAIL, EXIT_CANNOT_EVALUATE = 0, 1, 2
Registrar = Callable[[argparse._SubParsersAction], None]


def _run_compare(args: argparse.Namespace) -> int:
    """Run one comparison, write the report into --out, print a short summary; return the exit status."""
    from rl_verify.report import ReportMeta, write_report

    out = Path(args.out)
    if args.suite == "grpo":
        from rl_verify.grpo import compare_grpo

        result = compare_grpo(Path(args.baseline), Path(args.current), Path(args.checker_dir), out,
                              wall_time_s=args.wall_time_s, timeout_s=args.timeout_s)
    else:
        from rl_verify.opd import compare_opd

        result = compare_opd(Path(args.current), out, golden=Path(args.golden) if args.golden else None,
                             baseline=Path(args.baseline) if args.baseline else None,
                             missing_reference="no --baseline tracker was given (pass --baseline BASE.jsonl, a "
                                               "tracker of a 25-step run of the baseline config, to compare them)")
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


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def register_compare(subparsers: argparse._SubParsersAction) -> None:
    """Add ``compare grpo|opd``."""
    compare = subparsers.add_parser("compare", help="compare a run's tracker against its baseline/golden values")
    suites = compare.add_subparsers(dest="suite", metavar="{grpo,opd}", required=True)

    grpo = suites.add_parser("grpo", help="GRPO: the checkout's check_rl_result + final eval/accuracy + wall time")
    grpo.add_argument("--baseline", required=True, help="baseline tracker.jsonl")
    grpo.add_argument("--current", required=True, help="current run's tracker.jsonl")
    grpo.add_argument("--checker-dir", required=True,
                      help="the checkout's autotest folder (holds utils/check_metric.py)")
    grpo.add_argument("--out", required=True, help="output folder for report.json/md/html and plots")
    grpo.add_argument("--commit", default=None, help="full SHA of the code under test")
    grpo.add_argument("--wall-time-s", type=float, default=None, help="e2e wall time of the run in seconds")
    grpo.add_argument("--timeout-s", type=_positive_float, default=600.0, help="checker timeout (default 600)")
    grpo.set_defaults(func=_run_compare)

    opd = suites.add_parser("opd", help="OPD: every eval point against the golden table")
    opd.add_argument("--current", required=True, help="current run's tracker.jsonl")
    opd.add_argument("--out", required=True, help="output folder for report.json/md/html and plots")
    opd.add_argument("--golden", default=None, help="golden file (default: the packaged 2026-10-26 table)")
    opd.add_argument("--baseline", default=None,
                     help="baseline tracker for metrics the golden table lacks (response_len, time/step)")
    opd.add_argument("--commit", default=None, help="full SHA of the code under test")
    opd.set_defaults(func=_run_compare)


REGISTRARS: list[Registrar] = [register_compare]


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
