"""The seed's stateful keyed aggregation: events -> keyed tumbling event-time windows -> Kafka + PostgreSQL.

Input: topic ``events`` (``-D source.topic=``), JSON ``{"id": str, "key": str, "value": int, "ts": int}``
with ``ts`` in epoch milliseconds as event time. Malformed events go to ``events-dlq`` with the reason.

Output, per key and window of ``-D window.size_ms=`` (default 1000):
``{"key", "window_start", "window_end", "count", "sum"}`` to topic ``window-results`` (``-D sink.topic=``)
and to the PostgreSQL table ``window_results`` (``-D sink.table=``) keyed by ``(key, window_start)``.

``-D sink.postgres=false`` leaves the PostgreSQL sink out. ``-D source.bounded=true`` reads up to the
end offsets present at start, fires every window and finishes.

``-D columnar=true`` runs the same job on the columnar path (``weir.core.columnar``): the source
decodes each poll into an Arrow record batch by a declared schema, ``key_by("key")`` partitions
batches on arrays, and the window aggregates them with the built-in ``Count`` and ``Sum``. Its output
is the same; its window state is the same (key, (count, sum)), so a savepoint of one path restores
into the other. A malformed event goes to the dead-letter topic with msgspec's reason; the source
decodes only the fields the job reads (``key``, ``value``, ``ts``), so ``id`` is not checked there.
"""

from __future__ import annotations

from typing import Any

from weir.api import Count, DataStream, Environment, Sum, TumblingEventTimeWindows, json_deserializer

_FIELDS = (("id", str), ("key", str), ("value", int), ("ts", int))


def parse_event(raw: bytes) -> dict[str, Any]:
    """One event, checked: a JSON object with str ``id`` and ``key``, int ``value`` and ``ts``."""
    if raw is None:
        raise ValueError("record has no value")
    event = json_deserializer(raw)  # Weir's JSON codec (msgspec); a malformed record raises as json.loads does
    try:  # the common case in one expression; ``type() is`` also refuses bool for int
        if (
            type(event["id"]) is str
            and type(event["key"]) is str
            and type(event["value"]) is int
            and type(event["ts"]) is int
        ):
            return event  # type: ignore[no-any-return]
    except (KeyError, TypeError):
        pass
    if not isinstance(event, dict):
        raise ValueError("event is not a JSON object")
    for field, kind in _FIELDS:
        if type(event.get(field)) is not kind:
            raise ValueError(f"field {field!r} must be {kind.__name__}")
    raise AssertionError("unreachable: every field checked")


class CountAndSum:
    """Incremental window aggregate: (count, sum) per key and window, over (key, value) pairs."""

    def create(self) -> tuple[int, int]:
        return (0, 0)

    def add(self, acc: tuple[int, int], pair: tuple[str, int]) -> tuple[int, int]:
        return (acc[0] + 1, acc[1] + pair[1])

    def result(self, key: str, window_start: int, window_end: int, acc: tuple[int, int]) -> dict[str, Any]:
        return {"key": key, "window_start": window_start, "window_end": window_end, "count": acc[0], "sum": acc[1]}


def build(env: Environment) -> None:
    p = env.params
    results = _columnar_windows(env) if p.get_bool("columnar", False) else _record_windows(env)
    results.sink_to_kafka(p.get_str("sink.topic", "window-results"), uid="kafka-sink", key=lambda r: r["key"])
    if not p.get_bool("sink.postgres", True):
        return  # a Kafka-only variant (the benchmark's fair pair with Quix Streams)
    results.sink_to_postgres(
        p.get_str("sink.table", "window_results"),
        uid="postgres-sink",
        columns=("key", "window_start", "window_end", "count", "sum"),
        key_columns=("key", "window_start"),
    )


def _source_options(env: Environment) -> dict[str, Any]:
    p = env.params
    return {
        "uid": "events-source",
        "bounded": p.get_bool("source.bounded", False),
        "max_out_of_orderness_ms": p.get_int("source.max_out_of_orderness_ms", 0),
        "dead_letter_topic": p.get_str("source.dlq_topic", "events-dlq"),
        "records_per_second": p.get_int("source.records_per_second", 0) or None,
    }


def _columnar_windows(env: Environment) -> DataStream:
    p = env.params
    events = env.from_kafka(
        p.get_str("source.topic", "events"), schema=dict(_FIELDS), timestamp_field="ts", **_source_options(env)
    )
    return (
        events.key_by("key")
        .window(
            TumblingEventTimeWindows(p.get_int("window.size_ms", 1000)),
            allowed_lateness_ms=p.get_int("window.allowed_lateness_ms", 0),
        )
        .aggregate({"count": Count(), "sum": Sum("value")}, uid="window-count-sum")
    )


def _record_windows(env: Environment) -> DataStream:
    p = env.params
    events = env.from_kafka(
        p.get_str("source.topic", "events"),
        deserializer=parse_event,
        timestamp=lambda e: e["ts"],
        **_source_options(env),
    )
    return (
        # Keep only what the window needs before the shuffle (the event time travels as the record's
        # timestamp): a (key, value) pair crosses the network for a fraction of the whole event's cost.
        events.map(lambda e: (e["key"], e["value"]), uid="key-value", name="project")
        .key_by(lambda pair: pair[0])
        .window(
            TumblingEventTimeWindows(p.get_int("window.size_ms", 1000)),
            allowed_lateness_ms=p.get_int("window.allowed_lateness_ms", 0),
        )
        .aggregate(CountAndSum(), uid="window-count-sum")
    )
