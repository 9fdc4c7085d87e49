"""What the record store holds of earlier verifications, as a bisection asks it: every verification's
report, the ends of a range the record already decided (same commit and experiment fingerprint), the
newest verified PASS of some suites, and a run's card fingerprint.
"""

from __future__ import annotations

import json
from typing import Any, Iterable, Mapping

from rl_verify import settings
from rl_verify.core import bisect
from rl_verify.core.model import is_infrastructure
from rl_verify.orchestration import links
from rl_verify.orchestration.standing import card_fingerprint
from rl_verify.store import record

#: A suite's outcomes that decide a commit's reading (a range's end taken from the record).
DECIDED = ("PASS", "PASS (not reproduced)", "PASS (unchanged)", "PASS (bitwise)", "FAIL (reproduced)")
#: A suite's outcomes that verified its commit by a full run (a base the path-aware skip may rest on).
FULL_PASSES = ("PASS", "PASS (not reproduced)")
#: A suite's outcomes that say its commit's numbers are not known good (issue 42): a shortcut must never say PASS
#: against them. A FAIL classed infrastructure says nothing of the numbers (the node, the launch) and is left out.
DOUBTING = ("FAIL (reproduced)", "FAIL", "INCONCLUSIVE")


def verification_reports() -> Iterable[tuple[str, dict[str, Any], Any]]:
    """(run folder name, report.json, folder) of every verification run in the record store."""
    root = record.dag_store(settings.DAG_ID)
    if not root.exists():
        return
    for folder in root.iterdir():
        path = folder / "report.json"
        try:
            yield folder.name, json.loads(path.read_bytes()), folder
        except (OSError, ValueError):
            continue


def fingerprint_of(sha: str, suites: list[str]) -> str | None:
    """The experiment fingerprint of the newest recorded verification of ``sha`` with these suites (newest by
    when its report was written, as in ``last_pass``: probes' run ids carry no time)."""
    newest_first = sorted(verification_reports(), key=lambda r: _written_at(r[2] / "report.json"), reverse=True)
    for _, report, folder in newest_first:
        if report.get("commit") == sha and sorted(s.get("suite") for s in report.get("suites") or []) == sorted(suites):
            return folder_fingerprint(folder)
    return None


def folder_fingerprint(folder: Any) -> str | None:
    card = folder / "card.md"
    try:
        return card_fingerprint(card.read_text()) if card.exists() else None
    except OSError:
        return None


def recorded_readings(shas: list[str], suites: list[str], fingerprint: str | None,
                      baselines: Mapping[str, str] | None = None) -> dict[str, bisect.Reading]:
    """The ends of ``shas`` that the record already decided: a verification of that exact commit with the same
    experiment fingerprint (suites, specs, thresholds, golden data, baseline versions, repeats) whose every
    suite ended PASS, PASS (not reproduced) or FAIL (reproduced). None without a fingerprint to match."""
    if not fingerprint:
        return {}
    ends = {shas[0], shas[-1]}
    found: dict[str, bisect.Reading] = {}
    for _, report, folder in verification_reports():
        sha = report.get("commit")
        if sha not in ends or sha in found:
            continue
        rows = report.get("suites") or []
        if sorted(r.get("suite") for r in rows) != sorted(suites) or folder_fingerprint(folder) != fingerprint:
            continue
        if baselines and any((report.get("baselines") or {}).get(s) != v for s, v in baselines.items()):
            continue
        outcomes = [suite_outcome(r) for r in rows]
        if all(o in DECIDED for o in outcomes):
            found[sha] = bisect.Reading.BAD if "FAIL (reproduced)" in outcomes else bisect.Reading.GOOD
    return found


def suite_outcome(row: Mapping[str, Any]) -> str:
    """A report.json suite row's outcome over its runs (its one run's verdict when it was not repeated)."""
    return str((row.get("outcome") or {}).get("outcome") or row.get("verdict") or "FAIL")


def last_pass(suites: list[str], not_sha: str | None) -> str | None:
    """The commit of the newest verification in the record whose every one of ``suites`` PASSed."""
    best: tuple[float, str] | None = None
    for _, report, folder in verification_reports():
        rows = {r.get("suite"): r for r in report.get("suites") or []}
        if report.get("commit") in (None, not_sha) or not all(s in rows for s in suites):
            continue
        if all(suite_outcome(rows[s]) in FULL_PASSES for s in suites):
            when = _written_at(folder / "report.json")
            if best is None or when > best[0]:
                best = (when, report["commit"])
    return best[1] if best else None


