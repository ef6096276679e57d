"""Nexmark q12 (processing-time windows, the suite's text) on Weir's cluster and on Apache Flink 2.2.1
over the same topic. Which window a bid falls in depends on when each side processes it, so the rows
cannot be compared; what both outputs must satisfy is: each window is 10 s aligned to the epoch
(``starttime`` a multiple of 10 s, ``endtime`` 10 s later), a bidder has at most one row per window,
and a bidder's counts summed over the windows that fired never exceed its bids (windows still open
at the end of the bounded input never fire, on both sides, as docs/api.md says of processing-time
windows). Weir's source is paced so that its job spans several windows; Flink's is not (its Kafka
source has no pacing), so it may fire few or none."""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections import Counter
from typing import Any

import pytest

from tests.integration.conftest import WeirCluster
from tests.integration.sql.side_by_side import flink_build, load_nexmark_topic, run_on_both_sides
from weir import nexmark as nx
from weir.connectors import kafka

pytestmark = pytest.mark.integration

EVENTS = 10_000
CONFIG = nx.NexmarkConfig(events_per_second=500)
PARTITIONS = 3
PACE = 500
"""Weir's source reads 500 events a second, each of its 3 subtasks (``bench.nexmark_bench.PARALLELISM``) about 167 of
its partition: 20 s of input (more on a busy machine, never less), two or three 10 s windows that fire; only
the window open at the end (at most 10 s of the input) does not, so at least half the bids are counted, twice
the quarter the test asks for. (With 4 partitions and 150 a second, the subtask of two partitions read them
for 100 s.)"""


def millis(text: str) -> int:
    """A TIMESTAMP(3) as the JSON format writes it: Weir's always with milliseconds, Flink's without
    them when they are zero."""
    moment = dt.datetime.fromisoformat(text).replace(tzinfo=dt.UTC)
    return int(moment.timestamp() * 1000)


def windows(endpoints: Any, topic: str, bids: Counter[int]) -> Counter[int]:
    """The output's rows checked; answers each bidder's count summed over its windows."""
    seen: set[tuple[int, int]] = set()
    counted: Counter[int] = Counter()
    for _p, _o, _k, value in kafka.read_all(endpoints, topic):
        assert value is not None
        row = json.loads(value)
        start, end = millis(row["starttime"]), millis(row["endtime"])
        assert start % 10_000 == 0 and end - start == 10_000, row
        assert (row["bidder"], start) not in seen, f"{topic}: bidder {row['bidder']} twice in one window"
        seen.add((row["bidder"], start))
        assert row["bid_count"] > 0, row
        counted[row["bidder"]] += row["bid_count"]
    for bidder, count in counted.items():
        assert count <= bids[bidder], f"{topic}: bidder {bidder} counted {count} of its {bids[bidder]} bids"
    return counted


def test_weir_s_and_flink_s_processing_time_windows_keep_q12_s_invariants(
    weir_cluster: WeirCluster, tmp_path_factory: pytest.TempPathFactory
) -> None:
    build = flink_build()
    endpoints = weir_cluster.endpoints
    work = tmp_path_factory.mktemp("q12-vs-flink")
    topic = f"sql-q12-{uuid.uuid4().hex[:8]}"
    load_nexmark_topic(endpoints, topic, PARTITIONS, EVENTS, CONFIG)
    bids = Counter(e.bidder for e in (nx.event(n, CONFIG) for n in range(EVENTS)) if isinstance(e, nx.Bid))
    weir_out, flink_out = f"{topic}-weir", f"{topic}-flink"
    for name in (f"{weir_out}-q12", flink_out):
        assert kafka.create_topic(endpoints, name, 2, 1, {"retention.ms": "-1"})

    def paced(text: str) -> str:
        bounded = "  'scan.bounded.mode' = 'latest-offset',\n"  # the events table's option line (not its comment)
        edited = text.replace(bounded, bounded + f"  'scan.records-per-second' = '{PACE}',\n", 1)
        assert edited != text, "the events table's options changed: pace Weir's source another way"
        return edited

    run_on_both_sides(
        weir_cluster, build, work, queries=("q12",), topic=topic, weir_out=weir_out, flink_out=flink_out,
        job_name="q12", edit=paced,
    )  # fmt: skip
    weir_counted = windows(endpoints, f"{weir_out}-q12", bids)
    flink_counted = windows(endpoints, flink_out, bids)
    assert sum(weir_counted.values()) > sum(bids.values()) // 4, "Weir's paced job fired too few windows"
    assert sum(flink_counted.values()) <= sum(bids.values())
