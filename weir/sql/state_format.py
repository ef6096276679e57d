"""The format tag of the SQL operators' keyed state values (docs/formats.md, "SQL operator state"):
each value is the pair ``(format, body)``, so that a later Weir that changes a body's shape reads the
old one or refuses it in one line, never misreads it. The one place that writes and reads the tag.

A state written before its operator had a tag (``changelog-aggregate``, ``top-n``, ``group-aggregate``
and ``join`` before format 1) is told apart by its shape (``before_format``) and read as format 1's
body: savepoints of those versions restore. A state whose untagged value is itself a pair (the
group-aggregate's tuple of accumulators) is tagged as a list ``[format, body]`` (``as_list``): a
tuple is then always the untagged value, never misread as a tag."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from weir.core.errors import SerializationError


@dataclass(frozen=True)
class SqlStateFormat:
    """The format of one SQL operator's state value: ``operator`` its kind as EXPLAIN names it,
    ``current`` the format this Weir writes and reads, ``before_format`` whether a value is of the
    untagged shape written before the tag (None: the operator was tagged from the start)."""

    operator: str
    current: int
    before_format: Callable[[Any], bool] | None = None
    as_list: bool = False

    def tagged(self, body: Any) -> tuple[int, Any] | list[Any]:
        """The state value of ``body``: ``(current, body)`` (``[current, body]`` ``as_list``)."""
        return [self.current, body] if self.as_list else (self.current, body)

    def body(self, held: Any) -> Any:
        """The body of a stored value: of a ``(current, body)`` pair, or an untagged value of the shape
        before the tag; another format (a newer Weir's) or shape is a SerializationError (it fails the
        job, as a state that cannot be read: never a record's fault) naming the operator's format."""
        if self.before_format is not None and self.before_format(held):
            return held
        match held:
            case (int() as version, body) if version == self.current and not isinstance(version, bool):
                return body
            case (version, _):
                raise SerializationError(
                    f"{self.operator} state has format {version!r}; this Weir reads format {self.current}: "
                    "restore the savepoint with the Weir version that wrote it"
                )
            case _:
                raise SerializationError(
                    f"{self.operator} state is not a ({self.current}, ...) pair but a {type(held).__name__}: "
                    "it was not written by this operator"
                )


def _group_before_format(held: Any) -> bool:
    """``(rows, accumulators, emitted)``: the untagged changelog-aggregate state."""
    return isinstance(held, tuple) and len(held) == 3


def _top_before_format(held: Any) -> bool:
    """A list of rows: the untagged top-n state."""
    return isinstance(held, list)


def _accumulators_before_format(held: Any) -> bool:
    """A tuple (of accumulators, or of the key and its accumulators): the untagged group-aggregate state."""
    return isinstance(held, tuple)


def _row_before_format(held: Any) -> bool:
    """A row (a dict): an untagged element of a regular join's side."""
    return isinstance(held, dict)


CHANGELOG_AGGREGATE_STATE: Final = SqlStateFormat("changelog-aggregate", 1, _group_before_format)
"""Value state ``group``: ``(1, (rows, accumulators, emitted row or None))``."""

TOP_N_STATE: Final = SqlStateFormat("top-n", 1, _top_before_format)
"""Value state ``top``: ``(1, [row, ...])``, the partition's first N rows in order."""

GROUP_AGGREGATE_STATE: Final = SqlStateFormat("group-aggregate", 1, _accumulators_before_format, as_list=True)
"""A GROUP BY written straight to an upsert sink: value state ``accumulators`` (``group-aggregate``
under mini-batch, ``group-aggregate-ttl``), ``[1, accumulators]``; the reduce's value (the
``group-aggregate`` of neither), ``[1, (key, accumulators)]``."""

JOIN_STATE: Final = SqlStateFormat("join", 1, _row_before_format)
"""List states ``left`` and ``right`` of a regular join of append inputs: each element ``(1, row)``."""

RETRACTING_TOP_N_STATE: Final = SqlStateFormat("retracting-top-n", 1)
"""Value state ``rows``: ``(1, [row, ...])``, every row of the partition in order (a Top-N over an
updating input; tagged from the start)."""

CHANGELOG_NORMALIZE_STATE: Final = SqlStateFormat("changelog-normalize", 1)
"""Value state ``last``: ``(1, {column: value})``, the key's last row (tagged from the start)."""

CHANGELOG_JOIN_STATE: Final = SqlStateFormat("changelog-join", 2)
"""Each row a side holds for the key (``weir.sql.changelog_join``): ``(2, (row, count,
associations))``, in value state ``left-row`` / ``right-row`` (a side whose unique key is within the
join key: one row) or as an entry of map state ``left-rows`` / ``right-rows`` (by unique key, or by
row)."""

CHANGELOG_JOIN_PREVIOUS_STATE: Final = SqlStateFormat("changelog-join", 1)
"""Format 1, read to rewrite it into format 2: value states ``left`` and ``right``, ``(1, [(row,
count, associations), ...])``, a side's whole list of rows of the key."""

SINK_UPSERT_MATERIALIZER_STATE: Final = SqlStateFormat("sink-upsert-materializer", 1)
"""Value state ``rows``: ``(1, [row, ...])``, the rows of the result at an upsert sink's key, in order
of arrival (``weir.sql.materialize``; tagged from the start)."""


__all__ = [
    "CHANGELOG_AGGREGATE_STATE",
    "CHANGELOG_JOIN_PREVIOUS_STATE",
    "CHANGELOG_JOIN_STATE",
    "CHANGELOG_NORMALIZE_STATE",
    "GROUP_AGGREGATE_STATE",
    "JOIN_STATE",
    "RETRACTING_TOP_N_STATE",
    "SINK_UPSERT_MATERIALIZER_STATE",
    "TOP_N_STATE",
    "SqlStateFormat",
]
