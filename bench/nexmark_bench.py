"""Nexmark on Weir and on Apache Flink: each query on both, the same events from the same topic, one run.

``make bench-nexmark`` runs ``python -m bench.nexmark_bench [--quick] [--events N] [--queries q0,q1]``:

1. N Nexmark events (``weir.tools.nexmark_load``, default 1,000,000; ``--quick`` 100,000) into one
   8-partition topic, once; every query of both contenders reads it from the start (bounded);
2. per query, Weir: ``examples/nexmark/qN.py`` on a private cluster (JobManager + 3 TaskManagers,
   ``-p 3``, a checkpoint every second, exactly-once Kafka sink,
   ``-D source=kafka -D source.bounded=true``); Flink: the reference's ``qN.sql`` in Flink SQL
   (``weir.bench.NexmarkSql`` of bench/flink/, a MiniCluster in one JVM, parallelism 3, RocksDB, a
   checkpoint every second, exactly-once Kafka sink);
3. figures: events/s (N over the time from the job running to the job finished) and CPU seconds per
   million events over the same span, of each contender's own processes (Weir's JobManager and
   TaskManagers; Flink's JVM, whose whole-life CPU, start-up and SQL planning included, is recorded
   too); Weir / Flink ratios;
4. the committed output of each is counted and checked: against the plain-Python reference
   (``weir.tools.nexmark_reference``) when N is at most ``--reference-events``, else q0 and q1
   against the number of bids; and Weir against Flink.

A query is in the run when its Weir job file exists (``examples/nexmark/qN.py``); its Flink side
when ``bench/flink/src/main/resources/nexmark/qN.sql`` does. Results:
``bench/results/nexmark.json``, ``nexmark.md`` and ``nexmark.png``.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final

from bench.harness import (
    REPO_ROOT,
    RESULTS_DIR,
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
    reap,
    remove_checkpoints,
    remove_run_root,
)

QUERY_ORDER: Final = ("q0", "q1", "q2", "q3", "q4", "q5", "q7", "q8", "q11")
QUICK_QUERIES: Final = ("q0", "q1", "q2")
EXAMPLES_DIR: Final = REPO_ROOT / "examples" / "nexmark"
FLINK_SQL_DIR: Final = REPO_ROOT / "bench" / "flink" / "src" / "main" / "resources" / "nexmark"
FLINK_SQL_MAIN: Final = "weir.bench.NexmarkSql"
PARTITIONS: Final = 8
PARALLELISM: Final = 3
FULL_EVENTS: Final = 1_000_000
QUICK_EVENTS: Final = 100_000
REFERENCE_EVENTS: Final = 200_000
UPDATING: Final = frozenset({"q4"})
"""Queries whose Flink result is an update stream (upsert-kafka): its record count is the updates, not
the rows, and is not compared."""
JOB_TIMEOUT_S: Final = 900.0


# Query selection (pure) ----------------------------------------------------------------------------------


def query_key(name: str) -> tuple[int, str]:
    digits = name[1:]
    return (int(digits), name) if name.startswith("q") and digits.isdigit() else (10**6, name)


def present_queries(examples_dir: Path = EXAMPLES_DIR) -> list[str]:
    """The Nexmark queries with a Weir job file, in query order."""
    found = [p.stem for p in examples_dir.glob("q*.py") if p.stem[1:].isdigit()]
    return sorted(found, key=query_key)


def flink_queries(sql_dir: Path = FLINK_SQL_DIR) -> set[str]:
    return {p.stem for p in sql_dir.glob("q*.sql")}


def select_queries(
    requested: Sequence[str] | None, *, quick: bool, present: Sequence[str]
) -> tuple[list[str], list[str]]:
    """The queries to run and the requested ones skipped (no job file). Default: every present query,
    or the stateless q0-q2 in quick mode."""
    if requested:
        wanted = list(dict.fromkeys(q.strip() for q in requested if q.strip()))
    else:
        wanted = list(QUICK_QUERIES) if quick else list(present)
    chosen = [q for q in wanted if q in present]
    skipped = [q for q in wanted if q not in present]
    return sorted(chosen, key=query_key), skipped


# Output checks (pure) ------------------------------------------------------------------------------------


def bids_among(events: int) -> int:
    """Bids among events 0..events-1: of every 50 event ids the first 4 are a person and 3 auctions."""
    full, rest = divmod(events, 50)
    return full * 46 + max(0, rest - 4)


def reference_counts(events: int, queries: Sequence[str]) -> dict[str, int]:
    """Rows of each query's plain-Python reference over events 0..events-1 (the loaded ones)."""
    from weir import nexmark
    from weir.tools import nexmark_reference

    stream = [nexmark.event(n) for n in range(events)]
    return {q: len(nexmark_reference.QUERIES[q](stream)) for q in queries if q in nexmark_reference.QUERIES}


