"""Three generations of one keyed job on the real cluster, each a new job started from the state of
the one before at another parallelism (3 -> 2 -> 3), aligned and unaligned, with a checkpoint every
200 ms: the first is cancelled after a completed
checkpoint and the second starts from that retained checkpoint (``--from-checkpoint``), the second is
stopped with a savepoint and the third starts from it and reads the input to its end. Each reads part
of the input. Every restore point holds each Kafka partition's position once, in the state of the
source subtask that reads it; both sinks' committed output over the whole input is exactly the
reference as a multiset (``weir verify``: the Kafka sink read_committed, nothing missing, duplicated
or unexpected); the consumer group's offsets never go back and end at the topic's end."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.integration import polling
from tests.integration.checkpointing.test_rescale import events_read, retained
from tests.integration.checkpointing.test_savepoints import prepared_of, stop_with_savepoint
from tests.integration.conftest import REPO_ROOT, WeirCluster, assert_sinks_exact, keyed_aggregation_inputs
from tests.integration.polling import poll
from weir.connectors import kafka
from weir.core.config import Endpoints
from weir.core.descriptors import default_group_id
from weir.core.states import JobStatus
from weir.operators.sources import decode_kafka_source_state
from weir.tools.client import JobDetails
from weir.tools.savepoint_inspect import load_savepoint

pytestmark = pytest.mark.integration

JOB = REPO_ROOT / "examples" / "keyed_aggregation.py"
SOURCE_UID = "events-source"
EVENTS = 30_000
PARTITIONS = 6  # keyed_aggregation_inputs' source topic


def source_positions(endpoints: Endpoints, path: str) -> list[dict[int, int]]:
    """Each source subtask's positions in the checkpoint or savepoint at ``path``, by subtask, as a
    restore reads them; checks that each holds only the partitions it reads (p % parallelism)."""
    loaded = load_savepoint(path, endpoints)
    subtasks = sorted(
        (t.document.subtask, t.document.layout.parallelism, t.operator_states[SOURCE_UID])
        for t in loaded.tasks
        if SOURCE_UID in t.operator_states
    )
    positions = []
    for subtask, parallelism, data in subtasks:
        nexts, _ends = decode_kafka_source_state(data)
        assert all(p % parallelism == subtask for p in nexts), (
            f"{path}: source subtask {subtask}/{parallelism} holds the positions of partitions {sorted(nexts)}"
        )
        positions.append(nexts)
    assert [s for s, _p, _d in subtasks] == list(range(len(subtasks))), f"{path}: source subtasks {subtasks}"
    return positions


def union_once(positions: list[dict[int, int]]) -> dict[int, int]:
    """The positions of all subtasks as one, each partition in exactly one subtask's state."""
    union: dict[int, int] = {}
    for held in positions:
        assert not set(held) & set(union), f"partitions {sorted(set(held) & set(union))} held twice: {positions}"
        union |= held
    return union


def group_offsets(endpoints: Endpoints, topic: str) -> dict[int, int]:
    return kafka.committed_offsets(endpoints, default_group_id(JOB.stem, SOURCE_UID), topic)


def ended(cluster: WeirCluster, job_id: str, what: str, timeout_s: float = 180.0) -> JobDetails:
    client = cluster.client
    done: JobDetails = polling.until(
        what, timeout_s, lambda: (s := client.job_status(job_id)).summary.status.terminal and s
    )
    return done


def part_way(cluster: WeirCluster, job_id: str, events: int) -> Callable[[], bool]:
    """A check that the job has read more than ``events`` events and retains a completed checkpoint."""
    return lambda: bool(retained(cluster, job_id)) and events_read(cluster.client.job_status(job_id)) > events


