"""The benchmark's results as files: ``results.json`` (everything measured), ``results.md`` (tables,
ratios, targets as pass/miss) and ``chart.png`` (throughput and latency per contender)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench import provenance
from bench.evidence import RunOutcome, figure_of, spread_label

# The fair pairs: Quix Streams and the raw limit write to Kafka only, so Weir's Kafka-only variant is
# the one compared with them; the variant with PostgreSQL is shown beside it.
WEIR_VS_OTHERS = "weir-kafka"
WEIR_COLUMNAR = "weir-columnar"  # the same job on its columnar path (-D columnar=true), Kafka only


FIGURES = ("sustained_eps", "wall_eps", "cpu_s_per_million", "sustained_cpu_s_per_million", "s3_cpu_s")
"""The per-run values each contender's figure is the median (min, max) of."""


def output_ok(output: dict[str, Any]) -> bool:
    """A run's output check: ``ok`` (record for record), or format 1's ``complete`` (counts only)."""
    return bool(output.get("ok", output.get("complete", False)))


def summarize_throughput(entry: dict[str, Any]) -> dict[str, Any]:
    """A contender's figure over its runs (``figure``: each value's median, min and max, or the runs
    that failed it), and the medians the ratios and targets read (None when the figure failed).
    A results file of format 1 (before record-for-record checks) has its runs judged by their
    ``complete`` flag, which counted windows and events only: :func:`_check_text` says so."""
    runs = entry.get("runs", [])
    outcomes = [
        RunOutcome(
            values={name: r.get(name) for name in FIGURES},
            output_ok=output_ok(r.get("output") or {}),
            error=r.get("error"),
            under_load=bool((r.get("load") or {}).get("under_load")),
        )
        for r in runs
    ]
    figure = figure_of(outcomes, FIGURES)
    entry["figure"] = figure.as_dict()

    def med(name: str) -> float | None:
        spread = figure.spreads.get(name)
        return spread.median if spread is not None else None

    entry["median_eps"] = med("sustained_eps")
    entry["median_wall_eps"] = med("wall_eps")
    entry["median_cpu_s_per_million"] = med("cpu_s_per_million")
    entry["median_sustained_cpu_s_per_million"] = med("sustained_cpu_s_per_million")
    ok_runs = [r for r in runs if "error" not in r]
    entry["peak_rss_max_bytes"] = max((max(r["peak_rss_bytes"].values(), default=0) for r in ok_runs), default=None)
    return entry


