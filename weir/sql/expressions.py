"""SQL scalar expressions compiled to Python functions of a row (a mapping of column name to value),
with SQL's NULL rules: an operator over NULL is NULL, AND/OR are three-valued, WHERE keeps a row whose
condition is TRUE. An expression Weir does not evaluate is refused with its position."""

from __future__ import annotations

import datetime as dt
import math
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal
from operator import itemgetter
from typing import Any, Final

from sqlglot import exp

from weir.sql import functions
from weir.sql.errors import Position, SqlError
from weir.sql.types import Kind, SqlType, coerce, parse_timestamp

Row = Mapping[str, Any]
Evaluate = Callable[[Row], Any]

_UNIT_MS: Final = {
    "MILLISECOND": 1,
    "SECOND": 1000,
    "MINUTE": 60_000,
    "HOUR": 3_600_000,
    "DAY": 86_400_000,
}


def interval_ms(interval: exp.Interval) -> int | None:
    """``INTERVAL '5' SECOND`` in milliseconds; None for a unit Weir does not count in ms (MONTH, YEAR)."""
    unit = interval.unit.name.upper() if interval.unit is not None else "SECOND"
    unit = unit.removesuffix("S") if unit.endswith("S") and unit[:-1] in _UNIT_MS else unit
    if unit not in _UNIT_MS or not isinstance(interval.this, exp.Literal):
        return None
    try:
        return int(float(interval.this.this) * _UNIT_MS[unit])
    except ValueError:
        return None


class Locate:
    """Positions of a statement's nodes: the statement's offset in the script plus the node's own."""

    def __init__(self, script: str, offset: int) -> None:
        self.script, self.offset = script, offset

    def __call__(self, node: exp.Expr) -> Position:
        starts = [n.meta["start"] for n in node.walk() if isinstance(n, exp.Expr) and "start" in n.meta]
        return Position.of(self.script, self.offset + (min(starts) if starts else 0))

    def refuse(self, node: exp.Expr, what: str) -> SqlError:
        return SqlError(what, self(node))


@dataclass(frozen=True)
class Scope:
    """What an expression can name: the input's columns (by name, optionally qualified by the table or
    its alias), and expressions already computed upstream (a GROUP BY key, an aggregate) by their SQL."""

    columns: Mapping[str, SqlType | None]
    qualifiers: frozenset[str]
    computed: Mapping[str, str]  # normalized SQL of an expression -> the column holding its value


def normalized(node: exp.Expr) -> str:
    return node.sql(dialect="spark", normalize=True, identify=False)


def compile_expression(node: exp.Expr, scope: Scope, locate: Locate) -> Evaluate:
    return _Compiler(scope, locate).compile(node)


def _null_safe(fn: Callable[..., Any]) -> Callable[..., Any]:
    def call(*args: Any) -> Any:
        return None if any(a is None for a in args) else fn(*args)

    return call


def _divide(a: Any, b: Any) -> Any:
    if b == 0:
        raise ValueError("division by zero")
    if isinstance(a, int) and isinstance(b, int):
        quotient = abs(a) // abs(b)
        return quotient if (a >= 0) == (b >= 0) else -quotient
    return a / b


def _mod(a: Any, b: Any) -> Any:
    if b == 0:
        raise ValueError("MOD by zero")
    return math.fmod(a, b) if isinstance(a, float) or isinstance(b, float) else a - b * int(a / b)


def column_read(evaluate: Evaluate) -> str | None:
    """The input column ``evaluate`` reads as it is (a compiled column reference: an ``itemgetter``
    of one name), or None when it is anything else."""
    if type(evaluate) is not itemgetter:
        return None
    reduced: Any = evaluate.__reduce__()  # (itemgetter, the names it reads)
    names: tuple[object, ...] = reduced[1]
    return names[0] if len(names) == 1 and isinstance(names[0], str) else None


