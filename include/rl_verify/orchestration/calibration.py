"""Task bodies of the baseline calibration DAG (``dags/rl_baseline_calibration.py``).

N runs of a reference commit per suite, trained like a verification run trains (the same
``SuiteTrainingOperator``, launch, watch, fetch and cleanup), each with its own seed and its own
worktree on its node; the runs are spread round robin over the ``nodes`` param (one training per node
at a time, in the node's pool: ``placement.calibration_nodes`` and the cluster policy agree on it).
The trackers become a proposal (``Engine.propose``: statistics, tables, warnings, plots) that a
person approves; approved, it is written as a new baseline version with its provenance and made
current (``rl_verify.store.baselines``). Everything the calibration produced is kept in the run's record
under ``calibration/``.
"""

from __future__ import annotations

import json
import logging
from datetime import date, datetime, timezone
from pathlib import Path
from typing import Any, Mapping

from airflow.sdk.exceptions import AirflowFailException

from rl_verify import settings
from rl_verify.core.errors import InputError
from rl_verify.core.names import run_key, short_sha
from rl_verify.core.provenance import Provenance
from rl_verify.core.tracker import read_tracker
from rl_verify.engines import engine_of, load_suite
from rl_verify.node import ops as node
from rl_verify.node import placement, remote
from rl_verify.orchestration import links, spread_history
from rl_verify.orchestration.nodes import (check_nodes, expanded_specs, no_retry_on, node_launcher, node_problems,
                                           node_settings, pool_problems, ssh_client, suite_node)
from rl_verify.store import baselines, record

log = logging.getLogger(__name__)

FOLDER = settings.CALIBRATION_RECORD_FOLDER
#: A calibration's record is ``<record root>/<this DAG id>/<run key>/``, apart from the verification runs'.
DAG_ID = settings.CALIBRATION_DAG_ID
MAX_RUNS = 20
#: The approval form's field where the approver picks a proposal's thresholds (``Proposal.choices``).
THRESHOLDS_PARAM = "thresholds"


def run_folder(suite: str, index: int) -> str:
    """The record folder of run ``index`` (1-based) of ``suite``."""
    return f"{FOLDER}/{suite}/run{index}"


def validated_params(params: Mapping[str, Any]) -> dict[str, Any]:
    """commit, suites, nodes and N per suite from the run's params; every problem named at once."""
    problems: list[str] = []
    out: dict[str, Any] = {}
    for name, check in (("commit", remote.validate_commit), ("suites", remote.validate_suites),
                        ("nodes", placement.node_list)):
        try:
            out[name] = check(params.get(name))
        except ValueError as err:
            problems.append(str(err))
    runs = params.get("runs")
    out["runs"] = {}
    specs = {suite: load_suite(suite) for suite in out.get("suites", [])}
    defaults = {suite: engine_of(spec).calibration_runs(spec) for suite, spec in specs.items()}
    for suite in out.get("suites", []):
        n = defaults[suite] if runs in (None, "") else runs
        if isinstance(n, bool) or not isinstance(n, int) or not 2 <= n <= MAX_RUNS:
            problems.append(f"param 'runs': N = {n!r} for {suite}: a mean and a run-to-run deviation need at least "
                            f"2 runs (and at most {MAX_RUNS}); give 2..{MAX_RUNS}, or leave it empty for the runbook's "
                            f"N, that of each suite's shipped baseline "
                            f"({', '.join(f'{s} {k}' for s, k in defaults.items())})")
            break
        out["runs"][suite] = n
    if problems:
        raise remote.BadInput(f"{len(problems)} problem(s) with the calibration's params; nothing was launched:\n"
                              + "\n".join(f"  - {p}" for p in problems))
    return out


