"""Accepting a job: load its file, fix the start offsets of its Kafka sources (unless they start at
the beginning) and the end offsets of its bounded ones, check it
(``weir.jobmanager.submit_checks``), take over the state of another job's retained checkpoint when it
starts from one (``weir.jobmanager.restoring``), place its first attempt and deploy it.

Everything before the placement runs without the JobManager's lock (loading a job and asking Kafka
take time); a refused job raises the WeirError the servicer maps onto a status code.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass, field

import structlog

from weir.api.artifacts import check_size
from weir.api.job_code import JobCode, PreparedArtifact, SourceCode, check_distributions, load_job, prepare_artifact
from weir.api.load_check import check_job_loads
from weir.connectors import kafka
from weir.connectors.object_storage import CheckpointStorage, open_storage
from weir.core.config import Endpoints, PythonJobSettings
from weir.core.descriptors import KafkaSourceSpec, OffsetReset, end_offsets_parameter, start_offsets_parameter
from weir.core.errors import JobDefinitionError
from weir.core.ids import JobId
from weir.core.kafka_config import KafkaClientConfig, kafka_client_config
from weir.core.paths import CheckpointPaths
from weir.graph import LogicalGraph
from weir.jobmanager.checkpointing.config import CheckpointSettings
from weir.jobmanager.deployment import Deployer
from weir.jobmanager.ending import resolve_inherited_transactions
from weir.jobmanager.errors import JobNotCreatedError
from weir.jobmanager.jobs import JobMaster, JobSubmission, new_job_id
from weir.jobmanager.record_store import JobRecordStore
from weir.jobmanager.registry import HEARTBEAT_TIMEOUT_S
from weir.jobmanager.restoring import (
    TAKEOVER_ATTEMPT,
    CheckpointNotFoundError,
    InitialState,
    SourceJobRunningError,
    plan_initial_state,
    read_retained_state,
)
from weir.jobmanager.submit_checks import check_job_at_submit
from weir.operators.sources import decide_start_offsets, encode_start_offsets

log = structlog.get_logger("weir.jobmanager")

EndOffsetsReader = Callable[[KafkaClientConfig, str], Mapping[int, int]]
"""The end offset (high watermark) of every partition of a Kafka topic now, read as the source reads."""

StartOffsetsReader = Callable[[KafkaClientConfig, KafkaSourceSpec, str], Mapping[int, int | None]]
"""Where each partition of a Kafka source's topic starts now (None: at its beginning), by its
``starting_offsets``, given the consumer group its positions are committed to, read as the source reads."""

SubmitCheck = Callable[[LogicalGraph, CheckpointSettings, float, Mapping[str, str]], None]
"""Refuse a job that cannot run, given its parameters (raises JobDefinitionError or ServiceUnavailableError)."""

ResolveInherited = Callable[[LogicalGraph, InitialState, JobSubmission, int], None]
"""Resolve the old job's sink transactions as of the checkpoint a new job starts from, as an attempt."""


def resolve_inherited(graph: LogicalGraph, initial: InitialState, submission: JobSubmission, attempt: int) -> None:
    storage = open_storage(initial.storage_uri)
    report = resolve_inherited_transactions(
        graph,
        initial.documents,
        initial.checkpoint,
        submission.job_name,
        submission.parameters,
        attempt,
        storage.get_bytes,
    )
    log.info(
        "inherited_transactions_resolved",
        job_id=submission.job_id,
        from_job_id=initial.checkpoint.job_id,
        checkpoint_id=initial.checkpoint.checkpoint_id,
        attempt=attempt,
        sink_subtasks=report.sink_subtasks,
    )


@dataclass(frozen=True)
class SubmitRequest:
    job_name: str  # empty: the job's own name
    job_file_name: str
    job_source: bytes
    parameters: Mapping[str, str] = field(default_factory=dict)
    parallelism: int = 0  # 0: the job's own default (1)
    from_checkpoint: str = ""  # the external path of another job's retained checkpoint to start from
    allow_non_restored_state: bool = False
    job_artifact: bytes = b""  # weir run --py-files ...: the job's artifact (weir.api.artifacts); job_source empty


def kafka_end_offsets(cluster: KafkaClientConfig, topic: str) -> Mapping[int, int]:
    return kafka.end_offsets(cluster, topic)


