"""A regular join of changelogs on a hot key (``weir.sql.changelog_join``): CPU per change against the
rows the key holds on one side, for two checkouts of Weir (before and after a change to the join's
state), in process, without a cluster.

``python -m bench.changelog_join_bench --before /work/main [--rounds 3] [--rows 10,100,1000,5000]``

The join is bench/flink's ``join_upsert_table.sql`` shape: bids (an append input, rows kept by row)
joined with an upsert table of auction tags (a changelog whose primary key is the join key: one row
per key), ``INNER`` and ``LEFT`` (bids outer). One auction holds N bids (written first, untimed, then a
snapshot flushes them to RocksDB); then, timed with ``time.process_time``:

- ``bid``: 300 more bids of the auction, each one change of the side holding N rows, then a snapshot
  (the flush of what they wrote is part of their cost);
- ``tag``: then 5 updates of the auction's tag (``-U``, ``+U``: 10 changes), each joined with every
  bid the key holds by then (N + 300), then a snapshot.

Each checkout's join runs in its own process (``--measure``, ``PYTHONPATH`` the checkout), rounds
alternating before and after; each figure is the median of the rounds. Results:
``bench/results/changelog-join-hot-key.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BIDS_TIMED = 300
TAG_UPDATES = 5
HOT = 1
JOINS = ("INNER", "LEFT")


def measure(rows_per_key: int, join: str) -> dict[str, float]:
    """CPU µs per change of each kind at ``rows_per_key`` bids of the hot key, with the Weir on the
    path (before or after)."""
    from weir.core.ids import SubtaskIndex
    from weir.core.keygroups import key_group_range_for_subtask
    from weir.operators.base import OperatorContext
    from weir.operators.keyed import KeyedCoProcessOperator
    from weir.sql import changelog_join as cj
    from weir.sql.changelog import Change, RowKind
    from weir.sql.join import JoinedRow
    from weir.taskmanager.state import RocksDBStateBackend

    bid_columns, tag_columns = ("auction", "bidder", "price", "n"), ("auction", "tag", "weight")
    options: dict[str, Any] = {}
    if "kept" in inspect.signature(cj.ChangelogJoin).parameters:  # after: how each side keeps its rows
        options["kept"] = (cj.SideRows(cj.RowsKept.BY_ROW), cj.SideRows(cj.RowsKept.ONE_ROW))
    function = cj.ChangelogJoin(
        JoinedRow("B", "T", bid_columns, tag_columns),
        (dict.fromkeys(bid_columns), dict.fromkeys(tag_columns)),
        outer=(join == "LEFT", False),
        changelogs=(False, True),
        **options,
    )
    emitted = [0]

    class Count:
        def emit(self, value: Any, timestamp: int | None) -> None:
            emitted[0] += 1

        def emit_watermark(self, watermark: int) -> None:
            pass

    with tempfile.TemporaryDirectory(prefix="changelog-join-bench-") as folder:
        backend = RocksDBStateBackend(Path(folder) / "rocksdb")
        op = KeyedCoProcessOperator(function, (lambda bid: (bid["auction"],), lambda c: (c.row["auction"],)))
        op.setup(
            OperatorContext(
                job_id="bench", job_name="bench", uid="join", subtask=0, parallelism=1, max_parallelism=128,
                attempt=1, key_group_range=key_group_range_for_subtask(128, 1, SubtaskIndex(0)), parameters={},
                state=backend,
            ),
            Count(),
        )  # fmt: skip
        op.open()
        tag = {"auction": HOT, "tag": "t0", "weight": 1}
        op.process_input(1, Change(RowKind.INSERT, tag), None)
        for n in range(rows_per_key):
            op.process_input(0, {"auction": HOT, "bidder": n, "price": n, "n": n}, None)
        op.snapshot_state(1)
        started = time.process_time()
        for n in range(rows_per_key, rows_per_key + BIDS_TIMED):
            op.process_input(0, {"auction": HOT, "bidder": n, "price": n, "n": n}, None)
        op.snapshot_state(2)
        bid_us = (time.process_time() - started) / BIDS_TIMED * 1e6
        started = time.process_time()
        for u in range(TAG_UPDATES):
            new = {"auction": HOT, "tag": f"t{u + 1}", "weight": u + 2}
            op.process_input(1, Change(RowKind.UPDATE_BEFORE, tag), None)
            op.process_input(1, Change(RowKind.UPDATE_AFTER, new), None)
            tag = new
        op.snapshot_state(3)
        tag_us = (time.process_time() - started) / (2 * TAG_UPDATES) * 1e6
        backend.close()
    assert emitted[0] > 0
    return {"bid_us": bid_us, "tag_us": tag_us}


def _measure_main(rows: list[int]) -> None:
    out = {f"{join}/{n}": measure(n, join) for join in JOINS for n in rows}
    print(json.dumps(out))


def _run(checkout: Path, rows: list[int]) -> dict[str, dict[str, float]]:
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    argv = [sys.executable, str(Path(__file__).resolve()), "--measure", "--rows", ",".join(map(str, rows))]
    done = subprocess.run(argv, env=env, cwd=checkout, capture_output=True, text=True, check=True)
    result: dict[str, dict[str, float]] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _markdown(result: dict[str, Any]) -> str:
    lines = [
        "# Changelog join on a hot key: CPU µs per change against the rows the key holds",
        "",
        f"`{result['command']}`; before {result['before']['commit']}, after {result['after']['commit']}; "
        f"median of {result['rounds']} alternating rounds; load average before {result['load_before']}, "
        f"after {result['load_after']}; {result['cpus']} CPUs.",
        "",
        "Each bid change faces N bids of its key (the first column); each tag change N + "
        f"{result['bids_timed']} (the timed bids added). A change's CPU includes its share of the snapshot that "
        "follows its phase (RocksDB writes of what it changed).",
        "",
        "| join | bids of the key (N) | bid (µs/change) before | after | tag update (µs/change) before | after |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for key, before in result["median"]["before"].items():
        after = result["median"]["after"][key]
        join, n = key.split("/")
        lines.append(
            f"| {join} | {n} | {before['bid_us']:,.0f} | {after['bid_us']:,.0f} "
            f"| {before['tag_us']:,.0f} | {after['tag_us']:,.0f} |"
        )
    return "\n".join(lines) + "\n"


def _commit(checkout: Path) -> str:
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=checkout, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "weir"], cwd=checkout, capture_output=True, text=True)
    return head.stdout.strip() + (" (uncommitted changes)" if dirty.stdout.strip() else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, help="the checkout to compare with (its weir on the path)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rows", default="10,100,1000,5000")
    parser.add_argument("--measure", action="store_true", help="measure the Weir on the path (one process)")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    args = parser.parse_args()
    rows = [int(n) for n in args.rows.split(",")]
    if args.measure:
        _measure_main(rows)
        return
    if args.before is None:
        parser.error("--before CHECKOUT is needed (or --measure)")
    after = Path(__file__).resolve().parents[1]
    load_before = os.getloadavg()
    runs: dict[str, list[dict[str, dict[str, float]]]] = {"before": [], "after": []}
    for _ in range(args.rounds):
        for name, checkout in (("before", args.before), ("after", after)):
            runs[name].append(_run(checkout, rows))
    load_after = os.getloadavg()
    median = {
        name: {
            key: {m: statistics.median(r[key][m] for r in rounds) for m in ("bid_us", "tag_us")} for key in rounds[0]
        }
        for name, rounds in runs.items()
    }
    result = {
        "command": f"python -m bench.changelog_join_bench --before {args.before} --rounds {args.rounds} "
        f"--rows {args.rows}",
        "before": {"checkout": str(args.before), "commit": _commit(args.before)},
        "after": {"checkout": str(after), "commit": _commit(after)},
        "rounds": args.rounds,
        "bids_timed": BIDS_TIMED,
        "tag_updates": TAG_UPDATES,
        "cpus": os.cpu_count(),
        "load_before": [round(x, 2) for x in load_before],
        "load_after": [round(x, 2) for x in load_after],
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "median": median,
        "runs": runs,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "changelog-join-hot-key.json").write_text(json.dumps(result, indent=2) + "\n")
    (args.out / "changelog-join-hot-key.md").write_text(_markdown(result))
    print(_markdown(result))


if __name__ == "__main__":
    main()
