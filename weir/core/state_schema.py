"""Keyed state schemas: the serializer and version each state of a keyed operator is written with,
and whether a job's declared schema can read what a restored snapshot holds (Flink's
``TypeSerializerSnapshot`` compatibility, simplified).

A keyed operator declares a :class:`StateSchema` per state (a window operator's accumulators are
the state ``win``, a reduce's running value ``reduce``, a KeyedProcessFunction's states their own
names). Every snapshot records them as :class:`StoredSchema` in the task-state document's layout
(``weir.core.task_state``). On restore the two are compared per state (:func:`check_compatible`):

- same serializer, same version: **compatible**, the values are read as they are;
- same serializer, the job declares a newer version and a ``migrate`` function: **migrate**, each
  restored value is rewritten once, at restore, through ``migrate(stored_version, value)``;
- anything else (a newer version without ``migrate``, an older version than the snapshot's, another
  serializer): **incompatible**, the restore fails with one line naming the operator, the state, both
  versions and what to do.

A state the record does not name (a document written before schemas were recorded, or a state a
KeyedProcessFunction never declared) is version 1 of the ``pickle`` serializer, Weir's one serializer.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from weir.core.errors import JobDefinitionError

PICKLE: Final = "pickle"
SERIALIZERS: Final = frozenset({PICKLE})
"""The serializers the keyed state backend can write and read (``weir.taskmanager.state``)."""

Migrate = Callable[[int, Any], Any]
"""``migrate(stored_version, value)``: a value written at ``stored_version`` as the declared version's."""


class StateSchemaError(JobDefinitionError):
    """The job's declared state schema cannot read what the restored snapshot holds, or a value could
    not be migrated: the user's to fix (a restart would fail the same way)."""


@dataclass(frozen=True)
class StoredSchema:
    """What a snapshot records of one state: its name inside the operator, serializer and version."""

    name: str
    serializer: str = PICKLE
    version: int = 1

    def __str__(self) -> str:
        return f"version {self.version} ({self.serializer})"


@dataclass(frozen=True)
class StateSchema:
    """What a job declares of one state of a keyed operator: its name inside the operator, its
    serializer, its version (from 1) and, optionally, how to migrate a value of an older version."""

    name: str
    serializer: str = PICKLE
    version: int = 1
    migrate: Migrate | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        problem = schema_problem(self)
        if problem is not None:
            raise JobDefinitionError(problem)

    def stored(self) -> StoredSchema:
        return StoredSchema(self.name, self.serializer, self.version)

    def __str__(self) -> str:
        return f"version {self.version} ({self.serializer})"


def schema_problem(schema: StateSchema) -> str | None:
    """Why ``schema`` cannot be declared (None: it can): checked when the job is built."""
    if not isinstance(schema.name, str) or not schema.name or "\x00" in schema.name:
        return f"a state name must be a non-empty string without NUL, got {schema.name!r}"
    what = f"state {schema.name!r}"
    if schema.serializer not in SERIALIZERS:
        return f"{what}: serializer {schema.serializer!r} is unknown; Weir serializes keyed state with {PICKLE!r}"
    if type(schema.version) is not int or schema.version < 1:
        return f"{what}: state_version must be an int of at least 1, got {schema.version!r}"
    if schema.migrate is not None:
        if not callable(schema.migrate):
            return f"{what}: migrate must be a function (stored_version, value) -> value, got {schema.migrate!r}"
        if schema.version == 1:
            return f"{what}: migrate is given but state_version is 1: there is no older version to migrate from"
    return None


class Verdict(enum.Enum):
    COMPATIBLE = "compatible"
    MIGRATE = "migrate"
    INCOMPATIBLE = "incompatible"


@dataclass(frozen=True)
class Compatibility:
    """The answer of :func:`check_compatible`: the verdict, the stored version (what ``migrate`` is
    given), and for an incompatible state the one-line message the restore fails with."""

    verdict: Verdict
    stored_version: int
    message: str = ""


def check_compatible(uid: str, stored: StoredSchema, declared: StateSchema) -> Compatibility:
    """Whether state ``declared.name`` of operator ``uid``, stored as ``stored``, can be restored
    into the job that declares ``declared``. Pure: no state is read."""
    if stored.name != declared.name:
        raise ValueError(f"comparing state {stored.name!r} with state {declared.name!r}")
    head = (
        f"operator {uid!r} state {declared.name!r}: the restored snapshot holds {stored}, the job declares {declared}"
    )
    if stored.serializer != declared.serializer:
        return Compatibility(
            Verdict.INCOMPATIBLE,
            stored.version,
            f"{head}: the {declared.serializer} serializer cannot read {stored.serializer} state; a state's "
            f"serializer cannot change: restore it with serializer {stored.serializer!r}, or start the job "
            "without this state (a new operator uid)",
        )
    if stored.version == declared.version:
        return Compatibility(Verdict.COMPATIBLE, stored.version)
    if stored.version > declared.version:
        return Compatibility(
            Verdict.INCOMPATIBLE,
            stored.version,
            f"{head}: state is never migrated to an older version; declare state_version={stored.version} "
            f"(or later, with migrate=...), or restore a snapshot written at version {declared.version}",
        )
    if declared.migrate is None:
        return Compatibility(
            Verdict.INCOMPATIBLE,
            stored.version,
            f"{head} and no migration: pass migrate=fn(stored_version, value) along with "
            f"state_version={declared.version}, or declare state_version={stored.version} to restore it as it is",
        )
    return Compatibility(Verdict.MIGRATE, stored.version)


def required_migrations(
    uid: str, stored: Mapping[str, StoredSchema], declared: Sequence[StateSchema]
) -> dict[str, int]:
    """The states of operator ``uid`` to migrate on restore, each with its stored version; raises
    StateSchemaError with :func:`check_compatible`'s message at the first incompatible state (in name
    order). A state only one side names is version 1 pickle on the other."""
    declared_by_name = {s.name: s for s in declared}
    migrations: dict[str, int] = {}
    for name in sorted(set(stored) | set(declared_by_name)):
        answer = check_compatible(
            uid, stored.get(name, StoredSchema(name)), declared_by_name.get(name, StateSchema(name))
        )
        match answer.verdict:
            case Verdict.INCOMPATIBLE:
                raise StateSchemaError(answer.message)
            case Verdict.MIGRATE:
                migrations[name] = answer.stored_version
            case Verdict.COMPATIBLE:
                pass
    return migrations


def merge_stored_schemas(uid: str, records: Iterable[Sequence[StoredSchema]]) -> dict[str, StoredSchema]:
    """The stored schemas of operator ``uid`` by state name, from the records of every old subtask
    whose state is restored (they agree when they come from one snapshot)."""
    merged: dict[str, StoredSchema] = {}
    for record in records:
        for schema in record:
            seen = merged.setdefault(schema.name, schema)
            if seen != schema:
                raise StateSchemaError(
                    f"operator {uid!r} state {schema.name!r}: the restored snapshot's subtasks hold it as both "
                    f"{seen} and {schema}: they are not of one job; restore another snapshot"
                )
    return merged
