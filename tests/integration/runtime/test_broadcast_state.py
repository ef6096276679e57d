"""Broadcast state on the session cluster: a bounded rules stream broadcast to every subtask of a
keyed operator changes some keys' factors mid-run (a second batch of versions valid from a later
event time, arriving while events flow) and ends early; a TaskManager is SIGKILLed once checkpoints
completed after it ended; the restored subtasks know the rules only from the checkpointed broadcast
state (the rules source does not read them again); the job is then rescaled from 3 to 2 (each new
subtask inherits the broadcast state) and finishes with both sinks exact (``weir verify``). The
checkpoints hold the broadcast state once: the three subtasks' documents name one content-addressed
object. In unaligned mode, with rules in flight at the checkpoint restored from, the restore is exact
too."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import psycopg
import pytest

from tests.integration.checkpointing.test_recovery import process_running, wait_until
from tests.integration.conftest import REPO_ROOT, WeirCluster, assert_sinks_exact, keyed_aggregation_inputs
from tests.integration.runtime.jobs.broadcast_rules import KEYS
from weir.connectors.object_storage import CheckpointStorage, ObjectNotFoundError, copy_folder, open_storage
from weir.core.broadcast_state import BroadcastStateRef
from weir.core.checkpointing import CheckpointKind
from weir.core.config import Endpoints, checkpoint_dir
from weir.core.ids import JobId
from weir.core.inflight_state import decode_inflight
from weir.core.paths import CheckpointPaths
from weir.core.task_state import INFLIGHT_STATE_NAME, TaskStateDocument, decode_task_state, read_operator_states
from weir.jobmanager.checkpointing.metadata import decode_metadata
from weir.jobmanager.checkpointing.store import CompletedCheckpoint
from weir.tools.events import EventSpec, events
from weir.tools.supervisor import kill_process

pytestmark = pytest.mark.integration

JOB = "tests/integration/runtime/jobs/broadcast_rules.py"
EVENTS = 20_000
RULES = KEYS + KEYS // 5  # the first batch, then every fifth key's second version
OPERATOR = "scale-by-rule"
PATHS = CheckpointPaths()


def retained_checkpoints(storage: CheckpointStorage, job_id: str, latest: int = 0) -> list[CompletedCheckpoint]:
    """The job's completed checkpoints whose metadata is in storage, by id (``latest`` > 0: only the
    last ones)."""
    found = []
    keys = [
        key
        for key, _ in storage.list(PATHS.checkpoints_dir(JobId(job_id)))
        if (parsed := PATHS.parse_metadata_key(key)) is not None and parsed.kind is CheckpointKind.CHECKPOINT
    ]
    for key in sorted(keys)[-latest:]:
        try:
            found.append(decode_metadata(storage.get_bytes(key), key))
        except ObjectNotFoundError:
            continue  # subsumed since the listing
    return sorted(found, key=lambda c: c.checkpoint_id)


def operator_documents(checkpoint: CompletedCheckpoint) -> list[TaskStateDocument]:
    """The task-state documents of the broadcast operator's subtasks, by subtask."""
    documents = [
        decode_task_state(s.inline_payload, f"checkpoint {checkpoint.checkpoint_id} {s.task_id}")
        for s in checkpoint.task_states
        if s.task_id.operator_uid == OPERATOR
    ]
    return sorted(documents, key=lambda d: d.subtask)


def broadcast_objects(storage: CheckpointStorage, checkpoint: CompletedCheckpoint) -> dict[str, int]:
    """Every object in the checkpoint's broadcast-state folder, with its size."""
    folder = PATHS.checkpoint_dir(checkpoint.job_id, checkpoint.checkpoint_id) + "broadcast/"
    return dict(storage.list(folder))


def inflight_rules(storage: CheckpointStorage, document: TaskStateDocument) -> int:
    """How many buffers of the rules input the subtask's unaligned checkpoint holds in flight."""
    data = read_operator_states(document.operator_state, storage.get_bytes).get(INFLIGHT_STATE_NAME)
    if data is None:
        return 0
    state = decode_inflight(data, f"{document.vertex_uid}#{document.subtask}", lambda _blob: 1)
    return sum(
        len(buffers) for channel, buffers in state.channels.items() if state.origins[channel].producer_vertex == "rules"
    )


