"""A TaskManager's id and advertised address when its command line leaves them out."""

from __future__ import annotations

import pytest

from weir.taskmanager.identity import advertised_host, default_taskmanager_id

HOSTS = {"3f2a9c1be07d": "172.18.0.7", "taskmanager-2": "10.244.1.12"}


def resolve(name: str) -> str:
    return HOSTS[name]


def test_the_id_is_the_host_name() -> None:
    assert default_taskmanager_id(lambda: "taskmanager-2") == "taskmanager-2"


def test_an_explicit_host_wins() -> None:
    assert advertised_host("0.0.0.0", "tm.example", lambda: "3f2a9c1be07d", resolve) == "tm.example"


def test_a_concrete_bind_address_is_advertised() -> None:
    assert advertised_host("127.0.0.1", None, lambda: "3f2a9c1be07d", resolve) == "127.0.0.1"
    assert advertised_host("10.0.0.5", "", lambda: "3f2a9c1be07d", resolve) == "10.0.0.5"


@pytest.mark.parametrize("bind", ["0.0.0.0", "::", "[::]", ""])
@pytest.mark.parametrize("hostname", sorted(HOSTS))
def test_bound_to_every_interface_it_advertises_its_host_names_address(bind: str, hostname: str) -> None:
    assert advertised_host(bind, None, lambda: hostname, resolve) == HOSTS[hostname]


def test_a_host_name_that_resolves_to_no_address_is_an_error() -> None:
    with pytest.raises(ValueError):
        advertised_host("0.0.0.0", None, lambda: "x", lambda _: "not-an-address")
