"""Flink's ``PUT /jobs/{id}/resource-requirements`` on Weir's REST API: bounds checked by Flink's own
rules (400, its messages, one line each, nothing changed), then mapped onto a live rescale (200 ``{}``:
a rescale to the highest parallelism within the bounds, or nothing when the job runs within them);
bounds Weir cannot run the job within are 409, the job untouched."""

from __future__ import annotations

import warnings
from typing import Any

import pytest

from tests.unit.jobmanager.conftest import Harness
from tests.unit.jobmanager.test_rescale import running_job
from weir.jobmanager.rest.ids import flink_job_id, flink_vertex_id

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from fastapi.testclient import TestClient


GEN = flink_vertex_id("gen")


def requirements(lower: int, upper: int, vertex: str = GEN) -> dict[str, Any]:
    return {vertex: {"parallelism": {"lowerBound": lower, "upperBound": upper}}}


def not_positive(lower: int, upper: int) -> str:
    return (
        f"Both, the requested lower bound [{lower}] and upper bound [{upper}] for job vertex [{GEN}] must be "
        "greater than zero."
    )


def errors_of(response: Any, status: int) -> list[str]:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"errors"} and body["errors"], body
    return list(body["errors"])


def test_bounds_below_the_job_s_parallelism_rescale_it_to_their_upper_bound(
    harness: Harness, client: TestClient
) -> None:
    job = running_job(harness)  # parallelism 3, one vertex (gen -> out)
    response = client.put(f"/v1/jobs/{flink_job_id(job.job_id)}/resource-requirements", json=requirements(1, 2))
    assert (response.status_code, response.json()) == (200, {})
    op = harness.jm.executor.rescales.active(job.job_id)
    assert op is not None and (op.from_parallelism, op.to_parallelism) == (3, 2)
    again = client.put(f"/jobs/{job.job_id}/resource-requirements", json=requirements(1, 1))
    assert errors_of(again, 409) == [
        f"job {job.job_id} is already being rescaled (request {op.trigger_id}); wait for it to end"
    ]


def test_a_vertex_is_named_by_its_uid_too_and_bounds_the_job_runs_within_change_nothing(
    harness: Harness, client: TestClient
) -> None:
    job = running_job(harness)
    response = client.put(f"/jobs/{job.job_id}/resource-requirements", json=requirements(3, 3, vertex="gen"))
    assert (response.status_code, response.json()) == (200, {})
    assert harness.jm.executor.rescales.active(job.job_id) is None
    assert client.get(f"/jobs/{job.job_id}/resource-requirements").json() == {
        GEN: {"parallelism": {"lowerBound": 3, "upperBound": 3}}
    }


def test_no_upper_bound_is_every_slot_the_job_could_use(harness: Harness, client: TestClient) -> None:
    job = running_job(harness)  # 3 of tm-a's 4 slots
    free = sum(max(0, offer.free_slots) for offer in harness.jm.registry.offers())
    assert (free, len(job.slots)) == (1, 3)
    response = client.put(f"/jobs/{job.job_id}/resource-requirements", json=requirements(-1, -1))
    assert (response.status_code, response.json()) == (200, {})
    op = harness.jm.executor.rescales.active(job.job_id)
    assert op is not None and (op.from_parallelism, op.to_parallelism) == (3, 4)


@pytest.mark.parametrize(
    ("body", "errors"),
    [
        ({}, ["Request body does not specify resource requirements."]),
        (
            requirements(1, 2, vertex="nope"),
            [
                "Job vertex [nope] was not found in the JobGraph.",
                f"The request is incomplete, missing job vertex [{GEN}] resource requirements.",
            ],
        ),
        (
            requirements(0, 2),
            [not_positive(0, 2)],
        ),
        (
            requirements(-1, 0),
            [not_positive(1, 0)],
        ),
        (
            requirements(3, 2),
            [f"The requested lower bound [3] for job vertex [{GEN}] is higher than the upper bound [2]."],
        ),
        (
            requirements(1, 129),
            [f"The newly requested parallelism 129 for the job vertex {GEN} exceeds its maximum parallelism 128."],
        ),
        (
            requirements(4, 129),
            [f"The newly requested parallelism 129 for the job vertex {GEN} exceeds its maximum parallelism 128."],
        ),
        (
            {**requirements(1, 2), **requirements(1, 2, vertex="gen")},
            [f"Job vertex [{GEN}] is named twice: [{GEN}] and [gen]."],
        ),
    ],
)
def test_flink_s_validation_errors_are_a_bad_request_and_change_nothing(
    harness: Harness, client: TestClient, body: dict[str, Any], errors: list[str]
) -> None:
    job = running_job(harness)
    assert errors_of(client.put(f"/jobs/{job.job_id}/resource-requirements", json=body), 400) == errors
    assert harness.jm.executor.rescales.active(job.job_id) is None


@pytest.mark.parametrize(
    "body",
    [
        {GEN: {"parallelism": {"lowerBound": "one", "upperBound": 2}}},
        {GEN: {"parallelism": {"lowerBound": 1}}},
        {GEN: {"parallelism": {"lowerBound": 1, "upperBound": 2, "step": 1}}},
        {GEN: 3},
        [1, 2],
    ],
)
def test_a_body_that_is_no_resource_requirements_is_a_bad_request(
    harness: Harness, client: TestClient, body: object
) -> None:
    job = running_job(harness)
    assert errors_of(client.put(f"/jobs/{job.job_id}/resource-requirements", json=body), 400)
    not_json = client.put(
        f"/jobs/{job.job_id}/resource-requirements", content=b"{", headers={"content-type": "application/json"}
    )
    assert errors_of(not_json, 400)
    assert harness.jm.executor.rescales.active(job.job_id) is None


def test_bounds_weir_cannot_meet_are_a_conflict_and_an_unknown_job_is_not_found(
    harness: Harness, client: TestClient
) -> None:
    job = running_job(harness)
    free = sum(max(0, offer.free_slots) for offer in harness.jm.registry.offers())
    slots = free + len(job.slots)
    too_many = client.put(f"/jobs/{job.job_id}/resource-requirements", json=requirements(slots + 1, 128))
    assert errors_of(too_many, 409) == [
        f"job {job.job_id}: its bounds ask for parallelism {slots + 1} at least, the cluster has {slots} slots for it "
        "(free ones and the job's own); add TaskManagers or lower the bound"
    ]
    assert harness.jm.executor.rescales.active(job.job_id) is None
    assert "nope" in errors_of(client.put("/jobs/nope/resource-requirements", json=requirements(1, 2)), 404)[0]
