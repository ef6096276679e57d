"""The CDC source's pure part: the position state machine (simulated against a model of the slot,
with crashes, lost notifications and aborts), the start decision, the state's JSON and the event's."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from decimal import Decimal
from uuid import UUID

import pytest

from weir.core.cdc import (
    SNAPSHOT_PENDING,
    CdcProgress,
    CdcSourceError,
    CdcState,
    ChangeEvent,
    ChangeOp,
    Phase,
    Resume,
    SlotFound,
    TakeSnapshot,
    TransactionVerdict,
    decide_start,
    decode_cdc_state,
    encode_cdc_state,
    format_lsn,
    parse_lsn,
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


def test_a_state_has_a_position_exactly_when_streaming() -> None:
    with pytest.raises(ValueError):
        CdcState(Phase.SNAPSHOT, 5)
    with pytest.raises(ValueError):
        CdcState(Phase.STREAMING, None)


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
    progress.snapshot_emitted(10)
    with pytest.raises(ValueError):
        progress.snapshot_emitted(20)


def test_the_slot_advances_to_a_completed_checkpoints_position_once_and_never_back() -> None:
    progress = CdcProgress()
    assert progress.checkpoint_taken(1) == SNAPSHOT_PENDING
    progress.snapshot_emitted(10)
    progress.checkpoint_taken(2)
    progress.transaction(20)
    progress.checkpoint_taken(3)
    progress.transaction(30)
    progress.checkpoint_taken(4)
    assert progress.checkpoint_completed(1) is None, "the snapshot's checkpoint holds no position"
    assert progress.checkpoint_completed(3) == 20
    assert progress.pending_checkpoints == [4], "checkpoint 2 is covered by 3"
    assert progress.checkpoint_completed(2) is None, "late: covered"
    progress.checkpoint_aborted(4)
    assert progress.checkpoint_completed(4) is None, "aborted"
    progress.checkpoint_taken(5)
    assert progress.checkpoint_completed(5) == 30
    progress.checkpoint_taken(6)  # no new transaction: the same position
    assert progress.checkpoint_completed(6) is None, "the slot is there already"
    assert progress.checkpoint_completed(99) is None, "unknown"


# The progress, simulated --------------------------------------------------------------------------------


@dataclass
class Server:
    """A model of the database: committed transactions (by their commit's end LSN) and the slot."""

    wal_end: int = 0
    committed: list[int] = field(default_factory=list)
    slot: int | None = None  # the slot's confirmed position

    def commit(self, rng: random.Random) -> None:
        self.wal_end += rng.randint(1, 5)
        self.committed.append(self.wal_end)

    def decodable(self, start: int, taken: int, n: int) -> list[int]:
        """What the temporary copy of the slot (made at ``start``) returns after ``taken`` ones."""
        after = [t for t in self.committed if t > start]
        return after[taken : taken + n]


@dataclass
class Attempt:
    progress: CdcProgress
    copy_start: int | None = None  # the temporary copy's start; None before the snapshot
    taken: int = 0


def run_simulation(seed: int, steps: int = 300) -> None:
    """Random commits, polls, checkpoints, completions (some notifications lost), aborts and crashes.
    The sink is exactly once: at a crash its output goes back to the restored checkpoint's. Checks:
    the final output is the snapshot's transactions, then every later one once, in order; the slot
    only moves forward and never past the position of the last completed checkpoint."""
    rng = random.Random(seed)
    server = Server()
    for _ in range(rng.randint(0, 5)):
        server.commit(rng)
    output: list[tuple[str, int]] = []  # ("snapshot", consistent point) or ("tx", end)
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
            case Resume(position=position):
                assert server.slot is not None and server.slot <= position
                attempt.copy_start = server.slot
        return attempt

    attempt = start(None)
    for _ in range(steps):
        action = rng.choice(["commit", "commit", "poll", "poll", "checkpoint", "complete", "abort", "crash"])
        if action == "commit":
            server.commit(rng)
        elif action == "poll":
            if attempt.copy_start is None:  # the snapshot: a new slot at the WAL's end
                server.slot = server.wal_end
                output.append(("snapshot", server.wal_end))
                attempt.progress.snapshot_emitted(server.wal_end)
                attempt.copy_start = server.wal_end
            else:
                batch = server.decodable(attempt.copy_start, attempt.taken, rng.randint(0, 3))
                attempt.taken += len(batch)
                for end in batch:
                    if attempt.progress.transaction(end) is TransactionVerdict.EMIT:
                        output.append(("tx", end))
                if rng.random() < 0.5:  # the decoder read to the WAL's end
                    rest = server.decodable(attempt.copy_start, attempt.taken, 10**9)
                    if not rest:
                        attempt.progress.decoded_through(server.wal_end)
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
                        assert server.slot is not None and advance >= server.slot
                        server.slot = advance
        elif action == "abort" and checkpoints:
            attempt.progress.checkpoint_aborted(rng.choice(list(checkpoints)))
        elif action == "crash":
            restored, length = checkpoints[completed] if completed is not None else (None, 0)
            del output[length:]
            for dead in [c for c in checkpoints if completed is None or c > completed]:
                del checkpoints[dead]  # pending at the crash: they never complete
            attempt = start(restored)
        if completed is not None and server.slot is not None:
            held = decode_cdc_state(checkpoints[completed][0], "slot").position
            assert held is None or server.slot <= held, "the slot never passes the last completed checkpoint"
    # drain: poll until everything committed is out
    if attempt.copy_start is None:
        server.slot = server.wal_end
        output.append(("snapshot", server.wal_end))
        attempt.progress.snapshot_emitted(server.wal_end)
        attempt.copy_start = server.wal_end
    for end in server.decodable(attempt.copy_start, attempt.taken, 10**9):
        if attempt.progress.transaction(end) is TransactionVerdict.EMIT:
            output.append(("tx", end))
    kind, snapshot_at = output[0]
    assert kind == "snapshot"
    assert [o for o in output if o[0] == "snapshot"] == [output[0]], "one snapshot in the output"
    assert output[1:] == [("tx", end) for end in server.committed if end > snapshot_at], f"seed {seed}"


@pytest.mark.parametrize("seed", range(400))
def test_simulated_runs_emit_every_transaction_once_after_the_snapshot(seed: int) -> None:
    run_simulation(seed)


# The state's JSON -------------------------------------------------------------------------------------


def test_the_state_round_trips_and_is_the_documented_json() -> None:
    streaming = CdcState(Phase.STREAMING, 0x193E920)
    assert encode_cdc_state(streaming, "s") == b'{"format":1,"slot":"s","phase":"streaming","lsn":"0/193E920"}'
    assert decode_cdc_state(encode_cdc_state(streaming, "s"), "s") == streaming
    assert decode_cdc_state(encode_cdc_state(SNAPSHOT_PENDING, "s"), "s") == SNAPSHOT_PENDING


def test_a_state_of_another_slot_is_refused() -> None:
    with pytest.raises(JobDefinitionError, match="state is of replication slot 'a', this source reads 'b'"):
        decode_cdc_state(encode_cdc_state(SNAPSHOT_PENDING, "a"), "b")


@pytest.mark.parametrize(
    "data",
    [
        b'{"format":2,"slot":"s","phase":"snapshot","lsn":null}',
        b'{"format":1,"slot":"s","phase":"later","lsn":null}',
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
