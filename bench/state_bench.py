"""Checkpoint and restore of keyed state as curves over state size (issue 13).

``make bench-state`` (``.venv/bin/python -m bench.state_bench [--quick] [--sizes 100000,1000000]``) drives
the TaskManager's own snapshot code (``weir.taskmanager.snapshots.TaskKeyedState``: one RocksDB per subtask,
incremental uploads) against the real checkpoint storage, without a cluster. For each size N:

1. one subtask owning all 128 key groups writes N keys (16 bytes, 32-byte values) through a
   ``KeyedStateStore``;
2. checkpoint 1 (first: every file uploaded), completed; 1 % of the keys updated, checkpoint 2
   (incremental), completed; 10 % updated, checkpoint 3 (not with ``--quick``);
3. restores of the latest checkpoint, each into a fresh database as a redeployed subtask: at the same
   parallelism (1 -> 1: one handle, the whole range, opened as the database), after which the restored
   subtask checkpoints unchanged (every restored SST reused: only the small private files uploaded),
   then after 1 % of the keys changed (beside the same change checkpointed by the writer itself, before
   it was discarded: what the database uploads for it without a restore, its compactions included),
   and rescaled to 2 (1 -> 2: each subtask half the range of the one handle, opened and the
   other half range-deleted); the two rescaled subtasks then checkpoint (a first checkpoint of their
   new databases) and that is restored into 1 subtask (2 -> 1: one handle opened, the other copied)
   and into subtask 1 of 3 (2 -> 3: key groups 43..85, a third of each handle: both copied).

Each figure has its wall time and the CPU seconds of this process (all its threads: uploads and
downloads run on background threads) beside it, and, for the local S3 server, that server's CPU
seconds. Every restore is checked: after it (outside the measured time) the restored key groups must
hold as many entries as were written into them, and the entries it copied one by one are reported.
Results: ``bench/results/state.json``, ``state.md`` and ``state.png`` (``bench.state_report``); the
targets are reported as pass/miss, never asserted. The run's objects live under a prefix named after
the run and are deleted at the end, as is its local directory.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, Final

from bench import state_report
from bench.harness import REPO_ROOT, RESULTS_DIR, BenchError, log, new_run_id
from weir.connectors.object_storage import CheckpointStorage, FileCheckpointStorage, open_storage
from weir.core import logs
from weir.core.config import Endpoints, run_dir
from weir.core.ids import CheckpointId, JobId, KeyGroup, OperatorUid, SubtaskIndex, TaskManagerId
from weir.core.keygroups import KeyGroupRange, key_group_for, key_group_range_for_subtask
from weir.core.paths import CheckpointPaths
from weir.taskmanager.snapshots import KeyedStateHandle, RestoreResult, SnapshotResult, TaskKeyedState
from weir.taskmanager.state import RocksDBKeyedStateStore as KeyedStateStore
from weir.taskmanager.state import RocksDBStateBackend as StateBackend

NAMESPACE: Final = "agg"  # the keyed operator's state namespace (its uid), in keys and in ranges
STATE_NAME: Final = "count"
MAX_PARALLELISM: Final = 128
KEY_BYTES: Final = 16
VALUE_BYTES: Final = 32
FULL_SIZES: Final = (100_000, 1_000_000, 5_000_000)
QUICK_SIZES: Final = (100_000, 1_000_000)
UPDATES: Final = (0.01, 0.10)  # fractions of the keys changed before checkpoints 2, 3, ...
AFTER_RESTORE_UPDATE: Final = 0.01  # of the keys changed after the 1 -> 1 restore, before its next checkpoint
UNCHANGED_AFTER_RESTORE_LABEL: Final = "unchanged after restore 1->1"
AFTER_RESTORE_LABEL: Final = "1% after restore 1->1"
CONTROL_LABEL: Final = "1% more without a restore"
QUICK_UPDATES: Final = (0.01,)
RESTORE_REPEATS: Final = 3  # a restore is repeatable (a fresh database each time); checkpoints are a sequence
SNAPSHOT_TIMEOUT_S: Final = 1800.0
PATHS: Final = CheckpointPaths()
FULL_RANGE: Final = KeyGroupRange(KeyGroup(0), KeyGroup(MAX_PARALLELISM - 1))


# What is measured ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Usage:
    """Wall and CPU seconds of one measured step; ``s3_cpu_s`` is the local S3 server's (None: unknown)."""

    wall_s: float
    cpu_s: float
    s3_cpu_s: float | None


