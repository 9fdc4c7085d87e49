"""The shape of a breach: how a failing metric left its bound, read from its compared points.

Runbook section 3 gives two rules that depend on *when* a metric left its bound (at step 1 / the
first eval point -> initialisation or config; diverging gradually -> the training loop). A rule is
only applied to a breach of the shape it describes, so every failing metric is first classified:

* ``non-finite``: a compared current value is NaN or +-Infinity;
* ``single-point``: the metric is compared at one point only, later than step 1 (GRPO's final
  ``eval/accuracy``); a run stopped early after its first point is ``from-start``;
* ``from-start``: outside its bound already at the first compared point;
* ``isolated``: exactly one compared point outside its bound, later than the first, that did not
  grow into it (see ``gradual``);
* ``intermittent``: several points outside, with points inside between them or after them;
* ``jump``: outside from step N to the last compared point, and the point before N used less
  than half of the threshold (``JUMP_RATIO``): the error leapt across the bound in one step;
* ``gradual``: outside from step N to the last compared point, and the point before N already
  used at least half of the threshold: the error grew into the bound. A breach at the last
  compared point only (a run stopped by the early abort at that point, or a breach at the final
  eval point) is gradual when, in addition, the error grew into it from the point before: the points
  before it show how it moved toward the bound, although no later point can show that it stays.

The shape is read from every compared point of the metric, and its sentence quotes how the error
moved (its share of the threshold at each point before the breach), so a reader sees the reading.
Steps are the tracker's own step numbers (eval-only row = 0, RL steps from 1).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

#: A point whose error is below this fraction of the threshold is "well inside" its bound; a breach
#: that follows such a point is a jump, not a gradual growth.
JUMP_RATIO = 0.5

#: Steps that count as the start of a run (runbook section 3: "already off at step 1 / the first eval point"):
#: a metric compared only there, because the run stopped early, is read as ``from-start``, not ``single-point``.
FIRST_STEPS = 1

KINDS = ("non-finite", "single-point", "from-start", "isolated", "intermittent", "jump", "gradual")


@dataclass(frozen=True)
class ComparedPoint:
    """One compared point of a metric: its step, the current value, the error and whether it breached."""

    step: int
    current: float | None
    error: float | None
    breached: bool


@dataclass(frozen=True)
class Shape:
    """``kind`` (one of ``KINDS``), the first breaching step and a sentence that states the shape."""

    kind: str
    first_step: int
    text: str
    steps: str = ""  # the breaching steps as ranges, e.g. "1-45" or "5, 15-25"


def step_ranges(steps: Sequence[int], all_steps: Sequence[int] | None = None) -> str:
    """``steps`` as ranges: a run of consecutive compared points (``all_steps``, default every
    integer) is written "first-last"; e.g. "1-45", "3, 7-9"."""
    order = sorted(all_steps) if all_steps is not None else None
    out: list[list[int]] = []
    for s in sorted(steps):
        prev = out[-1][-1] if out else None
        adjacent = prev is not None and (
            order.index(s) == order.index(prev) + 1 if order is not None and prev in order and s in order
            else s == prev + 1)
        if adjacent:
            out[-1].append(s)
        else:
            out.append([s])
    return ", ".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in out)


def _finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value)


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4g}"


def _steps(points: Sequence[ComparedPoint]) -> str:
    steps = [p.step for p in points]
    if len(steps) <= 4:
        return ", ".join(str(s) for s in steps)
    return f"{steps[0]}, {steps[1]}, ..., {steps[-1]} ({len(steps)} steps)"


def classify(points: Sequence[ComparedPoint], threshold: float | None) -> Shape | None:
    """The shape of the breach in ``points`` (in step order), or None when no point breached."""
    shape = _classify(sorted(points, key=lambda p: p.step), threshold)
    if shape is None:
        return None
    ranges = step_ranges([p.step for p in points if p.breached], [p.step for p in points])
    return Shape(shape.kind, shape.first_step, shape.text, ranges)


def _classify(points: Sequence[ComparedPoint], threshold: float | None) -> Shape | None:
    breached = [p for p in points if p.breached]
    if not breached:
        return None
    first = breached[0]
    non_finite = [p for p in points if p.current is not None and not _finite(p.current)]
    if non_finite:
        where = "only at step" if len(non_finite) == 1 else "at steps"
        return Shape("non-finite", non_finite[0].step, f"NaN/Infinity {where} {_steps(non_finite)}")
    if len(points) == 1 and first.step > FIRST_STEPS:
        return Shape("single-point", first.step, f"compared at step {first.step} only (error {_fmt(first.error)})")
    if len(points) == 1:  # a run stopped early at its first point: the runbook's "already off at step 1"
        return Shape("from-start", first.step, f"outside its bound at the first compared step {first.step} (the run "
                                               f"compared no later point; error {_fmt(first.error)})")
    after = [p for p in points if p.step > first.step]
    stays = all(p.breached for p in after)
    if first.step == points[0].step:
        tail = ("and stays outside to step " + str(points[-1].step)) if stays else \
            f"{len(breached)} of {len(points)} compared points outside"
        return Shape("from-start", first.step, f"outside its bound from the first compared step {first.step}, {tail}")
    earlier = [p for p in points if p.step < first.step]
    ratio = _ratio(earlier[-1], threshold)
    at_last = first.step == points[-1].step
    if len(breached) == 1 and not (at_last and _grew_into(earlier, threshold)):
        where = "the last compared point" if at_last else "the points around it are inside"
        return Shape("isolated", first.step,
                     f"single breach at step {first.step} ({where}; {_path(earlier, threshold)})")
    if not stays:
        return Shape("intermittent", first.step,
                     f"{len(breached)} breaches at steps {_steps(breached)}, with points inside between or after them")
    before = earlier[-1]
    if ratio is not None and ratio < JUMP_RATIO:
        return Shape("jump", first.step,
                     f"jump at step {first.step} (error {_fmt(first.error)}; {_fmt(before.error)} at step "
                     f"{before.step}), stays outside to step {points[-1].step}")
    where = (f"outside from step {first.step}, the last compared point" if at_last else
             f"outside from step {first.step} to step {points[-1].step}")
    return Shape("gradual", first.step,
                 f"grows into the bound over {len(earlier) + 1} compared points ({_path(earlier, threshold)}; "
                 f"error {_fmt(first.error)} at step {first.step}), {where}")


def _ratio(point: ComparedPoint, threshold: float | None) -> float | None:
    """The share of the threshold ``point``'s error uses (None without a finite error or threshold)."""
    return (point.error / threshold) if (threshold and _finite(point.error)) else None


