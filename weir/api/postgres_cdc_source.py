"""The PostgreSQL CDC source and its builder (Flink CDC's ``PostgreSQLSource.builder()``).

::

    changes = env.from_source(
        PostgresCdcSource.builder().tables(["orders"]).slot_name("orders_cdc").build(), uid="orders-cdc"
    )

A consistent snapshot of the tables, then their inserts, updates and deletes decoded from a logical
replication slot (``pgoutput``), as :class:`~weir.core.cdc.ChangeEvent` values. The slot is advanced
only when a checkpoint completes, so a restore decodes again from the checkpoint's position.
``env.from_postgres_cdc(tables, uid=..., slot_name=...)`` is this builder with the same option names.
See docs/sources.md.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from weir.api.connector import Options, Source, required
from weir.core.cdc import SlotRetention
from weir.core.descriptors import PostgresCdcSourceSpec

if TYPE_CHECKING:
    from weir.operators.cdc_source import PostgresCdcSourceOperator

OPTIONS = Options("postgres cdc source")

_SLOT_NAME = re.compile(r"[a-z0-9_]{1,63}")  # PostgreSQL's rule for replication slot names


@dataclass(frozen=True)
class PostgresCdcSource(Source):
    """Made by :meth:`builder`."""

    spec: PostgresCdcSourceSpec

    @staticmethod
    def builder() -> PostgresCdcSourceBuilder:
        return PostgresCdcSourceBuilder()

    def descriptor(self) -> PostgresCdcSourceSpec:
        return self.spec

    def create_operator(self) -> PostgresCdcSourceOperator:
        # The operator runs in the TaskManager: imported there, so a client builds the job without the server install.
        from weir.operators.cdc_source import PostgresCdcSourceOperator

        return PostgresCdcSourceOperator(self.spec)

    def default_name(self) -> str:
        return f"postgres-cdc:{self.spec.slot_name}"

    def default_parallelism(self) -> int | None:
        return 1  # a replication slot has one reader; a parallel snapshot is asked for


@dataclass(frozen=True)
class _Settings:
    tables: tuple[str, ...] | None = None
    slot_name: str | None = None
    publication: str | None = None
    max_changes_per_poll: int = 1000
    chunk_size: int = 8096
    slot_retention: SlotRetention = SlotRetention.UNLESS_SAVEPOINT


class PostgresCdcSourceBuilder:
    """Sets the source's options one by one; :meth:`build` makes the :class:`PostgresCdcSource`."""

    __slots__ = ("_settings",)

    def __init__(self, settings: _Settings | None = None) -> None:
        self._settings = settings or _Settings()

    def _with(self, **options: Any) -> PostgresCdcSourceBuilder:
        return PostgresCdcSourceBuilder(replace(self._settings, **options))

    def tables(self, tables: Sequence[str]) -> PostgresCdcSourceBuilder:
        """The tables captured (required), as the server resolves them (``orders``, ``shop.orders``);
        each needs a replica identity (a primary key, or ``REPLICA IDENTITY FULL``)."""
        if isinstance(tables, str) or not isinstance(tables, Sequence) or not tables:
            raise OPTIONS.refuse("tables", "a non-empty list of table names", tables)
        return self._with(tables=tuple(OPTIONS.text("tables", t) for t in tables))

    def slot_name(self, slot_name: str) -> PostgresCdcSourceBuilder:
        """The logical replication slot the source owns (required): lower-case letters, digits and
        underscores. A start without a checkpoint drops a slot of that name and creates it anew."""
        if not isinstance(slot_name, str) or not _SLOT_NAME.fullmatch(slot_name):
            raise OPTIONS.refuse("slot_name", "1 to 63 lower-case letters, digits or underscores", slot_name)
        return self._with(slot_name=slot_name)

    def publication(self, publication: str | None) -> PostgresCdcSourceBuilder:
        """The publication decoded (default: the slot's name); created for the tables when missing."""
        return self._with(publication=OPTIONS.optional_text("publication", publication))

    def max_changes_per_poll(self, changes: int) -> PostgresCdcSourceBuilder:
        """How many changes one poll decodes at least (whole transactions; default 1000)."""
        if type(changes) is not int or changes <= 0:
            raise OPTIONS.refuse("max_changes_per_poll", "a positive int", changes)
        return self._with(max_changes_per_poll=changes)

    def chunk_size(self, rows: int) -> PostgresCdcSourceBuilder:
        """How many rows one chunk of the snapshot reads, by primary key (default 8096, Flink CDC's
        ``scan.incremental.snapshot.chunk.size``); a checkpoint can fall between two chunks, and a
        restore goes on after the last chunk it holds."""
        if type(rows) is not int or rows <= 0:
            raise OPTIONS.refuse("chunk_size", "a positive int", rows)
        return self._with(chunk_size=rows)

    def slot_retention(self, retention: SlotRetention | str) -> PostgresCdcSourceBuilder:
        """What the job's end does with the slot (and the publication the source created):
        ``"unless-savepoint"`` (default: dropped when the job is cancelled, fails or finishes, kept
        when it stopped at a savepoint, which restores from it), ``"always-drop"``, ``"keep"``."""
        try:
            return self._with(slot_retention=SlotRetention(retention))
        except ValueError:
            raise OPTIONS.refuse(
                "slot_retention", " or ".join(repr(r.value) for r in SlotRetention), retention
            ) from None

    def build(self) -> PostgresCdcSource:
        s = self._settings
        tables = required(OPTIONS, "tables", s.tables, "call .tables([...])")
        slot = required(OPTIONS, "slot_name", s.slot_name, "call .slot_name(name)")
        return PostgresCdcSource(
            PostgresCdcSourceSpec(
                tables=tables,
                slot_name=slot,
                publication=s.publication or slot,
                max_changes_per_poll=s.max_changes_per_poll,
                chunk_size=s.chunk_size,
                slot_retention=s.slot_retention,
            )
        )


__all__ = ["PostgresCdcSource", "PostgresCdcSourceBuilder"]
