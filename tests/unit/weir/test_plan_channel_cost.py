"""Numbering a job's channels costs as many steps as it has channels: the JobManager numbers every
channel of every subtask while it places an attempt, with its lock held (``bench/jm_scale.py``
measured 17 s for five vertices at parallelism 200 when each output channel renumbered its
consumer's inputs)."""

from __future__ import annotations

from typing import Any

import pytest

from weir import plan as plan_module
from weir.api import Environment
from weir.plan import JobPlan, build_plan


def _all_to_all(parallelism: int) -> JobPlan:
    env = Environment("channels", parallelism=parallelism)
    events = env.from_generator(lambda i: i, uid="source", count=10)
    keyed = events.rebalance().map(lambda e: e, uid="parse").key_by(lambda e: e).reduce(lambda a, b: b, uid="sum")
    keyed.rebalance().print(uid="sink")
    return build_plan(env.graph)


def test_the_output_channels_of_every_subtask_take_no_more_records_than_the_job_has_channels(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    plan = _all_to_all(8)
    built = 0
    real = plan_module.InputChannel

    def counting(*args: Any, **kwargs: Any) -> Any:
        nonlocal built
        built += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(plan_module, "InputChannel", counting)
    channels = 0
    for vertex in plan.vertices.values():
        for s in range(vertex.parallelism):
            channels += len(plan.output_channels(vertex.uid, s))
    assert channels == 3 * 8 * 8
    assert built <= channels


def test_each_output_channel_lands_on_the_consumer_channel_its_producer_feeds() -> None:
    plan = _all_to_all(5)
    for vertex in plan.vertices.values():
        for s in range(vertex.parallelism):
            for out in plan.output_channels(vertex.uid, s):
                target = plan.input_channels(out.consumer_vertex, out.consumer_subtask)[out.consumer_channel]
                assert (target.producer_vertex, target.producer_subtask) == (vertex.uid, s)
                assert target.edge is vertex.outputs[out.edge_index]
