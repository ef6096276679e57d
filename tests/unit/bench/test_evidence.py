"""bench/evidence.py: run order, median and spread, the steady-state window, the load gate, and
outputs compared record for record."""

from __future__ import annotations

import itertools

import pytest

from bench.evidence import (
    RunOutcome,
    Sample,
    Upsert,
    compare_records,
    crossing,
    figure_of,
    final_table,
    run_order,
    spread,
    steady_state,
    wait_for_quiet,
    window,
    with_notes,
)

# Order -------------------------------------------------------------------------------------------------


def test_two_contenders_alternate_abba() -> None:
    sequence = list(itertools.chain.from_iterable(run_order(["A", "B"], run) for run in range(4)))
    assert "".join(sequence) == "ABBAABBA"


def test_rotation_puts_every_contender_in_every_position() -> None:
    contenders = ["weir", "quix", "raw", "flink", "ceiling"]
    orders = [run_order(contenders, run) for run in range(len(contenders))]
    for position in range(len(contenders)):
        assert sorted(order[position] for order in orders) == sorted(contenders)
    assert all(sorted(order) == sorted(contenders) for order in orders)
    assert run_order(contenders, 5) == run_order(contenders, 0)


def test_no_contender_is_first_twice_in_a_row() -> None:
    contenders = ["a", "b", "c"]
    firsts = [run_order(contenders, run)[0] for run in range(6)]
    assert all(x != y for x, y in itertools.pairwise(firsts))
    assert run_order([], 3) == []


# Median and spread ----------------------------------------------------------------------------------------


def test_spread_is_median_min_max_of_the_present_values() -> None:
    s = spread([3.0, None, 1.0, 2.0])
    assert s is not None
    assert (s.median, s.low, s.high, s.runs) == (2.0, 1.0, 3.0, 3)
    assert s.relative_range == pytest.approx(1.0)
    even = spread([1.0, 4.0])
    assert even is not None and even.median == 2.5
    assert spread([None, None]) is None
    assert spread([]) is None


def test_a_figure_is_the_spread_of_each_value_over_its_runs() -> None:
    outcomes = [
        RunOutcome({"eps": 100.0, "cpu": 10.0}, output_ok=True),
        RunOutcome({"eps": 300.0, "cpu": 12.0}, output_ok=True, under_load=True),
        RunOutcome({"eps": 200.0, "cpu": None}, output_ok=True),
    ]
    figure = figure_of(outcomes, ["eps", "cpu"])
    assert figure.ok
    assert figure.spreads["eps"] is not None and figure.spreads["eps"].median == 200.0
    assert figure.spreads["cpu"] is not None and figure.spreads["cpu"].runs == 2
    assert figure.under_load == 1
    assert figure.as_dict()["eps"] == {"median": 200.0, "min": 100.0, "max": 300.0, "runs": 3}


def test_a_mismatching_output_fails_the_figure_and_is_never_averaged_in() -> None:
    outcomes = [
        RunOutcome({"eps": 100.0}, output_ok=True),
        RunOutcome({"eps": 900.0}, output_ok=False),
        RunOutcome({"eps": 110.0}, output_ok=True),
    ]
    figure = figure_of(outcomes, ["eps"])
    assert not figure.ok
    assert figure.spreads == {"eps": None}
    assert figure.failed == ("run 2: output does not match the reference",)


def test_a_failed_run_fails_the_figure_with_its_error() -> None:
    figure = figure_of([RunOutcome({}, output_ok=False, error="timed out")], ["eps"])
    assert figure.failed == ("run 1: timed out",)
    assert not figure_of([], ["eps"]).ok


# Steady state from samples ---------------------------------------------------------------------------------


def _run(startup_s: float, startup_cpu: float, rate: float, cpu_per_event: float, total: int) -> list[Sample]:
    """Start-up with no progress, then a constant rate and CPU per event, sampled every 0.5 s."""
    samples = [Sample(0.0, 0.0, 0.0), Sample(startup_s, 0.0, startup_cpu)]
    t, consumed, cpu = startup_s, 0.0, startup_cpu
    while consumed < total:
        t += 0.5
        step = min(rate * 0.5, total - consumed)
        consumed += step
        cpu += step * cpu_per_event
        samples.append(Sample(t, consumed, cpu))
    return samples


