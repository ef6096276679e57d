"""Changelogs between SQL operators: what a row does to the result it belongs to (Flink's ``RowKind``).

An append result (a scan, a join of append inputs, a window aggregation) is plain rows, each an
insert. An updating result read by another operator (a GROUP BY without a window in a subquery, read
by an outer GROUP BY: Nexmark q4) is a changelog, each element a :class:`Change` of one of the four
:class:`RowKind` values, as Flink's runtime stamps each ``RowData``:

- ``+I`` INSERT: a row joins the result;
- ``-U`` UPDATE_BEFORE: the previous row of a key leaves the result, its ``+U`` follows from the same
  operator (Flink's contract: a consumer may hold back a retraction until the new row arrives);
- ``+U`` UPDATE_AFTER: the new row of that key joins the result;
- ``-D`` DELETE: a row leaves the result, nothing replaces it.

:class:`ChangelogMode` is the set of kinds a plan node's output can hold (Flink's ``ChangelogMode``):
the planner computes it per node (``weir.sql.plan.changelog_of``) and refuses, at plan time, a sink or
operator that cannot take it. Every decision on a kind is a ``match`` ending in ``assert_never``."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, assert_never


@enum.unique
class RowKind(enum.Enum):
    """What a changelog element does to the result (Flink's ``RowKind``, its short strings)."""

    INSERT = "+I"
    UPDATE_BEFORE = "-U"
    UPDATE_AFTER = "+U"
    DELETE = "-D"


def accumulates(kind: RowKind) -> bool:
    """True when the row joins the result (an aggregate adds it), False when it leaves it (retracts)."""
    match kind:
        case RowKind.INSERT | RowKind.UPDATE_AFTER:
            return True
        case RowKind.UPDATE_BEFORE | RowKind.DELETE:
            return False
        case _:
            assert_never(kind)


@dataclass(frozen=True)
class Change:
    """One element of a changelog: ``row`` (column name -> value) with what it does, ``kind``."""

    kind: RowKind
    row: Mapping[str, Any]

    def __str__(self) -> str:
        return f"{self.kind.value}{dict(self.row)}"


@dataclass(frozen=True)
class ChangelogMode:
    """The kinds a result can hold. ``APPEND``: inserts only (plain rows between operators);
    ``RETRACT``: inserts and paired updates (an updating aggregation of an append input);
    with ``DELETE``: rows may also leave for good."""

    kinds: frozenset[RowKind]

    @property
    def appends(self) -> bool:
        return self.kinds == frozenset({RowKind.INSERT})

    @property
    def deletes(self) -> bool:
        return RowKind.DELETE in self.kinds

    def __str__(self) -> str:
        return "[" + ", ".join(k.value for k in RowKind if k in self.kinds) + "]"


APPEND: Final = ChangelogMode(frozenset({RowKind.INSERT}))
RETRACT: Final = ChangelogMode(frozenset({RowKind.INSERT, RowKind.UPDATE_BEFORE, RowKind.UPDATE_AFTER}))
WITH_DELETES: Final = ChangelogMode(frozenset(RowKind))


def aggregation_mode(input_mode: ChangelogMode, *, paired: bool) -> ChangelogMode:
    """The changelog of a GROUP BY without a window over an input of ``input_mode``: a key's row is
    inserted, then updated (-U, +U). ``paired``: an input -U's +U reaches the same key (an append
    input; or each key a column of the input's own key), so a key emptied by a -U keeps its row until
    the +U (``weir.sql.retract.group_changes``); otherwise, or when the input deletes, a key whose
    input rows all left is deleted."""
    return RETRACT if paired and not input_mode.deletes else WITH_DELETES


__all__ = [
    "APPEND",
    "RETRACT",
    "WITH_DELETES",
    "Change",
    "ChangelogMode",
    "RowKind",
    "accumulates",
    "aggregation_mode",
]
