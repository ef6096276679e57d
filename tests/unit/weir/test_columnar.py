"""weir.core.columnar: schemas and their batch decoder, batch metadata, field keys, key groups of a
batch, the split by channel, Arrow IPC and the built-in aggregates."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from weir.core.columnar import (
    TIMESTAMP_METADATA,
    BatchKeys,
    BuiltinAggregates,
    Count,
    FieldKey,
    Max,
    Mean,
    Min,
    Schema,
    Sum,
    batch_timestamps,
    channel_table,
    concat,
    decode_ipc,
    encode_ipc,
    is_batch,
    partition_order,
    records_of,
    split_by_channel,
    timestamp_field_of,
)
from weir.core.errors import JobDefinitionError, SerializationError
from weir.core.keygroups import KeyEncoder, subtask_for_key_group

SCHEMA = Schema.of({"id": str, "key": str, "value": int, "ts": int})
DECODER = SCHEMA.decoder("ts")


def raw(key: str = "a", value: Any = 1, ts: Any = 5, id: str = "e1") -> bytes:
    import json

    return json.dumps({"id": id, "key": key, "value": value, "ts": ts}).encode()


def batch(rows: list[tuple[str, str, int, int]]) -> pa.RecordBatch:
    return DECODER.batch([list(column) for column in zip(*rows, strict=True)] if rows else [[], [], [], []])


# Schema --------------------------------------------------------------------------------------------


def test_a_schema_keeps_its_fields_in_order_from_a_mapping_or_pairs() -> None:
    assert SCHEMA.names == ("id", "key", "value", "ts")
    assert Schema.of([("b", float), ("a", bool)]).fields == (("b", float), ("a", bool))
    assert SCHEMA.kind_of("value") is int
    arrow = SCHEMA.arrow_schema("ts")
    assert arrow.types == [pa.string(), pa.string(), pa.int64(), pa.int64()]
    assert arrow.metadata == {TIMESTAMP_METADATA: b"ts"}
    assert Schema.of({"x": float, "y": bool}).arrow_schema(None).metadata is None
    assert Schema.of({"x": float, "y": bool}).arrow_schema(None).types == [pa.float64(), pa.bool_()]


@pytest.mark.parametrize(
    ("fields", "complaint"),
    [
        ({}, "at least one field"),
        ([], "at least one field"),
        ({"": int}, "non-empty str, got ''"),
        ([(3, int)], "non-empty str, got 3"),
        ([("a", int), ("a", str)], "'a' is declared twice"),
        ({"a": bytes}, "schema field 'a': type <class 'bytes'> is not one of str, int, float, bool"),
        ({"a": "int"}, "is not one of str, int, float, bool"),
        ({"a": list}, "is not one of"),
    ],
)
def test_a_bad_schema_is_a_job_definition_error(fields: Any, complaint: str) -> None:
    with pytest.raises(JobDefinitionError, match=complaint):
        Schema.of(fields)


def test_an_unknown_field_is_named_with_the_schema_fields() -> None:
    with pytest.raises(JobDefinitionError, match=r"no field 'nope' \(fields: id, key, value, ts\)"):
        SCHEMA.kind_of("nope")


def test_the_timestamp_field_must_be_a_known_int_field() -> None:
    with pytest.raises(JobDefinitionError, match="timestamp field 'key' must be an int field"):
        SCHEMA.decoder("key")
    with pytest.raises(JobDefinitionError, match="no field 'time'"):
        SCHEMA.decoder("time")
    assert Schema.of({"a": float}).decoder(None).timestamp_field is None


# BatchDecoder --------------------------------------------------------------------------------------


def test_a_good_list_decodes_into_records_columns_and_a_batch() -> None:
    raws = [raw("a", 1, 10, "e1"), raw("b", 2, 7, "e2"), raw("a", -3, 12, "e3")]
    records, bad = DECODER.decode(raws)
    assert bad == []
    assert [(r.id, r.key, r.value, r.ts) for r in records] == [
        ("e1", "a", 1, 10),
        ("e2", "b", 2, 7),
        ("e3", "a", -3, 12),
    ]
    columns = DECODER.columns(records)
    assert [list(column) for column in columns] == [["e1", "e2", "e3"], ["a", "b", "a"], [1, 2, -3], [10, 7, 12]]
    assert [type(column).__name__ for column in columns] == ["list", "list", "ndarray", "ndarray"]
    stamps = DECODER.timestamps(columns)
    assert stamps is not None and list(stamps) == [10, 7, 12]
    b = DECODER.batch(columns)
    assert is_batch(b) and b.num_rows == 3
    assert b.schema == SCHEMA.arrow_schema("ts")
    assert b.to_pydict() == {"id": ["e1", "e2", "e3"], "key": ["a", "b", "a"], "value": [1, 2, -3], "ts": [10, 7, 12]}
    assert DECODER.decode([]) == ([], [])


def test_other_fields_are_ignored_and_an_int_is_taken_for_a_float() -> None:
    decoder = Schema.of({"x": float, "flag": bool}).decoder(None)
    records, bad = decoder.decode([b'{"x": 1, "flag": true, "extra": [1, 2]}', b'{"flag": false, "x": 2.5}'])
    assert bad == []
    b = decoder.batch(decoder.columns(records))
    assert b.to_pydict() == {"x": [1.0, 2.5], "flag": [True, False]}
    assert decoder.timestamps(decoder.columns(records)) is None


def test_one_malformed_record_is_refused_alone_with_a_json_reason() -> None:
    raws = [raw("a", 1, 1), b'{"id": "e2", "key": "b", "value": 2', raw("c", 3, 3), b"\xff\xfe"]
    records, bad = DECODER.decode(raws)
    assert [r.key for r in records] == ["a", "c"]
    assert [i for i, _ in bad] == [1, 3]
    assert all(reason.startswith("JSONDecodeError: ") for _, reason in bad), bad


@pytest.mark.parametrize(
    ("record", "where"),
    [
        (raw(value=True), "$.value"),  # bool is not an int
        (raw(value="1"), "$.value"),
        (raw(value=1.5), "$.value"),
        (raw(ts=None), "$.ts"),
        (b'{"id": "e", "key": "a", "value": 1}', "ts"),  # missing field
        (b'["e", "a", 1, 5]', "object"),  # not an object
    ],
)
def test_a_record_of_the_wrong_type_is_refused_alone_with_a_value_reason(record: bytes, where: str) -> None:
    records, bad = DECODER.decode([raw("a"), record, raw("b")])
    assert [r.key for r in records] == ["a", "b"]
    ((index, reason),) = bad
    assert index == 1 and reason.startswith("ValueError: ") and where in reason, reason


def test_a_record_without_a_value_is_refused() -> None:
    records, bad = DECODER.decode([None, raw("a")])
    assert [r.key for r in records] == ["a"]
    assert bad == [(0, "ValueError: record has no value")]
    assert DECODER.decode([None]) == ([], [(0, "ValueError: record has no value")])


def test_a_record_holding_two_json_objects_is_refused_not_split() -> None:
    good = raw("a", 1, 1)
    records, bad = DECODER.decode([good, good + b"," + raw("b", 2, 2)])
    assert [r.key for r in records] == ["a"]
    assert [i for i, _ in bad] == [1]
    records, bad = DECODER.decode([b'{"id": "e", "key": "a", "value": 1', b'"ts": 5}'])
    assert records == [] and [i for i, _ in bad] == [0, 1]


def test_an_int_beyond_int64_is_refused_alone() -> None:
    records, bad = DECODER.decode([raw("a", 2**63, 1), raw("b", 1, 2)])
    assert [r.key for r in records] == ["b"]
    assert [i for i, _ in bad] == [0] and bad[0][1].startswith("ValueError: ")
    assert DECODER.batch(DECODER.columns(records)).num_rows == 1


# Batch metadata ------------------------------------------------------------------------------------


def test_a_batch_names_its_event_time_column_in_its_schema_metadata() -> None:
    b = batch([("e1", "a", 1, 30), ("e2", "b", 2, -4)])
    assert timestamp_field_of(b) == "ts"
    assert batch_timestamps(b).tolist() == [30, -4]
    assert batch_timestamps(b).dtype == np.int64
    rows, stamps = records_of(b)
    assert rows == [{"id": "e1", "key": "a", "value": 1, "ts": 30}, {"id": "e2", "key": "b", "value": 2, "ts": -4}]
    assert stamps == [30, -4]


def test_a_batch_without_event_time_has_no_timestamps() -> None:
    plain = Schema.of({"k": str}).decoder(None).batch([["x", "y"]])
    assert timestamp_field_of(plain) is None
    assert records_of(plain) == ([{"k": "x"}, {"k": "y"}], [None, None])
    with pytest.raises(JobDefinitionError, match="without an event-time column"):
        batch_timestamps(plain)
    other_metadata = plain.replace_schema_metadata({b"other": b"x"})
    assert timestamp_field_of(other_metadata) is None


def test_only_a_record_batch_is_a_batch() -> None:
    b = batch([("e", "a", 1, 1)])
    assert is_batch(b)
    assert not is_batch(pa.Table.from_batches([b]))
    assert not is_batch({"key": "a"}) and not is_batch(None)


# FieldKey ------------------------------------------------------------------------------------------


def test_a_field_key_selects_the_field_of_a_record_and_compares_by_field() -> None:
    key = FieldKey("key")
    assert key({"key": "a", "value": 1}) == "a"
    with pytest.raises(KeyError):
        key({"value": 1})
    assert key == FieldKey("key") and hash(key) == hash(FieldKey("key"))
    assert key != FieldKey("value") and key != "key"
    assert len({FieldKey("key"), FieldKey("key"), FieldKey("value")}) == 2
    assert repr(key) == "FieldKey('key')"
    for bad in ("", 3, None):
        with pytest.raises(JobDefinitionError, match="non-empty str"):
            FieldKey(bad)  # type: ignore[arg-type]


# Key groups of a batch -----------------------------------------------------------------------------


@pytest.mark.parametrize("max_parallelism", [1, 7, 128, 32768])
def test_the_key_group_of_each_row_is_the_per_record_one(max_parallelism: int) -> None:
    rng = random.Random(max_parallelism)
    keys = [f"user-{rng.randrange(300)}" for _ in range(2000)] + ["", "ü-ñicode", "a" * 300]
    b = Schema.of({"key": str}).decoder(None).batch([keys])
    groups = BatchKeys("key", max_parallelism).key_groups(b)
    encoder = KeyEncoder(max_parallelism)
    assert groups.tolist() == [encoder.key_group(k) for k in keys]
    ints = [rng.randrange(-(2**63), 2**63) for _ in range(500)] + [0, -1, 2**63 - 1]
    b = Schema.of({"key": int}).decoder(None).batch([ints])
    assert BatchKeys("key", max_parallelism).key_groups(b).tolist() == [encoder.key_group(k) for k in ints]


def test_distinct_keys_and_their_encoding() -> None:
    b = Schema.of({"key": str}).decoder(None).batch([["b", "a", "b", "c", "a"]])
    keys, indices = BatchKeys("key", 128).distinct(b)
    assert [keys[i] for i in indices] == ["b", "a", "b", "c", "a"]
    assert sorted(keys) == ["a", "b", "c"]
    assert BatchKeys("key", 128).encode("a") == KeyEncoder(128).encode("a")
    empty = Schema.of({"key": str}).decoder(None).batch([[]])
    assert BatchKeys("key", 128).key_groups(empty).tolist() == []


def test_a_null_key_is_a_serialization_error() -> None:
    b = pa.RecordBatch.from_pydict({"key": ["a", None, None]})
    with pytest.raises(SerializationError, match="key field 'key' is null in 2 records"):
        BatchKeys("key", 128).key_groups(b)


# Split by channel ------------------------------------------------------------------------------------


def test_a_batch_splits_by_channel_keeping_the_order_of_each_channel() -> None:
    rng = random.Random(5)
    n, channels = 1000, 5
    b = Schema.of({"i": int}).decoder(None).batch([list(range(n))])
    of_row = np.array([rng.randrange(channels - 1) for _ in range(n)], dtype=np.int32)  # channel 4 gets none
    parts = split_by_channel(b, of_row, channels)
    assert [ch for ch, _ in parts] == sorted({int(c) for c in of_row})
    for ch, part in parts:
        assert part.column("i").to_pylist() == [i for i in range(n) if of_row[i] == ch]
        assert part.schema == b.schema
    assert sorted(i for _, part in parts for i in part.column("i").to_pylist()) == list(range(n))


def test_a_batch_for_one_channel_is_not_copied_and_an_empty_one_goes_nowhere() -> None:
    b = Schema.of({"i": int}).decoder(None).batch([[1, 2, 3]])
    assert split_by_channel(b, np.array([2, 2, 2], dtype=np.int32), 4) == [(2, b)]
    assert split_by_channel(b, np.array([0, 0, 0], dtype=np.int32), 1) == [(0, b)]
    (only,) = split_by_channel(b, np.array([2, 2, 2], dtype=np.int32), 4)
    assert only[1] is b
    empty = Schema.of({"i": int}).decoder(None).batch([[]])
    assert split_by_channel(empty, np.array([], dtype=np.int32), 4) == []
    assert split_by_channel(empty, np.array([], dtype=np.int32), 1) == []


def test_the_channel_table_maps_each_key_group_to_its_owner() -> None:
    table = channel_table(lambda kg: subtask_for_key_group(128, 3, kg), 128)
    assert table.dtype == np.int32 and len(table) == 128
    assert table.tolist() == [subtask_for_key_group(128, 3, kg) for kg in range(128)]


# Arrow IPC -----------------------------------------------------------------------------------------


def test_batches_round_trip_through_arrow_ipc_as_one_batch() -> None:
    first = batch([("e1", "a", 1, 10), ("e2", "b", 2, 11)])
    second = batch([("e3", "c", 3, 12)])
    third = batch([])
    decoded = decode_ipc(encode_ipc([first, second, third]))
    assert decoded.to_pylist() == first.to_pylist() + second.to_pylist()
    assert decoded.schema == first.schema and timestamp_field_of(decoded) == "ts"
    assert decode_ipc(encode_ipc([first])).equals(first)
    assert concat([first]) is first
    assert concat([first, second]).num_rows == 3


@pytest.mark.parametrize("cut", [0, 1, 7, 30, -9, -1])
def test_a_corrupt_or_truncated_blob_is_a_serialization_error(cut: int) -> None:
    blob = encode_ipc([batch([("e1", "a", 1, 10), ("e2", "b", 2, 11)])])
    with pytest.raises(SerializationError, match="not a readable Arrow IPC stream"):
        decode_ipc(blob[:cut])


def test_garbage_is_a_serialization_error() -> None:
    with pytest.raises(SerializationError, match="not a readable Arrow IPC stream"):
        decode_ipc(b"definitely not arrow" * 3)


def test_a_stream_of_two_batches_is_refused() -> None:
    b = batch([("e1", "a", 1, 10)])
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, b.schema) as writer:
        writer.write_batch(b)
        writer.write_batch(b)
    with pytest.raises(SerializationError, match="must hold one record batch, found 2"):
        decode_ipc(sink.getvalue().to_pybytes())


# Built-in aggregates ---------------------------------------------------------------------------------


def test_count_and_sum_keep_a_count_sum_accumulator() -> None:
    fn = BuiltinAggregates({"count": Count(), "sum": Sum("value")}, "key")
    assert fn.partials == ((None, "count"), ("value", "sum"))
    assert fn.create() == (0, 0)
    acc = fn.create()
    for v in (3, -1, 10):
        acc = fn.add(acc, {"key": "a", "value": v})
    assert acc == (3, 12)
    assert fn.merge(acc, (2, 5)) == (5, 17)
    assert fn.result("a", 0, 10, acc) == {"key": "a", "window_start": 0, "window_end": 10, "count": 3, "sum": 12}
    assert fn.fields() == ("value",)


def test_every_aggregate_creates_adds_merges_and_results() -> None:
    fn = BuiltinAggregates(
        {"lo": Min("v"), "hi": Max("v"), "avg": Mean("v"), "n": Count(), "total": Sum("w"), "top": Max("w")}, "user"
    )
    assert fn.partials == ((("v", "min")), ("v", "max"), ("v", "sum"), (None, "count"), ("w", "sum"), ("w", "max"))
    assert fn.fields() == ("v", "w")
    empty = fn.create()
    assert empty == (None, None, 0, 0, 0, None)
    assert fn.result("u", 0, 5, empty) == {
        "user": "u",
        "window_start": 0,
        "window_end": 5,
        "lo": None,
        "hi": None,
        "avg": None,
        "n": 0,
        "total": 0,
        "top": None,
    }
    acc = empty
    for v, w in [(4, 1.5), (-2, 0.5), (9, 2.0)]:
        acc = fn.add(acc, {"v": v, "w": w})
    assert acc == (-2, 9, 11, 3, 4.0, 2.0)
    assert fn.result("u", 0, 5, acc)["avg"] == pytest.approx(11 / 3)
    # merging a partial from a batch: min/max against None on either side, sums and counts added
    assert fn.merge(empty, (5, 6, 11, 2, 1.0, 0.5)) == (5, 6, 11, 2, 1.0, 0.5)
    assert fn.merge(acc, (None, None, 0, 0, 0, None)) == acc
    assert fn.merge(acc, (-7, 100, 1, 1, 1.0, 8.0)) == (-7, 100, 12, 4, 5.0, 8.0)
    assert fn.result("u", 0, 5, fn.merge(acc, (-7, 100, 1, 1, 1.0, 8.0)))["avg"] == 3.0


def test_results_of_many_windows_are_each_windows_result() -> None:
    fn = BuiltinAggregates(
        {"lo": Min("v"), "hi": Max("v"), "avg": Mean("v"), "n": Count(), "total": Sum("w"), "top": Max("w")}, "user"
    )
    accs = [(-2, 9, 11, 3, 4.0, 2.0), (None, None, 0, 0, 0, None), (5, 5, 5, 1, 0.5, 0.5)]
    keys, starts = ["u", "v", "u"], [0, 0, 10]
    columns = [list(c) for c in zip(*accs, strict=True)]
    expected = [fn.result(k, s, s + 10, acc) for k, s, acc in zip(keys, starts, accs, strict=True)]
    assert fn.results(keys, starts, 10, columns) == expected
    assert [list(r) for r in fn.results(keys, starts, 10, columns)] == [list(r) for r in expected]  # same order
    assert fn.results([], [], 10, [[] for _ in fn.partials]) == []


def test_mean_shares_the_count_and_sum_partials_of_other_aggregates() -> None:
    fn = BuiltinAggregates({"mean": Mean("x"), "count": Count(), "sum": Sum("x")}, "key")
    assert fn.partials == (("x", "sum"), (None, "count"))
    acc = fn.add(fn.add(fn.create(), {"x": 1}), {"x": 2})
    assert fn.result("k", 0, 1, acc) == {
        "key": "k",
        "window_start": 0,
        "window_end": 1,
        "mean": 1.5,
        "count": 2,
        "sum": 3,
    }


@pytest.mark.parametrize("name", ["key", "window_start", "window_end"])
def test_an_aggregate_may_not_take_a_result_field_name(name: str) -> None:
    with pytest.raises(JobDefinitionError, match=f"aggregate name '{name}' is taken"):
        BuiltinAggregates({name: Count()}, "key")


def test_no_aggregates_or_an_unknown_one_is_a_job_definition_error() -> None:
    with pytest.raises(JobDefinitionError, match="at least one built-in aggregate"):
        BuiltinAggregates({}, "key")
    with pytest.raises(JobDefinitionError, match="is not a built-in aggregate"):
        BuiltinAggregates({"x": "sum"}, "key")  # type: ignore[dict-item]


LAZY_ARROW = """
import sys
from weir.core import columnar

