"""The logical job graph a job file builds: operators with stable uids, joined by partitioned edges.

Every process (the CLI for validation, the JobManager for scheduling, each TaskManager for the user
code of its subtasks) loads the same job file with the same parameters and gets the same graph.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from weir.core.descriptors import SinkSpec, SourceSpec
from weir.core.errors import JobDefinitionError
from weir.core.process_functions import OutputTag
from weir.core.rejections import OnRecordError


class Partitioning(enum.Enum):
    FORWARD = "forward"
    HASH = "hash"
    REBALANCE = "rebalance"
    BROADCAST = "broadcast"


class OperatorKind(enum.Enum):
    SOURCE = "source"
    ONE_INPUT = "one_input"
    TWO_INPUT = "two_input"
    SINK = "sink"


@dataclass(frozen=True)
class Edge:
    """``target_uid``'s input ``input_index`` takes an output of ``source_uid``: its main output, or
    the side output ``side_output``."""

    source_uid: str
    target_uid: str
    partitioning: Partitioning
    input_index: int = 0
    key_selector: Callable[[Any], Any] | None = None
    side_output: OutputTag | None = None


@dataclass
class Transformation:
    """One operator of the logical graph. ``factory`` builds a fresh runtime operator per subtask."""

    uid: str
    name: str
    kind: OperatorKind
    factory: Callable[[], Any]
    parallelism: int | None = None
    max_parallelism: int | None = None
    key_selector: Callable[[Any], Any] | None = None  # keyed operators: the key of their input
    chainable: bool = True
    source_spec: SourceSpec | None = None  # sources: what the JobManager needs to know (weir.core.descriptors)
    sink_spec: SinkSpec | None = None  # sinks: the system, target and delivery (weir.core.descriptors)
    columnar: bool = False  # emits record batches (weir.core.columnar), not one value per record
    side_outputs: tuple[OutputTag, ...] = ()  # the side outputs it declares (a window's late data)
    # Operators with a user function: how a record it raises on is handled (the operator's own ``on_error``,
    # else the job's), read when the job runs: where a keyed edge into it takes the key (the producer's record
    # writer), and at submit (a dead-letter topic must exist). None: the operator calls no user function.
    on_error: Callable[[], OnRecordError] | None = None


@dataclass
class LogicalGraph:
    job_name: str
    default_parallelism: int
    max_parallelism: int
    transformations: dict[str, Transformation] = field(default_factory=dict)
    edges: list[Edge] = field(default_factory=list)

    def add(self, transformation: Transformation) -> Transformation:
        if not transformation.uid:
            raise JobDefinitionError(f"operator {transformation.name!r} needs a non-empty uid")
        if transformation.uid in self.transformations:
            raise JobDefinitionError(
                f"two operators share the uid {transformation.uid!r}: every operator needs its own stable uid"
            )
        self.transformations[transformation.uid] = transformation
        return transformation

    def connect(self, edge: Edge) -> None:
        if edge.side_output is not None:
            self.check_side_output(edge.source_uid, edge.side_output)
        self.edges.append(edge)

    def check_side_output(self, uid: str, tag: OutputTag) -> None:
        """A side output's name means one thing per operator: every tag of that name taken from
        ``uid`` or declared by it has the same ``value_type``. A tag the operator never emits is
        allowed (its stream stays empty), as in Flink."""
        known = [e.side_output for e in self.outputs_of(uid) if e.side_output is not None]
        known += self.transformations[uid].side_outputs if uid in self.transformations else ()
        for other in known:
            if other.name == tag.name and other.value_type is not tag.value_type:
                raise JobDefinitionError(
                    f"operator {uid!r}: side output {tag.name!r} is taken as {_type_name(tag)} and as "
                    f"{_type_name(other)}: a side output's name means one thing per operator; give the "
                    "other side output another name"
                )

    def inputs_of(self, uid: str) -> list[Edge]:
        return sorted((e for e in self.edges if e.target_uid == uid), key=lambda e: e.input_index)

    def outputs_of(self, uid: str) -> list[Edge]:
        return [e for e in self.edges if e.source_uid == uid]

    def parallelism_of(self, uid: str) -> int:
        return self.transformations[uid].parallelism or self.default_parallelism

    def topological(self) -> Iterator[Transformation]:
        seen: set[str] = set()
        order: list[str] = []

        def visit(uid: str) -> None:
            if uid in seen:
                return
            seen.add(uid)
            for edge in self.inputs_of(uid):
                visit(edge.source_uid)
            order.append(uid)

        for uid in self.transformations:
            visit(uid)
        return (self.transformations[u] for u in order)

    def validate(self) -> None:
        if not self.transformations:
            raise JobDefinitionError("the job defines no operators")
        if not any(t.kind is OperatorKind.SOURCE for t in self.transformations.values()):
            raise JobDefinitionError("the job has no source")
        for t in self.transformations.values():
            p = self.parallelism_of(t.uid)
            if p < 1 or p > self.max_parallelism:
                raise JobDefinitionError(
                    f"operator {t.uid!r}: parallelism {p} must be between 1 and max parallelism {self.max_parallelism}"
                )
            if t.kind is not OperatorKind.SOURCE and not self.inputs_of(t.uid):
                raise JobDefinitionError(f"operator {t.uid!r} has no input")
        for e in self.edges:
            if e.partitioning is Partitioning.FORWARD and self.parallelism_of(e.source_uid) != self.parallelism_of(
                e.target_uid
            ):
                raise JobDefinitionError(
                    f"forward edge {e.source_uid!r} -> {e.target_uid!r} joins different parallelisms; "
                    "use rebalance() or key_by()"
                )


def _type_name(tag: OutputTag) -> str:
    return "values of any type" if tag.value_type is None else f"values of type {tag.value_type.__qualname__}"
