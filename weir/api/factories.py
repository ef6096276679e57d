"""The operator each stream method adds, built from what the job gave it and checked at build time:
the factories the stream classes (``weir.api.streams``) hand their one path. The stream classes wire;
this module knows the operators (``weir.operators``) and what each needs of the job's functions."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import partial
from typing import Any

from weir.api.checks import millis
from weir.api.connector import Duration, WithOnError, WithoutOnError
from weir.core.errors import JobDefinitionError
from weir.core.process_functions import OutputTag
from weir.core.state_schema import StateSchema
from weir.core.windows import EventTimeSessionWindows, SlidingEventTimeWindows, TumblingEventTimeWindows
from weir.operators.async_io import AsyncMapOperator, check_async_function
from weir.operators.basic import CoProcessOperator, FilterOperator, FlatMapOperator, MapOperator, ProcessOperator
from weir.operators.broadcast import BroadcastProcessOperator, KeyedBroadcastProcessOperator
from weir.operators.joins import EmitJoined, IntervalJoinOperator, ProcessJoin, WindowJoinOperator
from weir.operators.keyed import KeyedCoProcessOperator, KeyedProcessOperator, ReduceOperator
from weir.operators.windows import ProcessElements, ProcessResult, WindowAggregateOperator

Key = Callable[[Any], Any]
Keys = tuple[Key, Key]


def map_operator(fn: Callable[[Any], Any]) -> WithOnError:
    return WithOnError(partial(MapOperator, fn))


def filter_operator(fn: Callable[[Any], bool]) -> WithOnError:
    return WithOnError(partial(FilterOperator, fn))


def flat_map_operator(fn: Callable[[Any], Iterable[Any]]) -> WithOnError:
    return WithOnError(partial(FlatMapOperator, fn))


def async_map_operator(
    uid: str, fn: Callable[[Any], Any], capacity: int, timeout_ms: int | None, ordered: bool
) -> WithOnError:
    """Flink's async I/O: ``fn`` an ``async def``, up to ``capacity`` calls in flight."""
    check_async_function(uid, fn)
    if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
        raise JobDefinitionError(f"operator {uid!r}: async_map's capacity must be a positive int, not {capacity!r}")
    if timeout_ms is not None and (isinstance(timeout_ms, bool) or not isinstance(timeout_ms, int) or timeout_ms < 1):
        raise JobDefinitionError(
            f"operator {uid!r}: async_map's timeout_ms must be a positive int or None, not {timeout_ms!r}"
        )
    return WithOnError(lambda on_error: AsyncMapOperator(fn, capacity, timeout_ms, ordered, on_error=on_error))


def union_operator() -> WithoutOnError:
    """An identity operator with several inputs."""
    return WithoutOnError(partial(MapOperator, _identity))


def process_operator(uid: str, fn: Any) -> WithOnError:
    """A ProcessFunction's operator (no key, no state): ``fn`` needs ``process_element``."""
    if not callable(getattr(fn, "process_element", None)):
        raise JobDefinitionError(
            f"operator {uid!r}: process takes a ProcessFunction with process_element(value, ctx, out), not {fn!r}"
        )
    return WithOnError(partial(ProcessOperator, fn))


def reduce_operator(fn: Callable[[Any, Any], Any], key: Key, schema: StateSchema) -> WithOnError:
    return WithOnError(lambda on_error: ReduceOperator(fn, key, schema, on_error=on_error))


def keyed_process_operator(fn: Any, key: Key, schemas: tuple[StateSchema, ...]) -> WithOnError:
    return WithOnError(lambda on_error: KeyedProcessOperator(fn, key, schemas, on_error=on_error))


def window_operator(
    uid: str,
    fn: Any,
    key: Key,
    assigner: Any,
    lateness: int,
    schema: StateSchema,
    window_function: ProcessResult | ProcessElements | None,
    late_data: OutputTag | None,
) -> WithOnError:
    """A keyed window over records; session windows merge accumulators, so ``fn`` needs ``merge``."""
    if isinstance(assigner, EventTimeSessionWindows) and not callable(getattr(fn, "merge", None)):
        raise JobDefinitionError(
            f"operator {uid!r}: session windows ({assigner!r}) merge the accumulators of the windows they "
            f"join, and {type(fn).__name__} has no merge(a, b) method: give it one"
        )
    return WithOnError(
        lambda on_error: WindowAggregateOperator(
            fn, key, assigner, lateness, schema, window_function=window_function, late_data=late_data, on_error=on_error
        )
    )


def co_process_operator(fn: Any) -> WithOnError:
    return WithOnError(partial(CoProcessOperator, fn))


def broadcast_process_operator(fn: Any) -> WithOnError:
    return WithOnError(partial(BroadcastProcessOperator, fn))


def keyed_broadcast_process_operator(fn: Any, key: Key, schemas: tuple[StateSchema, ...]) -> WithOnError:
    return WithOnError(lambda on_error: KeyedBroadcastProcessOperator(fn, key, schemas, on_error=on_error))


def keyed_co_process_operator(fn: Any, keys: Keys, schemas: tuple[StateSchema, ...]) -> WithOnError:
    return WithOnError(lambda on_error: KeyedCoProcessOperator(fn, keys, schemas, on_error=on_error))


def window_join_operator(
    uid: str, fn: Any, assigner: TumblingEventTimeWindows | SlidingEventTimeWindows, keys: Keys
) -> WithOnError:
    """``fn(first, second)``, or an object with such a ``join`` method, per pair of a window."""
    join = getattr(fn, "join", None)
    join = join if callable(join) else fn
    if not callable(join):
        raise JobDefinitionError(f"operator {uid!r}: a window join takes fn(first, second), not {fn!r}")
    return WithOnError(lambda on_error: WindowJoinOperator(join, assigner, keys, on_error=on_error))


def interval_bounds(lower: Duration, upper: Duration) -> tuple[int, int]:
    """An interval join's bounds in ms (negative allowed), the lower not above the upper."""
    lower_ms = millis("an interval join's lower bound", lower)
    upper_ms = millis("an interval join's upper bound", upper)
    if lower_ms > upper_ms:
        raise JobDefinitionError(f"an interval join's lower bound {lower_ms} ms is above its upper bound {upper_ms} ms")
    return lower_ms, upper_ms


def interval_join_operator(
    uid: str, fn: Any, bounds: tuple[int, int], exclusive: tuple[bool, bool], keys: Keys
) -> WithOnError:
    """A ProcessJoinFunction's ``process_element``, or ``fn(left, right)`` emitted as is, per pair
    within the bounds (each made exclusive by one millisecond where asked)."""
    lower = bounds[0] + (1 if exclusive[0] else 0)
    upper = bounds[1] - (1 if exclusive[1] else 0)
    if lower > upper:
        raise JobDefinitionError(
            f"operator {uid!r}: the interval join's bounds {bounds[0]}..{bounds[1]} ms with the exclusive "
            "bound(s) left out match nothing"
        )
    process_element = getattr(fn, "process_element", None)
    if callable(process_element):
        process: ProcessJoin = process_element
    elif callable(fn):
        process = EmitJoined(fn)
    else:
        raise JobDefinitionError(
            f"operator {uid!r}: an interval join takes a ProcessJoinFunction or fn(left, right), not {fn!r}"
        )
    return WithOnError(lambda on_error: IntervalJoinOperator(process, lower, upper, keys, on_error=on_error))


def _identity(value: Any) -> Any:
    return value