def verified_passes(wanted: Mapping[str, tuple[str, str | None]]) -> dict[str, dict[str, Any]]:
    """Per suite of ``wanted`` (suite -> its per-suite experiment fingerprint and its baseline version's label),
    the newest verification where it PASSed in a full run with that fingerprint (``commit.json``'s
    ``suite_fingerprints``), that baseline version and a clean worktree, as ``sha``, ``run_id``, ``report`` (the
    link) and ``written_at`` (when its report was written, epoch seconds); suites without one are left out. A
    PASS (unchanged) is no base: the skip always rests on a commit that was trained. One pass over the record."""
    best: dict[str, dict[str, Any]] = {}
    for _, report, folder in verification_reports():
        rows = {r.get("suite"): r for r in report.get("suites") or []}
        candidates = [suite for suite, (_, label) in wanted.items()
                      if suite in rows and suite_outcome(rows[suite]) in FULL_PASSES
                      and (report.get("baselines") or {}).get(suite) == label]
        if not candidates or not report.get("commit"):
            continue
        try:
            resolved = json.loads((folder / "commit.json").read_bytes())
        except (OSError, ValueError):
            continue  # a run from before the path-aware skip (or a broken record): no base
        if resolved.get("dirty_stat"):
            continue
        when = _written_at(folder / "report.json")
        run_id = str(report.get("dag_run_id") or folder.name)
        for suite in candidates:
            if (resolved.get("suite_fingerprints") or {}).get(suite) != wanted[suite][0]:
                continue
            if suite not in best or when > best[suite]["written_at"]:
                best[suite] = {"sha": report["commit"], "run_id": run_id, "written_at": when,
                               "report": links.report_view_path(settings.DAG_ID, run_id)}
    return best


def _written_at(path: Any) -> float:
    """When the record file was written (0 when the store cannot say): run ids of probes carry no time."""
    try:
        return float(path.stat().st_mtime)
    except (OSError, AttributeError, TypeError, ValueError):
        return 0.0


def suite_verdicts(suites: Iterable[str]) -> list[dict[str, Any]]:
    """Every full verdict the record holds of ``suites`` (the verification's and the probes' runs), newest first:
    ``suite``, ``sha``, ``outcome``, ``failure_class`` (the first run's), ``run_id``, ``report`` (the link),
    ``written_at`` and ``doubting`` (the outcome doubts the commit's numbers: ``DOUBTING``, not infrastructure).
    A shortcut's PASS is no verdict of its own and is left out. One pass over the record."""
    wanted, out = set(suites), []
    for _, report, folder in verification_reports():
        sha = report.get("commit")
        if not sha:
            continue
        run_id = str(report.get("dag_run_id") or folder.name)
        when = _written_at(folder / "report.json")
        for row in report.get("suites") or []:
            outcome = suite_outcome(row)
            if row.get("suite") not in wanted or outcome not in DOUBTING + FULL_PASSES:
                continue
            failure = row.get("failure_class")
            out.append({"suite": row["suite"], "sha": sha, "outcome": outcome, "failure_class": failure,
                        "run_id": run_id, "written_at": when,
                        "report": links.report_view_path(settings.verification_dag_of(run_id), run_id),
                        "doubting": outcome in DOUBTING and not is_infrastructure(failure)})
    return sorted(out, key=lambda v: v["written_at"], reverse=True)


def doubted(verdicts: Iterable[Mapping[str, Any]], suite: str, sha: str) -> dict[str, Any] | None:
    """The record's newest full verdict of ``suite`` at ``sha`` when it doubts the commit (a later full PASS of the
    same commit clears an earlier FAIL), else None."""
    for verdict in verdicts:  # newest first
        if verdict["suite"] == suite and verdict["sha"] == sha:
            return dict(verdict) if verdict["doubting"] else None
    return None


def doubt_words(verdict: Mapping[str, Any], of: str = "this commit") -> str:
    """One phrase naming a doubting verdict for the card and the report: "<suite> ended FAIL (reproduced) at this
    commit in run R (its report: link)"."""
    klass = f", {verdict['failure_class']}" if verdict.get("failure_class") and verdict["outcome"] != "INCONCLUSIVE" \
        else ""
    return (f"{verdict['suite']} ended {verdict['outcome']}{klass} at {of} in run {verdict['run_id']} (its report: "
            f"{verdict['report']})")


def identical_readings(suite: str, sha: str) -> list[dict[str, Any]]:
    """The lane readings (``<suite>/lane.json``) of the record's runs at ``sha`` whose bits were the reference's:
    what says that commit's first steps equal a reference (issue 42: a FAIL of it makes that reference blind)."""
    out = []
    for _, report, folder in verification_reports():
        if report.get("commit") != sha:
            continue
        try:
            reading = json.loads((folder / suite / "lane.json").read_bytes())
        except (OSError, ValueError):
            continue
        if reading.get("identical"):
            out.append(reading)
    return out
