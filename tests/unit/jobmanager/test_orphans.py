"""Orphans: which uploads of checkpoints that never completed go, decided from a listing, then collected."""

from __future__ import annotations

import random
from pathlib import Path

import structlog.testing

from weir.connectors.object_storage import FileCheckpointStorage
from weir.core.checkpointing import CheckpointKind
from weir.core.ids import CheckpointId, JobId, OperatorUid, SubtaskIndex, TaskId, TaskManagerId
from weir.core.paths import CheckpointPaths
from weir.jobmanager.checkpointing.coordinator import CheckpointCoordinator
from weir.jobmanager.checkpointing.orphans import Kept, Orphans, StoredObject, find_orphans
from weir.jobmanager.checkpointing.pending import StateObject, TaskStateHandle
from weir.jobmanager.checkpointing.store import CompletedCheckpoint, InMemoryCompletedCheckpointStore
from weir.jobmanager.checkpointing.trigger import CheckpointConfig
from weir.jobmanager.orphans import collect_orphans

JOB = JobId("job-1")
TM = TaskManagerId("tm-a")
PATHS = CheckpointPaths("root")
SOURCE = TaskId(JOB, OperatorUid("source"), SubtaskIndex(0))


def sst(checkpoint_id: int, name: str, job: JobId = JOB) -> str:
    return PATHS.shared_sst(job, TM, "db1", CheckpointId(checkpoint_id), name)


def db_file(checkpoint_id: int, name: str, kind: CheckpointKind = CheckpointKind.CHECKPOINT) -> str:
    return PATHS.db_file(JOB, CheckpointId(checkpoint_id), TM, "db1", checkpoint_id, name, kind)


def metadata(checkpoint_id: int, kind: CheckpointKind = CheckpointKind.CHECKPOINT) -> str:
    return PATHS.metadata(JOB, CheckpointId(checkpoint_id), kind)


def completed(checkpoint_id: int, *keys: str, kind: CheckpointKind = CheckpointKind.CHECKPOINT) -> CompletedCheckpoint:
    state = TaskStateHandle(SOURCE, tuple(StateObject(k, 10) for k in keys))
    return CompletedCheckpoint(
        CheckpointId(checkpoint_id), JOB, 1.0, 2.0, (state,), metadata(checkpoint_id, kind), kind
    )


def listing(*keys: str) -> tuple[StoredObject, ...]:
    return tuple(StoredObject(k, 10) for k in keys)


def deleted(orphans: Orphans) -> set[str]:
    return {*orphans.metadata_keys, *orphans.object_keys}


# ---------------------------------------------------------------------------------------------------
# The decision


def test_a_crashed_checkpoint_s_uploads_go_and_the_retained_checkpoint_stays() -> None:
    retained = completed(5, sst(3, "a.sst"), sst(5, "b.sst"), db_file(5, "MANIFEST"))
    crashed = (sst(6, "c.sst"), db_file(6, "MANIFEST"), db_file(6, "CURRENT"))
    objects = listing(metadata(5), sst(3, "a.sst"), sst(5, "b.sst"), db_file(5, "MANIFEST"), *crashed)
    orphans = find_orphans(PATHS, JOB, objects, [retained])
    assert orphans.metadata == ()
    assert orphans.checkpoint_objects == listing(db_file(6, "CURRENT"), db_file(6, "MANIFEST"))
    assert orphans.shared_ssts == listing(sst(6, "c.sst"))
    assert orphans.size_bytes == 30
    assert orphans.kept_count(Kept.REFERENCED) == 4  # the metadata and the three objects of checkpoint 5


def test_a_subsumed_checkpoint_s_folder_goes_metadata_first_but_what_a_retained_one_reuses_stays() -> None:
    retained = completed(5, sst(3, "a.sst"), sst(5, "b.sst"))
    subsumed = (metadata(3), db_file(3, "MANIFEST"), sst(3, "a.sst"), sst(3, "old.sst"))
    orphans = find_orphans(PATHS, JOB, listing(metadata(5), sst(5, "b.sst"), *subsumed), [retained])
    assert orphans.metadata_keys == (metadata(3),)
    assert orphans.object_keys == (db_file(3, "MANIFEST"), sst(3, "old.sst"))


def test_an_aborted_checkpoint_s_uploads_go_even_those_its_tasks_never_acknowledged() -> None:
    retained = completed(2, sst(2, "a.sst"))
    aborted = (db_file(4, "MANIFEST"), PATHS.task_state(JOB, CheckpointId(4), OperatorUid("map"), SubtaskIndex(1)))
    orphans = find_orphans(PATHS, JOB, listing(metadata(2), sst(2, "a.sst"), sst(4, "x.sst"), *aborted), [retained])
    assert deleted(orphans) == {sst(4, "x.sst"), *aborted}


