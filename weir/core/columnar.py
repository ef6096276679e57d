"""Columnar records: a stream of Apache Arrow record batches instead of one Python value per record.

A job opts in by declaring its data by field names (Flink's Table API in miniature): a Kafka source
with a :class:`Schema` decodes each poll into one ``pyarrow.RecordBatch``; ``key_by("field")``
hash-partitions whole batches by key group on arrays; a window ``.aggregate`` of built-in
aggregates (:class:`Count`, :class:`Sum`, :class:`Min`, :class:`Max`, :class:`Mean`) aggregates them
vectorized. What this module holds is shared by the job API, the operators and the TaskManager:

- :class:`Schema`: the declared fields, their Arrow types and the JSON decoder of a batch (msgspec,
  one call per batch; a batch holding a malformed record is decoded record by record so that only
  that record is refused, with the reason);
- :class:`FieldKey`: a key selector naming a field, usable on a batch (its column) and on a record
  (a mapping: ``record[field]``), so a keyed exchange and keyed state agree on both paths;
- key groups of a batch's key column, computed once per distinct key (the same ``key_to_bytes`` and
  CRC32 as a per-record key), and the split of a batch by output channel;
- Arrow IPC, the encoding of a columnar buffer on the wire and in in-flight checkpoint state
  (``docs/formats.md``).

A batch says which column is its event time in its schema metadata (``weir.timestamp``); its
records carry no separate timestamp.

The declarations (:class:`Schema`, :class:`FieldKey`, the aggregates) need neither Arrow nor numpy:
the client install (``weir.core.extras``) builds a columnar job's graph without them, and the Arrow
work, which runs in the TaskManager, starts with :func:`arrow`.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from operator import add as _add
from operator import attrgetter, itemgetter
from types import GenericAlias
from typing import TYPE_CHECKING, Annotated, Any, Final

import msgspec

from weir.core.errors import JobDefinitionError, SerializationError
from weir.core.extras import MissingServerExtraError
from weir.core.ids import KeyGroup
from weir.core.keygroups import KeyEncoder

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa
else:  # imported by arrow(), when the Arrow work starts: a job without batches never imports them
    np = pa = None
_MISSING_ARROW: str | None = None
"""The module the server install's Arrow lacks (the client declares columnar jobs without them)."""

TIMESTAMP_METADATA: Final = b"weir.timestamp"
"""The schema metadata key naming a batch's event-time column."""

_INT64: Final = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]

_ARROW_TYPE_NAMES: Final[Mapping[type, str]] = {str: "string", int: "int64", float: "float64", bool: "bool_"}
"""A schema field's Python type -> the ``pyarrow`` factory of its Arrow type."""

_first: Final = itemgetter(0)

_RECORD_BATCH: type | None = None
"""``pyarrow.RecordBatch`` once :func:`arrow` imported it."""


def arrow() -> Any:
    """The ``pyarrow`` module (``numpy`` imported with it, as ``np`` here), imported on first use; or
    :class:`MissingServerExtraError` in a client-only install."""
    global np, pa, _RECORD_BATCH, _MISSING_ARROW
    if pa is None:
        if _MISSING_ARROW is None:
            try:
                import numpy
                import pyarrow
            except ModuleNotFoundError as missing:
                _MISSING_ARROW = missing.name or "pyarrow"
            else:
                np, pa, _RECORD_BATCH = numpy, pyarrow, pyarrow.RecordBatch
        if pa is None:
            raise MissingServerExtraError("the columnar path (Arrow record batches)", _MISSING_ARROW or "pyarrow")
    return pa


def is_batch(value: object) -> bool:
    """Whether a stream value is a columnar batch (never, without Arrow: a batch can only have been
    made once something imported ``pyarrow``)."""
    record_batch = _RECORD_BATCH
    if record_batch is None:
        if "pyarrow" not in sys.modules:
            return False
        arrow()
        record_batch = _RECORD_BATCH
    return type(value) is record_batch