@dataclass(frozen=True)
class CheckpointFigures:
    label: str
    checkpoint_id: int
    subtask: str
    changed_keys: int
    cache_flush_s: float  # writing the KeyedStateStore's dirty entries (on the task thread, before the snapshot)
    sync_s: float  # cache flush + the snapshot's synchronous part (memtable flush, RocksDB checkpoint)
    async_s: float  # the asynchronous part: waiting for the uploads started in the synchronous one
    usage: Usage  # from the cache flush until every file is in the storage
    uploaded_bytes: int
    uploaded_files: int
    size_bytes: int  # everything the handle references, reused files included
    files: int
    reused_files: int

    @property
    def duration_s(self) -> float:
        return self.usage.wall_s


@dataclass(frozen=True)
class RestoreFigures:
    label: str  # "1->1", "1->2", "2->1", "2->3"
    from_parallelism: int
    to_parallelism: int
    subtask: int
    key_groups: tuple[int, int]
    handles_used: int
    entries: int  # in the restored key groups after the restore
    expected_entries: int
    copied_entries: int  # copied entry by entry (0: every handle used was opened as the database)
    adopted: bool  # a handle was opened as the database
    downloaded_bytes: int
    usage: Usage  # the restore call (downloads, opening each snapshot, copying the ranges): the median sample
    samples: tuple[Usage, ...]  # every repeat, in order

    @property
    def duration_s(self) -> float:
        return self.usage.wall_s


@dataclass(frozen=True)
class SizeFigures:
    keys: int
    write: Usage  # writing the N keys (not a target; says what the rest is next to)
    live_sst_bytes: int  # the written database's SST files at the first checkpoint
    checkpoints: tuple[CheckpointFigures, ...]
    restores: tuple[RestoreFigures, ...]
    total: Usage
    load_average_at_start: tuple[float, float, float]  # the machine is shared: how busy it was


# The measurement ---------------------------------------------------------------------------------


def key_of(index: int) -> bytes:
    return b"k%015d" % index


def value_of(index: int, version: int) -> bytes:
    """Key ``index``'s value after ``version`` updates: 32 incompressible bytes, deterministic."""
    return hashlib.blake2b(index.to_bytes(8, "big") + version.to_bytes(2, "big"), digest_size=VALUE_BYTES).digest()


def updated_indexes(keys: int, fraction: float) -> range:
    """The keys an update of ``fraction`` of them changes: every (1 / fraction)-th, spread over all key groups."""
    return range(0, keys, max(1, round(1 / fraction)))


def final_versions(keys: int, updates: Sequence[float]) -> dict[int, int]:
    """Index -> version for the keys the updates changed (the others keep version 0)."""
    versions: dict[int, int] = {}
    for version, fraction in enumerate(updates, start=1):
        versions.update(dict.fromkeys(updated_indexes(keys, fraction), version))
    return versions


class _S3ServerCpu:
    """CPU seconds of the local S3 server process (``$WEIR_RUN_DIR/s3/s3.pid``), when it runs here."""

    def __init__(self, pid: int | None) -> None:
        self._stat = Path(f"/proc/{pid}/stat") if pid is not None else None
        self._ticks = os.sysconf("SC_CLK_TCK")

    @classmethod
    def local(cls) -> _S3ServerCpu:
        try:
            return cls(int((run_dir() / "s3" / "s3.pid").read_text().split()[0]))
        except (OSError, ValueError, IndexError):
            return cls(None)

    def read(self) -> float | None:
        if self._stat is None:
            return None
        try:
            fields = self._stat.read_text().rpartition(")")[2].split()
        except OSError:
            return None
        return (int(fields[11]) + int(fields[12])) / self._ticks  # utime, stime (fields 14, 15 of stat)


