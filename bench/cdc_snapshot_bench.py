"""The PostgreSQL CDC source's snapshot at parallelism 1 vs 2 (and more): wall time and the source's
CPU to read a table of ``--rows`` rows into ``read`` events, each subtask in a process of its own
(as on a cluster's TaskManagers), its events counted and dropped (no sink: the source's own cost).

``python -m bench.cdc_snapshot_bench --rows 200000 --parallelism 1 2 --runs 3 [--serialize]``. Each run takes a new
slot; a reader's handover is driven as a completed checkpoint would (its state taken, then the
completion notified, once its partition is read), and the run ends when subtask 0 streams. Wall:
from the moment every subtask was open (a barrier) to subtask 0 streaming. CPU: the subtasks' processes (user +
system, ``time.process_time``), not the server's backends. Writes ``bench/results/cdc-parallel-
snapshot[-json].json`` and ``.md`` with the machine, the commit and the load average before and after.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import time
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

from psycopg import sql

from bench import provenance
from bench.harness import REPO_ROOT
from weir.connectors import postgres
from weir.core.cdc import Phase
from weir.core.config import Endpoints
from weir.core.descriptors import PostgresCdcSourceSpec
from weir.core.keygroups import KeyGroupRange
from weir.operators.base import OperatorContext
from weir.operators.cdc_source import PostgresCdcSourceOperator

RESULTS = REPO_ROOT / "bench" / "results" / "cdc-parallel-snapshot"


class Counting:
    """Counts the events; with ``serialize``, first writes each as a changelog sink's serializer
    would (``json.dumps(event.to_json())``): per-row work chained to the source, which a parallel
    snapshot spreads over its subtasks."""

    def __init__(self, serialize: bool) -> None:
        self.events = 0
        self.serialize = serialize

    def emit(self, value: Any, timestamp: int | None) -> None:
        if self.serialize:
            json.dumps(value.to_json())
        self.events += 1

    def emit_watermark(self, watermark: int) -> None:
        pass


def subtask_main(
    table: str, slot: str, subtask: int, parallelism: int, chunk_size: int, serialize: bool, start: Any, out: Any
) -> None:
    spec = PostgresCdcSourceSpec((table,), slot, slot, chunk_size=chunk_size)
    operator = PostgresCdcSourceOperator(spec)
    ctx = OperatorContext(
        job_id=f"bench-{slot}",
        job_name="cdc-snapshot-bench",
        uid="cdc",
        subtask=subtask,
        parallelism=parallelism,
        max_parallelism=128,
        attempt=0,
        key_group_range=KeyGroupRange(0, 127),  # type: ignore[arg-type]
        parameters={"checkpointing.interval": "1s"},
        state=None,
    )
    counting = Counting(serialize)
    operator.setup(replace(ctx), counting)
    operator.open()
    start.wait()  # every subtask open (imports, connections), and the bench's clock started
    began_wall, began_cpu = time.monotonic(), time.process_time()
    checkpoint = 0
    while True:
        operator.poll(1000)
        phase = operator._progress.state.phase  # noqa: SLF001 - the bench watches the phase
        if subtask == 0 and phase is Phase.STREAMING:
            break
        if subtask > 0 and phase is Phase.PARTITION_READ:
            checkpoint += 1
            operator.snapshot_state(checkpoint)
            operator.notify_checkpoint_complete(checkpoint)  # as the checkpoint's completion would
            break
        if operator.idle_wait_s():
            time.sleep(operator.idle_wait_s())  # the task's idle wait between polls, as the task loop does
    out.put(
        (subtask, time.monotonic() - began_wall, time.process_time() - began_cpu, counting.events, time.monotonic())
    )
    operator.close()


def run_once(endpoints: Endpoints, table: str, parallelism: int, chunk_size: int, serialize: bool) -> dict[str, Any]:
    slot = f"weir_cdc_bench_{uuid.uuid4().hex[:10]}"
    context = mp.get_context("spawn")
    start, out = context.Barrier(parallelism + 1), context.Queue()
    processes = [
        context.Process(target=subtask_main, args=(table, slot, s, parallelism, chunk_size, serialize, start, out))
        for s in range(parallelism)
    ]
    try:
        for process in processes:
            process.start()
        start.wait(timeout=600)  # every subtask open: the time to start processes is not measured
        started = time.monotonic()
        results = [out.get(timeout=1800) for _ in processes]
        for process in processes:
            process.join(60)
        ended = max(r[4] for r in results if r[0] == 0)
        return {
            "parallelism": parallelism,
            "wall_s": round(ended - started, 3),
            "cpu_s": round(sum(r[2] for r in results), 3),
            "cpu_s_by_subtask": [round(r[2], 3) for r in sorted(results)],
            "events": sum(r[3] for r in results),
        }
    finally:
        with postgres.connect(endpoints, autocommit=True) as conn:
            conn.execute(
                "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = %s", (slot,)
            )
            conn.execute(sql.SQL("DROP PUBLICATION IF EXISTS {}").format(sql.Identifier(slot)))


def render(document: dict[str, Any]) -> str:
    lines = [
        f"# CDC snapshot: {document['rows']:,} rows, chunks of {document['chunk_size']}"
        + (", each event to JSON" if document.get("serialize") else ", events counted only"),
        "",
        f"Load average before/after: {document['load_before']} / {document['load_after']} "
        f"on {os.cpu_count()} cores; {document['runs']} runs each, median (all runs in the JSON).",
        "",
        "| parallelism | wall s | source CPU s | rows/s (wall) |",
        "| --- | --- | --- | --- |",
    ]
    for p, runs in document["by_parallelism"].items():
        wall = statistics.median(r["wall_s"] for r in runs)
        cpu = statistics.median(r["cpu_s"] for r in runs)
        lines.append(f"| {p} | {wall:.2f} | {cpu:.2f} | {document['rows'] / wall:,.0f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--chunk-size", type=int, default=8096)
    parser.add_argument("--parallelism", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--serialize", action="store_true", help="each event to JSON, as a changelog sink would")
    args = parser.parse_args()
    endpoints = Endpoints.from_env()
    table = f"cdc_bench_{uuid.uuid4().hex[:10]}"
    with postgres.connect(endpoints, autocommit=True) as conn:
        conn.execute(
            sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, name text, amount int)").format(sql.Identifier(table))
        )
        conn.execute(
            sql.SQL("INSERT INTO {} SELECT g, 'n' || g, g * 10 FROM generate_series(1, %s) g").format(
                sql.Identifier(table)
            ),
            (args.rows,),
        )
        conn.execute(sql.SQL("VACUUM ANALYZE {}").format(sql.Identifier(table)))
    load_before = [round(x, 2) for x in os.getloadavg()]
    by_parallelism: dict[str, list[dict[str, Any]]] = {str(p): [] for p in args.parallelism}
    try:
        for _ in range(args.runs):  # interleaved, so a change of the machine's load hits every parallelism
            for p in args.parallelism:
                result = run_once(endpoints, table, p, args.chunk_size, args.serialize)
                assert result["events"] == args.rows, result
                by_parallelism[str(p)].append(result)
                print(json.dumps(result), flush=True)
    finally:
        with postgres.connect(endpoints, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(table)))
    document = {
        "format": 1,
        "benchmark": "cdc-parallel-snapshot",
        "rows": args.rows,
        "chunk_size": args.chunk_size,
        "runs": args.runs,
        "serialize": args.serialize,
        "load_before": load_before,
        "load_after": [round(x, 2) for x in os.getloadavg()],
        "by_parallelism": by_parallelism,
        "provenance": provenance.collect(REPO_ROOT, java=None),
    }
    name = f"{RESULTS}{'-json' if args.serialize else ''}"
    Path(f"{name}.json").write_text(json.dumps(document, indent=2) + "\n")
    Path(f"{name}.md").write_text(render(document))
    print(render(document))


if __name__ == "__main__":
    main()