@dataclass(frozen=True)
class Schema:
    """The fields of a columnar stream's records, in order: name -> Python type (str, int, float, bool).

    A JSON record must be an object holding every field with a value of its type (``bool`` is not an
    ``int``; an ``int`` is accepted for a ``float``); other fields are ignored."""

    fields: tuple[tuple[str, type], ...]

    @classmethod
    def of(cls, fields: Mapping[str, type] | Sequence[tuple[str, type]]) -> Schema:
        items = tuple(fields.items()) if isinstance(fields, Mapping) else tuple(fields)
        if not items:
            raise JobDefinitionError("a schema needs at least one field")
        seen: set[str] = set()
        for name, kind in items:
            if not isinstance(name, str) or not name:
                raise JobDefinitionError(f"a schema field name must be a non-empty str, got {name!r}")
            if name in seen:
                raise JobDefinitionError(f"schema field {name!r} is declared twice")
            if kind not in _ARROW_TYPE_NAMES:
                raise JobDefinitionError(f"schema field {name!r}: type {kind!r} is not one of str, int, float, bool")
            seen.add(name)
        return cls(items)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.fields)

    def project(self, names: Iterable[str]) -> Schema:
        """The schema of the fields named (in this schema's order): what a source decodes when the job
        reads only those (Flink's projection push-down)."""
        wanted = set(names)
        for name in wanted:
            self.kind_of(name)  # an unknown field fails
        return Schema(tuple((name, kind) for name, kind in self.fields if name in wanted))

    def kind_of(self, name: str) -> type:
        for field, kind in self.fields:
            if field == name:
                return kind
        raise JobDefinitionError(f"the schema has no field {name!r} (fields: {', '.join(self.names)})")

    def check_timestamp_field(self, timestamp_field: str | None) -> None:
        """A batch's event time is an int field of the schema (epoch ms), or none."""
        if timestamp_field is not None and self.kind_of(timestamp_field) is not int:
            raise JobDefinitionError(f"timestamp field {timestamp_field!r} must be an int field (epoch ms)")

    def arrow_schema(self, timestamp_field: str | None) -> pa.Schema:
        arrow_ = arrow()
        metadata = {TIMESTAMP_METADATA: timestamp_field.encode()} if timestamp_field else None
        fields = [(name, getattr(arrow_, _ARROW_TYPE_NAMES[kind])()) for name, kind in self.fields]
        return arrow_.schema(fields, metadata=metadata)

    def decoder(self, timestamp_field: str | None) -> BatchDecoder:
        return BatchDecoder(self, timestamp_field)


