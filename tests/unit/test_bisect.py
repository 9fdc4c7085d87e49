"""The bisection planner (core.bisect): binary and ternary splits, skips as ranges, the ends re-checked or
taken from the record, the deciding pair confirmed, probes stopped once they no longer matter, INCONCLUSIVE,
conflicts and contradictions, the worst case for the card, and the bad input it refuses."""

from __future__ import annotations

import math
import random
import subprocess
import sys
from collections.abc import Callable, Sequence

import pytest

from rl_verify.core import bisect
from rl_verify.core.bisect import (BAD_END_PASSES, CULPRIT, END_SKIPPED, GOOD_END_FAILS, INCONSISTENT, MAX_COMMITS,
                                   BisectInputError, Reading, Settings, check_range, plan, reading, worst_case)

G, B, S, U = Reading.GOOD, Reading.BAD, Reading.SKIP, Reading.UNSURE
PLAIN = Settings(confirm=1)


def commits(n: int) -> list[str]:
    """A range of ``n`` commits after the good one: c00 (good) .. c<n> (bad)."""
    return [f"c{i:02d}" for i in range(n + 1)]


def truth(culprit: int, skipped: Sequence[int] = ()) -> Callable[[int, int], Reading]:
    """What a probe of commit i says (the k-th probe of it, from 0) when the regression came in at ``culprit``."""
    return lambda i, k: S if i in skipped else G if i < culprit else B


def bisect_all(n: int, free: int, says: Callable[[int, int], Reading], *, known: bool = True,
               settings: Settings = Settings(), limit: int = 200) -> tuple[bisect.Answer, list[tuple[str, ...]]]:
    """Run the planner to its answer in rounds (every probe of a round ends before the next plan); return the
    answer and the probes of each round."""
    cs = commits(n)
    record = {cs[0]: G, cs[-1]: B} if known else {}
    readings: dict[str, list[Reading]] = {}
    rounds: list[tuple[str, ...]] = []
    for _ in range(limit):
        p = plan(cs, readings, (), free, record=record, settings=settings)
        if p.answer is not None:
            assert p.probe == () and p.stop == ()
            return p.answer, rounds
        assert p.probe, f"no probe and no answer: {p}"
        for c in p.probe:
            readings.setdefault(c, []).append(says(cs.index(c), len(readings.get(c, []))))
        rounds.append(p.probe)
    raise AssertionError(f"no answer after {limit} rounds")


# ------------------------------------------------------------------------------------------------ readings
@pytest.mark.parametrize("outcome,failure_class,chased,expected", [
    ("PASS", None, "accuracy", G),
    ("PASS (not reproduced)", None, "accuracy", G),
    ("FAIL (reproduced)", "accuracy", "accuracy", B),
    ("FAIL", "accuracy", "accuracy", B),                 # a NaN, a breach far outside the noise: FAIL at once
    ("FAIL", "infrastructure", "accuracy", S),           # no tracker, crash, a log rule: the commit was not judged
    ("FAIL", "performance", "accuracy", G),              # only time checks breached: accuracy held
    ("FAIL", "performance", "performance", B),
    ("FAIL", "accuracy", "performance", S),
    ("INCONCLUSIVE", None, "accuracy", U),
    ("SKIP", None, "accuracy", S),
])
def test_reading_of_each_outcome(outcome: str, failure_class: str | None, chased: str, expected: Reading) -> None:
    assert reading(outcome, failure_class, chased) is expected


@pytest.mark.parametrize("outcome,failure_class,chased,words", [
    ("MAYBE", None, "accuracy", "unknown probe outcome 'MAYBE'"),
    ("FAIL", None, "accuracy", "needs its failure class"),
    ("FAIL", "accuracy", "latency", "chased class 'latency'"),
])
def test_reading_refuses_what_it_does_not_know(outcome: str, failure_class: str | None, chased: str,
                                               words: str) -> None:
    with pytest.raises(ValueError, match=words):
        reading(outcome, failure_class, chased)


