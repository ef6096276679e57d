"""Unaligned checkpoints, end to end in a pure model: a task with keyed-sum state driven by the
BarrierAligner in UNALIGNED mode snapshots on the first barrier and captures the in-flight records of
the other channels (``taskmanager.inflight``); a restore from the snapshot plus the captured records,
replayed before any new input, then fed what each channel sent after its barrier, ends in the state
of a failure-free run. Many seeded interleavings of records, barriers, ends of stream, JobManager
aborts and failures on 2-4 channels."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest

from taskmanager import barrier_aligner as ba
from taskmanager.barrier_aligner import AlignmentMode, BarrierAligner
from taskmanager.inflight import (
    InflightCapture,
    InflightCaptureError,
    InflightState,
    decode_inflight,
    encode_inflight,
)
from taskmanager.network import decode_records, encode_records
from weir.core.errors import SerializationError
from weir.core.ids import ChannelIndex, CheckpointId, JobId, OperatorUid, SubtaskIndex, TaskId

TASK = TaskId(JobId("job"), OperatorUid("sum"), SubtaskIndex(0))
KEYS = ("a", "b", "c", "d")


@dataclass(frozen=True)
class Records:
    """One buffer: (key, amount, sequence number on its channel) records."""

    records: tuple[tuple[str, int, int], ...]


@dataclass(frozen=True)
class BarrierEvent:
    checkpoint_id: CheckpointId


@dataclass(frozen=True)
class End:
    pass


Event = Records | BarrierEvent | End

# Per key: the sum and, per channel, the sequence numbers seen, in order (exactly once, in order).
State = dict[str, tuple[int, dict[int, tuple[int, ...]]]]


def apply_records(state: State, channel: int, blob: bytes) -> None:
    values, _ = decode_records(blob)
    for key, amount, seq in values:
        total, seqs = state.get(key, (0, {}))
        seqs = dict(seqs)
        seqs[channel] = (*seqs.get(channel, ()), seq)
        state[key] = (total + amount, seqs)


def copy_state(state: State) -> State:
    return {k: (total, dict(seqs)) for k, (total, seqs) in state.items()}


def channel_streams(rng: random.Random, channels: int, checkpoints: int) -> list[list[Event]]:
    """What each upstream sends: buffers of records, barriers 1..N (a channel may end early, after
    fewer barriers: its upstream finished), then its end of stream."""
    streams: list[list[Event]] = []
    for _ in range(channels):
        seq = 0
        events: list[Event] = []
        last = checkpoints if rng.random() < 0.8 else rng.randint(0, checkpoints)
        for cid in range(1, last + 2):
            for _ in range(rng.randint(0, 4)):
                batch = []
                for _ in range(rng.randint(1, 3)):
                    batch.append((rng.choice(KEYS), rng.randint(1, 9), seq))
                    seq += 1
                events.append(Records(tuple(batch)))
            if cid <= last:
                events.append(BarrierEvent(CheckpointId(cid)))
        events.append(End())
        streams.append(events)
    return streams


def after_barrier(stream: list[Event], checkpoint_id: CheckpointId | None) -> list[Event]:
    """What the channel's upstream sends again after a restore from ``checkpoint_id``: everything after
    its barrier (only its end of stream if it ended before it: all it sent is in the checkpoint)."""
    if checkpoint_id is None:
        return list(stream)
    for i, event in enumerate(stream):
        if event == BarrierEvent(checkpoint_id):
            return stream[i + 1 :]
    return [End()]


def interleave(rng: random.Random, streams: list[list[Event]]) -> list[tuple[int, Event]]:
    cursors = [0] * len(streams)
    merged: list[tuple[int, Event]] = []
    while True:
        live = [c for c, s in enumerate(streams) if cursors[c] < len(s)]
        if not live:
            return merged
        c = rng.choice(live)
        merged.append((c, streams[c][cursors[c]]))
        cursors[c] += 1


@dataclass
class Completed:
    checkpoint_id: CheckpointId
    state: State
    inflight: bytes  # the persisted document


@dataclass
class ModelTask:
    """The input loop of taskmanager.task in miniature: records into the keyed sums, control events
    into the aligner, its actions carried out as the runtime does."""

    channels: int
    state: State
    aligner: BarrierAligner = field(init=False)
    capture: InflightCapture | None = None
    snapshot: State | None = None
    completed: list[Completed] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.aligner = BarrierAligner(TASK, self.channels, AlignmentMode.UNALIGNED)

    def feed(self, channel: int, event: Event, now: float) -> None:
        ch = ChannelIndex(channel)
        match event:
            case Records(records=records):
                blob = encode_records(list(records), [None] * len(records))
                apply_records(self.state, channel, blob)
                if self.capture is not None:
                    self.capture.add(ch, blob)
            case BarrierEvent(checkpoint_id=cid):
                self.apply(self.aligner.on_barrier(ch, cid, now=now))
            case End():
                self.apply(self.aligner.on_end_of_stream(ch, now=now))

    def abort(self, checkpoint_id: CheckpointId) -> None:
        self.apply(self.aligner.abort(checkpoint_id))

    def apply(self, actions: tuple[ba.Action, ...]) -> None:
        for action in actions:
            match action:
                case ba.TriggerSnapshot(checkpoint_id=cid, capture_inflight=capture):
                    if capture:
                        self.snapshot = copy_state(self.state)
                        self.capture = InflightCapture(cid)
                    else:  # a single live channel: nothing can be in flight
                        self.completed.append(
                            Completed(cid, copy_state(self.state), encode_inflight(InflightState(cid)))
                        )
                case ba.StartCapture(channel=channel, checkpoint_id=cid):
                    assert self.capture is not None and self.capture.checkpoint_id == cid
                    self.capture.start(channel)
                case ba.StopCapture(channel=channel, checkpoint_id=cid):
                    assert self.capture is not None and self.capture.checkpoint_id == cid
                    self.capture.stop(channel)
                case ba.InflightCaptureComplete(checkpoint_id=cid):
                    assert self.capture is not None and self.snapshot is not None
                    assert self.capture.checkpoint_id == cid
                    self.completed.append(Completed(cid, self.snapshot, encode_inflight(self.capture.complete())))
                    self.capture, self.snapshot = None, None
                case ba.AbortedCheckpoint():
                    self.capture, self.snapshot = None, None
                case ba.BlockChannel() | ba.UnblockChannels():
                    raise AssertionError(f"unaligned mode blocked a channel: {action}")
                case ba.ForwardCancellation() | ba.AllChannelsEnded():
                    pass


def restored_task(channels: int, completed: Completed | None) -> ModelTask:
    """The snapshot's state, then the in-flight records replayed, before any new input."""
    if completed is None:
        return ModelTask(channels, {})
    task = ModelTask(channels, copy_state(completed.state))
    inflight = decode_inflight(completed.inflight, f"of checkpoint {completed.checkpoint_id}")
    assert inflight.checkpoint_id == completed.checkpoint_id
    for channel, blob in inflight.replay():
        apply_records(task.state, channel, blob)
    return task