def test_nothing_of_a_checkpoint_in_flight_goes() -> None:
    retained = completed(2, sst(2, "a.sst"))
    in_flight = (metadata(3), db_file(3, "MANIFEST"), sst(3, "b.sst"))  # 3 is persisting its metadata
    released_but_reused = sst(1, "deferred.sst")  # released by a subsumption, reused by the ack of 3
    objects = listing(metadata(2), sst(2, "a.sst"), *in_flight, released_but_reused, sst(1, "gone.sst"))
    orphans = find_orphans(PATHS, JOB, objects, [retained], [CheckpointId(3)], [released_but_reused])
    assert deleted(orphans) == {sst(1, "gone.sst")}
    assert orphans.kept_count(Kept.IN_FLIGHT) == 3


def test_a_completed_savepoint_stays_with_every_sst_it_may_reuse_when_its_references_are_unknown() -> None:
    """After a JobManager restart savepoints are not in the store: a savepoint only reuses SSTs
    uploaded before it, so those stay; later ones nothing references go."""
    retained = completed(9, sst(9, "d.sst"))
    savepoint = (metadata(7, CheckpointKind.SAVEPOINT), db_file(7, "MANIFEST", CheckpointKind.SAVEPOINT))
    shared = (sst(3, "a.sst"), sst(7, "b.sst"), sst(8, "c.sst"), sst(9, "d.sst"))
    orphans = find_orphans(PATHS, JOB, listing(metadata(9), *savepoint, *shared), [retained])
    assert deleted(orphans) == {sst(8, "c.sst")}
    assert orphans.kept_count(Kept.SAVEPOINT) == 4


def test_a_retained_savepoint_keeps_only_what_it_references() -> None:
    savepoint = completed(
        7, sst(3, "a.sst"), db_file(7, "MANIFEST", CheckpointKind.SAVEPOINT), kind=CheckpointKind.SAVEPOINT
    )
    retained = completed(9, sst(9, "d.sst"))
    objects = listing(
        metadata(7, CheckpointKind.SAVEPOINT),
        db_file(7, "MANIFEST", CheckpointKind.SAVEPOINT),
        sst(3, "a.sst"),
        sst(3, "unreferenced.sst"),
        metadata(9),
        sst(9, "d.sst"),
    )
    orphans = find_orphans(PATHS, JOB, objects, [savepoint, retained])
    assert deleted(orphans) == {sst(3, "unreferenced.sst")}


def test_a_savepoint_that_never_completed_goes() -> None:
    retained = completed(9, sst(9, "d.sst"))
    crashed = (db_file(10, "MANIFEST", CheckpointKind.SAVEPOINT), sst(10, "e.sst"))
    orphans = find_orphans(PATHS, JOB, listing(metadata(9), sst(9, "d.sst"), *crashed), [retained])
    assert deleted(orphans) == set(crashed)


def test_the_job_record_other_jobs_and_keys_outside_the_layout_are_left_alone() -> None:
    alien = (
        "root/job-1/notes.txt",
        "root/job-1/checkpoints/chk-42/_metadata",  # not zero-padded: not Weir's
        "root/job-1/checkpoints/chk-00000000000000000004",  # a file where a folder should be
        "root/job-1/shared/tm-a/db1/garbage.sst",  # no uploading checkpoint id
        "root/job-1/savepoints/sp-00000000000000000004/",
    )
    others = (sst(4, "x.sst", JobId("job-10")), "root/job-10/_job", "elsewhere/job-1/_job")
    objects = listing(PATHS.job_record(JOB), *alien, *others)
    orphans = find_orphans(PATHS, JOB, objects, [])
    assert deleted(orphans) == set()
    assert dict(orphans.kept) == {Kept.JOB_RECORD: 1, Kept.UNKNOWN: len(alien), Kept.OTHER_JOB: len(others)}


def test_everything_in_a_retained_checkpoint_s_folder_stays_even_what_no_handle_lists() -> None:
    retained = completed(5, sst(5, "b.sst"))
    operator_state = PATHS.task_state(JOB, CheckpointId(5), OperatorUid("window"), SubtaskIndex(0))
    orphans = find_orphans(PATHS, JOB, listing(metadata(5), sst(5, "b.sst"), operator_state), [retained])
    assert deleted(orphans) == set() and orphans.kept_count(Kept.RETAINED) == 1


def test_a_key_a_retained_checkpoint_references_stays_wherever_it_lies() -> None:
    foreign_folder = db_file(3, "MANIFEST")
    retained = completed(5, foreign_folder)
    orphans = find_orphans(PATHS, JOB, listing(metadata(5), metadata(3), foreign_folder), [retained])
    assert deleted(orphans) == {metadata(3)}


