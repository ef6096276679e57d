"""'format' = 'debezium-json' on Weir and on Apache Flink 2.2.1 over the same Debezium topic: the
change envelopes a Debezium connector writes of a table of accounts (snapshot reads ``r``, inserts
``c``, updates ``u`` with their old row, deletes ``d`` each followed by a tombstone, keys deleted and
inserted again), keyed by ``{"id": n}``, in ``<events topic>-debezium``. Two statements of
bench/flink/src/main/resources/nexmark/, in one job on each side (Flink's of ``weir.bench.NexmarkSql``,
without mini-batch so that it emits every change as Weir does): ``debezium_group_by.sql`` (a GROUP BY
over the Debezium table, read as a changelog, into upsert-kafka) and ``debezium_sink.sql`` (the same
updating GROUP BY written as Debezium envelopes into an append-only topic of one partition).

Compared: the upsert-kafka topics compacted by key (read_committed, offset order, a tombstone
deleting its key) as final tables, each equal to the other's and to plain Python's over the final
source table; the debezium-json topics as multisets of whole records, byte for byte, each equal to
the other's and to the changelog plain Python derives as Flink's GroupAggFunction emits it; and the
debezium-json topic folded in offset order (an owner's changes come from one subtask, in order)
equal to Python's final table."""

from __future__ import annotations

import json
import uuid
from collections import Counter
from collections.abc import Iterable
from typing import Any

import pytest

from tests.integration.conftest import WeirCluster
from tests.integration.sql.side_by_side import NO_RETENTION, flink_build, load_nexmark_topic, run_on_both_sides
from tests.unit.weir.sql.test_debezium import history
from weir import nexmark as nx
from weir.connectors import kafka

pytestmark = pytest.mark.integration

QUERIES = ("debezium_group_by", "debezium_sink")
CONFIG = nx.NexmarkConfig(events_per_second=500)

Row = tuple[str, int, int]  # owner, accounts, total


def source_changes(values: Iterable[bytes]) -> list[tuple[bool, dict[str, Any]]]:
    """The Debezium envelopes as (adds, row) in order, as Flink's format reads them: r/c add the new
    row, u retracts the old and adds the new, d retracts the old, a tombstone nothing."""
    out: list[tuple[bool, dict[str, Any]]] = []
    for value in values:
        if not value:
            continue
        envelope = json.loads(value)
        if envelope["op"] in ("u", "d"):
            out.append((False, envelope["before"]))
        if envelope["op"] in ("r", "c", "u"):
            out.append((True, envelope["after"]))
    return out


def group_changelog(changes: list[tuple[bool, dict[str, Any]]]) -> list[tuple[str, Row]]:
    """``GROUP BY owner`` with COUNT(*) and SUM(balance) over the changelog, each change as Flink's
    GroupAggFunction emits it (UPDATE_BEFORE generated: the sink takes it): +I of a new owner's row,
    -U of the old row and +U of the new one when it changes (nothing when it does not), -D of the
    last row when the owner's last account leaves."""
    groups: dict[str, tuple[int, int]] = {}
    emitted: dict[str, Row] = {}
    out: list[tuple[str, Row]] = []
    for adds, row in changes:
        owner = row["owner"]
        count, total = groups.get(owner, (0, 0))
        count, total = (count + 1, total + row["balance"]) if adds else (count - 1, total - row["balance"])
        groups[owner] = (count, total)
        if count == 0:
            del groups[owner]
            out.append(("-D", emitted.pop(owner)))
            continue
        new = (owner, count, total)
        old = emitted.get(owner)
        if old is None:
            out.append(("+I", new))
        elif old != new:
            out.extend([("-U", old), ("+U", new)])
        emitted[owner] = new
    return out


def debezium_bytes(kind: str, row: Row) -> bytes:
    """Flink's DebeziumJsonSerializationSchema's record of a change (its JSON format's row object)."""
    body = json.dumps({"owner": row[0], "accounts": row[1], "total": row[2]}, separators=(",", ":"))
    if kind in ("+I", "+U"):
        return f'{{"before":null,"after":{body},"op":"c"}}'.encode()
    return f'{{"before":{body},"after":null,"op":"d"}}'.encode()


