"""`weir plan --job` and `--savepoint` against a small keyed job on the session cluster.

The job (jobs/keyed_running_count.py) counts generated records per key over ``KEYS`` keys at a
throttled rate, checkpointing every 500 ms with a fixed restart delay. ``--job`` must measure a
positive input rate from Prometheus, the interval, the duration and the restart delay the job was
given, and compute its figures from them; ``--savepoint`` on a savepoint of the same job must count
one active key per key that has state, which, once every key has been seen, is all ``KEYS``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration import polling
from tests.integration.conftest import WeirCluster
from weir.tools.cli import run_cli
from weir.tools.plan import vector_sum

pytestmark = pytest.mark.integration

JOB = "tests/integration/tools/jobs/keyed_running_count.py"
KEYS = 37
RATE = 60  # records/s of the generator, shared by its 3 subtasks
WINDOW_S = 15
SCRAPE_S = 2  # deploy/prometheus/prometheus-local.yml


def plan_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    code = run_cli(["plan", *argv, "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    document: dict[str, Any] = json.loads(captured.out)
    return document


def test_plan_measures_a_running_job_and_its_savepoint(
    weir_cluster: WeirCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job_id = weir_cluster.submit(
        JOB,
        {
            "keys": str(KEYS),
            "rate": str(RATE),
            "output": str(tmp_path / "counts"),
            "checkpointing.interval": "500ms",
            "restart.strategy": "fixed-delay",
            "restart.delay": "1500ms",
        },
    )
    prometheus = weir_cluster.endpoints.prometheus_url
    # samples over the whole rate window of every series, so that the rate is not the start-up's
    expr = f'min(count_over_time(weir_records_out_total{{job_id="{job_id}"}}[{WINDOW_S}s])) >= {WINDOW_S // SCRAPE_S}'

    def window_filled() -> float | None:
        answer = httpx.get(f"{prometheus}/api/v1/query", params={"query": expr}, timeout=10).json()
        return vector_sum(answer, expr)

    polling.poll(f"Prometheus to have {WINDOW_S} s of the job's samples", 60, window_filled, 1.0)
    polling.poll(
        "a completed checkpoint",
        30,
        lambda: weir_cluster.client.job_status(job_id).last_completed_checkpoint,
    )

    measured = plan_json(
        capsys,
        "--job",
        job_id,
        "--window",
        str(WINDOW_S),
        "--active-keys",
        "100",
        "--aggregates-per-key",
        "1",
        "--bytes-per-aggregate",
        "64",
    )
    sources, inputs = measured["sources"], measured["inputs"]
    for name in ("input_records_per_s", "sink_records_per_s", "checkpoint_interval_s", "checkpoint_duration_s"):
        assert sources[name]["origin"] == "measured", (name, sources[name])
    assert sources["restart_delay_s"]["origin"] == "measured"
    assert sources["failure_detection_s"]["origin"] == "default"
    assert sources["active_keys"]["origin"] == "flag"
    lam, mu = inputs["input_records_per_s"], inputs["sink_records_per_s"]
    assert lam > 0
    # the generator is throttled to 60 records/s; a rate over 15 s of 2 s scrapes is coarse
    assert 0.5 * RATE <= lam <= 1.5 * RATE, lam
    assert mu == pytest.approx(lam, rel=0.5)  # one sink record per input record
    assert inputs["checkpoint_interval_s"] == 0.5
    assert 0 < inputs["checkpoint_duration_s"] < 30
    assert inputs["restart_delay_s"] == 1.5
    # consistent output: the figures are the formulas of the measured inputs
    assert measured["backlog_growth_records_per_s"] == pytest.approx(lam - mu)
    assert measured["backlog_growth_records_per_h"] == pytest.approx(3600 * (lam - mu))
    progress = max(0.5, inputs["checkpoint_duration_s"])
    assert measured["worst_case"]["replay_records"] == pytest.approx(lam * (progress + inputs["checkpoint_duration_s"]))
    assert measured["state_size_bytes"] == 100 * 1 * 64
    # the job keeps up (throttled input): its sink rate is what it was offered, and the plan says so
    assert any(n.startswith("--sink-rate:") and "lower bound" in n for n in measured["notes"]), measured["notes"]

    # a flag overrides what was measured
    state_flags = ["--active-keys", "1", "--aggregates-per-key", "1", "--bytes-per-aggregate", "1"]
    overridden = plan_json(capsys, "--job", job_id, "--window", str(WINDOW_S), "--sink-rate", "100000", *state_flags)
    assert overridden["sources"]["sink_records_per_s"]["origin"] == "flag"
    assert overridden["inputs"]["sink_records_per_s"] == 100000
    assert overridden["headroom"] is True
    assert overridden["sources"]["input_records_per_s"]["origin"] == "measured"

    # the human table says where each input came from
    assert run_cli(["plan", "--job", job_id, "--window", str(WINDOW_S), *state_flags]) == 0
    table = capsys.readouterr().out
    with capsys.disabled():
        print(table)  # pytest -s shows it (docs/plan.md's example)
    assert "measured" in table and "default" in table and "records/s" in table and "not an SLA" in table

    # every key has state once each was seen: wait until the sink took in at least 3 records per key
    polling.poll(
        "every key to have been counted",
        30,
        lambda: True if sum(t.records_in for t in weir_cluster.client.job_status(job_id).tasks) >= 3 * KEYS else None,
    )
    savepoint_id = weir_cluster.client.trigger_savepoint(job_id)
    savepoint = weir_cluster.client.wait_for_savepoint(job_id, savepoint_id, timeout_s=60)
    weir_cluster.client.cancel_job(job_id)

    # independently: record i has key "k{i % KEYS}"; once records 0..KEYS-1 of any subtask's stride
    # were read, every residue occurred (KEYS and the parallelism 3 are coprime)
    expected_keys = len({f"k{i % KEYS}" for i in range(3 * KEYS)})
    flags = ["--input-rate", "10", "--sink-rate", "20", "--checkpoint-interval", "1", "--checkpoint-duration", "0.1"]
    flags += ["--restart-delay", "1"]
    from_savepoint = plan_json(capsys, "--savepoint", savepoint.external_path, "--operator", "running-count", *flags)
    sources, inputs = from_savepoint["sources"], from_savepoint["inputs"]
    assert inputs["active_keys"] == expected_keys == KEYS
    assert sources["active_keys"]["origin"] == "measured"
    assert inputs["aggregates_per_key"] == 1.0  # a running count keeps one reduce entry per key
    assert inputs["bytes_per_aggregate"] > len("running-count") + len("reduce")
    assert from_savepoint["state_size_bytes"] == pytest.approx(KEYS * 1.0 * inputs["bytes_per_aggregate"])

    code = run_cli(["plan", "--savepoint", savepoint.external_path, "--operator", "no-such-operator", *flags])
    assert code == 2
    assert "running-count" in capsys.readouterr().err
