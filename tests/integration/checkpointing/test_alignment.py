"""A two-input operator aligns barriers; its checkpoints complete and report the alignment time."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration import polling
from tests.integration.conftest import WeirCluster

pytestmark = pytest.mark.integration


def test_two_input_job_completes_aligned_checkpoints(weir_cluster: WeirCluster, tmp_path: Path) -> None:
    job_id = weir_cluster.submit(
        "examples/two_inputs.py",
        {
            "checkpointing.interval": "500ms",
            "orders.rate": "3000",
            "payments.rate": "30",
            "output": str(tmp_path / "out"),
        },
        parallelism=2,
    )
    completed = polling.settle(
        120,
        lambda: [c for c in weir_cluster.client.list_checkpoints(job_id) if c.status == "COMPLETED"],
        lambda done: len(done) >= 4,
    )
    weir_cluster.client.cancel_job(job_id)
    assert len(completed) >= 4, "aligned checkpoints did not complete"

    match_stats = [t for c in completed for t in c.tasks if t.vertex_uid == "match"]
    assert match_stats, "the two-input task reported no checkpoint statistics"
    assert all(t.alignment_duration_s >= 0 for t in match_stats)
    # Barriers of the slow input arrive later than those of the fast one: the operator waited.
    assert max(t.alignment_duration_s for t in match_stats) > 0
    status = weir_cluster.wait_for(job_id, ("CANCELED",), timeout_s=60)
    assert status.summary.status == "CANCELED"
