"""The keyed-aggregation scenario's rules, without a cluster: the reference windows, their split at the
savepoint's watermarks, the comparison of a sink or the state with them, the coverage and count of each
event, the dead letters and the commit proofs, and the parsing of what the run reads back."""

from __future__ import annotations

import json
from dataclasses import replace

from weir.core.checkpointing import CheckpointStatus
from weir.core.keygroups import KeyGroupRange, key_group_for_key
from weir.operators.transactional_sinks import CommitMarker
from weir.scenarios.keyed_aggregation import (
    JobRun,
    KeyedAggregationConfig,
    KeyedAggregationRun,
    StateEntry,
    check,
    coverage,
    dead_letters,
    misplaced,
    split_at_cut,
    state_entry,
    summarize_proof,
)
from weir.scenarios.keyed_job import (
    KAFKA_SINK_UID,
    POSTGRES_SINK_UID,
    Event,
    InputRecord,
    KeyedJob,
    SavepointCut,
    WindowResult,
    WindowWatermark,
    compare_results,
    counted,
    marker_entries,
    parse_input,
    reference_windows,
    sink_record,
    sink_row,
)
from weir.tools.events import EventSpec, events
from weir.tools.verify import (
    CommitProof,
    ProofEntry,
    SinkKindName,
    SinkReport,
    SourceReport,
    SubtaskCommit,
    VerifyReport,
)

EVENTS = [
    Event("a", 5, 100),
    Event("a", 7, 999),  # the last millisecond of window [0, 1000)
    Event("b", 2, 400),
    Event("a", 1, 1000),  # window [1000, 2000)
    Event("b", 3, 1999),
    Event("a", 4, 2500),  # window [2000, 3000)
]
REFERENCE = reference_windows(EVENTS, 1000)


def test_the_reference_is_count_and_sum_per_key_and_tumbling_window() -> None:
    assert list(REFERENCE.values()) == [
        WindowResult("a", 0, 1000, 2, 12),
        WindowResult("a", 1000, 2000, 1, 1),
        WindowResult("a", 2000, 3000, 1, 4),
        WindowResult("b", 0, 1000, 1, 2),
        WindowResult("b", 1000, 2000, 1, 3),
    ]


def test_a_window_fired_once_its_subtasks_watermark_reached_its_last_millisecond() -> None:
    watermarks = {"a": 1999, "b": 1998}  # a and b on different subtasks
    split = split_at_cut(REFERENCE, watermarks.__getitem__)
    assert sorted(split.fired) == [("a", 0), ("a", 1000), ("b", 0)]
    assert sorted(split.open) == [("a", 2000), ("b", 1000)]  # b's [1000, 2000) needs watermark 1999


def test_a_place_holding_exactly_the_expected_windows_is_exact() -> None:
    c = compare_results("kafka", REFERENCE, reversed(list(REFERENCE.values())))
    assert c.exact and c.problems() == []
    assert (c.found, c.expected, counted(c)) == (5, 5, len(EVENTS))


def test_duplicates_missing_unexpected_mismatched_and_unreadable_are_each_counted() -> None:
    a0, a1, a2, b0, _b1 = REFERENCE.values()
    found = [
        a0,
        a0,  # duplicate
        WindowResult("a", 1000, 2000, 1, 99),  # mismatched sum
        a2,
        b0,
        WindowResult("c", 0, 1000, 1, 1),  # unexpected
        None,  # unreadable: unexpected too
    ]  # b's [1000, 2000) missing
    c = compare_results("postgres", REFERENCE, found)
    assert (c.duplicates, c.missing, c.unexpected, c.mismatched) == (1, 1, 2, 1)
    assert c.found == 7 and not c.exact
    assert counted(c) == 2 + 2 + 1 + 1 + 1 + 1  # each entry once, the duplicate included
    assert any(s.startswith("mismatched") for s in c.samples)
    assert a1 not in found


def test_a_window_in_a_sink_and_the_state_or_in_neither_breaks_the_coverage() -> None:
    split = split_at_cut(REFERENCE, lambda key: 1999 if key == "a" else 1998)
    sink = compare_results("kafka", split.fired, split.fired.values())
    state = compare_results("state", split.open, split.open.values())
    good = coverage(REFERENCE, sink, state)
    assert good.exact and good.counted == len(EVENTS)
    fired_again = compare_results("state", split.open, [*split.open.values(), REFERENCE[("a", 0)]])
    both = coverage(REFERENCE, sink, fired_again)
    assert (both.overlap, both.covered, both.exact) == (1, 5, False)
    assert both.counted == len(EVENTS) + 2  # its events counted twice
    lost = coverage(REFERENCE, sink, compare_results("state", split.open, [REFERENCE[("a", 2000)]]))
    assert (lost.covered, lost.exact, lost.counted) == (4, False, len(EVENTS) - 1)