class BatchDecoder:
    """Decodes JSON records of one :class:`Schema` into record batches: one msgspec call for the whole
    list; when that fails, each record alone, so a malformed one is refused without its neighbours."""

    def __init__(self, schema: Schema, timestamp_field: str | None) -> None:
        schema.check_timestamp_field(timestamp_field)
        self.schema = schema
        self.arrow_schema = schema.arrow_schema(timestamp_field)
        self.timestamp_field = timestamp_field
        # An int field is an Arrow int64: a larger int is refused as that record's error, not later.
        fields = [(name, _INT64 if kind is int else kind) for name, kind in schema.fields]
        # gc=False: a record holds str, int, float and bool only, never a cycle; untracked, a poll's
        # thousands of them cost the cyclic collector nothing.
        record = msgspec.defstruct("Record", fields, gc=False)
        # Each raw record in a list of its own ([[r1],[r2],...]): a raw record that is not one JSON
        # object (a fragment, or two objects) cannot pass as records of its neighbours.
        self._many = msgspec.json.Decoder(GenericAlias(list, GenericAlias(tuple, record))).decode
        self._one = msgspec.json.Decoder(record).decode
        self._getters = tuple(attrgetter(name) for name in schema.names)
        self._int64 = tuple(kind is int for _name, kind in schema.fields)
        self._timestamp_index = schema.names.index(timestamp_field) if timestamp_field else None

    def decode(self, raws: Sequence[bytes | None]) -> tuple[list[Any], list[tuple[int, str]]]:
        """The records of ``raws`` that decode (msgspec structs, in order) and ``(index, reason)`` of
        each one that does not."""
        try:  # a record without a value (None) makes the join raise TypeError: then one by one
            wrapped = self._many(b"[[" + b"],[".join(raws) + b"]]")  # type: ignore[arg-type]
        except (msgspec.DecodeError, UnicodeDecodeError, TypeError):
            pass
        else:
            if len(wrapped) == len(raws):
                return list(map(_first, wrapped)), []
        good: list[Any] = []
        bad: list[tuple[int, str]] = []
        one = self._one
        for i, raw in enumerate(raws):
            if raw is None:
                bad.append((i, "ValueError: record has no value"))
                continue
            try:
                good.append(one(raw))
            except msgspec.ValidationError as exc:
                bad.append((i, f"ValueError: {exc}"))
            except (msgspec.DecodeError, UnicodeDecodeError) as exc:
                bad.append((i, f"JSONDecodeError: {exc}"))
        return good, bad

    def columns(self, records: Sequence[Any]) -> list[np.ndarray | list[Any]]:
        """The records' values per field, in schema order: an int field's as an int64 numpy array
        (filled from the records in one pass, no list between: msgspec checked every value fits
        int64), any other field's as a list."""
        arrow()
        n, int64, fromiter = len(records), np.int64, np.fromiter
        return [
            fromiter(map(getter, records), int64, n) if is_int else list(map(getter, records))
            for getter, is_int in zip(self._getters, self._int64, strict=True)
        ]

    def timestamps(self, columns: Sequence[np.ndarray | list[Any]]) -> np.ndarray | list[Any] | None:
        """The event-time column of ``columns`` (an int64 numpy array), None without one."""
        return columns[self._timestamp_index] if self._timestamp_index is not None else None

    def batch(self, columns: Sequence[np.ndarray | list[Any]], order: np.ndarray | None = None) -> pa.RecordBatch:
        """The columns as a record batch; ``order``: its rows taken in that order. An int column
        given as a list goes through numpy (a third cheaper than Arrow's own conversion)."""
        arrow()
        int64 = pa.int64()
        arrays = [
            pa.array(values if isinstance(values, np.ndarray) else np.array(values, dtype=np.int64))
            if field.type == int64
            else pa.array(values, type=field.type)
            for values, field in zip(columns, self.arrow_schema, strict=True)
        ]
        batch = pa.RecordBatch.from_arrays(arrays, schema=self.arrow_schema)
        return batch if order is None else batch.take(pa.array(order))


def partition_order(
    partitions: Sequence[int], timestamps: np.ndarray | Sequence[int] | None
) -> tuple[dict[int, int], np.ndarray | None]:
    """Of a poll's decoded records (each one's partition and event time, or no event times; an int64
    numpy array is taken as it is): each partition's latest event time, and the order that puts the
    rows partition by partition (the partitions in order of first appearance, each one's rows in
    offset order), None when they already are."""
    distinct = list(dict.fromkeys(partitions))
    arrow()
    stamps = None if timestamps is None or len(timestamps) == 0 else np.asarray(timestamps, dtype=np.int64)
    if len(distinct) == 1:
        return ({distinct[0]: int(stamps.max())} if stamps is not None else {}), None
    parts = np.array(partitions, dtype=np.int64)
    latest: dict[int, int] = {}
    if stamps is not None:
        for partition in distinct:
            latest[partition] = int(stamps[parts == partition].max())
    if 1 + int(np.count_nonzero(parts[1:] != parts[:-1])) == len(distinct):
        return latest, None  # one run per partition already
    rank = np.zeros(max(distinct) + 1, dtype=np.int64)
    rank[distinct] = np.arange(len(distinct))
    return latest, np.argsort(rank[parts], kind="stable")


def timestamp_field_of(batch: pa.RecordBatch) -> str | None:
    """The batch's event-time column, from its schema metadata."""
    metadata = batch.schema.metadata
    if not metadata or TIMESTAMP_METADATA not in metadata:
        return None
    return metadata[TIMESTAMP_METADATA].decode()


