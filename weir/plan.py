"""From the logical graph to the physical plan: operator chains (vertices) and their channels.

An operator is chained to its input when the edge is FORWARD, both sides have the same parallelism
and it has exactly one input (the main output of its predecessor or one of its side outputs); a
chain is a tree rooted at its head, and every subtask of a vertex runs the whole tree in one thread.
Edges between vertices cross the network.

The JobManager and every TaskManager compute the same plan from the same job file, so the channel
numbering below is the contract between producer and consumer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from weir.core.inflight_state import OutputTarget
from weir.core.process_functions import OutputTag
from weir.graph import LogicalGraph, OperatorKind, Partitioning


@dataclass(frozen=True, eq=False)
class NetworkEdge:
    """An edge between two vertices: from an operator inside the producer vertex (its main output,
    or its side output ``side_output``) to a vertex's head."""

    producer_vertex: str
    producer_operator: str
    consumer_vertex: str
    partitioning: Partitioning
    input_index: int
    key_selector: Callable[[Any], Any] | None
    side_output: OutputTag | None = None

    @property
    def target(self) -> OutputTarget:
        """The edge as its producer's unaligned checkpoint names it: unlike its index among the
        producer's outputs, the same in another job (``weir.core.inflight_state``)."""
        side_output = self.side_output.name if self.side_output is not None else None
        return OutputTarget(self.consumer_vertex, self.input_index, self.producer_operator, side_output)


@dataclass
class Vertex:
    uid: str  # the head operator's uid
    operator_uids: list[str]  # topological order, head first
    parallelism: int
    chained: dict[str, list[str]] = field(default_factory=dict)  # operator -> chained successors
    # A chained successor that takes a side output of its predecessor -> that side output (one not
    # named takes the main output).
    chained_side_outputs: dict[str, OutputTag] = field(default_factory=dict)
    inputs: list[NetworkEdge] = field(default_factory=list)
    outputs: list[NetworkEdge] = field(default_factory=list)

    @property
    def is_source(self) -> bool:
        return not self.inputs

    def outputs_of(self, operator_uid: str) -> list[NetworkEdge]:
        return [e for e in self.outputs if e.producer_operator == operator_uid]


@dataclass(frozen=True)
class InputChannel:
    channel: int
    gate: int  # the input index of the head (0, or 1 for the second input of a two-input operator)
    producer_vertex: str
    producer_subtask: int
    edge: NetworkEdge | None = field(default=None, compare=False, repr=False)  # the edge it belongs to


@dataclass(frozen=True)
class OutputChannel:
    edge_index: int  # index into Vertex.outputs
    channel: int  # consumer subtask on that edge
    consumer_vertex: str
    consumer_subtask: int
    consumer_channel: int  # the channel index on the consumer side


@dataclass
class JobPlan:
    graph: LogicalGraph
    vertices: dict[str, Vertex]  # in topological order

    def vertex_of_operator(self, operator_uid: str) -> Vertex:
        for v in self.vertices.values():
            if operator_uid in v.operator_uids:
                return v
        raise KeyError(operator_uid)

    def _input_edges(self, vertex: Vertex) -> list[NetworkEdge]:
        """A vertex's input edges in channel order: by input index, then producer."""
        return sorted(vertex.inputs, key=lambda e: (e.input_index, e.producer_vertex))

    def _channels_of(self, edge: NetworkEdge) -> int:
        """How many channels an edge has into each consumer subtask."""
        return 1 if edge.partitioning is Partitioning.FORWARD else self.vertices[edge.producer_vertex].parallelism

    def input_channels(self, vertex_uid: str, subtask: int) -> list[InputChannel]:
        """Every channel into one subtask, numbered in a stable order."""
        vertex = self.vertices[vertex_uid]
        channels: list[InputChannel] = []
        for edge in self._input_edges(vertex):
            producer = self.vertices[edge.producer_vertex]
            if edge.partitioning is Partitioning.FORWARD:
                producers = [subtask]
            else:
                producers = list(range(producer.parallelism))
            for p in producers:
                channels.append(InputChannel(len(channels), edge.input_index, producer.uid, p, edge))
        return channels

    def output_channels(self, vertex_uid: str, subtask: int) -> list[OutputChannel]:
        """Every channel out of one subtask, with the consumer-side channel index it lands on: the
        edge's first channel on the consumer (the channels of the edges before it in
        ``input_channels``' order) plus the producer subtask (0 on a FORWARD edge). Computed from the
        edges alone, so the channels of a whole job cost as many steps as it has channels."""
        vertex = self.vertices[vertex_uid]
        out: list[OutputChannel] = []
        for index, edge in enumerate(vertex.outputs):
            consumer = self.vertices[edge.consumer_vertex]
            first = 0
            for before in self._input_edges(consumer):
                if before is edge:
                    break
                first += self._channels_of(before)
            forward = edge.partitioning is Partitioning.FORWARD
            consumer_channel = first + (0 if forward else subtask)
            targets = [subtask] if forward else range(consumer.parallelism)
            for target in targets:
                out.append(OutputChannel(index, target, consumer.uid, target, consumer_channel))
        return out

    @property
    def max_parallelism_over_vertices(self) -> int:
        return max(v.parallelism for v in self.vertices.values())


