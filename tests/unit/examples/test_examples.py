"""Every example job loads with its default parameters, and the one written with the connectors'
builders (examples/two_sinks.py) makes the job its convenience methods make."""

from __future__ import annotations

from pathlib import Path

import pytest

from weir.api import Environment, load_job_file
from weir.graph import LogicalGraph

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


@pytest.mark.parametrize("job", sorted(EXAMPLES.rglob("*.py")), ids=lambda p: str(p.relative_to(EXAMPLES)))
def test_each_example_loads(job: Path) -> None:
    graph = load_job_file(job).graph
    assert graph.transformations and all(t.uid for t in graph.transformations.values())


def described(graph: LogicalGraph) -> list[tuple[object, ...]]:
    return [
        (t.uid, t.kind, t.name, t.parallelism, t.source_spec, t.sink_spec, t.on_error is None, type(t.factory()))
        for t in graph.transformations.values()
    ] + [(e.source_uid, e.target_uid, e.partitioning) for e in graph.edges]


def test_the_builder_form_makes_the_job_of_the_convenience_methods() -> None:
    parameters = {"source.count": "50", "sink.topic": "out", "sink.table": "rows"}
    loaded = load_job_file(EXAMPLES / "two_sinks.py", parameters)
    env = Environment("two_sinks", parameters)
    events = env.from_generator(loaded.module.event, uid="events", count=50, records_per_second=200)
    events.sink_to_kafka("out", uid="kafka-sink", key=loaded.module.event_key)
    events.sink_to_postgres("rows", uid="postgres-sink", columns=("id", "key", "value"), key_columns=("id",))
    assert described(loaded.graph) == described(env.graph)
