"""A changelog into PostgreSQL, for ``weir verify``: record i upserts or deletes one of 10 ids.

Record i: id ``i % 10``; every third record deletes its id (``Delete``), the others upsert
``(id, i)``. Output: table ``-D sink.table=`` (``id int PRIMARY KEY, last int``) through the two-phase
sink ``copy``, keyed by id.
"""

from __future__ import annotations

from typing import Any

from weir.api import Delete, Environment

COUNT = 40


def change(i: int) -> dict[str, Any]:
    return {"id": i % 10, "last": i, "delete": i % 3 == 2}


def to_change(value: dict[str, Any]) -> tuple[Any, ...] | Delete:
    return Delete((value["id"],)) if value["delete"] else (value["id"], value["last"])


def build(env: Environment) -> None:
    changes = env.from_generator(change, uid="changes", count=COUNT, parallelism=1)
    changes.key_by(lambda v: v["id"]).sink_to_postgres(
        env.params["sink.table"], uid="copy", columns=("id", "last"), key_columns=("id",), row=to_change
    )
