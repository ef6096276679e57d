"""bench/cpu_cluster.py's summary of py-spy's raw stacks (no cluster: stacks in, text out)."""

from __future__ import annotations

from bench.cpu_cluster import summarize_pyspy

STACKS = [
    "Thread 1 (active+gil);_bootstrap (threading.py:995);run (task.py:10);decode (columnar.py:179) 6",
    "Thread 1 (active+gil);_bootstrap (threading.py:995);run (task.py:10);batch (columnar.py:216) 2",
    "Thread 2 (active);_bootstrap (threading.py:995);serve (server.py:5);wait (threading.py:320) 30",
    "Thread 3 (idle);_bootstrap (threading.py:995);_wait_once (grpc/_common.py:112) 7",
    "not a stack line",
]


def test_busy_samples_are_shared_out_by_leaf_and_by_every_frame_once() -> None:
    summary = summarize_pyspy(STACKS)
    lines = summary.splitlines()
    assert lines[0] == "busy samples 8 (idle left out: 37)"
    own = lines[lines.index("-- self") + 1 : lines.index("-- inclusive")]
    assert own == [" 75.0% decode (columnar.py", " 25.0% batch (columnar.py"]
    inclusive = lines[lines.index("-- inclusive") + 1 :]
    assert "100.0% run (task.py" in inclusive and "100.0% _bootstrap (threading.py" in inclusive
    assert not any("serve" in line or "wait" in line for line in lines[1:])


def test_no_busy_sample_is_said_so() -> None:
    assert summarize_pyspy(STACKS[2:3]) == "busy samples 0 (idle left out: 30)\n-- self\n-- inclusive\n"
