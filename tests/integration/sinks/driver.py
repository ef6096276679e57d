"""Runs a transactional sink through checkpoints in its own process, for a crash point to kill it.

``python -m tests.integration.sinks.driver HEX`` where HEX is the pickled arguments: ``kind`` (kafka or
postgres), ``job_id``, ``uid``, ``topic``/``marker_topic`` or ``table``, ``epochs`` (the values of each
checkpoint epoch; epoch i ends with checkpoint i+1) and ``snapshot_dir``. Each checkpoint's snapshot is
written to ``snapshot_dir/{checkpoint}.snapshot`` before its completion is notified, as the JobManager
stores a checkpoint before it notifies. Without a crash the process exits 0.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from tests.integration.sinks.conftest import KafkaSinkCase, PostgresSinkCase
from weir.core.config import Endpoints
from weir.core.serde import loads_value
from weir.operators.base import StreamOperator


def build(arguments: dict[str, Any]) -> StreamOperator:
    endpoints = Endpoints.from_env()
    if arguments["kind"] == "kafka":
        case = KafkaSinkCase(
            endpoints, arguments["job_id"], arguments["uid"], arguments["topic"], arguments["marker_topic"]
        )
        return case.sink()
    return PostgresSinkCase(endpoints, arguments["job_id"], arguments["uid"], arguments["table"]).sink()


def main() -> None:
    arguments = loads_value(bytes.fromhex(sys.argv[1]))
    directory = Path(arguments["snapshot_dir"])
    sink = build(arguments)
    sink.open()
    for index, values in enumerate(arguments["epochs"]):
        checkpoint_id = index + 1
        for value in values:
            sink.process(value, int(time.time()) * 1000)  # now: older records fall to retention
        snapshot = sink.snapshot_state(checkpoint_id)
        assert snapshot is not None
        (directory / f"{checkpoint_id}.snapshot").write_bytes(snapshot)
        sink.notify_checkpoint_complete(checkpoint_id)
    sink.close()


if __name__ == "__main__":
    main()