def test_input_records_parse_as_the_jobs_rule_says() -> None:
    assert parse_input(b'{"id": "e1", "key": "k", "value": 3, "ts": 10}') == Event("k", 3, 10)
    assert parse_input(b'{not json {"id": "e1", "key": "k", "value": 3, "ts": 10}') is None
    assert parse_input(b'{"id": "e1", "key": "k", "value": true, "ts": 10}') is None  # bool is not int
    assert parse_input(b'{"id": "e1", "key": 7, "value": 3, "ts": 10}') is None
    assert parse_input(b"[1, 2]") is None
    assert parse_input(None) is None


def test_the_producers_malformed_records_are_the_ones_the_reference_leaves_out() -> None:
    spec = EventSpec(count=50, keys=3, malformed_every=10, start_ms=0)
    produced = [json.dumps(e).encode() for e in events(spec)]
    values = [b"{not json " + v if i % 10 == 9 else v for i, v in enumerate(produced)]
    parsed = [parse_input(v) for v in values]
    assert sum(p is None for p in parsed) == KeyedAggregationConfig(events=50, malformed_every=10).malformed


def test_sink_records_and_rows_read_back() -> None:
    record = b'{"key": "a", "window_start": 0, "window_end": 1000, "count": 2, "sum": 12}'
    assert sink_record(record) == WindowResult("a", 0, 1000, 2, 12)
    assert sink_record(b'{"key": "a"}') is None
    assert sink_record(b"junk") is None
    assert sink_row(("a", 0, 1000, 2, 12)) == WindowResult("a", 0, 1000, 2, 12)
    assert sink_row(("a", 0, 1000, None, 12)) is None


def test_a_window_state_dump_line_reads_as_its_key_window_and_accumulator() -> None:
    line = {
        "subtask": 1,
        "key_group": 17,
        "state": "win",
        "key": {"key": "a", "window": [0, 1000]},
        "value": ("a", (2, 12)),
    }
    assert state_entry(line) == StateEntry(1, 17, WindowResult("a", 0, 1000, 2, 12))
    other_key = {**line, "value": ("b", (2, 12))}
    assert state_entry(other_key).result is None
    not_a_window = {**line, "key": "a"}
    assert state_entry(not_a_window).result is None


def test_an_entry_outside_its_keys_key_group_is_misplaced() -> None:
    right = key_group_for_key("a", 128)
    entries = [
        StateEntry(0, right, WindowResult("a", 0, 1000, 1, 1)),
        StateEntry(0, (right + 1) % 128, WindowResult("a", 1000, 2000, 1, 1)),
        StateEntry(0, 3, None),
    ]
    assert misplaced(entries, 128) == 1


def test_dead_letters_are_matched_to_the_malformed_records_positions() -> None:
    def envelope(partition: int, offset: int, topic: str = "in") -> bytes:
        return json.dumps({"topic": topic, "partition": partition, "offset": offset, "reason": "x"}).encode()

    malformed = {(0, 4), (2, 9)}
    exact = dead_letters([envelope(0, 4), envelope(2, 9)], "in", malformed)
    assert (exact.records, exact.distinct, exact.of_malformed) == (2, 2, 2)
    twice = dead_letters([envelope(0, 4), envelope(0, 4), envelope(2, 9)], "in", malformed)
    assert (twice.records, twice.distinct, twice.of_malformed) == (3, 2, 2)
    wrong = dead_letters([envelope(0, 5), envelope(2, 9, topic="other"), b"junk"], "in", malformed)
    assert (wrong.records, wrong.distinct, wrong.of_malformed) == (3, 1, 0)


def test_a_commit_proof_accounts_for_the_records_once_each_and_only_completed_checkpoints() -> None:
    history = {3: CheckpointStatus.COMPLETED, 4: CheckpointStatus.FAILED, 5: CheckpointStatus.COMPLETED}
    entries = [
        ProofEntry("job", KAFKA_SINK_UID, 0, 2, 10, 0),  # older than the history: not judged
        ProofEntry("job", KAFKA_SINK_UID, 0, 3, 5, 0),
        ProofEntry("job", KAFKA_SINK_UID, 1, 3, 7, 0),
        ProofEntry("job", POSTGRES_SINK_UID, 0, 3, 5, 0),  # another sink
        ProofEntry("other", KAFKA_SINK_UID, 0, 9, 100, 0),  # another job
    ]
    good = summarize_proof(KAFKA_SINK_UID, entries, "job", 5, history)
    assert (good.commits, good.records, good.repeated, good.after_savepoint, good.not_completed) == (3, 22, 0, 0, 0)
    assert good.last == (SubtaskCommit(0, 3, 5), SubtaskCommit(1, 3, 7))
    assert good.accounts_for(22) and not good.accounts_for(21)
    bad = summarize_proof(
        KAFKA_SINK_UID,
        [*entries, ProofEntry("job", KAFKA_SINK_UID, 1, 3, 7, 0), ProofEntry("job", KAFKA_SINK_UID, 0, 4, 1, 0)]
        + [ProofEntry("job", KAFKA_SINK_UID, 0, 6, 1, 0)],
        "job",
        5,
        history,
    )
    assert (bad.repeated, bad.not_completed, bad.after_savepoint) == (1, 1, 1)
    assert not bad.accounts_for(bad.records)


