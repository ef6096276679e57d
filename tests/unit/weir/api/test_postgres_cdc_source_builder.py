"""The PostgreSQL CDC source's builder and env.from_postgres_cdc: options checked where given, the
descriptor, one reader."""

from __future__ import annotations

from typing import Any

import pytest

from weir.api import Environment, OptionError, PostgresCdcSource, PostgresCdcSourceSpec, SlotRetention
from weir.operators.cdc_source import PostgresCdcSourceOperator


def test_the_builder_makes_the_descriptor_with_the_slot_as_default_publication() -> None:
    source = PostgresCdcSource.builder().tables(["orders", "shop.items"]).slot_name("orders_cdc").build()
    assert source.descriptor() == PostgresCdcSourceSpec(("orders", "shop.items"), "orders_cdc", "orders_cdc", 1000)
    assert source.default_name() == "postgres-cdc:orders_cdc"
    assert isinstance(source.create_operator(), PostgresCdcSourceOperator)
    other = PostgresCdcSource.builder().tables(["t"]).slot_name("s").publication("p").max_changes_per_poll(10).build()
    assert other.descriptor() == PostgresCdcSourceSpec(("t",), "s", "p", 10)
    assert source.descriptor().chunk_size == 8096
    assert source.descriptor().slot_retention is SlotRetention.UNLESS_SAVEPOINT, "kept only at a stop's savepoint"
    chunked = PostgresCdcSource.builder().tables(["t"]).slot_name("s").chunk_size(50).slot_retention("keep").build()
    assert chunked.descriptor() == PostgresCdcSourceSpec(("t",), "s", "s", 1000, 50, SlotRetention.KEEP)
    env = Environment("j")
    env.from_postgres_cdc(["t"], uid="cdc", slot_name="s", chunk_size=7, slot_retention="always-drop")
    spec = env.graph.transformations["cdc"].source_spec
    assert spec == PostgresCdcSourceSpec(("t",), "s", "s", 1000, 7, SlotRetention.ALWAYS_DROP)


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("tables", [], "tables must be a non-empty list of table names, got []"),
        ("tables", "orders", "tables must be a non-empty list of table names, got 'orders'"),
        ("tables", [""], "tables must be a non-empty string, got ''"),
        ("slot_name", "Orders", "slot_name must be 1 to 63 lower-case letters, digits or underscores, got 'Orders'"),
        ("slot_name", "a-b", "slot_name must be 1 to 63 lower-case letters, digits or underscores, got 'a-b'"),
        ("slot_name", "x" * 64, "slot_name must be 1 to 63 lower-case letters"),
        ("publication", "", "publication must be a non-empty string, got ''"),
        ("max_changes_per_poll", 0, "max_changes_per_poll must be a positive int, got 0"),
        ("chunk_size", 0, "chunk_size must be a positive int, got 0"),
        ("chunk_size", 1.5, "chunk_size must be a positive int, got 1.5"),
        (
            "slot_retention",
            "drop",
            "slot_retention must be 'unless-savepoint' or 'always-drop' or 'keep', got 'drop'",
        ),
    ],
)
def test_a_refused_option_is_one_line_naming_it(option: str, value: Any, message: str) -> None:
    with pytest.raises(OptionError, match="^postgres cdc source: " + message.replace("[", r"\[").replace("]", r"\]")):
        getattr(PostgresCdcSource.builder(), option)(value)


@pytest.mark.parametrize(
    ("builder", "missing"),
    [
        (PostgresCdcSource.builder().slot_name("s"), "tables is not set: call .tables"),
        (PostgresCdcSource.builder().tables(["t"]), "slot_name is not set: call .slot_name"),
    ],
)
def test_a_missing_required_option_is_named(builder: Any, missing: str) -> None:
    with pytest.raises(OptionError, match=missing):
        builder.build()


def test_from_postgres_cdc_adds_one_reader_and_names_the_operator_in_errors() -> None:
    env = Environment("j", parallelism=4)
    env.from_postgres_cdc(["orders"], uid="cdc", slot_name="orders_cdc")
    t = env.graph.transformations["cdc"]
    assert t.parallelism == 1
    assert t.source_spec == PostgresCdcSourceSpec(("orders",), "orders_cdc", "orders_cdc", 1000)
    with pytest.raises(OptionError, match="^postgres cdc source 'bad': slot_name must be"):
        env.from_postgres_cdc(["orders"], uid="bad", slot_name="Bad")


def test_the_source_runs_at_parallelism_1_unless_a_parallel_snapshot_is_asked_for() -> None:
    source = PostgresCdcSource.builder().tables(["t"]).slot_name("s").build()
    env = Environment("j", parallelism=4)
    env.from_source(source, uid="one")
    env.from_source(source, uid="three", parallelism=3)
    env.from_postgres_cdc(["t"], uid="two", slot_name="s2", parallelism=2)
    parallelism = {uid: env.graph.transformations[uid].parallelism for uid in ("one", "three", "two")}
    assert parallelism == {"one": 1, "three": 3, "two": 2}
