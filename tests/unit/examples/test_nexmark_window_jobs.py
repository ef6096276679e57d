"""examples/nexmark/q5, q7 and q11 (the windowed queries without a join) in reference mode output
exactly the multiset the plain-Python queries output: from the generator, from a topic loaded by
weir.tools.nexmark_load over partitions (injected: no broker), and from crafted bids on the edges
(ties, window boundaries, touching sessions)."""

from __future__ import annotations

from collections import Counter

import pytest

from tests.unit.examples.nexmark_inputs import EXAMPLES, loaded_topic, no_kafka, run_on_topic
from weir import nexmark as nx
from weir.tools import nexmark_reference as ref
from weir.tools.reference import run_reference

EVENTS = 5_000
CONFIG = nx.NexmarkConfig(events_per_second=50)  # 100 s of event time: 54 sliding, 10 tumbling windows
PARAMS = {"events": str(EVENTS), "events_per_second": str(CONFIG.events_per_second)}
QUERIES = {"q5": ref.q5, "q7": ref.q7, "q11": ref.q11}


@pytest.fixture(scope="module")
def events() -> list[nx.Event]:
    return [nx.event(n, CONFIG) for n in range(EVENTS)]


@pytest.mark.parametrize("query", sorted(QUERIES))
def test_the_generator_job_outputs_the_reference(query: str, events: list[nx.Event]) -> None:
    result = run_reference(EXAMPLES / f"{query}.py", PARAMS, kafka_input=no_kafka)
    expected = QUERIES[query](events)
    assert len(expected) >= 10
    assert ref.multiset(result["kafka-sink"]) == ref.multiset(expected)
    assert result.sinks["kafka-sink"].description.target == f"nexmark-{query}"
    assert result.sources["nexmark-source"].records == EVENTS
    assert not any(result.late_records.values())


@pytest.mark.parametrize("query", sorted(QUERIES))
def test_the_kafka_job_over_partitions_outputs_the_reference(query: str, events: list[nx.Event]) -> None:
    result = run_reference(EXAMPLES / f"{query}.py", {"source": "kafka"}, kafka_input=loaded_topic(EVENTS, 3, CONFIG))
    assert ref.multiset(result["kafka-sink"]) == ref.multiset(QUERIES[query](events))
    assert result.dead_lettered == 0


def test_the_file_sink_variant(events: list[nx.Event]) -> None:
    result = run_reference(EXAMPLES / "q11.py", {**PARAMS, "sink": "file", "sink.path": "/tmp/q11"})
    assert result.sinks["file-sink"].description.target == "/tmp/q11"
    assert ref.multiset(result["file-sink"]) == ref.multiset(ref.q11(events))


# q5 ----------------------------------------------------------------------------------------------


def test_q5_reports_every_auction_tied_for_the_most_bids() -> None:
    bids = [_bid(t, auction=a) for t, a in [(100, 1), (200, 2), (300, 1), (400, 2), (500, 3), (2_500, 3)]]
    expected = ref.q5(bids)
    # [-8 s, 2 s): 1 and 2 tied at 2 bids; [-6 s, 4 s) .. [0, 10 s): 1, 2 and 3 at 2; [2 s, 12 s): 3 alone
    assert Counter((row["auction"], row["num"]) for row in expected) == {(1, 2): 5, (2, 2): 5, (3, 2): 4, (3, 1): 1}
    assert ref.multiset(_run("q5", bids)) == ref.multiset(expected)


# q7 ----------------------------------------------------------------------------------------------


def test_q7_includes_a_bid_at_exactly_the_window_end_of_the_windows_maximum() -> None:
    bids = [
        _bid(1_000, price=50),
        _bid(9_999, price=70, bidder=2),
        _bid(10_000, price=70, bidder=3),  # the next window's first ms: matches [0, 10 s)'s max too
        _bid(10_000, price=90, bidder=4),  # higher, but not in [0, 10 s): does not raise its max
        _bid(15_000, price=60, bidder=5),
    ]
    expected = ref.q7(bids)
    assert [(row["bidder"], row["price"]) for row in expected] == [(2, 70), (3, 70), (4, 90)]
    assert ref.multiset(_run("q7", bids)) == ref.multiset(expected)
    # The job's timer at the window's end waits for that millisecond whatever the out-of-orderness.
    assert ref.multiset(_run("q7", bids, {"source.max_out_of_orderness_ms": "0"})) == ref.multiset(expected)


def test_q7_reports_every_bid_tied_for_the_highest_price() -> None:
    bids = [_bid(t, price=p, bidder=t) for t, p in [(0, 5), (10, 9), (20, 9), (30, 1), (10_010, 2)]]
    expected = ref.q7(bids)
    assert [row["bidder"] for row in expected] == [10, 20, 10_010]
    assert ref.multiset(_run("q7", bids)) == ref.multiset(expected)


# q11 ---------------------------------------------------------------------------------------------


def test_q11_continues_a_session_with_a_bid_exactly_the_gap_later() -> None:
    # Bidder 2's bid at 10 s comes first in its millisecond: a watermark right behind it (0 ms of
    # out-of-orderness) would close bidder 1's session [0, 10 s) before bidder 1's bid at 10 s.
    bids = [_bid(0, bidder=1), _bid(10_000, bidder=2), _bid(10_000, bidder=1), _bid(30_001, bidder=1)]
    expected = ref.q11(bids)
    assert expected[0] == {"bidder": 1, "bid_count": 2, "starttime": 0, "endtime": 20_000}
    assert ref.multiset(_run("q11", bids)) == ref.multiset(expected)
    assert ref.multiset(_run("q11", bids, {"source.max_out_of_orderness_ms": "1"})) == ref.multiset(expected)


def test_q11_with_no_out_of_orderness_splits_that_session_as_flink_would() -> None:
    """Not a bug: with a watermark 1 ms behind the latest event, a window whose end is read is
    complete as far as the watermark says; Flink's window operator fires and purges it too."""
    bids = [_bid(0, bidder=1), _bid(10_000, bidder=2), _bid(10_000, bidder=1)]
    rows = _run("q11", bids, {"source.max_out_of_orderness_ms": "0"})
    assert sorted((r["bidder"], r["starttime"], r["bid_count"]) for r in rows) == [
        (1, 0, 1),
        (1, 10_000, 1),
        (2, 10_000, 1),
    ]


def test_q11_merges_the_sessions_a_late_bid_bridges() -> None:
    # 6 s comes after 12 s, within the 4 s of out-of-orderness: it joins [0, 10 s) and [12 s, 22 s).
    times = [(0, 7), (3_000, 8), (12_000, 7), (6_000, 7), (22_000, 7), (32_001, 7)]
    bids = [_bid(t, bidder=b) for t, b in times]
    expected = ref.q11(bids)
    assert [(r["bidder"], r["bid_count"], r["starttime"], r["endtime"]) for r in expected] == [
        (7, 4, 0, 32_000),
        (7, 1, 32_001, 42_001),
        (8, 1, 3_000, 13_000),
    ]
    assert ref.multiset(_run("q11", bids)) == ref.multiset(expected)


# Helpers -----------------------------------------------------------------------------------------


def _bid(t: int, *, auction: int = 1, bidder: int = 1, price: int = 10) -> nx.Bid:
    return nx.Bid(auction=auction, bidder=bidder, price=price, channel="channel-1", url="u", date_time=t, extra="")


def _run(query: str, events: list[nx.Event], params: dict[str, str] | None = None) -> list[dict[str, object]]:
    """The job's output for ``events`` read in this order from a one-partition topic."""
    result = run_on_topic(query, events, params)
    return result["kafka-sink"]
