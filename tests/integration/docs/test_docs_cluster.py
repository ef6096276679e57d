"""The shell blocks of README.md and docs/ marked ``<!-- test: cluster ... -->`` run, as written,
against the test session's cluster (tests/unit/docs/blocks.py says how blocks are classified).

They use the example's own topics and table (``events``, ``window-results``, ``events-dlq``,
``window_results``); the test recreates them empty first, as a fresh ``make infra-up`` leaves the
broker, so that the blocks' own ``python -m weir.tools.prepare`` fills them. The blocks of one page run
in order, the shell variables one assigns carried to the next.
"""

from __future__ import annotations

import shlex
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration import polling
from tests.integration.conftest import WeirCluster
from tests.unit.docs import blocks
from tests.unit.docs.blocks import REPO_ROOT, Block, Kind
from tests.unit.docs.test_docs import shell_environment
from weir.core.states import JobStatus
from weir.tools.demo import TABLE, TABLE_DEFINITION, TOPICS
from weir.tools.drive import recreate_inputs

pytestmark = pytest.mark.integration

CLUSTER_PAGES = sorted({b.page for b in blocks.every_block() if b.kind is Kind.CLUSTER})
BLOCK_TIMEOUT_S = 240.0
JOB_ENDS_WITHIN_S = 240.0
ENDED = (JobStatus.FINISHED, JobStatus.FAILED, JobStatus.CANCELED)


@pytest.fixture
def example_inputs(weir_cluster: WeirCluster) -> Iterator[None]:
    recreate_inputs(weir_cluster.endpoints, TOPICS, TABLE, TABLE_DEFINITION)
    yield


def wait_until_ended(cluster: WeirCluster, job_id: str) -> JobStatus:
    return polling.settle(
        JOB_ENDS_WITHIN_S, lambda: cluster.client.job_status(job_id).summary.status, lambda s: s in ENDED, 0.5
    )


def run_block(block: Block, variables: dict[str, str], env: dict[str, str], state: Path) -> None:
    prelude = "".join(f"{name}={shlex.quote(value)}\n" for name, value in variables.items())
    saved = "".join(
        f'printf "%s\\t%s\\n" {name} "${name}" >> {shlex.quote(str(state))}\n'
        for name in blocks.assigned_variables(block)
    )
    done = subprocess.run(
        ["bash", "-e", "-o", "pipefail", "-c", prelude + block.text + saved],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=BLOCK_TIMEOUT_S,
    )
    assert done.returncode == 0, f"{block.name} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    if state.exists():
        for line in state.read_text().splitlines():
            name, _, value = line.partition("\t")
            variables[name] = value
        state.unlink()


@pytest.mark.parametrize("page", CLUSTER_PAGES, ids=[str(p.relative_to(REPO_ROOT)) for p in CLUSTER_PAGES])
def test_cluster_blocks(page: Path, weir_cluster: WeirCluster, example_inputs: None, tmp_path: Path) -> None:
    weir_cluster.wait_for_taskmanagers()
    env = shell_environment(tmp_path / "bin")
    env["WEIR_JOBMANAGER_ADDRESS"] = weir_cluster.endpoints.jobmanager_address
    variables: dict[str, str] = {}
    ran = 0
    for block in (b for b in blocks.blocks(page) if b.kind is Kind.CLUSTER):
        job_variable = blocks.waits_for(block)
        if job_variable is not None:
            assert job_variable in variables, f"{block.name} waits for ${job_variable}, which no block before it set"
            status = wait_until_ended(weir_cluster, variables[job_variable])
            assert status is JobStatus.FINISHED, f"{block.name}: job {variables[job_variable]} is {status}"
        run_block(block, variables, env, tmp_path / "state")
        ran += 1
    assert ran, f"{page} has no cluster block"
