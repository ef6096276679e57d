"""CPU microseconds per row of a SQL window aggregation operator alone: the per-record window
operator against the columnar one (``weir.sql.columnar_window``), fed the same rows.

``python -m bench.sql_window_bench [--rows N] [--rounds N]``: Nexmark's bids (``weir.nexmark``, decoded
as the SQL source decodes them) through the window aggregate of Nexmark q5 (HOP 10 s / 2 s, COUNT(*)
per auction) and of q11's TUMBLE form (TUMBLE 10 s, COUNT(*), SUM(price), MAX(price) per bidder),
each operator over its own RocksDB state (as a TaskManager's), a watermark every 500 rows (a source
poll), a checkpoint's snapshot every 100,000 rows, the end of input. Only the operator's own work is
timed (``time.process_time``: CPU, not wall time, which other work on a shared machine disturbs); the
rounds alternate the two paths; each output is checked equal, record for record (a multiset), to the
per-record one's. Results: ``bench/results/cpu-sql-window-operator.json``."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any, Final

from bench.cpu_bench import git_commit
from bench.jobs.nexmark_sql import script
from weir import nexmark
from weir.core.ids import SubtaskIndex
from weir.core.keygroups import key_group_range_for_subtask
from weir.core.watermarks import MAX_WATERMARK
from weir.core.windows import SlidingEventTimeWindows, TumblingEventTimeWindows
from weir.operators.base import OperatorContext
from weir.operators.windows import WindowAggregateOperator
from weir.sql import plan_script
from weir.sql.columnar_window import ColumnarWindowOperator
from weir.sql.compile import Accumulators, RowDecoder, WindowAggregation
from weir.sql.plan import Aggregate, Node, Scan
from weir.taskmanager.state import RocksDBStateBackend

ROOT: Final = Path(__file__).resolve().parent.parent
RESULTS: Final = ROOT / "bench" / "results" / "cpu-sql-window-operator.json"
WATERMARK_EVERY: Final = 500
CHECKPOINT_EVERY: Final = 100_000


class _Output:
    def __init__(self) -> None:
        self.records: list[tuple[Any, int | None]] = []

    def emit(self, value: Any, timestamp: int | None) -> None:
        self.records.append((value, timestamp))

    def emit_watermark(self, watermark: int) -> None:
        pass


def _aggregates(query: str) -> tuple[Aggregate, Scan]:
    (planned,) = plan_script(script(query, False)).inserts
    found: list[Aggregate] = []
    stack: list[Node] = [planned.plan.sink.input]
    scan = None
    while stack:
        node = stack.pop()
        if isinstance(node, Aggregate) and node.window is not None and node.window.kind in ("TUMBLE", "HOP"):
            found.append(node)
        if isinstance(node, Scan):
            scan = node
        for attribute in ("input", "left", "right"):
            child = getattr(node, attribute, None)
            if child is not None:
                stack.append(child)
    assert found and scan is not None
    return next(a for a in found if not _has_aggregate(a.input)), scan  # q5: the count per auction


def _has_aggregate(node: Any) -> bool:
    if isinstance(node, Aggregate):
        return True
    return any(_has_aggregate(getattr(node, a)) for a in ("input", "left", "right") if getattr(node, a, None))


def _rows(aggregate: Aggregate, scan: Scan, rows: int) -> list[tuple[dict[str, Any], int]]:
    """The window's input rows (bids, as the view projects them) with their event times."""
    decoder = RowDecoder(scan.table, script("q5", False))
    config = nexmark.NexmarkConfig()
    out: list[tuple[dict[str, Any], int]] = []
    n = 0
    while len(out) < rows:
        row = decoder.row(nexmark.to_dict(nexmark.event(n, config)))
        n += 1
        if row["event_type"] == 2:
            bid = {k: row[k] for k in ("auction", "bidder", "price", "channel", "url", "extra")}
            bid["dateTime"] = row["rowtime"]
            out.append((bid, row["rowtime"]))
    return out


