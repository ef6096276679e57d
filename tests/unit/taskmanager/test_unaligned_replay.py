"""Unaligned checkpoints, end to end in a pure model: a task with keyed-sum state driven by the
BarrierAligner in UNALIGNED mode takes each barrier as a priority event ahead of its channel's queue,
snapshots on the first one and captures the in-flight records: those its barriers overtook and those
the other channels deliver until their own barrier (``weir.taskmanager.inflight``). A restore from the
snapshot plus the captured records, replayed before any new input, then fed what each channel sent
after its barrier, ends in the state of a failure-free run. Many seeded interleavings of deliveries
and takes of records, barriers, ends of stream, JobManager aborts and failures on 2-4 channels."""

from __future__ import annotations

import base64
import json
import random
from collections import deque
from dataclasses import dataclass, field

import pytest

from weir.core.checkpointing import CheckpointingMode
from weir.core.errors import SerializationError
from weir.core.ids import ChannelIndex, CheckpointId, JobId, OperatorUid, SubtaskIndex, TaskId
from weir.taskmanager import barrier_aligner as ba
from weir.taskmanager.barrier_aligner import BarrierAligner
from weir.taskmanager.inflight import (
    InflightCapture,
    InflightCaptureError,
    InflightState,
    OutputTarget,
    decode_inflight,
    encode_inflight,
    parse_message,
    persistable,
)
from weir.taskmanager.network.codec import encode_records, read_buffer
from weir.wire.taskmanager_pb2 import DataMessage, EventKind

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


def message_of(records: tuple[tuple[str, int, int], ...]) -> DataMessage:
    return DataMessage(records=encode_records(list(records), [None] * len(records)), record_count=len(records))


def apply_records(state: State, channel: int, message: DataMessage) -> None:
    for key, amount, seq in read_buffer(message).values:
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


@dataclass
class Completed:
    checkpoint_id: CheckpointId
    state: State
    inflight: bytes  # the persisted document


CREDITS = 3  # buffers an input channel queues at most; a priority barrier takes no credit


