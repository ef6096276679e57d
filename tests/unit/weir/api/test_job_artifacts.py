"""Job artifacts (``weir.api.artifacts``, ``weir.api.job_code``): the same files make the same id;
a job's modules load under a package of their own; a requirement installs from a shipped wheel; a
conflicting package version, an artifact over the limit and a requirement that cannot be installed
are refused in one line."""

from __future__ import annotations

import sys
import uuid
from pathlib import Path

import pytest

from tests.python_jobs import write_job, write_scale_wheel, write_wheel
from weir.api.artifacts import build_artifact
from weir.api.job_code import check_distributions, load_job, prepare_artifact
from weir.core.errors import JobDefinitionError

MAX = 10 * 1024 * 1024


def test_the_same_files_make_the_same_artifact(tmp_path: Path) -> None:
    job, src = write_job(tmp_path, "a")
    first = build_artifact(job_file=job, py_module=None, py_files=[src], max_bytes=MAX)
    second = build_artifact(job_file=job, py_module=None, py_files=[src], max_bytes=MAX)
    assert first.data == second.data and first.artifact_id == second.artifact_id
    (src / "helpers.py").write_text("TAG = 'changed'\n", encoding="utf-8")
    assert build_artifact(job_file=job, py_module=None, py_files=[src], max_bytes=MAX).artifact_id != first.artifact_id


def test_two_jobs_with_a_helpers_module_each_load_their_own(tmp_path: Path) -> None:
    loaded = []
    for tag in ("x", "y"):
        job, src = write_job(tmp_path / tag, tag)
        wheel = write_scale_wheel(tmp_path / tag / "wheels")
        artifact = build_artifact(job_file=job, py_module=None, py_files=[src, wheel], max_bytes=MAX)
        prepared = prepare_artifact(artifact.data, cache=tmp_path / "cache")
        assert prepared.distributions == {"tinyscale": "1.0"}
        loaded.append((prepared, load_job(prepared, {}, 1)))
    tags = [sys.modules[f"{prepared.package}.helpers"].TAG for prepared, _ in loaded]
    assert tags == ["x", "y"]
    assert "helpers" not in sys.modules  # nothing of either job under the plain name


def test_another_version_of_a_package_held_here_is_refused_naming_both(tmp_path: Path) -> None:
    name = f"pkg{uuid.uuid4().hex[:8]}"
    prepared = []
    for version in ("1.0", "2.0"):
        wheel = write_wheel(tmp_path / version, name, version, {f"{name}/__init__.py": f"V = {version!r}\n"})
        job = tmp_path / version / "job.py"
        build = 'def build(env):\n    env.from_collection([1], uid="n").print(uid="o")\n'
        job.write_text(f"import {name}\n\n" + build, encoding="utf-8")
        artifact = build_artifact(job_file=job, py_module=None, py_files=[wheel], max_bytes=MAX)
        prepared.append(prepare_artifact(artifact.data, cache=tmp_path / "cache"))
    load_job(prepared[0], {}, 1)
    with pytest.raises(JobDefinitionError) as refused:
        check_distributions(prepared[1])
    assert str(refused.value) == (
        f"job job.py needs {name} 2.0, but another job running here uses {name} 1.0: "
        "one process holds one version of a package"
    )


def test_an_artifact_over_the_limit_is_refused(tmp_path: Path) -> None:
    job, src = write_job(tmp_path, "a")
    with pytest.raises(JobDefinitionError, match=r"^job job.py: its artifact is [\d,]+ bytes, over the limit of 100 "):
        build_artifact(job_file=job, py_module=None, py_files=[src], max_bytes=100)


def test_a_requirement_the_shipped_wheels_do_not_hold_is_one_line(tmp_path: Path) -> None:
    job, src = write_job(tmp_path, "a")
    write_scale_wheel(tmp_path / "wheels")
    requirements = tmp_path / "requirements.txt"
    requirements.write_text("tinyscale==9.9\n", encoding="utf-8")
    artifact = build_artifact(
        job_file=job,
        py_module=None,
        py_files=[src],
        requirements=f"{requirements}#{tmp_path / 'wheels'}",
        max_bytes=MAX,
    )
    with pytest.raises(JobDefinitionError) as refused:
        prepare_artifact(artifact.data, cache=tmp_path / "cache")
    message = str(refused.value)
    assert message.startswith("job job.py: its requirements cannot be installed from the wheels it ships: ERROR:")
    assert "tinyscale==9.9" in message and "\n" not in message
