"""Which columns of a table a statement reads (column pruning), and per-column coercers built once.

A SQL source decodes only the physical columns a statement reads (:func:`reads`, pushed down from
its sink through projections, filters, windows, aggregates and regular joins), the inputs of the table's computed
columns (every computed column is still computed, so it raises as before) and the WATERMARK's
column; an unread column is NULL in the row. A physical column it does not read is still checked (a
value of the wrong type raises as before: dead letters or job failure), without keeping its value; a
STRING column always converts, so it is not looked at."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import Any

import sqlglot
from sqlglot import exp

from weir.sql.catalog import Table
from weir.sql.changelog_join import sides_kept
from weir.sql.plan import Aggregate, Filter, Join, Project, Scan, Sink, WindowTvf, join_mode
from weir.sql.types import Kind, coerce

Coercer = Callable[[Any], Any]


_CHILDREN = frozenset({"input", "left", "right"})
_ALL = None  # every column of the node's output is read


def reads(plan: object) -> dict[str, frozenset[str]] | None:
    """The names each table's rows are read by in ``plan`` (an insert plan or a query's node), pushed
    down from the sink: a projection's output nobody reads does not count (if it is a bare column: an
    expression is still evaluated, so its inputs count); a filter's condition, a window's time column,
    an aggregate's keys and arguments do; a regular join passes each side the names of its columns
    read above it and its key's. Below an interval join or a Top-N every column counts (their rows
    are kept and compared whole). None: an expression's SQL does not parse (every column counts)."""
    out: dict[str, set[str] | None] = {}
    try:
        _push(getattr(plan, "sink", plan), _ALL, out, {})
    except _Unparsed:
        return None
    return {table: _EVERY if names is None else frozenset(names) for table, names in out.items()}


def read_above(plan: object) -> dict[int, frozenset[str]]:
    """The names read above each projection and regular join of ``plan`` (by the node's ``id``),
    case-folded: a projection need not build a bare column nobody reads, nor a join a column of its
    joined row (``weir.sql.join.JoinedRow``). A node not in the answer is read whole (so is every
    node when an expression's SQL does not parse)."""
    nodes: dict[int, frozenset[str] | None] = {}
    try:
        _push(getattr(plan, "sink", plan), _ALL, {}, nodes)
    except _Unparsed:
        return {}
    return {node: frozenset(n.casefold() for n in names) for node, names in nodes.items() if names is not None}


_EVERY = frozenset({"*"})  # a table's marker: every column read


class _Unparsed(Exception):
    pass


def _push(
    node: object, want: frozenset[str] | None, out: dict[str, set[str] | None], nodes: dict[int, frozenset[str] | None]
) -> None:
    if isinstance(node, Project | Join):
        seen = nodes.get(id(node), frozenset())
        nodes[id(node)] = None if want is None or seen is None else seen | want
    match node:
        case Scan():
            name = node.table.name
            if want is None:
                out[name] = None
            elif name not in out:
                out[name] = set(want)
            elif (known := out[name]) is not None:
                known.update(want)
        case Filter():
            _push(node.input, None if want is None else want | _columns(node.condition.sql), out, nodes)
        case Project():
            needed: set[str] = set()
            for o in node.outputs:
                used = want is None or o.name in want
                parsed = _parse(o.sql)
                if used or not isinstance(parsed, exp.Column):
                    needed.update(c.name for c in parsed.find_all(exp.Column))
            _push(node.input, frozenset(needed), out, nodes)
        case WindowTvf():
            _push(node.input, None if want is None else want | _own_names(node), out, nodes)
        case Aggregate():
            _push(node.input, (want or frozenset()) | _own_names(node), out, nodes)
        case Sink():
            _push(node.input, _ALL, out, nodes)
        case Join() if node.interval is None:
            folded = None if want is None else {n.casefold() for n in want}
            kept = sides_kept(node) if join_mode(node) is not None else None
            for at, (columns, keys, side) in enumerate(
                ((node.left_columns, node.left_keys, node.left), (node.right_columns, node.right_keys, node.right))
            ):
                if folded is None:
                    _push(side, _ALL, out, nodes)
                    continue
                side_want = {c for c in columns if c.casefold() in folded}
                for key in keys:
                    side_want.update(_columns(key.sql))
                if kept is not None:  # a changelog join keeps a side's rows by its unique key (a join
                    # below names a key column qualifier.column, built when its column is read)
                    side_want.update(kept[at].unique_key)
                    side_want.update(c.rpartition(".")[2] for c in kept[at].unique_key)
                _push(side, frozenset(side_want), out, nodes)
        case _:  # an interval join, a Top-N, a node this does not know: every column of every table below
            for child in _children(node):
                _push(child, _ALL, out, nodes)


