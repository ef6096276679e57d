"""A SQL script as statements: split at the top-level semicolons by sqlglot's tokenizer (comments and
quoted text kept whole), each statement recognised by its leading keywords, queries and expressions
parsed by sqlglot (its Spark dialect reads Flink's backquoted names and ``||``). ``CREATE TABLE``'s
column list is read element by element (Flink's computed columns, ``WATERMARK FOR``, ``PRIMARY KEY ...
NOT ENFORCED`` are not in sqlglot's dialects): types and expressions still parsed by sqlglot.

Anything else is refused with one line naming it and its ``line:column``."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final

import sqlglot
from sqlglot import exp
from sqlglot.dialects.spark import Spark
from sqlglot.errors import ParseError, TokenError
from sqlglot.tokens import Token, TokenType

from weir.sql.catalog import Column, ComputedColumn, Table, Watermark, check_table, connector_of
from weir.sql.errors import Position, SqlError
from weir.sql.expressions import interval_ms
from weir.sql.types import SqlType


class WeirFlink(Spark):
    """Spark's dialect reading Flink's group window function ``SESSION(ts, gap)`` as a function
    (Spark's tokenizer takes SESSION for a keyword)."""

    class Tokenizer(Spark.Tokenizer):
        KEYWORDS = {k: v for k, v in Spark.Tokenizer.KEYWORDS.items() if k != "SESSION"}


DIALECT = WeirFlink


class _ScriptTokenizer(WeirFlink.Tokenizer):
    """The dialect's tokenizer without its commands: EXPLAIN and EXECUTE are read as words, not as a
    command swallowing the rest of the statement as one string."""

    COMMANDS = Spark.Tokenizer.COMMANDS - {TokenType.COMMAND, TokenType.EXECUTE}


@dataclass(frozen=True)
class Text:
    """The script, for positions: a statement's offset into it turns a node's offset into ``line:column``."""

    script: str

    def at(self, offset: int) -> Position:
        return Position.of(self.script, offset)


@dataclass(frozen=True)
class CreateTable:
    table: Table
    position: Position


@dataclass(frozen=True)
class CreateView:
    """``CREATE VIEW name AS SELECT ...``: a named query, planned where a statement reads it."""

    name: str
    query: exp.Query = field(compare=False)
    offset: int
    position: Position


@dataclass(frozen=True)
class Insert:
    """``INSERT INTO sink SELECT ...``: ``query`` parsed, ``offset`` of its text in the script,
    ``normalized`` the statement as sqlglot prints it (the operator uids derive from it)."""

    sink: str
    query: exp.Query = field(compare=False)
    offset: int
    position: Position
    normalized: str


@dataclass(frozen=True)
class CreateFunction:
    """``CREATE [TEMPORARY [SYSTEM]] FUNCTION [IF NOT EXISTS] name AS 'module.attr' LANGUAGE PYTHON``;
    ``language`` JAVA (Flink's default, no LANGUAGE) or SCALA: a JVM class, which stands for the Python
    function given to the job under the same name (``functions=``, ``weir sql --functions``)."""

    name: str
    target: str
    position: Position
    language: str = "PYTHON"


@dataclass(frozen=True)
class SetOption:
    key: str
    value: str
    position: Position


@dataclass(frozen=True)
class Explain:
    inserts: tuple[Insert, ...]
    position: Position


@dataclass(frozen=True)
class StatementSet:
    inserts: tuple[Insert, ...]
    position: Position


Statement = CreateTable | CreateView | CreateFunction | Insert | SetOption | Explain | StatementSet


def _tokens(text: str) -> list[Token]:
    try:
        return list(_ScriptTokenizer().tokenize(text))
    except TokenError as exc:
        raise SqlError(f"the text does not tokenize: {str(exc).splitlines()[0]}") from None


def _split(tokens: Sequence[Token]) -> list[list[Token]]:
    """Statements: the tokens between top-level semicolons (a statement set's BEGIN ... END whole)."""
    statements: list[list[Token]] = []
    current: list[Token] = []
    in_set = False
    for token in tokens:
        if token.token_type is TokenType.SEMICOLON:
            if in_set and not (len(current) >= 1 and _word(current[-1]) == "END" and _is_set_end(current)):
                current.append(token)
                continue
            if current:
                statements.append(current)
            current, in_set = [], False
            continue
        current.append(token)
        words = [_word(t) for t in current[:4]]
        if words == ["EXECUTE", "STATEMENT", "SET", "BEGIN"] or words[:3] == ["BEGIN", "STATEMENT", "SET"]:
            in_set = True
    if current:
        statements.append(current)
    return statements


def _is_set_end(tokens: Sequence[Token]) -> bool:
    """The END closing a statement set: alone after the previous semicolon."""
    return len(tokens) == 1 or tokens[-2].token_type is TokenType.SEMICOLON


def _word(token: Token) -> str:
    return token.text.upper() if token.token_type is not TokenType.STRING else ""


def parse_script(script: str) -> tuple[Statement, ...]:
    """The script's statements, in order; an unsupported statement raises SqlError with its position."""
    text = Text(script)
    return tuple(_statement(text, tokens) for tokens in _split(_tokens(script)))


def _statement(text: Text, tokens: list[Token]) -> Statement:
    first = tokens[0]
    position = text.at(first.start)
    words = [_word(t) for t in tokens[:4]]
    match words[0]:
        case "CREATE":
            if words[1] == "TABLE":
                return CreateTable(_create_table(text, tokens), position)
            if words[1] == "VIEW" or words[1:3] == ["TEMPORARY", "VIEW"]:
                return _create_view(text, tokens)
            if "FUNCTION" in words[1:4]:
                return _create_function(text, tokens)
            raise SqlError(
                f"CREATE {tokens[1].text} is not supported (CREATE TABLE, VIEW and FUNCTION are)",
                text.at(tokens[1].start),
            )
        case "INSERT":
            return _insert(text, tokens)
        case "SET":
            return _set(text, tokens)
        case "EXPLAIN":
            rest = tokens[1:]
            if rest and [_word(t) for t in rest[:4]][:3] in (
                ["EXECUTE", "STATEMENT", "SET"],
                ["STATEMENT", "SET", "BEGIN"],
            ):
                skip = 4 if _word(rest[0]) == "EXECUTE" else 3
                return Explain(_set_body(text, rest, skip).inserts, position)
            if not rest or _word(rest[0]) != "INSERT":
                raise SqlError("EXPLAIN takes an INSERT INTO ... or a STATEMENT SET", position)
            return Explain((_insert(text, rest),), position)
        case "EXECUTE":
            if words[1:4] != ["STATEMENT", "SET", "BEGIN"]:
                raise SqlError("EXECUTE takes STATEMENT SET BEGIN ... END", position)
            return _set_body(text, tokens, 4)
        case "BEGIN":
            if words[1:3] != ["STATEMENT", "SET"]:
                raise SqlError("BEGIN takes STATEMENT SET; ... END", position)
            return _set_body(text, tokens, 3)
        case _:
            raise SqlError(f"statement {first.text} is not supported", position)


def _set_body(text: Text, tokens: list[Token], skip: int) -> StatementSet:
    body = tokens[skip:]
    if body and body[0].token_type is TokenType.SEMICOLON:
        body = body[1:]
    if not body or _word(body[-1]) != "END":
        raise SqlError("a STATEMENT SET ends with END", text.at(tokens[0].start))
    inserts = []
    for part in _split(body[:-1]):
        if _word(part[0]) != "INSERT":
            raise SqlError(f"a STATEMENT SET holds INSERT statements, not {part[0].text}", text.at(part[0].start))
        inserts.append(_insert(text, part))
    if not inserts:
        raise SqlError("a STATEMENT SET without an INSERT", text.at(tokens[0].start))
    return StatementSet(tuple(inserts), text.at(tokens[0].start))


def _set(text: Text, tokens: list[Token]) -> SetOption:
    position = text.at(tokens[0].start)
    if (
        len(tokens) != 4
        or tokens[1].token_type is not TokenType.STRING
        or tokens[2].token_type is not TokenType.EQ
        or tokens[3].token_type is not TokenType.STRING
    ):
        raise SqlError("SET takes 'key' = 'value'", position)
    return SetOption(tokens[1].text, tokens[3].text, position)


def _source_text(text: Text, tokens: Sequence[Token]) -> tuple[str, int]:
    """The statement's text and its offset, the TABLE keyword of a table argument (``TUMBLE(TABLE t, ...)``)
    blanked (same length, so positions hold): sqlglot reads ``TUMBLE(t, ...)``. A table argument's
    ``PARTITION BY keys`` (``SESSION(TABLE t PARTITION BY k, ...)``) becomes an argument of its own,
    ``_PARTITION = keys`` (:data:`PARTITION_MARK`), over the same characters."""
    start, end = tokens[0].start, tokens[-1].end + 1
    chars = list(text.script[start:end])
    for i, token in enumerate(tokens):
        if (
            token.token_type is TokenType.TABLE
            and 0 < i < len(tokens) - 1
            and tokens[i - 1].token_type in (TokenType.L_PAREN, TokenType.COMMA)
            and tokens[i + 1].token_type is not TokenType.L_PAREN
        ):
            chars[token.start - start : token.end + 1 - start] = " " * (token.end + 1 - token.start)
        if (
            token.token_type is TokenType.PARTITION_BY
            and i >= 3
            and tokens[i - 2].token_type is TokenType.TABLE
            and tokens[i - 3].token_type is TokenType.L_PAREN
        ):
            mark = f",{PARTITION_MARK}="
            chars[token.start - start : token.end + 1 - start] = mark.ljust(token.end + 1 - token.start)
    return "".join(chars), start


PARTITION_MARK: Final = "_PARTITION"
"""A table argument's ``PARTITION BY keys`` as sqlglot reads it: the argument ``_PARTITION = keys``."""


def parse_expression(text: Text, source: str, offset: int) -> exp.Expr:
    try:
        parsed = sqlglot.parse_one(source, read=DIALECT)
    except ParseError as exc:
        raise _parse_error(text, exc, offset) from None
    return parsed


def _parse_error(text: Text, exc: ParseError, offset: int) -> SqlError:
    first = exc.errors[0] if exc.errors else {}
    description = str(first.get("description") or exc).splitlines()[0]
    highlight = first.get("highlight")
    line, col = first.get("line"), first.get("col")
    position = None
    if isinstance(line, int) and isinstance(col, int):
        base = text.at(offset)
        position = Position(
            base.line + line - 1, (base.column - 1 if line == 1 else 0) + col - (len(highlight or "") - 1)
        )
    return SqlError(f"does not parse: {description}", position)


_TVFS = ("TUMBLE", "HOP", "CUMULATE", "SESSION")


def _create_view(text: Text, tokens: list[Token]) -> CreateView:
    position = text.at(tokens[0].start)
    i = 3 if _word(tokens[1]) == "TEMPORARY" else 2
    if [_word(t) for t in tokens[i : i + 3]] == ["IF", "NOT", "EXISTS"]:
        i += 3
    if i + 2 >= len(tokens) or _word(tokens[i + 1]) != "AS":
        raise SqlError("CREATE VIEW takes a name, AS and a SELECT (a column list is not supported)", position)
    _refuse_table_functions(text, tokens)
    body = tokens[i + 2 :]
    source, offset = _source_text(text, body)
    query = parse_expression(text, source, offset)
    if not isinstance(query, exp.Query):
        raise SqlError("CREATE VIEW ... AS takes a SELECT", text.at(body[0].start))
    return CreateView(tokens[i].text, query, offset, position)


def _create_function(text: Text, tokens: list[Token]) -> CreateFunction:
    position = text.at(tokens[0].start)
    words = [_word(t) for t in tokens]
    i = words.index("FUNCTION") + 1
    if words[1:i] not in (["FUNCTION"], ["TEMPORARY", "FUNCTION"], ["TEMPORARY", "SYSTEM", "FUNCTION"]):
        raise SqlError("CREATE [TEMPORARY [SYSTEM]] FUNCTION name AS 'module.attr' LANGUAGE PYTHON", position)
    if words[i : i + 3] == ["IF", "NOT", "EXISTS"]:
        i += 3
    shape = "CREATE FUNCTION name AS 'module.attr' LANGUAGE PYTHON"
    rest = tokens[i:]
    if len(rest) < 3 or _word(rest[1]) != "AS" or rest[2].token_type is not TokenType.STRING:
        raise SqlError(f"CREATE FUNCTION takes a name and AS 'module.attr' ({shape})", position)
    language = [_word(t) for t in rest[3:]]
    if language not in ([], ["LANGUAGE", "PYTHON"], ["LANGUAGE", "JAVA"], ["LANGUAGE", "SCALA"]):
        at = text.at(rest[3].start) if len(rest) > 3 else position
        raise SqlError(f"CREATE FUNCTION ends with LANGUAGE PYTHON | JAVA | SCALA ({shape})", at)
    return CreateFunction(rest[0].text, rest[2].text, position, language[1] if language else "JAVA")


def _refuse_table_functions(text: Text, tokens: list[Token]) -> None:
    for i in range(len(tokens) - 3):
        if (
            tokens[i].token_type is TokenType.TABLE
            and tokens[i + 1].token_type is TokenType.L_PAREN
            and tokens[i + 3].token_type is TokenType.L_PAREN
            and _word(tokens[i + 2]) not in _TVFS
        ):
            raise SqlError(
                f"table function {tokens[i + 2].text} is not supported ({', '.join(_TVFS)} are)",
                text.at(tokens[i + 2].start),
            )


def _insert(text: Text, tokens: list[Token]) -> Insert:
    _refuse_table_functions(text, tokens)
    source, offset = _source_text(text, tokens)
    parsed = parse_expression(text, source, offset)
    position = text.at(tokens[0].start)
    if not isinstance(parsed, exp.Insert):
        raise SqlError("not an INSERT INTO ... SELECT", position)
    if parsed.args.get("overwrite"):
        raise SqlError("INSERT OVERWRITE is not supported (a streaming sink is appended or upserted)", position)
    target = parsed.this
    if isinstance(target, exp.Schema):
        raise SqlError("INSERT INTO sink (columns) is not supported: the SELECT gives every column in order", position)
    if not isinstance(target, exp.Table) or not isinstance(target.this, exp.Identifier):
        raise SqlError("INSERT INTO takes a table name", position)
    query = parsed.expression
    if not isinstance(query, exp.Query):
        raise SqlError("INSERT INTO takes a SELECT", position)
    return Insert(target.name, query, offset, position, parsed.sql(dialect=DIALECT))


# -- CREATE TABLE -------------------------------------------------------------------------------

_WATERMARK = re.compile(r"(?is)^WATERMARK\s+FOR\s+")


def _create_table(text: Text, tokens: list[Token]) -> Table:
    position = text.at(tokens[0].start)
    i = 2
    if [_word(t) for t in tokens[2:5]] == ["IF", "NOT", "EXISTS"]:
        i = 5
    if i >= len(tokens):
        raise SqlError("CREATE TABLE without a name", position)
    name = tokens[i].text
    if i + 1 < len(tokens) and tokens[i + 1].token_type is TokenType.DOT:
        raise SqlError("a qualified table name (catalog.db.table) is not supported", text.at(tokens[i + 1].start))
    i += 1
    if i >= len(tokens) or tokens[i].token_type is not TokenType.L_PAREN:
        raise SqlError(f"CREATE TABLE {name} needs its column list", position)
    close = _matching(tokens, i)
    if close is None:
        raise SqlError(f"CREATE TABLE {name}: the column list is not closed", text.at(tokens[i].start))
    columns: list[Column] = []
    computed: list[ComputedColumn] = []
    watermark: Watermark | None = None
    primary_key: tuple[str, ...] = ()
    for element in _elements(tokens[i + 1 : close]):
        at = text.at(element[0].start)
        words = [_word(t) for t in element[:3]]
        source = text.script[element[0].start : element[-1].end + 1]
        if words[0] == "WATERMARK":
            if watermark is not None:
                raise SqlError(f"table {name}: a second WATERMARK", at)
            watermark = _watermark(text, name, element, at)
        elif words[0] == "PRIMARY KEY" or words[:2] == ["PRIMARY", "KEY"]:
            primary_key = _primary_key(text, name, element, at)
        elif any(_word(t) == "METADATA" for t in element):
            raise SqlError(f"table {name}: METADATA columns are not supported", at)
        elif words[0] in ("CONSTRAINT", "LIKE"):
            raise SqlError(f"table {name}: {element[0].text} is not supported", at)
        elif len(element) >= 2 and _word(element[1]) == "AS":
            body = element[2:]
            if not body:
                raise SqlError(f"table {name}: computed column {element[0].text} has no expression", at)
            expr_source = text.script[body[0].start : element[-1].end + 1]
            expression = parse_expression(text, expr_source, body[0].start)
            computed.append(ComputedColumn(element[0].text, expression, expr_source))
        else:
            columns.append(_column(text, name, element, source, at))
    if not columns:
        raise SqlError(f"table {name} has no physical column", position)
    rest: Sequence[Token] = tokens[close + 1 :]
    partition_by: tuple[str, ...] = ()
    if rest and _word(rest[0]).split() == ["PARTITIONED", "BY"]:  # sqlglot's one token
        partition_by, rest = _partitioned_by(text, name, rest)
    options, positions = _with_options(text, name, rest, text.at(tokens[close].start))
    connector = connector_of(name, options, positions, position)
    table = Table(
        name,
        tuple(columns),
        tuple(computed),
        watermark,
        primary_key,
        connector,
        tuple(options.items()),
        partition_by,
    )
    check_table(table, position, positions)
    return table


def _partitioned_by(text: Text, table: str, tokens: Sequence[Token]) -> tuple[tuple[str, ...], Sequence[Token]]:
    """``PARTITIONED BY (a, b)``'s column names, and the tokens after it."""
    if len(tokens) < 2 or tokens[1].token_type is not TokenType.L_PAREN:
        raise SqlError(f"table {table}: PARTITIONED BY takes (column, ...)", text.at(tokens[0].start))
    close = _matching(tokens, 1)
    if close is None:
        raise SqlError(f"table {table}: PARTITIONED BY ( is not closed", text.at(tokens[1].start))
    names = []
    for element in _elements(tokens[2:close]):
        if len(element) != 1:
            raise SqlError(f"table {table}: PARTITIONED BY takes column names", text.at(element[0].start))
        names.append(element[0].text)
    if not names:
        raise SqlError(f"table {table}: PARTITIONED BY takes (column, ...)", text.at(tokens[0].start))
    return tuple(names), tokens[close + 1 :]


def _matching(tokens: Sequence[Token], open_at: int) -> int | None:
    depth = 0
    for j in range(open_at, len(tokens)):
        if tokens[j].token_type is TokenType.L_PAREN:
            depth += 1
        elif tokens[j].token_type is TokenType.R_PAREN:
            depth -= 1
            if depth == 0:
                return j
    return None


def _elements(tokens: Sequence[Token]) -> list[list[Token]]:
    """The column list's elements: split at the commas outside parentheses."""
    elements: list[list[Token]] = [[]]
    depth = angle = 0
    previous = ""
    for token in tokens:
        if token.token_type is TokenType.L_PAREN:
            depth += 1
        elif token.token_type is TokenType.R_PAREN:
            depth -= 1
        elif token.token_type is TokenType.LT and (angle or previous in ("ARRAY", "MAP", "ROW", "MULTISET")):
            angle += 1
        elif token.token_type is TokenType.GT and angle:
            angle -= 1
        previous = _word(token)
        if token.token_type is TokenType.COMMA and depth == 0 and angle == 0:
            elements.append([])
        else:
            elements[-1].append(token)
    return [e for e in elements if e]


def _column(text: Text, table: str, element: list[Token], source: str, at: Position) -> Column:
    name = element[0].text
    if len(element) < 2:
        raise SqlError(f"table {table}: column {name} has no type", at)
    type_tokens = element[1:]
    tail = [_word(t) for t in type_tokens]
    if tail[-2:] == ["NOT", "NULL"]:
        type_tokens = type_tokens[:-2]
    elif tail[-1:] == ["NULL"]:
        type_tokens = type_tokens[:-1]
    if [_word(t) for t in type_tokens[-3:]] == ["WITH", "LOCAL", "TIME"] or "ZONE" in tail:
        type_tokens = [t for t in type_tokens if _word(t) not in ("WITH", "LOCAL", "TIME", "ZONE")]
        ltz = True
    else:
        ltz = False
    type_text = text.script[type_tokens[0].start : type_tokens[-1].end + 1] if type_tokens else ""
    if _word(type_tokens[0]) == "TIMESTAMP_LTZ" or ltz:
        type_text = "TIMESTAMP" + type_text[len(type_tokens[0].text) :]
    if _word(type_tokens[0]) == "STRING":
        type_text = "STRING"
    try:
        data_type = exp.DataType.build(type_text, dialect=DIALECT)
    except (ParseError, ValueError):
        raise SqlError(
            f"table {table}: column {name}: type {type_text} does not parse", text.at(type_tokens[0].start)
        ) from None
    sql_type = SqlType.of(data_type)
    if sql_type is None:
        raise SqlError(
            f"table {table}: column {name}: type {type_text} is not supported "
            "(BIGINT, INT, SMALLINT, TINYINT, DOUBLE, FLOAT, DECIMAL, STRING, VARCHAR, CHAR, BOOLEAN, TIMESTAMP)",
            text.at(type_tokens[0].start),
        )
    return Column(name, sql_type)


def _watermark(text: Text, table: str, element: list[Token], at: Position) -> Watermark:
    if len(element) < 4 or _word(element[1]) != "FOR" or _word(element[3]) != "AS":
        raise SqlError(f"table {table}: WATERMARK takes FOR column AS expression", at)
    column = element[2].text
    body = element[4:]
    if not body:
        raise SqlError(f"table {table}: WATERMARK FOR {column} has no expression", at)
    source = text.script[body[0].start : element[-1].end + 1]
    expression = parse_expression(text, source, body[0].start)
    match expression:
        case exp.Column() if expression.name == column:
            return Watermark(column, 0)
        case exp.Sub(this=exp.Column() as col, expression=exp.Interval() as interval) if col.name == column:
            delay = interval_ms(interval)
            if delay is not None and delay >= 0:
                return Watermark(column, delay)
    raise SqlError(
        f"table {table}: WATERMARK FOR {column} AS {source}: "
        f"only {column} or {column} - INTERVAL 'n' unit is supported",
        text.at(body[0].start),
    )


def _primary_key(text: Text, table: str, element: list[Token], at: Position) -> tuple[str, ...]:
    words = [_word(t) for t in element]
    if words[-2:] != ["NOT", "ENFORCED"]:
        raise SqlError(f"table {table}: PRIMARY KEY (...) must be NOT ENFORCED (Flink does not enforce it either)", at)
    inner = element[1 if _word(element[0]) == "PRIMARY KEY" else 2 : -2]
    if not inner or inner[0].token_type is not TokenType.L_PAREN or inner[-1].token_type is not TokenType.R_PAREN:
        raise SqlError(f"table {table}: PRIMARY KEY takes (columns)", at)
    names = [t.text for t in inner[1:-1] if t.token_type is not TokenType.COMMA]
    if not names:
        raise SqlError(f"table {table}: PRIMARY KEY () without a column", at)
    return tuple(names)


def _with_options(
    text: Text, table: str, tokens: Sequence[Token], at: Position
) -> tuple[dict[str, str], dict[str, Position]]:
    """The options and where each is written."""
    if not tokens:
        raise SqlError(f"table {table}: WITH ('connector' = ...) is required", at)
    if _word(tokens[0]) != "WITH" or len(tokens) < 3 or tokens[1].token_type is not TokenType.L_PAREN:
        raise SqlError(
            f"table {table}: {tokens[0].text} is not supported after the column list (WITH (...) is)",
            text.at(tokens[0].start),
        )
    close = _matching(tokens, 1)
    if close is None:
        raise SqlError(f"table {table}: WITH ( is not closed", text.at(tokens[1].start))
    if close != len(tokens) - 1:
        extra = tokens[close + 1]
        raise SqlError(f"table {table}: {extra.text} after WITH (...) is not supported", text.at(extra.start))
    options: dict[str, str] = {}
    positions: dict[str, Position] = {}
    for element in _elements(tokens[2:close]):
        if (
            len(element) != 3
            or element[0].token_type is not TokenType.STRING
            or element[1].token_type is not TokenType.EQ
            or element[2].token_type is not TokenType.STRING
        ):
            raise SqlError(f"table {table}: a WITH option is 'key' = 'value'", text.at(element[0].start))
        if element[0].text in options:
            raise SqlError(f"table {table}: option '{element[0].text}' is given twice", text.at(element[0].start))
        options[element[0].text] = element[2].text
        positions[element[0].text] = text.at(element[0].start)
    return options, positions


__all__ = [
    "CreateFunction",
    "CreateTable",
    "CreateView",
    "Explain",
    "Insert",
    "SetOption",
    "Statement",
    "StatementSet",
    "Text",
    "parse_expression",
    "parse_script",
]
