"""Unaligned vs aligned checkpoints (issue 15): checkpoint duration under a slow sink at two backlog
sizes, and the throughput cost of unaligned mode without backpressure.

``make bench-backpressure`` (``.venv/bin/python -m bench.backpressure_bench [--quick]``) starts a private
cluster (bench.harness) and runs:

1. **Under backpressure**: examples/slow_sink_aggregation.py (the keyed aggregation into the
   exactly-once Kafka sink, paced to ``sink.records_per_second`` per subtask) on live input faster than
   the sink, once per mode and backlog size, with the scenario's own driver
   (``weir.scenarios.backpressure.run_mode``). The backlog that delays an aligned barrier is the
   work queued ahead of it in the channels: their records (bounded by the credits, the same in both
   sizes) over the rate at which the slow sink drains them. The two sizes are two sink rates, the
   larger backlog being 2x the smaller in seconds of work. Figures: the median checkpoint duration
   over the last third of the completed checkpoints, the longest start delay, the persisted in-flight
   bytes, and the ratio unaligned / aligned.
2. **Without backpressure**: examples/keyed_aggregation.py (Kafka sink only), bounded, over the same
   pre-produced input, a checkpoint every second, aligned and unaligned alternately (``--runs`` each):
   events/s from submission to FINISHED, and CPU seconds per event of the cluster's processes (psutil).
   The goal: unaligned throughput within 5 % of aligned (ratio >= 0.95), reported, never asserted.

Results: ``bench/results/backpressure.json`` and ``backpressure.md``. Topics are named after the run
and deleted at the end, with the run's checkpoints.
"""

from __future__ import annotations

import argparse
import io
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, replace
from typing import Any, Final

from rich.console import Console

from bench.harness import (
    REPO_ROOT,
    BenchCluster,
    BenchError,
    ProcessSampler,
    ensure_services,
    host_summary,
    log,
    new_run_id,
    prepare_environment,
    private_cluster,
    publish_results,
    remove_checkpoints,
    remove_run_root,
)
from weir.connectors import kafka
from weir.scenarios.backpressure import BackpressureConfig, measure, run_mode
from weir.tools.events import EventSpec, produce_events

KEYED_JOB: Final = REPO_ROOT / "examples" / "keyed_aggregation.py"
MODES: Final = ("aligned", "unaligned")
THROUGHPUT_GOAL: Final = 0.95


@dataclass(frozen=True)
class Plan:
    sink_rates: tuple[int, int] = (60, 30)  # results/s per sink subtask: the small and the large backlog
    backpressure_run_s: float = 50.0
    events: int = 300_000  # the throughput phase's input
    runs: int = 2  # per mode, alternating


QUICK: Final = Plan(sink_rates=(60, 30), backpressure_run_s=35.0, events=100_000, runs=1)


def backpressure_phase(cluster: BenchCluster, run_id: str, plan: Plan) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    console = Console(file=io.StringIO(), width=150)
    for label, rate in zip(("small", "large"), plan.sink_rates, strict=True):
        config = BackpressureConfig(
            sink_records_per_second=rate,
            run_s=plan.backpressure_run_s,
            topic_prefix=f"bench-bp-{run_id}-{label}",
        )
        queued_records = 5 * 1000 * config.parallelism * config.parallelism  # credits + sender buffer, per channel
        entry: dict[str, Any] = {
            "backlog": label,
            "sink_results_per_second_per_subtask": rate,
            "input_events_per_second": config.events_per_second,
            "sustainable_events_per_second": config.sustainable_events_per_second,
            "queued_work_s_at_most": queued_records / config.sustainable_events_per_second,
            "modes": {},
        }
        for mode in MODES:
            log(f"backpressure, {label} backlog (sink {rate} results/s per subtask), {mode}")
            run = run_mode(cluster.env.endpoints, cluster.client, config, mode, console)
            if not run.available:
                entry["modes"][mode] = {"unavailable": run.unavailable}
                continue
            m = measure(run, config)
            entry["modes"][mode] = {
                "job_id": run.job_id,
                "checkpoints_completed": m.completed,
                "checkpoint_durations_s": [round(c.duration_s, 3) for c in run.checkpoints if c.status == "COMPLETED"],
                "duration_last_third_median_s": m.duration_last_s,
                "duration_max_s": m.duration_max_s,
                "start_delay_last_third_median_s": m.start_delay_last_s,
                "alignment_max_s": m.alignment_max_s,
                "inflight_bytes_max": max(m.inflight_bytes, default=0),
                "latency_p50_s": m.latency_p50_s,
                "sink_events_per_second": m.sink_events_rate,
                "lag_growth_events_per_second": m.lag_growth,
            }
            kafka.delete_topics(cluster.env.endpoints, list(config.job(mode).topics(config.partitions)))
        modes = entry["modes"]
        if all("duration_last_third_median_s" in modes.get(m, {}) for m in MODES):
            a, u = modes["aligned"], modes["unaligned"]
            entry["duration_ratio_unaligned_to_aligned"] = u["duration_last_third_median_s"] / max(
                1e-9, a["duration_last_third_median_s"]
            )
        out.append(entry)
    return out


