"""Credit-based backpressure: a slow sink slows the source down and keeps memory bounded."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.integration import polling
from tests.integration.conftest import WeirCluster
from weir.taskmanager.network.gate import INITIAL_CREDITS
from weir.taskmanager.network.writer import RECORDS_PER_BUFFER
from weir.tools.supervisor import local_status

pytestmark = pytest.mark.integration


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


def test_slow_sink_backpressures_source_and_memory_stays_bounded(weir_cluster: WeirCluster) -> None:
    parallelism = 3
    job_id = weir_cluster.submit("examples/slow_sink.py", {"sink.delay_ms": "1"}, parallelism=parallelism)
    status = local_status(weir_cluster.directory)
    assert status is not None
    pids = {p.name: p.pid for p in status.processes if p.pid is not None}

    # Let the pipeline fill its buffers, then watch it for a while.
    def sink_receiving() -> bool:
        s = weir_cluster.client.job_status(job_id)
        return s.summary.status == "RUNNING" and sum(t.records_in for t in s.tasks if t.vertex_uid == "slow-sink") > 0

    polling.until("the slow sink to receive records", 60, sink_receiving)
    warm = time.monotonic() + 3
    while time.monotonic() < warm:
        time.sleep(0.2)
    baseline = {name: rss_bytes(pid) for name, pid in pids.items()}
    samples: list[tuple[int, int]] = []
    peak = dict(baseline)
    watch_until = time.monotonic() + 12
    while time.monotonic() < watch_until:
        s = weir_cluster.client.job_status(job_id)
        produced = sum(t.records_out for t in s.tasks if t.vertex_uid == "fast-source")
        consumed = sum(t.records_in for t in s.tasks if t.vertex_uid == "slow-sink")
        samples.append((produced, consumed))
        for name, pid in pids.items():
            peak[name] = max(peak[name], rss_bytes(pid))
        time.sleep(0.5)
    weir_cluster.client.cancel_job(job_id)
    weir_cluster.wait_for(job_id, ("CANCELED",), timeout_s=60)

    channels = parallelism * parallelism
    # In flight: what the channels may hold (credits) and what each writer and reader may have in hand,
    # plus one heartbeat's worth of staleness in the reported counters.
    bound = channels * (INITIAL_CREDITS + 2) * RECORDS_PER_BUFFER + 3 * parallelism * 1000
    in_flight = [p - c for p, c in samples]
    assert max(in_flight) <= bound, (max(in_flight), bound)
    produced_rate = (samples[-1][0] - samples[0][0]) / 12
    consumed_rate = (samples[-1][1] - samples[0][1]) / 12
    # The unthrottled generator makes hundreds of thousands of records per second on its own; here the
    # source runs at the sink's pace.
    assert produced_rate <= consumed_rate * 1.5 + 2000, (produced_rate, consumed_rate)
    for name in pids:
        grown = peak[name] - baseline[name]
        assert grown < 64 * 1024 * 1024, f"{name} grew by {grown / 1e6:.1f} MB while backpressured"