def expected_count(query: str, events: int, reference: dict[str, int]) -> int | None:
    """What a query must output over ``events`` events, when known."""
    if query in reference:
        return reference[query]
    if query in ("q0", "q1"):
        return bids_among(events)
    return None


def check_outputs(query: str, expected: int | None, weir: int | None, flink: int | None) -> dict[str, Any]:
    """Each contender's output count against the expected count and against the other's."""
    out: dict[str, Any] = {"expected": expected, "weir": weir, "flink": flink}

    def verdict(count: int | None) -> str:
        if count is None:
            return "not measured"
        if expected is None:
            return "no reference"
        return "ok" if count == expected else f"{'short' if count < expected else 'over'} by {abs(count - expected):,}"

    out["weir_check"] = verdict(weir)
    out["flink_check"] = "updates (not compared)" if query in UPDATING and flink is not None else verdict(flink)
    if weir is not None and flink is not None and query not in UPDATING:
        out["weir_equals_flink"] = weir == flink
    else:
        out["weir_equals_flink"] = None
    return out


# Figures and the report (pure) ------------------------------------------------------------------------------


def figures(events: int, running_s: float, cpu_s: float) -> dict[str, Any]:
    return {
        "seconds": running_s,
        "events_per_s": events / running_s if running_s > 0 else None,
        "cpu_s": cpu_s,
        "cpu_s_per_million": cpu_s / events * 1e6 if events else None,
    }


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def add_ratios(entry: dict[str, Any]) -> dict[str, Any]:
    weir, flink = entry.get("weir") or {}, entry.get("flink") or {}
    entry["ratios"] = {
        "events_per_s_weir_vs_flink": ratio(weir.get("events_per_s"), flink.get("events_per_s")),
        "cpu_per_event_weir_vs_flink": ratio(weir.get("cpu_s_per_million"), flink.get("cpu_s_per_million")),
    }
    return entry


def _num(value: float | None, fmt: str = "{:,.0f}") -> str:
    return "–" if value is None else fmt.format(value)


def _count(check: dict[str, Any], side: str) -> str:
    count = check.get(side)
    if count is None:
        return "–"
    return f"{count:,} ({check.get(f'{side}_check')})"


