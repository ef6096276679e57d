"""The barriers scenario's expectation and checks, on a made-up run (no cluster): a correct run passes
every check, and each kind of wrong evidence fails the check about it."""

from __future__ import annotations

import io
import json
import math
import threading
import time
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

import pytest
from rich.console import Console

from weir.core.checkpointing import CheckpointKind, CheckpointStatus
from weir.core.ids import CheckpointId, JobId, OperatorUid, SubtaskIndex
from weir.core.keygroups import key_group_range_for_subtask
from weir.core.states import JobStatus
from weir.scenarios.barriers import (
    BarriersConfig,
    BarriersRun,
    ChannelBarrier,
    CheckpointCut,
    InspectedCheckpoint,
    OutputRecord,
    SubtaskAlignment,
    check,
    check_holds,
    covering,
    expected_state,
    force_holds,
    join_records,
    measure_visibility,
    seen,
)
from weir.scenarios.driving import Arrival
from weir.scenarios.framework import ScenarioError
from weir.tools.client import CheckpointDetail, CheckpointInfo, JobDetails, JobSummary

KEYS = 4
PARALLELISM = 2
MAX_PARALLELISM = 128
RATES = {"orders": 40.0, "payments": 8.0}  # records/s, created from t=99 on
TRIGGERS = (100.0, 102.0, 104.0)
DURATION_S = 0.3
PAYMENTS_LATE_S = 0.2  # the payments barrier reaches the operator this long after the orders barrier
CONFIG = BarriersConfig(keys=KEYS, parallelism=PARALLELISM, checkpoint_interval_s=2.0, checkpoints=3, inspected=2)


def test_the_expected_state_is_each_keys_count_and_last_seq_before_the_cut() -> None:
    assert expected_state({"orders": 5}, 2) == {("k0", "orders"): (3, 4), ("k1", "orders"): (2, 3)}
    assert expected_state({"payments": 1, "orders": 0}, 3) == {("k0", "payments"): (1, 0)}


def test_a_record_is_covered_by_the_first_checkpoint_whose_cut_it_is_before() -> None:
    cuts = [_cut(2, 102.0, {"orders": 80}), _cut(1, 100.0, {"orders": 40})]
    assert covering(cuts, "orders", 39) == cuts[1]
    assert covering(cuts, "orders", 40) == cuts[0]
    assert covering(cuts, "orders", 80) is None


def test_a_correct_run_passes_every_check() -> None:
    report = check(CONFIG, _run())
    assert report.ok, report.failed
    assert len(report.checks) == 10
    assert report.check("alignment-exercised").numbers["held_records"] == 27
    assert report.check("committed-exactly-once").numbers["missing"] == 0


def test_a_post_barrier_record_processed_during_the_alignment_fails_the_division() -> None:
    run = _run()
    cut = run.cuts[0]
    # the first orders record after barrier 1, processed while payments' barrier was still missing
    records = tuple(
        replace(r, processed_s=cut.trigger_time + 0.05) if (r.input_name, r.seq) == ("orders", 40) else r
        for r in run.records
    )
    assert _failed(replace(run, records=records)) == {"barriers-divide-events"}
    hold = check_holds(run.inspected, records)
    assert len(hold.violations) == 1 and "orders seq 40 is after the barrier" in hold.violations[0]


def test_a_pre_barrier_record_processed_after_its_channels_barrier_fails_the_division() -> None:
    run = _run()
    records = tuple(replace(r, processed_s=r.processed_s + 1.0) if r.seq == 39 else r for r in run.records)
    assert _failed(replace(run, records=records)) == {"barriers-divide-events"}


def test_a_snapshot_with_a_post_barrier_record_in_it_fails() -> None:
    run = _run()
    last = run.inspected[-1]
    assert last.state is not None
    count, _last = last.state[("k0", "orders")]
    state = {**last.state, ("k0", "orders"): (count + 1, last.cut.positions["orders"])}
    inspected = (*run.inspected[:-1], replace(last, state=state))
    bad = replace(run, inspected=inspected)
    assert _failed(bad) == {"snapshot-totals", "snapshot-per-key"}