@pytest.mark.parametrize("mode", ["aligned", "unaligned"])
def test_three_generations_3_2_3_keep_every_source_position_once_and_both_sinks_exact(
    weir_cluster: WeirCluster, unique: str, mode: str
) -> None:
    """Periodic checkpoints every 200 ms race the stop's savepoint; in unaligned mode the cancelled
    generation's retained checkpoint may hold records in flight, which the next generation replays."""
    endpoints, client = weir_cluster.endpoints, weir_cluster.client
    params = keyed_aggregation_inputs(endpoints, unique, EVENTS, records_per_second=3000, checkpoint_interval="200ms")
    params["checkpointing.unaligned"] = "true" if mode == "unaligned" else "false"
    topic = params["source.topic"]
    end = kafka.end_offsets(endpoints, topic)
    assert sum(end.values()) == EVENTS and len(end) == PARTITIONS

    # Generation 1, parallelism 3: cancelled after a completed checkpoint, part way through.
    first = client.submit_job(JOB, params, 3)
    weir_cluster.submitted.append(first)
    polling.until("the first job part way, with a retained checkpoint", 120, part_way(weir_cluster, first, EVENTS // 5))
    client.cancel_job(first)
    polling.until(
        "the first job to be CANCELED", 120, lambda: client.job_status(first).summary.status is JobStatus.CANCELED
    )
    read_by_first = events_read(client.job_status(first))
    assert 0 < read_by_first < EVENTS, f"the first job read {read_by_first} of {EVENTS} events"
    checkpoint = retained(weir_cluster, first)[-1].external_path
    held = source_positions(endpoints, checkpoint)
    assert len(held) == 3
    at_checkpoint = union_once(held)
    assert 0 < sum(at_checkpoint.values()) < EVENTS
    after_first = group_offsets(endpoints, topic)
    assert all(o <= at_checkpoint.get(p, 0) for p, o in after_first.items()), (after_first, at_checkpoint)

    # Generation 2, parallelism 2, from the retained checkpoint: stopped with a savepoint, part way.
    second = client.submit_job(JOB, params, 2, from_checkpoint=checkpoint)
    weir_cluster.submitted.append(second)
    polling.until(
        "the second job part way, with a completed checkpoint", 120, part_way(weir_cluster, second, EVENTS // 5)
    )
    savepoint = stop_with_savepoint(weir_cluster, second)
    read_by_second = events_read(client.job_status(second))
    assert 0 < read_by_second < EVENTS - sum(at_checkpoint.values()), f"the second job read {read_by_second}"
    held = source_positions(endpoints, savepoint)
    assert len(held) == 2
    at_savepoint = union_once(held)
    # A partition not read past its beginning yet has no position; one that has keeps it, moving on.
    assert set(at_checkpoint) <= set(at_savepoint), f"positions lost: {at_checkpoint} -> {at_savepoint}"
    assert all(at_savepoint[p] >= at_checkpoint.get(p, 0) for p in at_savepoint), (at_checkpoint, at_savepoint)
    assert sum(at_savepoint.values()) < EVENTS
    # The savepoint's completion committed its positions, each by the subtask that reads the partition:
    # the group's offsets moved forward from the first job's, none back to the checkpoint's.
    poll(
        "the group's offsets at the savepoint's positions",
        60.0,
        lambda: (group_offsets(endpoints, topic) == at_savepoint) or None,
    )

    # Generation 3, parallelism 3, from the savepoint: reads the input to its end, unpaced (only the
    # generations stopped part way need the pace).
    third = client.submit_job(JOB, {**params, "source.records_per_second": "0"}, 3, from_checkpoint=savepoint)
    weir_cluster.submitted.append(third)
    done = ended(weir_cluster, third, "the third job to end")
    assert all(o <= end[p] for p, o in group_offsets(endpoints, topic).items())
    assert done.summary.status is JobStatus.FINISHED, done.failure
    assert done.summary.parallelism == 3
    read_by_third = events_read(done)
    assert 0 < read_by_third < EVENTS, f"the third job read {read_by_third} of {EVENTS}: it did not resume"

    # Both sinks over the whole input: exactly the reference, as multisets of whole records.
    report = assert_sinks_exact(JOB, params, third, endpoints, earlier_job_ids=(first, second))
    kafka_sink = next(s for s in report.sinks if s.kind == "kafka")
    assert (kafka_sink.duplicates, kafka_sink.missing, kafka_sink.unexpected) == (0, 0, 0)
    assert kafka_sink.found == kafka_sink.expected > 0
    assert {s.kind for s in report.sinks} == {"kafka", "postgres"}
    for job_id in (first, second, third):
        assert prepared_of(weir_cluster, job_id) == [], f"job {job_id} left prepared transactions"
    # The last job's final checkpoint committed the end of every partition.
    poll("the group's offsets at the topic's end", 60.0, lambda: (group_offsets(endpoints, topic) == end) or None)