def test_the_steady_state_leaves_start_up_and_tail_out() -> None:
    samples = _run(startup_s=10.0, startup_cpu=20.0, rate=1_000.0, cpu_per_event=0.002, total=10_000)
    steady = steady_state(samples, 10_000)
    assert steady is not None
    assert steady.window.events == pytest.approx(8_000)
    assert steady.window.events_per_s == pytest.approx(1_000.0)
    assert steady.window.cpu_s_per_million == pytest.approx(2_000.0)  # 0.002 s per event, start-up excluded
    assert steady.warmup_ratio == pytest.approx(1.0)


def test_a_run_still_warming_up_shows_in_the_warmup_ratio() -> None:
    # CPU per event 3 ms over the first half of the input, 1 ms after: a JIT still compiling
    samples = [Sample(0.0, 0.0, 0.0)]
    for i in range(1, 101):
        consumed = i * 100.0
        cost = 0.003 if consumed <= 5_000 else 0.001
        samples.append(Sample(i * 0.1, consumed, samples[-1].cpu_s + 100 * cost))
    steady = steady_state(samples, 10_000)
    assert steady is not None
    assert steady.warmup_ratio == pytest.approx(3.0)


def test_crossings_are_interpolated_between_samples() -> None:
    samples = [Sample(0.0, 0.0, 0.0), Sample(2.0, 100.0, 4.0), Sample(4.0, 300.0, 8.0)]
    assert crossing(samples, 50.0) == (pytest.approx(1.0), pytest.approx(2.0))
    assert crossing(samples, 200.0) == (pytest.approx(3.0), pytest.approx(6.0))
    assert crossing(samples, 301.0) is None


def test_no_steady_state_from_a_counter_that_moved_only_twice_in_the_window() -> None:
    # a short run: the progress counter (updated twice a second) jumped 0 -> 40 % -> 80 % -> done
    samples = [Sample(0.0, 0.0, 0.0), Sample(0.5, 400.0, 1.0), Sample(1.0, 800.0, 2.0), Sample(1.5, 1000.0, 3.0)]
    assert steady_state(samples, 1_000) is None
    samples.insert(3, Sample(1.2, 850.0, 2.5))  # a third step inside 10-90 %: measured
    assert steady_state(samples, 1_000) is not None


def test_no_steady_state_when_progress_never_reaches_90_percent() -> None:
    samples = [Sample(0.0, 0.0, 0.0), Sample(1.0, 50.0, 1.0)]
    assert steady_state(samples, 100) is None
    assert window([Sample(1.0, 100.0, 1.0)], 100, 0.1, 0.9) is None  # both points at once


# The load gate ----------------------------------------------------------------------------------------------


class _Machine:
    """A clock and a load average that falls by ``fall`` every poll."""

    def __init__(self, loads: list[float]) -> None:
        self.loads = loads
        self.now = 0.0
        self.polls = 0

    def load(self) -> float:
        value = self.loads[min(self.polls, len(self.loads) - 1)]
        self.polls += 1
        return value

    def clock(self) -> float:
        return self.now

    def pause(self, seconds: float) -> None:
        self.now += seconds


def test_a_quiet_machine_runs_at_once() -> None:
    m = _Machine([0.5])
    check = wait_for_quiet(2, 60, load_1m=m.load, clock=m.clock, pause=m.pause)
    assert (check.under_load, check.waited_s, check.load_1m) == (False, 0.0, 0.5)


def test_the_gate_waits_for_the_load_to_fall_to_the_core_count() -> None:
    m = _Machine([6.0, 4.0, 2.5, 1.9])
    check = wait_for_quiet(2, 60, load_1m=m.load, clock=m.clock, pause=m.pause, poll_s=5)
    assert check.under_load is False
    assert check.waited_s == 15.0
    assert check.load_1m == 1.9