def test_a_snapshot_missing_a_keys_last_record_fails_per_key_even_when_totals_match() -> None:
    run = _run()
    last = run.inspected[-1]
    assert last.state is not None
    (c0, l0), (c1, l1) = last.state[("k0", "orders")], last.state[("k1", "orders")]
    state = {**last.state, ("k0", "orders"): (c0 - 1, l0 - KEYS), ("k1", "orders"): (c1 + 1, l1)}
    inspected = (*run.inspected[:-1], replace(last, state=state))
    bad = replace(run, inspected=inspected)
    assert _failed(bad) == {"snapshot-per-key"}


def test_a_record_committed_before_its_checkpoint_completed_fails() -> None:
    run = _run()
    cut = run.cuts[1]
    records = tuple(
        replace(r, committed_at=cut.completed_at - 0.1) if (r.input_name, r.seq) == ("payments", 20) else r
        for r in run.records
    )
    assert _failed(replace(run, records=records)) == {"committed-after-completion"}
    visibility = measure_visibility(run.cuts, records)
    assert len(visibility.committed_early) == 1 and "before checkpoint 2 completed" in visibility.committed_early[0]


def test_output_that_became_visible_only_with_the_commit_fails_the_processing_checks() -> None:
    run = _run()
    records = tuple(replace(r, uncommitted_at=r.committed_at) for r in run.records if r.committed_at is not None)
    assert _failed(replace(run, records=records)) == {"processing-did-not-wait", "uncommitted-before-completion"}


def test_a_run_without_a_held_channel_proves_no_alignment() -> None:
    run = _run(payments_late_s=0.0)
    assert _failed(run) == {"alignment-exercised"}


def test_missing_or_duplicate_committed_output_fails() -> None:
    run = _run()
    records = tuple(
        replace(r, committed_at=None) if r.seq == 3 and r.input_name == "orders" else r for r in run.records
    )
    assert _failed(replace(run, records=records)) == {"committed-exactly-once"}
    assert _failed(replace(run, committed_duplicates=2)) == {"committed-exactly-once"}


def test_a_restart_or_a_failed_checkpoint_fails_the_clean_run() -> None:
    run = _run()
    assert _failed(replace(run, restarts=1)) == {"clean-run"}
    failed = replace(run.checkpoints[-1], checkpoint_id=CheckpointId(9), status=CheckpointStatus.FAILED)
    assert _failed(replace(run, checkpoints=(*run.checkpoints, failed))) == {"clean-run"}


# A made-up run: what a correct aligned runtime would have produced ----------------------------------


def _failed(run: BarriersRun) -> set[str]:
    """The names of the checks the run fails."""
    return {c.name for c in check(CONFIG, run).failed}


def _cut(checkpoint_id: int, trigger: float, positions: dict[str, int]) -> CheckpointCut:
    return CheckpointCut(checkpoint_id, trigger, trigger + DURATION_S, positions)


def _created(input_name: str, seq: int) -> float:
    return 99.0 + seq / RATES[input_name]


