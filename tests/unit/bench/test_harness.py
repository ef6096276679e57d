"""The benchmark's small statistics and its memory verdict."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench import harness
from bench.harness import ProcessSampler, ProcessUsage, median, percentile
from bench.run import memory_verdict

BURN = """
import sys, time
while time.process_time() < 0.5:
    pass
print("burnt", flush=True)
sys.stdin.read()
"""


def test_a_process_started_by_the_run_is_counted_from_its_birth() -> None:
    """Weir's cluster is started inside its run, as Flink's JVM is: the CPU its processes spent
    before the sampler first saw them (start-up) counts too."""
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", BURN], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline() == "burnt\n"  # 0.5 CPU s spent by now
        from_birth, from_now = ProcessSampler(), ProcessSampler()
        from_birth.add("taskmanager-1", child.pid, from_birth=True)
        from_now.add("s3-server", child.pid)
        assert from_birth.total_cpu_s() >= 0.4  # /proc counts in clock ticks
        assert from_now.total_cpu_s() == 0.0  # counted from its first sample: nothing yet
        assert from_birth.cpu_by_name() == {"taskmanager-1": from_birth.total_cpu_s()}
        from_birth.add("taskmanager-1", child.pid, from_birth=True)  # tracked again: still counted once
        assert len(from_birth.usage) == 1
    finally:
        assert child.stdin is not None
        child.stdin.close()
        child.wait(10)


def test_percentile_interpolates_and_median_skips_missing() -> None:
    assert percentile([], 50) is None
    assert percentile([3.0], 99) == 3.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == pytest.approx(2.5)
    assert percentile(list(map(float, range(101))), 99) == pytest.approx(99.0)
    assert median([None, 1.0, 3.0]) == 2.0
    assert median([None]) is None


def _sampler(series_mib: dict[str, list[float]]) -> ProcessSampler:
    sampler = ProcessSampler(keep_series=True)
    for pid, (name, series) in enumerate(series_mib.items(), start=1):
        rss = [int(mib * 2**20) for mib in series]
        sampler.usage[pid] = ProcessUsage(name, pid, 0.0, 0.0, max(rss), [(i * 0.5, r) for i, r in enumerate(rss)])
    return sampler


def test_memory_is_flat_when_rss_settles_after_warm_up() -> None:
    verdict = memory_verdict(_sampler({"taskmanager-1": [100, 150, 160] + [161] * 37}), 1000, 10.0, False)
    assert verdict["flat"] is True
    assert verdict["source_eps"] == 100.0


def test_memory_growing_past_the_allowance_is_not_flat() -> None:
    growing = [100 + 3 * i for i in range(40)]  # +3 MiB per sample: ~90 MiB from 2nd to 4th quarter
    verdict = memory_verdict(_sampler({"taskmanager-1": [150] * 40, "taskmanager-2": growing}), 1000, 10.0, False)
    assert verdict["flat"] is False
    assert verdict["taskmanagers"]["taskmanager-1"]["flat"] is True
    assert verdict["taskmanagers"]["taskmanager-2"]["flat"] is False


def test_services_started_by_a_run_live_in_the_shared_run_directory_not_the_runs_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A service started in the run's private directory outlived it (the run deletes it) and kept its
    # port: the next test session's S3 could not start.
    monkeypatch.setenv("WEIR_RUN_DIR", str(tmp_path / "shared"))
    monkeypatch.delenv("WEIR_CHECKPOINT_DIR", raising=False)
    env = harness.prepare_environment("r1", checkpoints_in_s3=False)
    assert env.run_root == tmp_path / "shared" / "bench-r1"
    assert os.environ["WEIR_RUN_DIR"] == str(env.run_root)  # the cluster's processes inherit the private one
    started_in = harness.services_environment(os.environ, env.services_run_dir)
    assert started_in["WEIR_RUN_DIR"] == str(tmp_path / "shared")
    assert harness.services_environment({"A": "1"}, None) == {"A": "1"}


def test_proc_stat_is_read_past_a_command_name_with_spaces_and_parentheses() -> None:
    ticks, page = os.sysconf("SC_CLK_TCK"), os.sysconf("SC_PAGE_SIZE")
    # pid (comm) state ppid ... utime(14)=250 stime(15)=50 cutime(16)=30 cstime(17)=20 ... starttime(22)=777
    # vsize(23) rss(24)=1000
    rest = ["S", "1", "2", "3", "4", "5", "6", "7", "8", "9", "10", "250", "50", "30", "20", "20", "0", "1", "0"]
    rest += ["777", "123456", "1000"]
    stat = harness.parse_proc_stat("42 (python3 -m (x)) " + " ".join(rest) + " 0 0")
    assert stat.cpu_s == pytest.approx(300 / ticks)
    assert stat.reaped_children_cpu_s == pytest.approx(50 / ticks)
    assert stat.start_ticks == 777
    assert stat.rss_bytes == 1000 * page
    assert not stat.zombie
    assert harness.parse_proc_stat("42 (java) Z " + " ".join(rest[1:]) + " 0").zombie
    assert harness.read_proc_stat(os.getpid()) is not None


def test_child_pids_are_the_live_children_of_a_process() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        assert child.pid in harness.child_pids(os.getpid())
        assert harness.child_pids(child.pid) == []
    finally:
        assert child.stdin is not None
        child.stdin.close()
        child.wait(30)
    assert child.pid not in harness.child_pids(os.getpid())
    assert harness.child_pids(2**22 + 1) == []  # no such process


def test_machine_cpu_counts_busy_and_stolen_seconds_since_boot() -> None:
    first = harness.machine_cpu()
    deadline = time.process_time() + 0.05
    while time.process_time() < deadline:
        pass
    second = harness.machine_cpu()
    assert second.busy_s > first.busy_s > 0
    assert second.stolen_s >= first.stolen_s >= 0
