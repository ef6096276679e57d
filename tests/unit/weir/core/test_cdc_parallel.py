"""The parallel snapshot's pure part: which subtask reads which rows (the key's partition, the tables
read in one chunk), where a decoded change's row was read, the readers' start and announcement, subtask
0's gathering of the announcements, the state's format 3, and random runs at parallelism 2 and 3 against
the model of the server of ``test_cdc`` (every subtask restarting together at a crash, as a failover
redeploys them)."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field
from uuid import UUID

import pytest

from tests.unit.weir.core.test_cdc import TABLE, Server
from weir.core.cdc import (
    SNAPSHOT_PENDING,
    AdvanceSlot,
    AnnouncePartition,
    AnnounceRestored,
    AwaitSlot,
    CdcProgress,
    CdcState,
    ChunkRead,
    Key,
    PartitionRead,
    Phase,
    Redistributed,
    RedistributionRefused,
    Resume,
    ResumeSnapshot,
    SlotFound,
    SnapshotCollector,
    SnapshotRun,
    StayIdle,
    TakeSnapshot,
    TransactionVerdict,
    XidSnapshot,
    chunk_of,
    decide_reader_start,
    decide_start,
    decode_cdc_state,
    decode_partition_read,
    encode_cdc_state,
    encode_partition_read,
    key_partition,
    key_text,
    redistribute,
    slot_mark,
    snapshot_partitions,
    tables_read_by,
)
from weir.core.errors import SerializationError

# Which subtask reads which rows --------------------------------------------------------------------------


def test_the_key_text_is_postgresqls_text_of_each_column() -> None:
    assert key_text((-5,)) == "-5"
    assert key_text(("a", 5)) == "a\x1f5"
    assert key_text((UUID("A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11"),)) == "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"
    with pytest.raises(TypeError):
        key_text((True,))


@pytest.mark.parametrize(
    ("key", "partitions", "partition"),
    [  # md5 of the key's text, its first 32 bits: the values PostgreSQL computes (tests/integration checks it)
        (("a", 5), 7, 0x5CFAD577 % 7),
        (("é",), 5, 0x66DDCD97 % 5),
        ((1,), 1, 0),
    ],
)
def test_a_keys_partition_is_the_first_32_bits_of_the_md5_of_its_text(
    key: Key, partitions: int, partition: int
) -> None:
    assert key_partition(key, partitions) == partition


def test_every_key_has_one_partition_and_they_are_even() -> None:
    for partitions in (2, 3, 5):
        counts = Counter(key_partition((k,), partitions) for k in range(30_000))
        assert set(counts) == set(range(partitions))
        assert max(counts.values()) - min(counts.values()) < 30_000 // partitions // 10
    with pytest.raises(ValueError):
        key_partition((1,), 0)


@pytest.mark.parametrize("parallelism", [1, 2, 3, 4])
def test_each_table_read_in_one_chunk_is_read_by_one_subtask_and_each_chunked_table_by_all(parallelism: int) -> None:
    tables = ["a", "b", "c", "d", "e"]
    for pattern in range(1 << len(tables)):
        chunked = {t: bool(pattern >> i & 1) for i, t in enumerate(tables)}
        readers: Counter[str] = Counter()
        for subtask in range(parallelism):
            read = tables_read_by(tables, chunked, subtask, parallelism)
            assert read == [t for t in tables if t in read], "in the tables' order"
            readers.update(read)
        for i, table in enumerate(tables):
            assert readers[table] == (parallelism if chunked[table] else 1)
            if not chunked[table]:
                assert table in tables_read_by(tables, chunked, i % parallelism, parallelism)
    with pytest.raises(ValueError):
        tables_read_by(tables, dict.fromkeys(tables, True), parallelism, parallelism)


def _chunk(upper: Key | None, partition: int, wal_end: int = 100, table: str = TABLE) -> ChunkRead:
    return ChunkRead(table, upper, XidSnapshot(10, 20), wal_end, partition)


def test_a_key_is_placed_in_a_chunk_of_its_own_partition_only() -> None:
    partitions = 3
    keys = list(range(200))
    by_partition = {p: sorted(k for k in keys if key_partition((k,), partitions) == p) for p in range(partitions)}
    # each partition in two chunks: up to its middle key, then the rest (its last chunk: no bound)
    chunks = []
    for p in range(partitions):
        middle = by_partition[p][len(by_partition[p]) // 2]
        chunks += [_chunk((middle,), p), _chunk(None, p)]
    for key in keys:
        found = chunk_of(chunks, TABLE, (key,), partitions)
        p = key_partition((key,), partitions)
        assert found is not None and found.partition == p
        middle = by_partition[p][len(by_partition[p]) // 2]
        assert found.upper == ((middle,) if key <= middle else None)
    assert chunk_of(chunks[:2], TABLE, (by_partition[1][0],), partitions) is None, "its partition's chunks are not here"
    one = [_chunk(None, 2, table="public.small")]
    assert chunk_of(one, "public.small", None, partitions) == one[0], "a table read in one chunk holds every row"


# The readers ---------------------------------------------------------------------------------------------


def test_a_reader_waits_for_the_slot_resumes_its_chunks_or_announces_what_it_restored() -> None:
    assert decide_reader_start(SNAPSHOT_PENDING) == AwaitSlot()
    chunks = (_chunk((5,), 1), _chunk(None, 1))
    assert decide_reader_start(CdcState(Phase.SNAPSHOT, 50, chunks[:1], 2)) == ResumeSnapshot(50)
    assert decide_reader_start(CdcState(Phase.PARTITION_READ, 50, chunks, 2)) == AnnounceRestored(chunks)
    with pytest.raises(ValueError):
        decide_reader_start(CdcState(Phase.STREAMING, 50, (), 2))


def test_a_reader_announces_after_a_checkpoint_holding_its_whole_partition_completes() -> None:
    progress = CdcProgress(partitions=2)
    progress.slot_created(50)
    progress.checkpoint_taken(1)
    first, last = _chunk((5,), 1), _chunk(None, 1)
    progress.chunk_emitted(first)
    progress.checkpoint_taken(2)
    progress.chunk_emitted(last)
    assert progress.next_chunk([TABLE]) is None
    progress.partition_read()
    assert progress.state == CdcState(Phase.PARTITION_READ, 50, (first, last), 2)
    progress.checkpoint_taken(3)
    progress.checkpoint_taken(4)
    assert progress.checkpoint_completed(1) is None
    assert progress.checkpoint_completed(2) is None, "part of the partition only"
    assert progress.checkpoint_completed(3) == AnnouncePartition((first, last))
    assert progress.checkpoint_completed(4) is None, "once a run: subtask 0 reads every message in the WAL"
    with pytest.raises(ValueError):
        progress.chunk_emitted(last)
    with pytest.raises(ValueError):
        progress.transaction(60)
    restored = CdcProgress(progress.state, partitions=2)  # a new run: it announces at its start
    restored.partition_announced()
    restored.checkpoint_taken(5)
    assert restored.checkpoint_completed(5) is None
    with pytest.raises(ValueError, match="announced once read"):
        CdcProgress(partitions=2).partition_announced()


def test_one_subtask_has_no_partition_to_announce_and_a_snapshot_goes_on_at_its_own_parallelism_only() -> None:
    progress = CdcProgress()
    progress.slot_created(50)
    with pytest.raises(ValueError, match="no partition to announce"):
        progress.partition_read()
    with pytest.raises(ValueError, match="read at parallelism 2 cannot go on at parallelism 3"):
        CdcProgress(CdcState(Phase.SNAPSHOT, 50, (), 2), partitions=3)
    CdcProgress(CdcState(Phase.STREAMING, 50, (_chunk(None, 1),), 2), partitions=1)  # streaming: subtask 0's state


def test_subtask_0_streams_with_every_partitions_chunks_and_places_each_change_in_its_partition() -> None:
    partitions = 2
    keys = {p: [k for k in range(40) if key_partition((k,), partitions) == p] for p in (0, 1)}
    own = _chunk(None, 0, wal_end=200)
    other = ChunkRead(TABLE, None, XidSnapshot(30, 30), 300, 1)  # saw every transaction below 30
    progress = CdcProgress(partitions=partitions)
    progress.slot_created(50)
    progress.chunk_emitted(own)
    progress.snapshot_emitted([other])
    assert progress.state == CdcState(Phase.STREAMING, 50, (own, other), partitions)
    assert progress.transaction(250) is TransactionVerdict.EMIT
    xid = 25  # seen by the other partition's chunk only
    assert progress.seen_by_snapshot(TABLE, [(keys[1][0],)], xid, 250)
    assert not progress.seen_by_snapshot(TABLE, [(keys[0][0],)], xid, 250)
    assert not progress.seen_by_snapshot(TABLE, [(keys[1][0],), (keys[0][0],)], xid, 250), "a row moved across"
    assert not progress.seen_by_snapshot(TABLE, [(keys[1][0],)], xid, 301), "committed after the chunk's read"
    progress.decoded_through(301)
    assert progress.state.chunks == (), "past every chunk's read: nothing to filter"


# Subtask 0 gathers the announcements ----------------------------------------------------------------------

RUN = SnapshotRun("job", 3)


def _announce(subtask: int, chunks: tuple[ChunkRead, ...], *, run: SnapshotRun = RUN, slot: str = "s",
              partitions: int = 3) -> PartitionRead:  # fmt: skip
    return PartitionRead(slot, run, subtask, partitions, chunks)


def test_subtask_0_takes_only_this_runs_announcements_and_the_last_of_each_reader() -> None:
    collector = SnapshotCollector("s", RUN, 3)
    assert collector.missing == [1, 2]
    one, one_again = (_chunk((4,), 1), _chunk(None, 1)), (_chunk(None, 1, wal_end=140),)
    two = (_chunk(None, 2),)
    assert not collector.offer(_announce(1, one, run=SnapshotRun("job", 2))), "an earlier attempt's"
    assert not collector.offer(_announce(1, one, run=SnapshotRun("other", 3))), "another job's"
    assert not collector.offer(_announce(1, one, slot="t")), "another slot's"
    assert not collector.offer(_announce(1, one, partitions=2)), "read at another parallelism"
    assert not collector.offer(_announce(0, ())), "subtask 0 announces nothing"
    assert not collector.offer(_announce(3, ())), "no such reader"
    with pytest.raises(ValueError):
        collector.chunks()
    assert collector.offer(_announce(2, two))
    assert collector.missing == [1]
    assert collector.offer(_announce(1, one))
    assert collector.offer(_announce(1, one_again))
    assert collector.missing == []
    assert collector.chunks() == (*one_again, *two), "by subtask, the last announcement of each"
    with pytest.raises(ValueError, match="another partition"):
        collector.offer(_announce(1, (_chunk(None, 2),)))
    with pytest.raises(ValueError):
        SnapshotCollector("s", RUN, 1)


def test_the_announcement_round_trips_and_is_the_documented_json() -> None:
    announcement = _announce(1, (ChunkRead(TABLE, (7,), XidSnapshot(740, 745, frozenset({741})), 0x193E000, 1),))
    data = encode_partition_read(announcement)
    assert data == (
        b'{"format":1,"slot":"s","job_id":"job","attempt":3,"subtask":1,"partitions":3,"chunks":['
        b'{"table":"public.t","partition":1,"upper":[["integer",7]],"snapshot":"740:745:741","wal_end":"0/193E000"}]}'
    )
    assert decode_partition_read(data) == announcement
    for bad in (b"{}", b'{"format":1,"slot":"s"}', b'{"format":2}', b"[", b'{"format":1,"slot":"s","job_id":"j",'
                b'"attempt":"3","subtask":1,"partitions":3,"chunks":[]}'):  # fmt: skip
        with pytest.raises(SerializationError):
            decode_partition_read(bad)


def test_the_slot_mark_names_the_run_within_postgresqls_63_characters() -> None:
    marks = {slot_mark("s" * 63, SnapshotRun("j" * 32, a)) for a in range(100)}
    assert len(marks) == 100 and all(len(m) <= 63 for m in marks)
    assert slot_mark("s", RUN) != slot_mark("t", RUN)


# Random runs at parallelism 2 and 3 ------------------------------------------------------------------------


@dataclass
class Subtask:
    index: int
    progress: CdcProgress
    partitions: int  # the snapshot's (snapshot_partitions): the source's parallelism unless restored rescaled
    waits_for_slot: bool = False
    copy_start: int | None = None  # subtask 0 streaming: the temporary copy's start
    taken: int = 0


@dataclass
class ParallelServer(Server):
    """The model, with the WAL's logical messages (the announcements) and subtask 0's slot mark."""

    messages: list[tuple[int, bytes]] = field(default_factory=list)  # (WAL position, content)
    mark: SnapshotRun | None = None

    def read_partition_chunk(
        self, after: Key | None, size: int, partition: int, partitions: int
    ) -> tuple[list[tuple[int, int]], ChunkRead]:
        keys = sorted(
            k for k in self.rows if key_partition((k,), partitions) == partition and (after is None or (k,) > after)
        )[:size]
        upper = (keys[-1],) if len(keys) == size else None
        self.wal_end += 1
        return [(k, self.rows[k]) for k in keys], ChunkRead(TABLE, upper, self.snapshot(), self.wal_end, partition)

    def emit_message(self, content: bytes) -> None:
        self.wal_end += 1
        self.messages.append((self.wal_end, content))


def run_parallel_simulation(seed: int, steps: int = 500, *, rescale: bool = False) -> None:
    """As ``test_cdc.run_simulation``, with ``partitions`` subtasks: each reads its partition chunk by
    chunk, at its own pace; the readers wait for subtask 0's mark of the run before their first
    chunk, and announce their chunks in the WAL when a checkpoint holding the whole partition
    completes; subtask 0, its partition read, gathers this run's announcements from the WAL after
    the slot's position and streams with every chunk. Each subtask's records travel on its own
    channel to one consumer, which takes them in any interleaving; a checkpoint completes once its
    barriers are aligned there (its output then is the checkpoint's). A crash restores every
    subtask from the last completed checkpoint (or none) in a new attempt, and the consumer's
    output to that checkpoint's (an exactly-once sink). With ``rescale``, a crash restores the
    checkpoint at a random parallelism from 1 to 4 as :func:`redistribute` gives it (at the old one
    when it refuses, as its line tells the user). Checks each key's events as there: one read of a
    value it had (or none), then each later committed value once, in order."""
    rng = random.Random(seed)
    parallelism = rng.choice([2, 3])
    server = ParallelServer()
    for key in range(0, 40, 2):
        server.rows[key] = key
        server.history[key] = [key]
    chunk_size = rng.randint(1, 5)
    output: list[tuple[str, int, int | None]] = []  # what the keyed consumer downstream received, in order
    channels: list[list[tuple[str, int, int | None] | int]] = [[] for _ in range(parallelism)]  # an int: a barrier
    checkpoints: dict[int, list[bytes]] = {}  # id -> each subtask's state
    aligned: dict[int, int] = {}  # id -> the consumer's output when every barrier of it arrived
    slow = rng.randrange(parallelism)
    completed: int | None = None
    next_id = 1
    attempt = 0

    def start(restored: list[bytes] | None) -> list[Subtask]:
        nonlocal parallelism, slow
        states = [SNAPSHOT_PENDING] * parallelism
        if restored is not None:
            states = [decode_cdc_state(data, "slot") for data in restored]
            if rescale:
                match redistribute(states, rng.randint(1, 4), "postgres cdc source 'cdc'"):
                    case Redistributed(states=new):
                        states = list(new)
                    case RedistributionRefused():
                        pass  # restored at its own parallelism
        parallelism = len(states)
        channels[:] = [[] for _ in range(parallelism)]
        slow = rng.randrange(parallelism)
        subtasks = []
        for index, state in enumerate(states):
            partitions = snapshot_partitions(state, parallelism)
            subtask = Subtask(index, CdcProgress(state, partitions), partitions)
            if index == 0:
                decision = decide_start(state, None if server.slot is None else SlotFound(server.slot), "slot")
                match decision:
                    case TakeSnapshot():
                        pass  # its first poll drops a slot left behind and creates it anew
                    case ResumeSnapshot(consistent_point=point):
                        assert server.slot == point
                        server.mark = SnapshotRun("job", attempt)
                    case Resume(position=position):
                        assert server.slot is not None and server.slot <= position
                        subtask.copy_start = server.slot
            else:
                match decide_reader_start(state):
                    case AwaitSlot():
                        subtask.waits_for_slot = True
                    case ResumeSnapshot():
                        pass
                    case AnnounceRestored(chunks=chunks):
                        announce(subtask, chunks)
                        subtask.progress.partition_announced()
                    case StayIdle():
                        pass
            subtasks.append(subtask)
        return subtasks

    def announce(subtask: Subtask, chunks: tuple[ChunkRead, ...]) -> None:
        run = SnapshotRun("job", attempt)
        announcement = PartitionRead("slot", run, subtask.index, subtask.partitions, chunks)
        server.emit_message(encode_partition_read(announcement))

    def poll_reader(subtask: Subtask) -> None:
        progress = subtask.progress
        if subtask.waits_for_slot:
            if server.mark != SnapshotRun("job", attempt):
                return
            assert server.slot is not None
            subtask.waits_for_slot = False
            progress.slot_created(server.slot)
        if progress.state.phase is not Phase.SNAPSHOT:
            return
        chunk = progress.next_chunk([TABLE])
        if chunk is None:
            progress.partition_read()
            return
        rows, read = server.read_partition_chunk(chunk.after, chunk_size, subtask.index, subtask.partitions)
        channels[subtask.index].extend(("read", key, value) for key, value in rows)
        progress.chunk_emitted(read)

    def poll_streamer(subtask: Subtask) -> None:
        progress = subtask.progress
        if subtask.copy_start is None:
            if progress.state.position is None:
                server.slot = None
                server.create_slot()
                progress.slot_created(server.wal_end)
                server.mark = SnapshotRun("job", attempt)
                return
            chunk = progress.next_chunk([TABLE])
            if chunk is not None:
                rows, read = server.read_partition_chunk(chunk.after, chunk_size, 0, subtask.partitions)
                channels[0].extend(("read", key, value) for key, value in rows)
                progress.chunk_emitted(read)
                return
            if subtask.partitions == 1:  # read alone (restored at parallelism 1 before the slot): no reader
                progress.snapshot_emitted()
                subtask.copy_start = server.slot
                return
            collector = SnapshotCollector("slot", SnapshotRun("job", attempt), subtask.partitions)
            assert server.slot is not None
            for position, content in server.messages:
                if position > server.slot:
                    collector.offer(decode_partition_read(content))
            if collector.missing:
                return
            progress.snapshot_emitted(collector.chunks())
            subtask.copy_start = server.slot
            return
        for tx in server.decodable(subtask.copy_start, subtask.taken, rng.randint(0, 3)):
            subtask.taken += 1
            assert tx.end is not None
            if progress.transaction(tx.end) is TransactionVerdict.SKIP:
                continue
            for key, value in tx.writes:
                if not progress.seen_by_snapshot(TABLE, [(key,)], tx.xid & 0xFFFFFFFF, tx.end):
                    channels[0].append(("change", key, value))
        if rng.random() < 0.5 and not server.decodable(subtask.copy_start, subtask.taken, 1):
            progress.decoded_through(server.wal_end)

    def poll(subtask: Subtask) -> None:
        (poll_streamer if subtask.index == 0 else poll_reader)(subtask)

    def checkpoint(subtasks: list[Subtask]) -> None:
        nonlocal next_id
        checkpoints[next_id] = [encode_cdc_state(s.progress.checkpoint_taken(next_id), "slot") for s in subtasks]
        for channel in channels:
            channel.append(next_id)
        next_id += 1

    def deliver() -> None:
        """A record reaches the consumer from one channel, or a checkpoint's barriers are aligned
        (a channel whose barrier arrived is blocked until the others' do, as aligned checkpoints)."""
        ready = [c for c in channels if c and not isinstance(c[0], int)]
        if len(ready) > 1 and channels[slow] in ready and rng.random() < 0.9:
            ready.remove(channels[slow])  # one channel lags behind the others
        if ready:
            event = rng.choice(ready).pop(0)
            assert not isinstance(event, int)
            output.append(event)
        elif channels[0] and all(c and c[0] == channels[0][0] for c in channels):
            barrier = channels[0][0]
            assert isinstance(barrier, int)
            for channel in channels:
                channel.pop(0)
            aligned[barrier] = len(output)

    def complete(subtasks: list[Subtask], checkpoint: int) -> None:
        for subtask in subtasks:
            if rng.random() < 0.2:
                continue  # this subtask's notification is lost
            action = subtask.progress.checkpoint_completed(checkpoint)
            match action:
                case None:
                    pass
                case AdvanceSlot(lsn=lsn):
                    assert subtask.index == 0 and server.slot is not None and lsn >= server.slot
                    server.slot = lsn
                case AnnouncePartition(chunks=chunks):
                    assert subtask.index > 0
                    announce(subtask, chunks)

    subtasks = start(None)
    for _ in range(steps):
        action = rng.choice(
            ["begin", "commit", "commit", "poll", "poll", "poll", "deliver", "checkpoint", "complete", "crash"]
        )
        if action == "begin":
            server.begin(rng)
        elif action == "commit":
            server.commit(rng)
        elif action == "poll":
            poll(rng.choice(subtasks))
        elif action == "deliver":
            deliver()
        elif action == "checkpoint":
            checkpoint(subtasks)
        elif action == "complete":
            pending = [c for c in aligned if completed is None or c > completed]
            if pending:
                completed = rng.choice(pending)
                complete(subtasks, completed)
        elif action == "crash" and rng.random() < 0.3:
            restored = checkpoints[completed] if completed is not None else None
            del output[aligned[completed] if completed is not None else 0 :]
            for dead in [c for c in checkpoints if completed is None or c > completed]:
                del checkpoints[dead]
                aligned.pop(dead, None)
            for channel in channels:
                channel.clear()
            attempt += 1
            server.mark = None  # subtask 0's session went with it
            subtasks = start(restored)
    # every transaction commits; the subtasks poll, checkpoints complete, until everything is out
    while server.open:
        server.commit(rng)
    for _ in range(20_000):
        streamer = subtasks[0]
        streamed = streamer.copy_start is not None and not server.decodable(streamer.copy_start, streamer.taken, 1)
        if streamed and not any(channels):  # at parallelism 1 the reads may still be on their way
            break
        for subtask in subtasks:
            poll(subtask)
        checkpoint(subtasks)
        while any(channels):
            deliver()
        completed = max(aligned)
        complete(subtasks, completed)
    else:
        raise AssertionError(f"seed {seed}: the snapshot never finished")
    by_key: dict[int, list[tuple[str, int, int | None]]] = {}
    for event in output:
        by_key.setdefault(event[1], []).append(event)
    for key, history in server.history.items():
        events = by_key.pop(key, [])
        values = [value for _, _, value in events]
        reads = [e for e in events if e[0] == "read"]
        assert len(reads) <= 1 and (not reads or events[0] == reads[0]), f"seed {seed}: key {key}: {events}"
        if not reads:
            values = [None, *values]
        assert any(history[i:] == values for i in range(len(history))), (
            f"seed {seed}: key {key}: output {values}, committed values {history}"
        )
    assert not by_key, f"seed {seed}: events of keys never written: {by_key}"


@pytest.mark.parametrize("seed", range(300))
def test_simulated_parallel_runs_give_each_key_its_read_then_every_later_change_once(seed: int) -> None:
    run_parallel_simulation(seed)


@pytest.mark.parametrize("seed", range(200))
def test_simulated_runs_restored_at_random_parallelisms_give_each_key_its_read_then_every_later_change_once(
    seed: int,
) -> None:
    """Longer runs, so that restores also fall after the snapshot. Measured over seeds 0-99: about 30
    restores at another parallelism per seed, 13 % of them after the snapshot, 45 % mid-snapshot
    above its partitions, 33 % refused below them (then restored at their own), 9 % before any read."""
    run_parallel_simulation(seed, 1500, rescale=True)
