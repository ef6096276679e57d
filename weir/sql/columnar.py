"""SQL projections and filters evaluated on Arrow record batches (``pyarrow.compute``), with the
per-record path's exact results.

:func:`columnar_chain` takes the part of a statement's plan that is a scan followed by filters and
projections (the INSERT's last projection converted to the sink's column types) and answers either
a :class:`ColumnarChain`, which maps a batch of the scan's rows to a batch of the chain's output rows,
or a :class:`Fallback` naming the first construct it does not vectorize (that statement then stays on
the per-record path, as EXPLAIN says). Only what Arrow computes exactly as Python does is vectorized:

- columns, integer/string/boolean literals; ``+ - *`` and unary minus on BIGINT (overflow-checked: a
  batch that would overflow int64 is evaluated per record, where integers are unbounded) and on
  DOUBLE; ``MOD``/``%`` on BIGINT (a batch with a value of 2**52 or more, or a zero divisor, per record);
- comparisons between values of one kind, or of BIGINT with DOUBLE (Python compares those exactly:
  a batch with an int of 2**53 or more is evaluated per record); AND/OR three-valued (Kleene), NOT, IS [NOT] NULL;
- searched CASE whose branches have one kind (a NULL or FALSE condition skips its branch), COALESCE,
  ABS, CHAR_LENGTH;
- CAST of BIGINT to BIGINT, DOUBLE or STRING;
- an exact DECIMAL literal times a BIGINT, into a DOUBLE (DECIMAL) column: ``d * x`` with ``d`` =
  ``D / 10**s`` is the double nearest ``D * x / 10**s``, as ``float(Decimal)``, computed as the
  correctly rounded division of two exactly represented doubles (a batch with ``|D * x| >= 2**53`` is
  evaluated per record).

:class:`ColumnarChainOperator` runs such a chain in a job (``SET 'weir.columnar' = 'true'``; see
``weir.sql.compile``). Everything else (``/``, string functions whose Unicode rules differ,
TIMESTAMP arithmetic, DECIMAL anywhere else, mixed-kind CASE) is a :class:`Fallback`. Window
aggregation on batches is ``weir.sql.columnar_window`` (see docs/sql.md).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import pyarrow as pa
import pyarrow.compute as pc
import sqlglot
from sqlglot import exp

from weir.operators.base import StreamOperator
from weir.sql.plan import Filter, NamedExpression, Node, Project, Scan, Sink
from weir.sql.types import Kind, SqlType

_EXACT: Final = 2**53
_MOD_LIMIT: Final = 2**52

ARROW_TYPES: Final[Mapping[Kind, pa.DataType]] = {
    Kind.INTEGER: pa.int64(),
    Kind.DOUBLE: pa.float64(),
    Kind.STRING: pa.string(),
    Kind.BOOLEAN: pa.bool_(),
    Kind.TIMESTAMP: pa.int64(),  # epoch ms, as the per-record rows hold it
}


@dataclass(frozen=True)
class Fallback:
    """Why a statement's chain stays on the per-record path."""

    reason: str


class _Refused(Exception):
    """A construct the columnar path does not evaluate exactly (at translation)."""


class _PerRecord(Exception):
    """A batch whose values Arrow would not compute as Python does (at run time): per record."""


@dataclass(frozen=True)
class _Value:
    """A vectorized value: its SQL kind (``decimal``: an exact product ``numerator / 10**scale``)."""

    kind: Kind | str
    data: Any  # a pyarrow Array or Scalar
    scale: int = 0


_Eval = Callable[[pa.Table], _Value]

_COMPARE: Final[Mapping[type[exp.Expr], str]] = {
    exp.EQ: "equal",
    exp.NEQ: "not_equal",
    exp.GT: "greater",
    exp.GTE: "greater_equal",
    exp.LT: "less",
    exp.LTE: "less_equal",
}
_ARITHMETIC: Final[Mapping[type[exp.Expr], tuple[str, str]]] = {
    exp.Add: ("add_checked", "add"),
    exp.Sub: ("subtract_checked", "subtract"),
    exp.Mul: ("multiply_checked", "multiply"),
}