@dataclass
class ModelTask:
    """The input loop of weir.taskmanager.task in miniature, with its input gate: each channel queues what
    its upstream sent (up to its credits); a barrier is a priority event, handled on arrival with the
    buffers it overtook; records go into the keyed sums, control events into the aligner, whose
    actions are carried out as the runtime does."""

    channels: int
    state: State
    aligned_start: bool = False  # aligned-checkpoint-timeout: barriers queue in order until they time out
    aligner: BarrierAligner = field(init=False)
    queues: list[deque[Event]] = field(init=False)
    capture: InflightCapture | None = None
    snapshot: State | None = None
    completed: list[Completed] = field(default_factory=list)
    _overtaken: list[DataMessage] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.aligner = BarrierAligner(
            TASK, self.channels, CheckpointingMode.UNALIGNED, aligned_start=self.aligned_start
        )
        self.queues = [deque() for _ in range(self.channels)]

    def can_arrive(self, channel: int, event: Event) -> bool:
        priority = isinstance(event, BarrierEvent) and not self.aligned_start
        return priority or len(self.queues[channel]) < CREDITS

    def can_take(self, channel: int) -> bool:
        return bool(self.queues[channel]) and ChannelIndex(channel) not in self.aligner.blocked_channels

    def queued_barriers(self) -> list[int]:
        return [c for c, q in enumerate(self.queues) if any(isinstance(e, BarrierEvent) for e in q)]

    def time_out(self, channel: int, now: float) -> None:
        """The channel's queued barrier timed out: it becomes a priority event overtaking its queue."""
        queue = self.queues[channel]
        position = next(i for i, e in enumerate(queue) if isinstance(e, BarrierEvent))
        barrier = queue[position]
        assert isinstance(barrier, BarrierEvent)
        del queue[position]
        self._overtaken = [message_of(e.records) for e in list(queue)[:position] if isinstance(e, Records)]
        self.apply(self.aligner.on_barrier(ChannelIndex(channel), barrier.checkpoint_id, now=now, priority=True))
        self._overtaken = []

    def arrive(self, channel: int, event: Event, now: float) -> None:
        """The upstream's next event reaches the channel: queued, or (a barrier) handled at once."""
        match event:
            case BarrierEvent() if self.aligned_start:
                self.queues[channel].append(event)
            case BarrierEvent(checkpoint_id=cid):
                self._overtaken = [message_of(e.records) for e in self.queues[channel] if isinstance(e, Records)]
                self.apply(self.aligner.on_barrier(ChannelIndex(channel), cid, now=now, priority=True))
                self._overtaken = []
            case Records() | End():
                self.queues[channel].append(event)

    def take(self, channel: int, now: float) -> None:
        """The task takes the head of the channel's queue."""
        ch = ChannelIndex(channel)
        match self.queues[channel].popleft():
            case Records(records=records):
                message = message_of(records)
                apply_records(self.state, channel, message)
                if self.capture is not None:
                    self.capture.add(ch, message)
            case End():
                self.apply(self.aligner.on_end_of_stream(ch, now=now))
            case BarrierEvent(checkpoint_id=cid):
                assert self.aligned_start, "a priority barrier was queued"
                self.apply(self.aligner.on_barrier(ch, cid, now=now))

    def abort(self, checkpoint_id: CheckpointId) -> None:
        self.apply(self.aligner.abort(checkpoint_id))

    def apply(self, actions: tuple[ba.Action, ...]) -> None:
        for action in actions:
            match action:
                case ba.TriggerSnapshot(checkpoint_id=cid, capture_inflight=capture):
                    if capture:
                        self.snapshot = copy_state(self.state)
                        self.capture = InflightCapture(cid)
                    else:  # aligned to the end: every channel delivered its barrier
                        assert self.aligned_start, "an unaligned checkpoint always keeps what its barriers overtook"
                        inflight = encode_inflight(InflightState(cid))
                        self.completed.append(Completed(cid, copy_state(self.state), inflight))
                case ba.StartCapture(channel=channel, checkpoint_id=cid):
                    assert self.capture is not None and self.capture.checkpoint_id == cid
                    self.capture.start(channel)
                case ba.StopCapture(channel=channel, checkpoint_id=cid):
                    assert self.capture is not None and self.capture.checkpoint_id == cid
                    self.capture.stop(channel)
                case ba.CaptureQueued(channel=channel, checkpoint_id=cid):
                    assert self.capture is not None and self.capture.checkpoint_id == cid
                    self.capture.add_queued(channel, self._overtaken)
                case ba.InflightCaptureComplete(checkpoint_id=cid):
                    assert self.capture is not None and self.snapshot is not None
                    assert self.capture.checkpoint_id == cid
                    self.completed.append(Completed(cid, self.snapshot, encode_inflight(self.capture.complete())))
                    self.capture, self.snapshot = None, None
                case ba.AbortedCheckpoint():
                    self.capture, self.snapshot = None, None
                case ba.BlockChannel() | ba.UnblockChannels():
                    assert self.aligned_start, f"unaligned mode blocked a channel: {action}"
                case ba.ForwardCancellation() | ba.AllChannelsEnded():
                    pass


def restored_task(channels: int, completed: Completed | None, aligned_start: bool = False) -> ModelTask:
    """The snapshot's state, then the in-flight records replayed, before any new input."""
    if completed is None:
        return ModelTask(channels, {}, aligned_start)
    task = ModelTask(channels, copy_state(completed.state), aligned_start)
    inflight = decode_inflight(completed.inflight, f"of checkpoint {completed.checkpoint_id}")
    assert inflight.checkpoint_id == completed.checkpoint_id
    for channel, blob in inflight.replay():
        apply_records(task.state, channel, parse_message(blob, "test"))
    return task


def run(rng: random.Random, task: ModelTask, streams: list[list[Event]], fail_after: int | None) -> bool:
    """Deliver and take in a random order until every stream is taken (True) or ``fail_after`` steps
    (False: the task died, its queues are lost). The JobManager now and then aborts the pending one."""
    cursors = [0] * len(streams)
    now = 0.0
    while fail_after is None or now < fail_after:
        steps = [
            ("arrive", c) for c, s in enumerate(streams) if cursors[c] < len(s) and task.can_arrive(c, s[cursors[c]])
        ]
        steps += [("take", c) for c in range(len(task.queues)) if task.can_take(c)]
        if rng.random() < 0.3:  # now and then a barrier times out
            steps += [("time_out", c) for c in task.queued_barriers()]
        if not steps:
            return True
        kind, channel = rng.choice(steps)
        now += 1.0
        match kind:
            case "arrive":
                task.arrive(channel, streams[channel][cursors[channel]], now)
                cursors[channel] += 1
            case "take":
                task.take(channel, now)
            case "time_out":
                task.time_out(channel, now)
        pending = task.aligner.pending_checkpoint
        if pending is not None and rng.random() < 0.03:
            task.abort(pending)
    return False


