"""The layer order is enforced: the import-linter contracts in pyproject.toml hold, and a deliberately
added upward import breaks them (so the check can fail)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("weir", "connectors", "operators", "taskmanager", "jobmanager")
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
    assert "Contracts: 3 kept, 0 broken." in result.stdout


def test_an_upward_import_breaks_the_layers(tmp_path: Path) -> None:
    shutil.copy(REPO_ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    for package in PACKAGES:
        shutil.copytree(REPO_ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    ids = tmp_path / "weir" / "core" / "ids.py"
    ids.write_text(ids.read_text() + "\nimport jobmanager.service  # an upward import\n")
    result = lint_imports(tmp_path)
    assert result.returncode != 0
    assert "weir.core.ids -> jobmanager.service" in result.stdout