def _children(node: object) -> list[object]:
    if not dataclasses.is_dataclass(node) or isinstance(node, type):
        return []
    return [getattr(node, f.name) for f in dataclasses.fields(node) if f.name in _CHILDREN]


def _own_names(node: object) -> frozenset[str]:
    """Every name a node holds (its expressions' columns, its string fields), its inputs' left out."""
    names: set[str] = set()
    stack: list[object] = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            names.add(item)
        elif isinstance(item, tuple | list | frozenset | set):
            stack.extend(item)
        elif isinstance(item, Table):
            continue
        elif dataclasses.is_dataclass(item) and not isinstance(item, type):
            for f in dataclasses.fields(item):
                if f.name in _CHILDREN:
                    continue
                value = getattr(item, f.name)
                if f.name == "sql" and isinstance(value, str):
                    names.update(_columns(value))
                stack.append(value)
    return frozenset(names)


def _parse(sql: str) -> exp.Expr:
    try:
        return sqlglot.parse_one(sql, read="spark")
    except sqlglot.errors.ParseError:
        raise _Unparsed(sql) from None


def bare_column(sql: str) -> bool:
    """True when ``sql`` (an expression the plan parsed already) is a column, nothing else."""
    return isinstance(sqlglot.parse_one(sql, read="spark"), exp.Column)


def _columns(sql: str) -> frozenset[str]:
    return frozenset(c.name for c in _parse(sql).find_all(exp.Column))


def read_columns(table: Table, reading: dict[str, frozenset[str]] | None) -> frozenset[str]:
    """The physical columns of ``table`` a statement reading ``reading`` (:func:`reads`; None: every
    column) needs decoded: those it reads, the computed columns' inputs, the WATERMARK's column."""
    physical = frozenset(c.name for c in table.columns)
    names = None if reading is None else reading.get(table.name)
    if names is None or names == _EVERY:
        return physical
    needed = set(names)
    for computed in table.computed:
        needed.update(c.name for c in computed.expression.find_all(exp.Column))
    if table.watermark is not None:
        needed.add(table.watermark.column)
    # the plan's expressions spell unquoted identifiers in lower case (``itemname`` for ``itemName``):
    # a column is read when its name matches one of them in any case
    folded = {n.casefold() for n in needed}
    return frozenset(c for c in physical if c.casefold() in folded)


def coercer(kind: Kind) -> Coercer:
    """``coerce(value, kind)`` with the common case (a JSON value already of the kind) decided by one
    type test, the rest (NULL, conversions, errors) by ``coerce`` itself."""
    match kind:
        case Kind.INTEGER:

            def integer(value: Any) -> Any:
                return value if type(value) is int else coerce(value, Kind.INTEGER)

            return integer
        case Kind.DOUBLE:

            def double(value: Any) -> Any:
                return value if type(value) is float else coerce(value, Kind.DOUBLE)

            return double
        case Kind.STRING:

            def string(value: Any) -> Any:
                return value if type(value) is str else coerce(value, Kind.STRING)

            return string
        case Kind.BOOLEAN:

            def boolean(value: Any) -> Any:
                return value if type(value) is bool else coerce(value, Kind.BOOLEAN)

            return boolean
        case Kind.TIMESTAMP:

            def timestamp(value: Any) -> Any:
                return value if type(value) is int else coerce(value, Kind.TIMESTAMP)

            return timestamp


_ALWAYS_CONVERTS = frozenset({Kind.STRING})  # coerce never raises for these: an unread one is not looked at


def checked(columns: Iterable[tuple[str, Kind]], read: frozenset[str]) -> tuple[tuple[str, Coercer], ...]:
    """The unread columns whose values are still checked (their coercers, results dropped)."""
    return tuple((name, coercer(kind)) for name, kind in columns if name not in read and kind not in _ALWAYS_CONVERTS)


__all__ = ["Coercer", "bare_column", "checked", "coercer", "read_above", "read_columns", "reads"]
