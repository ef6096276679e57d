"""The one path by which a job's sources, operators and sinks enter its logical graph.

Every public method of the job API (``env.from_source``, ``stream.map``, a window's ``aggregate``, a
join's ``apply``, ``stream.sink_to``, ...) checks its own arguments and hands
:meth:`GraphBuilder.add_operator` what to add: the operator factory, its kind, uid, name,
parallelism, ``on_error`` and inputs. Only here is a :class:`~weir.graph.Transformation` made, an
operator's handling of rejected records recorded and an edge drawn, so every operator is wired alike
(Flink's ``DataStream.transform`` and ``StreamExecutionEnvironment.addOperator``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, assert_never

from weir.api.connector import OperatorFactory, WithOnError, WithoutOnError
from weir.core.descriptors import SinkSpec, SourceSpec
from weir.core.errors import JobDefinitionError
from weir.core.process_functions import OutputTag
from weir.core.rejections import FAIL, DeadLetterOnError, FailOnError, OnRecordError
from weir.graph import Edge, LogicalGraph, OperatorKind, Partitioning, Transformation
from weir.operators.base import StreamOperator


@dataclass(frozen=True)
class StreamInput:
    """What an operator reads: an upstream operator's main output (or its side output
    ``side_output``), partitioned by ``partitioning`` (by ``key_selector`` when hashed)."""

    uid: str
    parallelism: int | None
    partitioning: Partitioning = Partitioning.FORWARD
    key_selector: Callable[[Any], Any] | None = None
    side_output: OutputTag | None = None


def checked_on_error(uid: str, given: object) -> OnRecordError | None:
    """An operator's ``on_error`` as given: None (the job's), ``FailOnError()`` or ``DeadLetterOnError(topic)``."""
    if given is None or isinstance(given, FailOnError | DeadLetterOnError):
        return given
    raise JobDefinitionError(
        f"operator {uid!r}: on_error takes FailOnError() or DeadLetterOnError(topic), not {given!r}"
    )


class GraphBuilder:
    """A job's logical graph as its ``build(env)`` adds to it, and the job's handling of rejected records."""

    def __init__(self, graph: LogicalGraph) -> None:
        self.graph = graph
        self._on_record_error: OnRecordError = FAIL
        self.records_operators: dict[str, Transformation] = {}  # the <uid>-records of each columnar operator

    def on_record_error(self, handling: OnRecordError) -> None:
        """The handling of every operator not given its own ``on_error``."""
        if not isinstance(handling, FailOnError | DeadLetterOnError):
            raise JobDefinitionError(
                f"on_record_error takes FailOnError() or DeadLetterOnError(topic), not {handling!r}"
            )
        self._on_record_error = handling

    def record_error_handling(self, given: OnRecordError | None) -> OnRecordError:
        """An operator's handling of rejected records: its own, else the job's. Read when a task
        builds the operator, so ``env.on_record_error`` may come after the operators in ``build(env)``."""
        return self._on_record_error if given is None else given

    def add_operator(
        self,
        factory: OperatorFactory,
        *,
        kind: OperatorKind,
        uid: str,
        name: str,
        parallelism: int | None,
        on_error: OnRecordError | None = None,
        inputs: Sequence[StreamInput] = (),
        key_selector: Callable[[Any], Any] | None = None,
        source_spec: SourceSpec | None = None,
        sink_spec: SinkSpec | None = None,
        columnar: bool = False,
        side_outputs: tuple[OutputTag, ...] = (),
    ) -> Transformation:
        """Add an operator fed by ``inputs`` (none for a source, two for a two-input operator, in
        order). A forward input at another parallelism is rebalanced."""
        match kind:
            case OperatorKind.SOURCE:
                fed = not inputs
            case OperatorKind.TWO_INPUT:
                fed = len(inputs) == 2
            case OperatorKind.ONE_INPUT | OperatorKind.SINK:
                fed = len(inputs) >= 1  # a union takes several
            case _:
                assert_never(kind)
        assert fed, f"operator {uid!r} ({kind.value}) given {len(inputs)} input(s)"
        create: Callable[[], StreamOperator]
        handling: Callable[[], OnRecordError] | None
        match factory:
            case WithOnError(build):
                handling = partial(self.record_error_handling, checked_on_error(uid, on_error))
                create = partial(_built_with_handling, build, handling)
            case WithoutOnError(build):
                if on_error is not None:
                    raise JobDefinitionError(
                        f"operator {uid!r} ({name}) takes no on_error: it never rejects a record, so there is "
                        "nothing for on_error to handle"
                    )
                create, handling = build, None
            case _:
                assert_never(factory)
        transformation = self.graph.add(
            Transformation(
                uid=uid,
                name=name,
                kind=kind,
                factory=create,
                parallelism=parallelism,
                key_selector=key_selector,
                source_spec=source_spec,
                sink_spec=sink_spec,
                columnar=columnar,
                side_outputs=side_outputs,
                on_error=handling,
            )
        )
        for index, upstream in enumerate(inputs):
            partitioning = upstream.partitioning
            if partitioning is Partitioning.FORWARD and (
                (parallelism or self.graph.default_parallelism)
                != (upstream.parallelism or self.graph.default_parallelism)
            ):
                partitioning = Partitioning.REBALANCE
            self.graph.connect(
                Edge(
                    source_uid=upstream.uid,
                    target_uid=uid,
                    partitioning=partitioning,
                    input_index=index if kind is OperatorKind.TWO_INPUT else 0,
                    key_selector=upstream.key_selector,
                    side_output=upstream.side_output,
                )
            )
        return transformation


def _built_with_handling(
    build: Callable[[OnRecordError], StreamOperator], handling: Callable[[], OnRecordError]
) -> StreamOperator:
    return build(handling())


__all__ = ["GraphBuilder", "StreamInput", "checked_on_error"]