def test_a_load_that_stays_high_marks_the_run_under_load_at_the_deadline() -> None:
    m = _Machine([9.6])
    check = wait_for_quiet(2, 12, load_1m=m.load, clock=m.clock, pause=m.pause, poll_s=5)
    assert check.under_load is True
    assert check.waited_s == 12.0  # the last pause is cut to the deadline
    assert check.as_dict() == {"load_1m": 9.6, "cores": 2, "waited_s": 12.0, "under_load": True}


# Records --------------------------------------------------------------------------------------------------

KEYED = [("key-1", 0, 1000, 8, 400), ("key-2", 0, 1000, 8, 380), ("key-1", 1000, 2000, 8, 410)]


def _identity(record: tuple[object, ...]) -> tuple[object, ...]:
    return record[:2]  # key and window


def test_identical_outputs_match_in_any_order() -> None:
    diff = compare_records(KEYED, list(reversed(KEYED)), _identity)
    assert diff.ok
    assert diff.summary() == "ok (3 records, as the reference)"


def test_a_duplicated_record_is_reported() -> None:
    diff = compare_records(KEYED, [*KEYED, KEYED[0]], _identity)
    assert not diff.ok
    assert diff.duplicated == ((KEYED[0], 1),)
    assert (diff.missing, diff.unexpected, diff.changed) == ((), (), ())
    assert "1 duplicated" in diff.summary()


def test_a_missing_record_is_reported() -> None:
    diff = compare_records(KEYED, KEYED[:2], _identity)
    assert diff.missing == ((KEYED[2], 1),)
    assert (diff.duplicated, diff.unexpected, diff.changed) == ((), (), ())
    assert "1 missing" in diff.summary()


def test_a_changed_record_is_reported_as_changed_even_if_its_count_is_right() -> None:
    # the keyed job's old check compared counts only: a wrong sum passed it
    wrong_sum = ("key-2", 0, 1000, 8, 999)
    diff = compare_records(KEYED, [KEYED[0], wrong_sum, KEYED[2]], _identity)
    assert diff.changed == ((KEYED[1], wrong_sum),)
    assert (diff.duplicated, diff.missing, diff.unexpected) == ((), (), ())
    assert "1 changed" in diff.summary()
    assert diff.as_dict()["changed"] == 1


def test_without_an_identity_a_change_is_a_missing_and_an_unexpected_record() -> None:
    wrong = ("key-2", 0, 1000, 8, 999)
    diff = compare_records(KEYED, [KEYED[0], wrong, KEYED[2]])
    assert diff.missing == ((KEYED[1], 1),)
    assert diff.unexpected == ((wrong, 1),)


def test_a_duplicated_a_missing_and_a_changed_record_are_each_reported_together() -> None:
    wrong = ("key-1", 1000, 2000, 8, 0)
    diff = compare_records(KEYED, [KEYED[0], KEYED[0], wrong], _identity)
    assert diff.duplicated == ((KEYED[0], 1),)
    assert diff.missing == ((KEYED[1], 1),)
    assert diff.changed == ((KEYED[2], wrong),)
    summary = diff.summary()
    assert "1 duplicated" in summary and "1 missing" in summary and "1 changed" in summary


def test_the_final_table_applies_upserts_in_order_and_tombstones_delete() -> None:
    table = final_table(
        [
            Upsert(10, (10, 7), partition=0, offset=2),
            Upsert(10, (10, 5), partition=0, offset=0),
            Upsert(11, (11, 1), partition=1, offset=0),
            Upsert(11, None, partition=1, offset=1),
            Upsert(12, (12, 3), partition=1, offset=2),
        ]
    )
    assert sorted(table.rows) == [(10, 7), (12, 3)]
    assert table.updates == 5
    assert table.notes == ()


def test_a_key_in_two_partitions_has_no_defined_final_value_and_is_noted() -> None:
    table = final_table([Upsert(10, (10, 7), partition=0), Upsert(10, (10, 5), partition=3)])
    assert table.notes and "several partitions" in table.notes[0]
    diff = with_notes(compare_records([(10, 5)], table.rows), table.notes)
    assert not diff.ok
