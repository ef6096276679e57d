"""The benchmark's event formula, window bookkeeping and latency arithmetic (no broker)."""

from __future__ import annotations

import json

import pytest

from bench import dataset
from bench.dataset import PARTITIONS, START_MS, WINDOW_MS


def decoded(i: int) -> tuple[int, str, int]:
    partition, key, value = dataset.event_bytes(i)
    event = json.loads(value)
    assert event["key"] == key.decode()
    return partition, event["key"], event["ts"]


def test_event_time_advances_one_ms_per_event_in_each_partition() -> None:
    last: dict[int, int] = {}
    for i in range(4000):
        partition, _key, ts = decoded(i)
        assert ts == last.get(partition, START_MS - 1) + 1
        last[partition] = ts


def test_each_key_lives_in_one_partition_and_there_are_1000() -> None:
    partitions_of: dict[str, set[int]] = {}
    for i in range(16_000):
        partition, key, _ts = decoded(i)
        partitions_of.setdefault(key, set()).add(partition)
        assert dataset.partition_of_key(int(key[4:])) == partition
    assert len(partitions_of) == dataset.KEYS
    assert all(len(p) == 1 for p in partitions_of.values())


@pytest.mark.parametrize("events", [1, 7, 100, 999, 8_000, 12_345, 40_001])
def test_expected_windows_counts_distinct_key_windows(events: int) -> None:
    seen = set()
    for i in range(events):
        _p, key, ts = decoded(i)
        seen.add((key, (ts - START_MS) // WINDOW_MS))
    assert dataset.expected_windows(events) == len(seen)


@pytest.mark.parametrize("events", [1, 9, 8_000, 12_345])
def test_expected_results_are_every_windows_count_and_sum(events: int) -> None:
    brute: dict[tuple[str, int], list[int]] = {}
    for i in range(events):
        _p, _k, value = dataset.event_bytes(i)
        event = json.loads(value)
        acc = brute.setdefault((event["key"], event["ts"] - (event["ts"] - START_MS) % WINDOW_MS), [0, 0])
        acc[0] += 1
        acc[1] += event["value"]
    expected = sorted((k, w, w + WINDOW_MS, c, s) for (k, w), (c, s) in brute.items())
    assert sorted(dataset.expected_results(events)) == expected
    assert len(expected) == dataset.expected_windows(events)


def test_a_result_record_is_the_whole_record() -> None:
    result = {"key": "key-0001", "window_start": START_MS, "window_end": START_MS + WINDOW_MS, "count": 8, "sum": 9}
    assert dataset.result_record(result) == ("key-0001", START_MS, START_MS + WINDOW_MS, 8, 9)
    assert dataset.result_identity(dataset.result_record(result)) == ("key-0001", START_MS)
    with pytest.raises(KeyError):
        dataset.result_record({"key": "key-0001", "window_start": START_MS, "count": 8})


def test_last_event_of_window_is_the_keys_last_event_in_it() -> None:
    last_j: dict[tuple[str, int], int] = {}
    for i in range(3 * WINDOW_MS * PARTITIONS):
        _p, key, ts = decoded(i)
        j = ts - START_MS
        last_j[(key, START_MS + j - j % WINDOW_MS)] = j
    for (key, window_start), j in last_j.items():
        assert dataset.last_event_of_window(int(key[4:]), window_start) == j


def test_sentinels_come_ten_seconds_after_each_partitions_last_event() -> None:
    events = 20_003
    for partition in range(PARTITIONS):
        last_ts = max(decoded(i)[2] for i in range(partition, events, PARTITIONS))
        key, value = dataset.sentinel_bytes(partition, events)
        assert key == f"end-{partition}".encode()
        assert json.loads(value)["ts"] == last_ts + dataset.SENTINEL_GAP_MS


def test_latency_is_visibility_minus_append_of_the_windows_last_event() -> None:
    key_index = 9  # partition 1, the 2nd key of that partition: events j = 1, 126, 251, ...
    window_start = START_MS
    j_last = dataset.last_event_of_window(key_index, window_start)
    appended = [[] for _ in range(PARTITIONS)]
    appended[1] = [(j, 10_000 + j) for j in range(WINDOW_MS)]
    seen = [
        (f"key-{key_index:04d}", window_start, 10_000 + j_last + 250.0),
        (f"key-{key_index:04d}", window_start, 10_000 + j_last + 900.0),  # a duplicate counts once, first
        ("end-1", window_start, 0.0),  # sentinel windows are not measured
    ]
    assert dataset.latencies_ms(appended, seen, since_ms=0) == [250.0]
    assert dataset.latencies_ms(appended, seen, since_ms=10_000 + j_last + 1) == []  # in the warm-up