def throughput_phase(cluster: BenchCluster, run_id: str, plan: Plan) -> dict[str, Any]:
    endpoints = cluster.env.endpoints
    source, dlq = f"bench-bp-{run_id}-tput-events", f"bench-bp-{run_id}-tput-dlq"
    kafka.create_topics(endpoints, {source: 6, dlq: 1}, replace=True)
    log(f"producing {plan.events:,} events into {source}")
    produce_events(endpoints, source, EventSpec(count=plan.events, keys=1000))
    runs: list[dict[str, Any]] = []
    sinks: list[str] = []
    for i in range(plan.runs):
        for mode in MODES:
            sink = f"bench-bp-{run_id}-tput-results-{mode}-{i}"
            sinks.append(sink)
            kafka.create_topics(endpoints, {sink: 3}, replace=True)
            params = {
                "source.topic": source,
                "source.dlq_topic": dlq,
                "sink.topic": sink,
                "sink.postgres": "false",
                "source.bounded": "true",
                "checkpointing.interval": "1s",
                "checkpointing.unaligned": "true" if mode == "unaligned" else "false",
            }
            sampler = ProcessSampler(interval_s=0.25)
            sampler.track(cluster.process_pids())
            sampler.start()
            started = time.monotonic()
            job = cluster.submit(KEYED_JOB, params, parallelism=3)
            status = cluster.wait_job(job, lambda s: s.summary.status == "FINISHED", 600, "FINISHED")
            elapsed = time.monotonic() - started
            sampler.stop()
            checkpoints = cluster.client.list_checkpoints(job)
            completed = [c for c in checkpoints if c.status.value == "COMPLETED"]
            runs.append(
                {
                    "mode": mode,
                    "run": i,
                    "job_id": job,
                    "status": status.summary.status,
                    "elapsed_s": elapsed,
                    "events_per_second": plan.events / elapsed,
                    "cpu_s": sampler.total_cpu_s(),
                    "cpu_us_per_event": sampler.total_cpu_s() / plan.events * 1e6,
                    "checkpoints_completed": len(completed),
                    "checkpoint_duration_median_s": statistics.median([c.duration_s for c in completed])
                    if completed
                    else None,
                }
            )
            log(
                f"  {mode} run {i}: {plan.events / elapsed:,.0f} events/s, "
                f"{runs[-1]['cpu_us_per_event']:.1f} us CPU/event, {len(completed)} checkpoints"
            )
    kafka.delete_topics(endpoints, [source, dlq, *sinks])

    def med(mode: str, key: str) -> float:
        return statistics.median(r[key] for r in runs if r["mode"] == mode)

    result: dict[str, Any] = {"events": plan.events, "runs": runs}
    for mode in MODES:
        result[mode] = {
            "events_per_second": med(mode, "events_per_second"),
            "cpu_us_per_event": med(mode, "cpu_us_per_event"),
        }
    result["throughput_ratio_unaligned_to_aligned"] = (
        result["unaligned"]["events_per_second"] / result["aligned"]["events_per_second"]
    )
    result["cpu_ratio_unaligned_to_aligned"] = (
        result["unaligned"]["cpu_us_per_event"] / result["aligned"]["cpu_us_per_event"]
    )
    result["goal"] = f"throughput ratio >= {THROUGHPUT_GOAL}"
    result["goal_met"] = result["throughput_ratio_unaligned_to_aligned"] >= THROUGHPUT_GOAL
    return result


