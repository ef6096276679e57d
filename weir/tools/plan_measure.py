"""Measuring ``weir plan``'s inputs: from a running job (``--job``) and from a savepoint (``--savepoint``).

A running job: the rates from Prometheus (``weir_records_out_total`` of the source vertices,
``weir_records_in_total`` of the sink vertices, as ``rate()`` over a window), which vertices are
sources and sinks from the JobManager's REST plan, the checkpoint interval from
``weir_checkpoint_interval_seconds``, the checkpoint duration from the latest completed checkpoints
(``JobManagerClient.list_checkpoints``), the restart delay from the job's restart strategy (its
``restart.*`` parameters, read from the job record in checkpoint storage). Failure detection is not
measurable from a healthy job: its default is the JobManager's heartbeat timeout, the time a lost
TaskManager goes unnoticed (a failing task reports at once). A job that keeps up takes in what it is
offered: its measured sink rate is then the input rate, not its capacity, and the plan says so (from
the sources' ``weir_backpressured_seconds_total``: at capacity they wait for credit).

A savepoint or retained checkpoint: one keyed operator's entries, read with
``weir.tools.savepoint_inspect``. An entry's state key is the record key, or, for the states whose
layout ``weir.core.state_layout`` knows (the window operator's ``win``, the timers, the joins'
buffers), the length-prefixed record key followed by more (the window's bounds, the timer's time, a
map entry's key): those count once per record key. Active keys = distinct record
keys; aggregates per key = entries / active keys; bytes per aggregate = the mean serialized entry
(RocksDB key + value bytes, before RocksDB's compression and overheads).
"""

from __future__ import annotations

import ssl
import statistics
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import httpx

from weir.connectors.object_storage import open_storage
from weir.core.checkpointing import CheckpointKind, CheckpointStatus
from weir.core.config import Endpoints, checkpoint_dir
from weir.core.errors import Fault, WeirError
from weir.core.ids import JobId
from weir.core.key_samples import KEY_SAMPLE_STATE
from weir.core.paths import CheckpointPaths
from weir.core.state_layout import entry_key, operator_prefix, record_key_of
from weir.core.transport_security import TransportSecurity
from weir.jobmanager.records import JobRecord
from weir.jobmanager.registry import HEARTBEAT_TIMEOUT_S
from weir.jobmanager.restart import (
    ExponentialDelayRestartStrategy,
    FailureRateRestartStrategy,
    FixedDelayRestartStrategy,
    NoRestartStrategy,
    RestartStrategy,
    parse_restart_strategy,
)
from weir.tools.client import CheckpointInfo, JobManagerClient
from weir.tools.plan import (
    FLAGS,
    Figure,
    Origin,
    Plan,
    ResolvedInputs,
    compute_plan,
    label_matcher,
    resolve_inputs,
    vector_sum,
)
from weir.tools.savepoint_inspect import (
    UnknownOperatorError,
    load_savepoint,
    open_keyed_snapshot,
    scan_entries,
)

DEFAULT_WINDOW_S: Final = 30.0
RECENT_CHECKPOINTS: Final = 10
HTTP_TIMEOUT_S: Final = 10.0


class MeasurementError(WeirError):
    """A service needed for a measurement did not answer (Prometheus, the REST API, storage)."""

    fault: Fault = Fault.EXTERNAL


# A running job ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class JobTopology:
    sources: tuple[str, ...]  # vertex uids (= the head operator's uid, the metrics' operator_uid)
    sinks: tuple[str, ...]


def topology_from_plan(document: Mapping[str, Any]) -> JobTopology:
    """Sources and sinks of a REST ``/jobs/{id}/plan`` answer: a vertex with no input is a source,
    one that no vertex reads from is a sink."""
    nodes = document["plan"]["nodes"]
    read_from = {i["id"] for n in nodes for i in n["inputs"]}
    # a node's ``id`` is Flink's 32-hex vertex id; Weir's metrics label a vertex by its ``uid``
    return JobTopology(
        sources=tuple(n["uid"] for n in nodes if not n["inputs"]),
        sinks=tuple(n["uid"] for n in nodes if n["id"] not in read_from),
    )


def first_restart_delay_s(strategy: RestartStrategy) -> float | None:
    """The delay before the first restart after a failure; None: the strategy never restarts."""
    match strategy:
        case NoRestartStrategy():
            return None
        case FixedDelayRestartStrategy() | FailureRateRestartStrategy():
            return float(strategy.delay_s)
        case ExponentialDelayRestartStrategy():
            return float(strategy.initial_backoff_s)
    raise TypeError(f"unknown restart strategy {type(strategy).__name__}")