# ------------------------------------------------------------------------------------------------ bad input
@pytest.mark.parametrize("given,param,words", [
    (["a1", "a1"], "bad", "good and bad are the same commit"),
    (["a1"], "bad", "good and bad are the same commit"),
    ([], "good", "the range is empty"),
    (["a0", "a1", "a1", "a2"], "commits", "listed twice"),
    (commits(MAX_COMMITS + 1), "good", f"{MAX_COMMITS + 1} commits after good, more than the maximum of 64"),
])
def test_bad_ranges_are_refused_naming_the_param_and_the_fix(given: list[str], param: str, words: str) -> None:
    with pytest.raises(BisectInputError, match=words) as err:
        plan(given, {}, (), 1)
    assert err.value.param == param and err.value.fix and str(err.value).startswith(f"{param}: ")
    assert "Fix: " in str(err.value)


def test_the_maximum_is_the_callers_to_state() -> None:
    assert len(check_range(commits(MAX_COMMITS))) == MAX_COMMITS + 1
    with pytest.raises(BisectInputError, match="more than the maximum of 8"):
        check_range(commits(9), max_commits=8)
    assert len(check_range(commits(9), max_commits=9)) == 10


@pytest.mark.parametrize("kwargs,param", [
    ({"readings": {"zz": [G]}}, "readings"),
    ({"running": ("zz",)}, "running"),
    ({"record": {"zz": G}}, "record"),
    ({"free": -1}, "free"),
])
def test_calls_naming_strangers_are_refused(kwargs: dict, param: str) -> None:
    with pytest.raises(BisectInputError) as err:
        plan(commits(4), **kwargs)
    assert err.value.param == param


@pytest.mark.parametrize("settings", [{"confirm": 0}, {"unsure_retries": -1}])
def test_settings_out_of_range_are_refused(settings: dict) -> None:
    with pytest.raises(BisectInputError):
        Settings(**settings)


# ------------------------------------------------------------------------------------------------ splitting
def test_p1_is_a_binary_search() -> None:
    n = 16
    first = plan(commits(n), {}, (), 1, record={"c00": G, "c16": B}, settings=PLAIN)
    assert first.probe == ("c08",)  # 8 possible culprits on each side
    for culprit in range(1, n + 1):
        answer, rounds = bisect_all(n, 1, truth(culprit), settings=PLAIN)
        assert answer.kind == CULPRIT and answer.culprit.commits == (f"c{culprit:02d}",)
        assert len(rounds) == math.ceil(math.log2(n)) and all(len(r) == 1 for r in rounds)


def test_p2_is_a_ternary_search() -> None:
    n = 16
    first = plan(commits(n), {}, (), 2, record={"c00": G, "c16": B}, settings=PLAIN)
    assert first.probe == ("c05", "c10")  # culprits 1-5, 6-10, 11-16: three parts of 5, 5 and 6
    worst = 0
    for culprit in range(1, n + 1):
        answer, rounds = bisect_all(n, 2, truth(culprit), settings=PLAIN)
        assert answer.culprit.commits == (f"c{culprit:02d}",)
        worst = max(worst, len(rounds))
    assert worst == math.ceil(math.log(n, 3))  # 3 rounds, against 4 at P = 1


def test_p_probes_split_the_range_into_p_plus_1_parts() -> None:
    p = plan(commits(32), {}, (), 3, record={"c00": G, "c32": B}, settings=PLAIN)
    assert p.probe == ("c08", "c16", "c24")  # 4 parts of 8 possible culprits


@pytest.mark.parametrize("n", [1, 2, 3, 7, 8, 16, 31, 32])
@pytest.mark.parametrize("free", [1, 2, 3])
@pytest.mark.parametrize("known", [True, False])
@pytest.mark.parametrize("confirm", [1, 2])
def test_every_culprit_position_is_found(n: int, free: int, known: bool, confirm: int) -> None:
    for culprit in range(1, n + 1):
        answer, rounds = bisect_all(n, free, truth(culprit), known=known, settings=Settings(confirm=confirm))
        assert answer.kind == CULPRIT and answer.culprit.exact
        assert answer.culprit.commits == (f"c{culprit:02d}",) and answer.culprit.last_good == f"c{culprit - 1:02d}"
        probed = [c for r in rounds for c in r]
        assert all(len(r) <= free and len(set(r)) == len(r) for r in rounds)
        # no commit is probed more often than the confirmation asks (truthful readings never conflict)
        assert max((probed.count(c) for c in probed), default=0) <= confirm


def test_running_probes_count_as_split_points() -> None:
    # c05 said GOOD while c10 still runs: the one free node goes to the larger part, c11..c15
    p = plan(commits(16), {"c05": [G]}, ("c10",), 1, record={"c00": G, "c16": B}, settings=PLAIN)
    assert p.probe == ("c13",) and p.stop == ()