def failure_free(channels: int, streams: list[list[Event]]) -> State:
    state: State = {}
    for channel, stream in enumerate(streams):
        for event in stream:
            if isinstance(event, Records):
                apply_records(state, channel, message_of(event.records))
    return state


@pytest.mark.parametrize("seed", range(400))
def test_restore_from_snapshot_and_inflight_records_equals_a_failure_free_run(seed: int) -> None:
    rng = random.Random(seed)
    aligned_start = seed % 2 == 1  # odd seeds: aligned-checkpoint-timeout, aligned until a barrier times out
    channels = rng.randint(2, 4)
    streams = channel_streams(rng, channels, checkpoints=rng.randint(1, 5))
    expected = failure_free(channels, streams)

    latest: Completed | None = None
    failures = rng.randint(0, 3)
    task = restored_task(channels, None, aligned_start)
    while True:
        start = latest.checkpoint_id if latest is not None else None
        todo = [after_barrier(s, start) for s in streams]
        fail_after = rng.randint(0, 2 * sum(map(len, todo))) if failures else None
        finished = run(rng, task, todo, fail_after)
        if task.completed:
            latest = task.completed[-1]
        if finished:
            break
        failures -= 1
        task = restored_task(channels, latest, aligned_start)

    assert task.state == expected


def test_the_captured_records_are_those_between_the_first_barrier_and_each_channels_own() -> None:
    task = ModelTask(3, {})
    rec = [Records(((k, 1, i),)) for i, k in enumerate("abcdefg")]
    task.arrive(0, rec[0], 1.0)
    task.take(0, 1.0)  # before the checkpoint: in the snapshot
    task.arrive(0, rec[6], 1.5)  # queued on channel 0 when its barrier arrives: overtaken, in flight
    task.arrive(0, BarrierEvent(CheckpointId(1)), 2.0)  # snapshot here; channels 1 and 2 capture
    task.arrive(0, rec[1], 3.0)  # after channel 0's barrier: not the checkpoint's
    for channel, record in ((1, rec[2]), (2, rec[3]), (1, rec[4])):  # in flight on channels 1 and 2
        task.arrive(channel, record, 4.0)
        task.take(channel, 4.0)
    task.arrive(1, rec[5], 6.0)  # queued on channel 1 ahead of its barrier: in flight too
    task.arrive(1, BarrierEvent(CheckpointId(1)), 7.0)
    assert not task.completed
    task.arrive(2, End(), 9.0)
    task.take(2, 9.0)  # channel 2 ends: the capture is complete
    (done,) = task.completed
    assert done.state == {"a": (1, {0: (0,)})}
    inflight = decode_inflight(done.inflight, "test")
    replayed = [(c, read_buffer(parse_message(b, "test")).values) for c, b in inflight.replay()]
    assert replayed == [
        (0, [("g", 1, 6)]),
        (1, [("c", 1, 2)]),
        (1, [("e", 1, 4)]),
        (1, [("f", 1, 5)]),
        (2, [("d", 1, 3)]),
    ]
    assert inflight.outputs == {}


def test_a_savepoint_stays_aligned_and_captures_nothing() -> None:
    aligner = BarrierAligner(TASK, 2, CheckpointingMode.UNALIGNED)
    first = aligner.on_barrier(ChannelIndex(0), CheckpointId(1), ba.CheckpointKind.SAVEPOINT, now=1.0)
    assert first == (ba.BlockChannel(ChannelIndex(0)),)


WATERMARK = DataMessage(event=EventKind.EVENT_KIND_WATERMARK, watermark=9).SerializeToString()


def _blob(*values: int) -> bytes:
    return message_of(tuple(("k", v, v) for v in values)).SerializeToString()


