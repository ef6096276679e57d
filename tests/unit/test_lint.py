"""What `make lint` checks runs in `make test` too (CI runs only that): ruff over the code and the tests,
and mypy over the product with the settings in pyproject.toml, both with no finding."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=REPO_ROOT, capture_output=True, text=True, timeout=600, check=False)


def test_ruff_finds_nothing() -> None:
    paths = ("weir", "jobmanager", "taskmanager", "connectors", "operators", "tests", "examples", "bench")
    result = run(str(BIN / "ruff"), "check", *paths)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]


def test_mypy_finds_nothing() -> None:
    result = run(str(BIN / "mypy"))
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "Success: no issues found" in result.stdout
