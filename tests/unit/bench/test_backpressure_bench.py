"""The backpressure benchmark's report, from a made-up result document."""

from __future__ import annotations

from bench.backpressure_bench import render_markdown


def test_the_report_shows_ratios_cpu_per_event_and_an_unavailable_mode() -> None:
    document = {
        "run_id": "r1",
        "host": {"machine": "x86_64", "cpus": 2},
        "commit": "abc1234",
        "date": "2026-12-01T12:00:00Z",
        "backpressure": [
            {
                "backlog": "small",
                "sink_results_per_second_per_subtask": 60,
                "queued_work_s_at_most": 8.9,
                "modes": {
                    "aligned": {"duration_last_third_median_s": 6.0, "start_delay_last_third_median_s": 5.0},
                    "unaligned": {
                        "duration_last_third_median_s": 1.5,
                        "start_delay_last_third_median_s": 0.2,
                        "inflight_bytes_max": 2048,
                    },
                },
                "duration_ratio_unaligned_to_aligned": 0.25,
            },
            {
                "backlog": "large",
                "sink_results_per_second_per_subtask": 30,
                "queued_work_s_at_most": 17.8,
                "modes": {"aligned": {"duration_last_third_median_s": 12.0}, "unaligned": {"unavailable": "no"}},
            },
        ],
        "throughput": {
            "events": 1000,
            "runs": [{}, {}],
            "aligned": {"events_per_second": 1000.0, "cpu_us_per_event": 50.0},
            "unaligned": {"events_per_second": 960.0, "cpu_us_per_event": 52.0},
            "throughput_ratio_unaligned_to_aligned": 0.96,
            "cpu_ratio_unaligned_to_aligned": 1.04,
            "goal": "throughput ratio >= 0.95",
            "goal_met": True,
        },
    }
    text = render_markdown(document)
    assert "| small | 60 | 8.9 s | 6.00 s | 5.00 s | 1.50 s | 0.20 s | 2.0 KiB | 0.25 |" in text
    assert "| large | 30 | 17.8 s | 12.00 s | - | unavailable | unavailable | - | - |" in text
    assert "| unaligned | 960 | 52.0 us |" in text
    assert "throughput 0.960, CPU per event 1.040; goal throughput ratio >= 0.95: met" in text