def _bounded(data: Any, limit: int) -> None:
    """A batch with a value whose magnitude reaches ``limit`` is evaluated per record."""
    if isinstance(data, pa.Scalar):
        value = data.as_py()
        if value is not None and abs(value) >= limit:
            raise _PerRecord
        return
    if len(data) == 0 or data.null_count == len(data):
        return
    low, high = pc.min_max(data).values()
    if max(abs(low.as_py()), abs(high.as_py())) >= limit:
        raise _PerRecord


class _Translator:
    def __init__(self, columns: Mapping[str, Kind]) -> None:
        self.columns = columns

    def translate(self, node: exp.Expr) -> tuple[Kind | str, _Eval]:  # noqa: PLR0911, PLR0912  # one case per node
        match node:
            case exp.Paren() | exp.Alias():
                return self.translate(node.this)
            case exp.Column():
                if node.table or node.name not in self.columns:
                    raise _Refused(f"column {node.sql(dialect='spark')}")
                name, column_kind = node.name, self.columns[node.name]
                return column_kind, lambda t: _Value(column_kind, t.column(name))
            case exp.Literal():
                return self._literal(node)
            case exp.Boolean():
                scalar = pa.scalar(bool(node.this))
                return Kind.BOOLEAN, lambda t: _Value(Kind.BOOLEAN, scalar)
            case exp.Neg():
                kind, inner = self.translate(node.this)
                if kind is Kind.INTEGER:
                    return kind, lambda t: _Value(kind, _arrow("negate_checked", inner(t).data))
                if kind is Kind.DOUBLE:
                    return kind, lambda t: _Value(kind, pc.negate(inner(t).data))
                raise _Refused(f"unary minus on {kind}")
            case exp.Not():
                kind, inner = self.translate(node.this)
                self._want(kind, Kind.BOOLEAN, node)
                return kind, lambda t: _Value(kind, pc.invert(inner(t).data))
            case exp.And() | exp.Or():
                function = "and_kleene" if isinstance(node, exp.And) else "or_kleene"
                (lk, left), (rk, right) = self.translate(node.this), self.translate(node.expression)
                self._want(lk, Kind.BOOLEAN, node)
                self._want(rk, Kind.BOOLEAN, node)
                return Kind.BOOLEAN, lambda t: _Value(
                    Kind.BOOLEAN, pc.call_function(function, [left(t).data, right(t).data])
                )
            case exp.Is():
                if not isinstance(node.expression, exp.Null):
                    raise _Refused("IS other than IS NULL")
                _kind, inner = self.translate(node.this)
                return Kind.BOOLEAN, lambda t: _Value(Kind.BOOLEAN, _is_null(inner(t).data, t.num_rows))
            case exp.Case():
                return self._case(node)
            case exp.Cast():
                return self._cast(node)
            case exp.Mod():
                return self._mod(node.this, node.expression)
            case exp.Coalesce():
                parts = [self.translate(e) for e in [node.this, *node.expressions]]
                kinds = {k for k, _ in parts}
                if len(kinds) != 1 or "decimal" in kinds:
                    raise _Refused("COALESCE of values of different kinds")
                (kind,) = kinds
                evaluators = [e for _, e in parts]
                return kind, lambda t: _Value(kind, pc.coalesce(*[_array(e(t).data, t.num_rows) for e in evaluators]))
            case exp.Abs():
                kind, inner = self.translate(node.this)
                if kind not in (Kind.INTEGER, Kind.DOUBLE):
                    raise _Refused(f"ABS of {kind}")
                return kind, lambda t: _Value(kind, _arrow("abs_checked", inner(t).data))
            case exp.Length():
                kind, inner = self.translate(node.this)
                self._want(kind, Kind.STRING, node)
                return Kind.INTEGER, lambda t: _Value(Kind.INTEGER, pc.cast(pc.utf8_length(inner(t).data), pa.int64()))
            case _ if type(node) in _COMPARE:
                return self._compare(node)
            case _ if type(node) in _ARITHMETIC:
                return self._arithmetic(node)
        raise _Refused(f"{type(node).__name__.upper()} ({node.sql(dialect='spark')})")

    @staticmethod
    def _want(kind: Kind | str, wanted: Kind, node: exp.Expr) -> None:
        if kind is not wanted:
            raise _Refused(f"{node.sql(dialect='spark')} on {kind}")

    def _literal(self, node: exp.Literal) -> tuple[Kind | str, _Eval]:
        if node.is_string:
            text = pa.scalar(node.this, pa.string())
            return Kind.STRING, lambda t: _Value(Kind.STRING, text)
        digits = node.this
        try:
            number = int(digits)
        except ValueError:
            pass
        else:
            if abs(number) >= 2**63:
                raise _Refused(f"integer literal {digits} beyond BIGINT")
            integer = pa.scalar(number, pa.int64())
            return Kind.INTEGER, lambda t: _Value(Kind.INTEGER, integer)
        if "e" in digits.lower() or not digits.replace(".", "", 1).lstrip("-").isdigit():
            raise _Refused(f"approximate literal {digits}")
        whole, _, fraction = digits.partition(".")
        numerator, scale = int(whole + fraction), len(fraction)
        if abs(numerator) >= _EXACT:
            raise _Refused(f"decimal literal {digits}")
        value = pa.scalar(numerator, pa.int64())
        return "decimal", lambda t: _Value("decimal", value, scale)

    def _compare(self, node: exp.Expr) -> tuple[Kind | str, _Eval]:
        (lk, left), (rk, right) = self.translate(node.this), self.translate(node.expression)
        function = _COMPARE[type(node)]
        if {lk, rk} == {Kind.INTEGER, Kind.DOUBLE}:  # exact while the ints convert exactly (below 2**53)

            def mixed(t: pa.Table) -> _Value:
                a, b = left(t), right(t)
                for side in (a, b):
                    if side.kind is Kind.INTEGER:
                        _bounded(side.data, _EXACT)
                x, y = (_cast_to(v.data, pa.float64()) for v in (a, b))
                return _Value(Kind.BOOLEAN, pc.call_function(function, [x, y]))

            return Kind.BOOLEAN, mixed
        if lk != rk or lk == "decimal":
            raise _Refused(f"comparison of {lk} with {rk}")
        return Kind.BOOLEAN, lambda t: _Value(Kind.BOOLEAN, pc.call_function(function, [left(t).data, right(t).data]))

    def _arithmetic(self, node: exp.Expr) -> tuple[Kind | str, _Eval]:
        (lk, left), (rk, right) = self.translate(node.this), self.translate(node.expression)
        checked, plain = _ARITHMETIC[type(node)]
        if lk is Kind.INTEGER and rk is Kind.INTEGER:
            return Kind.INTEGER, lambda t: _Value(Kind.INTEGER, _arrow(checked, left(t).data, right(t).data))
        if {lk, rk} <= {Kind.INTEGER, Kind.DOUBLE}:

            def double(t: pa.Table) -> _Value:
                a, b = (_cast_to(v.data, pa.float64()) for v in (left(t), right(t)))
                return _Value(Kind.DOUBLE, pc.call_function(plain, [a, b]))

            return Kind.DOUBLE, double
        if isinstance(node, exp.Mul) and {lk, rk} == {"decimal", Kind.INTEGER}:
            decimal, integer = (left, right) if lk == "decimal" else (right, left)

            def product(t: pa.Table) -> _Value:
                d = decimal(t)
                numerator = _arrow("multiply_checked", d.data, integer(t).data)
                return _Value("decimal", numerator, d.scale)

            return "decimal", product
        raise _Refused(f"{node.sql(dialect='spark')} on {lk} and {rk}")

    def _mod(self, a: exp.Expr, b: exp.Expr) -> tuple[Kind | str, _Eval]:
        (ak, left), (bk, right) = self.translate(a), self.translate(b)
        if ak is not Kind.INTEGER or bk is not Kind.INTEGER:
            raise _Refused(f"MOD of {ak} and {bk}")

        def mod(t: pa.Table) -> _Value:
            x, y = left(t).data, right(t).data
            _bounded(x, _MOD_LIMIT)
            _bounded(y, _MOD_LIMIT)
            if pc.any(pc.equal(y, 0)).as_py():
                raise _PerRecord  # Python raises per record: that row's error, as on the per-record path
            # truncated division, the per-record ``a - b * int(a / b)`` for magnitudes below 2**52
            return _Value(Kind.INTEGER, pc.subtract(x, pc.multiply(y, pc.divide(x, y))))

        return Kind.INTEGER, mod

    def _case(self, node: exp.Case) -> tuple[Kind | str, _Eval]:
        if node.this is not None:
            raise _Refused("CASE with an operand")
        branches = []
        for branch in node.args.get("ifs") or []:
            ck, condition = self.translate(branch.this)
            self._want(ck, Kind.BOOLEAN, branch)
            branches.append((condition, *self.translate(branch.args["true"])))
        default_node = node.args.get("default")
        default = None if default_node is None or isinstance(default_node, exp.Null) else self.translate(default_node)
        kinds = {k for _c, k, _v in branches} | ({default[0]} if default else set())
        if len(kinds) != 1 or "decimal" in kinds:
            raise _Refused("CASE whose branches have different kinds")
        (kind,) = kinds
        assert isinstance(kind, Kind)
        arrow_type = ARROW_TYPES[kind]

        def case(t: pa.Table) -> _Value:
            n = t.num_rows
            conditions = [pc.fill_null(_array(c(t).data, n), False) for c, _k, _v in branches]
            values = [_array(v(t).data, n, arrow_type) for _c, _k, v in branches]
            otherwise = _array(default[1](t).data, n, arrow_type) if default else pa.nulls(n, arrow_type)
            names = [str(i) for i in range(len(conditions))]
            return _Value(kind, pc.case_when(pa.StructArray.from_arrays(conditions, names), *values, otherwise))

        return kind, case

    def _cast(self, node: exp.Cast) -> tuple[Kind | str, _Eval]:
        target = SqlType.of(node.to)
        kind, inner = self.translate(node.this)
        if target is None or kind is not Kind.INTEGER or target.kind not in (Kind.INTEGER, Kind.DOUBLE, Kind.STRING):
            raise _Refused(f"CAST({kind} AS {node.to.sql(dialect='spark')})")
        to = ARROW_TYPES[target.kind]
        out = target.kind
        return out, lambda t: _Value(out, _cast_to(inner(t).data, to))


