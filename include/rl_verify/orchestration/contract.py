"""The values the DAG's tasks pass each other (XCom), typed in one place.

Each is JSON-ready (Airflow serialises XCom as JSON) and small: trackers, logs and reports travel
through the record store, never through XCom. The producing task is named on each type.
"""

from __future__ import annotations

from typing import Any, NotRequired, TypedDict


class NodeFolders(TypedDict):
    """The run's folders on one node (each node has its own checkout, so its own worktree)."""

    run_dir: str
    worktree: str


class Resolved(TypedDict):
    """``resolve_commit``: the commit under test and the run's folders on each node it uses.

    ``node``, ``run_dir`` and ``worktree`` are those of the first suite's node; ``suite_nodes`` says
    where every suite trains and ``nodes`` gives each node's folders.
    """

    commit_ref: str
    sha: str
    subject: str
    run_dir: str
    worktree: str
    dirty_stat: str | None
    warnings: list[str]
    run_key: str
    suites: list[str]
    node: str
    suite_nodes: dict[str, str]
    nodes: dict[str, NodeFolders]
    #: Where the run's record lives (a folder path or an object storage URL).
    record: str
    #: End a suite's training as soon as its FAIL is certain (param ``early_abort``).
    early_abort: bool
    #: suite -> the baseline version it is judged against (``baselines.in_use``).
    baselines: NotRequired[dict[str, Any]]
    #: The seed of a calibration run (``RL_VERIFY_SEED`` in its job's environment).
    seed: NotRequired[int]
    #: Extra runs each suite may take to confirm a FAIL noise could have produced (``core.confirm``).
    repeats: NotRequired[int]
    #: The node's GPUs in one line (calibration runs: ``nvidia-smi -L`` at planning).
    hardware: NotRequired[str | None]
    #: suite -> its own experiment fingerprint (spec as written, data in use, baseline version).
    suite_fingerprints: NotRequired[dict[str, str]]
    #: The run's param ``lane``: ``auto`` (the path-aware skip applies) or ``full``.
    lane: NotRequired[str]
    #: suite -> why it needs no training (``orchestration.unchanged``): its verified PASS (``sha``, ``run_id``,
    #: ``report``), the diff's ``files`` and ``why``. Its tasks are skipped; it ends PASS (unchanged).
    unchanged: NotRequired[dict[str, dict[str, Any]]]
    #: Whether the run is a scheduled one (the lane's full-every policy), and when each suite's last full
    #: verification ended (epoch seconds; suites with a verified PASS of the same experiment only).
    scheduled: NotRequired[bool]
    last_full: NotRequired[dict[str, float]]
    #: suite -> its ``affects`` / ``disabled_by`` patterns that match no file of the checkout at this commit
    #: (issue 42): each turns its shortcut off for the suite.
    stale: NotRequired[dict[str, dict[str, list[str]]]]
    #: suite -> what the record knows against a shortcut at this commit (its newest full verdict doubts it).
    contradicted: NotRequired[dict[str, str]]


class PrerequisiteItem(TypedDict):
    suite: str
    kind: str
    path: str


class Prerequisites(TypedDict):
    """``check_prerequisites``: every verified input (``missing``/``busy`` are empty when it returns)."""

    ok: list[PrerequisiteItem]
    missing: list[PrerequisiteItem]
    busy: list[str]
    #: node -> its environment (gpu, gpu_count, driver, cuda, packages) and ``fingerprint``.
    environment: NotRequired[dict[str, dict[str, Any]]]
    #: suite -> the bitwise lane's decision (``bitwise_lane.decide``): suites with a lane in a lane = auto run.
    lanes: NotRequired[dict[str, dict[str, Any]]]


class Card(TypedDict):
    """``experiment_card``: the Markdown the approver sees, its experiment fingerprint, and the
    notes about schedule ticks that never started."""

    markdown: str
    fingerprint: str
    gaps: list[str]


class Decision(TypedDict, total=False):
    """``approve`` (XCom key ``decision``): who answered, what, when; or that nobody did in time."""

    chosen_options: list[str]
    by: str | None
    at: str
    standing: bool
    granted_in: str | None
    #: A bisection's probe: the bisection run whose approval pre-approved this card.
    bisection: str | None
    timed_out: bool
    timeout: str | None
    #: Nobody was asked: every suite was PASS (unchanged), nothing to launch.
    not_needed: bool


class Fetched(TypedDict):
    """``fetch_<suite>``: what was archived (the files themselves are in the record store)."""

    suite: str
    steps: int | None
    wall_time_s: float | None


class Breach(TypedDict):
    metric: str
    first_breach_step: int | None
    steps: str  # where it was outside, as ranges ("1-45"); empty for an aggregate without per-step data


class SuiteSummary(TypedDict):
    """One suite in ``report``'s summary: its first run's verdict, class, breaches, and its outcome over its
    runs (``core.confirm``: FAIL (reproduced), PASS (not reproduced), INCONCLUSIVE, or the one run's verdict)."""

    suite: str
    verdict: str
    failure_class: str | None
    breached: list[Breach]
    missing: list[str]
    outcome: NotRequired[str]
    runs: NotRequired[int]
    outcome_reason: NotRequired[str]
    #: An infrastructure FAIL's first finding (what ended the run, with its fix when known).
    cause: NotRequired[str]
    #: The drift alarm of the spread its outcome was decided with (``core.spread``): information, not a FAIL.
    drift: NotRequired[list[str]]


class ReportSummary(TypedDict):
    """``report``: the run's verdict, classes, where the record and its report files are."""

    verdict: str
    failure_classes: list[str]
    record: str
    report: dict[str, str]
    failed_suites: list[str]
    suites: list[SuiteSummary]
    #: The node's GPUs after cleanup, one line per node ("GPUs free: ..." or "GPU memory still held by pid P ...").
    gpus: NotRequired[list[str]]