assert "pyarrow" not in sys.modules and "numpy" not in sys.modules, "imported with the module"
assert not columnar.is_batch({"key": "a"}) and "pyarrow" not in sys.modules, "a record made is_batch import Arrow"
import pyarrow as pa  # a batch made elsewhere (a job's own code), before any Arrow work here

batch = pa.RecordBatch.from_pydict({"key": ["a", "b", "a"]})
assert columnar.is_batch(batch), "a batch made before the module's first Arrow work is not seen as one"
assert not columnar.is_batch({"key": "a"})
keys = columnar.BatchKeys("key", 128)
channels = columnar.channel_table(lambda kg: kg % 2, 128)[keys.key_groups(batch)]
parts = columnar.split_by_channel(batch, channels, 2)
assert sorted(row for _, part in parts for row in part.column("key").to_pylist()) == ["a", "a", "b"]
print("ok")
"""


def test_arrow_is_imported_by_the_first_arrow_work_and_a_batch_made_before_it_is_one() -> None:
    """The module imports pyarrow and numpy on first use (a job without batches never loads them);
    a batch made by code that imported pyarrow itself is still told apart from a record."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", LAZY_ARROW], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


@pytest.mark.parametrize("seed", range(20))
def test_partition_order_puts_the_rows_partition_by_partition_keeping_offsets(seed: int) -> None:
    """Against a plain reading: partitions in order of first appearance, each one's rows in the order
    given, and each partition's latest event time (the order None when the runs are already whole)."""
    rng = random.Random(seed)
    partitions: list[int] = []
    while len(partitions) < 60:
        partitions += [rng.randrange(5)] * rng.randrange(1, 9)  # fetch runs, partitions in turn
    stamps = [rng.randrange(-50, 1000) for _ in partitions]
    latest, order = partition_order(partitions, stamps)
    firsts = list(dict.fromkeys(partitions))
    expected = [i for p in firsts for i in range(len(partitions)) if partitions[i] == p]
    assert (list(range(len(partitions))) if order is None else order.tolist()) == expected
    assert (order is None) == (expected == list(range(len(partitions))))
    assert latest == {p: max(t for q, t in zip(partitions, stamps, strict=True) if q == p) for p in firsts}
    no_times, same_order = partition_order(partitions, None)
    assert no_times == {} and (same_order is None) == (order is None)
    assert same_order is None or same_order.tolist() == expected
    from_array, array_order = partition_order(partitions, np.array(stamps, dtype=np.int64))  # as the decoder gives
    assert from_array == latest and all(type(t) is int for t in from_array.values())
    assert (array_order is None) == (order is None) and (array_order is None or array_order.tolist() == expected)


def test_partition_order_of_one_partition_takes_nothing() -> None:
    assert partition_order([3, 3, 3], [5, 9, 2]) == ({3: 9}, None)
    latest, order = partition_order([3, 3, 3], np.array([5, 9, 2], dtype=np.int64))
    assert latest == {3: 9} and type(latest[3]) is int and order is None
    assert partition_order([3, 3], None) == ({}, None)