def run(path: str, aggregate: Aggregate, rows: list[tuple[dict[str, Any], int]], tmp: Path) -> tuple[float, Counter]:
    keys = tuple(k.evaluate for k in aggregate.keys)
    names = tuple(k.name for k in aggregate.keys)

    def key_of(row: Any) -> tuple[Any, ...]:
        return tuple(f(row) for f in keys)

    window = aggregate.window
    assert window is not None
    assigner: Any = (
        TumblingEventTimeWindows(window.size_ms)
        if window.kind == "TUMBLE"
        else SlidingEventTimeWindows(window.size_ms, window.slide_ms)
    )
    fn = WindowAggregation(names, Accumulators(aggregate.calls))
    op: Any = (
        ColumnarWindowOperator(fn, key_of, aggregate.calls, assigner)
        if path == "columnar"
        else WindowAggregateOperator(fn, key_of, assigner, 0)
    )
    backend = RocksDBStateBackend(tmp / f"rocksdb-{path}-{time.monotonic_ns()}")
    context = OperatorContext(
        job_id="bench",
        job_name="bench",
        uid="window",
        subtask=0,
        parallelism=1,
        max_parallelism=128,
        attempt=1,
        key_group_range=key_group_range_for_subtask(128, 1, SubtaskIndex(0)),
        parameters={},
        state=backend,
    )
    out = _Output()
    op.setup(context, out)
    op.open()
    top = 0
    cpu0 = time.process_time()
    for i, (row, ts) in enumerate(rows, 1):
        op.process(row, ts)
        top = max(top, ts)
        if i % WATERMARK_EVERY == 0:
            op.process_watermark(top - 4_000)  # the DDL's WATERMARK delay
        if i % CHECKPOINT_EVERY == 0:
            op.snapshot_state(i // CHECKPOINT_EVERY)
    op.process_watermark(MAX_WATERMARK)
    op.end_input()
    cpu = time.process_time() - cpu0
    backend.close()
    return cpu / len(rows) * 1e6, Counter((tuple(sorted(v.items())), t) for v, t in out.records)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--queries", default="q5,q11-tumble")
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    cases: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="weir-sql-window-bench-") as tmp:
        for query in args.queries.split(","):
            aggregate, scan = _aggregates(query)
            rows = _rows(aggregate, scan, args.rows)
            runs: dict[str, list[float]] = {"record": [], "columnar": []}
            loads: list[float] = []
            expected: Counter | None = None
            for r in range(args.rounds):
                order = ("record", "columnar") if r % 2 == 0 else ("columnar", "record")
                for path in order:
                    loads.append(os.getloadavg()[0])
                    us, output = run(path, aggregate, rows, Path(tmp))
                    if expected is None:
                        expected = output
                    if output != expected:
                        raise SystemExit(f"{query}: the {path} operator's output differs from the other path's")
                    runs[path].append(round(us, 3))
                    print(
                        f"{query}/{path}: {us:.2f} us/row CPU ({len(rows)} rows, {sum(output.values())} out)",
                        flush=True,
                    )
            medians = {p: statistics.median(v) for p, v in runs.items()}
            cases[query] = {
                "window": f"{aggregate.window.kind} {aggregate.window.size_ms}/{aggregate.window.slide_ms} ms"
                if aggregate.window
                else "",
                "aggregates": [c.sql for c in aggregate.calls],
                "rows": len(rows),
                "output_records": sum(expected.values()) if expected else 0,
                "runs_us_per_row": runs,
                "median_us_per_row": medians,
                "spread_us_per_row": {p: [min(v), max(v)] for p, v in runs.items()},
                "ratio_columnar_to_record": round(medians["columnar"] / medians["record"], 3),
                "load_1m_at_each_run": loads,
            }
            print(
                f"{query}: record {medians['record']:.2f} -> columnar {medians['columnar']:.2f} us/row "
                f"({cases[query]['ratio_columnar_to_record']:.2f}x)"
            )
    document = {
        "benchmark": "sql-window-operator",
        "commit": git_commit(),
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "python": sys.version.split()[0],
        "cores": os.cpu_count(),
        "measure": "CPU time (time.process_time) of the window operator alone per input row; medians of "
        "alternating rounds; outputs checked equal as multisets",
        "rounds": args.rounds,
        "watermark_every": WATERMARK_EVERY,
        "checkpoint_every": CHECKPOINT_EVERY,
        "under_load": any(x > (os.cpu_count() or 1) for c in cases.values() for x in c["load_1m_at_each_run"]),
        "cases": cases,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(document, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