def plan(params: Mapping[str, Any], dag_run_id: str) -> list[dict[str, Any]]:
    """Validate everything, make one worktree of the commit per run on its node, check every input on
    every node; return the trainings in the order of the mapped task (``suite``, ``resolved``,
    ``record_as``), which ``placement.calibration_nodes`` also follows."""
    with no_retry_on(remote.BadInput, ValueError):
        p = validated_params(params)
        per_node = {conn: node_problems(conn) for conn in p["nodes"]}
        problems = [line for lines in per_node.values() for line in lines]
        problems += pool_problems([conn for conn, lines in per_node.items() if not lines])
        if problems:
            raise ValueError(f"{len(problems)} problem(s) with the node(s) of this calibration; nothing was "
                             "launched:\n" + "\n".join(f"  - {line}" for line in problems))
    with no_retry_on(OSError):
        where = record.ensure_store_writable(dag_run_id, dag_id=DAG_ID)
    runs = [(suite, i) for suite in p["suites"] for i in range(1, p["runs"][suite] + 1)]
    placed = placement.calibration_nodes(p["nodes"], len(runs))
    key = run_key(dag_run_id)
    trainings: list[dict[str, Any] | None] = [None] * len(runs)
    for conn in dict.fromkeys(placed):
        values = node_settings(conn)
        with ssh_client(conn) as client:
            gpus = node.hardware(client)
            for k, ((suite, i), at) in enumerate(zip(runs, placed)):
                if at != conn:
                    continue
                training_key = f"{key}-{suite}-r{i}"
                with no_retry_on(node.NodeError):
                    found = node.resolve_commit(client, values[settings.NODE_CHECKOUT_KEY],
                                                values[settings.REMOTE_RUNS_DIR_KEY], training_key, p["commit"])
                found.pop("tree")  # a calibration trains whatever the diff: no path rule to check
                resolved = {**found, "run_key": training_key, "suites": [suite], "node": conn,
                            "suite_nodes": {suite: conn},
                            "nodes": {conn: {"run_dir": found["run_dir"], "worktree": found["worktree"]}},
                            "early_abort": False, "record": where, "baselines": {}, "seed": k + 1,
                            "hardware": gpus}
                trainings[k] = {"suite": suite, "resolved": resolved, "record_as": run_folder(suite, i)}
    done = [t for t in trainings if t is not None]
    shas = {t["resolved"]["sha"] for t in done}
    if len(shas) > 1:
        raise AirflowFailException(f"commit {p['commit']!r} is not the same commit on every node "
                                   f"({', '.join(sorted(short_sha(s) for s in shas))}): give a full SHA")
    # Each node's suites, checked from its first run's worktree (the runs' worktrees are one commit).
    groups: dict[str, tuple[list[str], str]] = {}
    for t in done:
        suites, _ = groups.setdefault(t["resolved"]["node"], ([], t["resolved"]["worktree"]))
        if t["suite"] not in suites:
            suites.append(t["suite"])
    check_nodes(groups, done[0]["resolved"]["run_key"])
    record.put_json(dag_run_id, f"{FOLDER}/plan.json", {"commit": p["commit"], "sha": shas.pop(), "runs": p["runs"],
                                                        "nodes": p["nodes"], "trainings": done}, dag_id=DAG_ID)
    for t in done:
        log.info("%s run %s on %s (seed %d): worktree %s", t["suite"], t["record_as"].rsplit("run", 1)[1],
                 t["resolved"]["node"], t["resolved"]["seed"], t["resolved"]["worktree"])
    return done


def fetch_runs(trainings: list[dict[str, Any]], dag_run_id: str) -> dict[str, Any]:
    """Archive every run's tracker and logs into the record (``calibration/<suite>/run<i>/``); fail
    naming every run whose tracker is missing or short (a short run cannot be part of a baseline)."""
    problems: list[str] = []
    steps: dict[str, int] = {}
    with record.workspace(dag_run_id, parts=[], dag_id=DAG_ID) as run_dir:
        for t in trainings:
            resolved, suite = t["resolved"], t["suite"]
            conn, folders = suite_node(resolved, suite)
            spec = expanded_specs([suite], node_settings(conn), folders["worktree"])[0]
            dest = run_dir / t["record_as"]
            with ssh_client(conn) as client:
                meta = node.fetch_suite(client, spec, remote.RunLayout(folders["run_dir"]), dest, with_baseline=False)
            tracker = meta["files"].get("tracker")
            count = read_tracker(tracker["local"], metrics=[]).steps if tracker else 0
            steps[t["record_as"]] = count
            problems += [f"{t['record_as']} ({conn}): {p}" for p in meta["problems"]]
            if tracker and count != spec.expected_steps:
                problems.append(f"{t['record_as']} ({conn}): {count} step-summary rows, expected {spec.expected_steps}")
            record.write_json(dest / "fetch.json", {**meta, "steps": count})
    if problems:
        raise AirflowFailException(f"{len(problems)} calibration run(s) unusable; nothing is proposed:\n"
                                   + "\n".join(f"  - {p}" for p in problems))
    return {"steps": steps}


