"""The Nexmark suite's SQL text (bench/flink/src/main/resources/nexmark/qN.sql, the queries Weir's
Flink benchmark runs) on Weir's streaming SQL, unmodified: only the DDL's connector options differ
(examples/sql/nexmark-ddl.sql with the 'nexmark' generator). Each runs in this process and its sink
is compared, as a multiset of whole records, with the plain-Python query (weir.tools.nexmark_reference)
over the same generated events."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.unit.weir.tools.test_jobtest import no_services  # noqa: F401 (autouse: every client refused)
from weir import nexmark as nx
from weir.sql import plan_script
from weir.tools import nexmark_reference as ref

if TYPE_CHECKING:
    from weir.testing import RunJob

pytest_plugins = ["weir.testing"]

ROOT = Path(__file__).resolve().parents[4]
QUERIES = ROOT / "bench/flink/src/main/resources/nexmark"
EVENTS = 3_000
CONFIG = nx.NexmarkConfig(events_per_second=100)  # 30 s of event time: 3 tumbling windows of 10 s
LEAST = {"q0": 2_000, "q1": 2_000, "q2": 3, "q3": 5, "q5": 10, "q7": 3, "q8": 5, "q11": 20}
"""Rows the reference gives, at least (an empty result would prove nothing)."""
SINK = "'connector' = 'kafka', 'topic' = 'nexmark-out', 'format' = 'json', 'sink.delivery-guarantee' = 'exactly-once'"


def script(query: str) -> str:
    ddl = (ROOT / "examples/sql/nexmark-ddl.sql").read_text()
    ddl = ddl.replace("'events.num' = '100000'", f"'events.num' = '{EVENTS}'")
    ddl = ddl.replace("'first-event.rate' = '10000'", f"'first-event.rate' = '{CONFIG.events_per_second}'")
    text = (QUERIES / f"{query}.sql").read_text()
    return ddl + "\n" + text.replace("${SINK}", SINK)


def test_the_query_files_are_the_reference_text() -> None:
    q2 = (QUERIES / "q2.sql").read_text()
    assert "SELECT auction, price FROM bid WHERE MOD(auction, 123) = 0;" in q2


@pytest.mark.parametrize("query", ["q0", "q1", "q2", "q3", "q5", "q7", "q8", "q11"])
def test_nexmark_query_equals_the_plain_python_query(tmp_path: Path, weir_job: RunJob, query: str) -> None:
    text = script(query)
    job = tmp_path / f"nexmark_{query}.py"
    job.write_text(f"from weir.sql import sql\n\nSCRIPT = {text!r}\n\n\ndef build(env):\n    sql(env, SCRIPT)\n")
    run = weir_job(job)
    (statement,) = plan_script(text).inserts
    (sink,) = [uid for uid in run.sinks if uid.startswith(statement.uid_prefix + "-")]
    expected = ref.multiset(getattr(ref, query)([nx.event(n, CONFIG) for n in range(EVENTS)]))
    assert sum(expected.values()) >= LEAST[query]
    assert ref.multiset(run.sinks[sink]) == expected
