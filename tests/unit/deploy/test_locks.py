"""pyproject.toml's requirements and the lock files requirements/*.lock (``make constraints``) agree.

Every requirement of the distribution is bounded above; the client (the distribution alone) pulls no
server library; each lock pins every line to one version with the hashes of its files, holds every
requirement of the extras it is for at a version their bounds allow, and the locks never disagree on a
version (they are resolved against one reference, bench.lock)."""

from __future__ import annotations

import re
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from weir.core.extras import SERVER_MODULES

REPO = Path(__file__).resolve().parents[3]
PYPROJECT: dict[str, Any] = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
PROJECT = PYPROJECT["project"]
EXTRAS_OF = {
    "client": (),
    "server": ("server", "postgres-binary"),
    "dev": ("server", "postgres-binary", "dev"),
    "bench": ("server", "postgres-binary", "dev", "bench"),
}
SERVER_ONLY = {
    "rocksdict",
    "pyarrow",
    "numpy",
    "psycopg",
    "psycopg-binary",
    "confluent-kafka",
    "boto3",
    "botocore",
    "fastapi",
    "starlette",
    "uvicorn",
    "grpcio-health-checking",
    "tenacity",
    "cryptography",
}
LINUX_311 = {"sys_platform": "linux", "os_name": "posix", "python_version": "3.11", "python_full_version": "3.11.7"}


@dataclass(frozen=True)
class Pin:
    version: Version
    marker: Marker | None
    hashes: tuple[str, ...]


def read_lock(name: str) -> dict[str, Pin]:
    """name -> its pin, from pip's requirements format (continuation lines joined, comments dropped)."""
    text = (REPO / "requirements" / f"{name}.lock").read_text(encoding="utf-8")
    pins: dict[str, Pin] = {}
    for entry in re.sub(r"\\\n\s*", " ", text).splitlines():
        entry = entry.split("#", 1)[0].strip()
        if not entry:
            continue
        requirement, _, options = entry.partition(" --hash=")
        spec, _, marker = requirement.partition(";")
        package, sep, version = spec.strip().partition("==")
        assert sep, f"{name}.lock: {entry[:80]!r} is not pinned with =="
        hashes = tuple(h.strip() for h in f"--hash={options}".split("--hash=") if h.strip())
        key = canonicalize_name(package)
        assert key not in pins, f"{name}.lock pins {package} twice"
        pins[key] = Pin(Version(version), Marker(marker) if marker.strip() else None, hashes)
    return pins


def requirements(extras: Iterable[str]) -> list[Requirement]:
    listed = [*PROJECT["dependencies"], *(r for e in extras for r in PROJECT["optional-dependencies"][e])]
    return [Requirement(r) for r in listed]


@pytest.mark.parametrize("lock", ["client", "server", "dev", "bench", "build"])
def test_every_line_of_a_lock_is_one_version_with_its_hashes(lock: str) -> None:
    pins = read_lock(lock)
    assert pins
    for package, pin in pins.items():
        assert pin.hashes and all(re.fullmatch(r"sha256:[0-9a-f]{64}", h) for h in pin.hashes), package


@pytest.mark.parametrize(("lock", "extras"), EXTRAS_OF.items())
def test_a_lock_holds_every_requirement_of_its_extras_within_their_bounds(lock: str, extras: tuple[str, ...]) -> None:
    pins = read_lock(lock)
    for requirement in requirements(extras):
        if requirement.marker is not None and not requirement.marker.evaluate(LINUX_311):
            continue
        pin = pins.get(canonicalize_name(requirement.name))
        assert pin is not None, f"{lock}.lock lacks {requirement}: run `make constraints`"
        assert requirement.specifier.contains(pin.version, prereleases=True), (
            f"{lock}.lock pins {requirement.name}=={pin.version}, outside {requirement}: run `make constraints`"
        )
        for extra in requirement.extras:  # psycopg[binary]: the extra's own package, at the same version
            assert canonicalize_name(f"{requirement.name}-{extra}") in pins, f"{lock}.lock lacks {requirement}"


def test_the_build_lock_holds_the_build_backend() -> None:
    pins = read_lock("build")
    for text in PYPROJECT["build-system"]["requires"]:
        requirement = Requirement(text)
        assert requirement.specifier.contains(pins[canonicalize_name(requirement.name)].version), text


def test_the_locks_agree_on_every_version() -> None:
    reference = read_lock("bench")
    for lock in ("client", "server", "dev", "build"):
        for package, pin in read_lock(lock).items():
            assert package in reference, f"{lock}.lock has {package}, which bench.lock (everything) lacks"
            assert pin.version == reference[package].version, (lock, package, pin.version, reference[package].version)
            assert pin.hashes == reference[package].hashes, (lock, package)


def test_the_client_pulls_no_server_library() -> None:
    client = read_lock("client")
    assert not SERVER_ONLY & set(client), sorted(SERVER_ONLY & set(client))
    base = {canonicalize_name(r.name) for r in requirements(())}
    assert not SERVER_ONLY & base
    server = {canonicalize_name(r.name) for r in requirements(("server",))} - base
    assert {canonicalize_name(d) for d in SERVER_MODULES.values()} <= server, "weir.core.extras names the extra"
    assert read_lock("server").keys() >= {"psycopg", "psycopg-binary", "rocksdict", "pyarrow", "boto3"}


def test_psycopg_is_required_without_its_binary_but_for_the_extra_that_asks() -> None:
    server = {Requirement(r).name: Requirement(r) for r in PROJECT["optional-dependencies"]["server"]}
    assert server["psycopg"].extras == set(), "the server extra takes the system's libpq or postgres-binary's"
    (binary,) = (Requirement(r) for r in PROJECT["optional-dependencies"]["postgres-binary"])
    assert (binary.name, binary.extras) == ("psycopg", {"binary"})


def test_every_requirement_of_the_distribution_is_bounded_above() -> None:
    for requirement in requirements(PROJECT["optional-dependencies"]):
        operators = {spec.operator for spec in requirement.specifier}
        assert operators & {"<", "<=", "==", "~="}, f"{requirement} has no upper bound"


def test_the_distribution_names_its_urls_and_classifiers() -> None:
    assert PROJECT["urls"] and all(url.startswith("https://") for url in PROJECT["urls"].values())
    classifiers = set(PROJECT["classifiers"])
    assert "Programming Language :: Python :: 3.11" in classifiers
    assert not any(c.startswith("License ::") for c in classifiers), "the SPDX license field says it (PEP 639)"