class _Meter:
    """Measures steps: ``with meter() as usage: ...`` then ``usage()``."""

    def __init__(self, s3_cpu: _S3ServerCpu) -> None:
        self._s3_cpu = s3_cpu

    @contextlib.contextmanager
    def __call__(self) -> Iterator[Callable[[], Usage]]:
        wall, cpu, s3 = time.perf_counter(), time.process_time(), self._s3_cpu.read()
        measured: list[Usage] = []
        yield lambda: measured[0]
        s3_end = self._s3_cpu.read()
        s3_cpu = s3_end - s3 if s3 is not None and s3_end is not None else None
        measured.append(Usage(time.perf_counter() - wall, time.process_time() - cpu, s3_cpu))


@dataclass
class _Subtask:
    """One keyed subtask's state: its own database and snapshotter, as a TaskManager deploys it."""

    name: str
    key_groups: KeyGroupRange
    attempt: int
    keyed: TaskKeyedState
    _store: KeyedStateStore | None = None

    @property
    def store(self) -> KeyedStateStore:
        """The operator's store, opened on first use: after the restore, as an operator opens after it
        (a database a store was opened on is not replaced by a restored one)."""
        if self._store is None:
            self._store = self.keyed.backend.keyed_store(NAMESPACE)
        return self._store

    @property
    def ranges(self) -> tuple[tuple[OperatorUid, KeyGroupRange], ...]:
        return ((OperatorUid(NAMESPACE), self.key_groups),)


