"""A PostgreSQL table's changes, captured by the CDC source, into a copy of the table and a Kafka changelog.

Input: table ``-D source.table=`` (``id int PRIMARY KEY, name text, amount int``) through replication
slot ``-D source.slot=``. Output: each change applied to ``-D sink.table=`` (same columns) by ``id``,
exactly once (two-phase): a read, insert or update upserts the row, a delete deletes it
(``Delete``); and each change event's JSON form into topic ``-D sink.topic=`` keyed by ``id``,
exactly once. Optional: ``-D source.chunk_size=`` (snapshot rows per chunk), ``-D source.slot_retention=``,
``-D source.parallelism=`` (default 1: a parallel snapshot above), ``-D copy.delay_us=`` (a slow consumer).
"""

from __future__ import annotations

import json
import time
from typing import Any

from weir.api import ChangeEvent, ChangeOp, Delete, Environment


def target_change(event: ChangeEvent) -> tuple[Any, ...] | Delete:
    if event.op is ChangeOp.DELETE:
        return Delete((event.row["id"],))
    after = event.row
    return (after["id"], after["name"], after["amount"])


def build(env: Environment) -> None:
    p = env.params
    changes = env.from_postgres_cdc(
        [p["source.table"]],
        uid="cdc",
        slot_name=p["source.slot"],
        chunk_size=p.get_int("source.chunk_size", 8096),
        slot_retention=p.get_str("source.slot_retention", "unless-savepoint"),
        parallelism=p.get_int("source.parallelism", 1),
    )
    delay_s = p.get_int("copy.delay_us", 0) / 1_000_000
    if delay_s > 0:  # a slow consumer chained to the one reader: the snapshot is read slowly (mid-way at a kill)

        def slowly(event: ChangeEvent) -> ChangeEvent:
            time.sleep(delay_s)  # the consumer's cost per change, not a wait for a condition
            return event

        # the source's parallelism: chained to it, so each row's changes keep their order (a rebalance would not)
        changes = changes.map(slowly, uid="slow-consumer", parallelism=p.get_int("source.parallelism", 1))
    changes.sink_to_kafka(
        p["sink.topic"],
        uid="changelog",
        serializer=lambda event: json.dumps(event.to_json()).encode(),
        key=lambda event: str(event.row["id"]),
    )
    # Keyed first: every change of a row goes through one subtask, in order (a rebalance would not keep it).
    by_id = changes.key_by(lambda event: event.row["id"])
    by_id.sink_to_postgres(
        p["sink.table"], uid="copy", columns=("id", "name", "amount"), key_columns=("id",), row=target_change
    )