def batch_timestamps(batch: pa.RecordBatch) -> np.ndarray:
    """The batch's event times (int64 epoch ms); raises JobDefinitionError when it declares none."""
    field = timestamp_field_of(batch)
    if field is None:
        raise JobDefinitionError("a columnar batch without an event-time column: give the source a timestamp_field")
    return batch.column(field).to_numpy(zero_copy_only=False)


def records_of(batch: pa.RecordBatch) -> tuple[list[dict[str, Any]], list[int | None]]:
    """The batch's records as dicts, and each one's timestamp (None without an event-time column)."""
    rows = batch.to_pylist()
    field = timestamp_field_of(batch)
    if field is None:
        return rows, [None] * len(rows)
    return rows, batch.column(field).to_pylist()


class FieldKey:
    """A key selector naming a field: ``record[field]`` for a record, the column for a batch."""

    __slots__ = ("field",)

    def __init__(self, field: str) -> None:
        if not isinstance(field, str) or not field:
            raise JobDefinitionError(f"a key field name must be a non-empty str, got {field!r}")
        self.field = field

    def __call__(self, record: Any) -> Any:
        return record[self.field]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, FieldKey) and other.field == self.field

    def __hash__(self) -> int:
        return hash((FieldKey, self.field))

    def __repr__(self) -> str:
        return f"FieldKey({self.field!r})"


class BatchKeys:
    """Key groups of a batch's key column, each distinct key encoded once (:class:`KeyEncoder`)."""

    def __init__(self, field: str, max_parallelism: int) -> None:
        self.field = field
        self._encoder = KeyEncoder(max_parallelism)

    def distinct(self, batch: pa.RecordBatch) -> tuple[list[Any], np.ndarray]:
        """The distinct keys of the batch, and for each row the index of its key among them."""
        column = batch.column(self.field)
        if column.null_count:
            raise SerializationError(f"key field {self.field!r} is null in {column.null_count} records")
        encoded = column.dictionary_encode()
        return encoded.dictionary.to_pylist(), encoded.indices.to_numpy(zero_copy_only=False)

    def key_groups(self, batch: pa.RecordBatch) -> np.ndarray:
        """The key group of each row."""
        arrow()
        keys, indices = self.distinct(batch)
        key_group = self._encoder.key_group
        groups = np.fromiter((key_group(k) for k in keys), dtype=np.int32, count=len(keys))
        return groups[indices]

    def encode(self, key: Any) -> tuple[bytes, KeyGroup, bytes]:
        return self._encoder.encode(key)


def split_by_channel(
    batch: pa.RecordBatch, channels: np.ndarray, num_channels: int
) -> list[tuple[int, pa.RecordBatch]]:
    """The rows of ``batch`` per output channel (``channels[i]`` is row i's), order kept within each."""
    if num_channels == 1 or batch.num_rows == 0:
        return [(0, batch)] if batch.num_rows else []
    arrow()
    counts = np.bincount(channels, minlength=num_channels)
    if counts.max() == batch.num_rows:
        return [(int(np.argmax(counts)), batch)]
    order = np.argsort(channels, kind="stable")
    ordered = batch.take(pa.array(order))
    parts: list[tuple[int, pa.RecordBatch]] = []
    offset = 0
    for channel, count in enumerate(counts.tolist()):
        if count:
            parts.append((channel, ordered.slice(offset, count)))
            offset += count
    return parts


def channel_table(owner_of_key_group: Callable[[int], int], max_parallelism: int) -> np.ndarray:
    """The output channel of each key group, as an array indexed by key group."""
    arrow()
    return np.fromiter((owner_of_key_group(kg) for kg in range(max_parallelism)), dtype=np.int32, count=max_parallelism)


# Arrow IPC -----------------------------------------------------------------------------------------


def concat(batches: Sequence[pa.RecordBatch]) -> pa.RecordBatch:
    """One batch of the rows of ``batches`` (of one schema), in order."""
    if len(batches) == 1:
        return batches[0]
    return arrow().concat_batches(batches)


