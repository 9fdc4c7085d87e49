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
from typing import Any
from pathlib import Path

from rl_verify.errors import InputError

EXIT_PASS, EXIT_FAIL, EXIT_CANNOT_EVALUATE = 0, 1, 2
# argparse's subparsers object (add_parser); its class is private to argparse.
Subparsers = Any
Registrar = Callable[[Subparsers], None]


def _run_compare(args: argparse.Namespace) -> int:
    """Run one comparison, write the report into --out, print a short summary; return the exit status."""
    from rl_verify.report import ReportMeta, write_report

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
    from rl_verify.engines import engine_of
    from rl_verify.suite import available_suites, load_suite

    specs = [load_suite(name) for name in available_suites()]
    compare = subparsers.add_parser("compare", help="compare a run's tracker against its baseline/golden values")
    suites = compare.add_subparsers(dest="suite", metavar="{" + ",".join(s.name for s in specs) + "}", required=True)
    for spec in specs:
        engine = engine_of(spec)
        parser = suites.add_parser(spec.name, help=f"{spec.title}: {engine.describe}")
        engine.cli_args(parser)
        parser.set_defaults(func=_run_compare, spec=spec, engine=engine)


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
