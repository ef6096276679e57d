"""The Nexmark suite's q14-q17 and q20-q22 (bench/flink/src/main/resources/nexmark/qN.sql: the
suite's text, its sink a Kafka table) on Weir's streaming SQL in this process, each sink compared, as
a multiset of whole records, with the plain-Python query (weir.tools.nexmark_reference) over the same
generated events. q15-q17 are updating results (GROUP BY without a window, to an upsert sink): their
final table (each key's last update) is compared, and they emit one update per bid. q14's user
function ``count_char`` is weir.tools.nexmark_functions', given to the job by name (the script's
``CREATE FUNCTION count_char AS '<Java class>'`` stands for it)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.unit.weir.sql.test_nexmark_sql import CONFIG, EVENTS, script
from tests.unit.weir.tools.test_jobtest import no_services  # noqa: F401 (autouse: every client refused)
from weir import nexmark as nx
from weir.sql import plan_script
from weir.sql.errors import SqlError
from weir.tools import nexmark_reference as ref
from weir.tools.nexmark_functions import count_char

if TYPE_CHECKING:
    from weir.testing import RunJob

pytest_plugins = ["weir.testing"]

UPSERT_SINK = "'connector' = 'upsert-kafka', 'topic' = 'nexmark-out', 'key.format' = 'json', 'value.format' = 'json'"
KEYS = {"q15": ("day",), "q16": ("channel", "day"), "q17": ("auction", "day")}
LEAST = {"q14": 500, "q15": 1, "q16": 300, "q17": 150, "q20": 150, "q21": 2_000, "q22": 2_500}
"""Rows the reference gives, at least (an empty result would prove nothing)."""
FUNCTIONS = {"count_char": count_char}


def final_table(updates: Sequence[Mapping[str, Any]], key: tuple[str, ...]) -> list[Mapping[str, Any]]:
    """An upsert sink's table once every update is applied in order (each key's last row)."""
    table: dict[tuple[Any, ...], Mapping[str, Any]] = {}
    for row in updates:
        table[tuple(row[k] for k in key)] = row
    return list(table.values())


def run_query(
    tmp_path: Path, weir_job: RunJob, query: str, *, failures: bool = False, mini_batch: bool = False
) -> list[Any]:
    text = (MINI_BATCH if mini_batch else "") + script(query).replace("${UPSERT_SINK}", UPSERT_SINK)
    job = tmp_path / f"nexmark_{query}.py"
    job.write_text(
        "from weir.sql import sql\nfrom weir.tools.nexmark_functions import count_char\n\n"
        f"SCRIPT = {text!r}\n\n\ndef build(env):\n    sql(env, SCRIPT, functions={{'count_char': count_char}})\n"
    )
    run = weir_job(job, checkpoint_every=400)
    if failures:
        run.with_failures()
    (statement,) = plan_script(text, FUNCTIONS).inserts
    (sink,) = [uid for uid in run.sinks if uid.startswith(statement.uid_prefix + "-")]
    return run.sinks[sink]


@pytest.mark.parametrize("query", ["q14", "q20", "q21", "q22"])
def test_nexmark_query_equals_the_plain_python_query(tmp_path: Path, weir_job: RunJob, query: str) -> None:
    expected = ref.multiset(getattr(ref, query)([nx.event(n, CONFIG) for n in range(EVENTS)]))
    assert sum(expected.values()) >= LEAST[query]
    assert ref.multiset(run_query(tmp_path, weir_job, query)) == expected


@pytest.mark.parametrize("query", ["q15", "q16", "q17"])
def test_updating_nexmark_query_ends_as_the_plain_python_table(tmp_path: Path, weir_job: RunJob, query: str) -> None:
    events = [nx.event(n, CONFIG) for n in range(EVENTS)]
    expected = ref.multiset(getattr(ref, query)(events))
    assert sum(expected.values()) >= LEAST[query]
    updates = run_query(tmp_path, weir_job, query, failures=query == "q15")
    assert ref.multiset(final_table(updates, KEYS[query])) == expected
    # each update is the group's row after one more of its bids: as many updates as bids
    assert len(updates) == len(ref.bids(events))


MINI_BATCH = (
    "SET 'table.exec.mini-batch.enabled' = 'true';\nSET 'table.exec.mini-batch.allow-latency' = '1 s';\n"
    "SET 'table.exec.mini-batch.size' = '50';\n"
)


@pytest.mark.parametrize("query", ["q15", "q16", "q17"])
def test_updating_nexmark_query_in_mini_batches_ends_as_the_plain_python_table(
    tmp_path: Path, weir_job: RunJob, query: str
) -> None:
    events = [nx.event(n, CONFIG) for n in range(EVENTS)]
    expected = ref.multiset(getattr(ref, query)(events))
    updates = run_query(tmp_path, weir_job, query, failures=query == "q15", mini_batch=True)
    assert ref.multiset(final_table(updates, KEYS[query])) == expected
    # one update per key and batch (of 50 bids at most: a checkpoint every 400 records cuts batches too),
    # not one per bid; q15's one day: one update per batch
    assert len(expected) <= len(updates) < len(ref.bids(events))
    if query == "q15":
        assert len(updates) <= len(ref.bids(events)) // 50 + EVENTS // 400 + 1


def test_q14_without_a_python_count_char_is_refused_at_its_create_function() -> None:
    text = script("q14")
    line = text[: text.index("CREATE FUNCTION count_char")].count("\n") + 1
    with pytest.raises(SqlError, match=rf"^SQL {line}:1: CREATE FUNCTION count_char: JAVA classes do not run"):
        plan_script(text)
