"""Column values between JSON and the types a SQL column holds (weir.sql.types)."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from typing import Any

import pytest

from weir.sql.types import Kind, coerce, parse_timestamp, timestamp_text, to_json


@pytest.mark.parametrize(
    ("value", "kind", "held"),
    [
        (7, Kind.INTEGER, 7),
        ("7", Kind.INTEGER, 7),
        (7.0, Kind.INTEGER, 7),
        (Decimal("7"), Kind.INTEGER, 7),
        (1.5, Kind.DOUBLE, 1.5),
        (2, Kind.DOUBLE, 2.0),
        ("2.5", Kind.DOUBLE, 2.5),
        ("x", Kind.STRING, "x"),
        (3, Kind.STRING, "3"),
        (True, Kind.BOOLEAN, True),
        ("FALSE", Kind.BOOLEAN, False),
        (1_700_000_000_123, Kind.TIMESTAMP, 1_700_000_000_123),
        ("2023-11-14 22:13:20.123", Kind.TIMESTAMP, 1_700_000_000_123),
        (None, Kind.INTEGER, None),
    ],
)
def test_a_value_is_held_as_its_column_s_type(value: Any, kind: Kind, held: Any) -> None:
    got = coerce(value, kind)
    assert got == held and type(got) is type(held)


@pytest.mark.parametrize(
    ("value", "kind"),
    [
        (True, Kind.INTEGER),  # a bool is an int to Python, not to SQL
        (7.5, Kind.INTEGER),
        ("seven", Kind.INTEGER),
        (False, Kind.DOUBLE),
        ([1], Kind.DOUBLE),
        (1, Kind.BOOLEAN),
        ("yes", Kind.BOOLEAN),
        (True, Kind.TIMESTAMP),
        (1.5, Kind.TIMESTAMP),
    ],
)
def test_a_value_of_another_type_is_refused(value: Any, kind: Kind) -> None:
    with pytest.raises(ValueError, match="not a"):
        coerce(value, kind)


def test_json_writes_each_type_as_flink_s_json_format_does() -> None:
    assert to_json(1_700_000_000_123, Kind.TIMESTAMP) == "2023-11-14 22:13:20.123"
    assert to_json(7, Kind.INTEGER) == 7 and type(to_json(7.0, Kind.INTEGER)) is int
    assert to_json(2, Kind.DOUBLE) == 2.0 and type(to_json(2, Kind.DOUBLE)) is float
    assert to_json("x", Kind.STRING) == "x" and to_json(None, Kind.TIMESTAMP) is None


def test_a_remembered_timestamp_text_is_the_instant_s_text() -> None:
    epoch = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
    for ms in (*range(1_700_000_000_000, 1_700_000_020_000, 7), -1, 0, 86_399_999, 253_402_300_799_999):
        moment = epoch + dt.timedelta(milliseconds=ms)
        text = timestamp_text(ms)
        assert text == moment.strftime("%Y-%m-%d %H:%M:%S.") + f"{ms % 1000:03d}", ms
        assert timestamp_text(ms) == text and parse_timestamp(text) == ms
