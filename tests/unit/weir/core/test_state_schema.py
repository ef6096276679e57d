"""The state schema compatibility check, exhaustively: every verdict and its one-line message."""

from __future__ import annotations

from typing import Any

import pytest

from weir.core.errors import JobDefinitionError
from weir.core.state_schema import (
    Compatibility,
    StateSchema,
    StateSchemaError,
    StoredSchema,
    Verdict,
    check_compatible,
    merge_stored_schemas,
    required_migrations,
)

UID = "window-count-sum"


def add_max(stored_version: int, acc: Any) -> Any:
    count, total = acc
    return count, total, None


def test_the_same_version_and_serializer_is_compatible() -> None:
    assert check_compatible(UID, StoredSchema("win", "pickle", 1), StateSchema("win")) == Compatibility(
        Verdict.COMPATIBLE, 1
    )
    assert check_compatible(UID, StoredSchema("win", "pickle", 3), StateSchema("win", version=3)).verdict is (
        Verdict.COMPATIBLE
    )


def test_the_same_version_with_a_migration_is_compatible_and_the_migration_unused() -> None:
    answer = check_compatible(UID, StoredSchema("win", version=2), StateSchema("win", version=2, migrate=add_max))
    assert answer == Compatibility(Verdict.COMPATIBLE, 2)


@pytest.mark.parametrize("stored_version", [1, 2, 4])
def test_a_newer_declared_version_with_a_migration_migrates_from_the_stored_version(stored_version: int) -> None:
    answer = check_compatible(
        UID, StoredSchema("win", version=stored_version), StateSchema("win", version=5, migrate=add_max)
    )
    assert answer == Compatibility(Verdict.MIGRATE, stored_version)


def test_a_newer_declared_version_without_a_migration_is_refused_with_what_to_do() -> None:
    answer = check_compatible(UID, StoredSchema("win", "pickle", 1), StateSchema("win", version=2))
    assert answer.verdict is Verdict.INCOMPATIBLE
    assert answer.message == (
        "operator 'window-count-sum' state 'win': the restored snapshot holds version 1 (pickle), the job "
        "declares version 2 (pickle) and no migration: pass migrate=fn(stored_version, value) along with "
        "state_version=2, or declare state_version=1 to restore it as it is"
    )


def test_an_older_declared_version_than_the_stored_one_is_a_refused_downgrade() -> None:
    answer = check_compatible(UID, StoredSchema("win", version=3), StateSchema("win", version=2, migrate=add_max))
    assert answer.verdict is Verdict.INCOMPATIBLE and answer.stored_version == 3
    assert answer.message == (
        "operator 'window-count-sum' state 'win': the restored snapshot holds version 3 (pickle), the job "
        "declares version 2 (pickle): state is never migrated to an older version; declare state_version=3 "
        "(or later, with migrate=...), or restore a snapshot written at version 2"
    )


@pytest.mark.parametrize(("stored_version", "declared_version"), [(1, 1), (1, 2), (2, 1)])
def test_another_serializer_is_refused_whatever_the_versions(stored_version: int, declared_version: int) -> None:
    migrate = add_max if declared_version > 1 else None
    answer = check_compatible(
        UID, StoredSchema("win", "kryo", stored_version), StateSchema("win", version=declared_version, migrate=migrate)
    )
    assert answer.verdict is Verdict.INCOMPATIBLE
    assert answer.message == (
        f"operator 'window-count-sum' state 'win': the restored snapshot holds version {stored_version} (kryo), "
        f"the job declares version {declared_version} (pickle): the pickle serializer cannot read kryo state; a "
        "state's serializer cannot change: restore it with serializer 'kryo', or start the job without this "
        "state (a new operator uid)"
    )


def test_two_different_states_are_not_compared() -> None:
    with pytest.raises(ValueError, match="comparing state 'win' with state 'reduce'"):
        check_compatible(UID, StoredSchema("win"), StateSchema("reduce"))


@pytest.mark.parametrize(
    ("schema", "complaint"),
    [
        ({"name": ""}, "a state name must be a non-empty string"),
        ({"name": "a\x00b"}, "without NUL"),
        ({"name": "win", "version": 0}, "state 'win': state_version must be an int of at least 1, got 0"),
        ({"name": "win", "version": True}, "state_version must be an int of at least 1, got True"),
        ({"name": "win", "version": 2.0}, "state_version must be an int of at least 1, got 2.0"),
        ({"name": "win", "version": 2, "migrate": 3}, "migrate must be a function"),
        ({"name": "win", "migrate": add_max}, "migrate is given but state_version is 1"),
        ({"name": "win", "serializer": "json"}, "serializer 'json' is unknown"),
    ],
)
def test_a_schema_that_cannot_be_declared_is_refused(schema: dict[str, Any], complaint: str) -> None:
    with pytest.raises(JobDefinitionError, match=complaint):
        StateSchema(**schema)


# One operator's states --------------------------------------------------------------------------


def test_an_operator_lists_the_states_to_migrate_with_their_stored_versions() -> None:
    declared = [
        StateSchema("a", version=2, migrate=add_max),
        StateSchema("b"),
        StateSchema("c", version=3, migrate=add_max),
    ]
    stored = {"a": StoredSchema("a", version=1), "b": StoredSchema("b"), "c": StoredSchema("c", version=3)}
    assert required_migrations(UID, stored, declared) == {"a": 1}


def test_a_state_the_record_does_not_name_is_version_1_pickle() -> None:
    """A document written before schemas were recorded: every state is version 1."""
    assert required_migrations(UID, {}, [StateSchema("win", version=2, migrate=add_max)]) == {"win": 1}
    assert required_migrations(UID, {}, [StateSchema("win")]) == {}
    with pytest.raises(StateSchemaError, match="holds version 1 \\(pickle\\), the job declares version 2"):
        required_migrations(UID, {}, [StateSchema("win", version=2)])


def test_a_stored_state_the_job_no_longer_declares_must_be_version_1() -> None:
    assert required_migrations(UID, {"old": StoredSchema("old")}, []) == {}
    with pytest.raises(
        StateSchemaError, match="state 'old': the restored snapshot holds version 2 .* declares version 1"
    ):
        required_migrations(UID, {"old": StoredSchema("old", version=2)}, [])


def test_the_first_incompatible_state_in_name_order_fails_the_restore() -> None:
    declared = [StateSchema("b", version=2), StateSchema("a", version=2)]
    with pytest.raises(StateSchemaError, match="state 'a'"):
        required_migrations(UID, {}, declared)


def test_the_records_of_several_old_subtasks_merge_when_they_agree() -> None:
    one = (StoredSchema("win", version=2),)
    assert merge_stored_schemas(UID, [one, one, ()]) == {"win": StoredSchema("win", version=2)}
    with pytest.raises(StateSchemaError, match="hold it as both version 2 \\(pickle\\) and version 1 \\(pickle\\)"):
        merge_stored_schemas(UID, [one, (StoredSchema("win"),)])