def test_random_layouts_never_lose_what_is_retained_in_flight_or_unknown() -> None:
    """Seeded random jobs: every listed key is either deleted or kept, and nothing deleted is the job
    record, a protected key, in the folder of a retained, in-flight or completed savepoint, or an SST
    a savepoint may reuse; every shared SST and folder of an ended checkpoint nobody references goes."""
    for seed in range(300):
        rng = random.Random(seed)
        ids = list(range(1, 12))
        kinds = {i: rng.choice(list(CheckpointKind)) for i in ids}
        has_metadata = {i for i in ids if rng.random() < 0.6}
        in_flight = {i for i in ids if i not in has_metadata and rng.random() < 0.3}
        keys: set[str] = {PATHS.job_record(JOB), "root/job-1/stray"}
        for i in ids:
            keys |= {db_file(i, "MANIFEST", kinds[i]), sst(i, f"{i}.sst"), sst(i, f"{i}-extra.sst")}
            if i in has_metadata:
                keys.add(metadata(i, kinds[i]))
        shared = sorted(k for k in keys if PATHS.parse_shared_sst(k) is not None)
        completed_ids = sorted(has_metadata)
        retained_ids = set(rng.sample(completed_ids, k=min(len(completed_ids), rng.randint(0, 3))))
        retained = [
            completed(i, db_file(i, "MANIFEST", kinds[i]), *rng.sample(shared, k=3), kind=kinds[i])
            for i in sorted(retained_ids)
        ]
        live = set(rng.sample(shared, k=2))
        orphans = find_orphans(PATHS, JOB, listing(*keys), retained, map(CheckpointId, in_flight), live)

        gone = deleted(orphans)
        assert sum(count for _, count in orphans.kept) + len(gone) == len(keys), seed
        protected = live | {k for c in retained for k in c.object_keys} | {c.metadata_key for c in retained}
        unknown_savepoints = [i for i in has_metadata if kinds[i] is CheckpointKind.SAVEPOINT and i not in retained_ids]
        reuse_bound = max(unknown_savepoints, default=0)
        for key in keys:
            folder = PATHS.parse_checkpoint_object(key)
            shared_sst = PATHS.parse_shared_sst(key)
            if folder is not None:
                i = folder.checkpoint_id
                keep = i in retained_ids or i in in_flight or (i in unknown_savepoints and folder.kind == "savepoint")
            elif shared_sst is not None:
                keep = shared_sst.checkpoint_id in in_flight or shared_sst.checkpoint_id <= reuse_bound
            else:
                keep = True  # the job record and the stray key
            assert (key in gone) is (not keep and key not in protected), (seed, key)


# ---------------------------------------------------------------------------------------------------
# The coordinator's view and the collection


def coordinator(store: InMemoryCompletedCheckpointStore | None = None) -> CheckpointCoordinator:
    config = CheckpointConfig(interval_s=1.0, timeout_s=10.0)
    return CheckpointCoordinator(JOB, config, store or InMemoryCompletedCheckpointStore(2))


def test_the_coordinator_keeps_what_is_pending_and_what_its_acknowledgements_reuse() -> None:
    coord = coordinator()
    coord.load_completed([completed(2, sst(2, "a.sst"))])
    coord.start(0.0, [SOURCE, TaskId(JOB, OperatorUid("sink"), SubtaskIndex(0))], [SOURCE])
    trigger = coord.tick(1.0)[0]
    pending_id = trigger.checkpoint_id  # type: ignore[union-attr]
    coord.receive_ack(1.1, pending_id, SOURCE, TaskStateHandle(SOURCE, (StateObject(sst(2, "a.sst"), 10, True),)))
    objects = listing(
        metadata(2), sst(2, "a.sst"), sst(pending_id, "new.sst"), db_file(pending_id, "MANIFEST"), sst(1, "old.sst")
    )
    orphans = coord.find_orphans(PATHS, objects)
    assert deleted(orphans) == {sst(1, "old.sst")}


def test_collecting_deletes_the_orphans_and_logs_counts_and_bytes(tmp_path: Path) -> None:
    storage = FileCheckpointStorage(tmp_path)
    coord = coordinator()
    coord.load_completed([completed(2, sst(2, "a.sst"))])
    for key, data in {
        PATHS.job_record(JOB): b"{}",
        metadata(2): b"m",
        sst(2, "a.sst"): b"kept",
        sst(3, "b.sst"): b"orphan",
        db_file(3, "MANIFEST"): b"manifest",
    }.items():
        storage.put_bytes(key, data)
    with structlog.testing.capture_logs() as logs:
        orphans = collect_orphans(storage, PATHS, coord)
    assert orphans is not None
    assert sorted(k for k, _ in storage.list(PATHS.job_dir(JOB))) == sorted(
        [PATHS.job_record(JOB), metadata(2), sst(2, "a.sst")]
    )
    (event,) = [e for e in logs if e["event"] == "orphans_collected"]
    assert event["job_id"] == JOB and event["listed"] == 5
    assert (event["checkpoint_objects"], event["shared_ssts"], event["metadata"]) == (1, 1, 0)
    assert event["deleted_bytes"] == len(b"orphan") + len(b"manifest") and event["kept"] == 3