def propose(trainings: list[dict[str, Any]], dag_run_id: str) -> dict[str, Any]:
    """Each suite's proposal from its N runs, against its current baseline version: the version's
    files, ``proposal.md`` and a plot of the N curves, their band and the current baseline, kept in
    ``calibration/<suite>/proposal/``. Returns the Markdown the approver reads and each suite's
    proposal summary. A proposal the N runs of the reference commit would fail is refused."""
    plan_data = record.get_json(dag_run_id, f"{FOLDER}/plan.json", dag_id=DAG_ID) or {}
    sha = plan_data.get("sha")
    suites = list(dict.fromkeys(t["suite"] for t in trainings))
    versions = baselines.in_use(suites, {})
    body = [f"# Baseline calibration of `{sha}`", "",
            f"**DAG run:** `{dag_run_id}` · nodes: {', '.join(plan_data.get('nodes', []))}", ""]
    summary: dict[str, Any] = {}
    with record.workspace(dag_run_id, parts=[FOLDER], dag_id=DAG_ID) as run_dir:
        for suite in suites:
            spec = load_suite(suite)
            engine = engine_of(spec)
            mine = [t for t in trainings if t["suite"] == suite]
            trackers = {t["record_as"].rsplit("/", 1)[1]: _tracker_of(run_dir / t["record_as"]) for t in mine}
            folder = run_dir / FOLDER / suite / "proposal"
            folder.mkdir(parents=True, exist_ok=True)
            current_files = _written(folder / "current", baselines.version_files(suite, versions[suite]["version"]))
            current = engine.data_in_use(spec, current_files)
            proposal = engine.propose(spec, trackers, current, sha)
            for name, data in proposal.files.items():
                record.write_atomic(folder / name, data)
            _verify_own_runs(spec, run_dir, mine, {name: folder / name for name in proposal.files})
            baseline_tracker = None if engine.baseline_is_data else current_files.get(engine.baseline_file)
            png = _plot(suite, trackers, folder / "runs.png", current, baseline_tracker, spec)
            text = (f"## {suite}: proposal from N = {len(trackers)} runs, against the current "
                    f"{versions[suite]['label']}\n\n{proposal.markdown}\n"
                    f"Plot of the {len(trackers)} runs, their band and the current baseline: "
                    f"`{record.location(dag_run_id, dag_id=DAG_ID)}/{FOLDER}/{suite}/proposal/{png.name}`\n")
            text += "\n".join(_spread_beside(spec, versions[suite]["version"], current_files, len(trackers),
                                              proposal.statistics, plan_data.get("nodes") or [], dag_run_id))
            warnings = ["**Warnings**", ""] + [f"- {w}" for w in proposal.warnings] + [""] if proposal.warnings else []
            record.write_atomic(folder / "proposal.md", "\n".join([text, *warnings]))
            body += [text, _plot_markdown(suite, len(trackers), dag_run_id), "", *warnings]
            summary[suite] = {"runs": len(trackers), "against": versions[suite]["version"],
                              "files": sorted(proposal.files), "warnings": proposal.warnings,
                              "statistics": proposal.statistics, "choices": proposal.choices}
    choices = [c for info in summary.values() for c in info["choices"]]
    body.append("Approve: each proposal becomes a new baseline version and the current one"
                + (f", with the thresholds you pick in the form ('{THRESHOLDS_PARAM}': "
                   + " or ".join(f"'{c}'" for c in dict.fromkeys(choices)) + f"; default '{choices[0]}')"
                   if len(set(choices)) > 1 else "") + ". Reject: nothing changes.")
    markdown = "\n".join(body)
    record.put_json(dag_run_id, f"{FOLDER}/proposal.json", {"sha": sha, "suites": summary}, dag_id=DAG_ID)
    log.info("Proposal:\n%s", markdown)
    return {"markdown": markdown, "sha": sha, "suites": summary}


def _spread_beside(spec: Any, version: int, current_files: Mapping[str, Path], runs: int,
                   statistics: Mapping[str, Any], nodes: list[str], dag_run_id: str) -> list[str]:
    """Markdown: per metric, the run-to-run sigma of this calibration's runs beside the one the confirmation
    rule has learned on each node from the current version's verifications (``core.spread``); [] for an
    engine with no spread."""
    engine = engine_of(spec)
    provenance = current_files.get(baselines.VERSION_FILE)
    prior = engine.spread(spec, json.loads(provenance.read_text()) if provenance else None)
    own = engine.spread(spec, {"runs": runs, "statistics": statistics})
    if prior is None or own is None:
        return []
    learned = {conn: spread_history.learned(prior, spec, {"baselines": {spec.name: {"version": version}},
                                                          "suite_nodes": {spec.name: conn}}, dag_run_id, [])
               for conn in nodes}
    lines = ["", f"Run-to-run sigma: these {runs} runs beside what verifications learned against the current "
                 "version (its prior pooled with their repeats and healthy history; the confirmation rule decides "
                 "with it):", "",
             "| metric | these runs | current version's prior | "
             + " | ".join(f"learned on {c}" for c in learned) + " |",
             "|---|---|---|" + "---|" * len(learned)]
    for metric in sorted(own.sigma):
        cells = [f"{learned[c].sigma[metric]:.4g} ({learned[c].sigma[metric] / prior.sigma[metric]:.2f}x)"
                 if metric in prior.sigma and prior.sigma[metric] else "-" for c in learned]
        lines.append(f"| {metric} | {own.sigma[metric]:.4g} | "
                     f"{format(prior.sigma[metric], '.4g') if metric in prior.sigma else '-'} | " + " | ".join(cells)
                     + " |")
    lines += [""] + [f"- learned on {c}: {'; '.join(s.sources)}" for c, s in learned.items()]
    lines += [f"- drift on {c}: {alarm}" for c, s in learned.items() for alarm in s.drift] + [""]
    return lines


