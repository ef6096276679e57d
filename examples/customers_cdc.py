"""The changes of a PostgreSQL table, captured (CDC): copied into another table, written as a Kafka
changelog, and numbered per row in keyed state.

Input: the table ``customers`` (``id`` primary key, ``name``, ``email``), read by the PostgreSQL CDC
source (docs/postgres-cdc-source.md) from the replication slot ``customers_cdc``: a snapshot of its
rows, then every insert, update and delete.
Output: the table ``customers_copy`` keyed by ``id`` (a delete deletes the row), equal to
``customers`` as of the last completed checkpoint; topic ``customers-changelog``, each change in its
JSON form keyed by the row's id; topic ``customer-versions``, per change ``{"id", "op", "version"}``
with ``version`` 1, 2, ... the number of the row's changes so far (the snapshot's read is 1).

Tested without a database: ``weir test examples/customers_cdc.py --source
customers-cdc=examples/customers_changes.jsonl --failures`` (docs/jobs.md).
"""

from __future__ import annotations

import json
from typing import Any

from weir.api import ChangeEvent, ChangeOp, Delete, Environment


def copy_row(event: ChangeEvent) -> tuple[Any, ...] | Delete:
    """The copy's change: a delete deletes the key's row; a read, an insert or an update upserts it."""
    if event.op is ChangeOp.DELETE:
        return Delete((event.row["id"],))
    return (event.row["id"], event.row["name"], event.row["email"])


def first_version(event: ChangeEvent) -> dict[str, Any]:
    return {"id": event.row["id"], "op": event.op.value, "version": 1}


def next_version(previous: dict[str, Any], change: dict[str, Any]) -> dict[str, Any]:
    return {**change, "version": previous["version"] + 1}


def build(env: Environment) -> None:
    changes = env.from_postgres_cdc(["customers"], uid="customers-cdc", slot_name="customers_cdc")
    changes.sink_to_kafka(
        "customers-changelog",
        uid="changelog",
        key=lambda e: str(e.row["id"]),
        serializer=lambda e: json.dumps(e.to_json()).encode(),
    )
    by_id = changes.key_by(lambda e: e.row["id"])  # keyed first: a row's changes stay in order
    by_id.sink_to_postgres(
        "customers_copy", uid="copy", columns=("id", "name", "email"), key_columns=("id",), row=copy_row
    )
    versions = by_id.map(first_version, uid="change").key_by(lambda c: c["id"]).reduce(next_version, uid="versions")
    versions.sink_to_kafka("customer-versions", uid="versions-sink")
