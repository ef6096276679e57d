"""The CDC source's pure part: the position state machine (simulated against a model of the server's
rows, transactions, MVCC snapshots and slot, with a chunked snapshot, crashes, lost notifications and
aborts), the chunk and visibility decisions at their boundaries, the start decision, the slot's fate
at the job's end, the state's JSON and the event's."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from decimal import Decimal
from uuid import UUID

import pytest

from weir.core.cdc import (
    SNAPSHOT_PENDING,
    AdvanceSlot,
    CdcProgress,
    CdcSourceError,
    CdcState,
    ChangeEvent,
    ChangeOp,
    ChunkRead,
    DropSlot,
    JobEnd,
    KeepSlot,
    Key,
    NextChunk,
    Phase,
    Resume,
    ResumeSnapshot,
    SlotFound,
    SlotRetention,
    TakeSnapshot,
    TransactionVerdict,
    XidSnapshot,
    chunk_of,
    decide_slot_at_end,
    decide_start,
    decode_cdc_state,
    encode_cdc_state,
    format_lsn,
    next_chunk,
    parse_lsn,
    widen_xid,
)
from weir.core.errors import JobDefinitionError, SerializationError

# LSNs ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "value"), [("0/0", 0), ("0/193E920", 0x193E920), ("16/B374D848", (0x16 << 32) | 0xB374D848)]
)
def test_lsn_text_round_trips(text: str, value: int) -> None:
    assert parse_lsn(text) == value
    assert format_lsn(value) == text


@pytest.mark.parametrize("text", ["", "12", "x/1", "1/"])
def test_a_malformed_lsn_is_refused(text: str) -> None:
    with pytest.raises(ValueError):
        parse_lsn(text)


# The start decision -------------------------------------------------------------------------------------


def test_start_without_state_takes_the_snapshot_dropping_a_leftover_slot() -> None:
    assert decide_start(SNAPSHOT_PENDING, None, "s") == TakeSnapshot(drop_existing=False)
    assert decide_start(SNAPSHOT_PENDING, SlotFound(100), "s") == TakeSnapshot(drop_existing=True)


def test_start_from_a_streaming_state_resumes_when_the_slot_is_at_or_before_it() -> None:
    state = CdcState(Phase.STREAMING, 500)
    assert decide_start(state, SlotFound(500), "s") == Resume(500)
    assert decide_start(state, SlotFound(100), "s") == Resume(500)


def test_start_from_a_streaming_state_without_the_slot_is_one_clear_error() -> None:
    with pytest.raises(CdcSourceError, match="replication slot 's' is gone.*0/1F4.*take a new snapshot"):
        decide_start(CdcState(Phase.STREAMING, 500), None, "s")


def test_start_from_a_state_the_slot_moved_past_is_one_clear_error() -> None:
    with pytest.raises(CdcSourceError, match="advanced to 0/258, past the restored checkpoint's LSN 0/1F4"):
        decide_start(CdcState(Phase.STREAMING, 500), SlotFound(600), "s")


def test_a_streaming_state_has_a_position_and_chunks_need_a_slot() -> None:
    with pytest.raises(ValueError):
        CdcState(Phase.STREAMING, None)
    with pytest.raises(ValueError):
        CdcState(Phase.SNAPSHOT, None, (ChunkRead("public.t", None, XidSnapshot(5, 5), 10),))
    assert CdcState(Phase.SNAPSHOT, 5).position == 5, "the slot was created, no chunk read yet"


# The progress, step by step ---------------------------------------------------------------------------


def test_transactions_at_or_before_the_position_are_skipped_and_later_ones_move_it() -> None:
    progress = CdcProgress(CdcState(Phase.STREAMING, 100))
    assert progress.transaction(90) is TransactionVerdict.SKIP
    assert progress.transaction(100) is TransactionVerdict.SKIP
    assert progress.transaction(150) is TransactionVerdict.EMIT
    assert progress.state == CdcState(Phase.STREAMING, 150)
    progress.decoded_through(140)  # behind: no move
    assert progress.state.position == 150
    progress.decoded_through(200)
    assert progress.state.position == 200
    assert progress.transaction(180) is TransactionVerdict.SKIP


def test_no_change_before_the_snapshot_and_one_snapshot_only() -> None:
    progress = CdcProgress()
    with pytest.raises(ValueError):
        progress.transaction(10)
    with pytest.raises(ValueError):
        progress.decoded_through(10)
    with pytest.raises(ValueError):
        progress.chunk_emitted(ChunkRead("public.t", None, XidSnapshot(5, 5), 10))
    progress.slot_created(10)
    with pytest.raises(ValueError):
        progress.slot_created(20)
    with pytest.raises(ValueError):
        progress.transaction(20)
    progress.snapshot_emitted()
    with pytest.raises(ValueError):
        progress.snapshot_emitted()
    with pytest.raises(ValueError):
        progress.next_chunk(["public.t"])


def test_the_slot_advances_to_a_completed_checkpoints_position_once_and_never_back() -> None:
    progress = CdcProgress()
    assert progress.checkpoint_taken(1) == SNAPSHOT_PENDING
    progress.slot_created(10)
    progress.checkpoint_taken(7)
    progress.snapshot_emitted()
    assert progress.checkpoint_completed(7) is None, "a snapshot's checkpoint never advances the slot"
    progress.checkpoint_taken(2)
    progress.transaction(20)
    progress.checkpoint_taken(3)
    progress.transaction(30)
    progress.checkpoint_taken(4)
    assert progress.checkpoint_completed(1) is None, "the snapshot's checkpoint holds no position"
    assert progress.checkpoint_completed(3) == AdvanceSlot(20)
    assert progress.pending_checkpoints == [4], "checkpoint 2 is covered by 3"
    assert progress.checkpoint_completed(2) is None, "late: covered"
    progress.checkpoint_aborted(4)
    assert progress.checkpoint_completed(4) is None, "aborted"
    progress.checkpoint_taken(5)
    assert progress.checkpoint_completed(5) == AdvanceSlot(30)
    progress.checkpoint_taken(6)  # no new transaction: the same position
    assert progress.checkpoint_completed(6) is None, "the slot is there already"
    assert progress.checkpoint_completed(99) is None, "unknown"


# The progress, simulated --------------------------------------------------------------------------------

TABLE = "public.t"
XID_START = (1 << 32) - 40  # 32-bit xids wrap around during a run: pgoutput's xids are widened back


@dataclass
class Transaction:
    xid: int  # 64-bit
    writes: list[tuple[int, int | None]] = field(default_factory=list)  # (key, new value; None: delete)
    end: int | None = None  # its commit record's end, once written to the WAL


@dataclass
class Server:
    """A model of the database: rows, transactions (open, committing: WAL written but not yet
    visible, or committed), the decodable WAL, the slot, and MVCC snapshots."""

    rows: dict[int, int] = field(default_factory=dict)
    history: dict[int, list[int | None]] = field(default_factory=dict)  # each key's committed values
    next_xid: int = XID_START
    open: list[Transaction] = field(default_factory=list)
    wal: list[Transaction] = field(default_factory=list)  # by commit end: what a slot decodes
    wal_end: int = 0
    slot: int | None = None  # the slot's confirmed position

    def begin(self, rng: random.Random) -> None:
        """A transaction writing up to three keys no open transaction holds (a row lock is held
        until the holder's commit is visible, so a key's changes commit in the WAL's order)."""
        locked = {key for t in self.open for key, _ in t.writes}
        free = [k for k in range(41) if k not in locked]
        if not free:
            return
        tx = Transaction(self.next_xid)
        self.next_xid += 1
        for _ in range(rng.randint(1, 3)):
            key = rng.choice(free)
            tx.writes.append((key, None if rng.random() < 0.25 else rng.randint(0, 10**6)))
        self.open.append(tx)

    def commit(self, rng: random.Random) -> None:
        """The WAL record of an open transaction, or the visibility of one whose record is written."""
        if not self.open:
            return
        tx = rng.choice(self.open)
        if tx.end is None:
            self.wal_end += rng.randint(1, 5)
            tx.end = self.wal_end
            self.wal.append(tx)
            return
        self.open.remove(tx)
        self._apply(tx)

    def create_slot(self) -> None:
        """The slot's consistent point is reached once the transactions running when it was asked
        for finished (PostgreSQL waits for them): every transaction whose commit record comes later
        is decoded, every earlier one is visible to every later snapshot."""
        for tx in [t for t in self.open if t.end is not None]:
            self.open.remove(tx)
            self._apply(tx)
        self.slot = self.wal_end

    def _apply(self, tx: Transaction) -> None:
        for key, value in tx.writes:
            if value is None:
                self.rows.pop(key, None)
            else:
                self.rows[key] = value
            self.history.setdefault(key, [None]).append(value)

    def snapshot(self) -> XidSnapshot:
        running = frozenset(t.xid for t in self.open)
        return XidSnapshot(min(running, default=self.next_xid), self.next_xid, running)

    def read_chunk(self, after: Key | None, size: int) -> tuple[list[tuple[int, int]], ChunkRead]:
        keys = sorted(k for k in self.rows if after is None or (k,) > after)[:size]
        upper = (keys[-1],) if len(keys) == size else None
        self.wal_end += 1  # the read's own WAL insert position moves on
        return [(k, self.rows[k]) for k in keys], ChunkRead(TABLE, upper, self.snapshot(), self.wal_end)

    def decodable(self, start: int, taken: int, n: int) -> list[Transaction]:
        after = [t for t in self.wal if t.end is not None and t.end > start]
        return after[taken : taken + n]


@dataclass
class Attempt:
    progress: CdcProgress
    copy_start: int | None = None  # the temporary copy's start; None while the snapshot is read
    taken: int = 0


Event = tuple[str, int, int | None]  # ("read" | "change", key, value; None: deleted)


def run_simulation(seed: int, steps: int = 400) -> None:
    """Random transactions (commit order unlike xid order; the WAL record before the visibility),
    polls (a chunk of the snapshot, or decoded transactions), checkpoints, completions (some
    notifications lost), aborts and crashes, also mid-snapshot. The sink is exactly once: at a crash
    its output goes back to the restored checkpoint's. Checks: each key's events are a read of a
    value it had (or none if it had none) and then each later committed value once, in order, to
    its last: the snapshot and the stream together give every change once, none twice; a crash
    mid-snapshot resumes after the restored chunks (no key is read twice); the slot only moves
    forward, stays at the consistent point while the snapshot is read, and never passes the last
    completed checkpoint's position."""
    rng = random.Random(seed)
    server = Server()
    for key in range(0, 40, 2):
        server.rows[key] = key
        server.history[key] = [key]
    chunk_size = rng.randint(1, 8)
    output: list[Event] = []
    checkpoints: dict[int, tuple[bytes, int]] = {}  # id -> (state, output length)
    completed: int | None = None
    next_id = 1

    def start(restored: bytes | None) -> Attempt:
        state = SNAPSHOT_PENDING if restored is None else decode_cdc_state(restored, "slot")
        found = None if server.slot is None else SlotFound(server.slot)
        decision = decide_start(state, found, "slot")
        attempt = Attempt(CdcProgress(state))
        match decision:
            case TakeSnapshot(drop_existing=drop):
                assert drop == (server.slot is not None)
                server.slot = None
            case ResumeSnapshot(consistent_point=point):
                assert server.slot == point, "the slot stays at its consistent point during the snapshot"
            case Resume(position=position):
                assert server.slot is not None and server.slot <= position
                attempt.copy_start = server.slot
        return attempt

    def poll(attempt: Attempt) -> None:
        progress = attempt.progress
        if attempt.copy_start is None:
            if progress.state.position is None:
                server.create_slot()
                progress.slot_created(server.wal_end)
                return
            chunk = progress.next_chunk([TABLE])
            if chunk is None:
                progress.snapshot_emitted()
                attempt.copy_start = server.slot
                return
            assert chunk.table == TABLE
            rows, read = server.read_chunk(chunk.after, chunk_size)
            output.extend(("read", key, value) for key, value in rows)
            progress.chunk_emitted(read)
            return
        for tx in server.decodable(attempt.copy_start, attempt.taken, rng.randint(0, 3)):
            attempt.taken += 1
            assert tx.end is not None
            if progress.transaction(tx.end) is TransactionVerdict.SKIP:
                continue
            for key, value in tx.writes:
                if not progress.seen_by_snapshot(TABLE, [(key,)], tx.xid & 0xFFFFFFFF, tx.end):
                    output.append(("change", key, value))
        if rng.random() < 0.5 and not server.decodable(attempt.copy_start, attempt.taken, 1):
            progress.decoded_through(server.wal_end)

    attempt = start(None)
    for _ in range(steps):
        action = rng.choice(["begin", "commit", "commit", "poll", "poll", "checkpoint", "complete", "abort", "crash"])
        if action == "begin":
            server.begin(rng)
        elif action == "commit":
            server.commit(rng)
        elif action == "poll":
            poll(attempt)
        elif action == "checkpoint":
            state = attempt.progress.checkpoint_taken(next_id)
            checkpoints[next_id] = (encode_cdc_state(state, "slot"), len(output))
            next_id += 1
        elif action == "complete" and checkpoints:
            pending = [c for c in checkpoints if completed is None or c > completed]
            if pending:
                checkpoint = rng.choice(pending)
                completed = checkpoint
                if rng.random() < 0.8:  # else the notification is lost
                    advance = attempt.progress.checkpoint_completed(checkpoint)
                    if advance is not None:
                        assert isinstance(advance, AdvanceSlot), "one subtask never announces"
                        assert server.slot is not None and advance.lsn >= server.slot
                        server.slot = advance.lsn
        elif action == "abort" and checkpoints:
            attempt.progress.checkpoint_aborted(rng.choice(list(checkpoints)))
        elif action == "crash":
            restored, length = checkpoints[completed] if completed is not None else (None, 0)
            del output[length:]
            for dead in [c for c in checkpoints if completed is None or c > completed]:
                del checkpoints[dead]  # pending at the crash: they never complete
            attempt = start(restored)
        if completed is not None and server.slot is not None:
            held = decode_cdc_state(checkpoints[completed][0], "slot")
            if held.position is not None:
                assert server.slot <= held.position, "the slot never passes the last completed checkpoint"
    # every transaction commits and becomes visible; then poll until everything is out
    while server.open:
        server.commit(rng)
    for _ in range(10_000):
        if attempt.copy_start is not None and not server.decodable(attempt.copy_start, attempt.taken, 1):
            break
        poll(attempt)
    by_key: dict[int, list[Event]] = {}
    for event in output:
        by_key.setdefault(event[1], []).append(event)
    for key, history in server.history.items():
        events = by_key.pop(key, [])
        values = [value for _, _, value in events]
        reads = [e for e in events if e[0] == "read"]
        assert len(reads) <= 1 and (not reads or events[0] == reads[0]), f"seed {seed}: key {key}: {events}"
        if not reads:
            values = [None, *values]  # no row when its chunk was read
        assert any(history[i:] == values for i in range(len(history))), (
            f"seed {seed}: key {key}: output {values}, committed values {history}"
        )
    assert not by_key, f"seed {seed}: events of keys never written: {by_key}"


@pytest.mark.parametrize("seed", range(250))
def test_simulated_runs_give_each_key_its_read_then_every_later_change_once(seed: int) -> None:
    run_simulation(seed)


def test_a_snapshot_state_with_its_slot_resumes_the_chunks_only_from_the_slot_at_its_consistent_point() -> None:
    state = CdcState(Phase.SNAPSHOT, 500, (ChunkRead(TABLE, (3,), XidSnapshot(9, 9), 510),))
    assert decide_start(state, SlotFound(500), "s") == ResumeSnapshot(500)
    with pytest.raises(CdcSourceError, match="replication slot 's' is gone"):
        decide_start(state, None, "s")
    with pytest.raises(CdcSourceError, match="was advanced to 0/258, past the restored checkpoint's LSN 0/1F4"):
        decide_start(state, SlotFound(600), "s")


# Chunks and visibility, at their boundaries -------------------------------------------------------------


def _chunk(table: str, upper: Key | None, wal_end: int = 100) -> ChunkRead:
    return ChunkRead(table, upper, XidSnapshot(10, 20, frozenset({12})), wal_end)


def test_the_next_chunk_goes_on_after_the_last_one_read_table_by_table() -> None:
    tables = ["public.a", "public.b"]
    assert next_chunk(tables, []) == NextChunk("public.a", None)
    assert next_chunk(tables, [_chunk("public.a", (5,))]) == NextChunk("public.a", (5,))
    assert next_chunk(tables, [_chunk("public.a", (5,)), _chunk("public.a", (9,))]) == NextChunk("public.a", (9,))
    assert next_chunk(tables, [_chunk("public.a", (5,)), _chunk("public.a", None)]) == NextChunk("public.b", None)
    done = [_chunk("public.a", None), _chunk("public.b", ("k",)), _chunk("public.b", None)]
    assert next_chunk(tables, done) is None


@pytest.mark.parametrize(
    ("key", "upper"),
    [
        ((-(10**12),), (5,)),  # below the first chunk's upper bound
        ((5,), (5,)),  # at it: the upper bound is inclusive
        ((6,), (9,)),  # just above it: the next chunk
        ((9,), (9,)),
        ((10,), None),  # above every bound: the last chunk, which has none
        ((10**12,), None),
    ],
)
def test_a_key_belongs_to_the_first_chunk_whose_upper_bound_is_at_or_above_it(key: Key, upper: Key | None) -> None:
    chunks = [_chunk("public.a", (5,)), _chunk("public.b", None), _chunk("public.a", (9,)), _chunk("public.a", None)]
    found = chunk_of(chunks, "public.a", key)
    assert found is not None and found.table == "public.a" and found.upper == upper


def test_composite_and_text_keys_order_as_tuples_and_code_points() -> None:
    chunks = [_chunk("t", (1, "b")), _chunk("t", (2, "a")), _chunk("t", None)]
    assert chunk_of(chunks, "t", (1, "a")) == chunks[0]
    assert chunk_of(chunks, "t", (1, "ba")) == chunks[1], "'ba' sorts after 'b'"
    assert chunk_of(chunks, "t", (1, "Z")) == chunks[0], "upper case sorts first (code points, COLLATE C)"
    assert chunk_of(chunks, "t", (2, "a")) == chunks[1]
    assert chunk_of(chunks, "t", (2, "é")) == chunks[2]


def test_a_table_read_in_one_chunk_holds_every_key_and_an_unread_table_none() -> None:
    chunks = [_chunk("public.a", None)]
    assert chunk_of(chunks, "public.a", None) == chunks[0]
    assert chunk_of(chunks, "public.a", (7,)) == chunks[0]
    assert chunk_of(chunks, "public.b", (7,)) is None
    with pytest.raises(ValueError, match="a key is needed"):
        chunk_of([_chunk("public.a", (5,)), _chunk("public.a", None)], "public.a", None)


@pytest.mark.parametrize(
    ("xid", "near", "wide"),
    [
        (5, 100, 5),
        (0xFFFFFFF0, (1 << 32) + 5, 0xFFFFFFF0),  # just before the wrap, seen from just after it
        (3, (1 << 32) - 5, (1 << 32) + 3),  # just after the wrap, seen from just before it
        (7, (5 << 32) + 9, (5 << 32) + 7),
        ((1 << 31) + 10, (1 << 32) + 5, (1 << 31) + 10),  # more than 2^31 above: the previous era
    ],
)
def test_a_32_bit_xid_widens_to_the_64_bit_one_nearest_its_snapshot(xid: int, near: int, wide: int) -> None:
    assert widen_xid(xid, near) == wide


def test_a_snapshot_sees_the_transactions_below_xmin_and_those_below_xmax_not_in_progress() -> None:
    snapshot = XidSnapshot.parse("100:105:100,103")
    assert snapshot == XidSnapshot(100, 105, frozenset({100, 103}))
    assert [x for x in range(95, 110) if snapshot.sees(x)] == [95, 96, 97, 98, 99, 101, 102, 104]
    wrapped = XidSnapshot((1 << 32) - 2, (1 << 32) + 2, frozenset({(1 << 32) - 1}))
    assert [x for x in [0xFFFFFFFD, 0xFFFFFFFE, 0xFFFFFFFF, 0, 1, 2, 3] if wrapped.sees(x)] == [
        0xFFFFFFFD,
        0xFFFFFFFE,
        0,
        1,
    ]
    with pytest.raises(ValueError):
        XidSnapshot(10, 5)
    with pytest.raises(ValueError):
        XidSnapshot(10, 20, frozenset({25}))


def _streaming(chunks: tuple[ChunkRead, ...], position: int = 50) -> CdcProgress:
    progress = CdcProgress()
    progress.slot_created(position)
    for chunk in chunks:
        progress.chunk_emitted(chunk)
    progress.snapshot_emitted()
    return progress


def test_a_change_is_not_emitted_again_only_when_every_chunk_of_its_rows_saw_it() -> None:
    chunks = (
        ChunkRead(TABLE, (5,), XidSnapshot(10, 20, frozenset({12})), 100),
        ChunkRead(TABLE, None, XidSnapshot(30, 40), 200),
    )
    progress = _streaming(chunks)
    assert progress.transaction(90) is TransactionVerdict.EMIT
    assert progress.seen_by_snapshot(TABLE, [(3,)], 11, 90), "committed before chunk 1 was read"
    assert not progress.seen_by_snapshot(TABLE, [(3,)], 12, 90), "in progress when chunk 1 was read"
    assert not progress.seen_by_snapshot(TABLE, [(3,)], 25, 90), "began after chunk 1 was read"
    assert progress.seen_by_snapshot(TABLE, [(7,)], 25, 90), "committed before chunk 2 was read"
    assert not progress.seen_by_snapshot(TABLE, [(7,), (3,)], 25, 90), "moved from a chunk that did not see it"
    assert not progress.seen_by_snapshot("public.other", [(3,)], 11, 90), "a table no chunk read"
    assert progress.transaction(150) is TransactionVerdict.EMIT
    assert not progress.seen_by_snapshot(TABLE, [(3,)], 11, 150), "its commit ends after chunk 1's read"
    assert progress.seen_by_snapshot(TABLE, [(7,)], 25, 150)
    assert progress.state.chunks == chunks
    assert progress.transaction(200) is TransactionVerdict.EMIT
    assert progress.state.chunks == chunks, "a commit ending at a chunk's wal_end may have been seen"
    progress.decoded_through(201)
    assert progress.state.chunks == (), "past every chunk's read, no chunk saw what comes"
    assert not progress.seen_by_snapshot(TABLE, [(7,)], 25, 250)


# The slot at the job's end ------------------------------------------------------------------------------

KEPT_AT_SAVEPOINT = KeepSlot("the job stopped at a savepoint, which resumes from the slot's position")
KEPT_ALWAYS = KeepSlot("the source keeps its slot (slot_retention='keep'): drop it when done")


@pytest.mark.parametrize(
    ("end", "retention", "decision"),
    [
        (JobEnd.FINISHED, SlotRetention.UNLESS_SAVEPOINT, DropSlot()),
        (JobEnd.STOPPED_AT_SAVEPOINT, SlotRetention.UNLESS_SAVEPOINT, KEPT_AT_SAVEPOINT),
        (JobEnd.CANCELED, SlotRetention.UNLESS_SAVEPOINT, DropSlot()),
        (JobEnd.FAILED, SlotRetention.UNLESS_SAVEPOINT, DropSlot()),
        (JobEnd.FINISHED, SlotRetention.ALWAYS_DROP, DropSlot()),
        (JobEnd.STOPPED_AT_SAVEPOINT, SlotRetention.ALWAYS_DROP, DropSlot()),
        (JobEnd.CANCELED, SlotRetention.ALWAYS_DROP, DropSlot()),
        (JobEnd.FAILED, SlotRetention.ALWAYS_DROP, DropSlot()),
        (JobEnd.FINISHED, SlotRetention.KEEP, KEPT_ALWAYS),
        (JobEnd.STOPPED_AT_SAVEPOINT, SlotRetention.KEEP, KEPT_ALWAYS),
        (JobEnd.CANCELED, SlotRetention.KEEP, KEPT_ALWAYS),
        (JobEnd.FAILED, SlotRetention.KEEP, KEPT_ALWAYS),
    ],
)
def test_the_slot_at_the_jobs_end_for_every_end_and_retention(
    end: JobEnd, retention: SlotRetention, decision: object
) -> None:
    assert decide_slot_at_end(end, retention) == decision


def test_the_slot_table_covers_every_end_and_retention() -> None:
    assert len(list(JobEnd)) * len(list(SlotRetention)) == 12


# The state's JSON -------------------------------------------------------------------------------------


def test_the_state_round_trips_and_is_the_documented_json() -> None:
    streaming = CdcState(Phase.STREAMING, 0x193E920)
    assert encode_cdc_state(streaming, "s") == (
        b'{"format":4,"slot":"s","phase":"streaming","lsn":"0/193E920","partitions":1,"chunks":[]}'
    )
    assert decode_cdc_state(encode_cdc_state(streaming, "s"), "s") == streaming
    assert decode_cdc_state(encode_cdc_state(SNAPSHOT_PENDING, "s"), "s") == SNAPSHOT_PENDING
    chunks = (
        ChunkRead("public.t", (7, "b", UUID(int=3)), XidSnapshot(740, 745, frozenset({741, 743})), 0x193E000),
        ChunkRead("public.t", None, XidSnapshot(745, 745), 0x193E900),
    )
    snapshot = CdcState(Phase.SNAPSHOT, 0x193D000, chunks)
    assert encode_cdc_state(snapshot, "s") == (
        b'{"format":4,"slot":"s","phase":"snapshot","lsn":"0/193D000","partitions":1,"chunks":['
        b'{"table":"public.t","partition":0,'
        b'"upper":[["integer",7],["text","b"],["uuid","00000000-0000-0000-0000-000000000003"]],'
        b'"snapshot":"740:745:741,743","wal_end":"0/193E000"},'
        b'{"table":"public.t","partition":0,"upper":null,"snapshot":"745:745:","wal_end":"0/193E900"}]}'
    )
    assert decode_cdc_state(encode_cdc_state(snapshot, "s"), "s") == snapshot
    parallel = CdcState(
        Phase.PARTITION_READ, 0x193D000, (ChunkRead("public.t", None, XidSnapshot(745, 745), 0x193E900, 2),), 3
    )
    assert encode_cdc_state(parallel, "s") == (
        b'{"format":4,"slot":"s","phase":"partition-read","lsn":"0/193D000","partitions":3,"chunks":['
        b'{"table":"public.t","partition":2,"upper":null,"snapshot":"745:745:","wal_end":"0/193E900"}]}'
    )
    assert decode_cdc_state(encode_cdc_state(parallel, "s"), "s") == parallel
    format_3 = encode_cdc_state(parallel, "s").replace(b'"format":4', b'"format":3')
    assert decode_cdc_state(format_3, "s") == parallel, "format 3 (no idle phase) is still read"
    format_2 = (
        b'{"format":2,"slot":"s","phase":"snapshot","lsn":"0/193D000","chunks":['
        b'{"table":"public.t","upper":[["integer",7],["text","b"],["uuid","00000000-0000-0000-0000-000000000003"]],'
        b'"snapshot":"740:745:741,743","wal_end":"0/193E000"},'
        b'{"table":"public.t","upper":null,"snapshot":"745:745:","wal_end":"0/193E900"}]}'
    )
    assert decode_cdc_state(format_2, "s") == snapshot, "format 2 (one subtask) is still read"
    old = b'{"format":1,"slot":"s","phase":"streaming","lsn":"0/193E920"}'
    assert decode_cdc_state(old, "s") == streaming, "format 1 (no chunks) is still read"


def test_a_state_of_another_slot_is_refused() -> None:
    with pytest.raises(JobDefinitionError, match="state is of replication slot 'a', this source reads 'b'"):
        decode_cdc_state(encode_cdc_state(SNAPSHOT_PENDING, "a"), "b")


@pytest.mark.parametrize(
    "data",
    [
        b'{"format":5,"slot":"s","phase":"snapshot","lsn":null}',
        b'{"format":2,"slot":"s","phase":"partition-read","lsn":"0/1"}',
        b'{"format":4,"slot":"s","phase":"idle","lsn":"0/1","partitions":1,"chunks":[]}',
        b'{"format":3,"slot":"s","phase":"partition-read","lsn":null,"partitions":2,"chunks":[]}',
        b'{"format":3,"slot":"s","phase":"snapshot","lsn":"0/1","partitions":0,"chunks":[]}',
        b'{"format":3,"slot":"s","phase":"snapshot","lsn":"0/1","partitions":2,"chunks":[{"table":"t",'
        b'"partition":2,"upper":null,"snapshot":"5:5:","wal_end":"0/1"}]}',
        b'{"format":1,"slot":"s","phase":"later","lsn":null}',
        b'{"format":2,"slot":"s","phase":"snapshot","lsn":null,"chunks":[{"table":"t","upper":null,'
        b'"snapshot":"5:5:","wal_end":"0/1"}]}',
        b'{"format":2,"slot":"s","phase":"snapshot","lsn":"0/1","chunks":[{"table":"t","upper":[["real",1]],'
        b'"snapshot":"5:5:","wal_end":"0/1"}]}',
        b'{"format":2,"slot":"s","phase":"snapshot","lsn":"0/1","chunks":[{"table":"t","upper":null,'
        b'"snapshot":"9:5:","wal_end":"0/1"}]}',
        b'{"format":1,"slot":"s","phase":"streaming","lsn":null}',
        b'{"format":1,"slot":"s","phase":"streaming","lsn":"nope"}',
        b'{"format":1,"phase":"snapshot","lsn":null}',
        b"not json",
    ],
)
def test_a_malformed_state_is_a_serialization_error(data: bytes) -> None:
    with pytest.raises(SerializationError):
        decode_cdc_state(data, "s")


# The event's JSON -------------------------------------------------------------------------------------


def test_the_change_event_json_form() -> None:
    event = ChangeEvent(
        ChangeOp.UPDATE,
        "public.orders",
        {"id": 1},
        {
            "id": 1,
            "amount": Decimal("1.50"),
            "day": date(2026, 1, 2),
            "at": datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC),
            "ref": UUID(int=1),
            "blob": b"\x01\xff",
            "tags": ["a", None],
            "doc": {"k": Decimal("2")},
            "flag": True,
            "none": None,
        },
        lsn=0x193E920,
        xid=768,
    )
    assert event.to_json() == {
        "format": 1,
        "op": "update",
        "table": "public.orders",
        "before": {"id": 1},
        "after": {
            "id": 1,
            "amount": "1.50",
            "day": "2026-01-02",
            "at": "2026-01-02T03:04:05+00:00",
            "ref": "00000000-0000-0000-0000-000000000001",
            "blob": "\\x01ff",
            "tags": ["a", None],
            "doc": {"k": "2"},
            "flag": True,
            "none": None,
        },
        "lsn": "0/193E920",
        "xid": 768,
    }
    assert event.row == event.after


def test_a_deletes_row_is_its_before() -> None:
    event = ChangeEvent(ChangeOp.DELETE, "public.t", {"id": 3}, None, lsn=5, xid=1)
    assert event.row == {"id": 3}
    assert event.to_json()["after"] is None