def _plot_markdown(suite: str, runs: int, dag_run_id: str) -> str:
    """The proposal plot as a Markdown image the approval card shows, served by the UI plugin."""
    path = links.proposal_plot_path(DAG_ID, dag_run_id, suite)
    url = links.absolute(links.ui_base_url(), path)
    # A linked image: Airflow's Markdown shows images at most 300 px wide; a click opens it at full size.
    return (f"[![{suite}: the {runs} runs, their band and the current baseline]({url})]({url})\n\n"
            f"(click the plot to open it at full size)")


def _verify_own_runs(spec: Any, run_dir: Path, runs: list[dict[str, Any]], proposed: Mapping[str, Path]) -> None:
    """Every run of the reference commit judged against the proposal by the suite's own comparison
    (GRPO: the checkout's checker): a proposal its own runs FAIL is refused, nothing is promoted."""
    failed = []
    for t in runs:
        folder = run_dir / t["record_as"]
        meta = record.relocate(record.read_json(folder / "fetch.json") or {}, run_dir)
        result = engine_of(spec).compare_archived(spec, folder, folder / "self-check", meta, t["resolved"]["node"],
                                                  proposed)
        if not result.passed:
            breached = sorted({c.metric for c in result.checks if c.passed is False})
            failed.append(f"{t['record_as']}: {result.verdict} ({result.failure_class}): "
                          + (", ".join(breached) or "; ".join(result.abnormal[:2])))
    if failed:
        raise AirflowFailException(f"the reference commit fails its own verification against the {spec.name} "
                                   f"proposal, so its runs cannot be a baseline; nothing is proposed:\n"
                                   + "\n".join(f"  - {line}" for line in failed))


def _tracker_of(folder: Path) -> Path:
    meta = record.relocate(record.read_json(folder / "fetch.json") or {}, folder.parents[2])
    tracker = (meta.get("files") or {}).get("tracker")
    if not tracker:
        raise InputError("the run has no tracker", folder, None, "see the fetch_runs task")
    return Path(tracker["local"])


