"""Weir as a user installs it: an sdist and a wheel built from a clean checkout of HEAD (no Makefile, no
generated code in the tree), installed into fresh virtual environments: the client alone (``pip install
weir-streaming``: the CLI and the job API, none of the server's libraries), which builds a job's graph
and submits it, and the server install (``weir-streaming[server,postgres-binary]``), which runs a local
cluster and a bounded job from that environment alone.

Every package comes from a wheelhouse in Weir's cache (``$WEIR_CACHE_DIR/wheelhouse``), filled from
PyPI with the files of ``requirements/*.lock`` (hashes checked) when it lacks one; a warm run needs no
network (~1 min). pip resolves each install itself, its versions constrained to the lock of that install,
so a requirement the distribution declares beyond its lock fails here. The cluster uses the private ports and
a private run directory, so it runs beside the session's cluster.
"""

from __future__ import annotations

import email.parser
import json
import os
import re
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from tests.integration.ports import private_ports
from weir.core.config import Endpoints, cache_dir

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[3]
WIRE_MODULES = ("common_pb2", "common_pb2_grpc", "jobmanager_pb2", "jobmanager_pb2_grpc", "taskmanager_pb2")
SERVER_MODULES = ("rocksdict", "pyarrow", "numpy", "psycopg", "confluent_kafka", "boto3", "fastapi", "grpc_health")
SERVER_EXTRAS = "server,postgres-binary"
JOB = """
from weir.api import Environment


def build(env: Environment) -> None:
    path = env.params.get_str("out", "")
    numbers = env.from_collection(list(range(1000)), uid="numbers")
    numbers.key_by(lambda n: n % 7).map(lambda n: {"n": n, "square": n * n}, uid="square").sink_to_file(path, uid="out")
"""


def _run(argv: list[str], *, env: Mapping[str, str], cwd: Path, timeout: float = 600) -> str:
    result = subprocess.run(argv, env=dict(env), cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False)
    assert result.returncode == 0, f"{' '.join(argv)} exited {result.returncode}:\n{result.stdout}\n{result.stderr}"
    return result.stdout


def _clean_environment(**extra: str) -> dict[str, str]:
    """This process's environment without anything that would let the repository's code in."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env.update(extra)
    return env


def _pins(lock: Path, directory: Path) -> Path:
    """The lock's ``name==version ; marker`` lines without their hashes: constraints any pip takes (pip
    before 25 refuses hashes in a constraints file); the hashes were checked when the wheelhouse was filled."""
    text = re.sub(r"\\\n\s*", " ", lock.read_text(encoding="utf-8"))
    lines = [line.split(" --hash=")[0].strip() for line in text.splitlines() if line and not line.startswith(" ")]
    pins = directory / f"{lock.stem}-pins.txt"
    pins.write_text("\n".join(line for line in lines if not line.startswith("#")) + "\n", encoding="utf-8")
    return pins


def _with_wheelhouse(argv: list[str], lock: Path, *, wheelhouse: Path, cwd: Path, **env: str) -> str:
    """Run ``argv`` with pip finding packages in the wheelhouse only; when that fails, download the
    lock's files for this machine into it (``--require-hashes``) and run once more."""
    offline = _clean_environment(PIP_NO_INDEX="1", PIP_FIND_LINKS=str(wheelhouse), **env)
    first = subprocess.run(argv, env=offline, cwd=cwd, capture_output=True, text=True, timeout=600, check=False)
    if first.returncode == 0:
        return first.stdout
    download = [sys.executable, "-m", "pip", "download", "-q", "--require-hashes", "--no-deps", "-d", str(wheelhouse)]
    _run([*download, "-r", str(lock)], env=os.environ, cwd=cwd)
    return _run(argv, env=offline, cwd=cwd)