def _grew_into(earlier: Sequence[ComparedPoint], threshold: float | None) -> bool:
    """Whether the error grew toward the bound on its way to a breach at the last compared point: the
    point before the breach used at least ``JUMP_RATIO`` of the threshold, and the error
    grew from the point before that one (a run that drifts toward its bound, caught where it crosses)."""
    ratio = _ratio(earlier[-1], threshold)
    if ratio is None or ratio < JUMP_RATIO:
        return False
    if len(earlier) < 2:
        return True
    previous = earlier[-2].error
    return previous is not None and _finite(previous) and earlier[-1].error > previous  # type: ignore[operator]


#: How many points before a breach its sentence quotes one by one (more are summarised).
QUOTED_POINTS = 5


def _path(earlier: Sequence[ComparedPoint], threshold: float | None) -> str:
    """How the error moved before the breach, as shares of the threshold: "error at 9%, 30%, 55%, 71% of
    the threshold at steps 0, 5, 10, 15" (the first points and the last ones when there are many)."""
    if not threshold:
        return "inside its bound before"
    shown = list(earlier) if len(earlier) <= QUOTED_POINTS else [*earlier[:2], *earlier[-(QUOTED_POINTS - 2):]]
    shares = ["n/a" if _ratio(p, threshold) is None else f"{_ratio(p, threshold):.0%}" for p in shown]
    steps = [str(p.step) for p in shown]
    if len(shown) < len(earlier):
        shares.insert(2, "...")
        steps.insert(2, "...")
    return f"error at {', '.join(shares)} of the threshold at step{'s' if len(shown) > 1 else ''} {', '.join(steps)}"