def restart_delay_from_parameters(parameters: Mapping[str, str]) -> Figure | None:
    strategy = parse_restart_strategy(parameters)
    delay = first_restart_delay_s(strategy)
    if delay is None:
        return None
    name = parameters.get("restart.strategy", "exponential-delay")
    return Figure(delay, Origin.MEASURED, f"first restart delay of the job's {name} restart strategy")


def checkpoint_duration(checkpoints: Iterable[CheckpointInfo], recent: int = RECENT_CHECKPOINTS) -> Figure | None:
    """Mean duration of the latest ``recent`` completed periodic checkpoints (savepoints left out)."""
    done = sorted(
        (c for c in checkpoints if c.status is CheckpointStatus.COMPLETED and c.kind is CheckpointKind.CHECKPOINT),
        key=lambda c: c.checkpoint_id,
    )[-recent:]
    if not done:
        return None
    durations = [c.duration_s for c in done]
    return Figure(
        statistics.fmean(durations),
        Origin.MEASURED,
        f"mean of the latest {len(done)} completed checkpoints (max {max(durations):.3f} s)",
    )


class Prometheus:
    def __init__(self, url: str, http: httpx.Client) -> None:
        self.url = url.rstrip("/")
        self._http = http

    def instant(self, expr: str) -> float | None:
        try:
            response = self._http.get(f"{self.url}/api/v1/query", params={"query": expr})
            answer = response.json()
        except (httpx.HTTPError, ValueError) as exc:
            raise MeasurementError(f"Prometheus at {self.url} did not answer {expr!r}: {exc}") from exc
        return vector_sum(answer, expr)


def _rest_client(endpoints: Endpoints, security: TransportSecurity) -> httpx.Client:
    host = endpoints.jobmanager_address.rpartition(":")[0]
    headers = {"Authorization": f"Bearer {security.token}"} if security.token else {}
    tls = security.client_tls
    if tls is None:
        return httpx.Client(base_url=f"http://{host}:{endpoints.jobmanager_rest_port}", headers=headers, timeout=10)
    context = ssl.create_default_context(cadata=tls.root_certificates.decode() if tls.root_certificates else None)
    return httpx.Client(
        base_url=f"https://{host}:{endpoints.jobmanager_rest_port}", headers=headers, verify=context, timeout=10
    )


def job_topology(job_id: str, endpoints: Endpoints, security: TransportSecurity | None = None) -> JobTopology:
    if not endpoints.jobmanager_rest_port:
        raise MeasurementError(
            "the JobManager serves no REST API (WEIR_JOBMANAGER_REST_PORT=0): give the rates as flags"
        )
    with _rest_client(endpoints, security or TransportSecurity.from_env()) as http:
        try:
            response = http.get(f"/jobs/{job_id}/plan")
        except httpx.HTTPError as exc:
            raise MeasurementError(f"the JobManager's REST API did not answer: {exc}") from exc
        if response.status_code != 200:
            raise MeasurementError(f"the JobManager's REST API answered {response.status_code} for job {job_id}'s plan")
        return topology_from_plan(response.json())


def job_parameters(job_id: str, endpoints: Endpoints) -> Mapping[str, str]:
    """The job's ``-D`` parameters, from its record in checkpoint storage."""
    storage = open_storage(checkpoint_dir(), endpoints)
    key = CheckpointPaths().job_record(JobId(job_id))
    return JobRecord.from_json(storage.get_bytes(key), where=f"job record {key}").submission.parameters


@dataclass(frozen=True)
class Measured:
    figures: Mapping[str, Figure]
    hints: Mapping[str, str] = field(default_factory=dict)  # field -> why it was not measured
    source_backpressured_ratio: float | None = None  # share of the sources' time waiting for credit


def rate_queries(job_id: str, topology: JobTopology, window_s: float) -> dict[str, str]:
    """The PromQL of the two rates: records the sources emit and records the sinks take in, per second."""
    w = f"{window_s:g}s"
    queries = {}
    if topology.sources:
        where = label_matcher(job_id=job_id, operator_uid=list(topology.sources))
        queries["input_records_per_s"] = f"sum(rate(weir_records_out_total{where}[{w}]))"
    if topology.sinks:
        where = label_matcher(job_id=job_id, operator_uid=list(topology.sinks))
        queries["sink_records_per_s"] = f"sum(rate(weir_records_in_total{where}[{w}]))"
    return queries