def render_markdown(document: dict[str, Any]) -> str:
    lines = [
        "# Unaligned vs aligned checkpoints (`make bench-backpressure`)",
        "",
        f"Run {document['run_id']} on {document['host']['machine']} ({document['host']['cpus']} CPUs), "
        f"commit {document['commit']}, {document['date']}.",
        "",
        "## Checkpoint duration under a slow sink",
        "",
        "| backlog | sink (results/s per subtask) | queued work at most | aligned: duration | aligned: start delay "
        "| unaligned: duration | unaligned: start delay | unaligned in-flight persisted | unaligned / aligned |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for e in document["backpressure"]:
        a, u = e["modes"].get("aligned", {}), e["modes"].get("unaligned", {})

        def dur(m: dict[str, Any], key: str) -> str:
            if "unavailable" in m:
                return "unavailable"
            return f"{m[key]:.2f} s" if key in m else "-"

        ratio = e.get("duration_ratio_unaligned_to_aligned")
        inflight = "-" if "unavailable" in u else f"{u.get('inflight_bytes_max', 0) / 1024:.1f} KiB"
        lines.append(
            f"| {e['backlog']} | {e['sink_results_per_second_per_subtask']} | {e['queued_work_s_at_most']:.1f} s "
            f"| {dur(a, 'duration_last_third_median_s')} | {dur(a, 'start_delay_last_third_median_s')} "
            f"| {dur(u, 'duration_last_third_median_s')} | {dur(u, 'start_delay_last_third_median_s')} "
            f"| {inflight} | {'-' if ratio is None else f'{ratio:.2f}'} |"
        )
    lines += [
        "",
        "Durations: median over the last third of the completed checkpoints (the channels' queues are full",
        "by then); start delay: trigger to the barrier at the last task. Input 3,000 events/s, 40 keys,",
        "250 ms windows, parallelism 2, interval 1 s.",
        "",
        "## Throughput without backpressure",
        "",
    ]
    t = document["throughput"]
    lines += [
        "| mode | events/s (median) | CPU per event (cluster, median) |",
        "| --- | --- | --- |",
        *(f"| {m} | {t[m]['events_per_second']:,.0f} | {t[m]['cpu_us_per_event']:.1f} us |" for m in MODES),
        "",
        f"Unaligned / aligned: throughput {t['throughput_ratio_unaligned_to_aligned']:.3f}, CPU per event "
        f"{t['cpu_ratio_unaligned_to_aligned']:.3f}; goal {t['goal']}: "
        f"{'met' if t['goal_met'] else 'missed'} ({t['events']:,} events, keyed aggregation -p 3, Kafka sink, "
        f"checkpoint every 1 s, {len(t['runs']) // 2} run(s) per mode).",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.backpressure_bench", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="shorter runs, one throughput run per mode")
    parser.add_argument("--runs", type=int, default=None)
    parser.add_argument("--events", type=int, default=None)
    parser.add_argument("--keep", action="store_true", help="keep the run's directory")
    args = parser.parse_args(argv)
    plan = QUICK if args.quick else Plan()
    plan = replace(plan, runs=args.runs or plan.runs, events=args.events or plan.events)
    run_id = new_run_id()
    env = prepare_environment(run_id, checkpoints_in_s3=True)
    ensure_services(env.endpoints, env.services_run_dir)
    ok = False
    try:
        with private_cluster(env) as cluster:
            cluster.wait_all_taskmanagers()
            backpressure = backpressure_phase(cluster, run_id, plan)
            throughput = throughput_phase(cluster, run_id, plan)
        ok = True
    except BenchError as exc:
        log(f"error: {exc}")
        return 1
    finally:
        remove_checkpoints(env)
        remove_run_root(env, keep=args.keep or not ok)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO_ROOT)
    document = {
        "run_id": run_id,
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "commit": commit.stdout.strip(),
        "host": host_summary(),
        "plan": asdict(plan),
        "backpressure": backpressure,
        "throughput": throughput,
    }
    publish_results("backpressure", document, render_markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
