"""What a subtask restores before it opens its chain, after Flink's ``StreamTaskStateInitializerImpl``
(keyed and operator state) and ``SequentialChannelStateReader`` (in-flight data).

From the task-state documents the JobManager deployed with the task, it restores the subtask's key
groups into its RocksDB, gives each operator its own state (or, from another job's checkpoint, the
union of the old subtasks' states), and turns an unaligned checkpoint's in-flight records into an
:class:`InflightReplay`: output buffers to send (or, at another parallelism, records to emit anew)
and input buffers to feed into the chain, before any new input. Records of a keyed edge restored at
another parallelism go to the subtask owning their key group now.

A one-way collaborator of the task: it is given the chain, the keyed state and the plan's view of
the task's channels, and answers the replay; it never reaches back into the task.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, assert_never

import pyarrow as pa

from weir.connectors.object_storage import CheckpointStorage
from weir.core.columnar import BatchKeys, FieldKey, is_batch
from weir.core.errors import Fault, WeirError
from weir.core.ids import ChannelIndex, CheckpointId, JobId, OperatorUid
from weir.core.keygroups import KeyEncoder, KeyGroupRange
from weir.core.rescale import key_group_sources
from weir.core.state_schema import merge_stored_schemas
from weir.core.task_state import (
    INFLIGHT_REDISTRIBUTION_REFUSED,
    SubtaskLayout,
    TaskStateDocument,
    read_operator_states,
)
from weir.graph import Partitioning
from weir.operators.base import InheritedState
from weir.operators.keyed import KeyedOperator
from weir.plan import Vertex
from weir.taskmanager.chain import OperatorChain
from weir.taskmanager.inflight import (
    INFLIGHT_STATE_NAME,
    InflightState,
    InputOrigin,
    OutputTarget,
    decode_inflight,
    parse_message,
)
from weir.taskmanager.network.codec import encode_into, encode_records, read_buffer
from weir.taskmanager.network.writer import TaskOutputs
from weir.taskmanager.snapshots import KeyedStateHandle, SnapshotError, TaskKeyedState, keyed_state_from_document
from weir.taskmanager.task_types import Cancelled, ChainRestore, InheritedRestore, Restore, TaskAddress
from weir.wire.taskmanager_pb2 import DataMessage


class InflightStateNotRedistributable(WeirError):
    """A restore met in-flight records of an unaligned checkpoint that it cannot place (documented
    limits: another operator chain, a broadcast edge at another parallelism, output buffers named by
    index only in a task that now has several outputs): restore from a savepoint."""

    retriable = False
    fault = Fault.USER


@dataclass(frozen=True)
class InflightReplay:
    """What a restore feeds in before any new input, from an unaligned checkpoint's in-flight state:
    output buffers sent as they were (``sends``: output, channel, buffer) or, at another parallelism,
    their records emitted anew (``emits``: output, buffer), then input buffers into the chain by channel."""

    checkpoint_id: CheckpointId
    sends: tuple[tuple[int, int, DataMessage], ...] = ()
    emits: tuple[tuple[int, DataMessage], ...] = ()
    inputs: tuple[tuple[ChannelIndex, DataMessage], ...] = ()
    redistributed: bool = False


def replay_outputs(replay: InflightReplay | None, outputs: TaskOutputs, log: Any) -> None:
    """The restored output buffers an unaligned barrier overtook, sent before anything else (their
    consumers read them after replaying their own in-flight input, as they would have); at another
    parallelism their records are emitted anew through the partitioners."""
    if replay is None or not (replay.sends or replay.emits):
        return
    writers = outputs.writers
    for edge, channel, message in replay.sends:
        writers[edge].channels[channel].send(message)
    for edge, message in replay.emits:
        buffer = read_buffer(message)
        writer = writers[edge]
        for value, timestamp in zip(buffer.values, buffer.timestamps, strict=True):
            writer.emit(value, timestamp)
    for writer in writers:
        writer.flush()
    log.info(
        "inflight_outputs_replayed",
        checkpoint_id=replay.checkpoint_id,
        buffers_sent=len(replay.sends),
        buffers_emitted=len(replay.emits),
        redistributed=replay.redistributed,
    )


def check_state_schemas(operators: Iterable[KeyedOperator], layouts: Iterable[SubtaskLayout]) -> None:
    """Before any keyed state is restored: tell each keyed operator the schemas its state was stored
    with (the layouts of the old subtasks that hold some of it); a state it cannot read raises
    StateSchemaError (the user's, not retriable: the job fails at once with that line), one of an
    older version is migrated when the operator opens (``KeyedOperator.migrate_from``)."""
    stored = tuple(layouts)
    for op in operators:
        uid = op.ctx.uid
        records = [layout.state_schemas.get(uid, ()) for layout in stored if uid in layout.keyed_operator_uids]
        if records:
            op.migrate_from(merge_stored_schemas(uid, records))


@dataclass(frozen=True)
class _KeyGroupFilter:
    """Which records (or rows of a record batch) of a keyed edge belong to the key groups ``owned``."""

    key_selector: Callable[[Any], Any]
    key_group_of: Callable[[Any], int]
    owned: KeyGroupRange
    max_parallelism: int

    def record(self, value: Any) -> bool:
        return self.key_group_of(self.key_selector(value)) in self.owned

    def rows(self, batch: Any) -> Any:
        if not isinstance(self.key_selector, FieldKey):
            raise SnapshotError(f"a columnar keyed edge keyed by {self.key_selector!r}, not by a field")
        groups = BatchKeys(self.key_selector.field, self.max_parallelism).key_groups(batch)
        return (groups >= self.owned.start) & (groups <= self.owned.end)


def _owned_by(
    key_selector: Callable[[Any], Any] | None,
    key_group_of: Callable[[Any], int],
    owned: KeyGroupRange,
    max_parallelism: int,
) -> _KeyGroupFilter:
    """Whether a record of a keyed edge belongs to the key groups ``owned``."""
    if key_selector is None:
        raise SnapshotError("a keyed edge without a key selector")
    return _KeyGroupFilter(key_selector, key_group_of, owned, max_parallelism)


def _records_where(message: DataMessage, keep: _KeyGroupFilter) -> DataMessage | None:
    """A buffer of the records of ``message`` that ``keep`` accepts (no event); None if none."""
    buffer = read_buffer(message)
    if buffer.values and is_batch(buffer.values[0]):
        batches = [b.filter(pa.array(keep.rows(b))) for b in buffer.values]
        batches = [b for b in batches if b.num_rows]
        if not batches:
            return None
        msg = DataMessage()
        encode_into(msg, batches, [None] * len(batches))
        return msg
    kept = [(v, t) for v, t in zip(buffer.values, buffer.timestamps, strict=True) if keep.record(v)]
    if not kept:
        return None
    return DataMessage(records=encode_records([v for v, _ in kept], [t for _, t in kept]), record_count=len(kept))


@dataclass(frozen=True)
class TaskChannels:
    """The plan's view of one subtask's channels, as a restore places in-flight records: each input
    channel's edge (``origins``), each output's edge (``targets``, by output index) and how many
    channels each output has (``outputs``)."""

    origins: Mapping[ChannelIndex, InputOrigin]
    targets: Mapping[int, OutputTarget]
    inputs: int
    outputs: Sequence[int]


class SubtaskRestorer:
    """Restores one subtask attempt from ``checkpoint_id``; see the module. ``storage``: where the
    restored state's objects are; ``cancelled``: a cancel stops it between the keyed and the operator
    state (a sink's restore fences producers: a cancelled attempt must not reach it)."""

    def __init__(
        self,
        *,
        address: TaskAddress,
        checkpoint_id: int,
        vertex: Vertex,
        max_parallelism: int,
        key_group_range: KeyGroupRange,
        channels: TaskChannels,
        storage: CheckpointStorage | None,
        cancelled: threading.Event,
        log: Any,
    ) -> None:
        self._address = address
        self._checkpoint_id = checkpoint_id
        self._vertex = vertex
        self._max_parallelism = max_parallelism
        self._key_group_range = key_group_range
        self._channels = channels
        self._storage = storage
        self._cancelled = cancelled
        self._log = log

    def restore(
        self, restore: Restore, chain: OperatorChain, keyed_state: TaskKeyedState | None
    ) -> InflightReplay | None:
        """Keyed state back into RocksDB (only this subtask's key groups), then each operator's own
        state, read from checkpoint storage when it was too large to stay inline; answers the
        in-flight records to replay (None: none)."""
        ranges = [(OperatorUid(op.ctx.uid), self._key_group_range) for op in chain.keyed_operators]
        replay: InflightReplay | None = None
        chain.prepare_restore()  # e.g. a Kafka sink's fencing (0.5-1 s) runs while the keyed state downloads
        match restore:
            case ChainRestore():
                check_state_schemas(chain.keyed_operators, [restore.layout] if restore.layout is not None else [])
                keyed = [restore.keyed_state] if restore.keyed_state is not None else []
                restored_entries = self._restore_keyed(keyed_state, keyed, ranges, adopt=True)
                if self._cancelled.is_set():  # the keyed restore may take long: a sink's restore fences producers
                    raise Cancelled()
                states = read_operator_states(restore.operator_state, self._read_stored_state)
                inflight = states.pop(INFLIGHT_STATE_NAME, None)
                if inflight is not None:
                    replay = self._restored_inflight(inflight)
                chain.restore(states)
                state_bytes = sum(len(b) for b in states.values())
                inherited_from = 0
            case InheritedRestore(documents=documents):
                replay = self.redistributed_inflight(documents)
                check_state_schemas(chain.keyed_operators, [d.layout for d in documents])
                handles = self._inherited_keyed_handles(chain, documents)
                restored_entries = self._restore_keyed(keyed_state, handles, ranges, adopt=False)
                if self._cancelled.is_set():
                    raise Cancelled()
                inherited = self._inherited_operator_states(chain, documents)
                chain.restore_inherited(inherited)
                state_bytes = sum(len(s.data) for states in inherited.values() for s in states)
                inherited_from = len(documents)
            case _:
                assert_never(restore)
        self._log.info(
            "task_restored",
            checkpoint_id=self._checkpoint_id,
            keyed_entries_copied=restored_entries,
            operator_state_bytes=state_bytes,
            inherited_from_subtasks=inherited_from,
        )
        return replay

    # Keyed and operator state --------------------------------------------------------------------

    def _restore_keyed(
        self,
        keyed_state: TaskKeyedState | None,
        handles: list[KeyedStateHandle],
        ranges: list[tuple[OperatorUid, KeyGroupRange]],
        *,
        adopt: bool,
    ) -> int:
        """Restore this subtask's key groups from ``handles``; ``adopt``: they are this job's own, so
        their files may be reused by the next snapshot (another job's never are). Answers the entries
        copied one by one (0 when the restore opened the snapshot as the database)."""
        if keyed_state is None:
            return 0
        snapshotter = keyed_state.snapshotter
        job_id = JobId(self._address.job_id)
        snapshotter.start_attempt(job_id, self._address.attempt, handles if adopt else [])
        if not handles:
            return 0
        result = snapshotter.restore(
            handles,
            ranges,
            self._storage,
            job_id=job_id if adopt else None,
            attempt=self._address.attempt,
        )
        snapshotter.clear_restore_cache()
        return result.copied_entries

    def _inherited_keyed_handles(
        self, chain: OperatorChain, documents: tuple[TaskStateDocument, ...]
    ) -> list[KeyedStateHandle]:
        """The keyed state handles of the old subtasks whose key groups overlap this subtask's, for
        each old vertex that ran one of this chain's keyed operators."""
        mine = {op.ctx.uid for op in chain.keyed_operators}
        by_vertex: dict[str, dict[int, TaskStateDocument]] = {}
        for d in documents:
            if mine & set(d.layout.keyed_operator_uids):
                by_vertex.setdefault(d.vertex_uid, {})[d.subtask] = d
        handles: list[KeyedStateHandle] = []
        for vertex_uid, subtasks in sorted(by_vertex.items()):
            sources = key_group_sources(self._key_group_range, {s: d.key_group_range for s, d in subtasks.items()})
            for source in sources:
                document = subtasks[source.old_subtask]
                if document.keyed_state is not None:
                    where = f"of task {vertex_uid}#{source.old_subtask} in checkpoint {document.checkpoint_id}"
                    handles.append(keyed_state_from_document(document.keyed_state, where))
        return handles

    def _inherited_operator_states(
        self, chain: OperatorChain, documents: tuple[TaskStateDocument, ...]
    ) -> dict[str, list[InheritedState]]:
        """Each operator's state in every old subtask that holds some, by operator uid (a union)."""
        mine = set(chain.by_uid)
        inherited: dict[str, list[InheritedState]] = {}
        read: dict[str, bytes] = {}  # a broadcast state's object, which old subtasks share, read once

        def read_once(key: str) -> bytes:
            if key not in read:
                read[key] = self._read_stored_state(key)
            return read[key]

        for d in documents:
            if not mine & set(d.operator_state_uids):
                continue
            for uid, data in read_operator_states(d.operator_state, read_once).items():
                if uid in mine:
                    inherited.setdefault(uid, []).append(
                        InheritedState(d.subtask, d.layout.parallelism, d.key_group_range, data)
                    )
        return inherited

    def _read_stored_state(self, key: str) -> bytes:
        if self._storage is None:
            raise SnapshotError(
                f"task {self._address}: checkpoint {self._checkpoint_id} stores its operator state "
                f"in {key}, but this task was given no checkpoint storage to read it from"
            )
        return self._storage.get_bytes(key)

    # In-flight records ---------------------------------------------------------------------------

    def _restored_inflight(self, data: bytes) -> InflightReplay:
        """This task's own in-flight state (same job, same parallelism), to replay as it was: each
        output's buffers into the output of the edge they name, or, in a document that names none
        (format 2), into the output of their index, which this job's plan, the one that wrote them,
        gives the same edge."""
        where = f"of task {self._address} in checkpoint {self._checkpoint_id}"
        state = decode_inflight(data, where)
        inputs = self._channels.inputs
        if any(channel >= inputs for channel in state.channels):
            raise InflightStateNotRedistributable(
                f"task {self._address}: the in-flight state {where} names input channels {sorted(state.channels)}, "
                f"this task has {inputs}: {INFLIGHT_REDISTRIBUTION_REFUSED}"
            )
        outputs = list(self._channels.outputs)
        routed = {
            edge: self._output_index(state.targets[edge]) if state.targets_named else edge for edge, _ in state.outputs
        }
        misplaced = sorted(
            (edge, channel)
            for edge, channel in state.outputs
            if (new := routed[edge]) is None or new >= len(outputs) or channel >= outputs[new]
        )
        if misplaced:
            named = ", ".join(str(state.targets[edge]) for edge in sorted({e for e, _ in misplaced}))
            raise InflightStateNotRedistributable(
                f"task {self._address}: the in-flight state {where} names output channels {misplaced} "
                f"({named or 'by index only'}), this task has {outputs} per output "
                f"({', '.join(map(str, self._channels.targets.values()))}): {INFLIGHT_REDISTRIBUTION_REFUSED}"
            )
        return InflightReplay(
            state.checkpoint_id,
            sends=tuple(
                (edge, channel, parse_message(b, where))
                for (old, channel), b in state.replay_outputs()
                if (edge := routed[old]) is not None
            ),
            inputs=tuple((channel, parse_message(b, where)) for channel, b in state.replay()),
        )

    def _output_index(self, target: OutputTarget) -> int | None:
        """The index of this task's output that is the edge ``target`` names; None if it has none."""
        return next((index for index, mine in self._channels.targets.items() if mine == target), None)

    def redistributed_inflight(self, documents: tuple[TaskStateDocument, ...]) -> InflightReplay | None:
        """The in-flight state of the old subtasks of this chain, restored at another parallelism or
        into another job: the input records of a keyed edge go to the subtask owning their key group
        now (every new subtask filters each old one's); the rest of old subtask j's input, and its
        output records, go to new subtask j mod parallelism, which emits the output records anew
        through the partitioner of the output whose edge they were queued on (by consumer, never by
        position: the new job may connect its outputs in another order). Output records of an edge
        the new job lacks are dropped with a warning (the JobManager allowed it: non-restored state).
        Watermarks in flight are dropped (the sources emit them again)."""
        olds = sorted(
            (d for d in documents if d.vertex_uid == self._vertex.uid and INFLIGHT_STATE_NAME in d.operator_state_uids),
            key=lambda d: d.subtask,
        )
        if not olds:
            return None
        channel_of: dict[InputOrigin, ChannelIndex] = {}
        for own_channel, own_origin in sorted(self._channels.origins.items()):
            channel_of.setdefault(own_origin, own_channel)
        edge_of = {InputOrigin(e.input_index, e.producer_vertex): e for e in self._vertex.inputs}
        key_group_of = KeyEncoder(self._max_parallelism).key_group
        inputs: list[tuple[ChannelIndex, DataMessage]] = []
        emits: list[tuple[int, DataMessage]] = []
        for old in olds:
            where = f"of task {old.vertex_uid}#{old.subtask} in checkpoint {old.checkpoint_id}"
            data = read_operator_states(old.operator_state, self._read_stored_state)[INFLIGHT_STATE_NAME]
            state = decode_inflight(data, where)
            takes_whole = old.subtask % self._vertex.parallelism == self._address.subtask

            def refuse(why: str, where: str = where) -> InflightStateNotRedistributable:
                return InflightStateNotRedistributable(
                    f"task {self._address}: the in-flight state {where} {why}: {INFLIGHT_REDISTRIBUTION_REFUSED}"
                )

            for channel, blobs in sorted(state.channels.items()):
                messages = [m for b in blobs if (m := parse_message(b, where)).record_count]
                origin = state.origins.get(channel)
                if origin is None:
                    raise refuse(f"does not say where input channel {channel} comes from (an older format)")
                edge, new_channel = edge_of.get(origin), channel_of.get(origin)
                if edge is None or new_channel is None:
                    raise refuse(
                        f"has records from {origin.producer_vertex} on input {origin.gate}, which this job lacks"
                    )
                match edge.partitioning:
                    case Partitioning.HASH:
                        owned = _owned_by(edge.key_selector, key_group_of, self._key_group_range, self._max_parallelism)
                        for message in messages:
                            kept = _records_where(message, owned)
                            if kept is not None:
                                inputs.append((new_channel, kept))
                    case Partitioning.FORWARD | Partitioning.REBALANCE:
                        if takes_whole:
                            inputs += [(new_channel, m) for m in messages]
                    case Partitioning.BROADCAST:
                        if messages:
                            raise refuse(f"holds records of the broadcast input from {origin.producer_vertex}")
                    case _:
                        assert_never(edge.partitioning)
            if not takes_whole:
                continue
            for (old_edge, old_channel), blobs in sorted(state.outputs.items()):
                messages = [m for b in blobs if (m := parse_message(b, where)).record_count]
                if not messages:
                    continue
                output = self._inherited_output(state, old_edge, where)
                if output is None:  # the JobManager let it through: --allow-non-restored-state
                    self._log.warning(
                        "inflight_records_dropped",
                        checkpoint_id=old.checkpoint_id,
                        old_subtask=old.subtask,
                        consumer=state.targets[old_edge].consumer,
                        edge=str(state.targets[old_edge]),
                        records=sum(m.record_count for m in messages),
                        reason="their consumer is not connected to this task in the new job, and the restore "
                        "allows non-restored state",
                    )
                    continue
                if self._vertex.outputs[output].partitioning is Partitioning.BROADCAST:
                    raise refuse(f"holds records of broadcast output {old_edge} (channel {old_channel})")
                emits += [(output, m) for m in messages]
        return InflightReplay(olds[0].checkpoint_id, emits=tuple(emits), inputs=tuple(inputs), redistributed=True)

    def _inherited_output(self, state: InflightState, old_edge: int, where: str) -> int | None:
        """The output of this task that the old task's output ``old_edge`` is now: the one of the edge it
        names (None: this job does not connect it). A document that names none (format 2) says only the
        index, which means the same edge in another job only when this task has that one output."""
        if state.targets_named:
            return self._output_index(state.targets[old_edge])
        outputs = len(self._channels.outputs)
        if old_edge == 0 and outputs == 1:
            return 0
        named = f"{outputs} output" + ("" if outputs == 1 else "s")
        raise InflightStateNotRedistributable(
            f"task {self._address}: the in-flight state {where} holds output buffers named by output index only "
            f"(written before output buffers named their consumer), and {self._vertex.uid} has {named} in this "
            f"job, so which consumer output {old_edge} was queued for is unknown: take a savepoint of the old job "
            "(always aligned) and restore from it"
        )