def measure_job(
    job_id: str,
    endpoints: Endpoints,
    client: JobManagerClient,
    *,
    window_s: float = DEFAULT_WINDOW_S,
    http: httpx.Client | None = None,
) -> Measured:
    """Every input a running job tells (see the module docstring); what is not found gets a hint."""
    figures: dict[str, Figure] = {}
    hints: dict[str, str] = {}
    client.job_status(job_id)  # UnknownJobError for a job the JobManager does not know
    topology = job_topology(job_id, endpoints)
    own_http = http is None
    prom_http = http if http is not None else httpx.Client(timeout=HTTP_TIMEOUT_S)
    try:
        prometheus = Prometheus(endpoints.prometheus_url, prom_http)
        for name, expr in rate_queries(job_id, topology, window_s).items():
            value = prometheus.instant(expr)
            if value is None:
                hints[name] = f"Prometheus has no samples yet for {expr}"
            else:
                figures[name] = Figure(value, Origin.MEASURED, expr)
        if not topology.sources:
            hints["input_records_per_s"] = "the job's plan has no source vertex"
        backpressured: float | None = None
        if topology.sources:
            where = label_matcher(job_id=job_id, operator_uid=list(topology.sources))
            backpressured = prometheus.instant(f"avg(rate(weir_backpressured_seconds_total{where}[{window_s:g}s]))")
        interval_expr = f"weir_checkpoint_interval_seconds{label_matcher(job_id=job_id)}"
        interval = prometheus.instant(interval_expr)
        if interval is not None:
            figures["checkpoint_interval_s"] = Figure(interval, Origin.MEASURED, interval_expr)
        else:
            hints["checkpoint_interval_s"] = "the job has no periodic checkpoints (or Prometheus no sample yet)"
    finally:
        if own_http:
            prom_http.close()
    duration = checkpoint_duration(client.list_checkpoints(job_id))
    if duration is not None:
        figures["checkpoint_duration_s"] = duration
    else:
        hints["checkpoint_duration_s"] = "the job completed no checkpoint yet"
    try:
        restart = restart_delay_from_parameters(job_parameters(job_id, endpoints))
    except WeirError as exc:
        hints["restart_delay_s"] = f"the job's parameters could not be read: {exc}"
    else:
        if restart is None:
            hints["restart_delay_s"] = "restart.strategy is none: the job does not restart after a failure"
        else:
            figures["restart_delay_s"] = restart
    return Measured(figures, hints, backpressured)


BACKPRESSURED_AT_CAPACITY: Final = 0.5


def sink_rate_note(backpressured_ratio: float | None) -> str:
    """What a measured sink rate means: the pipeline's capacity only when its sources wait for it."""
    if backpressured_ratio is not None and backpressured_ratio >= BACKPRESSURED_AT_CAPACITY:
        return (
            f"the sources waited for credit {backpressured_ratio:.0%} of the time: the job runs at capacity, "
            "the measured sink rate is its sustainable rate"
        )
    share = "an unknown share" if backpressured_ratio is None else f"{backpressured_ratio:.0%}"
    return (
        f"the sources waited for credit {share} of the time: the job keeps up, so the measured sink rate is "
        "the input rate it was offered, a lower bound of the sustainable rate (the measured backlog growth is "
        "sampling noise around 0); catch-up and recovery figures from it are upper bounds, 'never' included "
        "(give --sink-rate from a run at capacity)"
    )


def default_figures() -> dict[str, Figure]:
    return {
        "failure_detection_s": Figure(
            HEARTBEAT_TIMEOUT_S,
            Origin.DEFAULT,
            "the JobManager's heartbeat timeout: a lost TaskManager (a failing task reports at once)",
        )
    }


# A savepoint -------------------------------------------------------------------------------------


def record_key(state: str, key: bytes) -> bytes:
    """The record key of an entry (``weir.core.state_layout.record_key_of``)."""
    return record_key_of(state, key)


@dataclass(frozen=True)
class KeyedStateMeasure:
    path: str
    operator_uid: str
    active_keys: int
    entries: int
    serialized_bytes: int
    entries_by_state: Mapping[str, int]

    @property
    def aggregates_per_key(self) -> float:
        return self.entries / self.active_keys if self.active_keys else 0.0

    @property
    def bytes_per_aggregate(self) -> float:
        return self.serialized_bytes / self.entries if self.entries else 0.0

    def figures(self) -> dict[str, Figure]:
        where = f"operator {self.operator_uid} in {self.path}"
        states = ", ".join(f"{name}: {n}" for name, n in sorted(self.entries_by_state.items()))
        return {
            "active_keys": Figure(float(self.active_keys), Origin.MEASURED, f"distinct record keys of {where}"),
            "aggregates_per_key": Figure(
                self.aggregates_per_key, Origin.MEASURED, f"{self.entries} entries ({states}) / {self.active_keys} keys"
            ),
            "bytes_per_aggregate": Figure(
                self.bytes_per_aggregate,
                Origin.MEASURED,
                f"{self.serialized_bytes} bytes of RocksDB keys and values / {self.entries} entries",
            ),
        }


