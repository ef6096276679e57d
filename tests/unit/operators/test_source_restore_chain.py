"""State passed through several generations of a job at changing parallelism keeps every source
position exactly once: a seeded random model of the restore chain.

Each generation is a new job restored from the previous one's last completed checkpoint (``weir run
--from-checkpoint``, a savepoint upgrade, a rescale), at a random parallelism (max parallelism fixed),
on a topic whose partition count only grows, with random reads, checkpoints that complete or abort,
and failovers inside the generation (a restart from its own last completed checkpoint). The state
travels the real path: each subtask's ``snapshot_state`` bytes in a task-state document (encoded and
decoded), ``weir.core.rescale`` checks the assignment and picks the inherited documents, and each new
subtask gets every old subtask's state through ``restore_inherited_state``, as a task does.

After each generation: every partition is in exactly one subtask's snapshot (the one that reads it),
at a position no lower than the generation before, equal to it plus what was read (committed through
a model transactional sink); across all generations each record is committed exactly once; no subtask
commits to the consumer group a partition it does not read, and the group's offsets never go back.
A failing seed is reported with the trace of its generations."""

from __future__ import annotations

import json
import random
from collections import Counter
from dataclasses import dataclass, field

import pytest

from tests.unit.conftest import CollectingOutput
from tests.unit.operators.fake_topic import FakeTopic, FakeTopicReader
from weir.core.descriptors import (
    EARLIEST,
    LATEST,
    KafkaSourceSpec,
    StartingOffsets,
    end_offsets_parameter,
    start_offsets_parameter,
)
from weir.core.errors import WeirError
from weir.core.ids import CheckpointId, SubtaskIndex
from weir.core.keygroups import key_group_range_for_subtask
from weir.core.rescale import check_state_assignment, inherited_documents
from weir.core.task_state import (
    InlineOperatorState,
    SubtaskLayout,
    TaskStateDocument,
    decode_task_state,
    encode_task_state,
    read_operator_states,
)
from weir.operators.base import InheritedState, OperatorContext
from weir.operators.sources import KafkaSourceOperator, decode_kafka_source_state, encode_start_offsets

MAX_PARALLELISM = 16
MOST_SUBTASKS = 5
MOST_PARTITIONS = 12
UID = "events-source"
VERTEX = "events-source"
CHAIN = (UID, "key-value")
DISCOVERY_INTERVAL_MS = 1000

Record = tuple[int, int]  # (partition, offset) as the source emitted it


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Subtask:
    """One running source subtask, with the records it emitted as a transactional sink sees them:
    since the last snapshot, pre-committed per checkpoint, committed."""

    source: KafkaSourceOperator
    reader: FakeTopicReader
    output: CollectingOutput
    pending: dict[int, list[Record]] = field(default_factory=dict)

    def take(self) -> list[Record]:
        return [(v["p"], v["o"]) for v, _ts in self.output.take()]


@dataclass(frozen=True)
class Generation:
    """What one generation's job was: how the chain's trace names it."""

    number: int
    parallelism: int
    partitions: int
    bounded: bool
    starting: StartingOffsets
    discovery: bool


