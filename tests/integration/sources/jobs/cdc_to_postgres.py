"""A PostgreSQL table's changes, captured by the CDC source, into a copy of the table and a Kafka changelog.

Input: table ``-D source.table=`` (``id int PRIMARY KEY, name text, amount int``) through replication
slot ``-D source.slot=``. Output: each change's row upserted by ``id`` into ``-D sink.table=``
(``id, name, amount, deleted``: a delete upserts the key with ``deleted`` true, as the PostgreSQL sink
writes upserts only), exactly once (two-phase); and each change event's JSON form into topic
``-D sink.topic=`` keyed by ``id``, exactly once.
"""

from __future__ import annotations

import json
from typing import Any

from weir.api import ChangeEvent, ChangeOp, Environment


def target_row(event: ChangeEvent) -> dict[str, Any]:
    if event.op is ChangeOp.DELETE:
        return {"id": event.row["id"], "name": None, "amount": None, "deleted": True}
    after = event.row
    return {"id": after["id"], "name": after["name"], "amount": after["amount"], "deleted": False}


def build(env: Environment) -> None:
    p = env.params
    changes = env.from_postgres_cdc([p["source.table"]], uid="cdc", slot_name=p["source.slot"])
    changes.sink_to_kafka(
        p["sink.topic"],
        uid="changelog",
        serializer=lambda event: json.dumps(event.to_json()).encode(),
        key=lambda event: str(event.row["id"]),
    )
    # Keyed first: every change of a row goes through one subtask, in order (a rebalance would not keep it).
    by_id = changes.key_by(lambda event: event.row["id"])
    by_id.map(target_row, uid="target-row").sink_to_postgres(
        p["sink.table"], uid="copy", columns=("id", "name", "amount", "deleted"), key_columns=("id",)
    )