def _arrow(function: str, *args: Any) -> Any:
    """A checked kernel: an overflow makes the batch per record (Python's integers do not overflow)."""
    try:
        return pc.call_function(function, list(args))
    except pa.ArrowInvalid:
        raise _PerRecord from None


def _array(data: Any, n: int, arrow_type: pa.DataType | None = None) -> pa.Array:
    if isinstance(data, pa.Scalar):
        data = pa.array([data.as_py()] * n, type=arrow_type or data.type)
    if isinstance(data, pa.ChunkedArray):
        data = data.combine_chunks()
    return data if arrow_type is None or data.type == arrow_type else _cast_to(data, arrow_type)


def _cast_to(data: Any, arrow_type: pa.DataType) -> Any:
    """Arrow's safe cast: an int beyond 2**53 into a double is refused there, so per record."""
    try:
        return pc.cast(data, arrow_type)
    except pa.ArrowInvalid:
        raise _PerRecord from None


def _is_null(data: Any, n: int) -> pa.Array:
    return _array(pa.scalar(not data.is_valid), n) if isinstance(data, pa.Scalar) else pc.is_null(data)


def _as_kind(value: _Value, kind: Kind, n: int) -> pa.Array:
    """A projection's value converted to its sink column's kind (the per-record ``coerce``)."""
    if value.kind == "decimal":
        assert kind is Kind.DOUBLE
        _bounded(value.data, _EXACT)
        numerator = _array(value.data, n, pa.float64())
        return pc.divide(numerator, pa.scalar(float(10**value.scale)))  # both exact: correctly rounded
    return _array(value.data, n, ARROW_TYPES[kind])