def _run(payments_late_s: float = PAYMENTS_LATE_S) -> BarriersRun:
    """Sources creating records from t=99 at their rates; checkpoint N cuts each input at the records
    created before its trigger; the orders barrier reaches each subtask 10 ms after the trigger, the
    payments one ``payments_late_s`` later, and the alignment ends then; a record is processed 5 ms
    after it was created, or, behind a held barrier, 1 ms after the alignment ended; read_uncommitted
    sees it 50 ms after that, read_committed 20 ms after its checkpoint completed."""
    horizon = TRIGGERS[-1] + 1.0
    seqs = {name: range(int((horizon - 99.0) * rate)) for name, rate in RATES.items()}
    cuts = tuple(
        _cut(n, t, {name: sum(1 for s in seqs[name] if _created(name, s) < t) for name in RATES})
        for n, t in enumerate(TRIGGERS, 1)
    )
    ranges = [key_group_range_for_subtask(MAX_PARALLELISM, PARALLELISM, SubtaskIndex(s)) for s in range(PARALLELISM)]
    alignments = {
        cut.checkpoint_id: tuple(
            SubtaskAlignment(
                subtask=s,
                key_groups=ranges[s],
                channels=(
                    ChannelBarrier(0, "orders#0", "orders", cut.trigger_time + 0.01),
                    ChannelBarrier(1, "payments#0", "payments", cut.trigger_time + 0.01 + payments_late_s),
                ),
                first_barrier_at=cut.trigger_time + 0.01,
                alignment_end_at=cut.trigger_time + 0.01 + payments_late_s,
                sync_end_at=cut.trigger_time + 0.02 + payments_late_s,
            )
            for s in range(PARALLELISM)
        )
        for cut in cuts
    }
    records: list[OutputRecord] = []
    for name in RATES:
        for seq in seqs[name]:
            created = _created(name, seq)
            processed = created + 0.005
            for cut in cuts:
                end = alignments[cut.checkpoint_id][0].alignment_end_at
                if not cut.before(name, seq) and cut.trigger_time <= processed < end:
                    processed = end + 0.001
            cover = covering(cuts, name, seq)
            records.append(
                OutputRecord(
                    name,
                    seq,
                    f"k{seq % KEYS}",
                    created,
                    processed,
                    processed + 0.05,
                    cover.completed_at + 0.02 if cover is not None else None,
                )
            )
    inspected = tuple(
        InspectedCheckpoint(
            cut,
            alignments[cut.checkpoint_id],
            _operator_state(records, cut) if cut.checkpoint_id > 1 else None,
            MAX_PARALLELISM,
        )
        for cut in cuts
    )
    checkpoints = tuple(
        CheckpointInfo(
            checkpoint_id=CheckpointId(cut.checkpoint_id),
            status=CheckpointStatus.COMPLETED,
            kind=CheckpointKind.CHECKPOINT,
            trigger_time=cut.trigger_time,
            duration_s=DURATION_S,
            size_bytes=1,
            failure="",
            tasks=(),
        )
        for cut in cuts
    )
    return BarriersRun(
        job_id="job",
        checkpoints=checkpoints,
        cuts=cuts,
        inspected=inspected,
        records=tuple(records),
    )


def _operator_state(records: list[OutputRecord], cut: CheckpointCut) -> dict[tuple[str, str], tuple[int, int]]:
    """What the operator counted of the records processed before the cut, record by record."""
    state: dict[tuple[str, str], tuple[int, int]] = defaultdict(lambda: (0, -1))
    for r in sorted(records, key=lambda r: (r.input_name, r.seq)):
        if cut.before(r.input_name, r.seq):
            count, _last = state[(r.key, r.input_name)]
            state[(r.key, r.input_name)] = (count + 1, r.seq)
    return dict(state)


@pytest.mark.parametrize("keys", [1, 3, 7])
def test_the_expectation_equals_counting_record_by_record(keys: int) -> None:
    positions = {"orders": 23, "payments": 2}
    counted: dict[tuple[str, str], tuple[int, int]] = {}
    for name, n in positions.items():
        for seq in range(n):
            count, _ = counted.get((f"k{seq % keys}", name), (0, -1))
            counted[(f"k{seq % keys}", name)] = (count + 1, seq)
    assert expected_state(positions, keys) == counted


def test_only_records_on_a_held_channel_count_as_held() -> None:
    run = _run()
    hold = check_holds(run.inspected, run.records)
    assert hold.held_records > 0 and not hold.violations
    assert {name for _cp, _subtask, name in hold.held_by_channel} == {"orders"}  # payments' barrier came last
    # per checkpoint the orders records created from its trigger (the cut) until the alignment's end (trigger
    # + 10 ms + 200 ms): one every 25 ms, 9 of them; every key lives on one subtask or the other
    assert hold.held_records == 3 * math.ceil(RATES["orders"] * (0.01 + PAYMENTS_LATE_S)) == 27


# Forced holds: the gate across a trigger ----------------------------------------------------------


def _in_progress(checkpoint_id: int) -> CheckpointInfo:
    return CheckpointInfo(
        CheckpointId(checkpoint_id), CheckpointStatus.IN_PROGRESS, CheckpointKind.CHECKPOINT, 0.0, 0.0, 0, "", ()
    )