def test_kafka_commit_markers_read_as_proof_entries() -> None:
    marker = CommitMarker("job", KAFKA_SINK_UID, 2, 7, 40, "txn").to_json()
    records = [(marker, 5), (b"junk", 6), (None, 7)]
    assert marker_entries(records, KAFKA_SINK_UID) == [ProofEntry("job", KAFKA_SINK_UID, 2, 7, 40, 5)]
    assert marker_entries(records, POSTGRES_SINK_UID) == []


# The checks over a whole (made-up) run --------------------------------------------------------------------


def _run(**changes: object) -> KeyedAggregationRun:
    """A run as a correct runtime leaves it: the EVENTS in partition 0 (offsets 0-5) and a malformed
    record at offset 6; every window's subtask at watermark 1999 at the savepoint, so a's [2000, 3000)
    is still open (in state) and the other four fired (in both sinks)."""
    fired = [r for r in REFERENCE.values() if r.end - 1 <= 1999]
    still_open = REFERENCE[("a", 2000)]
    proof = CommitProof("test", "job", (SubtaskCommit(0, 3, len(fired)),))

    def sink(uid: str, kind: SinkKindName) -> SinkReport:
        return SinkReport(uid, kind, "t", 5, 4, 0, 1, 0, 0, {}, proof, (), "m")

    run = KeyedAggregationRun(
        job=JobRun(
            "job", 7, 4, "s3://b/sp", {3: CheckpointStatus.COMPLETED, 4: CheckpointStatus.COMPLETED}, 3, 6, 6, 0
        ),
        steps=("ran it",),
        records=(*(InputRecord(0, i, e) for i, e in enumerate(EVENTS)), InputRecord(0, 6, None)),
        end_offsets={0: 7},
        cut=SavepointCut({0: 7}, (WindowWatermark(0, KeyGroupRange(0, 127), 1999),)),  # type: ignore[arg-type]
        state=(StateEntry(0, key_group_for_key("a", 128), still_open),),
        kafka=tuple(fired),
        postgres=tuple(fired),
        dead_letters=(json.dumps({"topic": CONFIG.job.source_topic, "partition": 0, "offset": 6}).encode(),),
        verified=VerifyReport(
            "keyed_aggregation.py",
            "keyed",
            "job",
            "--job-id",
            (SourceReport("events-source", "kafka", CONFIG.job.source_topic, 7, 1),),
            (sink(KAFKA_SINK_UID, "kafka"), sink(POSTGRES_SINK_UID, "postgres")),
            (),
            ("every sink committed up to 3",),
        ),
        proofs={
            KAFKA_SINK_UID: (ProofEntry("job", KAFKA_SINK_UID, 0, 3, len(fired), 0),),
            POSTGRES_SINK_UID: (ProofEntry("job", POSTGRES_SINK_UID, 0, 3, len(fired), 0),),
        },
        duration_s=1.0,
    )
    return replace(run, **changes)  # type: ignore[arg-type]


CONFIG = KeyedAggregationConfig(job=KeyedJob.named("t"))


def _failed(run: KeyedAggregationRun) -> set[str]:
    return {c.name for c in check(CONFIG, run).failed}


def test_a_run_that_shows_the_outcome_passes_every_check() -> None:
    report = check(CONFIG, _run())
    assert report.ok, report.failed
    assert len(report.checks) == 19
    assert report.check("windows-fired-and-open").numbers == {"checkpoint_after_input": 3, "fired": 4, "open": 1}
    assert report.check("each-event-counted-once:postgres-sink").numbers == {"counted": 6, "well_formed": 6}


def test_a_duplicate_in_one_sink_fails_its_checks_and_no_other() -> None:
    fired = _run().kafka
    assert _failed(_run(kafka=(*fired, fired[0]))) == {
        "sink-holds-fired-windows:kafka-sink",
        "each-event-counted-once:kafka-sink",
        "commit-proof-accounts:kafka-sink",  # its proof counts 4 records, the topic holds 5
    }
    numbers = check(CONFIG, _run(kafka=(*fired, fired[0]))).check("sink-holds-fired-windows:kafka-sink").numbers
    assert (numbers["duplicates"], numbers["found"], numbers["expected"]) == (1, 5, 4)


def test_a_fired_window_still_in_state_breaks_the_state_and_the_coverage() -> None:
    again = StateEntry(0, key_group_for_key("a", 128), REFERENCE[("a", 0)])
    assert _failed(_run(state=(*_run().state, again))) == {
        "state-holds-open-windows",
        "sink-and-state-cover-input:kafka-sink",
        "sink-and-state-cover-input:postgres-sink",
        "each-event-counted-once:kafka-sink",
        "each-event-counted-once:postgres-sink",
    }


def test_a_lost_dead_letter_or_an_unread_input_fails() -> None:
    assert _failed(_run(dead_letters=())) == {"dead-letters-once"}
    assert _failed(_run(end_offsets={0: 8})) == {"source-positions-at-end"}
    assert _failed(_run(job=replace(_run().job, produced=8))) == {"input-read-back"}