def _output_kinds(value_kind: Kind | str, sink_kind: Kind | None) -> Kind:
    """The kind a projection's output has: its own, or the sink column's it is converted to."""
    if sink_kind is None:
        if value_kind == "decimal":
            raise _Refused("a DECIMAL value other than into a DOUBLE/DECIMAL column")
        assert isinstance(value_kind, Kind)
        return value_kind
    if value_kind == sink_kind or (value_kind in ("decimal", Kind.INTEGER) and sink_kind is Kind.DOUBLE):
        return sink_kind
    raise _Refused(f"a {value_kind} value into a {sink_kind} column")


@dataclass(frozen=True)
class _Step:
    condition: _Eval | None  # a filter
    outputs: tuple[tuple[str, _Eval, Kind], ...]  # a projection: name, value, output kind


class ColumnarChain:
    """Filters and projections on batches of a scan's rows (Arrow tables of :data:`ARROW_TYPES`).

    ``per_record`` (the same nodes' per-record functions) evaluates a batch Arrow would not compute
    as Python does (an int64 overflow, a large MOD operand); ``batches_per_record`` counts those."""

    def __init__(self, scan: Scan, steps: tuple[_Step, ...], nodes: tuple[Filter | Project, ...]) -> None:
        self.scan, self._steps, self._nodes = scan, steps, nodes
        self.input_schema = pa.schema([(name, ARROW_TYPES[kind]) for name, kind in scan_kinds(scan).items()])
        self.batches_per_record = 0

    def batch(self, rows: Sequence[Mapping[str, Any]]) -> pa.Table:
        """The scan's rows (dicts) as one input table."""
        return pa.Table.from_pylist(list(rows), schema=self.input_schema)

    def apply(self, table: pa.Table) -> list[dict[str, Any]]:
        """The chain's output rows for one input batch."""
        return [row for _i, row in self.apply_indexed(table)]

    def apply_indexed(self, table: pa.Table) -> list[tuple[int, dict[str, Any]]]:
        """The chain's output rows for one input batch, each with the index of its input row."""
        try:
            out, index = self._vectorized(table)
            return list(zip(index.to_pylist(), out.to_pylist(), strict=True))
        except _PerRecord:
            self.batches_per_record += 1
            return [(i, out) for i, row in enumerate(table.to_pylist()) for out in per_record(self._nodes, [row])]

    def _vectorized(self, table: pa.Table) -> tuple[pa.Table, pa.Array]:
        index = pa.array(range(table.num_rows), type=pa.int64())
        for step in self._steps:
            if step.condition is not None:
                mask = pc.fill_null(_array(step.condition(table).data, table.num_rows), False)  # WHERE: TRUE only
                table, index = table.filter(mask), index.filter(mask)
            else:
                n = table.num_rows
                arrays = [_as_kind(evaluate(table), kind, n) for _name, evaluate, kind in step.outputs]
                table = pa.Table.from_arrays(arrays, names=[name for name, _e, _k in step.outputs])
        return table, index


