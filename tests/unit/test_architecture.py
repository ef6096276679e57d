"""The layer order is enforced: the import-linter contracts in pyproject.toml hold, and a deliberately
added upward import breaks them (so the check can fail)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
        env={"PYTHONPATH": str(root)},
    )


def test_the_contracts_hold() -> None:
    result = lint_imports(REPO_ROOT)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "Contracts: 6 kept, 0 broken." in result.stdout


def copy_of_the_code(tmp_path: Path) -> Path:
    """The pyproject and the packages (weir with its links followed: plain folders in the copy)."""
    shutil.copy(REPO_ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    shutil.copytree(REPO_ROOT / "weir", tmp_path / "weir", ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path


def test_an_upward_import_breaks_the_layers(tmp_path: Path) -> None:
    root = copy_of_the_code(tmp_path)
    ids = root / "weir" / "core" / "ids.py"
    ids.write_text(ids.read_text() + "\nimport weir.jobmanager.service  # an upward import\n")
    result = lint_imports(root)
    assert result.returncode != 0
    assert "weir.core.ids -> weir.jobmanager.service" in result.stdout


def test_rocksdb_outside_the_state_backend_breaks_a_contract(tmp_path: Path) -> None:
    """Only weir.taskmanager.state and .snapshots talk to RocksDB; the savepoint tools read through them."""
    root = copy_of_the_code(tmp_path)
    inspector = root / "weir" / "tools" / "savepoint_inspect.py"
    inspector.write_text(inspector.read_text() + "\nimport rocksdict  # the database, not the state backend\n")
    result = lint_imports(root)
    assert result.returncode != 0
    assert "weir.tools.savepoint_inspect -> rocksdict" in result.stdout


FORMER_ROOTS = re.compile(r"^\s*(?:from|import)\s+(jobmanager|taskmanager|operators|connectors)\b", re.M)


def test_everything_imports_under_the_one_root() -> None:
    """jobmanager, taskmanager, operators and connectors are packages of weir (weir/<name> links to the
    folder): importing one as a top-level package would load a second copy of its modules."""
    files = subprocess.run(
        ["git", "ls-files", "*.py"], cwd=REPO_ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    offenders = [f for f in files if FORMER_ROOTS.search((REPO_ROOT / f).read_text(encoding="utf-8"))]
    assert not offenders, f"imports of a former top-level package in {offenders}"
    for name in ("jobmanager", "taskmanager", "operators", "connectors"):
        link = REPO_ROOT / "weir" / name
        assert link.is_symlink() and link.resolve() == (REPO_ROOT / name).resolve(), name
        result = subprocess.run([sys.executable, "-c", f"import {name}"], cwd=REPO_ROOT, capture_output=True, text=True)
        assert result.returncode != 0 and f"import weir.{name}, not {name}" in result.stderr


@pytest.mark.parametrize(
    ("module", "added", "contract", "chain"),
    [
        (
            "jobmanager/lifecycle.py",
            "import grpc",
            "The pure protocol imports no gRPC",
            "weir.jobmanager.lifecycle -> grpc",
        ),
        (  # indirectly: the TLS channel helper imports grpc
            "taskmanager/barrier_aligner.py",
            "import weir.core.grpc_security",
            "The pure protocol imports no gRPC",
            "weir.taskmanager.barrier_aligner -> weir.core.grpc_security",
        ),
        (
            "core/windows.py",
            "import weir.nexmark",
            "The benchmark data model (weir.nexmark) is not part of the core",
            "weir.core.windows -> weir.nexmark",
        ),
        (  # the CLI launches the scenarios as a program: importing them would put the tools under them
            "tools/cli.py",
            "import weir.scenarios.registry",
            "Layers: scenarios | testing > tools",
            "weir.tools.cli -> weir.scenarios.registry",
        ),
        (  # the pytest plugin sits on the tools: the engine it drives never imports it back
            "tools/jobtest.py",
            "import weir.testing",
            "Layers: scenarios | testing > tools",
            "weir.tools.jobtest -> weir.testing",
        ),
        (  # the scenarios reach Kafka through the adapter in connectors/ like everything else
            "scenarios/driving.py",
            "import confluent_kafka",
            "Only the adapters in connectors/ talk to Kafka",
            "weir.scenarios.driving -> confluent_kafka",
        ),
    ],
    ids=[
        "pure-direct",
        "pure-indirect",
        "nexmark",
        "scenarios-above-tools",
        "testing-above-tools",
        "scenarios-through-adapters",
    ],
)
def test_each_new_contract_breaks_on_purpose(
    tmp_path: Path, module: str, added: str, contract: str, chain: str
) -> None:
    root = copy_of_the_code(tmp_path)
    target = root / "weir" / module
    target.write_text(target.read_text() + f"\n{added}  # breaks a contract on purpose\n")
    result = lint_imports(root)
    assert result.returncode != 0
    broken = result.stdout[result.stdout.index("Broken contracts") :]
    assert contract in broken and chain in broken, broken[:3000]
