"""Ratios, targets and the markdown of the benchmark's results (no chart, no services)."""

from __future__ import annotations

from typing import Any

from bench import report


def document(**overrides: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "run_id": "r1",
        "quick": True,
        "measured_at": "2026-01-01T00:00:00+0000",
        "host": {"cpus": 2, "python": "3.11"},
        "plan": {"events": 200_000, "runs": 1, "state_keys": 200_000},
        "contenders": {
            k: {"key": k, "label": k, "sinks": "Kafka", "guarantee": "exactly-once"}
            for k in ("weir", "weir-kafka", "quix", "raw")
        },
        "throughput": {
            "weir": {"median_eps": 40_000.0, "runs": []},
            "weir-kafka": {"median_eps": 50_000.0, "runs": []},
            "quix": {"median_eps": 20_000.0, "runs": []},
            "raw": {"median_eps": 125_000.0, "runs": []},
        },
        "latency": {},
        "checkpoint": {"keys": 1_000_000, "incremental": {"duration_s": 1.5}},
        "recovery": {"recovery_s": 6.0},
        "memory": {"max_growth_bytes": 2**20, "flat": True},
    }
    doc.update(overrides)
    return doc


def test_ratios_pair_weir_kafka_only_with_the_others() -> None:
    r = report.ratios(document())
    assert r["weir_kafka_vs_quix"] == 2.5
    assert r["weir_kafka_vs_raw"] == 0.4
    assert r["weir_kafka_postgres_vs_quix"] == 2.0


def test_targets_report_pass_miss_and_not_measured() -> None:
    vs_quix, vs_raw, checkpoint, recovery, memory = (t["result"] for t in report.targets(document())[:5])
    assert (vs_quix, vs_raw) == ("pass", "miss")  # 2.5x >= 1.5x; 40% < 50%
    assert (checkpoint, recovery, memory) == ("pass", "miss", "pass")  # 1.5 s < 2 s; 6 s >= 5 s; flat
    vs_quix, vs_raw, _, recovery, _ = (t["result"] for t in report.targets(document(throughput={}, recovery={}))[:5])
    assert {vs_quix, vs_raw, recovery} == {"not measured"}


def test_markdown_names_every_contender_and_the_targets() -> None:
    doc = document()
    doc["ratios"] = report.ratios(doc)
    doc["targets"] = report.targets(doc)
    text = report.markdown(doc)
    for label in ("weir", "weir-kafka", "quix", "raw"):
        assert f"| {label} |" in text
    assert "## Targets" in text
    assert "2.50x" in text


def _run(run: int, position: int, eps: float, ok: bool = True) -> dict[str, Any]:
    return {
        "run": run,
        "position": position,
        "sustained_eps": eps,
        "output": {"ok": ok, "summary": "ok" if ok else "1 duplicated (e.g. ('key-0001', 0, 1000, 8, 400) x1)"},
        "steady_state": {"warmup_ratio": 1.02},
        "load": {"under_load": run == 2},
    }


def test_markdown_shows_spreads_the_order_a_failed_figure_and_provenance() -> None:
    good_runs = [_run(1, 1, 50_000.0), _run(2, 2, 40_000.0), _run(3, 1, 60_000.0)]
    bad_runs = [_run(1, 2, 20_000.0), _run(2, 1, 20_000.0, ok=False), _run(3, 2, 20_000.0)]
    throughput = {
        "weir-kafka": {
            "runs": good_runs,
            "figure": {
                "ok": True,
                "runs": 3,
                "runs_under_load": 1,
                "failed": [],
                "sustained_eps": {"median": 50_000.0, "min": 40_000.0, "max": 60_000.0, "runs": 3},
            },
        },
        "raw": {
            "runs": bad_runs,
            "figure": {"ok": False, "runs": 3, "runs_under_load": 1, "failed": ["run 2: output mismatch"]},
        },
    }
    contenders = {k: {"key": k, "label": k, "sinks": "Kafka", "guarantee": "x"} for k in throughput}
    doc = document(
        throughput=throughput,
        contenders=contenders,
        provenance={"commit_short": "abc1234", "dirty": True, "machine": {"cores": 2}},
    )
    doc["plan"]["load_wait_s"] = 60
    text = report.markdown(doc)
    assert "Commit `abc1234` + uncommitted changes" in text
    assert "| weir-kafka | Kafka | 50,000 (40,000-60,000) |" in text
    assert "| 3 (1) | ok in 3 of 3 runs |" in text
    assert "| raw | Kafka | **failed** |" in text
    assert "**FAILED**: run 2: 1 duplicated" in text
    assert "run 1: weir-kafka, raw; run 2: raw, weir-kafka; run 3: weir-kafka, raw" in text
    assert "1.02" in text  # the warm-up ratio