# ------------------------------------------------------------------------------------------------ ends
def test_both_ends_are_rechecked_unless_the_record_holds_them() -> None:
    cs = commits(16)
    assert plan(cs, {}, (), 2).probe == ("c16", "c00")                     # bad end first
    assert plan(cs, {}, (), 1).probe == ("c16",)
    assert plan(cs, {}, (), 3).probe == ("c16", "c00", "c08")              # a third node splits meanwhile
    assert plan(cs, {}, (), 2, record={"c16": B}).probe == ("c00", "c08")
    assert plan(cs, {}, (), 2, record={"c00": G, "c16": B}).probe == ("c05", "c10")
    # a re-checked end is one reading: the deciding pair's end needs its confirmation probe
    answer, rounds = bisect_all(1, 1, truth(1), known=False)
    assert answer.culprit.commits == ("c01",)
    assert sorted(c for r in rounds for c in r) == ["c00", "c00", "c01", "c01"]
    answer, rounds = bisect_all(1, 1, truth(1), known=True)
    assert answer.culprit.commits == ("c01",) and rounds == []             # both recorded: nothing to probe


@pytest.mark.parametrize("end,contrary,kind", [("c00", B, GOOD_END_FAILS), ("c08", G, BAD_END_PASSES)])
def test_an_end_contradicting_its_role_ends_the_bisection_once_confirmed(end: str, contrary: Reading,
                                                                         kind: str) -> None:
    cs = commits(8)
    once = plan(cs, {end: [contrary]}, ("c04",), 2)
    assert once.answer is None and once.probe[0] == end            # probed again before concluding
    twice = plan(cs, {end: [contrary, contrary]}, ("c04",), 2)
    assert twice.answer.kind == kind and twice.probe == () and twice.stop == ("c04",)
    plain = plan(cs, {end: [contrary]}, ("c04",), 2, settings=PLAIN)
    assert plain.answer.kind == kind
    recorded = plan(cs, {}, (), 1, record={end: contrary})
    assert recorded.answer.kind == kind


@pytest.mark.parametrize("end", ["c00", "c08"])
def test_an_end_that_cannot_be_judged_ends_it(end: str) -> None:
    p = plan(commits(8), {end: [S]}, ("c03",), 1)
    assert p.answer.kind == END_SKIPPED and end in p.answer.reason and p.stop == ("c03",)


# ------------------------------------------------------------------------------------------------ skips
def test_a_skipped_commit_next_to_the_culprit_makes_the_answer_a_range() -> None:
    answer, rounds = bisect_all(16, 1, truth(9, skipped=[8]), settings=PLAIN)
    assert answer.kind == CULPRIT and not answer.culprit.exact
    assert answer.culprit.commits == ("c08", "c09") and answer.culprit.skipped == ("c08",)
    assert answer.culprit.last_good == "c07" and "could not be judged" in answer.reason
    assert [c for r in rounds for c in r].count("c08") == 1                # never probed again


@pytest.mark.parametrize("free", [1, 2])
def test_one_skipped_commit_costs_probes_not_the_answer(free: int) -> None:
    for culprit in range(1, 17):
        for skipped in range(1, 16):
            answer, _ = bisect_all(16, free, truth(culprit, [skipped]), settings=PLAIN)
            if skipped == culprit - 1:      # between the last good commit and the culprit
                expected = (f"c{skipped:02d}", f"c{culprit:02d}")
            elif skipped == culprit:        # the culprit itself cannot be judged: it or the next one
                expected = (f"c{culprit:02d}", f"c{culprit + 1:02d}")
            else:
                expected = (f"c{culprit:02d}",)
            assert answer.culprit.commits == expected, (culprit, skipped)


def test_every_commit_skipped_leaves_the_whole_range() -> None:
    answer, _ = bisect_all(5, 2, truth(3, skipped=[1, 2, 3, 4]), settings=PLAIN)
    assert answer.culprit.commits == ("c01", "c02", "c03", "c04", "c05") and len(answer.culprit.skipped) == 4


# ------------------------------------------------------------------------------------------------ stopping
def test_probes_outside_the_open_range_are_stopped() -> None:
    # ternary round: c05 and c10 running; c10 says GOOD, so c05 can no longer change the answer
    p = plan(commits(16), {"c10": [G]}, ("c05",), 1, record={"c00": G, "c16": B}, settings=PLAIN)
    assert p.stop == ("c05",) and "cannot change the answer" in p.why["c05"]
    assert p.probe == ("c13",) and p.low == 10 and p.high == 16


