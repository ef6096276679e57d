"""A bounded Kafka topic copied as it is into the exactly-once Kafka sink: one large sink epoch.

Input: topic ``-D source.topic=`` (values as bytes, any content). Output: the same values, unchanged
and in partition order, to topic ``-D sink.topic=`` through ``sink_to_kafka`` with its default
``epoch_memory_bytes`` (64 MiB). Source and sink are chained into one task per subtask, so everything
a subtask reads between two barriers is one epoch of its sink. With a checkpoint interval longer than
reading the input takes, that is the whole input: the final checkpoint's epoch.
"""

from __future__ import annotations

from weir.api import Environment


def raw(value: bytes) -> bytes:
    return value


def build(env: Environment) -> None:
    p = env.params
    records = env.from_kafka(
        p.get_str("source.topic", "big-records"),
        uid="records-source",
        bounded=p.get_bool("source.bounded", True),
        deserializer=raw,
    )
    records.sink_to_kafka(p.get_str("sink.topic", "big-records-copy"), uid="kafka-sink", serializer=raw)
