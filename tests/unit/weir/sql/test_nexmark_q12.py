"""Nexmark q12 (processing-time windows: each bidder's bids per 10 s of the wall clock) with the suite's
text, in this process under ``weir test``'s virtual processing time, which advances a fixed step per
source record: the window a bid falls in is known, so the output is compared record for record with
plain Python's counts by that clock. (On a cluster the output depends on the wall clock:
tests/integration/sql/test_nexmark_q12.py compares invariants with Flink's.)"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.unit.weir.sql.test_nexmark_sql import CONFIG, EVENTS, script
from tests.unit.weir.tools.test_jobtest import no_services  # noqa: F401 (autouse: every client refused)
from weir import nexmark as nx
from weir.sql import explain, plan_script
from weir.sql.errors import SqlError
from weir.tools.jobtest import VIRTUAL_EPOCH_MS

if TYPE_CHECKING:
    from weir.testing import RunJob

pytest_plugins = ["weir.testing"]

WINDOW_MS = 10_000


@pytest.mark.parametrize("ms_per_record", [20, 7])
def test_nexmark_q12_counts_each_bidders_bids_per_window_of_processing_time(
    tmp_path: Path, weir_job: RunJob, ms_per_record: int
) -> None:
    text = script("q12")
    job = tmp_path / "nexmark_q12.py"
    job.write_text(f"from weir.sql import sql\n\nSCRIPT = {text!r}\n\n\ndef build(env):\n    sql(env, SCRIPT)\n")
    run = weir_job(job, ms_per_record=ms_per_record)
    (statement,) = plan_script(text).inserts
    (sink,) = [uid for uid in run.sinks if uid.startswith(statement.uid_prefix + "-")]
    end = VIRTUAL_EPOCH_MS + EVENTS * ms_per_record  # the clock after the last event
    expected: Counter[tuple[int, int, int, int]] = Counter()
    per_window: Counter[tuple[int, int]] = Counter()
    for n in range(EVENTS):
        event = nx.event(n, CONFIG)
        if isinstance(event, nx.Bid):
            at = VIRTUAL_EPOCH_MS + n * ms_per_record  # event n is read at this processing time
            start = at - at % WINDOW_MS
            if start + WINDOW_MS <= end:  # its window fired before the end of input (a later one never fires)
                per_window[(event.bidder, start)] += 1
    for (bidder, start), count in per_window.items():
        expected[(bidder, count, start, start + WINDOW_MS)] += 1
    got = Counter((r["bidder"], r["bid_count"], r["starttime"], r["endtime"]) for r in run.sinks[sink])
    assert len({start for _b, _c, start, _e in expected}) >= 2
    assert got == expected


def test_explain_says_the_window_is_of_processing_time() -> None:
    text = explain(script("q12"))
    assert "window-aggregate: TUMBLE 10000 ms of processing time, GROUP BY bidder: COUNT(*)" in text, text


def test_a_processing_time_window_s_result_has_no_event_time_for_another_window() -> None:
    text = script("q12").replace(
        "GROUP BY bidder, window_start, window_end;",
        "GROUP BY bidder, window_start, window_end;\n"
        "CREATE TABLE again (bidder BIGINT, n BIGINT) WITH ('connector' = 'kafka', 'topic' = 'x', 'format' = 'json');\n"
        "CREATE VIEW counted AS SELECT bidder, window_start, window_end, COUNT(*) AS c FROM TABLE("
        "TUMBLE(TABLE B, DESCRIPTOR(p_time), INTERVAL '10' SECOND)) GROUP BY bidder, window_start, window_end;\n"
        "INSERT INTO again SELECT bidder, COUNT(*) FROM counted GROUP BY bidder, window_start, window_end;",
    )
    with pytest.raises(SqlError, match="window_start without a window TVF in FROM"):
        plan_script(text)  # not a window aggregation again, as an event-time window's result would be
