"""The versioned SQL operator state (docs/formats.md, "SQL operator state") through a real savepoint:
an aggregation of an updating aggregation (two ``changelog-aggregate`` operators, value state
``group`` as ``(1, (rows, accumulators, emitted))``) stopped with a savepoint mid-input and
resubmitted from it on the session cluster; the PostgreSQL table ends equal to plain Python's over
the whole input, which it cannot unless both operators restored their keys' state. Then a regular
join's state written in the layout before ``changelog-join`` format 2, restored by this Weir."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import psycopg
import pytest

from tests.integration.conftest import WeirCluster, create_topics
from tests.integration.sql.resume import stop_and_resume
from weir.connectors import kafka
from weir.tools.cli import sql_job_source
from weir.tools.savepoint_inspect import dump_operator, load_savepoint

pytestmark = pytest.mark.integration

ROWS = 1_500
"""Read at 120 a second (12.5 s): the first job stops after three checkpoints of 500 ms, a few seconds in,
with most of the input still unread (its test asserts it)."""


def script(source: str, table: str) -> str:
    return f"""
CREATE TABLE orders (id BIGINT, u STRING)
  WITH ('connector' = 'kafka', 'topic' = '{source}', 'format' = 'json', 'scan.startup.mode' = 'earliest-offset',
        'scan.bounded.mode' = 'latest-offset', 'scan.records-per-second' = '120');
CREATE TABLE per_count (n BIGINT, users BIGINT, PRIMARY KEY (n) NOT ENFORCED)
  WITH ('connector' = 'jdbc', 'url' = 'jdbc:postgresql://127.0.0.1:15432/weir', 'table-name' = '{table}');
INSERT INTO per_count
SELECT n, COUNT(*) FROM (SELECT u, COUNT(*) AS n FROM orders GROUP BY u) AS q GROUP BY n;
"""


def test_a_changelog_aggregates_state_restores_from_a_savepoint(
    weir_cluster: WeirCluster, unique: str, tmp_path: Path
) -> None:
    endpoints = weir_cluster.endpoints
    source, table = f"sql-state-orders-{unique}", f"sql_state_per_count_{unique}"
    create_topics(endpoints, {source: 2})
    with psycopg.connect(endpoints.postgres_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table} (n bigint PRIMARY KEY, users bigint)")
    producer = kafka.producer(endpoints, enable_idempotence=True)
    users = [f"u{(i * 7919) % 97 % (1 + i % 31)}" for i in range(ROWS)]
    for i, user in enumerate(users):
        producer.produce(source, json.dumps({"id": i, "u": user}).encode(), partition=i % 2)
    assert producer.flush(60) == 0
    per_user = Counter(users)
    expected = set(Counter(per_user.values()).items())
    assert len(expected) > 5

    text = script(source, table)
    resumed = stop_and_resume(
        weir_cluster,
        sql_job_source(text),
        sql_job_source(text),
        tmp_path,
        f"state_{unique}",
        f"SELECT n, users FROM {table}",
        endpoints.postgres_dsn,
    )
    assert resumed.at_stop and set(resumed.at_stop) != expected, "the first job had read everything: nothing to restore"
    # a job that started over (no state) would count only the rows after the savepoint
    assert resumed.at_end == Counter(expected)


PREVIOUS_LAYOUT_JOB = '''"""The SQL job below with its changelog-join writing the state layout of Weir before
format 2: each side's rows of a key in one value state (``left``, ``right``), ``(1, [(row, count,
associations), ...])``."""

from weir.sql import compile as _compile
from weir.sql import sql
from weir.sql.changelog import Change, RowKind, accumulates
from weir.sql.changelog_join import ChangelogJoin, JoinedChange, JoinSide, held_of, join_change


class PreviousLayoutJoin(ChangelogJoin):
    def _apply(self, side, value, ctx, out):
        change = value if self._of(self.changelogs, side) else Change(RowKind.INSERT, value)
        own_outer, other_outer = self._of(self.outer, side), self._of(self.outer, side.other)
        if None in ctx.key:
            if own_outer:
                kind = RowKind.INSERT if accumulates(change.kind) else RowKind.DELETE
                pair = (change.row, None) if side is JoinSide.LEFT else (None, change.row)
                self._emit((JoinedChange(kind, *pair),), out)
            return
        states = {s: ctx.value_state(s.value, self.ttl) for s in JoinSide}
        own, other = held_of(states[side].value()), held_of(states[side.other].value())
        step = join_change(side, change, own, other, own_outer=own_outer, other_outer=other_outer)
        self._emit(step.out, out)
        for s, held in ((side, step.own), (side.other, step.other)):
            if held:
                states[s].update((1, [(dict(e.row), e.count, e.associations) for e in held]))
            else:
                states[s].clear()


SCRIPT = {script!r}


def build(env):
    # the JobManager builds jobs in its own process: the previous join only while this one is built
    current, _compile.ChangelogJoin = _compile.ChangelogJoin, PreviousLayoutJoin
    try:
        sql(env, SCRIPT)
    finally:
        _compile.ChangelogJoin = current
'''


def join_script(source: str, table: str) -> str:
    """Each order with its user's order count so far: a LEFT JOIN of an append input (rows kept by row,
    a user's orders a hot key) with a GROUP BY result (one row per join key)."""
    return f"""
CREATE TABLE orders (id BIGINT, u STRING)
  WITH ('connector' = 'kafka', 'topic' = '{source}', 'format' = 'json', 'scan.startup.mode' = 'earliest-offset',
        'scan.bounded.mode' = 'latest-offset', 'scan.records-per-second' = '120');
CREATE TABLE per_order (id BIGINT, u STRING, n BIGINT, PRIMARY KEY (id) NOT ENFORCED)
  WITH ('connector' = 'jdbc', 'url' = 'jdbc:postgresql://127.0.0.1:15432/weir', 'table-name' = '{table}');
INSERT INTO per_order
SELECT O.id, O.u, C.n FROM orders AS O
LEFT JOIN (SELECT u, COUNT(*) AS n FROM orders GROUP BY u) AS C ON O.u = C.u;
"""