def assert_stored_once(endpoints: Endpoints, job_id: str, parallelism: int) -> tuple[BroadcastStateRef, int]:
    """The latest retained checkpoint after the rules ended holds the broadcast state once: every
    subtask's document names the same object, the only one in its broadcast folder, and no subtask
    holds a copy of its own inline. Answers the reference and the size of the subtasks' documents."""
    storage = open_storage(checkpoint_dir(), endpoints)
    (checkpoint,) = retained_checkpoints(storage, job_id, latest=1)
    documents = operator_documents(checkpoint)
    assert [d.subtask for d in documents] == list(range(parallelism)), documents
    refs = {d.operator_state.broadcast[OPERATOR] for d in documents}
    assert all(d.operator_state_uids.count(OPERATOR) == 1 for d in documents)  # in `broadcast` only
    assert len(refs) == 1, refs
    (ref,) = refs
    assert broadcast_objects(storage, checkpoint) == {ref.key: ref.size_bytes}
    assert len(storage.get_bytes(ref.key)) == ref.size_bytes > 1_000  # every key's factors
    # No subtask's document carries a copy of its own (inline, the whole state would be in it).
    documents_bytes = [len(s.inline_payload) for s in checkpoint.task_states if s.task_id.operator_uid == OPERATOR]
    assert max(documents_bytes) < ref.size_bytes, (documents_bytes, ref.size_bytes)
    return ref, sum(documents_bytes)


def scaled_totals(spec: EventSpec, change_at_ms: int) -> Counter[tuple[str, int]]:
    """Each key's scaled values summed over the whole run, computed from the events and the job's
    two rule batches independently of the job: every fifth key's factor changes at ``change_at_ms``."""
    totals: Counter[str] = Counter()
    for e in events(spec):
        k = int(e["key"].removeprefix("key-"))
        factor = k % 11 + 2 if k % 5 == 0 and e["ts"] >= change_at_ms else k % 7 + 1
        totals[e["key"]] += e["value"] * factor
    return Counter(totals.items())


def kill_and_restore(weir_cluster: WeirCluster, job_id: str, victim: str) -> float:
    """Kill ``victim`` (a TaskManager running the job's tasks) and wait for the job to run again from a
    restore after the kill, still at parallelism 3; answers when it was killed."""
    killed_at = time.time()
    kill_process(weir_cluster.directory, victim)
    restored = wait_until(
        weir_cluster,
        job_id,
        lambda s: s.summary.status == "RUNNING" and (s.last_restore_at or 0) > killed_at,
        f"the job to restore after killing {victim}",
    )
    assert restored.summary.parallelism == 3
    return killed_at


def test_changing_broadcast_rules_survive_a_kill_and_a_rescale_exactly_once(
    weir_cluster: WeirCluster, unique: str
) -> None:
    endpoints = weir_cluster.endpoints
    spec = EventSpec(count=EVENTS, keys=400)  # event time spans start_ms .. start_ms + 2000
    params = keyed_aggregation_inputs(
        endpoints, unique, EVENTS, records_per_second=1000, checkpoint_interval="500ms", spec=spec
    )
    change_at = spec.start_ms + 1000
    params |= {
        "restart.strategy": "fixed-delay",
        "restart.delay": "1s",
        "rules.change_at_ms": str(change_at),
        "rules.records_per_second": "200",
        "checkpointing.retained": "1000",  # read back below, never subsumed while read
    }
    job_id = weir_cluster.submit(JOB, params, parallelism=3)

    victim = "taskmanager-2"
    rules_ended = wait_until(
        weir_cluster,
        job_id,
        lambda s: (
            s.summary.status == "RUNNING" and any(t.vertex_uid == "rules" and t.records_out >= RULES for t in s.tasks)
        ),
        "the rules stream to be read",
    )
    read = sum(t.records_out for t in rules_ended.tasks if t.vertex_uid == "events-source")
    assert 0 < read < EVENTS, f"the rules' second batch did not arrive while events flowed ({read} events read)"
    at = rules_ended.last_completed_checkpoint or 0
    wait_until(
        weir_cluster,
        job_id,
        lambda s: (
            s.summary.status == "RUNNING"
            and (s.last_completed_checkpoint or 0) >= at + 2
            and process_running(weir_cluster, victim)
        ),
        "two checkpoints after the rules were read",
    )
    assert_stored_once(endpoints, job_id, parallelism=3)
    killed_at = kill_and_restore(weir_cluster, job_id, victim)
    weir_cluster.wait_for_taskmanagers()

    trigger_id = weir_cluster.client.rescale(job_id, 2)
    rescale = weir_cluster.client.wait_for_rescale(job_id, trigger_id, 120)
    assert (rescale.from_parallelism, rescale.to_parallelism) == (3, 2), rescale

    final = wait_until(weir_cluster, job_id, lambda s: s.summary.status == "FINISHED", "the job to finish", 300)
    assert final.summary.status == "FINISHED", final.failure
    assert final.summary.parallelism == 2
    assert sorted(t.subtask for t in final.tasks if t.vertex_uid == "scale-by-rule") == [0, 1], final.tasks
    assert final.last_restore_at is not None and final.last_restore_at > killed_at
    assert_sinks_exact(JOB, params, job_id, endpoints)
    with psycopg.connect(endpoints.postgres_dsn) as conn:
        rows = conn.execute(f'SELECT key, sum("sum") FROM "{params["sink.table"]}" GROUP BY key').fetchall()
    assert Counter((key, int(total)) for key, total in rows) == scaled_totals(spec, change_at)


