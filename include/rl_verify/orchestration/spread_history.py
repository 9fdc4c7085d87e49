"""The spread history in the record store: what each finished verification adds to the spread the
confirmation rule learns (``core.spread``, issue 34), and what a verification reads back.

One small JSON entry per finished verification and suite, ``<root>/spread-history/<suite>/<finished
UTC>__<run key>.json``: its spread key, outcome, when it finished and every run's judged points. A
verification reads the newest entries of its suite (one listing, a bounded number of reads; no walk over
every record), and ``core.spread.select`` keeps those that are evidence. Bisection probes write none:
they run commits chosen for being near a regression.
"""

from __future__ import annotations

import json
import logging
from datetime import datetime, timedelta, timezone
from typing import Any, Mapping, Sequence

from rl_verify import settings
from rl_verify.core import confirm, spread
from rl_verify.core.names import run_key
from rl_verify.store import record
from rl_verify.suites import card
from rl_verify.suites.spec import SuiteSpec

log = logging.getLogger(__name__)

#: How many of the newest entries of a suite are read at most (the kept ones are fewer: other keys, ages).
READ_AT_MOST_FACTOR = 4


def spread_key(spec: SuiteSpec, resolved: Mapping[str, Any]) -> dict[str, Any]:
    """What a run's spread depends on: the suite, its experiment (spec as written and thresholds, with the
    baseline version it is judged against) and the node it trains on (its connection id)."""
    version = ((resolved.get("baselines") or {}).get(spec.name) or {}).get("version")
    node = (resolved.get("suite_nodes") or {}).get(spec.name) or resolved.get("node")
    return {"suite": spec.name, "experiment": card.experiment_fingerprint([spec], versions={spec.name: version}),
            "baseline_version": version, "node": node}


def _folder(suite: str) -> Any:
    return record.store_root() / settings.SPREAD_HISTORY_FOLDER / suite


def keep(suite: str, dag_run_id: str, key: Mapping[str, Any], outcome: str | None,
         runs: Sequence[confirm.RunPoints], now: datetime | None = None) -> str | None:
    """Add this verification's entry (none for a bisection probe); return its location, None when not kept.
    A store that cannot take it costs the history one entry, never the verification."""
    if settings.verification_dag_of(dag_run_id) != settings.DAG_ID:
        return None
    now = now or datetime.now(timezone.utc)
    entry = {"label": dag_run_id, "key": dict(key), "outcome": outcome, "finished_at": now.isoformat(),
             "runs": [_run_json(r) for r in runs]}
    dest = _folder(suite) / f"{now.strftime('%Y%m%dT%H%M%S%fZ')}__{run_key(dag_run_id)}.json"
    try:
        record.make_parent(dest)
        dest.write_bytes((json.dumps(entry, sort_keys=True) + "\n").encode("utf-8"))
    except Exception as err:  # the verdict stands without it
        log.warning("Could not add %s to the spread history (%s: %s)", dag_run_id, type(err).__name__, err)
        return None
    return str(dest)


def read(suite: str, newest: int) -> list[spread.Past]:
    """The newest ``newest`` entries of ``suite`` (fewer when there are fewer); an unreadable entry is skipped
    with a warning."""
    folder = _folder(suite)
    try:
        names = sorted((p for p in folder.iterdir() if p.name.endswith(".json")), key=lambda p: p.name,
                       reverse=True)[:newest] if folder.exists() else []
    except Exception as err:
        log.warning("Could not list the spread history of %s (%s: %s): learning from the repeats only", suite,
                    type(err).__name__, err)
        return []
    out = []
    for path in names:
        try:
            out.append(_past(json.loads(path.read_bytes())))
        except Exception as err:
            log.warning("Spread history entry %s left out: %s: %s", path.name, type(err).__name__, err)
    return out


def learned(prior: confirm.Spread | None, spec: SuiteSpec, resolved: Mapping[str, Any], dag_run_id: str,
            repeats: Sequence[confirm.RunPoints], now: datetime | None = None,
            drift: bool = True) -> confirm.Spread | None:
    """The spread the rule judges this verification's repeats against: ``prior`` learned from ``repeats`` and
    the kept history (``core.spread.learn``); None when there is no prior (an engine with no spread).
    ``drift=False``: no drift test (a repeat gate: only the outcome reports it; SciPy's F stays unimported)."""
    if prior is None:
        return None
    now = now or datetime.now(timezone.utc)
    key = spread_key(spec, resolved)
    pasts = read(spec.name, settings.SPREAD_HISTORY_MAX * READ_AT_MOST_FACTOR)
    kept, skipped = spread.select(pasts, key, now, timedelta(days=settings.SPREAD_HISTORY_DAYS),
                                  settings.SPREAD_HISTORY_MAX, current=dag_run_id)
    if skipped:
        log.info("Spread history of %s: %d kept, left out: %s", spec.name, len(kept),
                 ", ".join(f"{n} ({why})" for why, n in sorted(skipped.items())))
    return spread.learn(prior, repeats, kept, settings.SPREAD_DRIFT_P if drift else None)


def describe(learned_spread: confirm.Spread | None) -> dict[str, Any] | None:
    """The spread that decided, for outcome.json and the report: per metric sigma, the prior's, their ratio,
    degrees of freedom and step-to-step correlation (issue 51); its sources in words; the drift alarm."""
    if learned_spread is None:
        return None
    moved = spread.moved(learned_spread)
    return {"sources": list(learned_spread.sources), "drift": list(learned_spread.drift),
            "metrics": {m: {"sigma": s, "prior_sigma": learned_spread.prior_sigma.get(m),
                            "moved": moved.get(m), "df": _finite(learned_spread.df.get(m)),
                            "correlation": learned_spread.correlation.get(m)}
                        for m, s in sorted(learned_spread.sigma.items())}}


def _finite(value: float | None) -> float | None:
    return None if value is None or value == float("inf") else round(float(value), 1)


def _run_json(run: confirm.RunPoints) -> dict[str, Any]:
    return {"verdict": run.verdict, "complete": run.complete,
            "points": [[p.metric, p.step, p.diff] for p in run.points]}


def _past(data: Mapping[str, Any]) -> spread.Past:
    finished = datetime.fromisoformat(data["finished_at"])
    if finished.tzinfo is None:
        finished = finished.replace(tzinfo=timezone.utc)
    runs = tuple(confirm.RunPoints(r.get("verdict") or "", None,
                                   [confirm.Point(str(m), int(s), float(d), 0.0, False) for m, s, d in r["points"]],
                                   complete=bool(r.get("complete", True))) for r in data.get("runs") or [])
    return spread.Past(str(data["label"]), dict(data["key"]), data.get("outcome"), finished, runs)