def _requires(wheel: Path) -> list[str]:
    """The wheel's ``Requires-Dist`` lines."""
    with zipfile.ZipFile(wheel) as whl:
        (metadata,) = (name for name in whl.namelist() if name.endswith(".dist-info/METADATA"))
        headers = email.parser.Parser().parsestr(whl.read(metadata).decode("utf-8"), headersonly=True)
    return list(headers.get_all("Requires-Dist") or [])


def _new_venv(root: Path) -> Path:
    _run([sys.executable, "-m", "venv", "--without-pip", str(root)], env=_clean_environment(), cwd=root.parent)
    return root


def _install(venv: Path, requirement: str, lock: Path, *, wheelhouse: Path, cwd: Path) -> None:
    """``pip install REQUIREMENT`` into ``venv``: pip resolves it, within the lock's versions."""
    install = [sys.executable, "-m", "pip", "--python", str(venv / "bin/python"), "install", "-q", "--no-compile"]
    _with_wheelhouse([*install, "-c", str(_pins(lock, cwd)), requirement], lock, wheelhouse=wheelhouse, cwd=cwd)


def _distributions(venv: Path, cwd: Path) -> dict[str, str]:
    """name -> version of every distribution installed in ``venv``."""
    probe = (
        "import importlib.metadata as m, json; "
        "print(json.dumps({d.name.lower(): d.version for d in m.distributions()}))"
    )
    return dict(json.loads(_run([str(venv / "bin/python"), "-c", probe], env=_clean_environment(), cwd=cwd)))


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A clean checkout of HEAD: ``git archive``, so nothing generated or ignored comes along."""
    work = tmp_path_factory.mktemp("checkout")
    archive = work / "head.tar"
    _run(["git", "-C", str(REPO), "archive", "--format=tar", "-o", str(archive), "HEAD"], env=os.environ, cwd=work)
    root = work / "weir"
    with tarfile.open(archive) as tar:
        tar.extractall(root, filter="data")
    assert not list((root / "weir/wire").glob("*_pb2*")), "a clean checkout has no generated code"
    return root


@pytest.fixture(scope="module")
def wheelhouse() -> Path:
    path = cache_dir() / "wheelhouse"
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="module")
def built(source: Path, wheelhouse: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The sdist, and the wheel built from it (``python -m build``, isolated build environments whose
    build backend is ``requirements/build.lock``'s)."""
    dist = tmp_path_factory.mktemp("dist")
    build = [sys.executable, "-m", "build", "--outdir", str(dist), str(source)]
    lock = source / "requirements/build.lock"
    _with_wheelhouse(build, lock, wheelhouse=wheelhouse, cwd=dist, PIP_CONSTRAINT=str(_pins(lock, dist)))
    (sdist,) = dist.glob("weir_streaming-*.tar.gz")
    (wheel,) = dist.glob("weir_streaming-*.whl")
    return sdist, wheel