def test_an_unaligned_checkpoint_with_rules_in_flight_restores_each_subtask_exactly(
    weir_cluster: WeirCluster, unique: str
) -> None:
    """Unaligned checkpoints while the rules queue in the channels (each takes 5 ms to apply, 20 ms
    at the subtask with key-0000's events; they arrive at 200 per second: the lagging subtask's queue
    lasts ~10 s, as the events do; at 10 ms it lasted 19 s, and the job with it): a barrier overtakes
    queued rules, and the lagging subtask's copy holds fewer of them than the others'. Each distinct copy is
    stored once, and each subtask restores its own and replays its own in-flight rules. A TaskManager
    is killed while the rules are still being applied; the restored checkpoint held rules in flight
    and differing copies, and the job finishes with both sinks exact."""
    endpoints = weir_cluster.endpoints
    spec = EventSpec(count=8_000, keys=400)
    params = keyed_aggregation_inputs(
        endpoints, unique, 8_000, records_per_second=800, checkpoint_interval="300ms", spec=spec
    )
    change_at = spec.start_ms + 1000
    params |= {
        "restart.strategy": "fixed-delay",
        "restart.delay": "1s",
        "checkpointing.unaligned": "true",
        "checkpointing.retained": "1000",
        "rules.change_at_ms": str(change_at),
        "rules.records_per_second": "200",
        "rules.apply_delay_ms": "5",
        "rules.lagging_key": "key-0000",
    }
    job_id = weir_cluster.submit(JOB, params, parallelism=3)
    storage = open_storage(checkpoint_dir(), endpoints)

    def differing_copies_checkpointed() -> bool:
        """The latest completed checkpoint holds rules in flight at a subtask of the broadcast operator,
        and the subtasks' copies differ (the lagging one applied fewer)."""
        for checkpoint in retained_checkpoints(storage, job_id, latest=1):
            documents = operator_documents(checkpoint)
            copies = {d.operator_state.broadcast[OPERATOR].key for d in documents if d.operator_state.broadcast}
            return len(copies) > 1 and any(inflight_rules(storage, d) for d in documents)
        return False

    victim = "taskmanager-2"
    wait_until(
        weir_cluster,
        job_id,
        lambda s: (
            s.summary.status == "RUNNING" and process_running(weir_cluster, victim) and differing_copies_checkpointed()
        ),
        "a completed unaligned checkpoint with rules in flight and differing copies",
    )
    killed_at = kill_and_restore(weir_cluster, job_id, victim)
    final = wait_until(weir_cluster, job_id, lambda s: s.summary.status == "FINISHED", "the job to finish", 300)
    assert final.summary.status == "FINISHED", final.failure

    # The checkpoint restored from: the latest completed before the kill. It held rules in flight.
    checkpoints = retained_checkpoints(storage, job_id)
    before = [c for c in checkpoints if c.trigger_timestamp < killed_at]
    restored_from = before[-1]
    documents = operator_documents(restored_from)
    in_flight = [inflight_rules(storage, d) for d in documents]
    assert any(in_flight), (restored_from.checkpoint_id, in_flight)
    refs = {d.operator_state.broadcast[OPERATOR] for d in documents if OPERATOR in d.operator_state.broadcast}
    assert len(refs) > 1, refs  # the copies differed: each subtask restored its own
    assert broadcast_objects(storage, restored_from) == {ref.key: ref.size_bytes for ref in refs}
    # The reference run without the slow rule updates (timing only, never the result): at parallelism
    # 1 its one subtask lags (it has key-0000's events), and 480 rules at 40 ms took 19 s of the test.
    reference_params = {k: v for k, v in params.items() if k != "rules.apply_delay_ms"}
    assert_sinks_exact(JOB, reference_params, job_id, endpoints)
    with psycopg.connect(endpoints.postgres_dsn) as conn:
        rows = conn.execute(f'SELECT key, sum("sum") FROM "{params["sink.table"]}" GROUP BY key').fetchall()
    assert Counter((key, int(total)) for key, total in rows) == scaled_totals(spec, change_at)


