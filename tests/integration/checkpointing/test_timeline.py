"""The checkpoint timeline against a real cluster: a two-input job at parallelism 2 whose keyed
operator has four input channels; each of its subtasks reports one barrier time per channel, in
order with the trigger, the alignment's end, the snapshot's parts and the ack (``weir checkpoints
JOB --detail CID`` and the GetCheckpointDetail call)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration import polling
from tests.integration.conftest import WeirCluster
from weir.core.checkpointing import CheckpointStatus
from weir.core.errors import UnknownCheckpointError
from weir.tools.cli import EXIT_OK, EXIT_USAGE, run_cli
from weir.tools.client import CheckpointInfo

pytestmark = pytest.mark.integration


def completed_checkpoint(cluster: WeirCluster, job_id: str, timeout_s: float = 120.0) -> CheckpointInfo:
    completed = polling.until(
        f"a completed checkpoint of job {job_id}",
        timeout_s,
        lambda: [c for c in cluster.client.list_checkpoints(job_id) if c.status is CheckpointStatus.COMPLETED],
    )
    return max(completed, key=lambda c: c.checkpoint_id)


def test_each_subtask_reports_its_barriers_per_channel_in_order(
    weir_cluster: WeirCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job_id = weir_cluster.submit(
        "examples/two_inputs.py",
        {"checkpointing.interval": "500ms", "orders.rate": "3000", "payments.rate": "30", "output": str(tmp_path)},
        parallelism=2,
    )
    try:
        checkpoint = completed_checkpoint(weir_cluster, job_id)
        detail = weir_cluster.client.checkpoint_detail(job_id, checkpoint.checkpoint_id)

        code = run_cli(["checkpoints", job_id, "--detail", str(checkpoint.checkpoint_id)])
        printed = capsys.readouterr()
        unknown = run_cli(["checkpoints", job_id, "--detail", str(checkpoint.checkpoint_id + 10_000)])
        unknown_err = capsys.readouterr().err
    finally:
        weir_cluster.client.cancel_job(job_id)

    info = detail.checkpoint
    assert info.checkpoint_id == checkpoint.checkpoint_id and info.status is CheckpointStatus.COMPLETED
    assert detail.pending == ()
    by_vertex: dict[str, list[int]] = {}
    for task in info.tasks:
        by_vertex.setdefault(task.vertex_uid, []).append(task.subtask)
    assert {v: sorted(s) for v, s in by_vertex.items()} == {"orders": [0, 1], "payments": [0, 1], "match": [0, 1]}

    trigger = info.trigger_time
    for task in info.tasks:
        timeline = task.timeline
        assert timeline is not None and task.acked_at is not None, task.name
        if task.vertex_uid == "match":
            upstream = sorted((c.upstream_vertex, c.upstream_subtask) for c in timeline.channels)
            assert upstream == [("orders", 0), ("orders", 1), ("payments", 0), ("payments", 1)], task.name
            assert sorted(c.channel for c in timeline.channels) == [0, 1, 2, 3]
            barriers = [c.barrier_at for c in timeline.channels]
            assert all(b is not None for b in barriers), (task.name, timeline)
            arrived = [b for b in barriers if b is not None]
            assert timeline.first_barrier_at == min(arrived), (task.name, timeline)
            assert all(trigger <= timeline.first_barrier_at <= b <= timeline.alignment_end_at for b in arrived)
        else:
            assert timeline.channels == (), task.name  # a source
        assert trigger <= timeline.first_barrier_at <= timeline.alignment_end_at, (task.name, trigger, timeline)
        assert timeline.alignment_end_at <= timeline.sync_end_at <= timeline.async_end_at <= task.acked_at, (
            task.name,
            timeline,
            task.acked_at,
        )

    assert code == EXIT_OK, printed.err
    lines = printed.out.splitlines()
    assert lines[0].startswith(f"checkpoint {info.checkpoint_id} of job {job_id}: COMPLETED, aligned")
    for subtask in (0, 1):
        (row,) = [line for line in lines if line.startswith(f"match#{subtask} ")]
        offsets = [int(cell.replace(",", "")) for cell in row.split()[1:6]]
        assert offsets == sorted(offsets), row  # first barrier, alignment end, sync end, async end, ack
    assert sum(1 for line in lines if line.strip().startswith("ch ")) == 8  # 4 channels at each match subtask

    assert unknown == EXIT_USAGE
    assert f"has no checkpoint {info.checkpoint_id + 10_000}" in unknown_err
    with pytest.raises(UnknownCheckpointError):
        weir_cluster.client.checkpoint_detail(job_id, info.checkpoint_id + 10_000)