def measure_savepoint(
    path: str, operator_uid: str | None = None, endpoints: Endpoints | None = None, work_dir: Path | None = None
) -> KeyedStateMeasure:
    """Scan one keyed operator's entries (``operator_uid``, or the savepoint's only keyed operator)."""
    sp = load_savepoint(path, endpoints)
    keyed_uids = sorted({uid for t in sp.tasks if t.keyed is not None for uid, _ in t.keyed.ranges})
    if operator_uid is None:
        if len(keyed_uids) != 1:
            raise UnknownOperatorError(
                f"{sp.what} has {len(keyed_uids)} keyed operators ({', '.join(keyed_uids) or 'none'}): "
                "choose one with --operator"
            )
        operator_uid = keyed_uids[0]
    elif operator_uid not in keyed_uids:
        raise UnknownOperatorError(
            f"{sp.what} has no keyed state of operator {operator_uid!r}; its keyed operators: "
            f"{', '.join(keyed_uids) or 'none'}"
        )
    keys: set[bytes] = set()
    entries = 0
    serialized = 0
    by_state: dict[str, int] = {}
    operator = operator_prefix(operator_uid)
    with tempfile.TemporaryDirectory(prefix="weir-plan-", dir=work_dir) as scratch:
        directory = Path(scratch)
        for task in sp.tasks:
            if task.keyed is None:
                continue
            ranges = [r for uid, r in task.keyed.ranges if uid == operator_uid]
            if not ranges:
                continue
            with open_keyed_snapshot(sp.storage, task.keyed, directory, f"{sp.what}: task {task.name}") as db:
                for key_groups in ranges:
                    for entry in scan_entries(db, operator_uid, key_groups, values=True):
                        if entry.state == KEY_SAMPLE_STATE:
                            continue  # bounded (weir.core.key_samples), not per key: not what the plan scales
                        keys.add(record_key(entry.state, entry.key))
                        entries += 1
                        stored_key = entry_key(operator, entry.key_group, entry.state, entry.key)
                        serialized += len(stored_key) + len(entry.value)
                        by_state[entry.state] = by_state.get(entry.state, 0) + 1
    return KeyedStateMeasure(path, operator_uid, len(keys), entries, serialized, by_state)


# Everything together ------------------------------------------------------------------------------


@dataclass(frozen=True)
class PlanRun:
    resolved: ResolvedInputs
    plan: Plan
    notes: tuple[str, ...]  # what a measurement means, and why one is missing where a flag or default stood in


def make_plan(
    flags: Mapping[str, float | None],
    *,
    job_id: str | None = None,
    savepoint_path: str | None = None,
    operator_uid: str | None = None,
    window_s: float = DEFAULT_WINDOW_S,
    endpoints: Endpoints | None = None,
) -> PlanRun:
    """Measure what ``job_id`` and ``savepoint_path`` tell, let the flags override it, compute the plan."""
    measured: dict[str, Figure] = {}
    hints: dict[str, str] = {}
    notes: list[str] = []
    if job_id is not None or savepoint_path is not None:
        endpoints = endpoints or Endpoints.from_env()
    if job_id is not None:
        assert endpoints is not None
        with JobManagerClient(endpoints.jobmanager_address) as client:
            job = measure_job(job_id, endpoints, client, window_s=window_s)
        measured.update(job.figures)
        hints.update(job.hints)
        if "sink_records_per_s" in job.figures and flags.get("sink_records_per_s") is None:
            notes.append("--sink-rate: " + sink_rate_note(job.source_backpressured_ratio))
    if savepoint_path is not None:
        measured.update(measure_savepoint(savepoint_path, operator_uid, endpoints).figures())
    resolved = resolve_inputs(flags, measured, default_figures(), hints=hints)
    notes += [f"{FLAGS[name]}: {hint}" for name, hint in hints.items() if resolved.figures.get(name) is not None]
    return PlanRun(resolved, compute_plan(resolved.inputs), tuple(notes))