def test_a_changelog_join_s_state_of_the_previous_layout_restores_from_a_savepoint(
    weir_cluster: WeirCluster, unique: str, tmp_path: Path
) -> None:
    """The first job writes the join's state as Weir did before format 2 (value states ``left`` and
    ``right``, seen in its savepoint); the same SQL resumed from the savepoint with this Weir's join
    rewrites each key at its first change: every order's row ends with its user's final count, which
    it cannot unless the orders held before the savepoint were read from the previous layout."""
    endpoints = weir_cluster.endpoints
    source, table = f"sql-join-state-{unique}", f"sql_join_state_{unique}"
    create_topics(endpoints, {source: 2})
    with psycopg.connect(endpoints.postgres_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table} (id bigint PRIMARY KEY, u text, n bigint)")
    producer = kafka.producer(endpoints, enable_idempotence=True)
    users = [f"u{(i * 7919) % 13}" for i in range(ROWS)]
    for i, user in enumerate(users):
        producer.produce(source, json.dumps({"id": i, "u": user}).encode(), partition=i % 2)
    assert producer.flush(60) == 0
    per_user = Counter(users)
    expected = {(i, u, per_user[u]) for i, u in enumerate(users)}

    text = join_script(source, table)
    resumed = stop_and_resume(
        weir_cluster,
        PREVIOUS_LAYOUT_JOB.replace("{script!r}", repr(text)),
        sql_job_source(text),
        tmp_path,
        f"join_{unique}",
        f"SELECT id, u, n FROM {table}",
        endpoints.postgres_dsn,
    )
    join_uid = next(
        u for u in load_savepoint(resumed.savepoint, endpoints).operator_uids() if u.endswith("-changelog-join")
    )
    states = Counter(line["state"] for line in dump_operator(resumed.savepoint, join_uid, endpoints=endpoints))
    assert set(states) == {"left", "right"}, states  # the previous layout, one value per side and key
    assert resumed.at_stop and set(resumed.at_stop) != expected, "the first job had read everything: nothing to restore"
    # an order held before the savepoint but not read would keep an old count
    assert resumed.at_end == Counter(expected)