def render_markdown(document: dict[str, Any]) -> str:
    kind = "quick run" if document.get("quick") else "full run"
    lines = [
        "# Nexmark: Weir vs Apache Flink",
        "",
        f"Run `{document['run_id']}` ({kind}) at `{document.get('commit', '?')}`, {document.get('measured_at', '')}; "
        f"{document['events']:,} events in {document['partitions']} partitions, parallelism {document['parallelism']}, "
        f"a checkpoint every second, exactly-once Kafka sinks on both sides. Host: "
        f"{document.get('host', {}).get('cpus', '?')} CPUs; load average at start / end "
        f"{_loads(document.get('load_average_at_start'))} / {_loads(document.get('load_average_at_end'))}.",
        "",
        "events/s: input events over the time from the job running to the job finished; CPU s / M: CPU "
        "seconds per million input events over that span, of Weir's JobManager + TaskManagers and of "
        "Flink's JVM. Ratios are Weir / Flink (events/s above 1: Weir faster; CPU below 1: Weir cheaper).",
        "",
        "| query | Weir events/s | Flink events/s | ratio | Weir CPU s / M | Flink CPU s / M | ratio "
        "| Weir output | Flink output | expected | Weir = Flink |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- | ---: | --- |",
    ]
    for query, entry in document.get("queries", {}).items():
        weir, flink = entry.get("weir") or {}, entry.get("flink") or {}
        r, check = entry.get("ratios", {}), entry.get("check", {})
        same = {True: "yes", False: "**no**", None: "–"}[check.get("weir_equals_flink")]
        lines.append(
            f"| {query} | {_num(weir.get('events_per_s'))} | {_num(flink.get('events_per_s'))} "
            f"| {_num(r.get('events_per_s_weir_vs_flink'), '{:.2f}x')} "
            f"| {_num(weir.get('cpu_s_per_million'), '{:.1f}')} | {_num(flink.get('cpu_s_per_million'), '{:.1f}')} "
            f"| {_num(r.get('cpu_per_event_weir_vs_flink'), '{:.2f}x')} "
            f"| {_count(check, 'weir')} | {_count(check, 'flink')} | {_num(check.get('expected'))} | {same} |"
        )
    notes = []
    for query, entry in document.get("queries", {}).items():
        for side in ("weir", "flink"):
            error = (entry.get(side) or {}).get("error")
            if error:
                notes.append(f"- {query}, {side}: {error}")
        whole = (entry.get("flink") or {}).get("jvm_cpu_s_whole")
        if whole is not None:
            notes.append(
                f"- {query}: Flink JVM CPU over its whole life (start-up, SQL planning) {whole:.1f} s; "
                f"job running {entry['flink'].get('seconds', 0):.1f} s"
            )
    if document.get("flink_unavailable"):
        notes.append(f"- Flink not run: {document['flink_unavailable']}")
    if document.get("skipped"):
        notes.append(f"- requested but without a Weir job file: {', '.join(document['skipped'])}")
    reference = document.get("reference_events")
    notes.append(
        f"- expected counts: the plain-Python reference over the same {reference:,} events"
        if reference
        else "- expected counts: q0 and q1 the number of bids; the other queries compared Weir against Flink only"
    )
    lines += ["", "Notes:", "", *notes, ""]
    return "\n".join(lines)


def _loads(loads: Sequence[float] | None) -> str:
    return "?" if not loads else " ".join(f"{x:.1f}" for x in loads)