class RestoreChain:
    def __init__(self, seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
        self.rng = random.Random(seed)
        self.bounded = self.rng.random() < 0.3  # a job's sources are bounded or not in every generation
        self.topic = FakeTopic([0] * self.rng.randint(1, 6))
        self.topic.serve(monkeypatch)
        self.clock = FakeClock()
        self.checkpoint_id = 0
        self.documents: list[TaskStateDocument] = []  # the previous generation's last completed checkpoint
        self.positions: dict[int, int] = {}  # its positions (the union of its snapshots)
        self.ends: dict[int, int] = {}  # a bounded source's ends, fixed by the first job that knew the partition
        self.first_start: dict[int, int] = {}  # where each partition's reading began, in the first job
        self.committed: Counter[Record] = Counter()  # every generation's committed output
        self.group: dict[int, int] = {}  # the consumer group's offsets as the commits so far left them
        self.commits_checked = 0
        self.trace: list[str] = []

    # One generation ------------------------------------------------------------------------------

    def run(self, generations: int) -> None:
        for number in range(generations):
            self.generation(number)

    def generation(self, number: int) -> None:
        rng, topic = self.rng, self.topic
        self.grow(rng.choice([0, 0, 1, 2, 3]))
        for p in range(len(topic.lengths)):
            topic.append(p, rng.randint(0, 30))
        gen = Generation(
            number=number,
            parallelism=rng.randint(1, MOST_SUBTASKS),
            partitions=len(topic.lengths),
            bounded=self.bounded,
            # (a bounded first job that starts at its ends reads nothing, ever)
            starting=EARLIEST if self.bounded and number == 0 else rng.choice([EARLIEST, LATEST]),
            discovery=not self.bounded and rng.random() < 0.4,
        )
        # The JobManager fixes at submit a LATEST start and a bounded source's ends.
        parameters: dict[str, str] = {}
        if gen.starting is LATEST:
            starts = {p: n for p, n in enumerate(topic.lengths)}
            parameters[start_offsets_parameter(UID)] = encode_start_offsets(starts)
            if number == 0:
                self.first_start = dict(starts)
        submitted_ends = dict(enumerate(topic.lengths))
        if gen.bounded:
            parameters[end_offsets_parameter(UID)] = json.dumps(submitted_ends)
        for p in range(len(topic.lengths)):
            topic.append(p, rng.randint(0, 10))  # written between the submit and the tasks' open
        inherited = self.inherited()
        self.trace.append(
            f"gen {number}: parallelism {gen.parallelism}, {gen.partitions} partitions {topic.lengths}, "
            f"{'bounded' if gen.bounded else 'unbounded'}, {gen.starting}"
            f"{', discovery' if gen.discovery else ''}; restored from {self.positions}"
        )
        readers_before, committed_before = len(topic.readers), Counter(self.committed)
        subtasks = self.start(gen, parameters, inherited, restore=None, attempt=0)
        completed: dict[int, list[bytes]] = {}  # this generation's completed checkpoints' snapshots
        last_completed: int | None = None
        for _ in range(rng.randint(3, 14)):
            roll = rng.random()
            if roll < 0.45:
                self.poll(rng.choice(subtasks))
            elif roll < 0.6:
                p = rng.randrange(len(topic.lengths))
                topic.append(p, rng.randint(1, 15))
            elif roll < 0.68 and gen.discovery and len(topic.lengths) < MOST_PARTITIONS:
                self.grow(rng.randint(1, 2))
                self.clock.now += DISCOVERY_INTERVAL_MS / 1000
                self.trace.append(f"  topic grows to {len(topic.lengths)} partitions")
            elif roll < 0.92:
                cid, snapshots = self.checkpoint(subtasks)
                if rng.random() < 0.75:
                    self.complete(subtasks, cid)
                    completed[cid], last_completed = snapshots, cid
                else:
                    for s in subtasks:
                        s.source.notify_checkpoint_aborted(cid)
                    self.trace.append(f"  checkpoint {cid} aborted")
            else:
                restore = completed[last_completed] if last_completed is not None else None
                self.trace.append(
                    f"  failover: restart from {f'checkpoint {last_completed}' if restore else 'the inherited state'}"
                )
                for s in subtasks:
                    s.source.close()
                subtasks = self.start(gen, parameters, inherited, restore=restore, attempt=1)
        # The generation ends with a completed checkpoint (a savepoint, or the one the next job restores).
        for s in subtasks:
            self.poll(s)
        cid, snapshots = self.checkpoint(subtasks)
        self.complete(subtasks, cid)
        for s in subtasks:
            s.source.close()
        self.check(gen, snapshots, readers_before, self.committed - committed_before, submitted_ends)
        self.documents = [document(number, s, gen.parallelism, cid, data) for s, data in enumerate(snapshots)]

    def grow(self, partitions: int) -> None:
        lengths = self.topic.lengths
        self.topic.grow(max(len(lengths), min(MOST_PARTITIONS, len(lengths) + partitions)))

    def inherited(self) -> list[InheritedState]:
        """The previous job's last checkpoint as a task of the new job receives it: the documents the
        JobManager checked and picked for the source's vertex (``weir.core.rescale``), each operator's
        state of each old subtask, with where that subtask sat."""
        if not self.documents:
            return []
        check_state_assignment(
            self.documents,
            CHAIN,
            (),
            MAX_PARALLELISM,
            allow_non_restored_state=False,
            where="the previous job's checkpoint",
        )
        picked = inherited_documents({VERTEX: CHAIN}, self.documents)[VERTEX]
        assert len(picked) == len(self.documents)
        return [
            InheritedState(
                d.subtask,
                d.layout.parallelism,
                d.key_group_range,
                read_operator_states(d.operator_state, _no_storage)[UID],
            )
            for d in picked
        ]

    def start(
        self,
        gen: Generation,
        parameters: dict[str, str],
        inherited: list[InheritedState],
        *,
        restore: list[bytes] | None,
        attempt: int,
    ) -> list[Subtask]:
        """The generation's subtasks set up, restored (from its own checkpoint after a failover, else
        from the previous job's) and opened."""
        spec = KafkaSourceSpec(
            topic="events",
            bounded=gen.bounded,
            deserializer=json.loads,
            timestamp=None,
            max_out_of_orderness_ms=0,
            dead_letter_topic=None,
            starting_offsets=gen.starting,
            partition_discovery_interval_ms=DISCOVERY_INTERVAL_MS if gen.discovery else None,
        )
        subtasks = []
        for index in range(gen.parallelism):
            source, output = KafkaSourceOperator(spec, clock=self.clock), CollectingOutput()
            source.setup(context(gen, index, attempt, parameters), output)
            if restore is not None:
                source.restore_state(restore[index])
            else:
                source.restore_inherited_state(inherited)
            source.open()
            subtasks.append(Subtask(source, self.topic.readers[-1], output))
        return subtasks

    def poll(self, subtask: Subtask) -> None:
        rng = self.rng
        subtask.reader.budget = {p: rng.randint(0, 12) for p in range(len(self.topic.lengths))}
        subtask.source.poll(rng.randint(1, 40))

    def checkpoint(self, subtasks: list[Subtask]) -> tuple[int, list[bytes]]:
        """Every subtask snapshots; what it emitted before the barrier is pre-committed with it."""
        self.checkpoint_id += 1
        cid = self.checkpoint_id
        snapshots = []
        for s in subtasks:
            s.pending[cid] = s.take()
            snapshots.append(s.source.snapshot_state(cid) or b"")
        return cid, snapshots

    def complete(self, subtasks: list[Subtask], cid: int) -> None:
        """Checkpoint ``cid`` completed: the sink commits every epoch up to it, the source its
        positions to the consumer group."""
        for s in subtasks:
            for epoch in [c for c in s.pending if c <= cid]:
                self.committed.update(s.pending.pop(epoch))
            s.source.notify_checkpoint_complete(cid)

    # The invariants ------------------------------------------------------------------------------

    def check(
        self,
        gen: Generation,
        snapshots: list[bytes],
        readers_before: int,
        committed_now: Counter[Record],
        submitted_ends: dict[int, int],
    ) -> None:
        decoded = [decode_kafka_source_state(data) for data in snapshots]
        union: dict[int, int] = {}
        ends: dict[int, int] = {}
        for subtask, (nexts, snapshot_ends) in enumerate(decoded):
            foreign = sorted({p for p in [*nexts, *(snapshot_ends or {})] if p % gen.parallelism != subtask})
            assert not foreign, f"subtask {subtask}/{gen.parallelism} snapshots partitions {foreign} it does not read"
            assert not set(nexts) & set(union), f"partitions {sorted(set(nexts) & set(union))} in two snapshots"
            union |= nexts
            ends |= snapshot_ends or {}
        read_by_partition = Counter(p for (p, _o), n in committed_now.items() for _ in range(n))
        self.trace.append(f"  read {dict(sorted(read_by_partition.items()))}; snapshots {[d[0] for d in decoded]}")
        lost = sorted(set(self.positions) - set(union))
        assert not lost, f"the positions of partitions {lost} were lost"
        for p in range(len(self.topic.lengths)):
            # Where this generation took the partition up: the previous one's position; without
            # one, where the first job started it, or (created since) its beginning.
            before = self.positions.get(p, self.first_start.get(p, 0) if gen.number == 0 else 0)
            read_now = read_by_partition[p]
            after = union.get(p, before)
            assert after >= before, f"partition {p} went back from {before} to {after}"
            assert after == before + read_now, f"partition {p} is at {after}, was at {before} and {read_now} were read"
            read = sorted(o for (q, o), n in self.committed.items() if q == p for _ in range(n))
            first = self.first_start.get(p, 0)
            assert read == list(range(first, first + len(read))), f"partition {p}'s records committed: {read}"
        if gen.bounded:
            for p in range(gen.partitions):
                self.ends.setdefault(p, submitted_ends[p])
            assert ends == self.ends, f"bounded ends {ends}, fixed {self.ends}"
            assert all(union.get(p, 0) <= self.ends[p] for p in union), f"read past an end: {union}"
        self.check_commits(gen, readers_before)
        assert self.group == union, f"the group's offsets {self.group} are not the last checkpoint's {union}"
        self.positions = union

    def check_commits(self, gen: Generation, readers_before: int) -> None:
        """Each commit names only partitions its subtask reads (of the topic's, those the round-robin
        gives it), and moves no partition of the group back."""
        for commit in self.topic.commits[self.commits_checked :]:
            assert commit.reader >= readers_before, "a commit from a reader of an earlier generation"
            subtask = (commit.reader - readers_before) % gen.parallelism
            reads = {p for p in range(len(self.topic.lengths)) if p % gen.parallelism == subtask}
            others = sorted(set(commit.offsets) - reads)
            assert not others, f"subtask {subtask}/{gen.parallelism} committed partitions {others} it does not read"
            back = {p: (self.group[p], o) for p, o in commit.offsets.items() if o < self.group.get(p, 0)}
            assert not back, f"subtask {subtask}/{gen.parallelism} moved the group back: {back}"
            self.group.update(commit.offsets)
        self.commits_checked = len(self.topic.commits)


def context(gen: Generation, subtask: int, attempt: int, parameters: dict[str, str]) -> OperatorContext:
    return OperatorContext(
        job_id=f"job-{gen.number}",
        job_name="restore-chain",
        uid=UID,
        subtask=subtask,
        parallelism=gen.parallelism,
        max_parallelism=MAX_PARALLELISM,
        attempt=attempt,
        key_group_range=key_group_range_for_subtask(MAX_PARALLELISM, gen.parallelism, SubtaskIndex(subtask)),
        parameters=parameters,
        state=None,
    )


def document(generation: int, subtask: int, parallelism: int, checkpoint_id: int, data: bytes) -> TaskStateDocument:
    """One source subtask's acknowledgement of ``checkpoint_id``, through its durable encoding."""
    layout = SubtaskLayout(
        parallelism=parallelism,
        max_parallelism=MAX_PARALLELISM,
        key_group_range=key_group_range_for_subtask(MAX_PARALLELISM, parallelism, SubtaskIndex(subtask)),
        operator_uids=CHAIN,
        keyed_operator_uids=(),
    )
    written = TaskStateDocument(
        job_id=f"job-{generation}",
        vertex_uid=VERTEX,
        subtask=subtask,
        attempt=0,
        checkpoint_id=CheckpointId(checkpoint_id),
        layout=layout,
        operator_state=InlineOperatorState({UID: data}),
    )
    return decode_task_state(encode_task_state(written), f"job-{generation} task {VERTEX}#{subtask}")


def _no_storage(key: str) -> bytes:
    raise AssertionError(f"a source's state is inline, nothing is read from storage ({key})")


@pytest.mark.parametrize("seed", range(60))
def test_state_passed_through_generations_keeps_every_source_position_exactly_once(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    chain = RestoreChain(seed, monkeypatch)
    chain.trace.append(f"seed {seed}")
    try:
        chain.run(generations=chain.rng.randint(3, 7))
    except (AssertionError, WeirError) as exc:
        trace = "\n  ".join(chain.trace)
        pytest.fail(f"seed {seed}: {type(exc).__name__}: {exc}\n  {trace}", pytrace=False)
    assert chain.committed, "nothing was read: the chain proves nothing\n  " + "\n  ".join(chain.trace)
