"""The chaos invariant (Flink's SemanticsCheckMapper): per key, seq advances by exactly one."""

from __future__ import annotations

from tests.chaos.semantics import Output, check_sink


def exact(key: str, last: int) -> list[Output]:
    return [Output(key, s, s - 1) for s in range(1, last + 1)]


def test_an_exact_sink_passes() -> None:
    result = check_sink("kafka", exact("a", 3) + exact("b", 2), {"a": 3, "b": 2})
    assert result.exact and result.records == 5 and result.keys == 2


def test_a_gap_a_repeat_and_an_unexpected_record_are_each_counted() -> None:
    outputs = [Output("a", 1, 0), Output("a", 3, 2), Output("a", 3, 2), Output("a", 9, 8)]
    result = check_sink("kafka", outputs, {"a": 3, "b": 1})
    assert (result.missing, result.repeated, result.unexpected) == (2, 1, 1)  # a:2 and all of b missing
    assert not result.exact
    assert any("a: 1 of 1..3 missing, the first 2" in s for s in result.samples)


def test_state_that_lost_or_double_counted_a_record_shows_in_prev() -> None:
    lost = [Output("a", 1, 0), Output("a", 2, 0)]  # a restore without the state of seq 1
    double = [Output("a", 1, 0), Output("a", 2, 2)]  # seq 2 counted twice before this output
    assert check_sink("pg", lost, {"a": 2}).wrong_prev == 1
    assert check_sink("pg", double, {"a": 2}).wrong_prev == 1


def test_an_empty_sink_is_never_exact() -> None:
    assert not check_sink("pg", [], {}).exact
