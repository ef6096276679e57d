"""SQL column types as Weir holds their values: BIGINT/INT/SMALLINT/TINYINT as ``int``, DOUBLE/FLOAT/
DECIMAL as ``float``, STRING/VARCHAR/CHAR as ``str``, BOOLEAN as ``bool``, TIMESTAMP(p) and
TIMESTAMP_LTZ(p) as ``int`` epoch milliseconds (UTC). The JSON format reads and writes them as
Flink's ``'format' = 'json'`` does (a timestamp as ``'yyyy-MM-dd HH:mm:ss.SSS'``; read also as
epoch milliseconds or ISO-8601)."""

from __future__ import annotations

import datetime as dt
import functools
from dataclasses import dataclass
from decimal import Decimal
from enum import Enum
from typing import Any, assert_never

from sqlglot import exp


class Kind(Enum):
    INTEGER = "integer"
    DOUBLE = "double"
    STRING = "string"
    BOOLEAN = "boolean"
    TIMESTAMP = "timestamp"


_KINDS: dict[exp.DType, Kind] = {
    exp.DType.BIGINT: Kind.INTEGER,
    exp.DType.INT: Kind.INTEGER,
    exp.DType.SMALLINT: Kind.INTEGER,
    exp.DType.TINYINT: Kind.INTEGER,
    exp.DType.DOUBLE: Kind.DOUBLE,
    exp.DType.FLOAT: Kind.DOUBLE,
    exp.DType.DECIMAL: Kind.DOUBLE,
    exp.DType.TEXT: Kind.STRING,
    exp.DType.VARCHAR: Kind.STRING,
    exp.DType.CHAR: Kind.STRING,
    exp.DType.BOOLEAN: Kind.BOOLEAN,
    exp.DType.TIMESTAMP: Kind.TIMESTAMP,
    exp.DType.TIMESTAMPTZ: Kind.TIMESTAMP,
    exp.DType.TIMESTAMPLTZ: Kind.TIMESTAMP,
}


@dataclass(frozen=True)
class SqlType:
    kind: Kind
    text: str  # as written, for EXPLAIN and errors

    @classmethod
    def of(cls, data_type: exp.DataType) -> SqlType | None:
        """The type, or None for one Weir does not hold (ROW, ARRAY, MAP, BYTES, DATE, TIME, ...)."""
        kind = _KINDS.get(data_type.this)
        return None if kind is None else cls(kind, data_type.sql(dialect="spark"))


_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


@functools.lru_cache(maxsize=1 << 14)
def timestamp_text(ms: int) -> str:
    """Flink's JSON form of a TIMESTAMP(3): ``yyyy-MM-dd HH:mm:ss.SSS`` (UTC). Remembered for the last
    16,384 instants: a stream's rows near in time share them (at Nexmark's rate thousands a millisecond)."""
    moment = _EPOCH + dt.timedelta(milliseconds=ms)
    return moment.strftime("%Y-%m-%d %H:%M:%S.") + f"{moment.microsecond // 1000:03d}"


def parse_timestamp(value: Any) -> int:
    """A timestamp's epoch milliseconds from JSON: a number of ms, or SQL/ISO-8601 text (UTC unless it says)."""
    if isinstance(value, bool):
        raise ValueError(f"not a timestamp: {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        moment = dt.datetime.fromisoformat(value.replace(" ", "T", 1).removesuffix("Z"))
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=dt.UTC)
        return (moment - _EPOCH) // dt.timedelta(milliseconds=1)
    raise ValueError(f"not a timestamp: {value!r}")


_HELD_AS: dict[Kind, type] = {
    Kind.INTEGER: int,
    Kind.DOUBLE: float,
    Kind.STRING: str,
    Kind.BOOLEAN: bool,
    Kind.TIMESTAMP: int,
}
"""The Python type a column's value is held as (a TIMESTAMP as epoch milliseconds)."""


def coerce(value: Any, kind: Kind) -> Any:
    """A JSON value as the column's type; None stays NULL; a value of another type raises ValueError."""
    if value is None or type(value) is _HELD_AS[kind]:  # already of the type (most values): as it is
        return value
    match kind:
        case Kind.INTEGER:
            if isinstance(value, bool) or not isinstance(value, int | float | str | Decimal):
                raise ValueError(f"not an integer: {value!r}")
            try:
                number = int(value)
            except ValueError:
                raise ValueError(f"not an integer: {value!r}") from None
            if isinstance(value, float | Decimal) and number != value:
                raise ValueError(f"not an integer: {value!r}")
            return number
        case Kind.DOUBLE:
            if isinstance(value, bool) or not isinstance(value, int | float | str | Decimal):
                raise ValueError(f"not a number: {value!r}")
            try:
                return float(value)
            except ValueError:
                raise ValueError(f"not a number: {value!r}") from None
        case Kind.STRING:
            return value if isinstance(value, str) else str(value)
        case Kind.BOOLEAN:
            if isinstance(value, bool):
                return value
            if isinstance(value, str) and value.lower() in ("true", "false"):
                return value.lower() == "true"
            raise ValueError(f"not a boolean: {value!r}")
        case Kind.TIMESTAMP:
            return parse_timestamp(value)
        case _:
            assert_never(kind)


def to_json(value: Any, kind: Kind) -> Any:
    """A value as the JSON format writes it."""
    if value is None:
        return None
    if kind is Kind.TIMESTAMP:
        return timestamp_text(int(value))
    if type(value) is _HELD_AS[kind]:  # written as it is held
        return value
    match kind:
        case Kind.TIMESTAMP:
            return timestamp_text(int(value))
        case Kind.INTEGER:
            return int(value)
        case Kind.DOUBLE:
            return float(value)
        case Kind.STRING | Kind.BOOLEAN:
            return value
        case _:
            assert_never(kind)


__all__ = ["Kind", "SqlType", "coerce", "parse_timestamp", "timestamp_text", "to_json"]
