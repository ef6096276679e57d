"""``weir test --failures`` over examples/keyed_aggregation.py: CPU and wall seconds, this tree against
a baseline commit, in alternating runs (``make bench-jobtest``).

Input: ``--records`` events ``{"id": str(i), "key": f"k{i % 7}", "value": i % 13, "ts": 1000 + 37 * i}``
(the example's own test, tests/unit/examples/test_examples_under_failures.py, with more records),
written as JSON lines; a checkpoint every 1,000 records (``weir test``'s default), so 10,000 records
give 11 checkpoints, 33 failure points and 35 runs. Each run is a new process (``python -c``, the
tree on ``PYTHONPATH``) that calls ``weir.tools.jobtest.check_job`` and reports its own
``time.process_time`` and ``time.perf_counter`` around the call (imports excluded); a second figure
is the whole command ``python -m weir.tools.cli test ... --failures``, wall and the child's CPU
(user + system, ``resource.getrusage``), imports included; the command's start is measured the same
way on ``weir test`` over 100 records without failures, and on ``python -m weir.tools.cli --help``,
the CLI's start alone. The baseline and this tree's HEAD (the
committed state) are each ``git archive``d into a temporary directory (with this tree's generated
``weir/wire`` modules). Runs alternate baseline, head, baseline, ...; the figures are medians over
``--repeats`` runs each. The machine is shared: CPU seconds are the comparable figure, wall seconds
show the load (the load averages are in the provenance line). Writes ``bench/results/jobtest.json`` and ``jobtest.md``.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import provenance

RESULTS = Path(__file__).resolve().parent / "results"
REPO_ROOT = Path(__file__).resolve().parent.parent
JOB = "examples/keyed_aggregation.py"
SOURCE_UID = "events-source"
START_RECORDS = 100
"""The records of the start measurement (``weir test`` without failures): its cost is the start."""

IN_PROCESS = """
import json, sys, time
from pathlib import Path
from weir.tools.jobtest import check_job, read_jsonl, records_of_lines
inputs = {%(uid)r: records_of_lines(read_jsonl(Path(sys.argv[1])))}
cpu, wall = time.process_time(), time.perf_counter()
report = check_job(Path(%(job)r), inputs, failures=True)
cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
print(json.dumps({"cpu_s": cpu, "wall_s": wall, "ok": report.ok, "runs": report.runs,
                  "failure_points": len(report.failure_points), "checkpoints": report.reference.checkpoints}))
