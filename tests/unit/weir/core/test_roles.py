"""The role model of weir.core.roles: the method table held to the services in ``proto/``, what each
role holds, every (method, token role) decision, the tokens file and the internal token's rules."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from weir.core.errors import ConfigurationError
from weir.core.roles import (
    ALL_ROLES,
    GRPC_METHOD_ROLES,
    AccessTable,
    Role,
    access_table,
    grpc_method_role,
    held_roles,
    parse_tokens_file,
    rest_route_role,
)
from weir.core.transport_security import AuthDecision, TransportSecurity, authorize, refusal_message
from weir.wire import jobmanager_pb2, taskmanager_pb2

READ, OPERATE, SUBMIT, INTERNAL = "read-tok", "operate-tok", "submit-tok", "internal-tok"
TOKENS_FILE = f"""
# client tokens
read {READ}
operate {OPERATE}
submit sha256:{hashlib.sha256(SUBMIT.encode()).hexdigest()}
"""


def _proto_methods() -> set[str]:
    methods: set[str] = set()
    for module in (jobmanager_pb2, taskmanager_pb2):
        for service in module.DESCRIPTOR.services_by_name.values():
            methods |= {f"/{service.full_name}/{method.name}" for method in service.methods}
    return methods


def test_every_method_of_the_services_in_proto_has_a_role_and_the_table_names_no_other() -> None:
    methods = _proto_methods()
    assert len(methods) >= 20
    assert methods - GRPC_METHOD_ROLES.keys() == set(), "methods without a role: add them to GRPC_METHOD_ROLES"
    assert GRPC_METHOD_ROLES.keys() - methods == set(), "roles of methods the services no longer have"


def test_each_role_holds_the_client_roles_below_it_and_internal_holds_only_itself() -> None:
    assert {role: held_roles(role) for role in Role} == {
        Role.READ: {Role.READ},
        Role.OPERATE: {Role.READ, Role.OPERATE},
        Role.SUBMIT: {Role.READ, Role.OPERATE, Role.SUBMIT},
        Role.INTERNAL: {Role.INTERNAL},
    }


def test_the_client_and_cluster_calls_need_what_the_issue_names() -> None:
    jm = "/weir.wire.JobManagerService/"
    assert grpc_method_role(jm + "SubmitJob") is Role.SUBMIT
    assert grpc_method_role(jm + "CancelJob") is Role.OPERATE
    assert grpc_method_role(jm + "TriggerSavepoint") is Role.OPERATE
    assert grpc_method_role(jm + "ListJobs") is Role.READ
    assert grpc_method_role(jm + "RegisterTaskManager") is Role.INTERNAL
    assert grpc_method_role("/weir.wire.TaskManagerService/OpenChannel") is Role.INTERNAL
    assert grpc_method_role("/weir.wire.JobManagerService/Unknown") is None
    assert rest_route_role("patch", "/v1/jobs/{job_id}") is Role.OPERATE  # Flink's versioned prefix
    assert rest_route_role("GET", "/jobs") is Role.READ
    assert rest_route_role("DELETE", "/jobs") is None


@pytest.fixture
def table() -> AccessTable:
    table = access_table(None, parse_tokens_file(TOKENS_FILE, "tokens"), INTERNAL)
    assert table is not None
    return table


@pytest.mark.parametrize("method", sorted(GRPC_METHOD_ROLES))
def test_every_method_accepts_exactly_the_tokens_holding_its_role(table: AccessTable, method: str) -> None:
    needed = GRPC_METHOD_ROLES[method]
    given = {READ: Role.READ, OPERATE: Role.OPERATE, SUBMIT: Role.SUBMIT, INTERNAL: Role.INTERNAL}
    for token, role in given.items():
        expected = AuthDecision.ACCEPTED if needed in held_roles(role) else AuthDecision.FORBIDDEN
        assert authorize(f"Bearer {token}", table, needed) is expected, (method, role)
    assert authorize("Bearer stranger", table, needed) is AuthDecision.REJECTED
    assert authorize(None, table, needed) is AuthDecision.MISSING
    assert authorize(f"Bearer {SUBMIT}", table, None) is AuthDecision.FORBIDDEN  # a method no table names


def test_a_refusal_for_a_missing_role_names_the_role_and_the_call_never_the_token() -> None:
    message = refusal_message(AuthDecision.FORBIDDEN, Role.SUBMIT, "/weir.wire.JobManagerService/SubmitJob")
    assert "'submit'" in message and "SubmitJob" in message and READ not in message
    assert "\n" not in message


def test_the_single_token_alone_holds_every_role_and_beside_a_tokens_file_only_what_the_file_says() -> None:
    alone = access_table("legacy", None, None)
    assert alone is not None and alone.roles_of("legacy") == ALL_ROLES
    with_file = access_table("legacy", parse_tokens_file(TOKENS_FILE, "tokens"), INTERNAL)
    assert with_file is not None and with_file.roles_of("legacy") is None
    assert with_file.roles_of(INTERNAL) == {Role.INTERNAL}
    assert with_file.roles_of(f"  {OPERATE} ") == {Role.READ, Role.OPERATE}
    assert access_table(None, None, None) is None


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("read", "line 1"),
        ("read a b", "line 1"),
        ("\nadmin tok", "unknown role 'admin'"),
        ("submit sha256:abc", "64 hex digits"),
        ("submit sha256:" + "zz" * 32, "64 hex digits"),
        ("# nothing\n\n", "names no token"),
    ],
)
def test_a_bad_tokens_file_is_refused_naming_the_line_never_a_token(text: str, names: str) -> None:
    with pytest.raises(ConfigurationError) as refused:
        parse_tokens_file(text, "WEIR_AUTH_TOKENS_FILE")
    assert names in str(refused.value)
    assert "\n" not in str(refused.value)


def test_the_internal_token_must_differ_from_every_client_token() -> None:
    with pytest.raises(ConfigurationError, match="also a client token"):
        access_table(None, parse_tokens_file(TOKENS_FILE, "tokens"), SUBMIT)
    with pytest.raises(ConfigurationError, match="also a client token"):
        access_table("same", None, "same")


def test_from_settings_a_tokens_file_needs_an_internal_token_and_peers_send_it(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text(TOKENS_FILE)
    with pytest.raises(ConfigurationError, match="WEIR_INTERNAL_TOKEN"):
        TransportSecurity.from_env({"WEIR_AUTH_TOKENS_FILE": str(tokens)})
    internal = tmp_path / "internal"
    internal.write_text(INTERNAL + "\n")
    security = TransportSecurity.from_env(
        {"WEIR_AUTH_TOKENS_FILE": str(tokens), "WEIR_INTERNAL_TOKEN_FILE": str(internal), "WEIR_AUTH_TOKEN": READ}
    )
    assert security.authorization() == f"Bearer {READ}"  # what a client in this environment sends
    assert security.for_cluster_peers().authorization() == f"Bearer {INTERNAL}"
    assert security.access is not None and security.access.roles_of(READ) == {Role.READ}
    assert INTERNAL not in repr(security) and READ not in repr(security)
    legacy = TransportSecurity.from_env({"WEIR_AUTH_TOKEN": "legacy"})
    assert legacy.for_cluster_peers() == legacy
    assert legacy.access is not None and legacy.access.roles_of("legacy") == ALL_ROLES