def write(document: dict[str, Any], directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    document["ratios"] = ratios(document)
    document["targets"] = targets(document)
    _atomic_write(directory / "results.json", json.dumps(document, indent=2, default=str) + "\n")
    _atomic_write(directory / "results.md", markdown(document))
    chart(document, directory / "chart.png")


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def _rate(document: dict[str, Any], key: str) -> float | None:
    return document.get("throughput", {}).get(key, {}).get("median_eps")


def _cpu(document: dict[str, Any], key: str) -> float | None:
    return document.get("throughput", {}).get(key, {}).get("median_cpu_s_per_million")


def ratios(document: dict[str, Any]) -> dict[str, float | None]:
    """Throughput ratios (``_vs_``: Weir's events/s over the other's) and CPU-per-event ratios
    (``_cpu_vs_``: Weir's CPU s per million events over the other's; below 1 is less CPU than it)."""
    weir, weir_pg = _rate(document, WEIR_VS_OTHERS), _rate(document, "weir")
    quix, raw = _rate(document, "quix"), _rate(document, "raw")
    flink, ceiling = _rate(document, "flink"), _rate(document, "ceiling")
    weir_cpu = _cpu(document, WEIR_VS_OTHERS)

    def ratio(a: float | None, b: float | None) -> float | None:
        return a / b if a and b else None

    return {
        "weir_kafka_vs_quix": ratio(weir, quix),
        "weir_kafka_vs_raw": ratio(weir, raw),
        "weir_kafka_postgres_vs_quix": ratio(weir_pg, quix),
        "weir_kafka_postgres_vs_raw": ratio(weir_pg, raw),
        "weir_kafka_vs_flink": ratio(weir, flink),
        "weir_kafka_vs_ceiling": ratio(weir, ceiling),
        "weir_kafka_cpu_vs_flink": ratio(weir_cpu, _cpu(document, "flink")),
        "weir_kafka_cpu_vs_raw": ratio(weir_cpu, _cpu(document, "raw")),
        "weir_kafka_cpu_vs_quix": ratio(weir_cpu, _cpu(document, "quix")),
        "weir_columnar_vs_flink": ratio(_rate(document, WEIR_COLUMNAR), flink),
        "weir_columnar_vs_ceiling": ratio(_rate(document, WEIR_COLUMNAR), ceiling),
        "weir_columnar_vs_weir_kafka": ratio(_rate(document, WEIR_COLUMNAR), weir),
        "weir_columnar_cpu_vs_flink": ratio(_cpu(document, WEIR_COLUMNAR), _cpu(document, "flink")),
        "weir_columnar_cpu_vs_raw": ratio(_cpu(document, WEIR_COLUMNAR), _cpu(document, "raw")),
        "weir_columnar_cpu_vs_weir_kafka": ratio(_cpu(document, WEIR_COLUMNAR), weir_cpu),
    }


def targets(document: dict[str, Any]) -> list[dict[str, Any]]:
    r = document.get("ratios") or ratios(document)
    checkpoint = document.get("checkpoint") or {}
    recovery = document.get("recovery") or {}
    memory = document.get("memory") or {}
    incremental = (checkpoint.get("incremental") or {}).get("duration_s")
    out = [
        _target(
            "Weir >= 1.5x Quix Streams (Kafka only, exactly-once)",
            r.get("weir_kafka_vs_quix"),
            ">= 1.5x",
            lambda v: v >= 1.5,
            "{:.2f}x",
        ),
        _target(
            "Weir >= 50% of the raw Python limit", r.get("weir_kafka_vs_raw"), ">= 50%", lambda v: v >= 0.5, "{:.0%}"
        ),
        _target(
            f"incremental checkpoint of {checkpoint.get('keys') or document['plan']['state_keys']:,} keys < 2 s",
            incremental,
            "< 2 s",
            lambda v: v < 2.0,
            "{:.2f} s",
        ),
        _target("recovery after SIGKILL < 5 s", recovery.get("recovery_s"), "< 5 s", lambda v: v < 5.0, "{:.2f} s"),
        {
            "target": "memory flat under a slow sink",
            "goal": "growth <= max(32 MiB, 10%)",
            "value": (f"{memory['max_growth_bytes'] / 2**20:+.1f} MiB" if "max_growth_bytes" in memory else None),
            "result": ("pass" if memory.get("flat") else "miss") if "max_growth_bytes" in memory else "not measured",
        },
    ]
    # Issue 16's targets, on Weir's columnar path where it ran, else its per-record path.
    variant = "columnar" if _rate(document, WEIR_COLUMNAR) else "kafka"
    label = "Weir columnar (Kafka only)" if variant == "columnar" else "Weir (Kafka only)"
    out += [
        _target(
            f"{label} CPU per event <= 0.5x Flink's",
            r.get(f"weir_{variant}_cpu_vs_flink"),
            "<= 0.5x",
            lambda v: v <= 0.5,
            "{:.2f}x",
        ),
        _target(
            f"{label} CPU per event <= 1.0x the raw Python limit's",
            r.get(f"weir_{variant}_cpu_vs_raw"),
            "<= 1.0x",
            lambda v: v <= 1.0,
            "{:.2f}x",
        ),
        _target(
            f"{label} throughput >= 90% of the ceiling",
            r.get(f"weir_{variant}_vs_ceiling"),
            ">= 90%",
            lambda v: v >= 0.9,
            "{:.0%}",
        ),
        _target(
            f"{label} throughput >= Flink's",
            r.get(f"weir_{variant}_vs_flink"),
            ">= 1.0x",
            lambda v: v >= 1.0,
            "{:.2f}x",
        ),
        _target("recovery after SIGKILL < 3 s", recovery.get("recovery_s"), "< 3 s", lambda v: v < 3.0, "{:.2f} s"),
    ]
    out += steady_cpu_targets(document)
    if checkpoint.get("keys") and checkpoint["keys"] < 1_000_000:
        out[2]["note"] = "fewer keys than the 1M of the target (quick run)"
    return out


def _steady_cpu(document: dict[str, Any], key: str) -> float | None:
    """A contender's steady-state (10-90 % of the input) CPU s per million events: µs per event."""
    return document.get("throughput", {}).get(key, {}).get("median_sustained_cpu_s_per_million")


def steady_cpu_targets(document: dict[str, Any]) -> list[dict[str, Any]]:
    """The keyed job's CPU targets on steady-state CPU (10-90 % of the input), medians:
    the columnar path <= 6 µs per event, <= 0.33x Flink's, <= 2x the raw Python limit's; the
    per-record path (Kafka only) <= 10 µs per event."""
    columnar, per_record = _steady_cpu(document, WEIR_COLUMNAR), _steady_cpu(document, WEIR_VS_OTHERS)
    flink, raw = _steady_cpu(document, "flink"), _steady_cpu(document, "raw")

    def ratio(a: float | None, b: float | None) -> float | None:
        return a / b if a and b else None

    return [
        _target(
            "steady state: Weir columnar CPU per event <= 6 µs", columnar, "<= 6 µs", lambda v: v <= 6.0, "{:.2f} µs"
        ),
        _target(
            "steady state: Weir columnar CPU per event <= 0.33x Flink's",
            ratio(columnar, flink),
            "<= 0.33x",
            lambda v: v <= 0.33,
            "{:.2f}x",
        ),
        _target(
            "steady state: Weir columnar CPU per event <= 2x the raw Python limit's",
            ratio(columnar, raw),
            "<= 2x",
            lambda v: v <= 2.0,
            "{:.2f}x",
        ),
        _target(
            "steady state: Weir per record (Kafka only) CPU per event <= 10 µs",
            per_record,
            "<= 10 µs",
            lambda v: v <= 10.0,
            "{:.2f} µs",
        ),
    ]


def _target(name: str, value: float | None, goal: str, ok: Any, fmt: str) -> dict[str, Any]:
    if value is None:
        return {"target": name, "goal": goal, "value": None, "result": "not measured"}
    return {"target": name, "goal": goal, "value": fmt.format(value), "result": "pass" if ok(value) else "miss"}


def _fmt(value: float | None, fmt: str = "{:,.0f}") -> str:
    return "-" if value is None else fmt.format(value)


def spread_text(figure: dict[str, Any] | None, name: str, fmt: str = "{:,.0f}") -> str:
    """``median (min-max)`` of a figure's value; the failure when the figure failed."""
    if not figure:
        return "-"
    if not figure.get("ok"):
        return "**failed**"
    value = figure.get(name)
    if not value:
        return "-"
    return spread_label(value, figure.get("runs"), fmt)


def _warmup(runs: list[dict[str, Any]]) -> str:
    ratios = sorted((r.get("steady_state") or {}).get("warmup_ratio") for r in runs if r.get("steady_state"))
    ratios = [x for x in ratios if x is not None]
    return "-" if not ratios else f"{ratios[len(ratios) // 2]:.2f}"


def _mismatch(output: dict[str, Any]) -> str:
    """What a failed output check found: its summary, or format 1's window and event counts."""
    if "summary" in output:
        return str(output["summary"])
    if "distinct_windows" in output:
        return (
            f"{output['distinct_windows']:,} of {output.get('expected_windows', 0):,} windows, "
            f"{output.get('counted_events', 0):,} of {output.get('expected_events', 0):,} events counted, "
            f"{output.get('duplicates', 0):,} duplicates"
        )
    return "output check failed"


def _check_text(entry: dict[str, Any]) -> str:
    runs = entry.get("runs", [])
    figure = entry.get("figure") or {}
    if not runs:
        return "-"
    counts_only = any("complete" in (r.get("output") or {}) and "ok" not in r["output"] for r in runs)
    if figure.get("ok"):
        if counts_only:
            return f"complete in {len(runs)} of {len(runs)} runs (results format 1: windows and counts, no sums)"
        return f"ok in {len(runs)} of {len(runs)} runs"
    reasons = []
    for n, r in enumerate(runs, start=1):
        if "error" in r:
            reasons.append(f"run {n}: {r['error'][:160]}")
        elif not output_ok(r.get("output") or {}):
            reasons.append(f"run {n}: {_mismatch(r.get('output') or {})[:240]}")
    return "**FAILED**: " + "; ".join(reasons)


def markdown(document: dict[str, Any]) -> str:
    plan = document["plan"]
    if "provenance" in document:
        method = (
            f"Throughput: {plan['runs']} run(s) per contender, the order rotated from run to run (two contenders: "
            "ABBA); each figure is the median of the runs with (min-max); a run whose output mismatched fails its "
            f"contender's figure. Before each run the load gate waited up to {plan.get('load_wait_s', '?')} s for "
            "the 1-minute load average to fall to the core count."
        )
    else:
        method = (
            f"Throughput: {plan['runs']} run(s) per contender (results format 1: every run in the same order, no "
            "load gate, outputs checked by windows and counts; the figures here are the median (min-max) of its runs)."
        )
    lines = [
        f"# Benchmark results ({'quick' if document['quick'] else 'full'} run {document['run_id']})",
        "",
        provenance.markdown_line(document.get("provenance")),
        "",
        f"Data set: {plan['events']:,} events over 1,000 keys in 8 partitions. {method} Definitions: "
        "docs/benchmarks.md.",
        "",
    ]
    for key, reason in document.get("unavailable", {}).items():
        lines += [f"**{key} could not run here:** {reason}", ""]
    throughput = document.get("throughput", {})
    latency = document.get("latency", {})
    if throughput or latency:
        lines += [
            "| contender | sinks | events/s, 10-90 % | events/s, whole run | CPU s / M, whole run "
            "| CPU s / M, 10-90 % | S3 server CPU s | warm-up ratio | peak RSS / process | p50 latency "
            "| p99 latency | runs (under load) | output, record for record |",
            "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
        ]
        for key, info in document.get("contenders", {}).items():
            tp = throughput.get(key, {})
            if tp.get("runs") and "figure" not in tp:
                tp = summarize_throughput(dict(tp))  # a format-1 file: the figure from its runs
            lat = latency.get(key, {})
            figure = tp.get("figure")
            runs = tp.get("runs", [])
            peak = tp.get("peak_rss_max_bytes")
            check = _check_text(tp)
            if "error" in lat:
                check += f" (latency: {lat['error'][:80]})"
            under = (figure or {}).get("runs_under_load", 0)
            lines.append(
                f"| {info['label']} | {info['sinks']} | {spread_text(figure, 'sustained_eps')} "
                f"| {spread_text(figure, 'wall_eps')} "
                f"| {spread_text(figure, 'cpu_s_per_million', '{:.1f}')} "
                f"| {spread_text(figure, 'sustained_cpu_s_per_million', '{:.1f}')} "
                f"| {spread_text(figure, 's3_cpu_s', '{:.2f}')} | {_warmup(runs)} "
                f"| {_fmt(peak / 2**20 if peak else None, '{:.0f} MiB')} "
                f"| {_fmt(lat.get('p50_ms'), '{:,.0f} ms')} | {_fmt(lat.get('p99_ms'), '{:,.0f} ms')} "
                f"| {len(runs)} ({under}) | {check} |"
            )
        lines += [
            "",
            "Whole run: from the launch (Weir: its cluster's start; the others: their processes' start, Flink's "
            "JVM included) until the output is committed. 10-90 %: between 10 % and 90 % of the input consumed, "
            "from CPU samples of every process of the contender taken every 0.1 s. CPU counts the S3 server's "
            "CPU during the run (its own column too: checkpoints go there). Warm-up ratio: CPU per event over "
            "10-50 % of the input / over 50-90 % (median of the runs; above 1: still warming up).",
            "",
        ]
        orders = _orders(throughput)
        if orders:
            lines += ["Order of the runs: " + "; ".join(orders) + ".", ""]
        labels = {k: info["label"] for k, info in document.get("contenders", {}).items()}
        rates = [
            f"{labels.get(k, k)} {_fmt(v['rate_eps'])} events/s (achieved {_fmt(v.get('achieved_rate_eps'))}"
            + (", default rate: throughput not measured" if v.get("rate_is_default") else "")
            + (
                f", **fell behind: {v['consumed_by_contender']:,} of {v['produced']:,} consumed at the end**"
                if v.get("consumed_by_contender", 0) < 0.99 * v.get("produced", 0)
                else ""
            )
            + ")"
            for k, v in latency.items()
            if "rate_eps" in v
        ]
        if rates:
            lines += ["Latency runs fed each contender at half its sustained rate: " + "; ".join(rates) + ".", ""]
    r = document.get("ratios", {})
    lines += [
        "## Ratios",
        "",
        "| ratio | value |",
        "| --- | ---: |",
        f"| Weir (Kafka only) / Quix Streams | {_fmt(r.get('weir_kafka_vs_quix'), '{:.2f}x')} |",
        f"| Weir (Kafka only) / raw Python limit | {_fmt(r.get('weir_kafka_vs_raw'), '{:.0%}')} |",
        f"| Weir (Kafka + PostgreSQL) / Quix Streams | {_fmt(r.get('weir_kafka_postgres_vs_quix'), '{:.2f}x')} |",
        f"| Weir (Kafka + PostgreSQL) / raw Python limit | {_fmt(r.get('weir_kafka_postgres_vs_raw'), '{:.0%}')} |",
        f"| Weir (Kafka only) / Apache Flink, events/s | {_fmt(r.get('weir_kafka_vs_flink'), '{:.2f}x')} |",
        f"| Weir (Kafka only) / ceiling (bare consumer), events/s | {_fmt(r.get('weir_kafka_vs_ceiling'), '{:.0%}')} |",
        f"| Weir (Kafka only) / Apache Flink, CPU per event | {_fmt(r.get('weir_kafka_cpu_vs_flink'), '{:.2f}x')} |",
        f"| Weir (Kafka only) / raw Python limit, CPU per event | {_fmt(r.get('weir_kafka_cpu_vs_raw'), '{:.2f}x')} |",
        f"| Weir (Kafka only) / Quix Streams, CPU per event | {_fmt(r.get('weir_kafka_cpu_vs_quix'), '{:.2f}x')} |",
        f"| Weir columnar / Weir (Kafka only), events/s | {_fmt(r.get('weir_columnar_vs_weir_kafka'), '{:.2f}x')} |",
        f"| Weir columnar / Weir (Kafka only), CPU per event "
        f"| {_fmt(r.get('weir_columnar_cpu_vs_weir_kafka'), '{:.2f}x')} |",
        f"| Weir columnar / Apache Flink, events/s | {_fmt(r.get('weir_columnar_vs_flink'), '{:.2f}x')} |",
        f"| Weir columnar / ceiling (bare consumer), events/s | {_fmt(r.get('weir_columnar_vs_ceiling'), '{:.0%}')} |",
        f"| Weir columnar / Apache Flink, CPU per event | {_fmt(r.get('weir_columnar_cpu_vs_flink'), '{:.2f}x')} |",
        f"| Weir columnar / raw Python limit, CPU per event | {_fmt(r.get('weir_columnar_cpu_vs_raw'), '{:.2f}x')} |",
        "",
        "Quix Streams' PostgreSQL sink is at-least-once, so the pairs with Quix Streams, the raw limit and "
        "Apache Flink (Kafka sink only too) use Weir's keyed aggregation with its Kafka sink only "
        "(-D sink.postgres=false). CPU per event counts each contender's own processes (Flink: its JVM); the "
        "ceiling's row is what the broker serves a bare Python consumer here, its check the records read.",
        "",
    ]
    checkpoint = document.get("checkpoint") or {}
    if "first" in checkpoint:
        first, inc = checkpoint["first"], checkpoint["incremental"]
        lines += [
            "## Checkpoints with many keys",
            "",
            f"{checkpoint['keys']:,} keys of keyed state (bench/jobs/keyed_state.py), loaded in "
            f"{checkpoint['load_s']:.1f} s; checkpoint interval {checkpoint['interval_s']} s"
            + (
                ""
                if checkpoint["loaded_before_first_trigger"]
                else " (**loading had not finished at the first trigger**)"
            )
            + ".",
            "",
            "| checkpoint | id | duration | size |",
            "| --- | ---: | ---: | ---: |",
            f"| first (all keys) | {first['checkpoint_id']} | {first['duration_s']:.2f} s "
            f"| {first['size_bytes'] / 1e6:.1f} MB |",
            f"| incremental ({checkpoint['changed_keys']:,} keys changed) | {inc['checkpoint_id']} "
            f"| {inc['duration_s']:.2f} s | {inc['size_bytes'] / 1e6:.1f} MB |",
            "",
        ]
    elif "error" in checkpoint:
        lines += ["## Checkpoints with many keys", "", f"failed: {checkpoint['error']}", ""]
    recovery = document.get("recovery") or {}
    if "killed" in recovery:
        lines += [
            "## Recovery",
            "",
            f"SIGKILL of {recovery['killed']} under load: first restore scheduled "
            f"{recovery['restore_scheduled_s']:.2f} s after the kill; {recovery['restarts_after_kill']} restart(s), "
            f"the last scheduled {recovery['last_restore_after_kill_s']:.2f} s after the kill; first output "
            f"committed after the restore {_fmt(recovery.get('recovery_s'), '{:.2f} s')} after the kill.",
            "",
        ]
        kills = recovery.get("kills_recovery_s") or []
        if len(kills) > 1:
            lines += [
                f"That kill is the median of {len(kills)} (one fresh job each, fed {recovery['rate_eps']:,.0f} "
                f"events/s): {', '.join(_fmt(k, '{:.2f} s') for k in kills)}.",
                "",
            ]
    elif "error" in recovery:
        lines += ["## Recovery", "", f"failed: {recovery['error']}", ""]
    memory = document.get("memory") or {}
    if "taskmanagers" in memory:
        lines += [
            "## Memory under a slow sink",
            "",
            f"{memory['duration_s']:.0f} s with a sink taking {memory['sink_delay_ms']} ms per window result; the "
            f"source was held to {memory['source_eps']:,.0f} events/s over the second half"
            + (" (**the input ran out: not enough backpressure**)" if memory["input_exhausted"] else "")
            + (" (**the source's progress could not be read**)" if not memory["source_events"] else "")
            + ".",
            "",
            "| TaskManager | RSS warm | RSS last quarter | peak | growth |",
            "| --- | ---: | ---: | ---: | ---: |",
        ]
        for name, tm in sorted(memory["taskmanagers"].items()):
            lines.append(
                f"| {name} | {tm['warm_rss_bytes'] / 2**20:.0f} MiB | {tm['last_rss_bytes'] / 2**20:.0f} MiB "
                f"| {tm['peak_rss_bytes'] / 2**20:.0f} MiB | {tm['growth_bytes'] / 2**20:+.1f} MiB |"
            )
        lines += [""]
    elif "error" in memory:
        lines += ["## Memory under a slow sink", "", f"failed: {memory['error']}", ""]
    lines += ["## Targets", "", "| target | goal | measured | result |", "| --- | --- | ---: | --- |"]
    for t in document.get("targets", []):
        note = f" ({t['note']})" if t.get("note") else ""
        lines.append(f"| {t['target']} | {t['goal']} | {t['value'] or '-'} | {t['result']}{note} |")
    lines += [""]
    return "\n".join(lines)


def _orders(throughput: dict[str, Any]) -> list[str]:
    """Per run, the contenders in the order they ran (from each run's ``run`` and ``position``)."""
    by_run: dict[int, list[tuple[int, str]]] = {}
    for key, entry in throughput.items():
        for r in entry.get("runs", []):
            if "run" in r and "position" in r:
                by_run.setdefault(r["run"], []).append((r["position"], key))
    return [f"run {n}: {', '.join(k for _p, k in sorted(by_run[n]))}" for n in sorted(by_run)]


def chart(document: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import StrMethodFormatter

    contenders = document.get("contenders", {})
    keys = list(contenders)
    labels = [contenders[k]["label"].replace(" (", "\n(") for k in keys]
    throughput = [document.get("throughput", {}).get(k, {}).get("median_eps") or 0 for k in keys]
    p50 = [document.get("latency", {}).get(k, {}).get("p50_ms") or 0 for k in keys]
    p99 = [document.get("latency", {}).get(k, {}).get("p99_ms") or 0 for k in keys]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    colors = ["#1f6fb2" if k.startswith("weir") else "#999999" for k in keys]
    left.bar(range(len(keys)), throughput, color=colors)
    left.set_xticks(range(len(keys)), labels, fontsize=8)
    left.set_ylabel("events/s (sustained, median)")
    left.yaxis.set_major_formatter(StrMethodFormatter("{x:,.0f}"))
    left.set_title("Throughput, exactly-once")
    for i, v in enumerate(throughput):
        left.annotate(f"{v:,.0f}", (i, v), ha="center", va="bottom", fontsize=8)
    width = 0.38
    right.bar([i - width / 2 for i in range(len(keys))], p50, width, label="p50", color="#4c9f70")
    right.bar([i + width / 2 for i in range(len(keys))], p99, width, label="p99", color="#d08c2b")
    right.set_xticks(range(len(keys)), labels, fontsize=8)
    right.set_ylabel("ms, append -> visible (read_committed)")
    right.yaxis.set_major_formatter(StrMethodFormatter("{x:,.0f}"))
    right.set_title("Latency at half the sustained rate")
    right.legend()
    kind = "quick run" if document["quick"] else "full run"
    fig.suptitle(f"Weir keyed aggregation benchmark ({kind} {document['run_id']})", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