def _binary(fn: Callable[[Any, Any], Any], left: Evaluate, right: Evaluate) -> Evaluate:
    """``fn`` of two operands, NULL when either is (both evaluated first: either may raise)."""

    def evaluate(row: Row) -> Any:
        a, b = left(row), right(row)
        return None if a is None or b is None else fn(a, b)

    return evaluate


def _numbers(fn: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    """Arithmetic over SQL's numbers: a DECIMAL literal (``Decimal``) with a DOUBLE is a DOUBLE."""

    def call(a: Any, b: Any) -> Any:
        if isinstance(a, Decimal) and isinstance(b, float):
            a = float(a)
        elif isinstance(b, Decimal) and isinstance(a, float):
            b = float(b)
        return fn(a, b)

    return call


_BINARY: Final[dict[type[exp.Expr], Callable[[Any, Any], Any]]] = {
    exp.Add: _numbers(lambda a, b: a + b),
    exp.Sub: _numbers(lambda a, b: a - b),
    exp.Mul: _numbers(lambda a, b: a * b),
    exp.Div: _numbers(_divide),
    exp.IntDiv: _numbers(_divide),
    exp.Mod: _numbers(_mod),
    exp.EQ: lambda a, b: a == b,
    exp.NEQ: lambda a, b: a != b,
    exp.GT: lambda a, b: a > b,
    exp.GTE: lambda a, b: a >= b,
    exp.LT: lambda a, b: a < b,
    exp.LTE: lambda a, b: a <= b,
}

_JAVA_DATE: Final = (
    ("yyyy", "%Y"),
    ("MM", "%m"),
    ("dd", "%d"),
    ("HH", "%H"),
    ("mm", "%M"),
    ("ss", "%S"),
)


def date_format(ms: int, pattern: str) -> str:
    """Flink's DATE_FORMAT(timestamp, 'yyyy-MM-dd HH:mm:ss'): Java's pattern letters yyyy MM dd HH mm ss SSS."""
    moment = _moment(ms)
    out = pattern.replace("%", "%%")
    for java, strf in _JAVA_DATE:
        out = out.replace(java, strf)
    return moment.strftime(out.replace("SSS", f"{moment.microsecond // 1000:03d}"))


class DateFormat:
    """DATE_FORMAT with one literal pattern, as :func:`date_format`, its result remembered per unit of
    the pattern's finest field (a day for ``yyyy-MM-dd``, a minute for ``HH:mm``, a millisecond with
    ``SSS``): rows of the same day (q15's key) format once. Up to :attr:`LIMIT` results are kept."""

    LIMIT: Final = 4_096

    def __init__(self, pattern: str) -> None:
        self.pattern = pattern
        self.unit = next(
            (ms for field, ms in (("SSS", 1), ("ss", 1_000), ("mm", 60_000), ("HH", 3_600_000)) if field in pattern),
            86_400_000,
        )
        self.formatted: dict[int, str] = {}

    def __call__(self, ms: int) -> str:
        slot = ms // self.unit
        text = self.formatted.get(slot)
        if text is None:
            if len(self.formatted) >= self.LIMIT:
                self.formatted.clear()
            text = self.formatted[slot] = date_format(ms, self.pattern)
        return text


def _like(pattern: str) -> re.Pattern[str]:
    regex = "".join(".*" if c == "%" else "." if c == "_" else re.escape(c) for c in pattern)
    return re.compile(f"(?s)^{regex}$")


class _Compiler:
    def __init__(self, scope: Scope, locate: Locate) -> None:
        self.scope, self.locate = scope, locate

    def refuse(self, node: exp.Expr, what: str) -> SqlError:
        return self.locate.refuse(node, what)

    def compile(self, node: exp.Expr) -> Evaluate:  # noqa: PLR0911, PLR0912  # one case per node kind
        held = self.scope.computed.get(normalized(node))
        if held is not None:
            return itemgetter(held)
        match node:
            case exp.Paren():
                return self.compile(node.this)
            case exp.Alias():
                return self.compile(node.this)
            case exp.Column():
                return self._column(node)
            case exp.Literal():
                value = self._literal(node)
                return lambda row: value
            case exp.Boolean():
                truth = bool(node.this)
                return lambda row: truth
            case exp.Null():
                return lambda row: None
            case exp.Interval():
                ms = interval_ms(node)
                if ms is None:
                    raise self.refuse(node, f"interval {node.sql(dialect='spark')}: only MILLISECOND to DAY units")
                return lambda row: ms
            case exp.Neg():
                inner = self.compile(node.this)
                return lambda row: None if (v := inner(row)) is None else -v
            case exp.Not():
                inner = self.compile(node.this)
                return lambda row: None if (v := inner(row)) is None else not v
            case exp.And():
                return self._and(self.compile(node.this), self.compile(node.expression))
            case exp.Or():
                return self._or(self.compile(node.this), self.compile(node.expression))
            case exp.DPipe():
                left, right = self.compile(node.this), self.compile(node.expression)
                concat = _null_safe(lambda a, b: _text(a) + _text(b))
                return lambda row: concat(left(row), right(row))
            case exp.Is():
                inner = self.compile(node.this)
                if not isinstance(node.expression, exp.Null):
                    raise self.refuse(node, "IS takes NULL or NOT NULL")
                return lambda row: inner(row) is None
            case exp.Between():
                value, low, high = (
                    self.compile(node.this),
                    self.compile(node.args["low"]),
                    self.compile(node.args["high"]),
                )

                def between(row: Row) -> Any:  # every operand evaluated (one may raise), then NULL-safe
                    v, lo, hi = value(row), low(row), high(row)
                    return None if v is None or lo is None or hi is None else lo <= v <= hi

                return between
            case exp.In():
                if node.args.get("query") is not None or node.args.get("unnest") is not None:
                    raise self.refuse(node, "IN (subquery) is not supported")
                value = self.compile(node.this)
                options = [self.compile(e) for e in node.expressions]
                return lambda row: _in(value(row), [o(row) for o in options])
            case exp.Like():
                value = self.compile(node.this)
                if not isinstance(node.expression, exp.Literal) or not node.expression.is_string:
                    raise self.refuse(node, "LIKE takes a string literal pattern")
                pattern = _like(node.expression.this)
                return lambda row: None if (v := value(row)) is None else bool(pattern.match(v))
            case exp.Case():
                return self._case(node)
            case exp.If():
                condition, true = self.compile(node.this), self.compile(node.args["true"])
                false_node = node.args.get("false")
                false = self.compile(false_node) if false_node is not None else (lambda row: None)
                return lambda row: true(row) if condition(row) is True else false(row)
            case exp.Cast() | exp.TryCast():
                return self._cast(node)
            case _ if type(node) in _BINARY:
                return _binary(_BINARY[type(node)], self.compile(node.this), self.compile(node.expression))
            case exp.Func():
                return self._function(node)
        raise self.refuse(node, f"{_describe(node)} is not supported")

    def _column(self, node: exp.Column) -> Evaluate:
        name = node.name
        qualifier = node.table
        if qualifier and qualifier not in self.scope.qualifiers:
            raise self.refuse(node, f"column {qualifier}.{name}: no table or alias {qualifier} in FROM")
        if qualifier and f"{qualifier}.{name}" in self.scope.columns:  # a join's side
            return itemgetter(f"{qualifier}.{name}")  # a column read is an itemgetter: see column_read
        if name not in self.scope.columns:
            if any(c.endswith(f".{name}") for c in self.scope.columns):
                raise self.refuse(node, f"column {name} is ambiguous: qualify it with its table or alias")
            shown = ", ".join(c for c in self.scope.columns if "." not in c)
            raise self.refuse(node, f"column {name} is not in the input (columns: {shown})")
        return itemgetter(name)

    def _literal(self, node: exp.Literal) -> Any:
        if node.is_string:
            return node.this
        text = node.this
        try:
            return int(text)
        except ValueError:
            pass
        if "e" in text.lower():
            return float(text)  # an approximate literal: DOUBLE
        return Decimal(text)  # an exact literal: DECIMAL (0.908 * price is exact, as in Flink)

    def _and(self, left: Evaluate, right: Evaluate) -> Evaluate:
        def evaluate(row: Row) -> Any:
            a = left(row)
            if a is False:
                return False
            b = right(row)
            if b is False:
                return False
            return None if a is None or b is None else True

        return evaluate

    def _or(self, left: Evaluate, right: Evaluate) -> Evaluate:
        def evaluate(row: Row) -> Any:
            a = left(row)
            if a is True:
                return True
            b = right(row)
            if b is True:
                return True
            return None if a is None or b is None else False

        return evaluate

    def _case(self, node: exp.Case) -> Evaluate:
        operand = self.compile(node.this) if node.this is not None else None
        branches = [(self.compile(i.this), self.compile(i.args["true"])) for i in node.args.get("ifs") or []]
        default_node = node.args.get("default")
        default = self.compile(default_node) if default_node is not None else (lambda row: None)

        def evaluate(row: Row) -> Any:
            subject = operand(row) if operand is not None else None
            for when, then in branches:
                w = when(row)
                if (operand is None and w is True) or (operand is not None and subject is not None and w == subject):
                    return then(row)
            return default(row)

        return evaluate

    def _cast(self, node: exp.Cast) -> Evaluate:
        target = SqlType.of(node.to)
        if target is None:
            raise self.refuse(node, f"CAST to {node.to.sql(dialect='spark')} is not supported")
        inner = self.compile(node.this)
        kind = target.kind
        if kind is Kind.STRING:
            return lambda row: None if (v := inner(row)) is None else _text(v)
        if kind is Kind.TIMESTAMP:
            return lambda row: None if (v := inner(row)) is None else parse_timestamp(v)
        if kind is Kind.INTEGER:
            return lambda row: None if (v := inner(row)) is None else int(float(v)) if isinstance(v, str) else int(v)
        return lambda row: coerce(inner(row), kind)

    def _function(self, node: exp.Func) -> Evaluate:  # noqa: PLR0911  # one case per function
        if isinstance(node, exp.AggFunc):
            raise self.refuse(node, f"aggregate {node.sql_name()} is not allowed here")
        name = node.sql_name().upper() if not isinstance(node, exp.Anonymous) else str(node.this).upper()
        match node:
            case exp.Upper():
                f = self.compile(node.this)
                return lambda row: None if (v := f(row)) is None else v.upper()
            case exp.Lower():
                f = self.compile(node.this)
                return lambda row: None if (v := f(row)) is None else v.lower()
            case exp.Abs():
                f = self.compile(node.this)
                return lambda row: None if (v := f(row)) is None else abs(v)
            case exp.Length():
                f = self.compile(node.this)
                return lambda row: None if (v := f(row)) is None else len(v)
            case exp.Trim():
                f = self.compile(node.this)
                return lambda row: None if (v := f(row)) is None else v.strip(" ")
            case exp.Coalesce():
                parts = [self.compile(node.this)] + [self.compile(e) for e in node.expressions]
                return lambda row: next((v for p in parts if (v := p(row)) is not None), None)
            case exp.ConcatWs():
                separator, *rest = (self.compile(e) for e in node.expressions)
                return lambda row: _concat_ws(separator(row), [p(row) for p in rest])
            case exp.Concat():
                parts = [self.compile(e) for e in node.expressions]
                return lambda row: (
                    None if any((v := p(row)) is None for p in parts) else "".join(_text(p(row)) for p in parts)
                )
            case exp.Substring():
                s = self.compile(node.this)
                start_node, length_node = node.args.get("start"), node.args.get("length")
                start = self.compile(start_node) if start_node is not None else (lambda row: 1)
                length = self.compile(length_node) if length_node is not None else (lambda row: -1)
                return lambda row: _substring(s(row), start(row), length(row))
            case exp.Floor():
                f = self.compile(node.this)
                return lambda row: None if (v := f(row)) is None else math.floor(v)
            case exp.Ceil():
                f = self.compile(node.this)
                return lambda row: None if (v := f(row)) is None else math.ceil(v)
            case exp.Round():
                f = self.compile(node.this)
                decimals_node = node.args.get("decimals")
                digits = self.compile(decimals_node) if decimals_node is not None else (lambda row: 0)
                return lambda row: None if (v := f(row)) is None else _round(v, digits(row))
            case exp.StrPosition():
                if node.args.get("position") is not None or node.args.get("occurrence") is not None:
                    raise self.refuse(node, "INSTR / LOCATE / POSITION take two arguments (a start is not supported)")
                s, sub = self.compile(node.this), self.compile(node.args["substr"])
                find = _null_safe(lambda v, w: v.find(w) + 1)
                return lambda row: find(s(row), sub(row))
            case exp.RegexpExtract():
                group_node = node.args.get("group")
                if group_node is None or "start" not in group_node.meta:  # sqlglot fills in Spark's default 1
                    raise self.refuse(node, "REGEXP_EXTRACT takes its group index: REGEXP_EXTRACT(s, regex, n)")
                s, regex, group = (self.compile(n) for n in (node.this, node.expression, group_node))
                return lambda row: _regexp_extract(s(row), regex(row), group(row))
            case exp.Hour() | exp.Minute() | exp.Second() | exp.Year() | exp.Month() | exp.DayOfMonth():
                value = node.this
                while isinstance(value, exp.TsOrDsToDate):  # sqlglot's wrapping
                    value = value.this
                f = self.compile(value)
                field = _TIME_FIELDS[type(node)]
                return lambda row: None if (v := f(row)) is None else getattr(_moment(_millis(v)), field)
            case exp.TimeToStr():
                value = node.this
                while isinstance(value, exp.TimeStrToTime | exp.TsOrDsToTimestamp):  # sqlglot's wrapping
                    value = value.this
                f = self.compile(value)
                fmt_node = node.args.get("format")
                if not isinstance(fmt_node, exp.Literal):
                    raise self.refuse(node, "DATE_FORMAT takes a literal pattern")
                formatted = DateFormat(_java_pattern(node))
                return lambda row: None if (v := f(row)) is None else formatted(_millis(v))
        if isinstance(node, exp.Anonymous) and name in ("TO_TIMESTAMP_LTZ",) and len(node.expressions) == 2:
            f = self.compile(node.expressions[0])
            precision = node.expressions[1]
            if not isinstance(precision, exp.Literal) or precision.this not in ("0", "3"):
                raise self.refuse(node, "TO_TIMESTAMP_LTZ(value, 0 | 3)")
            scale = 1000 if precision.this == "0" else 1
            return lambda row: None if (v := f(row)) is None else int(v) * scale
        if isinstance(node, exp.Anonymous) and name == "PROCTIME":
            if node.expressions:
                raise self.refuse(node, "PROCTIME() takes no argument")
            return lambda row: time.time_ns() // 1_000_000  # the processing time, epoch ms
        if isinstance(node, exp.Anonymous) and name == "SPLIT_INDEX":
            if len(node.expressions) != 3:
                raise self.refuse(node, "SPLIT_INDEX(string, separator, index) takes three arguments")
            s, separator, index = (self.compile(e) for e in node.expressions)
            return lambda row: _split_index(s(row), separator(row), index(row))
        python = functions.lookup(name) if isinstance(node, exp.Anonymous) else None
        if python is not None:
            if functions.is_aggregate(python):
                raise self.refuse(node, f"aggregate function {name} is not allowed here")
            arguments = tuple(self.compile(a) for a in node.expressions)
            return lambda row: python(*(a(row) for a in arguments))
        raise self.refuse(node, f"function {name} is not supported")


_TIME_FIELDS: Final[dict[type[exp.Expr], str]] = {
    exp.Hour: "hour",
    exp.Minute: "minute",
    exp.Second: "second",
    exp.Year: "year",
    exp.Month: "month",
    exp.DayOfMonth: "day",
}


def _moment(ms: int) -> dt.datetime:
    return dt.datetime(1970, 1, 1, tzinfo=dt.UTC) + dt.timedelta(milliseconds=ms)


def _millis(value: Any) -> int:
    """A TIMESTAMP's epoch ms; a string is read as CAST(s AS TIMESTAMP) reads it (Flink's
    DATE_FORMAT and HOUR take a timestamp string too)."""
    return parse_timestamp(value) if isinstance(value, str) else int(value)


def _concat_ws(separator: Any, values: list[Any]) -> Any:
    """Flink's CONCAT_WS: NULL when the separator is NULL; NULL arguments are skipped."""
    if separator is None:
        return None
    return separator.join(_text(v) for v in values if v is not None)


def _split_index(s: Any, separator: Any, index: Any) -> Any:
    """Flink's SPLIT_INDEX(string, separator, index): the 0-based index-th piece of the string split
    at each whole separator, empty pieces kept; NULL for a NULL argument, an index out of range or
    below 0, or an empty string (which has no pieces)."""
    if s is None or separator is None or index is None or index < 0 or s == "":
        return None
    pieces = re.split(r"\s", s) if separator == "" else s.split(separator)
    return pieces[index] if index < len(pieces) else None


_REGEX_CACHE: dict[str, re.Pattern[str] | None] = {}


def _regex(pattern: str) -> re.Pattern[str] | None:
    if pattern not in _REGEX_CACHE:
        try:
            compiled: re.Pattern[str] | None = re.compile(pattern)
        except re.error:
            compiled = None
        if len(_REGEX_CACHE) > 1000:
            _REGEX_CACHE.clear()
        _REGEX_CACHE[pattern] = compiled
    return _REGEX_CACHE[pattern]


def _regexp_extract(s: Any, pattern: Any, group: Any) -> Any:
    """Flink's REGEXP_EXTRACT(string, regex, n): group n (0 the whole match) of the regex's first
    match in the string; NULL for a NULL argument, no match, a group that did not take part, a group
    index out of range, or a regex that does not compile."""
    if s is None or pattern is None or group is None:
        return None
    regex = _regex(pattern)
    if regex is None or not 0 <= group <= regex.groups:
        return None
    match = regex.search(s)
    return None if match is None else match.group(group)


def _java_pattern(node: exp.TimeToStr) -> str:
    """The DATE_FORMAT pattern as written (Java's letters): sqlglot holds it as strftime and prints
    it back in Spark's (Java's) form."""
    printed = node.sql(dialect="spark")
    return printed.rsplit(", '", 1)[1].rsplit("'", 1)[0].replace("''", "'")


def _round(v: Any, digits: int) -> Any:
    """SQL's ROUND: half away from zero, keeping the argument's type (an integer rounds to itself)."""
    if isinstance(v, int):
        return v
    if isinstance(v, Decimal):
        return v.quantize(Decimal(1).scaleb(-digits), rounding=ROUND_HALF_UP)
    factor = 10.0**digits
    rounded = math.floor(abs(v) * factor + 0.5) / factor
    return rounded if v >= 0 else -rounded


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    return str(value)


def _substring(s: Any, start: Any, length: Any) -> Any:
    if s is None or start is None or length is None:
        return None
    begin = max(start - 1, 0) if start > 0 else max(len(s) + start, 0)
    return s[begin:] if length < 0 else s[begin : begin + length]


def _in(value: Any, options: list[Any]) -> Any:
    if value is None:
        return None
    if value in [o for o in options if o is not None]:
        return True
    return None if any(o is None for o in options) else False


def _describe(node: exp.Expr) -> str:
    names: dict[type[exp.Expr], str] = {
        exp.Window: "OVER (window function)",
        exp.Subquery: "a subquery",
        exp.Exists: "EXISTS",
        exp.Star: "*",
    }
    return names.get(type(node), f"{type(node).__name__.upper()} ({node.sql(dialect='spark')[:40]})")


__all__ = ["Evaluate", "Locate", "Row", "Scope", "compile_expression", "date_format", "interval_ms", "normalized"]