def test_every_running_probe_is_stopped_once_the_answer_is_known() -> None:
    p = plan(commits(16), {"c10": [G], "c11": [B]}, ("c05", "c13"), 2, record={"c00": G, "c16": B},
             settings=PLAIN)
    assert p.answer.kind == CULPRIT and p.answer.culprit.commits == ("c11",)
    assert p.probe == () and p.stop == ("c05", "c13") and p.done and not p.waiting


def test_nothing_free_means_waiting_with_stops_still_said() -> None:
    p = plan(commits(16), {"c10": [G]}, ("c05", "c13"), 0, record={"c00": G, "c16": B}, settings=PLAIN)
    assert p.probe == () and p.stop == ("c05",) and p.waiting


# ------------------------------------------------------------------------------------------------ confirmation
def test_the_deciding_pair_is_confirmed_in_one_parallel_round() -> None:
    p = plan(commits(16), {"c10": [G], "c11": [B]}, (), 2, record={"c00": G, "c16": B})
    assert p.answer is None and p.probe == ("c10", "c11")
    assert "confirm the deciding pair" in p.why["c10"]
    done = plan(commits(16), {"c10": [G, G], "c11": [B, B]}, (), 2, record={"c00": G, "c16": B})
    assert done.answer.culprit.commits == ("c11",)


def test_a_false_pass_of_a_regressed_commit_is_caught_by_the_confirmation() -> None:
    # culprit c06; the first probe of c08 passes by chance (a regressed commit's first run can pass at noise)
    def says(i: int, k: int) -> Reading:
        return G if i < 6 or (i == 8 and k == 0) else B

    wrong, _ = bisect_all(16, 1, says, settings=PLAIN)
    assert wrong.culprit.commits == ("c09",)                                 # plain bisection believes it
    answer, rounds = bisect_all(16, 1, says)
    assert answer.culprit.commits == ("c06",)
    assert [c for r in rounds for c in r].count("c08") == 3                  # conflict: the majority of three


def test_a_conflict_is_settled_by_the_majority() -> None:
    cs = commits(8)
    state = bisect.commit_state(3, "c03", [G, B], None)
    assert state.state == bisect.OPEN and "conflicting" in state.why
    assert bisect.commit_state(3, "c03", [G, B, B], None).state == bisect.BAD
    assert bisect.commit_state(3, "c03", [G, B, G, B], None).state == bisect.OPEN
    p = plan(cs, {"c04": [G, B]}, (), 1, record={"c00": G, "c08": B})
    assert p.probe == ("c04",)                                               # due before any split


# ------------------------------------------------------------------------------------------------ INCONCLUSIVE
def test_an_inconclusive_commit_is_probed_once_more_then_treated_as_skipped() -> None:
    cs = commits(16)
    record = {"c00": G, "c16": B}
    p = plan(cs, {"c08": [U]}, (), 1, record=record)
    assert p.probe == ("c08",) and "fresh verification" in p.why["c08"]
    p = plan(cs, {"c08": [U, U]}, (), 1, record=record)
    assert p.states[8].state == bisect.SKIPPED and p.probe == ("c07",)        # the split goes around it
    # an inconclusive culprit (an effect at the limit of detection) ends as a range that includes it
    answer, _ = bisect_all(16, 1, lambda i, k: U if i == 9 else G if i < 9 else B, settings=PLAIN)
    assert answer.culprit.commits == ("c09", "c10") and answer.culprit.skipped == ("c09",)
    never, _ = bisect_all(16, 1, lambda i, k: U if i == 9 else G if i < 9 else B,
                          settings=Settings(confirm=1, unsure_retries=0))
    assert never.culprit.commits == ("c09", "c10")


def test_a_later_reading_outweighs_an_inconclusive_one() -> None:
    assert bisect.commit_state(5, "c05", [U, G], None).state == bisect.GOOD