def test_a_savepoint_holds_the_broadcast_state_once_and_a_copy_of_it_restores_at_another_parallelism(
    weir_cluster: WeirCluster, unique: str, tmp_path: Path
) -> None:
    """Stop with a savepoint at parallelism 3 once the rules ended: its folder holds one broadcast
    object, which the documents name relative to the folder; copied elsewhere, `weir savepoint info`
    reads it from the copy, and a job restored from the copy at parallelism 2 finishes with both sinks
    exact over both jobs."""
    endpoints = weir_cluster.endpoints
    client = weir_cluster.client
    spec = EventSpec(count=EVENTS, keys=400)
    params = keyed_aggregation_inputs(
        endpoints, unique, EVENTS, records_per_second=1000, checkpoint_interval="500ms", spec=spec
    )
    change_at = spec.start_ms + 1000
    params |= {"rules.change_at_ms": str(change_at), "rules.records_per_second": "400"}
    old = weir_cluster.submit(JOB, params, parallelism=3)
    wait_until(
        weir_cluster,
        old,
        lambda s: (
            s.summary.status == "RUNNING"
            and any(t.vertex_uid == "rules" and t.records_out >= RULES for t in s.tasks)
            and (s.last_completed_checkpoint or 0) >= 1
        ),
        "the rules stream to be read",
    )
    target = f"s3://{endpoints.s3_bucket}/user-savepoints-{unique}"
    savepoint_id = client.trigger_savepoint(old, target, stop=True)
    path = client.wait_for_savepoint(old, savepoint_id, timeout_s=120.0).external_path
    stopped = wait_until(weir_cluster, old, lambda s: s.summary.status == "FINISHED", "the stopped job to end")
    read = sum(t.records_in_all_attempts for t in stopped.tasks if t.vertex_uid == OPERATOR)
    assert 0 < read < EVENTS + RULES * 3, "the job read all its input before the savepoint: it would prove nothing"

    saved = open_storage(path)
    listing = dict(saved.list(""))
    broadcast = {key: size for key, size in listing.items() if key.startswith("broadcast/")}
    metadata = decode_metadata(saved.get_bytes("_metadata"), "_metadata")
    refs = {d.operator_state.broadcast[OPERATOR] for d in operator_documents(metadata)}
    assert len(refs) == 1 and broadcast == {ref.key: ref.size_bytes for ref in refs}, (refs, broadcast)

    copied = tmp_path / "moved-savepoint"
    assert copy_folder(saved, "", open_storage(str(copied))) == sum(listing.values())
    # Offline, from the copy alone: `weir savepoint info` reads every subtask's state as a restore does
    # (the broadcast object checked against its size and digest).
    done = subprocess.run(
        [sys.executable, "-m", "weir.tools.cli", "savepoint", "info", str(copied), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    info = json.loads(done.stdout)
    assert (info["job_id"], info["kind"], info["formats"]["task_state"]) == (old, "savepoint", 3), info
    named = [s["operator_state"]["broadcast"][OPERATOR]["key"] for s in info["subtasks"] if s["vertex_uid"] == OPERATOR]
    assert named == [ref.key for ref in refs] * 3, named

    # The restored job reads the rest of the events unpaced: nothing happens to it while it runs (the
    # pacing only kept the first job reading until its savepoint), and its output does not depend on
    # the pace (the rules ended before the savepoint; each event waits for its timer)
    resumed = params | {"source.records_per_second": "0"}
    new = client.submit_job(REPO_ROOT / JOB, resumed, 2, from_checkpoint=str(copied))
    weir_cluster.submitted.append(new)
    ended = wait_until(weir_cluster, new, lambda s: s.summary.status.terminal, "the restored job to end", 300)
    assert ended.summary.status == "FINISHED", ended.failure
    assert sorted(t.subtask for t in ended.tasks if t.vertex_uid == OPERATOR) == [0, 1]
    assert_sinks_exact(JOB, resumed, new, endpoints, earlier_job_ids=(old,))
    with psycopg.connect(endpoints.postgres_dsn) as conn:
        rows = conn.execute(f'SELECT key, sum("sum") FROM "{params["sink.table"]}" GROUP BY key').fetchall()
    assert Counter((key, int(total)) for key, total in rows) == scaled_totals(spec, change_at)
