"""What a comparison engine provides: the one base class the registry knows.

An engine is one package under ``rl_verify/engines/`` named like the ``engine`` field of the suite
specs that use it, whose ``__init__`` holds ``ENGINE``, an instance of an :class:`Engine` subclass. It
owns everything about its kind of comparison: its data file's model, the card's criteria, the
comparison of archived files, the live check, the calibration proposal, its rules of runbook
section 3, the validation of a stored baseline version and the provenance of the baseline that
ships. Nothing outside an engine's package branches on an engine's or a suite's name, and no other
engine imports it.
"""

from __future__ import annotations

import argparse
import math
from abc import ABC, abstractmethod
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel

from rl_verify import settings
from rl_verify.core.confirm import Layout, RunPoints, Spread
from rl_verify.core.errors import InputError
from rl_verify.core.livecheck import LiveCheck
from rl_verify.core.model import Check, SuiteResult
from rl_verify.core.nextsteps import EngineRules
from rl_verify.core.provenance import Provenance
from rl_verify.core.tracker import check_baseline_tracker
from rl_verify.suites.spec import SuiteSpec, data_file

#: The file of a stored baseline version that holds a baseline tracker (XTuner's tracker format).
TRACKER_FILE = settings.BASELINE_TRACKER_FILE


class Engine(ABC):
    """One kind of comparison (see the module docstring); subclasses set the class attributes."""

    #: The ``engine`` field of the specs that use it (= the package's name).
    name: ClassVar[str]
    #: One line for the CLI's help.
    describe: ClassVar[str]
    #: The file of a stored baseline version that holds what this engine judges against.
    baseline_file: ClassVar[str]
    #: True: ``baseline_file`` is in the schema of the spec's data file and replaces it (a golden
    #: table); False: it replaces the spec's baseline tracker on the node's share.
    baseline_is_data: ClassVar[bool]
    #: The engine-specific rules of runbook section 3.
    rules: ClassVar[EngineRules]

    # --- the data file ---------------------------------------------------------------------------
    @abstractmethod
    def load_data(self, path: Path) -> BaseModel:
        """The suite's data file, validated (InputError naming the file and every bad field)."""

    def contradictions(self, spec: SuiteSpec, data: Any) -> list[str]:
        """Every fact the spec and its loaded data file state differently ([] when they agree)."""
        return []

    def data_in_use(self, spec: SuiteSpec, version_files: Mapping[str, Path]) -> Path:
        """The data file a suite is judged with: its baseline version's when that replaces the spec's
        data file (a golden table), else the spec's own."""
        if self.baseline_is_data and self.baseline_file in version_files:
            return version_files[self.baseline_file]
        return data_file(spec.data)

    def judged_metrics(self, data: Any) -> list[str]:
        """The metrics the data file judges, in its order (calibration plots, tables)."""
        return []

    def data_lines(self, data: Any) -> list[str]:
        """The data a baseline version holds in place of the spec's data file, as plain text (the CLI)."""
        return []

    def reference_points(self, data: Any, metric: str) -> list[tuple[int, float]]:
        """Reference values of ``metric`` stated by the data file itself (a golden table's points);
        [] when the reference is a baseline tracker."""
        return []

    # --- the card and the comparison --------------------------------------------------------------
    @abstractmethod
    def criteria(self, spec: SuiteSpec, data: Any) -> list[str]:
        """Card lines (Markdown) of the acceptance criteria, from the spec and its loaded data file."""

    @abstractmethod
    def compare_archived(self, spec: SuiteSpec, suite_dir: Path, out: Path, meta: Mapping[str, Any],
                         node_name: str | None, version: Mapping[str, Path], plot: bool = True) -> SuiteResult:
        """The verdict of a suite from the files its fetch archived in ``suite_dir``, judged against
        the baseline version in use (its files, name -> local path; {}: what ships). ``plot=False``
        draws no figure of ours (a benchmark judging thousands of runs; the verdict is the same)."""

    @abstractmethod
    def cli_args(self, parser: argparse.ArgumentParser) -> None:
        """Add this engine's options to a ``compare <suite>`` parser."""

    @abstractmethod
    def cli_compare(self, args: argparse.Namespace, spec: SuiteSpec, out: Path) -> SuiteResult:
        """The verdict from command-line arguments."""

    # --- the live check ----------------------------------------------------------------------------
    def live_baseline(self, spec: SuiteSpec) -> str | None:
        """The remote path of the tracker the live check compares against (a spec field), if any."""
        return None

    @abstractmethod
    def live(self, spec: SuiteSpec, baseline: bytes | None, data: Any) -> LiveCheck | None:
        """The live check of a training (serialisable: it travels to the triggerer), from the spec,
        the baseline tracker's bytes (None: there is none) and the data model in use; None when
        nothing can be judged live."""

    # --- confirming a FAIL (core.confirm) ---------------------------------------------------------
    def run_points(self, spec: SuiteSpec, suite_dir: Path, result: SuiteResult,
                   version: Mapping[str, Path]) -> RunPoints:
        """What the confirmation rule needs of one run (its verdict, class, judged points). This base
        names the breached metrics with the direction of their breach and no points: the rule then
        falls back to one repeat; an engine whose verdict is a set of point comparisons gives them."""
        breached: dict[str, int] = {}
        not_repeatable = []
        for c in result.checks:
            if not c.breached:
                continue
            if c.current is not None and not math.isfinite(c.current):
                not_repeatable.append(f"{c.metric} is not finite" + (f" at step {c.step}" if c.step is not None
                                                                     else ""))
            diff = (c.current - c.baseline) if c.current is not None and c.baseline is not None else 0.0
            breached.setdefault(c.metric, (diff > 0) - (diff < 0) if math.isfinite(diff) else 0)
        return RunPoints(result.verdict, result.failure_class, [], breached, not_repeatable)

    def judged_layout(self, spec: SuiteSpec, version: Mapping[str, Path]) -> Layout | None:
        """Every point a complete run is judged at (metric -> threshold and steps) against the baseline version's
        files: what the error rates of a verification against that version are computed over, the same for
        every run (issue 35); None when the engine judges no point comparisons."""
        return None

    def partial_checks(self, spec: SuiteSpec, suite_dir: Path, version: Mapping[str, Path]) -> list[Check]:
        """The comparison rows a run stopped early can show, from its partial tracker (issue 35: an aborted
        run's whole table); [] when the engine judges only whole runs (its judged metrics then read
        "not reached")."""
        return []

    def spread(self, spec: SuiteSpec, version: Mapping[str, Any] | None) -> Spread | None:
        """The run-to-run spread of the judged metrics, from the baseline version's record (``version.json``:
        its runs and statistics), or None when it records none (the rule falls back to one repeat)."""
        return None

    # --- baselines --------------------------------------------------------------------------------
    @abstractmethod
    def shipped(self, spec: SuiteSpec) -> tuple[Provenance, dict[str, bytes]]:
        """Version 1 of a suite's baseline: what ships today, as (provenance, data files)."""

    def calibration_runs(self, spec: SuiteSpec) -> int:
        """N, the runs a calibration of this suite averages by default: the N of the baseline that ships."""
        return self.shipped(spec)[0].runs or 3

    def check_version(self, spec: SuiteSpec, files: Mapping[str, bytes], baseline_ref: str | None,
                      where: Any, label: str, fix: str) -> Any:
        """Validate the data files of a stored baseline version (``where(name)``: the location to name in
        an error); returns the data model it holds, or None. This base checks a baseline tracker when
        there is one (readable, complete, the spec's step count) and requires one (or a reference to the
        share's) when ``baseline_file`` is the tracker."""
        if TRACKER_FILE in files:
            check_baseline_tracker(files[TRACKER_FILE], spec.expected_steps, spec.name, where(TRACKER_FILE),
                                   f"{label} {TRACKER_FILE}", fix)
        elif self.baseline_file == TRACKER_FILE and not baseline_ref:
            raise InputError(f"{label} has neither {TRACKER_FILE} nor a baseline_ref (suite {spec.name} is judged "
                             "against a baseline tracker)", where(TRACKER_FILE), None, fix)
        return None

    def threshold_choices(self) -> list[str]:
        """The labels of the threshold sets a calibration proposal of this engine offers the approver
        (``Proposal.choices``; [] when it offers no choice)."""
        return []

    @abstractmethod
    def propose(self, spec: SuiteSpec, trackers: Mapping[str, Path], current_data: Path,
                commit: str | None) -> Any:
        """A proposed baseline from N runs' trackers (run -> path) and the data file in use
        (``core.calibration.Proposal``; ``commit``: the commit the runs trained, when known)."""