# ------------------------------------------------------------------------------------------------ contradictions
def test_a_contradiction_is_probed_again_then_reported() -> None:
    cs = commits(16)
    record = {"c00": G, "c16": B}
    p = plan(cs, {"c05": [B], "c10": [G]}, ("c12",), 2, record=record, settings=PLAIN)
    assert set(p.probe) == {"c05", "c10"} and p.stop == ("c12",)            # no split while the bracket is in doubt
    gone = plan(cs, {"c05": [B, G, G], "c10": [G]}, (), 2, record=record, settings=PLAIN)
    assert gone.answer is None and gone.low == 10                            # c05 was a false FAIL: resolved
    held = plan(cs, {"c05": [B, B], "c10": [G, G]}, (), 2, record=record, settings=PLAIN)
    assert held.answer.kind == INCONSISTENT and "c05" in held.answer.reason and "c10" in held.answer.reason


# ------------------------------------------------------------------------------------------------ termination
@pytest.mark.parametrize("seed", range(40))
def test_noisy_readings_always_end_within_bounds(seed: int) -> None:
    """Readings wrong 15% of the time, INCONCLUSIVE 5%, skipped 5%: the planner always ends, never probes more
    than it may, and the answer it gives brackets a real change or says why it cannot."""
    rng = random.Random(seed)
    n, free = rng.choice([4, 8, 16, 32]), rng.choice([1, 2, 3])
    culprit = rng.randint(1, n)
    skipped = {i for i in range(1, n) if rng.random() < 0.05}

    def says(i: int, k: int) -> Reading:
        if i in skipped:
            return S
        r = rng.random()
        return U if r < 0.05 else (B if i < culprit else G) if r < 0.20 else G if i < culprit else B

    answer, rounds = bisect_all(n, free, says, known=rng.random() < 0.5, limit=8 * n + 20)
    probed = [c for r in rounds for c in r]
    assert all(len(r) <= free and len(set(r)) == len(r) for r in rounds)
    assert not any(c in {f"c{i:02d}" for i in skipped} and probed.count(c) > 1 for c in probed)
    assert answer.kind in (CULPRIT, GOOD_END_FAILS, BAD_END_PASSES, INCONSISTENT, END_SKIPPED)
    if answer.kind == CULPRIT:
        assert answer.culprit.first <= answer.culprit.last and answer.culprit.last_good == \
            f"c{answer.culprit.first - 1:02d}"


def test_plans_are_pure() -> None:
    cs, readings, running = commits(16), {"c05": [G]}, ("c10",)
    before = (list(cs), {k: list(v) for k, v in readings.items()}, tuple(running))
    assert plan(cs, readings, running, 2) == plan(cs, readings, running, 2)
    assert (cs, readings, running) == before


# ------------------------------------------------------------------------------------------------ the card
@pytest.mark.parametrize("n", [1, 2, 8, 16, 32])
def test_worst_case_is_log2_for_plain_binary_search_with_known_ends(n: int) -> None:
    w = worst_case(n, 1, good_known=True, bad_known=True, settings=PLAIN)
    assert w.probes == w.rounds == math.ceil(math.log2(n))


def test_worst_case_bounds_every_position_and_counts_the_extras() -> None:
    for free in (1, 2):
        for known in (True, False):
            w = worst_case(16, free, good_known=known, bad_known=known)
            seen = [bisect_all(16, free, truth(c), known=known)[1] for c in range(1, 17)]
            assert w.probes == max(sum(map(len, r)) for r in seen)
            assert w.rounds == max(len(r) for r in seen)
    base = worst_case(16, 1, good_known=True, bad_known=True, settings=PLAIN).probes
    assert worst_case(16, 1, good_known=True, bad_known=True).probes == base + 2          # the pair's two probes
    assert worst_case(16, 1, settings=PLAIN).probes == base + 2                         # the two ends
    assert worst_case(16, 1, good_known=True, bad_known=True, settings=PLAIN, skips=1).probes == base + 1
    assert worst_case(16, 2, good_known=True, bad_known=True, settings=PLAIN).rounds == 3
    with pytest.raises(BisectInputError):
        worst_case(16, 1, skips=2)


# ------------------------------------------------------------------------------------------------ layering
def test_the_planner_imports_no_airflow_and_nothing_outside_the_standard_library() -> None:
    code = ("import sys; import rl_verify.core.bisect; "
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('airflow', 'pandas', 'numpy', 'scipy', "
            "'pydantic', 'matplotlib')); print(bad); sys.exit(1 if bad else 0)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env={"PYTHONPATH": str(bisect.__file__).rsplit("/rl_verify/", 1)[0], "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stdout + out.stderr

