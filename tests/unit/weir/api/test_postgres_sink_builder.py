"""The PostgreSQL sinks' builder: two-phase (the default) or upsert, the columns checked where they are
given and against each other at build(), and ``sink_to_postgres`` as that builder."""

from __future__ import annotations

from typing import Any

import pytest

from weir.api import ColumnValues, DeadLetterOnError, Environment, OptionError, PostgresSink
from weir.core.descriptors import SinkDelivery, SinkSpec, SinkSystem
from weir.operators.sinks import PostgresUpsertSinkOperator
from weir.operators.transactional_sinks import TwoPhasePostgresSinkOperator

DLQ = DeadLetterOnError("dlq")


def row_of(value: dict[str, Any]) -> tuple[Any, ...]:
    return value["id"], value["total"], value["version"]


def test_two_phase_is_the_default_and_the_row_defaults_to_the_columns() -> None:
    sink = PostgresSink.builder().table("totals").columns(["id", "total"]).key_columns(("id",)).build()
    assert (sink.table, sink.columns, sink.key_columns, sink.delivery, sink.version_column) == (
        "totals",
        ("id", "total"),
        ("id",),
        "two_phase",
        None,
    )
    assert isinstance(sink.row, ColumnValues) and sink.row({"total": 5, "id": 1}) == (1, 5)
    assert sink.descriptor() == SinkSpec(SinkSystem.POSTGRES, "totals", SinkDelivery.EXACTLY_ONCE)
    assert sink.default_name() == "postgres-sink:totals"


@pytest.mark.parametrize(
    ("delivery", "operator", "guarantee"),
    [
        ("two_phase", TwoPhasePostgresSinkOperator, SinkDelivery.EXACTLY_ONCE),
        ("upsert", PostgresUpsertSinkOperator, SinkDelivery.AT_LEAST_ONCE),
    ],
)
def test_delivery_chooses_the_operator(delivery: Any, operator: type, guarantee: SinkDelivery) -> None:
    sink = (
        PostgresSink.builder()
        .table("totals")
        .columns(("id", "total", "version"))
        .key_columns(("id",))
        .row(row_of)
        .version_column("version")
        .delivery(delivery)
        .build()
    )
    env = Environment("j")
    env.from_collection([], uid="src").key_by("id").sink_to(sink, uid="pg", on_error=DLQ)
    t = env.graph.transformations["pg"]
    built = t.factory()
    assert isinstance(built, operator) and built.on_error == DLQ
    assert t.sink_spec is not None and t.sink_spec.delivery is guarantee


@pytest.mark.parametrize(
    ("option", "value", "complaint"),
    [
        ("table", "", "postgres sink: table must be a non-empty string, got ''"),
        (
            "columns",
            "id",
            "postgres sink: columns must be a non-empty sequence of column names, e.g. ('id', 'total'), got 'id'",
        ),
        (
            "columns",
            (),
            "postgres sink: columns must be a non-empty sequence of column names, e.g. ('id', 'total'), got ()",
        ),
        ("columns", ("id", 3), "postgres sink: columns must be a sequence of non-empty column names, got ('id', 3)"),
        ("columns", ("id", "id"), "postgres sink: columns must be distinct column names, got ('id', 'id')"),
        (
            "key_columns",
            "id",
            "postgres sink: key_columns must be a non-empty sequence of column names, e.g. ('id', 'total'), got 'id'",
        ),
        ("row", ("id",), "postgres sink: row must be a function or None, got ('id',)"),
        ("delivery", "2pc", "postgres sink: delivery must be 'two_phase' or 'upsert', got '2pc'"),
        ("version_column", 1, "postgres sink: version_column must be a non-empty string, got 1"),
    ],
)
def test_a_bad_option_is_refused_where_it_is_given_in_one_line(option: str, value: object, complaint: str) -> None:
    with pytest.raises(OptionError) as refused:
        getattr(PostgresSink.builder(), option)(value)
    assert str(refused.value) == complaint


@pytest.mark.parametrize(
    ("build", "complaint"),
    [
        (
            lambda b: b.columns(("id",)).key_columns(("id",)),
            "postgres sink: table is not set: give the table to write (.table(name))",
        ),
        (
            lambda b: b.table("t").key_columns(("id",)),
            "postgres sink: columns is not set: give the columns a row fills (.columns([...]))",
        ),
        (
            lambda b: b.table("t").columns(("id",)),
            "postgres sink: key_columns is not set: give the table's key (.key_columns([...]))",
        ),
        (
            lambda b: b.table("t").columns(("id", "total")).key_columns(("id", "day")),
            "postgres sink: key_columns ['id', 'day'] must be among the columns ['id', 'total']; missing: ['day']",
        ),
        (
            lambda b: b.table("t").columns(("id",)).key_columns(("id",)).version_column("v"),
            "postgres sink: version_column 'v' is missing from the columns ['id']",
        ),
    ],
)
def test_columns_that_do_not_go_together_are_refused_at_build(build: Any, complaint: str) -> None:
    with pytest.raises(OptionError) as refused:
        build(PostgresSink.builder()).build()
    assert str(refused.value) == complaint


def test_sink_to_postgres_names_the_operator() -> None:
    env = Environment("j")
    source = env.from_collection([], uid="src")
    with pytest.raises(OptionError) as refused:
        source.sink_to_postgres("t", uid="pg", columns="id", key_columns=("id",))  # type: ignore[arg-type]
    assert str(refused.value).startswith("postgres sink 'pg': columns must be a non-empty sequence of column names")
    assert "pg" not in env.graph.transformations
