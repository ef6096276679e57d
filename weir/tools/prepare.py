"""``python -m weir.tools.prepare``: what the example job needs before its first ``weir run``.

Creates, where missing, the checkpoint bucket, the demo's topics (``events``, ``window-results``,
``events-dlq``) and table (``window_results``), with the same definitions as ``make demo``; with
``--events N`` (compose's init service: 200,000, the demo's input), it also fills ``events`` when
that topic has never held a record. Unlike ``make demo`` it never drops anything: run it again and it changes
nothing, so compose can run it on every ``up``. Exit 0 when all is in place, 1 with one line naming
the service that failed.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import structlog

from weir.connectors import kafka, postgres, s3
from weir.core import logs
from weir.core.config import Endpoints
from weir.core.errors import WeirError
from weir.tools.demo import TABLE, TABLE_DEFINITION, TOPICS, demo_events
from weir.tools.events import produce_events

log = structlog.get_logger("weir.prepare")


@dataclass(frozen=True)
class Inputs:
    """What a job needs in place: topics (name -> partitions), a table, and the topic it reads."""

    topics: Mapping[str, int]
    table: str
    table_definition: str
    input_topic: str


DEMO_INPUTS = Inputs(TOPICS, TABLE, TABLE_DEFINITION, "events")


def prepare(endpoints: Endpoints, inputs: Inputs, events: int) -> None:
    """Create what is missing; fill the input topic with ``events`` demo events if it never held any."""
    created_bucket = s3.ensure_bucket(endpoints, endpoints.s3_bucket)
    log.info("bucket_ready", bucket=endpoints.s3_bucket, created=created_bucket)
    kafka.create_topics(endpoints, inputs.topics)
    log.info("topics_ready", topics=sorted(inputs.topics))
    created_table = postgres.create_table_if_missing(endpoints, inputs.table, inputs.table_definition)
    log.info("table_ready", table=inputs.table, created=created_table)
    if not events:
        return
    if any(kafka.end_offsets(endpoints, inputs.input_topic).values()):
        log.info("events_kept", topic=inputs.input_topic, reason="the topic has held records before")
        return
    written = produce_events(endpoints, inputs.input_topic, replace(demo_events(), count=events))
    log.info("events_produced", topic=inputs.input_topic, records=written)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m weir.tools.prepare", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--events", type=int, default=0, metavar="N", help="fill the empty topic events with N demo events (0: none)"
    )
    args = parser.parse_args(argv)
    logs.configure("prepare")
    try:
        prepare(Endpoints.from_env(), DEMO_INPUTS, args.events)
    except WeirError as exc:
        sys.stderr.write(f"prepare: {exc}\n")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
