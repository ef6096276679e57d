"""Python functions a script calls by name: passed to ``sql(env, script, functions={...})`` or
declared in the script with Flink's ``CREATE [TEMPORARY [SYSTEM]] FUNCTION name AS 'module.attr'
LANGUAGE PYTHON``. A scalar function is a callable of the call's argument values (NULL as None); an
aggregate function is an object with ``create() -> acc``, ``add(acc, *values) -> acc``,
``merge(a, b) -> acc`` and ``result(acc) -> value`` (as the job API's AggregateFunction; a class is
instantiated). Names are case-insensitive, as SQL's.

While a script is planned, its functions are :data:`REGISTERED` (a context variable the expression
compiler and the aggregate planner read): each call is bound to its function when it is planned."""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from types import FunctionType, ModuleType
from typing import Any, Final

from weir.sql.errors import Position, SqlError

REGISTERED: Final[ContextVar[Mapping[str, Any] | None]] = ContextVar("weir_sql_functions", default=None)


def is_aggregate(fn: Any) -> bool:
    return all(callable(getattr(fn, name, None)) for name in ("create", "add", "merge", "result"))


def registry(functions: Mapping[str, Any], where: Position | None = None) -> dict[str, Any]:
    """The functions by upper-case name, each checked: a callable or an aggregate function (a class
    of one is instantiated)."""
    out: dict[str, Any] = {}
    for name, fn in functions.items():
        if not name.isidentifier():
            raise SqlError(f"function name {name!r} is not an SQL identifier", where)
        if isinstance(fn, type) and is_aggregate(fn):
            fn = fn()
        if not (callable(fn) or is_aggregate(fn)):
            raise SqlError(
                f"function {name}: {fn!r} is neither callable nor an aggregate (create, add, merge, result)", where
            )
        if name.upper() in out:
            raise SqlError(f"function {name} is registered twice", where)
        out[name.upper()] = fn
    return out


def resolve(name: str, target: str, where: Position) -> Any:
    """``'module.attr'`` of CREATE FUNCTION: the attribute of the imported module."""
    module_name, _, attribute = target.rpartition(".")
    if not module_name or not attribute:
        raise SqlError(f"CREATE FUNCTION {name}: AS takes 'module.attribute', not {target!r}", where)
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise SqlError(f"CREATE FUNCTION {name}: cannot import {module_name}: {exc}", where) from None
    try:
        return getattr(module, attribute)
    except AttributeError:
        raise SqlError(f"CREATE FUNCTION {name}: module {module_name} has no {attribute}", where) from None


def defined_in(module: ModuleType) -> dict[str, Any]:
    """The functions of a module (``weir sql --functions FILE.py``): each public function, and each
    public class with create/add/merge/result, defined in the module itself, by its name."""
    found: dict[str, Any] = {}
    for name, value in vars(module).items():
        if name.startswith("_") or getattr(value, "__module__", None) != module.__name__:
            continue
        if isinstance(value, FunctionType) or (isinstance(value, type) and is_aggregate(value)):
            found[name] = value
    return found


def lookup(name: str) -> Any | None:
    return (REGISTERED.get() or {}).get(name.upper())


@contextmanager
def registered(functions: Mapping[str, Any]) -> Iterator[None]:
    token = REGISTERED.set(functions)
    try:
        yield
    finally:
        REGISTERED.reset(token)


__all__ = ["REGISTERED", "defined_in", "is_aggregate", "lookup", "registered", "registry", "resolve"]