def compacted(endpoints: Any, topic: str) -> Counter[Row]:
    table: dict[bytes, Row] = {}
    for _p, _o, key, value in sorted(kafka.read_all(endpoints, topic)):
        assert key is not None, f"{topic}: a record without a key"
        if value is None:
            table.pop(key, None)
            continue
        row = json.loads(value)
        table[key] = (row["owner"], row["accounts"], row["total"])
    return Counter(table.values())


def folded(values: list[bytes]) -> Counter[Row]:
    """A debezium-json topic's records in offset order applied to a table keyed by owner."""
    table: dict[str, Row] = {}
    for value in values:
        envelope = json.loads(value)
        match envelope["op"]:
            case "c":
                after = envelope["after"]
                table[after["owner"]] = (after["owner"], after["accounts"], after["total"])
            case "d":
                before = envelope["before"]
                assert table.pop(before["owner"]) == (before["owner"], before["accounts"], before["total"])
            case other:
                raise AssertionError(f"Flink's debezium-json writes op c or d, not {other!r}")
    return Counter(table.values())


def test_weir_reads_and_writes_debezium_json_as_flink_does(
    weir_cluster: WeirCluster, tmp_path_factory: pytest.TempPathFactory
) -> None:
    build = flink_build()
    endpoints = weir_cluster.endpoints
    work = tmp_path_factory.mktemp("debezium-vs-flink")
    topic = f"sql-debezium-vs-flink-{uuid.uuid4().hex[:8]}"
    load_nexmark_topic(endpoints, topic, 1, 100, CONFIG)  # the runner's events table (not read here)
    values, final = history(seed=7, steps=1500)
    assert kafka.create_topic(endpoints, f"{topic}-debezium", 1, 1, NO_RETENTION)
    producer = kafka.producer(endpoints, linger_ms=5, enable_idempotence=True)
    key = None
    for value in values:
        if value:  # a tombstone follows its delete: the key of the record before it
            envelope = json.loads(value)
            key = (envelope["after"] or envelope["before"])["id"]
        producer.produce(f"{topic}-debezium", key=json.dumps({"id": key}).encode(), value=value or None)
    assert producer.flush(30) == 0
    kinds = Counter(json.loads(v)["op"] if v else "tombstone" for v in values)
    assert all(kinds[k] >= 10 for k in ("r", "c", "u", "d", "tombstone")), kinds

    changes = source_changes(values)
    owners: dict[str, list[int]] = {}
    for row in final.values():
        owners.setdefault(row["owner"], []).append(row["balance"])
    want_table = Counter((o, len(b), sum(b)) for o, b in owners.items())
    want_changelog = group_changelog(changes)
    assert any(kind == "-D" for kind, _ in want_changelog), "an owner's last account leaves"
    weir_out, flink_out = f"{topic}-weir", f"{topic}-flink"
    for prefix in (weir_out, flink_out):
        assert kafka.create_topic(endpoints, f"{prefix}-debezium_group_by", 2, 1, NO_RETENTION)
        assert kafka.create_topic(endpoints, f"{prefix}-debezium_sink", 1, 1, NO_RETENTION)
    run_on_both_sides(
        weir_cluster, build, work, queries=QUERIES, topic=topic, weir_out=weir_out, flink_out=flink_out,
        job_name="debezium_sql", mini_batch=False,
    )  # fmt: skip

    weir_table = compacted(endpoints, f"{weir_out}-debezium_group_by")
    assert weir_table == compacted(endpoints, f"{flink_out}-debezium_group_by"), "Weir's table is not Flink's"
    assert weir_table == want_table, "the final tables are not Python's"

    written = {}
    for side, prefix in (("weir", weir_out), ("flink", flink_out)):
        records = sorted(kafka.read_all(endpoints, f"{prefix}-debezium_sink"))
        assert all(key is None and value is not None for _p, _o, key, value in records), side
        written[side] = [value for _p, _o, _k, value in records if value is not None]
    assert Counter(written["weir"]) == Counter(written["flink"]), "Weir's records are not Flink's, byte for byte"
    assert Counter(written["weir"]) == Counter(debezium_bytes(k, r) for k, r in want_changelog)
    assert folded(written["weir"]) == want_table == folded(written["flink"])