def test_inflight_document_round_trips_and_refuses_another_format() -> None:
    state = InflightState(
        CheckpointId(7),
        {ChannelIndex(2): (_blob(1), _blob(2, 3)), ChannelIndex(0): (_blob(4),)},
        {
            (1, 0): (_blob(5),),
            (0, 2): (DataMessage(event=EventKind.EVENT_KIND_WATERMARK, watermark=9).SerializeToString(),),
        },
        targets={0: OutputTarget("sum", 1, "map"), 1: OutputTarget("late", 0, "win", "late-events")},
    )
    decoded = decode_inflight(encode_inflight(state), "test")
    assert decoded == state and decoded.targets_named
    assert list(decoded.replay()) == [(0, _blob(4)), (2, _blob(1)), (2, _blob(2, 3))]
    assert [key for key, _ in decoded.replay_outputs()] == [(0, 2), (1, 0)]
    assert decoded.buffer_count == 5
    with pytest.raises(SerializationError, match="format"):
        decode_inflight(b'{"format": 9}', "test")
    with pytest.raises(SerializationError, match="malformed"):
        decode_inflight(b'{"format": 2, "checkpoint_id": 1, "input": [{"channel": 0}]}', "test")
    with pytest.raises(SerializationError, match="control event"):
        barrier = DataMessage(event=EventKind.EVENT_KIND_BARRIER, checkpoint_id=1).SerializeToString()
        decode_inflight(encode_inflight(InflightState(CheckpointId(1), {ChannelIndex(0): (barrier,)})), "test")


def test_a_format_1_document_of_record_blobs_is_still_read() -> None:
    blob = encode_records([("k", 1, 0), ("k", 2, 1)], [None, None])
    old = json.dumps(
        {"format": 1, "checkpoint_id": 3, "channels": [{"channel": 1, "buffers": [base64.b64encode(blob).decode()]}]}
    ).encode()
    decoded = decode_inflight(old, "test")
    ((channel, message),) = list(decoded.replay())
    assert channel == 1 and read_buffer(parse_message(message, "test")).values == [("k", 1, 0), ("k", 2, 1)]


def test_only_records_and_watermarks_are_kept_of_a_buffer() -> None:
    records = message_of((("k", 1, 0),))
    with_barrier = DataMessage()
    with_barrier.CopyFrom(records)
    with_barrier.event = EventKind.EVENT_KIND_BARRIER
    assert persistable(with_barrier) == records.SerializeToString()
    assert persistable(DataMessage(event=EventKind.EVENT_KIND_CANCEL_BARRIER, checkpoint_id=2)) is None
    assert persistable(DataMessage(event=EventKind.EVENT_KIND_END_OF_STREAM)) is None
    watermark = DataMessage(event=EventKind.EVENT_KIND_WATERMARK, watermark=5)
    assert persistable(watermark) == watermark.SerializeToString()


def test_capture_protocol_errors() -> None:
    target = OutputTarget("sink", 0, "sum")
    capture = InflightCapture(CheckpointId(1), targets={0: target})
    capture.start(ChannelIndex(0))
    with pytest.raises(InflightCaptureError):
        capture.start(ChannelIndex(0))
    with pytest.raises(InflightCaptureError):
        capture.stop(ChannelIndex(1))
    with pytest.raises(InflightCaptureError):
        capture.complete()
    with pytest.raises(InflightCaptureError, match="still captures"):
        capture.add_queued(ChannelIndex(0), [])
    capture.add(ChannelIndex(1), message_of((("ignored: channel 1 does not capture", 0, 0),)))
    kept = message_of((("kept", 1, 0),))
    capture.add(ChannelIndex(0), kept)
    capture.stop(ChannelIndex(0))
    capture.add_outputs((0, 1), [kept])
    with pytest.raises(InflightCaptureError, match="twice"):
        capture.add_outputs((0, 1), [])
    with pytest.raises(InflightCaptureError, match="output 1 names no edge"):
        capture.add_outputs((1, 0), [kept])
    assert capture.complete() == InflightState(
        CheckpointId(1),
        {ChannelIndex(0): (kept.SerializeToString(),)},
        {(0, 1): (kept.SerializeToString(),)},
        targets={0: target},
    )
