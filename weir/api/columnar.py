"""The columnar streams: Arrow record batches with declared fields, from a columnar source
(``KafkaSource.builder().schema(...).timestamp_field(...)``, or ``env.from_kafka(..., schema=...)``).

``key_by("field")`` and a window ``.aggregate`` of built-in aggregates (``{"count": Count(), "sum":
Sum("value")}``) over event-time windows that do not merge stay columnar: batches are hash-partitioned
on arrays, exchanged as Arrow IPC and aggregated vectorized. Everything else (``map``, ``filter``,
sinks, a key function, an AggregateFunction, ``process``) takes records: the batches are turned into
dicts (one per row, stamped with the event time) by an operator chained to the columnar one,
``<uid>-records``, made once per columnar operator.

The source decodes only the fields the job reads (Flink's projection push-down): when every operator
taking its batches is such a window without a late-data side output, the key, the aggregated fields
and the event time; when anything takes records (or a window's late rows), every field of the schema.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from weir.api.checks import KeySelector
from weir.api.connector import Source, WithoutOnError
from weir.api.functions import KeyedProcessFunction
from weir.api.streams import DataStream, KeyedStream
from weir.api.wiring import GraphBuilder
from weir.core.columnar import BuiltinAggregates, FieldKey, Schema
from weir.core.errors import JobDefinitionError
from weir.core.process_functions import OutputTag
from weir.core.rejections import OnRecordError
from weir.core.state_schema import StateSchema
from weir.core.windows import SlidingEventTimeWindows, TumblingEventTimeWindows
from weir.graph import Partitioning, Transformation

if TYPE_CHECKING:
    from weir.operators.columnar import ToRecordsOperator


def _to_records() -> ToRecordsOperator:
    """The operator turning batches into records. It runs in the TaskManager, as every columnar
    operator: imported there, so that a client builds a columnar job without Arrow (the server install)."""
    from weir.operators.columnar import ToRecordsOperator

    return ToRecordsOperator()


class FieldsRead:
    """The fields of a columnar source's schema that the operators taking its batches read, and the
    source's operator in the graph projected to them as each such operator is added."""

    def __init__(self, source: Source, transformation: Transformation) -> None:
        self._source = source
        self._t = transformation
        self._fields: set[str] | None = set()  # None: every field (records are made of the batches)

    def read(self, fields: Iterable[str] | None) -> None:
        """An operator takes ``fields`` of the batches; None: every field."""
        if self._fields is None:
            return
        if fields is None:
            self._fields = None
            projected = self._source.projected(None)
        else:
            self._fields.update(fields)
            projected = self._source.projected(tuple(sorted(self._fields)))
        self._t.source_spec = projected.descriptor()
        self._t.factory = projected.create_operator


class ColumnarStream(DataStream):
    """A stream of Arrow record batches with declared fields (a columnar source's output)."""

    def __init__(
        self,
        graph: GraphBuilder,
        transformation: Transformation,
        schema: Schema,
        reads: FieldsRead,
        partitioning: Partitioning = Partitioning.FORWARD,
        key_selector: Callable[[Any], Any] | None = None,
    ) -> None:
        super().__init__(graph, transformation, partitioning, key_selector)
        self.schema = schema
        self._reads = reads

    def records(self) -> DataStream:
        """The stream as records (dicts), converted once per columnar operator."""
        self._reads.read(None)
        records_uid = f"{self.uid}-records"
        made = self._graph.records_operators
        if records_uid not in made:
            if records_uid in self._graph.graph.transformations:
                raise JobDefinitionError(
                    f"operator uid {records_uid!r} is taken: it names the operator that turns the batches of "
                    f"columnar operator {self.uid!r} into records; give the other operator another uid"
                )
            made[records_uid] = self._add(
                WithoutOnError(_to_records),
                uid=records_uid,
                name="to-records",
                parallelism=self._t.parallelism,
                columnar_input=True,
            )._t
        return DataStream(self._graph, made[records_uid])

    def _as_records(self) -> DataStream:
        return self.records()

    def rebalance(self) -> DataStream:
        return self.records().rebalance()

    def broadcast(self) -> DataStream:
        return self.records().broadcast()

    def key_by(self, key: KeySelector) -> KeyedStream:
        if isinstance(key, str):
            self.schema.kind_of(key)  # an unknown field fails at build time
            return ColumnarKeyedStream(self._graph, self._t, self.schema, FieldKey(key), self._reads)
        return self.records().key_by(key)


class ColumnarKeyedStream(KeyedStream):
    """A columnar stream keyed by a field: batches are hash-partitioned by key group on arrays."""

    def __init__(
        self, graph: GraphBuilder, transformation: Transformation, schema: Schema, key: FieldKey, reads: FieldsRead
    ) -> None:
        super().__init__(graph, transformation, key)
        self.schema = schema
        self._field_key = key
        self._reads = reads

    def _columnar(self) -> ColumnarStream:
        return ColumnarStream(self._graph, self._t, self.schema, self._reads)

    def _records_keyed(self) -> KeyedStream:
        """The same partitioning over records: converted before the exchange, keyed by the field."""
        return self._columnar().records().key_by(self._field_key)

    def _as_records(self) -> DataStream:
        return self._records_keyed()

    def _records_for_window(self) -> KeyedStream:
        return self._records_keyed()

    def key_by(self, key: KeySelector) -> KeyedStream:
        return self._columnar().key_by(key)

    def rebalance(self) -> DataStream:
        return self._columnar().rebalance()

    def broadcast(self) -> DataStream:
        return self._columnar().broadcast()

    def reduce(self, fn: Callable[[Any, Any], Any], **kwargs: Any) -> DataStream:
        return self._records_keyed().reduce(fn, **kwargs)

    def process(self, fn: KeyedProcessFunction, **kwargs: Any) -> DataStream:  # type: ignore[override]
        return self._records_keyed().process(fn, **kwargs)

    def _vectorized_window(
        self,
        fn: BuiltinAggregates,
        schema: StateSchema,
        assigner: TumblingEventTimeWindows | SlidingEventTimeWindows,
        lateness: int,
        late_data: OutputTag | None,
        *,
        uid: str,
        name: str,
        parallelism: int | None,
        on_error: OnRecordError | None,
    ) -> DataStream | None:
        for field in fn.fields():
            self.schema.kind_of(field)  # an unknown field fails at build time
        key_field = self._field_key.field
        self._reads.read((key_field, *fn.fields()) if late_data is None else None)  # late rows go out whole

        def window_operator() -> Any:
            from weir.operators.columnar import ColumnarWindowAggregateOperator  # in the TaskManager: see _to_records

            return ColumnarWindowAggregateOperator(fn, key_field, assigner, lateness, schema, late_data=late_data)

        operator = WithoutOnError(window_operator)
        return self._add(
            operator,
            uid=uid,
            name=name,
            parallelism=parallelism,
            on_error=on_error,
            key_selector=self._field_key,
            columnar_input=True,
            side_outputs=() if late_data is None else (late_data,),
        )


__all__ = ["ColumnarKeyedStream", "ColumnarStream", "FieldsRead"]