def kafka_start_offsets(cluster: KafkaClientConfig, spec: KafkaSourceSpec, group_id: str) -> Mapping[int, int | None]:
    partitions = kafka.partition_count(cluster, spec.topic)  # a refused login: one line naming the broker's error
    reader = kafka.PartitionReader(cluster, spec.topic, group_id=group_id)
    try:
        return decide_start_offsets(spec.starting_offsets, range(partitions), reader)
    finally:
        reader.close()


def fixed_source_starts(
    graph: LogicalGraph, job_name: str, cluster: KafkaClientConfig, read_start_offsets: StartOffsetsReader
) -> dict[str, str]:
    """Kafka sources that do not start at the beginning start where ``starting_offsets`` says at
    submit, in every attempt: a failover before the first checkpoint does not move a LATEST start past
    records written since the job started. One internal job parameter per source, partition to
    offset (null: the beginning); a partition it does not name was created later and is read from
    its beginning (``weir.operators.sources``). ``cluster``: the job's Kafka configuration, each
    source's own ``properties`` over it."""
    fixed: dict[str, str] = {}
    for t in graph.transformations.values():
        spec = t.source_spec
        if isinstance(spec, KafkaSourceSpec) and spec.starting_offsets is not OffsetReset.EARLIEST:
            try:
                starts = read_start_offsets(cluster.merged(spec.properties), spec, spec.group_id_for(job_name, t.uid))
            except JobDefinitionError as exc:  # the cluster refuses the source's settings
                raise JobDefinitionError(f"kafka source {t.uid!r}: {exc}") from None
            fixed[start_offsets_parameter(t.uid)] = encode_start_offsets(starts)
    return fixed


def check_at_submit(
    graph: LogicalGraph, settings: CheckpointSettings, restart_allowance_s: float, parameters: Mapping[str, str]
) -> None:
    check_job_at_submit(graph, settings, restart_allowance_s, Endpoints.from_env(), parameters)


def fixed_source_ends(
    graph: LogicalGraph, cluster: KafkaClientConfig, read_end_offsets: EndOffsetsReader
) -> dict[str, str]:
    """Bounded Kafka sources end at the offsets present at submit, in every attempt (as Flink's
    enumerator fixes stopping offsets): they travel as internal job parameters, one JSON object of
    partition to offset per source (read by ``weir.operators.sources``)."""
    fixed: dict[str, str] = {}
    for t in graph.transformations.values():
        spec = t.source_spec
        if isinstance(spec, KafkaSourceSpec) and spec.bounded:
            try:
                ends = read_end_offsets(cluster.merged(spec.properties), spec.topic)
            except JobDefinitionError as exc:  # the cluster refuses the source's settings
                raise JobDefinitionError(f"kafka source {t.uid!r}: {exc}") from None
            fixed[end_offsets_parameter(t.uid)] = json.dumps(dict(ends))
    return fixed