def _written(folder: Path, files: Mapping[str, bytes]) -> dict[str, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    out = {}
    for name, data in files.items():
        (folder / name).write_bytes(data)
        out[name] = folder / name
    return out


def _plot(suite: str, trackers: Mapping[str, Path], out: Path, current_data: Path, baseline_tracker: Path | None,
          spec: Any) -> Path:
    """One panel per judged metric: every run's curve, the band (min..max) and mean, and the current
    baseline (golden values at the eval points, or ``baseline_tracker``'s curve)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from rl_verify.core.calibration import run_table, step_statistics, tracker_values  # pandas

    engine = engine_of(spec)
    data = engine.load_data(current_data)
    metrics = engine.judged_metrics(data)
    table = run_table(trackers, metrics, spec.expected_steps)
    stats = step_statistics(table)
    shown = [m for m in metrics if (stats["metric"] == m).any()]
    current_curve: dict[str, list[tuple[int, float]]] = {}
    if baseline_tracker is not None:
        for step, metric, value in tracker_values(read_tracker(baseline_tracker, shown), shown):
            current_curve.setdefault(metric, []).append((step, value))
    # Two columns: the card shows the plot in a narrow column, where a tall single stack is unreadable.
    cols = 2 if len(shown) > 2 else 1
    rows_n = -(-len(shown) // cols)
    fig, axes = plt.subplots(rows_n, cols, figsize=(5 * cols, 2.6 * rows_n), squeeze=False)
    for ax in axes.flat[len(shown):]:
        ax.set_visible(False)
    for ax, metric in zip(axes.flat, shown):
        mine = table[table["metric"] == metric]
        for run, rows in mine.groupby("run"):
            ax.plot(rows["step"], rows["value"], lw=0.8, alpha=0.7, label=str(run))
        s = stats[stats["metric"] == metric]
        ax.fill_between(s["step"], s["min"], s["max"], alpha=0.2, label="band (min..max)")
        ax.plot(s["step"], s["mean"], color="black", lw=1.4, label="mean (proposed)")
        if current_curve.get(metric):
            ax.plot(*zip(*sorted(current_curve[metric])), color="red", lw=1.0, ls="--", label="current baseline")
        points = engine.reference_points(data, metric)
        if points:
            ax.scatter(*zip(*points), color="red", marker="x", zorder=5, label="current golden")
        ax.set_title(metric, fontsize=9)
        ax.tick_params(labelsize=7)
    axes[0, 0].legend(fontsize=6, loc="best")
    fig.suptitle(f"{suite}: {len(trackers)} calibration runs", fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.985))
    fig.savefig(out, dpi=80)
    plt.close(fig)
    return out


def chosen_files(info: Mapping[str, Any], choice: str | None) -> tuple[str, dict[str, str]]:
    """The approver's choice among a proposal's ``choices`` (the first when none or an unknown one was
    picked) and the version's files: version file name -> the proposal file written there. A file the
    choice replaces is kept beside it, as ``<name without .json>-<replaced by>`` (nothing is lost)."""
    choices = info.get("choices") or {}
    label = choice if choice in choices else next(iter(choices), "")
    mapping = {name: name for name in info["files"]}
    for target, source in (choices.get(label) or {}).items():
        mapping.pop(source, None)
        mapping[f"{Path(target).stem}-runbook{Path(target).suffix}"] = target
        mapping[target] = source
    return label, mapping


def promote(proposal: Mapping[str, Any], decision: Mapping[str, Any] | None, dag_run_id: str) -> dict[str, int]:
    """Write each suite's approved proposal as a new baseline version (with the thresholds the approver
    picked, when the proposal offers a choice) with its provenance and make it current; returns suite ->
    the new version."""
    plan_data = record.get_json(dag_run_id, f"{FOLDER}/plan.json", dag_id=DAG_ID) or {}
    by = _approver(decision)
    at = datetime.now(timezone.utc)
    trainings = plan_data.get("trainings", [])
    out: dict[str, int] = {}
    with record.workspace(dag_run_id, parts=[FOLDER], dag_id=DAG_ID) as run_dir:
        for suite, info in proposal["suites"].items():
            folder = run_dir / FOLDER / suite / "proposal"
            nodes = sorted({t["resolved"]["node"] for t in trainings if t["suite"] == suite})
            label, files = chosen_files(info, ((decision or {}).get("params_input") or {}).get(THRESHOLDS_PARAM))
            provenance = Provenance(
                source="calibration", commit=proposal["sha"], runs=info["runs"], dag_run_ids=(dag_run_id,),
                dates=(date.today().isoformat(),), node=", ".join(nodes), hardware=_hardware(trainings, suite),
                approved_by=by, approved_at=at, statistics={**info["statistics"], "threshold_choice": label},
                note=(f"calibration DAG run {dag_run_id}, against v{info['against']}"
                      + (f"; thresholds: {label}" if label else "")))
            version = baselines.add_version(suite, provenance,
                                            {name: folder / source for name, source in files.items()})
            baselines.promote(suite, version, by)
            out[suite] = version
            log.info("%s: baseline v%d written and made current (approved by %s)", suite, version, by)
    return out


def _approver(decision: Mapping[str, Any] | None) -> str:
    user = (decision or {}).get("responded_by_user") or {}
    name = user.get("name") or user.get("id") if isinstance(user, Mapping) else str(user)
    return str(name or "unknown")


def _hardware(trainings: list[dict[str, Any]], suite: str) -> str | None:
    """``node: GPUs`` of each node that trained ``suite`` (``nvidia-smi -L`` at planning)."""
    seen = {t["resolved"]["node"]: t["resolved"].get("hardware") for t in trainings if t["suite"] == suite}
    return "; ".join(f"{n}: {hw or 'unknown'}" for n, hw in sorted(seen.items())) or None


def cleanup(trainings: list[dict[str, Any]] | None, dag_run_id: str) -> list[str]:
    """Stop whatever the calibration's runs left on their nodes (every run folder)."""
    lines: list[str] = []
    for t in trainings or []:
        conn, folders = suite_node(t["resolved"], t["suite"])
        with ssh_client(conn) as client:
            lines += node.cleanup(client, folders["run_dir"], t["resolved"]["run_key"], node_launcher(conn))
    left = [line for line in lines if line.startswith("LEFT")]
    log.info("cleanup: the node(s) are %s", "clean" if not left else "NOT clean: " + "; ".join(left))
    return lines
