"""Flink's ``/jobs/:jobid/resource-requirements`` (the adaptive scheduler's per-vertex parallelism
bounds, ``JobResourceRequirementsBody``): ``GET`` answers each vertex's bounds, ``PUT`` takes new ones,
checked by Flink's own rules (``JobResourceRequirements.validate``, its messages word for word) before
the JobManager maps them onto a live rescale (``weir.jobmanager.rescaling.decide_requirements``).

A request names vertices by their id in Flink's form (``weir.jobmanager.rest.ids.flink_vertex_id``) or,
as every vertex path takes, by their uid. Flink's ``-1`` stands for no bound: 1 below, the max
parallelism above."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from weir.jobmanager.errors import ResourceRequirementsError
from weir.jobmanager.messages import JobPlanView
from weir.jobmanager.rescaling import ParallelismBounds
from weir.jobmanager.rest.ids import flink_vertex_id
from weir.jobmanager.rest.vertices import find_vertex
from weir.jobmanager.rest.views import VertexResourceRequirements

NO_BOUND: Final = -1
EMPTY_BODY: Final = "Request body does not specify resource requirements."


def validated_bounds(
    plan: JobPlanView, requested: Mapping[str, VertexResourceRequirements]
) -> dict[str, ParallelismBounds]:
    """The bounds by vertex uid, ``-1`` expanded; ResourceRequirementsError with every problem Flink's
    validation finds (one line each), none changed."""
    if not requested:
        raise ResourceRequirementsError((EMPTY_BODY,))
    problems: list[str] = []
    bounds: dict[str, ParallelismBounds] = {}
    named_as: dict[str, str] = {}
    max_parallelism = plan.max_parallelism
    for key, requirements in requested.items():
        vertex = find_vertex(plan.vertices, key)
        if vertex is None:
            problems.append(f"Job vertex [{key}] was not found in the JobGraph.")
            continue
        if vertex.uid in named_as:
            first = named_as[vertex.uid]
            problems.append(f"Job vertex [{flink_vertex_id(vertex.uid)}] is named twice: [{first}] and [{key}].")
            continue
        named_as[vertex.uid] = key
        wanted = requirements.parallelism
        lower = 1 if wanted.lower_bound == NO_BOUND else wanted.lower_bound
        upper = max_parallelism if wanted.upper_bound == NO_BOUND else wanted.upper_bound
        if lower < 1 or upper < 1:
            problems.append(
                f"Both, the requested lower bound [{lower}] and upper bound [{upper}] for job vertex [{key}] must be "
                "greater than zero."
            )
            continue
        if lower > upper:
            problems.append(
                f"The requested lower bound [{lower}] for job vertex [{key}] is higher than the upper bound [{upper}]."
            )
        if max_parallelism < upper:
            problems.append(
                f"The newly requested parallelism {upper} for the job vertex {key} exceeds its maximum parallelism "
                f"{max_parallelism}."
            )
        bounds[vertex.uid] = ParallelismBounds(lower, upper)
    for vertex in plan.vertices:
        if vertex.uid not in named_as:
            problems.append(
                f"The request is incomplete, missing job vertex [{flink_vertex_id(vertex.uid)}] resource requirements."
            )
    if problems:
        raise ResourceRequirementsError(tuple(problems))
    return bounds