BATCH_ROWS: Final = 1_024
"""Rows a :class:`ColumnarChainOperator` gathers before it evaluates them as one batch."""

LINGER_MS: Final = 50
"""The longest a gathered row waits (wall time) before its batch is evaluated."""


class ColumnarChainOperator(StreamOperator):
    """A statement's scan -> filter/projection chain on batches: the scan's rows (dicts) are gathered,
    up to :data:`BATCH_ROWS` or :data:`LINGER_MS`, and evaluated as one Arrow batch; each output row
    keeps its input row's timestamp. A watermark that arrives while rows are gathered is held until
    they are emitted (so none is late downstream); at a checkpoint's snapshot (the barrier follows
    what the chain emitted during the snapshot) and at the end of input the gathered rows are
    evaluated and emitted, so no row is held across a barrier. It holds no state."""

    def __init__(self, node: Node, sink: Sink | None) -> None:
        self._node, self._sink = node, sink
        self._rows: list[Mapping[str, Any]] = []
        self._timestamps: list[int | None] = []
        self._first_ms: int | None = None
        self._watermark: int | None = None  # the latest watermark received while rows were gathered

    def open(self) -> None:
        chain = columnar_chain(self._node, self._sink)
        assert isinstance(chain, ColumnarChain), chain  # compile checked it
        self._chain = chain

    def process(self, value: Any, timestamp: int | None) -> None:
        if not self._rows:
            self._first_ms = time.time_ns() // 1_000_000
        self._rows.append(value)
        self._timestamps.append(timestamp)
        if len(self._rows) >= BATCH_ROWS:
            self._flush()

    def _flush(self) -> None:
        if not self._rows:
            return
        rows, timestamps = self._rows, self._timestamps
        self._rows, self._timestamps, self._first_ms = [], [], None
        emit = self.output.emit
        for i, row in self._chain.apply_indexed(self._chain.batch(rows)):
            emit(row, timestamps[i])
        if self._watermark is not None:
            watermark, self._watermark = self._watermark, None
            super().process_watermark(watermark)

    def process_watermark(self, watermark: int) -> None:
        if self._rows:
            self._watermark = watermark  # held until the gathered rows are out: none of them is late
        else:
            super().process_watermark(watermark)

    def next_processing_time(self) -> int | None:
        return None if self._first_ms is None else self._first_ms + LINGER_MS

    def on_processing_time(self, now_ms: int) -> None:
        self._flush()

    def snapshot_state(self, checkpoint_id: int) -> bytes | None:
        self._flush()
        return None

    def end_input(self) -> None:
        self._flush()