"""


def write_events(path: Path, records: int) -> None:
    with path.open("w") as f:
        for i in range(records):
            f.write(json.dumps({"id": str(i), "key": f"k{i % 7}", "value": i % 13, "ts": 1_000 + 37 * i}) + "\n")


def export_baseline(commit: str, into: Path) -> Path:
    """A commit's files in ``into`` (its generated gRPC modules taken from this tree)."""
    archive = subprocess.run(["git", "archive", commit], cwd=REPO_ROOT, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    for generated in (REPO_ROOT / "weir" / "wire").glob("*_pb2*.py*"):
        shutil.copy(generated, into / "weir" / "wire" / generated.name)
    return into


def _env(tree: Path) -> dict[str, str]:
    return {"PYTHONPATH": str(tree), "WEIR_LOCAL_MODE": "true", "PATH": "/usr/bin:/bin"}


def in_process(tree: Path, events: Path) -> dict[str, Any]:
    script = IN_PROCESS % {"uid": SOURCE_UID, "job": JOB}
    out = subprocess.run(
        [sys.executable, "-c", script, str(events)], cwd=tree, env=_env(tree), capture_output=True, text=True
    )
    if out.returncode != 0:
        raise RuntimeError(f"check_job in {tree} failed: {out.stderr.strip().splitlines()[-1:]}")
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def command(tree: Path, events: Path) -> dict[str, Any]:
    return _whole_process(
        tree, ["test", JOB, "--source", f"{SOURCE_UID}={events}", "--failures"], f"weir test in {tree}"
    )


def start_command(tree: Path, few_events: Path) -> dict[str, Any]:
    """``weir test`` over a few records without failures: the command's start (imports, loading the
    job) with a run too short to matter."""
    return _whole_process(tree, ["test", JOB, "--source", f"{SOURCE_UID}={few_events}"], f"weir test in {tree}")


def help_command(tree: Path) -> dict[str, Any]:
    """``weir --help``: the CLI's start alone (its imports and the help text)."""
    return _whole_process(tree, ["--help"], f"weir --help in {tree}")


def _whole_process(tree: Path, args: list[str], what: str) -> dict[str, Any]:
    argv = [sys.executable, "-m", "weir.tools.cli", *args]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    wall = time.perf_counter()
    out = subprocess.run(argv, cwd=tree, env=_env(tree), capture_output=True, text=True)
    wall = time.perf_counter() - wall
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if out.returncode != 0:
        raise RuntimeError(f"{what} exited {out.returncode}: {out.stderr.strip()[-300:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"cpu_s": cpu, "wall_s": wall}


def _summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    cpu = [r["cpu_s"] for r in runs]
    wall = [r["wall_s"] for r in runs]
    return {
        "cpu_s_median": statistics.median(cpu),
        "wall_s_median": statistics.median(wall),
        "cpu_s": cpu,
        "wall_s": wall,
    }


def measure(baseline: Path, head: Path, events: Path, few_events: Path, repeats: int) -> dict[str, Any]:
    trees = {"baseline": baseline, "head": head}
    raw: dict[str, dict[str, list[dict[str, Any]]]] = {
        t: {"check_job": [], "command": [], "start": [], "help": []} for t in trees
    }
    shape: dict[str, Any] = {}
    for _ in range(repeats):
        for name, tree in trees.items():
            run = in_process(tree, events)
            if not run["ok"]:
                raise RuntimeError(f"{name}: weir test --failures found a divergence in the example job")
            shape[name] = {k: run[k] for k in ("runs", "failure_points", "checkpoints")}
            raw[name]["check_job"].append(run)
        for name, tree in trees.items():
            raw[name]["command"].append(command(tree, events))
        for name, tree in trees.items():
            raw[name]["start"].append(start_command(tree, few_events))
        for name, tree in trees.items():
            raw[name]["help"].append(help_command(tree))
    return {
        "shape": shape,
        "figures": {name: {kind: _summary(runs) for kind, runs in kinds.items()} for name, kinds in raw.items()},
    }


def markdown(document: dict[str, Any]) -> str:
    shape = document["shape"]["head"]
    lines = [
        "# `weir test --failures` over examples/keyed_aggregation.py (`make bench-jobtest`)",
        "",
        provenance.markdown_line(document.get("provenance")),
        "",
        f"{document['records']:,} records, {shape['checkpoints']} checkpoints, {shape['failure_points']} failure "
        f"points, {shape['runs']} runs; medians of {document['repeats']} alternating runs per tree. Baseline: "
        f"commit `{document['baseline']}`; head: the commit in the line above.",
        "",
        "| what | tree | CPU s (median) | wall s (median) | CPU s, each run | wall s, each run |",
        "| --- | --- | ---: | ---: | --- | --- |",
    ]
    kinds = (
        ("check_job", "`check_job` in process"),
        ("command", "`weir test ... --failures`, whole process"),
        ("start", f"`weir test` over {START_RECORDS} records, whole process"),
        ("help", "`weir --help`, whole process"),
    )
    for kind, what in kinds:
        if kind not in document["figures"]["head"]:
            continue  # results written before the kind was measured
        for tree in ("baseline", "head"):
            f = document["figures"][tree][kind]
            each_cpu = ", ".join(f"{x:.2f}" for x in f["cpu_s"])
            each_wall = ", ".join(f"{x:.2f}" for x in f["wall_s"])
            lines.append(
                f"| {what} | {tree} | {f['cpu_s_median']:.2f} | {f['wall_s_median']:.2f} | {each_cpu} | {each_wall} |"
            )
    figures = document["figures"]
    ratios = [
        f"{what} {figures['head'][kind]['cpu_s_median'] / figures['baseline'][kind]['cpu_s_median']:.2f}"
        for kind, what in kinds
        if kind in figures["head"]
    ]
    lines += ["", f"CPU, head / baseline: {'; '.join(ratios)}.", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.jobtest_bench", description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--baseline", default=None, help="the commit to compare with (default: where this branch left main)"
    )
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    block = provenance.collect(REPO_ROOT, java=None)
    git = ["git", "rev-parse", "--short", args.baseline] if args.baseline else ["git", "merge-base", "HEAD", "main"]
    found = subprocess.run(git, cwd=REPO_ROOT, capture_output=True, text=True, check=True).stdout.strip()
    baseline_commit = found[:7]
    with tempfile.TemporaryDirectory(prefix="weir-jobtest-bench-") as tmp:
        events = Path(tmp) / "events.jsonl"
        write_events(events, args.records)
        few_events = Path(tmp) / "few-events.jsonl"
        write_events(few_events, START_RECORDS)
        baseline = export_baseline(baseline_commit, _mkdir(Path(tmp) / "base"))
        head = export_baseline("HEAD", _mkdir(Path(tmp) / "head"))  # committed state: edits meanwhile do not count
        measured = measure(baseline, head, events, few_events, args.repeats)
    document = {
        "benchmark": "jobtest",
        "records": args.records,
        "repeats": args.repeats,
        "baseline": baseline_commit,
        **measured,
        "provenance": provenance.finish(block),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "jobtest.json").write_text(json.dumps(document, indent=2) + "\n")
    text = markdown(document)
    (args.out / "jobtest.md").write_text(text)
    sys.stdout.write(text)
    return 0


def _mkdir(path: Path) -> Path:
    path.mkdir()
    return path


if __name__ == "__main__":
    sys.exit(main())