def build_plan(graph: LogicalGraph) -> JobPlan:
    order = list(graph.topological())
    head_of: dict[str, str] = {}
    vertices: dict[str, Vertex] = {}
    for t in order:
        inputs = graph.inputs_of(t.uid)
        parallelism = graph.parallelism_of(t.uid)
        chain_to: str | None = None
        if t.kind is not OperatorKind.SOURCE and t.chainable and len(inputs) == 1:
            edge = inputs[0]
            upstream = graph.transformations[edge.source_uid]
            if (
                edge.partitioning is Partitioning.FORWARD
                and graph.parallelism_of(upstream.uid) == parallelism
                and upstream.kind is not OperatorKind.SINK
                and upstream.chainable
            ):
                chain_to = edge.source_uid
        if chain_to is not None:
            head = head_of[chain_to]
            vertex = vertices[head]
            vertex.operator_uids.append(t.uid)
            vertex.chained.setdefault(chain_to, []).append(t.uid)
            if inputs[0].side_output is not None:
                vertex.chained_side_outputs[t.uid] = inputs[0].side_output
            head_of[t.uid] = head
        else:
            vertices[t.uid] = Vertex(uid=t.uid, operator_uids=[t.uid], parallelism=parallelism)
            head_of[t.uid] = t.uid
    for e in graph.edges:
        producer_head, consumer_head = head_of[e.source_uid], head_of[e.target_uid]
        if producer_head == consumer_head:
            continue  # chained
        net = NetworkEdge(
            producer_vertex=producer_head,
            producer_operator=e.source_uid,
            consumer_vertex=consumer_head,
            partitioning=e.partitioning,
            input_index=e.input_index,
            key_selector=e.key_selector,
            side_output=e.side_output,
        )
        vertices[producer_head].outputs.append(net)
        vertices[consumer_head].inputs.append(net)
    return JobPlan(graph=graph, vertices=vertices)


PLAN_FORMAT = 1
"""The version of :func:`plan_document` (docs/cli.md, ``weir info``)."""


def plan_document(plan: JobPlan) -> dict[str, Any]:
    """The plan as Flink's ``flink info`` prints a job's execution plan (``nodes`` with ``id``,
    ``type``, ``contents``, ``parallelism`` and ``predecessors`` with ``ship_strategy``), plus the
    vertices: the operator chains each subtask runs in one thread (``weir info``, without running)."""
    graph = plan.graph
    nodes: list[dict[str, Any]] = []
    for t in graph.topological():
        nodes.append(
            {
                "id": t.uid,
                "type": t.kind.value,
                "contents": t.name,
                "parallelism": graph.parallelism_of(t.uid),
                "max_parallelism": t.max_parallelism or graph.max_parallelism,
                "predecessors": [
                    {
                        "id": e.source_uid,
                        "ship_strategy": e.partitioning.name,
                        "side": "first" if e.input_index == 0 else "second",
                        **({"side_output": e.side_output.name} if e.side_output is not None else {}),
                    }
                    for e in graph.inputs_of(t.uid)
                ],
            }
        )
    vertices = [
        {
            "id": v.uid,
            "operators": list(v.operator_uids),
            "parallelism": v.parallelism,
            "inputs": [
                {"vertex": e.producer_vertex, "operator": e.producer_operator, "ship_strategy": e.partitioning.name}
                for e in v.inputs
            ],
        }
        for v in plan.vertices.values()
    ]
    return {
        "format": PLAN_FORMAT,
        "name": graph.job_name,
        "default_parallelism": graph.default_parallelism,
        "max_parallelism": graph.max_parallelism,
        "nodes": nodes,
        "vertices": vertices,
    }