@dataclass
class StateBench:
    """The steps of one size, against one storage; every database lives under ``work_dir``."""

    keys: int
    storage: CheckpointStorage
    work_dir: Path
    job_id: JobId
    meter: _Meter
    verify: Callable[[RestoreFigures, StateBackend], None] | None = None
    key_groups: bytearray = field(init=False)  # key group of each key index
    group_sizes: list[int] = field(init=False)  # keys per key group
    _deployed: list[_Subtask] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.key_groups = bytearray(key_group_for(key_of(i), MAX_PARALLELISM) for i in range(self.keys))
        self.group_sizes = [0] * MAX_PARALLELISM
        for group in self.key_groups:
            self.group_sizes[group] += 1

    def deploy(
        self, name: str, key_groups: KeyGroupRange, attempt: int, restored: Sequence[KeyedStateHandle] = ()
    ) -> _Subtask:
        keyed = TaskKeyedState(self.work_dir / name, self.storage, PATHS, TaskManagerId(name))
        keyed.snapshotter.start_attempt(self.job_id, attempt, restored)
        subtask = _Subtask(name, key_groups, attempt, keyed)
        self._deployed.append(subtask)
        return subtask

    def discard(self, subtask: _Subtask) -> None:
        subtask.keyed.discard()
        self._deployed.remove(subtask)

    def discard_all(self) -> None:
        for subtask in list(self._deployed):
            self.discard(subtask)

    def write(self, subtask: _Subtask, indexes: Iterable[int], version: int) -> int:
        put, groups, name = subtask.store.put, self.key_groups, STATE_NAME
        written = 0
        for i in indexes:
            put(name, groups[i], key_of(i), value_of(i, version))
            written += 1
        return written

    def snapshot(
        self, subtask: _Subtask, checkpoint_id: int, label: str, changed_keys: int
    ) -> tuple[KeyedStateHandle, CheckpointFigures]:
        """Checkpoint ``checkpoint_id`` of the subtask, as at a barrier, then its completion notice."""
        cid = CheckpointId(checkpoint_id)
        with self.meter() as usage:
            flush_started = time.perf_counter()
            subtask.store.flush()
            cache_flush_s = time.perf_counter() - flush_started
            future = subtask.keyed.snapshotter.begin(self.job_id, cid, subtask.ranges, attempt=subtask.attempt)
            result: SnapshotResult = future.result(SNAPSHOT_TIMEOUT_S)
        subtask.keyed.snapshotter.notify_checkpoint_complete(self.job_id, cid, attempt=subtask.attempt)
        handle = result.handle
        figures = CheckpointFigures(
            label=label,
            checkpoint_id=checkpoint_id,
            subtask=subtask.name,
            changed_keys=changed_keys,
            cache_flush_s=cache_flush_s,
            sync_s=cache_flush_s + result.sync_duration_s,
            async_s=result.async_duration_s,
            usage=usage(),
            uploaded_bytes=result.uploaded_bytes,
            uploaded_files=result.uploaded_files,
            size_bytes=handle.size_bytes,
            files=len(handle.objects),
            reused_files=sum(1 for f in handle.objects if f.reused),
        )
        log(
            f"{self.keys:,} keys: checkpoint {checkpoint_id} ({label}, {subtask.name}) {figures.duration_s:.2f} s, "
            f"{figures.uploaded_bytes / 1e6:.1f} MB in {figures.uploaded_files} files uploaded "
            f"({figures.reused_files} reused), CPU {figures.usage.cpu_s:.2f} s"
        )
        return handle, figures

    def restore(
        self,
        name: str,
        handles: Sequence[KeyedStateHandle],
        from_parallelism: int,
        to_parallelism: int,
        subtask_index: int,
        attempt: int,
        repeats: int,
    ) -> tuple[RestoreFigures, _Subtask]:
        """Restore into a fresh subtask ``repeats`` times (each a new database, nothing cached); the figures
        are the median's, the last subtask stays deployed."""
        key_groups = key_group_range_for_subtask(MAX_PARALLELISM, to_parallelism, SubtaskIndex(subtask_index))
        expected = sum(self.group_sizes[key_groups.start : key_groups.end + 1])
        label = f"{from_parallelism}->{to_parallelism}"
        samples: list[Usage] = []
        subtask: _Subtask | None = None
        for _ in range(repeats):
            if subtask is not None:
                self.discard(subtask)
            subtask = self.deploy(name, key_groups, attempt, handles)
            with self.meter() as usage:
                result: RestoreResult = subtask.keyed.snapshotter.restore(
                    handles, subtask.ranges, job_id=self.job_id, attempt=attempt
                )
            samples.append(usage())
            entries = self.entries_in(subtask)
            log(
                f"{self.keys:,} keys: restore {label} subtask {subtask_index} {key_groups} {samples[-1].wall_s:.2f} s, "
                f"{result.handles_used} handle(s), {'one opened as the database, ' if result.adopted else ''}"
                f"{result.copied_entries:,} entries copied, {result.downloaded_bytes / 1e6:.1f} MB downloaded, "
                f"CPU {samples[-1].cpu_s:.2f} s"
            )
            if entries != expected:
                raise BenchError(
                    f"{self.keys:,} keys: restore {label} into subtask {subtask_index} {key_groups} left "
                    f"{entries:,} entries there, {expected:,} were written into those key groups"
                )
        assert subtask is not None, "repeats must be at least 1"
        figures = RestoreFigures(
            label=label,
            from_parallelism=from_parallelism,
            to_parallelism=to_parallelism,
            subtask=subtask_index,
            key_groups=(key_groups.start, key_groups.end),
            handles_used=result.handles_used,
            entries=entries,
            expected_entries=expected,
            copied_entries=result.copied_entries,
            adopted=result.adopted is not None,
            downloaded_bytes=result.downloaded_bytes,
            usage=sorted(samples, key=lambda u: u.wall_s)[len(samples) // 2],
            samples=tuple(samples),
        )
        if self.verify is not None:
            self.verify(figures, subtask.keyed.backend)
        return figures, subtask

    def entries_in(self, subtask: _Subtask) -> int:
        """The entries of the subtask's key groups in its database (not measured: a check)."""
        store = subtask.store
        return sum(1 for group in subtask.key_groups for _ in store.items(STATE_NAME, group))


def measure_size(
    keys: int,
    storage: CheckpointStorage,
    work_dir: Path,
    *,
    updates: Sequence[float] = UPDATES,
    verify: Callable[[RestoreFigures, StateBackend], None] | None = None,
    s3_cpu: _S3ServerCpu | None = None,
    restore_repeats: int = RESTORE_REPEATS,
) -> SizeFigures:
    """Every figure of one state size (see the module docstring); deletes its objects and databases after.

    Each restore runs ``restore_repeats`` times (median reported); ``verify`` is called with the last
    restored database of each kind before it is discarded. Raises BenchError when a
    restore does not give back the keys written into its key groups.
    """
    job_id = JobId(f"state-{keys}")
    meter = _Meter(s3_cpu or _S3ServerCpu(None))
    bench = StateBench(keys, storage, work_dir / job_id, job_id, meter, verify)
    checkpoints: list[CheckpointFigures] = []
    restores: list[RestoreFigures] = []
    load_average = os.getloadavg()
    try:
        with meter() as total:
            writer = bench.deploy("writer", FULL_RANGE, attempt=1)
            with meter() as write:
                bench.write(writer, range(keys), version=0)
                writer.store.flush()
            log(f"{keys:,} keys written in {write().wall_s:.1f} s (CPU {write().cpu_s:.1f} s)")
            live_sst = writer.keyed.live_sst_bytes()
            checkpoint_id = 1
            latest, figures = bench.snapshot(writer, checkpoint_id, "first", keys)
            checkpoints.append(figures)
            live_sst = max(live_sst, writer.keyed.live_sst_bytes())
            for version, fraction in enumerate(updates, start=1):
                changed = bench.write(writer, updated_indexes(keys, fraction), version)
                checkpoint_id += 1
                latest, figures = bench.snapshot(writer, checkpoint_id, f"incremental {fraction:.0%}", changed)
                checkpoints.append(figures)
            # The control: the writer's own next checkpoint after the change the restored subtask makes below
            # (what the same database uploads for it without a restore, compactions included).
            after_change = updated_indexes(keys, AFTER_RESTORE_UPDATE)
            changed = bench.write(writer, after_change, len(updates) + 1)
            _control, figures = bench.snapshot(writer, checkpoint_id + 1, CONTROL_LABEL, changed)
            checkpoints.append(figures)
            bench.discard(writer)

            same, restored = bench.restore("p1-0", [latest], 1, 1, 0, 2, restore_repeats)
            restores.append(same)
            # The restored subtask's first checkpoints: unchanged (every restored SST reused), then after the
            # control's change (reused what no compaction rewrote).
            checkpoint_id += 1
            _handle, figures = bench.snapshot(restored, checkpoint_id, UNCHANGED_AFTER_RESTORE_LABEL, 0)
            checkpoints.append(figures)
            changed = bench.write(restored, after_change, len(updates) + 1)
            checkpoint_id += 1
            _handle, figures = bench.snapshot(restored, checkpoint_id, AFTER_RESTORE_LABEL, changed)
            checkpoints.append(figures)
            bench.discard(restored)

            rescaled: list[_Subtask] = []
            for index in range(2):
                figures_out, subtask = bench.restore(f"p2-{index}", [latest], 1, 2, index, 2, restore_repeats)
                restores.append(figures_out)
                rescaled.append(subtask)
            checkpoint_id += 1
            p2_handles = []
            for subtask in rescaled:
                handle, figures = bench.snapshot(subtask, checkpoint_id, "first after 1->2", 0)
                checkpoints.append(figures)
                p2_handles.append(handle)
                bench.discard(subtask)

            merged, restored = bench.restore("p1-merged", p2_handles, 2, 1, 0, 3, restore_repeats)
            restores.append(merged)
            bench.discard(restored)
            overlap, restored = bench.restore("p3-1", p2_handles, 2, 3, 1, 3, restore_repeats)
            restores.append(overlap)
            bench.discard(restored)
    finally:
        bench.discard_all()
        storage.delete(key for key, _size in storage.list(PATHS.job_dir(job_id)))
        shutil.rmtree(bench.work_dir, ignore_errors=True)
    return SizeFigures(keys, write(), live_sst, tuple(checkpoints), tuple(restores), total(), load_average)


# The run -------------------------------------------------------------------------------------------


def ensure_s3(endpoints: Endpoints) -> None:
    """Start the local S3 server (``deploy/local/infra.sh up s3``) unless the bucket answers."""
    from weir.connectors import s3

    try:
        s3.client(endpoints).head_bucket(Bucket=endpoints.s3_bucket)
        return
    except Exception:
        pass
    log("starting the S3 server (deploy/local/infra.sh up s3)")
    started = subprocess.run([str(REPO_ROOT / "deploy" / "local" / "infra.sh"), "up", "s3"], check=False)
    if started.returncode != 0:
        raise BenchError("could not start the S3 server: see the line above")


def host() -> dict[str, Any]:
    cpu_model = None
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return {
        "cpus": os.cpu_count(),
        "cpu_model": cpu_model,
        "memory_bytes": memory,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "rocksdict": metadata.version("rocksdict"),
    }


def git_commit() -> dict[str, Any]:
    def git(*args: str) -> str | None:
        done = subprocess.run(["git", "-C", str(REPO_ROOT), *args], capture_output=True, text=True, check=False)
        return done.stdout.strip() if done.returncode == 0 else None

    status = git("status", "--porcelain", "--untracked-files=no")
    return {
        "commit": git("rev-parse", "HEAD"),
        "branch": git("rev-parse", "--abbrev-ref", "HEAD"),
        "dirty": bool(status),
    }


def figures_document(figures: SizeFigures) -> dict[str, Any]:
    """The figures as JSON, with each step's duration beside its usage."""
    document = asdict(figures)
    for entry in (*document["checkpoints"], *document["restores"]):
        entry["duration_s"] = entry["usage"]["wall_s"]
    return document


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.state_bench", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="100k and 1M keys, the 1 %% update only")
    parser.add_argument("--sizes", help="comma-separated key counts (default 100000,1000000,5000000)")
    parser.add_argument(
        "--repeats", type=int, default=RESTORE_REPEATS, help="restores of each kind, median reported (default 3)"
    )
    parser.add_argument(
        "--storage", help="checkpoint storage root (default: the S3 bucket); the run writes under its own prefix"
    )
    parser.add_argument("--results", type=Path, default=RESULTS_DIR, help="where state.{json,md,png} go")
    args = parser.parse_args(argv)
    try:
        sizes = [int(s.replace("_", "")) for s in args.sizes.split(",") if s] if args.sizes else None
    except ValueError:
        parser.error(f"--sizes takes comma-separated key counts, got {args.sizes!r}")
    sizes = sizes or list(QUICK_SIZES if args.quick else FULL_SIZES)
    if any(n < MAX_PARALLELISM for n in sizes):
        parser.error(f"each size must be at least {MAX_PARALLELISM} keys")
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    updates = QUICK_UPDATES if args.quick else UPDATES
    logs.configure("state-bench", level=os.environ.get("WEIR_LOG_LEVEL", "warning"))

    run_id = new_run_id()
    endpoints = Endpoints.from_env()
    if args.storage is None:
        ensure_s3(endpoints)
        base = f"s3://{endpoints.s3_bucket}"
        s3_cpu = _S3ServerCpu.local()
    else:
        base = args.storage
        s3_cpu = _S3ServerCpu(None)
    uri = f"{base.rstrip('/')}/bench-state-{run_id}"
    storage = open_storage(uri, endpoints)
    work_dir = run_dir() / f"bench-state-{run_id}"
    log(f"run {run_id}: {', '.join(f'{n:,}' for n in sizes)} keys; checkpoints {storage.uri}, databases {work_dir}")
    document: dict[str, Any] = {
        "benchmark": "state",
        "run_id": run_id,
        "quick": args.quick,
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "git": git_commit(),
        "host": host(),
        "load_average_at_start": os.getloadavg(),
        "storage": storage.uri,
        "layout": {
            "namespace": NAMESPACE,
            "key_bytes": KEY_BYTES,
            "value_bytes": VALUE_BYTES,
            "max_parallelism": MAX_PARALLELISM,
            "updates": list(updates),
            "restore_repeats": args.repeats,
        },
        "sizes": [],
        "errors": {},
    }
    try:
        for keys in sizes:
            try:
                figures = measure_size(
                    keys, storage, work_dir, updates=updates, s3_cpu=s3_cpu, restore_repeats=args.repeats
                )
            except BenchError as exc:
                log(f"{keys:,} keys failed: {exc}")
                document["errors"][str(keys)] = str(exc)
                continue
            log(f"{keys:,} keys done in {figures.total.wall_s:.1f} s")
            document["sizes"].append(figures_document(figures))
    finally:
        with contextlib.suppress(Exception):
            storage.delete(key for key, _size in storage.list(""))
        if isinstance(storage, FileCheckpointStorage):
            shutil.rmtree(storage.root, ignore_errors=True)  # the folders the files were in
        shutil.rmtree(work_dir, ignore_errors=True)
    document["load_average_at_end"] = os.getloadavg()
    state_report.write(document, args.results)
    log(f"wrote {args.results / 'state.md'}, state.json, state.png")
    print((args.results / "state.md").read_text())
    return 1 if document["errors"] else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BenchError as exc:
        print(f"bench: error: {exc}", file=sys.stderr)
        sys.exit(1)
