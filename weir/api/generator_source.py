"""The generator source (Flink's ``DataGeneratorSource``): record i is ``generate(i)``.

::

    numbers = env.from_source(GeneratorSource(lambda i: {"n": i}, count=1_000), uid="numbers")
    words = env.from_source(GeneratorSource.of_collection(["a", "b"]), uid="words")

Deterministic and replayable, so a restore resumes at the index its checkpoint holds: subtask s of p
produces the indices s, s+p, s+2p, ... ``env.from_generator(fn, uid=..., **options)`` and
``env.from_collection(items, uid=...)`` are this source with the same option names.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any

from weir.api.connector import Duration, Options, Source
from weir.core.descriptors import GeneratorSourceSpec
from weir.core.windows import to_millis

if TYPE_CHECKING:
    from weir.operators.sources import GeneratorSourceOperator

OPTIONS = Options("generator source")


@dataclass(frozen=True)
class GeneratorSource(Source):
    """Record i is ``generate(i)`` for i in 0..count-1 (unbounded when ``count`` is None), stamped
    with ``timestamp(record)`` when given, the watermark ``max_out_of_orderness_ms`` behind the
    latest; ``records_per_second`` paces all subtasks together in wall time (None: as fast as it goes).
    The options are checked when the source is made."""

    generate: Callable[[int], Any]
    count: int | None = None
    timestamp: Callable[[Any], int] | None = None
    max_out_of_orderness_ms: Duration = 0
    records_per_second: float | None = None

    def __post_init__(self) -> None:
        if not callable(self.generate):
            raise OPTIONS.refuse("generate", "a function of the record index", self.generate)
        if self.count is not None and (type(self.count) is not int or self.count < 0):
            raise OPTIONS.refuse("count", "an int of at least 0 or None (unbounded)", self.count)
        OPTIONS.function("timestamp", self.timestamp)
        OPTIONS.millis("max_out_of_orderness_ms", self.max_out_of_orderness_ms, positive=False)
        OPTIONS.optional_rate("records_per_second", self.records_per_second)

    @classmethod
    def of_collection(
        cls,
        items: Iterable[Any],
        *,
        timestamp: Callable[[Any], int] | None = None,
        max_out_of_orderness_ms: Duration = 0,
        records_per_second: float | None = None,
    ) -> GeneratorSource:
        """The items, in their order (Flink's ``fromCollection``): a bounded generator over a list."""
        values = list(items)
        return cls(
            values.__getitem__,
            count=len(values),
            timestamp=timestamp,
            max_out_of_orderness_ms=max_out_of_orderness_ms,
            records_per_second=records_per_second,
        )

    @cached_property
    def _spec(self) -> GeneratorSourceSpec:
        return GeneratorSourceSpec(
            generate=self.generate,
            count=self.count,
            timestamp=self.timestamp,
            max_out_of_orderness_ms=to_millis(self.max_out_of_orderness_ms, "max_out_of_orderness_ms"),
            records_per_second=self.records_per_second,
        )

    def descriptor(self) -> GeneratorSourceSpec:
        return self._spec

    def create_operator(self) -> GeneratorSourceOperator:
        # The operator runs in the TaskManager: imported there, so a client builds the job without the server install.
        from weir.operators.sources import GeneratorSourceOperator

        return GeneratorSourceOperator(self._spec)

    def default_name(self) -> str:
        return "generator"


__all__ = ["GeneratorSource"]
