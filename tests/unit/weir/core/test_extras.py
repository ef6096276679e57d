"""The client install and the server extra (weir.core.extras): what the client imports, and the one line
a server feature says where only the client is installed.

The client's side runs in a child interpreter whose import system finds none of the server's modules
(as a client-only environment would not): the CLI and the job API import, and the example's job graph,
record and columnar, is built. tests/integration/packaging/test_wheel.py checks the same on a real
client-only install."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from weir.core import columnar, extras
from weir.core.columnar import Schema
from weir.core.extras import (
    SERVER_MODULES,
    MissingServerExtraError,
    NoLibpqError,
    exit_without_server,
    require_server,
    server_module_of,
)

REPO = Path(__file__).resolve().parents[4]

WITHOUT_SERVER = textwrap.dedent(
    """
    import importlib.abc, json, sys
    SERVER = set(json.loads(sys.argv[1]))

    class NoServer(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name.split(".")[0] in SERVER:
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, NoServer())
    """
)


def _client(code: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` where no server module can be imported."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-c", WITHOUT_SERVER + textwrap.dedent(code), json.dumps(sorted(SERVER_MODULES))],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_client_builds_the_examples_graph_without_any_server_module() -> None:
    result = _client(
        """
        from weir.tools import cli  # the weir command
        from weir.api import Count, Schema, Sum, load_job_file
        example = "examples/keyed_aggregation.py"
        graphs = {c: load_job_file(example, {"columnar": c}, 3).graph for c in ("false", "true")}
        print(json.dumps({c: sorted(g.transformations) for c, g in graphs.items()}))
        """
    )
    assert result.returncode == 0, result.stderr
    graphs = json.loads(result.stdout)
    assert graphs["false"] == ["events-source", "kafka-sink", "key-value", "postgres-sink", "window-count-sum"]
    assert graphs["true"] == ["events-source", "kafka-sink", "postgres-sink", "window-count-sum"]


def test_a_server_process_on_the_client_stops_with_one_line() -> None:
    result = _client("import runpy; runpy.run_module('weir.taskmanager', run_name='__main__')")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "taskmanager: error: a TaskManager needs the server install, which this environment lacks "
        "(rocksdict, module rocksdict): pip install 'weir-streaming[server]'"
    ]


def test_a_cli_command_of_the_server_says_which_extra() -> None:
    result = _client(
        """
        from weir.tools.cli import run_cli
        sys.exit(run_cli(["verify", "examples/keyed_aggregation.py", "--job-id", "j"]))
        """
    )
    assert result.returncode == 2, result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("weir: error: weir verify needs the server install, which this environment lacks (")
    assert line.endswith("pip install 'weir-streaming[server]'")


def test_require_server_names_the_first_missing_module(monkeypatch: pytest.MonkeyPatch) -> None:
    require_server("the JobManager")  # this environment has the server install
    monkeypatch.delitem(sys.modules, "rocksdict", raising=False)
    real = extras.importlib.util.find_spec
    monkeypatch.setattr(extras.importlib.util, "find_spec", lambda name: None if name == "rocksdict" else real(name))
    with pytest.raises(MissingServerExtraError) as caught:
        require_server("the JobManager")
    assert str(caught.value) == (
        "the JobManager needs the server install, which this environment lacks (rocksdict, module rocksdict): "
        "pip install 'weir-streaming[server]'"
    )
    assert caught.value.fault == "user"


def test_psycopg_without_a_libpq_says_how_to_get_one() -> None:
    """PSYCOPG_IMPL=c asks for psycopg's C build, which is not installed: what psycopg says when it finds
    no libpq at all."""
    code = "from weir.core.extras import require_server; require_server('a TaskManager')"
    env = {**os.environ, "PYTHONPATH": str(REPO), "PSYCOPG_IMPL": "c"}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(f"{NoLibpqError.__module__}.NoLibpqError: a TaskManager needs PostgreSQL's client library")
    assert last.endswith("install the system's libpq (Debian: libpq5) or pip install 'weir-streaming[postgres-binary]'")


def test_exit_without_server_turns_a_missing_server_module_into_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught, exit_without_server("jobmanager", "the JobManager"):
        raise ModuleNotFoundError("No module named 'uvicorn'", name="uvicorn")
    assert caught.value.code == 2
    assert capsys.readouterr().err == (
        "jobmanager: error: the JobManager needs the server install, which this environment lacks "
        "(uvicorn, module uvicorn): pip install 'weir-streaming[server]'\n"
    )
    with pytest.raises(ModuleNotFoundError), exit_without_server("jobmanager", "the JobManager"):
        raise ModuleNotFoundError("No module named 'a_jobs_own_module'", name="a_jobs_own_module")


def test_server_module_of() -> None:
    assert server_module_of(ModuleNotFoundError("x", name="pyarrow.compute")) == "pyarrow.compute"
    assert server_module_of(ModuleNotFoundError("x", name="pandas")) is None
    assert server_module_of(ImportError("x")) is None


def test_columnar_declarations_need_no_arrow_and_arrow_work_says_which_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(columnar, "pa", None)
    monkeypatch.setattr(columnar, "_MISSING_ARROW", "pyarrow")
    schema = Schema.of({"key": str, "value": int, "ts": int})
    schema.check_timestamp_field("ts")
    with pytest.raises(MissingServerExtraError, match=r"the columnar path \(Arrow record batches\) needs the server"):
        schema.decoder("ts")