def encode_ipc(batches: Sequence[pa.RecordBatch]) -> bytes:
    """``batches`` (of one schema) as one Arrow IPC stream holding one batch."""
    batch = concat(batches)
    arrow()
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return sink.getvalue().to_pybytes()


def decode_ipc(blob: bytes) -> pa.RecordBatch:
    """The one batch of an Arrow IPC stream written by :func:`encode_ipc`."""
    arrow()
    try:
        reader = pa.ipc.open_stream(blob)
        batches = list(reader)
    except (pa.ArrowInvalid, OSError) as exc:
        raise SerializationError(f"a columnar buffer is not a readable Arrow IPC stream: {exc}") from exc
    if len(batches) != 1:
        raise SerializationError(f"a columnar buffer must hold one record batch, found {len(batches)}")
    return batches[0]


# Pending windows in a snapshot ----------------------------------------------------------------------

PENDING_KEY: Final = "__key"
PENDING_START: Final = "__window_start"
"""The first two columns of a columnar window's pending rows: the key and the window's start; the
partials of the accumulator (``__p0``, ``__p1``, ...) follow, in the accumulator's order."""


def encode_pending_windows(table: pa.Table) -> bytes:
    """The pending windows ``table`` (columns ``__key``, ``__window_start``, the partials) as one
    Arrow IPC stream: what a columnar window's operator state keeps of them (docs/formats.md)."""
    arrow()
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def decode_pending_windows(blob: bytes) -> list[tuple[Any, int, tuple[Any, ...]]]:
    """The pending windows of :func:`encode_pending_windows`: ``(key, window start, accumulator)``
    each, the accumulator the tuple of its partials. Raises SerializationError for other bytes."""
    arrow()
    try:
        table = pa.ipc.open_stream(blob).read_all()
    except (pa.ArrowInvalid, OSError) as exc:
        raise SerializationError(f"the pending windows of a window state are not an Arrow IPC stream: {exc}") from exc
    names = table.column_names
    if names[:2] != [PENDING_KEY, PENDING_START] or len(names) < 3:
        raise SerializationError(
            f"the pending windows of a window state have columns {names}, not {PENDING_KEY}, {PENDING_START} "
            "and the partials: restore it with the Weir version that wrote it"
        )
    partials = [table.column(i).to_pylist() for i in range(2, len(names))]
    keys, starts = table.column(0).to_pylist(), table.column(1).to_pylist()
    return list(zip(keys, starts, zip(*partials, strict=True), strict=True))


# Built-in aggregates --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Count:
    """The number of records in the window."""


@dataclass(frozen=True)
class Sum:
    """The sum of ``field`` over the window's records."""

    field: str


@dataclass(frozen=True)
class Min:
    field: str


@dataclass(frozen=True)
class Max:
    field: str


@dataclass(frozen=True)
class Mean:
    """The arithmetic mean of ``field`` (a float)."""

    field: str


Aggregate = Count | Sum | Min | Max | Mean

Partial = tuple[str | None, str]
"""One partial aggregate a window keeps: (field or None for the record count, "count" | "sum" |
"min" | "max"); an accumulator is the tuple of a window's partials in order."""


def _partials_of(aggregate: Aggregate) -> tuple[Partial, ...]:
    match aggregate:
        case Count():
            return ((None, "count"),)
        case Sum(field=field):
            return ((field, "sum"),)
        case Min(field=field):
            return ((field, "min"),)
        case Max(field=field):
            return ((field, "max"),)
        case Mean(field=field):
            return ((field, "sum"), (None, "count"))
        case _:
            raise JobDefinitionError(f"{aggregate!r} is not a built-in aggregate (Count, Sum, Min, Max, Mean)")


