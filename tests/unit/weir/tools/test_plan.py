"""weir plan: the formulas against hand-computed cases, the merging of flags and measurements, the
parsing of Prometheus answers and of the REST plan; no network."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from weir.core.checkpointing import CheckpointKind, CheckpointStatus
from weir.core.ids import CheckpointId
from weir.jobmanager.restart import parse_restart_strategy
from weir.tools.cli import run_cli
from weir.tools.client import CheckpointInfo
from weir.tools.plan import (
    Figure,
    InvalidInputError,
    MissingInputError,
    Origin,
    PlanInputs,
    PrometheusQueryError,
    catch_up_s,
    compute_plan,
    label_matcher,
    resolve_inputs,
    vector_sum,
)
from weir.tools.plan_measure import (
    JobTopology,
    KeyedStateMeasure,
    checkpoint_duration,
    first_restart_delay_s,
    rate_queries,
    record_key,
    restart_delay_from_parameters,
    sink_rate_note,
    topology_from_plan,
)


def inputs(**overrides: Any) -> PlanInputs:
    base: dict[str, Any] = {
        "input_records_per_s": 1000.0,
        "sink_records_per_s": 1500.0,
        "checkpoint_interval_s": 10.0,
        "checkpoint_duration_s": 2.0,
        "failure_detection_s": 6.0,
        "restart_delay_s": 5.0,
        "active_keys": 100_000,
        "aggregates_per_key": 3,
        "bytes_per_aggregate": 120,
        "restore_bytes_per_s": 50_000_000.0,
    }
    return PlanInputs(**{**base, **overrides})


# The formulas -------------------------------------------------------------------------------------


def test_headroom_case_by_hand() -> None:
    plan = compute_plan(inputs())
    # g = λ − μ = 1000 − 1500 = −500 records/s: negative, headroom; per hour −500 · 3600 = −1,800,000
    assert plan.backlog_growth_records_per_s == -500.0
    assert plan.backlog_growth_records_per_h == -1_800_000.0
    assert plan.headroom
    # S = K·A·B = 100,000 · 3 · 120 = 36,000,000 bytes; R = S/ρ = 36e6 / 50e6 = 0.72 s
    assert plan.state_size_bytes == 36_000_000
    assert plan.restore_s == pytest.approx(0.72)
    # downtime d + r + R = 6 + 5 + 0.72 = 11.72 s; backlog meanwhile Q = 1000 · 11.72 = 11,720 records
    assert plan.downtime_s == pytest.approx(11.72)
    assert plan.worst_case.downtime_backlog_records == pytest.approx(11_720)
    # P = max(10, 2) = 10 s; worst case t = P + D = 12 s: 12,000 records; average t = P/2 + D = 7 s: 7,000
    assert plan.progress_interval_s == 10.0
    assert plan.worst_case.since_restore_point_s == 12.0
    assert plan.worst_case.replay_records == pytest.approx(12_000)
    assert plan.average_case.since_restore_point_s == 7.0
    assert plan.average_case.replay_records == pytest.approx(7_000)
    # catch-up worst (12,000 + 11,720) / (1500 − 1000) = 23,720 / 500 = 47.44 s; bound 11.72 + 47.44 = 59.16 s
    assert plan.worst_case.catch_up_s == pytest.approx(47.44)
    assert plan.worst_case.recovery_bound_s == pytest.approx(59.16)
    # catch-up average (7,000 + 11,720) / 500 = 37.44 s; bound 11.72 + 37.44 = 49.16 s
    assert plan.average_case.catch_up_s == pytest.approx(37.44)
    assert plan.average_case.recovery_bound_s == pytest.approx(49.16)


def test_the_sink_slower_than_the_input_never_catches_up() -> None:
    plan = compute_plan(inputs(input_records_per_s=2000.0, sink_records_per_s=1500.0))
    # g = 2000 − 1500 = +500 records/s, +1,800,000 records/h: the backlog grows
    assert plan.backlog_growth_records_per_s == 500.0
    assert plan.backlog_growth_records_per_h == 1_800_000.0
    assert not plan.headroom
    # replay is still λ·(P + D) = 2000 · 12 = 24,000 records, but μ − λ < 0: never caught up
    assert plan.worst_case.replay_records == pytest.approx(24_000)
    assert math.isinf(plan.worst_case.catch_up_s) and not plan.worst_case.catches_up
    assert math.isinf(plan.worst_case.recovery_bound_s)
    assert math.isinf(plan.average_case.catch_up_s)
    assert plan.to_json()["worst_case"]["catch_up_s"] == "never"


def test_a_sink_exactly_as_fast_as_the_input_has_no_growth_and_never_catches_up() -> None:
    plan = compute_plan(inputs(input_records_per_s=1500.0))
    # g = 1500 − 1500 = 0: no growth (headroom 0), but nothing is left over to work off a replay
    assert plan.backlog_growth_records_per_s == 0.0
    assert plan.headroom
    assert math.isinf(plan.worst_case.catch_up_s)


def test_checkpoints_longer_than_the_interval_progress_every_duration() -> None:
    plan = compute_plan(inputs(checkpoint_interval_s=1.0, checkpoint_duration_s=3.0))
    # P = max(1, 3) = 3 s; worst t = P + D = 6 s: 6,000 records; average t = 1.5 + 3 = 4.5 s: 4,500
    assert plan.progress_interval_s == 3.0
    assert plan.worst_case.replay_records == pytest.approx(6_000)
    assert plan.average_case.replay_records == pytest.approx(4_500)
    assert any("longer than the interval" in a for a in plan.assumptions)


def test_without_a_restore_rate_the_restore_is_not_counted() -> None:
    plan = compute_plan(inputs(restore_bytes_per_s=None))
    # downtime = d + r = 6 + 5 = 11 s; Q = 11,000; worst catch-up (12,000 + 11,000)/500 = 46 s; bound 57 s
    assert plan.restore_s is None
    assert plan.downtime_s == 11.0
    assert plan.worst_case.catch_up_s == pytest.approx(46.0)
    assert plan.worst_case.recovery_bound_s == pytest.approx(57.0)
    assert any("--restore-rate" in a for a in plan.assumptions)


def test_per_hour_is_per_second_times_3600() -> None:
    plan = compute_plan(inputs(input_records_per_s=0.25, sink_records_per_s=0.0))
    # 0.25 records/s · 3600 s/h = 900 records/h
    assert plan.backlog_growth_records_per_h == pytest.approx(900.0)


def test_state_size_is_the_product_of_keys_aggregates_and_bytes() -> None:
    # 37 keys · 2.5 aggregates/key · 80 bytes = 7,400 bytes (no fixed RocksDB factor)
    plan = compute_plan(inputs(active_keys=37, aggregates_per_key=2.5, bytes_per_aggregate=80))
    assert plan.state_size_bytes == pytest.approx(7_400)
    assert any("not a fixed RocksDB ratio" in a for a in plan.assumptions)


def test_catch_up_with_no_work_is_zero_even_without_spare_rate() -> None:
    assert catch_up_s(0.0, 10.0, 5.0) == 0.0
    assert catch_up_s(100.0, 10.0, 30.0) == 5.0  # 100 / (30 − 10)


@pytest.mark.parametrize(
    "field, value",
    [("input_records_per_s", -1.0), ("checkpoint_interval_s", 0.0), ("bytes_per_aggregate", math.nan)],
)
def test_invalid_inputs_are_refused(field: str, value: float) -> None:
    with pytest.raises(InvalidInputError, match=field):
        inputs(**{field: value})


# Flags, measurements, defaults -------------------------------------------------------------------


def test_a_flag_overrides_a_measurement_and_a_measurement_a_default() -> None:
    measured = {
        "input_records_per_s": Figure(120.0, Origin.MEASURED, "rate(...)"),
        "sink_records_per_s": Figure(118.0, Origin.MEASURED, "rate(...)"),
        "checkpoint_interval_s": Figure(0.5, Origin.MEASURED, "gauge"),
        "checkpoint_duration_s": Figure(0.1, Origin.MEASURED, "checkpoints"),
        "restart_delay_s": Figure(1.0, Origin.MEASURED, "strategy"),
        "failure_detection_s": Figure(2.0, Origin.MEASURED, "measured beats the default"),
    }
    flags: dict[str, float | None] = {
        "sink_records_per_s": 400.0,
        "active_keys": 10,
        "aggregates_per_key": 1,
        "bytes_per_aggregate": 50,
        "input_records_per_s": None,  # not given: the measurement stays
    }
    defaults = {
        "failure_detection_s": Figure(6.0, Origin.DEFAULT, "heartbeat"),
        "restart_delay_s": Figure(9.0, Origin.DEFAULT, "unused"),
    }
    resolved = resolve_inputs(flags, measured, defaults)
    assert resolved.inputs.sink_records_per_s == 400.0
    assert resolved.figures["sink_records_per_s"].origin is Origin.FLAG
    assert resolved.inputs.input_records_per_s == 120.0
    assert resolved.figures["input_records_per_s"].origin is Origin.MEASURED
    assert resolved.inputs.failure_detection_s == 2.0
    assert resolved.inputs.restart_delay_s == 1.0
    assert resolved.inputs.restore_bytes_per_s is None and "restore_bytes_per_s" not in resolved.figures
    # the merged inputs compute: g = 120 − 400 = −280 records/s
    assert compute_plan(resolved.inputs).backlog_growth_records_per_s == -280.0


def test_a_default_fills_in_when_nothing_else_is_there() -> None:
    flags = dict.fromkeys(("input_records_per_s", "sink_records_per_s", "checkpoint_interval_s"), 1.0)
    flags |= dict.fromkeys(("checkpoint_duration_s", "restart_delay_s", "active_keys"), 1.0)
    flags |= dict.fromkeys(("aggregates_per_key", "bytes_per_aggregate"), 1.0)
    resolved = resolve_inputs(flags, {}, {"failure_detection_s": Figure(6.0, Origin.DEFAULT, "heartbeat")})
    assert resolved.figures["failure_detection_s"].origin is Origin.DEFAULT
    assert resolved.inputs.failure_detection_s == 6.0


def test_missing_inputs_name_their_flags_and_why() -> None:
    with pytest.raises(MissingInputError) as raised:
        resolve_inputs({}, {}, hints={"restart_delay_s": "restart.strategy is none"})
    message = str(raised.value)
    for flag in ("--input-rate", "--sink-rate", "--checkpoint-interval", "--checkpoint-duration", "--active-keys"):
        assert flag in message
    assert "--restart-delay (restart_delay_s: restart.strategy is none)" in message
    assert "--restore-rate" not in message  # optional


def test_the_cli_names_the_missing_flag(capsys: pytest.CaptureFixture[str]) -> None:
    code = run_cli(["plan", "--input-rate", "10", "--sink-rate", "20"])
    assert code == 2
    assert "--checkpoint-interval" in capsys.readouterr().err


def test_the_cli_prints_the_hand_computed_figures_with_units(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["plan", "--input-rate", "1000", "--sink-rate", "1500", "--checkpoint-interval", "10"]
    argv += ["--checkpoint-duration", "2", "--failure-detection", "6", "--restart-delay", "5"]
    argv += ["--active-keys", "100000", "--aggregates-per-key", "3", "--bytes-per-aggregate", "120"]
    assert run_cli([*argv, "--restore-rate", "50000000"]) == 0
    out = capsys.readouterr().out
    assert "-500.0 records/s (headroom" in out
    assert "-1,800,000.0 records/h" in out
    assert "36,000,000 bytes" in out
    assert "12,000 records" in out and "59.2 s" in out
    assert "not an SLA" in out
    assert run_cli([*argv, "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["worst_case"]["catch_up_s"] == pytest.approx(46.0)  # no restore rate: (12,000 + 11,000)/500
    assert document["sources"]["failure_detection_s"]["origin"] == "flag"


# Prometheus answers -------------------------------------------------------------------------------


def vector(*values: str) -> dict[str, Any]:
    return {
        "status": "success",
        "data": {"resultType": "vector", "result": [{"metric": {}, "value": [1.7e9, v]} for v in values]},
    }


def test_an_instant_vector_sums_its_samples() -> None:
    assert vector_sum(vector("12.5", "7.5"), "q") == 20.0


def test_no_series_and_only_nan_are_none() -> None:
    assert vector_sum(vector(), "q") is None
    assert vector_sum(vector("NaN"), "q") is None
    assert vector_sum(vector("NaN", "3"), "q") == 3.0


def test_a_refused_query_is_an_error_with_prometheus_reason() -> None:
    answer = {"status": "error", "errorType": "bad_data", "error": "parse error at char 5"}
    with pytest.raises(PrometheusQueryError, match="bad_data: parse error at char 5"):
        vector_sum(answer, "sum(")


def test_a_range_answer_is_refused() -> None:
    with pytest.raises(PrometheusQueryError, match="matrix"):
        vector_sum({"status": "success", "data": {"resultType": "matrix", "result": []}}, "q[1m]")


def test_a_malformed_sample_is_refused() -> None:
    with pytest.raises(PrometheusQueryError, match="malformed"):
        vector_sum({"status": "success", "data": {"resultType": "vector", "result": [{"value": []}]}}, "q")


def test_label_matchers_escape_regex_alternations() -> None:
    # RE2 wants a\.b, and the PromQL string doubles the backslash; "-" needs no escape in RE2
    assert label_matcher(job_id="j1", operator_uid=["a.b", "c-d"]) == r'{job_id="j1",operator_uid=~"a\\.b|c-d"}'


def test_rate_queries_read_the_sources_output_and_the_sinks_input() -> None:
    queries = rate_queries("j1", JobTopology(sources=("src",), sinks=("sink",)), 30)
    assert queries["input_records_per_s"] == 'sum(rate(weir_records_out_total{job_id="j1",operator_uid=~"src"}[30s]))'
    assert queries["sink_records_per_s"] == 'sum(rate(weir_records_in_total{job_id="j1",operator_uid=~"sink"}[30s]))'


# The job: plan, checkpoints, restart strategy -----------------------------------------------------


def test_sources_and_sinks_from_the_rest_plan() -> None:
    document = {
        "plan": {
            "nodes": [
                # ids in Flink's form (32 hex), the uid beside: the metrics are labelled by uid
                {"id": "a" * 32, "uid": "src", "inputs": []},
                {"id": "b" * 32, "uid": "win", "inputs": [{"num": 0, "id": "a" * 32}]},
                {"id": "c" * 32, "uid": "kafka-sink", "inputs": [{"num": 0, "id": "b" * 32}]},
                {"id": "d" * 32, "uid": "pg-sink", "inputs": [{"num": 0, "id": "b" * 32}]},
            ]
        }
    }
    assert topology_from_plan(document) == JobTopology(sources=("src",), sinks=("kafka-sink", "pg-sink"))


def checkpoint(
    cid: int, duration_s: float, kind: CheckpointKind = CheckpointKind.CHECKPOINT, status: str = "COMPLETED"
) -> CheckpointInfo:
    return CheckpointInfo(CheckpointId(cid), CheckpointStatus(status), kind, 0.0, duration_s, 0, "", ())


def test_checkpoint_duration_is_the_mean_of_the_latest_completed_checkpoints() -> None:
    infos = [checkpoint(i, 100.0) for i in range(1, 4)]  # older than the latest 2: left out
    infos += [checkpoint(4, 0.2), checkpoint(5, 0.4), checkpoint(6, 9.0, status="FAILED")]
    infos += [checkpoint(7, 50.0, kind=CheckpointKind.SAVEPOINT)]
    figure = checkpoint_duration(infos, recent=2)
    assert figure is not None
    assert figure.value == pytest.approx(0.3)  # (0.2 + 0.4) / 2
    assert "max 0.400 s" in figure.how
    assert checkpoint_duration([checkpoint(1, 1.0, status="FAILED")]) is None


@pytest.mark.parametrize(
    "parameters, delay",
    [
        ({"restart.strategy": "fixed-delay", "restart.delay": "500ms"}, 0.5),
        ({"restart.strategy": "failure-rate", "restart.delay": "2s"}, 2.0),
        ({"restart.strategy": "exponential-delay", "restart.initial-backoff": "3s"}, 3.0),
        ({}, 1.0),  # the default strategy, exponential-delay, starts at 1 s
        ({"restart.strategy": "none"}, None),
    ],
)
def test_the_first_restart_delay_of_each_strategy(parameters: dict[str, str], delay: float | None) -> None:
    assert first_restart_delay_s(parse_restart_strategy(parameters)) == delay
    figure = restart_delay_from_parameters(parameters)
    assert (figure.value if figure is not None else None) == delay


# The savepoint measure ----------------------------------------------------------------------------


def test_record_keys_of_window_and_timer_entries_drop_the_suffix() -> None:
    prefixed = (3).to_bytes(4, "big") + b"abc" + (0).to_bytes(8, "big") + (1000).to_bytes(8, "big")
    assert record_key("win", prefixed) == b"abc"
    assert record_key("timers.event_time", (3).to_bytes(4, "big") + b"abc" + (5).to_bytes(8, "big")) == b"abc"
    assert record_key("reduce", b"abc") == b"abc"  # a plain state's key is the record key
    assert record_key("reduce", prefixed) == prefixed


def test_the_savepoint_measure_divides_entries_by_keys() -> None:
    measure = KeyedStateMeasure("p", "win", active_keys=4, entries=10, serialized_bytes=500, entries_by_state={})
    # 10 entries / 4 keys = 2.5 aggregates per key; 500 bytes / 10 entries = 50 bytes per aggregate
    figures = measure.figures()
    assert figures["active_keys"].value == 4
    assert figures["aggregates_per_key"].value == 2.5
    assert figures["bytes_per_aggregate"].value == 50.0
    assert all(f.origin is Origin.MEASURED for f in figures.values())


def test_a_measured_sink_rate_is_the_capacity_only_under_backpressure() -> None:
    assert "sustainable rate" in sink_rate_note(0.8) and "80%" in sink_rate_note(0.8)
    assert "lower bound" in sink_rate_note(0.1) and "10%" in sink_rate_note(0.1)
    assert "lower bound" in sink_rate_note(None)
