"""The stream methods' checks of what a job hands them, each failing the job's build with one
JobDefinitionError that names the operator, rather than its tasks at run time."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from weir.api.connector import Duration
from weir.core.columnar import FieldKey
from weir.core.errors import JobDefinitionError
from weir.core.state_schema import Migrate, StateSchema
from weir.core.windows import to_millis

KeySelector = Callable[[Any], Any] | str
"""A key: a function of the record, or a field name (``record[name]``; on a columnar stream, its column)."""


def key_selector(key: KeySelector) -> Callable[[Any], Any]:
    if isinstance(key, str):
        return FieldKey(key)
    if not callable(key):
        raise JobDefinitionError(f"key_by takes a function of the record or a field name, not {key!r}")
    return key


def millis(what: str, value: Duration) -> int:
    try:
        return to_millis(value, what)
    except (TypeError, ValueError) as exc:
        raise JobDefinitionError(str(exc)) from None


def process_window_function(uid: str, fn: Any) -> Any:
    """A ProcessWindowFunction: an object with a ``process`` method."""
    if not callable(getattr(fn, "process", None)):
        raise JobDefinitionError(
            f"operator {uid!r}: a window function is a ProcessWindowFunction with process(key, context, elements, "
            f"out), not {fn!r}"
        )
    return fn


def state_schema(uid: str, name: str, fn: Any, version: int | None, migrate: Migrate | None) -> StateSchema:
    """The schema of a keyed operator's one state: the explicit ``state_version``/``migrate``, else
    the function's own attributes of those names, else version 1."""
    if version is None:
        version = getattr(fn, "state_version", None)
    if migrate is None:
        migrate = getattr(fn, "migrate", None)
    try:
        return StateSchema(name, version=1 if version is None else version, migrate=migrate)
    except JobDefinitionError as exc:
        raise JobDefinitionError(f"operator {uid!r}: {exc}") from None


def process_state_schemas(uid: str, fn: Any, given: Iterable[StateSchema] | None) -> tuple[StateSchema, ...]:
    """A keyed process function's declared states: ``state_schemas``, else ``fn.state_schemas``."""
    schemas = tuple(getattr(fn, "state_schemas", ()) if given is None else given)
    names: set[str] = set()
    for schema in schemas:
        if not isinstance(schema, StateSchema):
            raise JobDefinitionError(f"operator {uid!r}: state_schemas holds {schema!r}, not a StateSchema")
        if schema.name in names:
            raise JobDefinitionError(f"operator {uid!r}: state {schema.name!r} is declared twice in state_schemas")
        names.add(schema.name)
    return schemas


__all__ = ["KeySelector", "key_selector", "millis", "process_state_schemas", "process_window_function", "state_schema"]