class JobSubmitter:
    def __init__(
        self,
        jobs: MutableMapping[str, JobMaster],
        deployer: Deployer,
        paths: CheckpointPaths,
        lock: threading.RLock,
        clock: Callable[[], float],
        *,
        storage: CheckpointStorage | None = None,
        read_end_offsets: EndOffsetsReader = kafka_end_offsets,
        read_start_offsets: StartOffsetsReader = kafka_start_offsets,
        check: SubmitCheck = check_at_submit,
        resolve_inherited: ResolveInherited = resolve_inherited,
        records: JobRecordStore | None = None,
    ) -> None:
        """``storage``: the checkpoint storage ``--from-checkpoint`` paths lie in (None: such a
        submission is refused). ``records``: under high availability, the store whose job index says
        whether a new job is created: the submission is answered once it is (or refused)."""
        self._storage = storage
        self._records = records
        self._resolve_inherited = resolve_inherited
        self._jobs = jobs
        self._deployer = deployer
        self._paths = paths
        self._lock = lock
        self._clock = clock
        self._read_end_offsets = read_end_offsets
        self._read_start_offsets = read_start_offsets
        self._check = check

    def submit(self, request: SubmitRequest) -> str:
        """Accept the job and start deploying it; answers its id."""
        # Its Kafka settings first (a literal secret is refused before it reaches a record or a log).
        cluster = kafka_client_config(Endpoints.from_env(), request.parameters)
        parallelism = request.parallelism or 1
        code = self._job_code(request)
        # User code runs first in a child process with a deadline: a build(env) that hangs, calls
        # sys.exit() or raises a BaseException is refused in one line and this process is untouched.
        check_job_loads(
            code,
            request.parameters,
            parallelism,
            request.job_name or None,
            PythonJobSettings.from_env().job_load_timeout,
        )
        loaded = load_job(code, dict(request.parameters), parallelism, request.job_name or None)
        restored_from = request.from_checkpoint
        job_name = request.job_name or loaded.graph.job_name
        fixed = {
            **fixed_source_starts(loaded.graph, job_name, cluster, self._read_start_offsets),
            **fixed_source_ends(loaded.graph, cluster, self._read_end_offsets),
        }
        submission = JobSubmission(
            job_id=new_job_id(),
            job_name=job_name,
            job_file_name=request.job_file_name,
            job_source=request.job_source,
            parameters={**request.parameters, **fixed},
            parallelism=parallelism,
            submitted_at=self._clock(),
            restored_from=restored_from,
            artifact_id=code.artifact_id if isinstance(code, PreparedArtifact) else "",
        )
        master = JobMaster.create(submission, loaded, self._paths.metadata_key_fn())
        # A savepoint or checkpoint that is not there, or whose state the job cannot take: refused first.
        initial = self._initial_state(master, request) if restored_from else None
        # Sinks that cannot commit (a Kafka transaction must outlive a checkpoint interval plus a
        # restart, or the broker aborts it), missing topics and tables: refused before any task starts.
        self._check(
            loaded.graph,
            master.checkpoint_settings,
            HEARTBEAT_TIMEOUT_S + master.restart_strategy.max_delay_s(),
            submission.parameters,
        )
        if initial is not None:
            self._take_over(master, initial, request.from_checkpoint)
            master.initial_state = initial
        if request.job_artifact:  # beside the record, before it: whoever reads the record finds it
            if self._storage is None:
                raise JobDefinitionError("this JobManager has no checkpoint storage to keep the job's artifact in")
            self._storage.put_bytes(self._paths.job_artifact(JobId(submission.job_id)), request.job_artifact)
        with self._lock:
            command, saved = self._deployer.schedule(master, self._clock())
            self._jobs[submission.job_id] = master
        log.info(
            "job_submitted",
            job_id=submission.job_id,
            job_name=submission.job_name,
            parallelism=parallelism,
            vertices=list(master.plan.vertices),
            restored_from=restored_from or None,
        )
        self._deployer.start(master, command, saved)
        if self._records is not None and not saved.result() and self._records.withdrawn(submission.job_id):
            with self._lock:
                self._jobs.pop(submission.job_id, None)
            raise JobNotCreatedError(
                f"job {submission.job_id} ({submission.job_name}) was not created: this JobManager stopped "
                "leading before the job index named it, and nothing of it stays; submit it again (the "
                "client moves on to the new leader)"
            )
        return submission.job_id

    def _job_code(self, request: SubmitRequest) -> JobCode:
        """The job's code: its one file, or its artifact unpacked and its requirements installed here
        (refused if a package version conflicts with one this JobManager holds)."""
        if not request.job_artifact:
            return SourceCode(request.job_file_name, request.job_source)
        settings = PythonJobSettings.from_env()
        check_size(len(request.job_artifact), settings.job_artifact_max_bytes, request.job_file_name)
        prepared = prepare_artifact(request.job_artifact, timeout_s=settings.job_load_timeout)
        check_distributions(prepared)
        return prepared

    def _initial_state(self, master: JobMaster, request: SubmitRequest) -> InitialState:
        """Read the retained checkpoint or savepoint and assign its state to the new job."""
        if self._storage is None:
            raise CheckpointNotFoundError("this JobManager has no checkpoint storage to restore from")
        retained = read_retained_state(request.from_checkpoint, self._storage)
        return plan_initial_state(
            retained, master.loaded.graph, master.plan, allow_non_restored_state=request.allow_non_restored_state
        )

    def _take_over(self, master: JobMaster, initial: InitialState, path: str) -> None:
        """Resolve the old job's sink transactions as of the checkpoint (``weir.jobmanager.restoring``),
        unless that job still runs here."""
        checkpoint = initial.checkpoint
        with self._lock:
            old = self._jobs.get(checkpoint.job_id)
            if old is not None and not old.status.terminal:
                raise SourceJobRunningError(
                    f"{path!r}: job {checkpoint.job_id} that took it is "
                    f"{old.status.value}: cancel it first (`weir cancel {checkpoint.job_id}`; its retained "
                    "checkpoints stay), or two jobs would write the same output"
                )
            attempt = old.attempt + 1 if old is not None else TAKEOVER_ATTEMPT
        self._resolve_inherited(master.loaded.graph, initial, master.submission, attempt)