def per_record(nodes: Iterable[Filter | Project], rows: Iterable[Mapping[str, Any]]) -> Iterable[dict[str, Any]]:
    """The same nodes on the per-record path (as ``weir.sql.compile`` runs them)."""
    out: Iterable[Mapping[str, Any]] = rows
    for node in nodes:
        match node:
            case Filter():
                condition = node.condition.evaluate
                out = [row for row in out if condition(row) is True]
            case Project():
                outputs = tuple((o.name, o.evaluate) for o in node.outputs)
                out = [{n: f(row) for n, f in outputs} for row in out]
    return [dict(row) for row in out]


def columnar_chain(node: Node, sink: Sink | None = None) -> ColumnarChain | Fallback:
    """``node`` (a sink's input when ``sink`` is given) as a columnar chain, or why it stays per record."""
    chain: list[Filter | Project] = []
    while isinstance(node, Filter | Project):
        chain.append(node)
        node = node.input
    if not isinstance(node, Scan):
        return Fallback(f"{type(node).__name__} is not a scan followed by filters and projections")
    if not chain:
        return Fallback("no filter or projection")
    chain.reverse()
    try:
        columns = scan_kinds(node)
    except _Refused as refused:
        return Fallback(str(refused))
    steps: list[_Step] = []
    try:
        for i, step in enumerate(chain):
            translator = _Translator(columns)
            last = sink is not None and i == len(chain) - 1
            match step:
                case Filter():
                    kind, condition = translator.translate(_parse(step.condition))
                    if kind is not Kind.BOOLEAN:
                        raise _Refused(f"WHERE {step.condition.sql} is not a BOOLEAN")
                    steps.append(_Step(condition, ()))
                case Project():
                    sink_kinds = (
                        [c.type.kind for c in sink.table.columns] if last and sink else [None] * len(step.outputs)
                    )
                    outputs = []
                    for output, sink_kind in zip(step.outputs, sink_kinds, strict=True):
                        kind, evaluate = translator.translate(_parse(output))
                        outputs.append((output.name, evaluate, _output_kinds(kind, sink_kind)))
                    steps.append(_Step(None, tuple(outputs)))
                    columns = {name: kind for name, _e, kind in outputs}
    except _Refused as refused:
        return Fallback(str(refused))
    return ColumnarChain(node, tuple(steps), tuple(chain))


def scan_kinds(scan: Scan) -> dict[str, Kind]:
    """The kinds of a scan's row: its physical columns, then its computed columns (a computed column
    is a CAST, whose target is its kind; the source's decoder computes its values per record)."""
    kinds = {c.name: c.type.kind for c in scan.table.columns}
    for computed in scan.table.computed:
        expression = computed.expression
        target = SqlType.of(expression.to) if isinstance(expression, exp.Cast) else None
        if target is None:
            raise _Refused(f"computed column {computed.name} is not a CAST (its kind is unknown)")
        kinds[computed.name] = target.kind
    return kinds


def _parse(expression: NamedExpression) -> exp.Expr:
    try:
        return sqlglot.parse_one(expression.sql, read="spark")
    except sqlglot.errors.ParseError as error:
        raise _Refused(f"{expression.sql}: {error}") from None