def chart(document: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import StrMethodFormatter

    queries = list(document.get("queries", {}))
    entries = [document["queries"][q] for q in queries]

    def values(side: str, key: str) -> list[float]:
        return [((e.get(side) or {}).get(key) or 0.0) for e in entries]

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    width = 0.38
    xs = range(len(queries))
    for axis, key, ylabel, title, fmt in (
        (left, "events_per_s", "events/s (running to finished)", "Throughput, exactly-once", "{:,.0f}"),
        (right, "cpu_s_per_million", "CPU s per million events", "CPU per event", "{:.1f}"),
    ):
        weir, flink = values("weir", key), values("flink", key)
        axis.bar([x - width / 2 for x in xs], weir, width, label="Weir", color="#1f6fb2")
        axis.bar([x + width / 2 for x in xs], flink, width, label="Apache Flink (SQL)", color="#999999")
        for x, (w, f) in enumerate(zip(weir, flink, strict=True)):
            axis.annotate(fmt.format(w), (x - width / 2, w), ha="center", va="bottom", fontsize=7)
            axis.annotate(fmt.format(f), (x + width / 2, f), ha="center", va="bottom", fontsize=7)
        axis.set_xticks(list(xs), queries)
        axis.set_ylabel(ylabel)
        axis.yaxis.set_major_formatter(StrMethodFormatter("{x:,.0f}" if key == "events_per_s" else "{x:,.1f}"))
        axis.set_title(title)
        axis.legend(fontsize=8)
    kind = "quick run" if document.get("quick") else "full run"
    fig.suptitle(f"Nexmark, Weir vs Flink ({kind} {document['run_id']}, {document['events']:,} events)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# Running the contenders ------------------------------------------------------------------------------------


def count_output(endpoints: Any, topic: str) -> int:
    from bench import dataset
    from weir.connectors import kafka

    dataset.wait_output_settled(endpoints, topic)
    return len(kafka.read_committed_records(endpoints, topic, timeout_s=300))


def run_weir(cluster: BenchCluster, query: str, input_topic: str, output_topic: str, events: int) -> dict[str, Any]:
    from bench import dataset

    endpoints = cluster.env.endpoints
    dlq = f"{output_topic}-dlq"
    dataset.create_topics(endpoints, {output_topic: PARTITIONS, dlq: 1})
    params = {
        "source": "kafka",
        "source.topic": input_topic,
        "source.bounded": "true",
        "source.dlq_topic": dlq,
        "sink": "kafka",
        "sink.topic": output_topic,
        "checkpointing.interval": "1s",
    }
    sampler = ProcessSampler().start()
    sampler.track(cluster.process_pids())
    submitted = time.monotonic()
    job_id = cluster.submit(EXAMPLES_DIR / f"{query}.py", params, PARALLELISM)
    marks: dict[str, float] = {}

    def on_poll(status: Any) -> None:
        if "running" not in marks and status.tasks and all(t.state == "RUNNING" for t in status.tasks):
            sampler.refresh()
            marks["running"] = time.monotonic()
            marks["cpu_running"] = sampler.total_cpu_s()

    try:
        cluster.wait_job(job_id, lambda s: s.summary.status == "FINISHED", JOB_TIMEOUT_S, "FINISHED", on_poll)
    except BenchError:
        cluster.cancel(job_id)
        raise
    finally:
        sampler.stop()
    finished = time.monotonic()
    running = marks.get("running", submitted)
    out = figures(events, finished - running, sampler.total_cpu_s() - marks.get("cpu_running", 0.0))
    out.update(
        job_id=job_id,
        submit_to_running_s=running - submitted,
        cluster_cpu_s_submit_to_finished=sampler.total_cpu_s(),
        peak_rss_bytes=sampler.peak_rss_by_process(),
        output_records=count_output(endpoints, output_topic),
    )
    return out


def flink_sql_argv(
    build_dir: Path,
    *,
    query: str,
    bootstrap: str,
    topic: str,
    output: str,
    group: str,
    checkpoint_dir: Path,
    rest_port: int,
) -> list[str]:
    """The JVM of one query (its REST port: NexmarkSql polls it for every task RUNNING)."""
    return [
        "java",
        "-cp",
        f"{build_dir / 'weir-bench-flink.jar'}:{build_dir / 'lib'}/*",
        FLINK_SQL_MAIN,
        "--query",
        query,
        "--bootstrap",
        bootstrap,
        "--topic",
        topic,
        "--output",
        output,
        "--group",
        group,
        "--checkpoint-dir",
        str(checkpoint_dir),
        "--parallelism",
        str(PARALLELISM),
        "--rest-port",
        str(rest_port),
    ]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def parse_marker(line: str) -> tuple[str, int] | None:
    """``@running <ms>`` / ``@done <ms>`` of NexmarkSql's stdout, else None."""
    parts = line.split()
    if len(parts) == 2 and parts[0] in ("@running", "@done") and parts[1].isdigit():
        return parts[0][1:], int(parts[1])
    return None


def run_flink(
    build_dir: Path, env: Any, query: str, input_topic: str, output_topic: str, events: int, work_dir: Path
) -> dict[str, Any]:
    from bench import dataset

    endpoints = env.endpoints
    dataset.create_topics(endpoints, {output_topic: PARTITIONS})
    checkpoints = work_dir / f"flink-{query}-checkpoints"
    checkpoints.mkdir(parents=True, exist_ok=True)
    log_path = work_dir / f"flink-{query}.log"
    argv = flink_sql_argv(
        build_dir,
        query=query,
        bootstrap=endpoints.kafka_bootstrap,
        topic=input_topic,
        output=output_topic,
        group=f"{output_topic}-group",
        checkpoint_dir=checkpoints,
        rest_port=free_port(),
    )
    sampler = ProcessSampler().start()
    marks: dict[str, float] = {}
    events_seen = threading.Event()
    with log_path.open("w") as log_file:
        proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log_file, text=True, cwd=work_dir
        )
        sampler.add("flink-jvm", proc.pid)

        def read() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                marker = parse_marker(line)
                if marker is None:
                    log_file.write(line)
                    continue
                sampler.refresh()
                marks[marker[0]] = time.monotonic()
                marks[f"cpu_{marker[0]}"] = sampler.total_cpu_s()
                if marker[0] == "done":
                    events_seen.set()
            events_seen.set()

        reader = threading.Thread(target=read, name=f"flink-{query}-stdout", daemon=True)
        reader.start()
        try:
            if not events_seen.wait(JOB_TIMEOUT_S):
                raise BenchError(f"Flink {query} did not finish in {JOB_TIMEOUT_S:.0f} s (log: {log_path})")
            if "done" not in marks:
                raise BenchError(f"Flink {query} exited without finishing the job (log: {log_path})")
        finally:
            with contextlib.suppress(OSError):
                assert proc.stdin is not None
                proc.stdin.close()
            reaped = reap(proc, 30.0)
            if reaped is None:
                proc.kill()
                reaped = reap(proc, 10.0)
            sampler.stop()
    out = figures(events, marks["done"] - marks["running"], marks["cpu_done"] - marks["cpu_running"])
    out.update(
        jvm_cpu_s_whole=reaped.cpu_s if reaped else None,
        peak_rss_bytes={"flink-jvm": reaped.peak_rss_bytes} if reaped else sampler.peak_rss_by_process(),
        output_records=count_output(endpoints, output_topic),
    )
    return out


def flink_ready() -> tuple[Path | None, str | None]:
    from bench.contenders import flink_available, flink_build_dir

    reason = flink_available()
    return (None, reason) if reason else (flink_build_dir(), None)


def load_events(endpoints: Any, topic: str, events: int) -> float:
    from bench import dataset
    from weir.connectors import kafka
    from weir.tools import nexmark_load

    dataset.create_topics(endpoints, {topic: PARTITIONS})
    producer = kafka.producer(endpoints, linger_ms=50, batch_num_messages=10_000, enable_idempotence=True)
    started = time.monotonic()
    nexmark_load.load(producer, topic, PARTITIONS, events)
    return time.monotonic() - started


def measure(
    label: str, queries_out: dict[str, Any], query: str, side: str, run: Callable[[], dict[str, Any]]
) -> dict[str, Any] | None:
    log(f"{query}: {label}")
    try:
        result = run()
    except BenchError as exc:
        log(f"  failed: {exc}")
        queries_out.setdefault(query, {})[side] = {"error": str(exc)}
        return None
    queries_out.setdefault(query, {})[side] = result
    log(
        f"  {result['events_per_s'] or 0:,.0f} events/s, {result['cpu_s_per_million'] or 0:.1f} CPU s / M, "
        f"{result['output_records']:,} output records"
    )
    return result


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.nexmark_bench", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_EVENTS:,} events, q0-q2")
    parser.add_argument("--events", type=int, help=f"events to load (default {FULL_EVENTS:,}; quick {QUICK_EVENTS:,})")
    parser.add_argument("--queries", help="comma-separated, e.g. q0,q1 (default: every query with a job file)")
    parser.add_argument("--contenders", default="weir,flink", help="weir,flink (default both)")
    parser.add_argument(
        "--reference-events",
        type=int,
        default=REFERENCE_EVENTS,
        help=f"check against the plain-Python reference when events <= this (default {REFERENCE_EVENTS:,})",
    )
    args = parser.parse_args(argv)
    events = args.events or (QUICK_EVENTS if args.quick else FULL_EVENTS)
    contenders = {c.strip() for c in args.contenders.split(",") if c.strip()}
    queries, skipped = select_queries(
        args.queries.split(",") if args.queries else None, quick=args.quick, present=present_queries()
    )
    if not queries:
        raise BenchError(f"no query to run (skipped, no job file: {skipped})")
    with_flink_sql = flink_queries()
    build_dir, flink_unavailable = (None, "not asked (--contenders)")
    if "flink" in contenders:
        build_dir, flink_unavailable = flink_ready()
        if flink_unavailable:
            log(f"Flink not run: {flink_unavailable}")

    run_id = new_run_id()
    env = prepare_environment(run_id, checkpoints_in_s3=True)
    ensure_services(env.endpoints, env.services_run_dir)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO_ROOT)
    document: dict[str, Any] = {
        "benchmark": "nexmark",
        "run_id": run_id,
        "quick": args.quick,
        "commit": commit.stdout.strip() or None,
        "measured_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "host": host_summary(),
        "load_average_at_start": os.getloadavg(),
        "events": events,
        "partitions": PARTITIONS,
        "parallelism": PARALLELISM,
        "selected": queries,
        "skipped": skipped,
        "flink_unavailable": flink_unavailable,
        "queries": {},
    }
    input_topic = f"bench-{run_id}-nexmark"
    failed = False
    from bench import dataset

    try:
        log(f"loading {events:,} Nexmark events into {input_topic}")
        document["load_s"] = load_events(env.endpoints, input_topic, events)
        log(f"  loaded in {document['load_s']:.1f} s")
        results: dict[str, Any] = document["queries"]
        with contextlib.ExitStack() as stack:
            cluster = stack.enter_context(private_cluster(env)) if "weir" in contenders else None
            if cluster is not None:
                cluster.wait_all_taskmanagers()
            for query in queries:  # Weir then Flink per query: each pair measured minutes apart at most
                if cluster is not None:
                    weir_run = functools.partial(
                        run_weir, cluster, query, input_topic, f"bench-{run_id}-weir-{query}", events
                    )
                    failed = measure("Weir", results, query, "weir", weir_run) is None or failed
                if build_dir is None:
                    continue
                if query not in with_flink_sql:
                    results.setdefault(query, {})["flink"] = {"error": f"no Flink SQL for {query}"}
                    continue
                flink_run = functools.partial(
                    run_flink, build_dir, env, query, input_topic, f"bench-{run_id}-flink-{query}", events, env.run_root
                )
                failed = measure("Flink SQL", results, query, "flink", flink_run) is None or failed
        reference: dict[str, int] = {}
        if events <= args.reference_events:
            log(f"reference counts over {events:,} events (plain Python)")
            reference = reference_counts(events, queries)
            document["reference_events"] = events
        for query in queries:
            entry = results.setdefault(query, {})
            entry["check"] = check_outputs(
                query,
                expected_count(query, events, reference),
                (entry.get("weir") or {}).get("output_records"),
                (entry.get("flink") or {}).get("output_records"),
            )
            add_ratios(entry)
        results_order = {q: results[q] for q in queries if q in results}
        document["queries"] = results_order
        document["load_average_at_end"] = os.getloadavg()
    finally:
        with contextlib.suppress(Exception):
            dataset.delete_topics_containing(env.endpoints, run_id)
        with contextlib.suppress(Exception):
            remove_checkpoints(env)
        remove_run_root(env, keep=failed)
    publish_results("nexmark", document, render_markdown)
    chart(document, RESULTS_DIR / "nexmark.png")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BenchError as exc:
        print(f"bench: error: {exc}", file=sys.stderr)
        sys.exit(1)