@pytest.fixture(scope="module")
def venv(built: tuple[Path, Path], source: Path, wheelhouse: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtual environment (no system site-packages) with the server install: the wheel with its
    ``server`` and ``postgres-binary`` extras, as the image has it."""
    _, wheel = built
    root = _new_venv(tmp_path_factory.mktemp("venv") / "venv")
    lock = source / "requirements/server.lock"
    _install(root, f"weir-streaming[{SERVER_EXTRAS}] @ {wheel.as_uri()}", lock, wheelhouse=wheelhouse, cwd=root.parent)
    return root


@pytest.fixture(scope="module")
def client_venv(
    built: tuple[Path, Path], source: Path, wheelhouse: Path, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """A fresh virtual environment with the wheel alone: ``pip install weir-streaming``, the client. The
    wheelhouse holds the server's packages too: a server library the distribution required would come
    along (and fail the tests below), or fall outside client.lock (and fail the install)."""
    _, wheel = built
    root = _new_venv(tmp_path_factory.mktemp("client") / "venv")
    _install(root, str(wheel), source / "requirements/client.lock", wheelhouse=wheelhouse, cwd=root.parent)
    return root


def test_the_sdist_carries_the_protos_and_the_build_hook(built: tuple[Path, Path]) -> None:
    sdist, wheel = built
    with tarfile.open(sdist) as tar:
        names = {name.split("/", 1)[1] for name in tar.getnames() if "/" in name}
    protos = {p.relative_to(REPO).as_posix() for p in (REPO / "proto/weir/wire").glob("*.proto")}
    assert protos and protos <= names
    assert {"build_hooks.py", "setup.py", "LICENSE", "weir/core/endpoints.env"} <= names
    assert {f"requirements/{lock}.lock" for lock in ("client", "server", "dev", "bench", "build")} <= names
    assert not any("_pb2" in name for name in names), "generated code is made by the build, not shipped in the sdist"
    with zipfile.ZipFile(wheel) as whl:
        members = set(whl.namelist())
    for module in WIRE_MODULES:
        assert f"weir/wire/{module}.py" in members
    assert "weir/wire/common_pb2.pyi" in members
    assert any(name.endswith(".dist-info/licenses/LICENSE") for name in members)


def test_the_wheel_installs_one_import_package_named_weir(built: tuple[Path, Path]) -> None:
    """jobmanager, taskmanager, operators and connectors are weir.* (other distributions on PyPI
    install top-level packages of those names); the distribution is weir-streaming ("weir" on PyPI
    is another project), the command weir."""
    _, wheel = built
    with zipfile.ZipFile(wheel) as whl:
        names = whl.namelist()
    top_level = {name.split("/")[0] for name in names if not name.split("/")[0].endswith((".dist-info", ".data"))}
    assert top_level == {"weir"}, top_level
    for package in ("jobmanager", "taskmanager", "operators", "connectors"):
        assert f"weir/{package}/__init__.py" in names, f"weir.{package} is not in the wheel"
    (metadata,) = (name for name in names if name.endswith(".dist-info/METADATA"))
    with zipfile.ZipFile(wheel) as whl:
        headers = email.parser.Parser().parsestr(whl.read(metadata).decode("utf-8"), headersonly=True)
    assert headers["Name"] == "weir-streaming"


def test_weir_lives_beside_distributions_named_operators_and_connectors(
    venv: Path, tmp_path: Path, wheelhouse: Path
) -> None:
    """Two distributions whose top-level packages are named like Weir's folders, installed into the
    same environment: each imports as itself, and Weir's packages are still Weir's."""
    for name in ("operators", "connectors"):
        project = tmp_path / f"other-{name}"
        (project / name).mkdir(parents=True)
        (project / name / "__init__.py").write_text(f"WHO = 'the {name} distribution'\n")
        (project / "pyproject.toml").write_text(
            f'[project]\nname = "{name}"\nversion = "9.9"\n[build-system]\nrequires = ["setuptools"]\n'
            'build-backend = "setuptools.build_meta"\n'
        )
        wheel = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-index", "--no-build-isolation"]
        _run([*wheel, "-w", str(tmp_path / "wheels"), str(project)], env=_clean_environment(), cwd=tmp_path)
    install = [sys.executable, "-m", "pip", "--python", str(venv / "bin/python"), "install", "-q", "--no-index"]
    _run([*install, *map(str, (tmp_path / "wheels").glob("*.whl"))], env=_clean_environment(), cwd=tmp_path)
    probe = (
        "import operators, connectors, weir.operators.windows, weir.connectors.kafka; "
        "print(operators.WHO, '|', connectors.WHO, '|', weir.operators.windows.__name__)"
    )
    out = _run([str(venv / "bin/python"), "-c", probe], env=_clean_environment(), cwd=tmp_path)
    assert out.strip() == "the operators distribution | the connectors distribution | weir.operators.windows"
    assert _run([str(venv / "bin/weir"), "--version"], env=_clean_environment(), cwd=tmp_path).startswith("weir ")
    uninstall = [sys.executable, "-m", "pip", "--python", str(venv / "bin/python"), "uninstall", "-q", "-y"]
    _run([*uninstall, "operators", "connectors"], env=_clean_environment(), cwd=tmp_path)


def test_the_installed_package_imports_its_own_wire_modules(venv: Path, tmp_path: Path) -> None:
    probe = (
        "import importlib, json; "
        f"print(json.dumps({{m: importlib.import_module('weir.wire.' + m).__file__ for m in {WIRE_MODULES!r}}}))"
    )
    files = json.loads(_run([str(venv / "bin/python"), "-c", probe], env=_clean_environment(), cwd=tmp_path))
    site = next((venv / "lib").glob("python3*/site-packages"))
    for module, file in files.items():
        assert Path(file).is_relative_to(site), f"weir.wire.{module} came from {file}, not the installed wheel"


def test_weir_version_names_the_projects_version(venv: Path, tmp_path: Path) -> None:
    import tomllib

    version = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]["version"]
    out = _run([str(venv / "bin/weir"), "--version"], env=_clean_environment(), cwd=tmp_path)
    assert out == f"weir {version}\n"


@pytest.fixture
def installed_cluster(venv: Path, tmp_path: Path, endpoints: Endpoints) -> Iterator[dict[str, str]]:
    """``weir cluster up`` from the virtual environment, on the private cluster ports beside the
    session's (``private_ports``), with file checkpoints. (Ports found free by binding port 0 are in
    the kernel's ephemeral range, where an outgoing connection of any process can take one before the
    cluster binds it: make test at 339f3a9 saw the JobManager's metrics port taken, 6 restarts.)"""
    env = _clean_environment(WEIR_RUN_DIR=str(tmp_path / "run"), **private_ports(endpoints))
    env.pop("WEIR_CHECKPOINT_DIR", None)
    _run([str(venv / "bin/weir"), "cluster", "up", "--timeout", "60"], env=env, cwd=tmp_path)
    try:
        yield env
    finally:
        _run([str(venv / "bin/weir"), "cluster", "down"], env=env, cwd=tmp_path)


def test_a_bounded_job_runs_on_a_cluster_of_the_installed_package(
    venv: Path, installed_cluster: dict[str, str], tmp_path: Path
) -> None:
    job = tmp_path / "squares.py"
    job.write_text(JOB, encoding="utf-8")
    out = tmp_path / "out" / "squares"
    stdout = _run(
        [str(venv / "bin/weir"), "run", str(job), "-p", "2", "-D", f"out={out}", "--json"],
        env=installed_cluster,
        cwd=tmp_path,
        timeout=180,
    )
    status = json.loads(stdout)
    assert status["summary"]["status"] == "FINISHED", status
    lines = [json.loads(line) for f in sorted(out.parent.glob("squares.*")) for line in f.read_text().splitlines()]
    assert sorted(r["n"] for r in lines) == list(range(1000))
    assert all(r["square"] == r["n"] ** 2 for r in lines)


# The client alone ------------------------------------------------------------------------------------

SERVER_DISTRIBUTIONS = {
    "rocksdict",
    "pyarrow",
    "numpy",
    "psycopg",
    "psycopg-binary",
    "confluent-kafka",
    "tenacity",
    "boto3",
    "botocore",
    "fastapi",
    "starlette",
    "uvicorn",
    "grpcio-health-checking",
    "cryptography",
}


def test_the_client_install_holds_no_server_library(
    client_venv: Path, built: tuple[Path, Path], tmp_path: Path
) -> None:
    installed = _distributions(client_venv, tmp_path)
    assert "weir-streaming" in installed
    assert not SERVER_DISTRIBUTIONS & set(installed), sorted(SERVER_DISTRIBUTIONS & set(installed))
    probe = f"import importlib.util; print([m for m in {SERVER_MODULES!r} if importlib.util.find_spec(m)])"
    assert _run([str(client_venv / "bin/python"), "-c", probe], env=_clean_environment(), cwd=tmp_path) == "[]\n"
    _, wheel = built
    base = [r for r in _requires(wheel) if "extra ==" not in r]
    named = {re.split(r"[\s<>=!~;\[(]", r, maxsplit=1)[0].lower() for r in base}
    assert named and not named & SERVER_DISTRIBUTIONS, named
    server = [r for r in _requires(wheel) if 'extra == "server"' in r]
    assert any(r.startswith("rocksdict") for r in server) and any(r.startswith("psycopg") for r in server)


def test_the_client_runs_the_cli_and_builds_the_examples_graph(client_venv: Path, source: Path, tmp_path: Path) -> None:
    env = _clean_environment()
    assert _run([str(client_venv / "bin/weir"), "--version"], env=env, cwd=tmp_path).startswith("weir ")
    usage = _run([str(client_venv / "bin/weir"), "--help"], env=env, cwd=tmp_path)
    for command in ("run", "status", "list", "cancel", "stop", "savepoint"):
        assert re.search(rf"^\W*{command}\b", usage, re.M), f"weir --help lists no {command}:\n{usage}"
    example = source / "examples/keyed_aggregation.py"
    probe = (
        "import json, sys; from weir.api import load_job_file; "
        f"graphs = {{c: load_job_file({str(example)!r}, {{'columnar': c}}, 3).graph for c in ('false', 'true')}}; "
        "print(json.dumps({'graphs': {c: sorted(g.transformations) for c, g in graphs.items()}, "
        "'server': sorted(m for m in sys.modules if m.split('.')[0] in "
        f"{SERVER_MODULES!r})}}))"
    )
    built = json.loads(_run([str(client_venv / "bin/python"), "-c", probe], env=env, cwd=tmp_path))
    for variant, uids in built["graphs"].items():
        assert {"events-source", "kafka-sink", "postgres-sink"} <= set(uids), (variant, uids)
    assert built["graphs"]["true"] != built["graphs"]["false"], "the columnar path is another graph"
    assert built["server"] == [], "building a job imports no server library"


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (["bin/weir", "cluster", "up"], "weir: error: weir cluster up (the JobManager and the TaskManagers run from"),
        (["bin/python", "-m", "weir.jobmanager"], "jobmanager: error: the JobManager needs the server install"),
        (["bin/python", "-m", "weir.taskmanager"], "taskmanager: error: a TaskManager needs the server install"),
        (["bin/weir", "savepoint", "info", "s3://weir-checkpoints/x"], "weir: error: weir savepoint needs the server"),
    ],
    ids=["cluster-up", "jobmanager", "taskmanager", "savepoint-info"],
)
def test_a_server_feature_on_the_client_says_which_extra_in_one_line(
    client_venv: Path, tmp_path: Path, argv: list[str], line: str
) -> None:
    env = _clean_environment(WEIR_RUN_DIR=str(tmp_path / "run"), AWS_EC2_METADATA_DISABLED="true")
    result = subprocess.run(
        [str(client_venv / argv[0]), *argv[1:]], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 2, result.stderr
    errors = result.stderr.strip().splitlines()
    assert len(errors) == 1 and errors[0].startswith(line), result.stderr
    assert errors[0].endswith("pip install 'weir-streaming[server]'"), errors[0]


def test_the_client_submits_a_job_to_a_cluster_of_the_server_install(
    client_venv: Path, installed_cluster: dict[str, str], tmp_path: Path
) -> None:
    job = tmp_path / "squares.py"
    job.write_text(JOB, encoding="utf-8")
    out = tmp_path / "out" / "squares"
    stdout = _run(
        [str(client_venv / "bin/weir"), "run", str(job), "-p", "2", "-D", f"out={out}", "--json"],
        env=installed_cluster,
        cwd=tmp_path,
        timeout=180,
    )
    assert json.loads(stdout)["summary"]["status"] == "FINISHED"
    lines = [json.loads(line) for f in sorted(out.parent.glob("squares.*")) for line in f.read_text().splitlines()]
    assert sorted((r["n"], r["square"]) for r in lines) == [(n, n * n) for n in range(1000)]
