"""Where and when a results file was measured: the commit (and whether the tree held uncommitted
changes), the machine, the load average before and after, the dates.

Every results file of ``bench/`` carries this block as ``provenance`` and its Markdown opens with
:func:`markdown_line`; docs/benchmarks.md is generated from those files (``bench/docs.py``), so a
figure there always names the commit and the machine it was measured on. The parsers are pure
(tested on text); :func:`collect` reads the real sources.
"""

from __future__ import annotations

import os
import platform
import re
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

RESULTS_FORMAT: Final = 2
"""Version of the results files' shared layout (``provenance`` block, runs with their spread);
files without ``results_format`` are version 1 (docs/benchmarks.md, "Results files")."""

OUTPUT_PATHS: Final = ("bench/results/", "docs/benchmarks.md", "docs/benchmarks-jm-scale.md")
"""Paths the benchmarks write themselves (their results, and the pages generated from them by the
bench targets): not counted as uncommitted changes of the code measured."""


def parse_cpu_model(cpuinfo: str) -> str | None:
    """The first ``model name`` of /proc/cpuinfo (x86), else its ``Model`` / ``Hardware`` (ARM)."""
    for label in ("model name", "Model", "Hardware"):
        match = re.search(rf"^{label}\s*:\s*(.+)$", cpuinfo, re.MULTILINE)
        if match:
            return match.group(1).strip()
    return None


def parse_mem_total(meminfo: str) -> int | None:
    """``MemTotal`` of /proc/meminfo, in bytes."""
    match = re.search(r"^MemTotal:\s*(\d+)\s*kB", meminfo, re.MULTILINE)
    return int(match.group(1)) * 1024 if match else None


def parse_java_version(output: str) -> str | None:
    """The version line of ``java -version`` (it prints to stderr), e.g. ``openjdk version
    "17.0.15" 2025-04-15`` -> ``openjdk 17.0.15``."""
    match = re.search(r'^(\S+) version "([^"]+)"', output, re.MULTILINE)
    return f"{match.group(1)} {match.group(2)}" if match else None


def dirty_paths(porcelain: str, ignore: Sequence[str] = OUTPUT_PATHS) -> list[str]:
    """Paths ``git status --porcelain`` lists, but the benchmarks' own output."""
    paths = []
    for line in porcelain.splitlines():
        if len(line) < 4:
            continue
        path = line[3:].split(" -> ")[-1].strip('"')
        if not any(path.startswith(prefix) for prefix in ignore):
            paths.append(path)
    return paths


def _run(argv: Sequence[str], cwd: Path | None = None) -> subprocess.CompletedProcess[str] | None:
    try:
        return subprocess.run(list(argv), capture_output=True, text=True, timeout=30, check=False, cwd=cwd)
    except (OSError, subprocess.TimeoutExpired):
        return None


def git_state(repo: Path) -> dict[str, Any]:
    """The commit checked out in ``repo`` and the uncommitted changes beside it (:data:`OUTPUT_PATHS`
    excluded: the benchmarks write there)."""
    head = _run(["git", "rev-parse", "HEAD"], repo)
    status = _run(["git", "status", "--porcelain", "--untracked-files=all"], repo)
    commit = head.stdout.strip() if head is not None and head.returncode == 0 else None
    changed = dirty_paths(status.stdout) if status is not None and status.returncode == 0 else None
    return {
        "commit": commit,
        "commit_short": commit[:7] if commit else None,
        "dirty": bool(changed) if changed is not None else None,
        "dirty_paths": (changed or [])[:20],
    }


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def machine(java: str | None = "java") -> dict[str, Any]:
    """Cores, memory, CPU model, kernel, Python and Java versions of this machine."""
    java_version = None
    if java is not None:
        probe = _run([java, "-version"])
        java_version = parse_java_version(probe.stderr + probe.stdout) if probe is not None else None
    return {
        "cores": os.cpu_count() or 0,
        "memory_bytes": parse_mem_total(_read("/proc/meminfo")),
        "cpu_model": parse_cpu_model(_read("/proc/cpuinfo")),
        "kernel": f"{platform.system()} {platform.release()}",
        "arch": platform.machine(),
        "python": platform.python_version(),
        "java": java_version,
    }


def utc_now(clock: Callable[[], float] = time.time) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(clock()))


def collect(repo: Path, *, java: str | None = "java") -> dict[str, Any]:
    """The block at the start of a run: commit, machine, load and date."""
    return {
        "results_format": RESULTS_FORMAT,
        **git_state(repo),
        "machine": machine(java),
        "started_at": utc_now(),
        "load_average_before": list(os.getloadavg()),
    }


def finish(block: dict[str, Any]) -> dict[str, Any]:
    """The same block at the end of the run: load and date added."""
    block["ended_at"] = utc_now()
    block["load_average_after"] = list(os.getloadavg())
    return block


def _gib(n: int | None) -> str:
    return "? GiB" if not n else f"{n / 2**30:.1f} GiB"


def _loads(values: Sequence[float] | None) -> str:
    return "?" if not values else " / ".join(f"{v:.2f}" for v in values)


def commit_label(block: Mapping[str, Any] | None) -> str:
    """``abc1234`` or ``abc1234 + uncommitted changes``; ``not recorded`` for older files."""
    if not block or not block.get("commit_short"):
        return "not recorded"
    dirty = block.get("dirty")
    suffix = " + uncommitted changes" if dirty else ("" if dirty is False else " (tree state not recorded)")
    return f"`{block['commit_short']}`{suffix}"


def markdown_line(block: Mapping[str, Any] | None) -> str:
    """One paragraph naming the commit, the machine, the dates and the load averages."""
    if not block:
        return "Provenance not recorded (a results file from before the provenance block)."
    m = block.get("machine") or {}
    return (
        f"Commit {commit_label(block)}; {block.get('started_at', '?')} to {block.get('ended_at', '?')}; "
        f"{m.get('cores', '?')} cores ({m.get('cpu_model') or 'CPU model unknown'}), {_gib(m.get('memory_bytes'))}, "
        f"{m.get('kernel', '?')}, Python {m.get('python', '?')}, Java {m.get('java') or 'not found'}; "
        f"load average (1/5/15 min) {_loads(block.get('load_average_before'))} before, "
        f"{_loads(block.get('load_average_after'))} after."
    )