def failure_free(channels: int, streams: list[list[Event]]) -> State:
    state: State = {}
    for channel, stream in enumerate(streams):
        for event in stream:
            if isinstance(event, Records):
                apply_records(state, channel, encode_records(list(event.records), [None] * len(event.records)))
    return state


@pytest.mark.parametrize("seed", range(400))
def test_restore_from_snapshot_and_inflight_records_equals_a_failure_free_run(seed: int) -> None:
    rng = random.Random(seed)
    channels = rng.randint(2, 4)
    streams = channel_streams(rng, channels, checkpoints=rng.randint(1, 5))
    expected = failure_free(channels, streams)

    latest: Completed | None = None
    failures = rng.randint(0, 3)
    task = restored_task(channels, None)
    now = 0.0
    while True:
        start = latest.checkpoint_id if latest is not None else None
        events = interleave(rng, [after_barrier(s, start) for s in streams])
        fail_at = rng.randint(0, len(events)) if failures else None
        for i, (channel, event) in enumerate(events):
            if i == fail_at:
                break
            now += 1.0
            task.feed(channel, event, now)
            pending = task.aligner.pending_checkpoint
            if pending is not None and rng.random() < 0.03:  # the JobManager gives up on it
                task.abort(pending)
        else:
            fail_at = None
        if task.completed:
            latest = task.completed[-1]
        if fail_at is None:
            break
        failures -= 1
        task = restored_task(channels, latest)

    assert task.state == expected