class GatedJob:
    """A job's checkpoints as force_holds sees them through the client, its payments source (a thread)
    waiting at the gate. Each client call is a step: a checkpoint is triggered when none is in
    progress; the orders source acknowledges it at the next step; the payments source only once the
    gate is open; the two-input subtasks then complete it."""

    def __init__(self, gate: Path) -> None:
        self.closed, self.waiting = gate / "closed", gate / "waiting"
        self.checkpoint = 0
        self.pending: set[tuple[str, int]] = set()
        self.completed = 0
        self.orders_acked_at: float | None = None
        self.held_s: dict[int, float] = {}  # checkpoint -> from the orders ack to its payments barrier
        self.stopped = threading.Event()
        threading.Thread(target=self._source, daemon=True).start()

    def _source(self) -> None:
        """The payments source: at its next record it finds the gate closed and waits, saying so."""
        while not self.stopped.wait(0.001):
            if self.closed.exists() and not self.waiting.exists():
                self.waiting.touch()

    def _step(self) -> None:
        if not self.pending:
            self.checkpoint += 1
            self.pending = {("orders", 0), ("payments", 0), ("counts", 0), ("counts", 1)}
        elif ("orders", 0) in self.pending:
            self.pending.discard(("orders", 0))
            self.orders_acked_at = time.monotonic()
        elif ("payments", 0) in self.pending:
            if not self.closed.exists():
                self.pending.discard(("payments", 0))
                assert self.orders_acked_at is not None
                self.held_s[self.checkpoint] = time.monotonic() - self.orders_acked_at
        else:
            self.pending.clear()
            self.completed = self.checkpoint

    def list_checkpoints(self, job_id: str) -> tuple[CheckpointInfo, ...]:
        self._step()
        return (_in_progress(self.checkpoint),) if self.pending else ()

    def checkpoint_detail(self, job_id: str, checkpoint_id: int) -> CheckpointDetail:
        pending = tuple((OperatorUid(v), SubtaskIndex(s)) for v, s in sorted(self.pending))
        return CheckpointDetail(_in_progress(checkpoint_id), pending)

    def job_status(self, job_id: str) -> JobDetails:
        self._step()
        summary = JobSummary(JobId(job_id), "two_input_counts", JobStatus.RUNNING, 0.0, 2, 0)
        return JobDetails(summary, (), None, CheckpointId(self.completed) if self.completed else None, None)


def test_forced_holds_keep_the_payments_barrier_back_past_the_orders_ack_for_each_checkpoint(tmp_path: Path) -> None:
    job = GatedJob(tmp_path)
    config = replace(CONFIG, gate=tmp_path, checkpoints=3, forced_hold_ms=30.0, timeout_s=10.0)

    try:
        force_holds(job, "job", tmp_path, config, Console(file=io.StringIO()))  # type: ignore[arg-type]
    finally:
        job.stopped.set()

    assert job.completed >= 3
    assert len(job.held_s) >= 3 and all(held >= 0.030 for held in job.held_s.values()), job.held_s
    assert not (tmp_path / "closed").exists()  # the source runs on


def test_forced_holds_open_the_gate_and_fail_when_no_checkpoint_comes(tmp_path: Path) -> None:
    class NoTrigger(GatedJob):
        def list_checkpoints(self, job_id: str) -> tuple[CheckpointInfo, ...]:
            return ()

    job = NoTrigger(tmp_path)
    config = replace(CONFIG, gate=tmp_path, checkpoints=1, timeout_s=0.2)

    try:
        with pytest.raises(ScenarioError, match="a checkpoint the orders source acknowledged while payments waits"):
            force_holds(job, "job", tmp_path, config, Console(file=io.StringIO()))  # type: ignore[arg-type]
    finally:
        job.stopped.set()
    assert not (tmp_path / "closed").exists()


# The consumers' records -----------------------------------------------------------------------------------


def _arrival(offset: int, at: float, input_name: str, seq: int) -> Arrival:
    record = {"input": input_name, "seq": seq, "key": f"k{seq % KEYS}", "created_ms": 1000, "processed_ms": 1005}
    return Arrival("out", 0, offset, at, json.dumps(record).encode())


def test_each_record_is_joined_with_when_each_consumer_first_saw_it_and_a_repeat_is_a_duplicate() -> None:
    uncommitted = seen([_arrival(0, 1.1, "orders", 0), _arrival(1, 1.2, "payments", 0)])
    committed = seen([_arrival(0, 2.1, "orders", 0), _arrival(2, 2.2, "orders", 0)])  # written twice
    assert committed.duplicates == 1 and uncommitted.duplicates == 0
    records = join_records(uncommitted, committed)
    assert [(r.input_name, r.seq, r.uncommitted_at, r.committed_at) for r in records] == [
        ("orders", 0, 1.1, 2.1),
        ("payments", 0, 1.2, None),
    ]
    assert (records[0].created_s, records[0].processed_s, records[0].key) == (1.0, 1.005, "k0")