class BuiltinAggregates:
    """Named built-in aggregates of a window as one AggregateFunction (``create``/``add``/``result``,
    for records) that also merges partial aggregates computed on batches (``merge``).

    The accumulator is the tuple of the partials (:data:`Partial`) the aggregates need, each kept
    once: ``{"count": Count(), "sum": Sum("value")}`` keeps ``(count, sum)``, as a hand-written
    (count, sum) AggregateFunction would, so the state of both reads the same. A result is a dict:
    the key under ``key_field``, ``window_start``, ``window_end`` and each aggregate by its name."""

    def __init__(self, aggregates: Mapping[str, Aggregate], key_field: str) -> None:
        if not aggregates:
            raise JobDefinitionError("a window aggregate needs at least one built-in aggregate")
        reserved = {key_field, "window_start", "window_end"}
        partials: list[Partial] = []
        for name, aggregate in aggregates.items():
            if name in reserved:
                raise JobDefinitionError(f"aggregate name {name!r} is taken by the result's own fields")
            for partial in _partials_of(aggregate):
                if partial not in partials:
                    partials.append(partial)
        self.key_field = key_field
        self.aggregates = dict(aggregates)
        self.partials: tuple[Partial, ...] = tuple(partials)
        self._index = {p: i for i, p in enumerate(self.partials)}
        self._ops = tuple(op for _f, op in self.partials)
        self._empty = tuple(0 if op in ("count", "sum") else None for op in self._ops)
        self._additive = all(op in ("count", "sum") for op in self._ops)
        self._fields = tuple(f for f, _op in self.partials)
        self._results: tuple[tuple[str, Callable[[tuple[Any, ...]], Any]], ...] = tuple(
            (name, self._result_of(aggregate)) for name, aggregate in self.aggregates.items()
        )

    def fields(self) -> tuple[str, ...]:
        """The record fields the aggregates read."""
        return tuple(sorted({f for f in self._fields if f is not None}))

    def _result_of(self, aggregate: Aggregate) -> Callable[[tuple[Any, ...]], Any]:
        match aggregate:
            case Mean(field=field):
                s, c = self._index[(field, "sum")], self._index[(None, "count")]
                return lambda acc: acc[s] / acc[c] if acc[c] else None
            case _:
                i = self._index[_partials_of(aggregate)[0]]
                return lambda acc: acc[i]

    def create(self) -> tuple[Any, ...]:
        return self._empty

    def add(self, acc: tuple[Any, ...], record: Any) -> tuple[Any, ...]:
        return self.merge(acc, tuple(1 if f is None else record[f] for f in self._fields))

    def merge(self, acc: tuple[Any, ...], partial: Sequence[Any]) -> tuple[Any, ...]:
        if self._additive:
            return tuple(map(_add, acc, partial))
        merged = []
        for op, a, b in zip(self._ops, acc, partial, strict=True):
            if op == "count" or op == "sum":
                merged.append(a + b)
            elif a is None or b is None:
                merged.append(b if a is None else a)
            else:
                merged.append(min(a, b) if op == "min" else max(a, b))
        return tuple(merged)

    def results(
        self, keys: Sequence[Any], starts: Sequence[int], size: int, partials: Sequence[Sequence[Any]]
    ) -> list[dict[str, Any]]:
        """The results of many windows of ``size`` ms at once, each as :meth:`result` makes it:
        ``partials[i]`` holds partial ``i`` of every window, in the order of ``keys`` and ``starts``."""
        names = (self.key_field, "window_start", "window_end", *(name for name, _of in self._results))
        columns: list[Sequence[Any]] = [keys, starts, [start + size for start in starts]]
        for aggregate in self.aggregates.values():
            match aggregate:
                case Mean(field=field):
                    sums, counts = partials[self._index[(field, "sum")]], partials[self._index[(None, "count")]]
                    columns.append([s / c if c else None for s, c in zip(sums, counts, strict=True)])
                case _:
                    columns.append(partials[self._index[_partials_of(aggregate)[0]]])
        return [dict(zip(names, row, strict=True)) for row in zip(*columns, strict=True)]

    def result(self, key: Any, window_start: int, window_end: int, acc: tuple[Any, ...]) -> dict[str, Any]:
        out: dict[str, Any] = {self.key_field: key, "window_start": window_start, "window_end": window_end}
        for name, of in self._results:
            out[name] = of(acc)
        return out