def test_the_captured_records_are_those_between_the_first_barrier_and_each_channels_own() -> None:
    task = ModelTask(3, {})
    rec = [Records(((k, 1, i),)) for i, k in enumerate("abcdef")]
    task.feed(0, rec[0], 1.0)  # before the checkpoint: in the snapshot
    task.feed(0, BarrierEvent(CheckpointId(1)), 2.0)  # snapshot here; channels 1 and 2 capture
    task.feed(0, rec[1], 3.0)  # after channel 0's barrier: not the checkpoint's
    task.feed(1, rec[2], 4.0)  # in flight on channel 1
    task.feed(2, rec[3], 5.0)  # in flight on channel 2
    task.feed(1, rec[4], 6.0)
    task.feed(1, BarrierEvent(CheckpointId(1)), 7.0)
    task.feed(1, rec[5], 8.0)  # after channel 1's barrier
    assert not task.completed
    task.feed(2, End(), 9.0)  # channel 2 ends: the capture is complete
    (done,) = task.completed
    assert done.state == {"a": (1, {0: (0,)})}
    inflight = decode_inflight(done.inflight, "test")
    replayed = [(c, decode_records(b)[0]) for c, b in inflight.replay()]
    assert replayed == [(1, [("c", 1, 2)]), (1, [("e", 1, 4)]), (2, [("d", 1, 3)])]


def test_a_savepoint_stays_aligned_and_captures_nothing() -> None:
    aligner = BarrierAligner(TASK, 2, AlignmentMode.UNALIGNED)
    first = aligner.on_barrier(ChannelIndex(0), CheckpointId(1), ba.CheckpointKind.SAVEPOINT, now=1.0)
    assert first == (ba.BlockChannel(ChannelIndex(0)),)


def test_inflight_document_round_trips_and_refuses_another_format() -> None:
    state = InflightState(CheckpointId(7), {ChannelIndex(2): (b"x", b"yz"), ChannelIndex(0): (b"\x00",)})
    decoded = decode_inflight(encode_inflight(state), "test")
    assert decoded == state
    assert list(decoded.replay()) == [(0, b"\x00"), (2, b"x"), (2, b"yz")]
    assert decoded.size_bytes == 4 and decoded.buffer_count == 3
    with pytest.raises(SerializationError, match="format"):
        decode_inflight(b'{"format": 9}', "test")
    with pytest.raises(SerializationError, match="malformed"):
        decode_inflight(b'{"format": 1, "checkpoint_id": 1, "channels": [{"channel": 0}]}', "test")


def test_capture_protocol_errors() -> None:
    capture = InflightCapture(CheckpointId(1))
    capture.start(ChannelIndex(0))
    with pytest.raises(InflightCaptureError):
        capture.start(ChannelIndex(0))
    with pytest.raises(InflightCaptureError):
        capture.stop(ChannelIndex(1))
    with pytest.raises(InflightCaptureError):
        capture.complete()
    capture.add(ChannelIndex(1), b"ignored: channel 1 does not capture")
    capture.add(ChannelIndex(0), b"kept")
    capture.stop(ChannelIndex(0))
    assert capture.complete() == InflightState(CheckpointId(1), {ChannelIndex(0): (b"kept",)})
