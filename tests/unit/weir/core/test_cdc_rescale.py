"""A CDC source's state restored at another parallelism (``weir.core.cdc.redistribute``), over every
state a checkpoint of one source can hold at parallelism 1 to 4 (each subtask in each phase it can be
in together with the others), restored at parallelism 1 to 5: the decision, what each new subtask then
does at its start, the refusal's line, and that two rescales in a row decide as one. Random runs that
restore at random parallelisms against a model of the server: tests/unit/weir/core/test_cdc_parallel.py."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest

from weir.core.cdc import (
    IDLE_READER,
    SNAPSHOT_PENDING,
    AnnounceRestored,
    AwaitSlot,
    CdcProgress,
    CdcState,
    ChunkRead,
    Phase,
    Redistributed,
    RedistributionRefused,
    Resume,
    ResumeSnapshot,
    SlotFound,
    StayIdle,
    TakeSnapshot,
    XidSnapshot,
    decide_reader_start,
    decide_start,
    decode_cdc_state,
    encode_cdc_state,
    redistribute,
    redistribute_stored,
    snapshot_partitions,
)
from weir.core.errors import JobDefinitionError, SerializationError

TABLE = "public.t"
POINT = 100  # the slot's consistent point
SOURCE = "postgres cdc source 'cdc'"


def _chunk(partition: int, upper: int | None) -> ChunkRead:
    return ChunkRead(TABLE, None if upper is None else (upper,), XidSnapshot(7, 9, frozenset({8})), 150, partition)


def _reader_states(partition: int, partitions: int, pending: CdcState, *, streaming: bool) -> list[CdcState]:
    """What subtask ``partition`` > 0 can hold: before the slot (``pending``), mid-partition, its
    partition read; or once subtask 0 streams, its partition read (or idle, restored rescaled before)."""
    done = CdcState(Phase.PARTITION_READ, POINT, (_chunk(partition, 5), _chunk(partition, None)), partitions)
    if streaming:
        return [done, IDLE_READER]
    return [pending, CdcState(Phase.SNAPSHOT, POINT, (_chunk(partition, 5),), partitions), done]


def checkpoints() -> Iterator[tuple[str, list[CdcState]]]:
    """Every combination of subtask states one source's checkpoint can hold, at parallelism 1 to 4,
    whose snapshot was read in ``partitions`` (its parallelism when it started) at most that
    parallelism (the subtasks above idle: restored rescaled up mid-snapshot, or after the handover)."""
    for parallelism in range(1, 5):
        yield "fresh", [SNAPSHOT_PENDING] * parallelism
        for partitions in range(1, parallelism + 1):
            idle = [IDLE_READER] * (parallelism - partitions)
            # before the slot, a state written at the snapshot's own parallelism holds no partitions (1); one
            # restored above it, the snapshot's (redistribute fixes them)
            pending = CdcState(Phase.SNAPSHOT, None, (), partitions if partitions != parallelism else 1)
            firsts = [pending, CdcState(Phase.SNAPSHOT, POINT, (_chunk(0, 3),), partitions)]
            readers = [_reader_states(p, partitions, pending, streaming=False) for p in range(1, partitions)]
            for first, *others in itertools.product(firsts, *readers):
                states = [first, *others, *idle]
                if any(s.position is not None for s in states):
                    yield "snapshot", states
            streaming = CdcState(Phase.STREAMING, 180, tuple(_chunk(p, None) for p in range(partitions)), partitions)
            readers = [_reader_states(p, partitions, pending, streaming=True) for p in range(1, partitions)]
            for others in itertools.product(*readers):
                yield "streaming", [streaming, *others, *idle]


def _partitions(states: list[CdcState]) -> int:
    return max(snapshot_partitions(s, len(states)) for s in states if s.phase is not Phase.IDLE)


CASES = [(kind, states, n) for kind, states in checkpoints() for n in range(1, 6)]


def test_the_cases_cover_each_kind_at_each_parallelism() -> None:
    kinds = {(kind, len(states), n) for kind, states, n in CASES}
    for old, n in itertools.product(range(1, 5), range(1, 6)):
        assert {("fresh", old, n), ("snapshot", old, n), ("streaming", old, n)} <= kinds
    assert len(CASES) > 500


@pytest.mark.parametrize(("kind", "states", "parallelism"), CASES)
def test_each_checkpoint_at_each_parallelism(kind: str, states: list[CdcState], parallelism: int) -> None:
    decision = redistribute(states, parallelism, SOURCE)
    if parallelism == len(states):
        assert decision == Redistributed(tuple(states)), "at its own parallelism, each subtask its own state"
        return
    if kind == "fresh":
        assert decision == Redistributed((SNAPSHOT_PENDING,) * parallelism), "nothing read: a new snapshot"
        return
    if kind == "streaming":
        assert decision == Redistributed((states[0], *(IDLE_READER,) * (parallelism - 1))), (
            "subtask 0's position, whole (its LSN and the chunks a later change may have been read by)"
        )
        return
    partitions = _partitions(states)
    if parallelism < partitions:
        assert isinstance(decision, RedistributionRefused)
        assert "\n" not in decision.reason
        assert decision.reason.startswith(f"{SOURCE}: the checkpoint was taken while {partitions} subtasks read")
        assert f"restore it at parallelism {partitions} or above" in decision.reason
        assert f"new snapshot at parallelism {parallelism}" in decision.reason
        return
    assert isinstance(decision, Redistributed)
    new = decision.states
    assert len(new) == parallelism
    assert new[partitions:] == (IDLE_READER,) * (parallelism - partitions)
    for index, (before, after) in enumerate(zip(states[:partitions], new, strict=False)):
        assert after.phase is before.phase and after.position == before.position and after.chunks == before.chunks
        assert all(c.partition == index for c in after.chunks), "partition i's reader is subtask i"
        assert snapshot_partitions(after, parallelism) == partitions, "it reads its partition of the snapshot's"


@pytest.mark.parametrize(("kind", "states", "parallelism"), CASES)
def test_each_new_subtask_starts_as_its_state_says(kind: str, states: list[CdcState], parallelism: int) -> None:
    """Through the stored form, as a restore reads it: subtask 0 resumes the stream, goes on with the
    snapshot or takes a new one; a reader waits for the slot, goes on, announces, or idles."""
    decision = redistribute_stored([encode_cdc_state(s, "slot") for s in states], "slot", parallelism, SOURCE)
    if isinstance(decision, RedistributionRefused):
        return
    new = [decode_cdc_state(encode_cdc_state(s, "slot"), "slot") for s in decision.states]
    assert tuple(new) == decision.states
    for index, state in enumerate(new):
        partitions = snapshot_partitions(state, parallelism)
        CdcProgress(state, partitions)  # the operator's, without a refusal
        if index == 0:
            start = decide_start(state, SlotFound(POINT), "slot")
            if kind == "streaming":
                assert isinstance(start, Resume) and start.position == states[0].position
            elif state.position is None:
                assert isinstance(start, TakeSnapshot), "nothing read, or subtask 0 had not created the slot"
            else:
                assert start == ResumeSnapshot(POINT)
        else:
            reader = decide_reader_start(state)
            if kind == "streaming" and parallelism != len(states):
                assert reader == StayIdle(), "the stream is subtask 0's"
            elif index >= partitions or state.phase is Phase.IDLE:
                assert reader == StayIdle()
            else:
                assert isinstance(reader, AwaitSlot | ResumeSnapshot | AnnounceRestored)


def _work(states: tuple[CdcState, ...]) -> list[tuple[Phase, int | None, tuple[ChunkRead, ...]]]:
    """What each subtask still has to do: once subtask 0 streams, its position alone (a reader whose
    partition was handed over only announces it again, which the stream ignores, or idles)."""
    if states[0].phase is Phase.STREAMING:
        return [(states[0].phase, states[0].position, states[0].chunks)] + [(Phase.IDLE, None, ())] * (len(states) - 1)
    return [(s.phase, s.position, s.chunks) for s in states]


@pytest.mark.parametrize(("kind", "states", "parallelism"), CASES)
def test_two_rescales_decide_as_one(kind: str, states: list[CdcState], parallelism: int) -> None:
    direct = redistribute(states, parallelism, SOURCE)
    for between in range(1, 6):
        first = redistribute(states, between, SOURCE)
        if not isinstance(first, Redistributed):
            continue
        second = redistribute(list(first.states), parallelism, SOURCE)
        if isinstance(direct, Redistributed) and isinstance(second, Redistributed):
            assert _work(second.states) == _work(direct.states), f"{kind} through parallelism {between}"
        else:
            assert type(second) is type(direct), f"{kind} through parallelism {between}: {second} / {direct}"


@pytest.mark.parametrize(
    "states",
    [
        [CdcState(Phase.PARTITION_READ, POINT, (), 2), SNAPSHOT_PENDING],  # subtask 0 never reads a partition
        [IDLE_READER, SNAPSHOT_PENDING],  # nor idles
        [CdcState(Phase.SNAPSHOT, POINT, (), 2), CdcState(Phase.STREAMING, POINT, (), 2)],  # a reader never streams
        [CdcState(Phase.SNAPSHOT, POINT, (), 2), CdcState(Phase.SNAPSHOT, POINT, (), 2), SNAPSHOT_PENDING],
        [CdcState(Phase.SNAPSHOT, POINT, (), 2), CdcState(Phase.SNAPSHOT, POINT, (), 3), SNAPSHOT_PENDING],
        [CdcState(Phase.SNAPSHOT, POINT, (), 2), SNAPSHOT_PENDING, IDLE_READER],  # 2 partitions: it has them
    ],
)
def test_states_that_are_not_one_sources_are_damaged(states: list[CdcState]) -> None:
    with pytest.raises(SerializationError, match="not those of one source"):
        redistribute(states, 4, SOURCE)


def test_a_state_of_another_slot_is_refused_as_the_restore_refuses_it() -> None:
    with pytest.raises(JobDefinitionError, match="replication slot 'other'"):
        redistribute_stored([encode_cdc_state(SNAPSHOT_PENDING, "other")], "slot", 2, SOURCE)


def test_the_idle_state_holds_nothing_and_is_format_4() -> None:
    with pytest.raises(ValueError, match="idle"):
        CdcState(Phase.IDLE, POINT)
    with pytest.raises(ValueError, match="idle"):
        CdcState(Phase.IDLE, None, (_chunk(0, None),))
    assert encode_cdc_state(IDLE_READER, "s") == (
        b'{"format":4,"slot":"s","phase":"idle","lsn":null,"partitions":1,"chunks":[]}'
    )
    with pytest.raises(SerializationError, match="phase 'idle' in format 3"):
        decode_cdc_state(b'{"format":3,"slot":"s","phase":"idle","lsn":null,"partitions":1,"chunks":[]}', "s")
    progress = CdcProgress(IDLE_READER, 1)
    assert progress.checkpoint_taken(1) == IDLE_READER
    assert progress.checkpoint_completed(1) is None, "nothing to advance or announce"


def test_a_rescaled_reader_that_had_not_started_keeps_the_snapshots_partitions() -> None:
    """Restored at 3 from 2 mid-snapshot: subtask 1 had not seen the slot; it still reads partition 1
    of 2, and takes the slot once subtask 0 marks it."""
    states = [CdcState(Phase.SNAPSHOT, POINT, (_chunk(0, 3),), 2), SNAPSHOT_PENDING]
    decision = redistribute(states, 3, SOURCE)
    assert decision == Redistributed((states[0], CdcState(Phase.SNAPSHOT, None, (), 2), IDLE_READER))
    reader = CdcProgress(decision.states[1], snapshot_partitions(decision.states[1], 3))
    reader.slot_created(POINT)
    assert reader.state == CdcState(Phase.SNAPSHOT, POINT, (), 2)
    assert snapshot_partitions(SNAPSHOT_PENDING, 3) == 3, "a new snapshot: one partition per subtask"
    assert snapshot_partitions(IDLE_READER, 3) == 1