def test_issue_16_targets_judge_the_columnar_path_where_it_ran() -> None:
    throughput = {
        "weir-kafka": {"median_eps": 60_000.0, "median_cpu_s_per_million": 20.0},
        "weir-columnar": {"median_eps": 190_000.0, "median_cpu_s_per_million": 3.0},
        "flink": {"median_eps": 80_000.0, "median_cpu_s_per_million": 8.0},
        "raw": {"median_eps": 100_000.0, "median_cpu_s_per_million": 2.0},
        "ceiling": {"median_eps": 200_000.0, "median_cpu_s_per_million": 0.5},
    }
    doc = document(throughput=throughput, recovery={"recovery_s": 2.5})
    doc["ratios"] = report.ratios(doc)
    assert doc["ratios"]["weir_columnar_cpu_vs_weir_kafka"] == 0.15
    by_name = {t["target"]: t for t in report.targets(doc)}
    assert by_name["Weir columnar (Kafka only) CPU per event <= 0.5x Flink's"]["result"] == "pass"  # 0.375x
    assert by_name["Weir columnar (Kafka only) CPU per event <= 1.0x the raw Python limit's"]["result"] == "miss"
    assert by_name["Weir columnar (Kafka only) throughput >= 90% of the ceiling"]["result"] == "pass"  # 95 %
    assert by_name["Weir columnar (Kafka only) throughput >= Flink's"]["value"] == "2.38x"
    assert by_name["recovery after SIGKILL < 3 s"]["result"] == "pass"
    del throughput["weir-columnar"]
    doc["ratios"] = report.ratios(doc)
    names = [t["target"] for t in report.targets(doc)]
    assert "Weir (Kafka only) CPU per event <= 0.5x Flink's" in names


def test_a_figure_measured_in_fewer_runs_than_were_made_says_in_how_many() -> None:
    """A steady state exists only in runs whose progress moved often enough: a median of 1 of 3
    runs is not shown as if it were of all 3."""
    one = {"median": 5.0, "min": 5.0, "max": 5.0, "runs": 1}
    two = {"median": 5.0, "min": 4.0, "max": 6.0, "runs": 2}
    assert report.spread_text({"ok": True, "runs": 3, "x": one}, "x") == "5 (1 of 3 runs)"
    assert report.spread_text({"ok": True, "runs": 3, "x": two}, "x") == "5 (4-6; 2 of 3 runs)"
    assert report.spread_text({"ok": True, "runs": 1, "x": one}, "x") == "5"
    assert report.spread_text({"ok": True, "runs": 2, "x": two}, "x") == "5 (4-6)"


def test_steady_cpu_targets_read_steady_state_cpu_medians() -> None:
    """The columnar path <= 6 µs per event, <= 0.33x Flink, <= 2x the raw limit; the per-record
    path <= 10 µs; all on steady-state CPU (10-90 % of the input), not the whole run's."""
    throughput = {
        "weir-kafka": {"median_cpu_s_per_million": 99.0, "median_sustained_cpu_s_per_million": 6.0},
        "weir-columnar": {"median_cpu_s_per_million": 99.0, "median_sustained_cpu_s_per_million": 4.9},
        "flink": {"median_cpu_s_per_million": 1.0, "median_sustained_cpu_s_per_million": 13.1},
        "raw": {"median_cpu_s_per_million": 1.0, "median_sustained_cpu_s_per_million": 1.3},
    }
    by_name = {t["target"]: t for t in report.steady_cpu_targets(document(throughput=throughput))}
    assert by_name["steady state: Weir columnar CPU per event <= 6 µs"] == {
        "target": "steady state: Weir columnar CPU per event <= 6 µs",
        "goal": "<= 6 µs",
        "value": "4.90 µs",
        "result": "pass",
    }
    assert by_name["steady state: Weir columnar CPU per event <= 0.33x Flink's"]["value"] == "0.37x"
    assert by_name["steady state: Weir columnar CPU per event <= 0.33x Flink's"]["result"] == "miss"
    assert by_name["steady state: Weir columnar CPU per event <= 2x the raw Python limit's"]["result"] == "miss"
    assert by_name["steady state: Weir per record (Kafka only) CPU per event <= 10 µs"]["result"] == "pass"
    del throughput["flink"]
    by_name = {t["target"]: t for t in report.steady_cpu_targets(document(throughput=throughput))}
    assert by_name["steady state: Weir columnar CPU per event <= 0.33x Flink's"]["result"] == "not measured"
    assert [t["target"] for t in report.targets(document(throughput=throughput))][-4:] == list(by_name)
