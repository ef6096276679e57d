"""The rescale decisions, pure (``weir.jobmanager.rescaling``): every refusal before the job is
touched, and every phase of an operation under every event."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest

from weir.core.states import JobStatus
from weir.jobmanager import rescaling as rs

FACTS = rs.RescaleFacts(
    job_id="job-1",
    status=JobStatus.RUNNING,
    parallelism=3,
    requested=2,
    max_parallelism=128,
    rescale_in_progress=None,
    stopping=False,
    finishing=False,
    slots_needed=2,
    slots_available=3,
)


def test_a_running_job_with_the_slots_is_accepted_down_and_up() -> None:
    assert rs.decide_rescale(FACTS) == rs.RescaleAccepted(2)
    assert rs.decide_rescale(replace(FACTS, requested=5, slots_needed=5, slots_available=5)) == rs.RescaleAccepted(5)
    assert rs.decide_rescale(replace(FACTS, requested=128, slots_needed=128, slots_available=200)) == (
        rs.RescaleAccepted(128)
    )


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"requested": 0}, "job job-1: parallelism must be at least 1, got 0"),
        ({"requested": -4}, "job job-1: parallelism must be at least 1, got -4"),
        ({"requested": 129}, "parallelism 129 is above the job's max parallelism 128"),
        ({"status": JobStatus.RESTARTING}, "job job-1 is RESTARTING: only a RUNNING job can be rescaled"),
        ({"status": JobStatus.FINISHED}, "job job-1 is FINISHED: only a RUNNING job can be rescaled"),
        ({"status": JobStatus.CANCELLING}, "job job-1 is CANCELLING: only a RUNNING job can be rescaled"),
        ({"rescale_in_progress": "abc"}, "job job-1 is already being rescaled (request abc)"),
        ({"stopping": True}, "job job-1 is stopping with a savepoint"),
        ({"finishing": True}, "read all its input and is finishing"),
        ({"requested": 3}, "job job-1 already runs at parallelism 3"),
        (
            {"requested": 6, "slots_needed": 6, "slots_available": 4},
            "parallelism 6 needs 6 slots, the cluster has 4 for it",
        ),
    ],
)
def test_a_request_the_job_cannot_take_is_refused_in_one_line(change: dict[str, object], reason: str) -> None:
    decision = rs.decide_rescale(replace(FACTS, **change))  # type: ignore[arg-type]
    assert isinstance(decision, rs.RescaleRefused), decision
    assert reason in decision.reason
    assert "\n" not in decision.reason


def test_the_refusals_come_in_a_fixed_order_every_combination_answers_one() -> None:
    """Every combination of the facts answers exactly one decision; a bad number is named before
    the job's state, the job's state before the slots."""
    for status, in_progress, stopping, finishing, requested, available in itertools.product(
        list(JobStatus), [None, "t"], [False, True], [False, True], [0, 2, 3, 200], [1, 3]
    ):
        facts = replace(
            FACTS,
            status=status,
            rescale_in_progress=in_progress,
            stopping=stopping,
            finishing=finishing,
            requested=requested,
            slots_needed=max(requested, 0),
            slots_available=available,
        )
        decision = rs.decide_rescale(facts)
        ok = (
            1 <= requested <= 128
            and status is JobStatus.RUNNING
            and in_progress is None
            and not stopping
            and not finishing
            and requested != 3
            and requested <= available
        )
        assert isinstance(decision, rs.RescaleAccepted) == ok, (facts, decision)
        if isinstance(decision, rs.RescaleRefused) and not 1 <= requested <= 128:
            assert "parallelism" in decision.reason and str(requested) in decision.reason


OP = rs.RescaleOperation("t1", "job-1", 3, 2, requested_at=10.0)
EVENTS: list[rs.RescaleEvent] = [
    rs.CheckpointTriggered(7),
    rs.CheckpointCompleted(7),
    rs.Redeployed(),
    rs.RescaleFailed("the job was cancelled"),
]


def test_an_operation_goes_checkpointing_redeploying_completed() -> None:
    op = rs.advance(OP, rs.CheckpointTriggered(7), 11.0)
    assert (op.phase, op.checkpoint_id) == (rs.RescalePhase.CHECKPOINTING, 7)
    op = rs.advance(op, rs.CheckpointCompleted(7), 12.0)
    assert (op.phase, op.checkpoint_id, op.finished_at) == (rs.RescalePhase.REDEPLOYING, 7, None)
    op = rs.advance(op, rs.Redeployed(), 15.0)
    assert (op.phase, op.finished_at, op.failure) == (rs.RescalePhase.COMPLETED, 15.0, "")


@pytest.mark.parametrize("phase", list(rs.RescalePhase))
@pytest.mark.parametrize("event", EVENTS)
def test_every_phase_under_every_event(phase: rs.RescalePhase, event: rs.RescaleEvent) -> None:
    op = replace(OP, phase=phase, checkpoint_id=5 if phase is not rs.RescalePhase.CHECKPOINTING else None)
    after = rs.advance(op, event, 20.0)
    if phase.finished:
        assert after == op, "a finished operation never changes"
        return
    match event:
        case rs.RescaleFailed(reason=reason):
            assert (after.phase, after.failure, after.finished_at) == (rs.RescalePhase.FAILED, reason, 20.0)
        case rs.CheckpointTriggered():
            expected = replace(op, checkpoint_id=7) if phase is rs.RescalePhase.CHECKPOINTING else op
            assert after == expected
        case rs.CheckpointCompleted():
            if phase is rs.RescalePhase.CHECKPOINTING:
                assert (after.phase, after.checkpoint_id) == (rs.RescalePhase.REDEPLOYING, 7)
            else:
                assert after == op, "a second completion changes nothing"
        case rs.Redeployed():
            if phase is rs.RescalePhase.REDEPLOYING:
                assert after.phase is rs.RescalePhase.COMPLETED
            else:
                assert after == op, "running again before the checkpoint completed is not the rescale's redeploy"


def test_the_books_keep_one_rescale_per_job_and_the_latest_finished_ones() -> None:
    ops = rs.RescaleOperations(kept=2)
    ops.start(OP)
    with pytest.raises(ValueError, match="already has rescale t1"):
        ops.start(replace(OP, trigger_id="t2"))
    assert ops.on("other-job", rs.Redeployed(), 1.0) is None
    ops.on("job-1", rs.CheckpointCompleted(4), 11.0)
    assert ops.get("job-1", "t1") == ops.active("job-1")
    done = ops.on("job-1", rs.Redeployed(), 12.0)
    assert done is not None and done.phase is rs.RescalePhase.COMPLETED
    assert ops.active("job-1") is None and ops.get("job-1", "t1") == done
    assert ops.get("job-2", "t1") is None, "a trigger id belongs to its job"
    for n in (2, 3):
        ops.start(replace(OP, trigger_id=f"t{n}"))
        ops.on("job-1", rs.RescaleFailed("x"), 13.0)
    assert ops.get("job-1", "t1") is None, "only the latest finished ones are kept"
    assert [ops.get("job-1", t) is not None for t in ("t2", "t3")] == [True, True]


@pytest.mark.parametrize(
    ("parallelism", "max_parallelism", "slots", "target"),
    [
        (3, 128, 6, 6),  # a TaskManager registered: grow to every slot
        (6, 128, 3, 3),  # one was lost: shrink to what is left
        (3, 128, 3, None),  # as it is
        (3, 4, 10, 4),  # never above the max parallelism
        (4, 4, 10, None),
        (3, 128, 0, None),  # no slot at all: nothing to run at, wait
    ],
)
def test_reactive_mode_runs_the_job_at_every_slot_it_could_use(
    parallelism: int, max_parallelism: int, slots: int, target: int | None
) -> None:
    assert rs.reactive_target(parallelism, max_parallelism, slots) == target


# Resource requirements (Flink's PUT /jobs/:jobid/resource-requirements) ------------------------------

SOURCE = rs.RequirementsVertex("source", 1, own=True)  # pinned at 1 in the job's code
WINDOWS = rs.RequirementsVertex("windows", 3, own=False)
SINK = rs.RequirementsVertex("sink", 3, own=False)
REQUIREMENTS = rs.RequirementsFacts(
    job_id="job-1", status=JobStatus.RUNNING, parallelism=3, vertices=(SOURCE, WINDOWS, SINK), slots_available=4
)


def bounds(source: tuple[int, int], windows: tuple[int, int], sink: tuple[int, int]) -> dict[str, rs.ParallelismBounds]:
    return {
        "source": rs.ParallelismBounds(*source),
        "windows": rs.ParallelismBounds(*windows),
        "sink": rs.ParallelismBounds(*sink),
    }


@pytest.mark.parametrize(
    ("requested", "decision"),
    [
        # the highest parallelism within the bounds of every vertex that follows the job's, up to the slots
        (bounds((1, 1), (1, 2), (2, 8)), rs.RescaleWithin(2)),
        (bounds((1, 4), (1, 8), (1, 8)), rs.RescaleWithin(4)),  # 4 slots: not 8
        (bounds((1, 1), (1, 1), (1, 1)), rs.RescaleWithin(1)),
        (bounds((1, 1), (3, 3), (1, 3)), rs.RequirementsMet(3)),  # already runs at 3
        (bounds((1, 2), (2, 3), (3, 5)), rs.RequirementsMet(3)),
    ],
)
def test_bounds_become_the_highest_parallelism_they_share_that_the_slots_allow(
    requested: dict[str, rs.ParallelismBounds], decision: rs.RequirementsDecision
) -> None:
    assert rs.decide_requirements(REQUIREMENTS, requested) == decision


@pytest.mark.parametrize(
    ("facts", "requested", "reason"),
    [
        (
            REQUIREMENTS,
            bounds((2, 4), (1, 2), (1, 2)),
            "job job-1: vertex 'source' runs at its own parallelism 1, set in the job's code, which Weir does not "
            "change: its bounds [2, 4] must include 1",
        ),
        (
            REQUIREMENTS,
            bounds((1, 1), (1, 2), (3, 4)),
            "job job-1: the vertices 'windows' [1, 2], 'sink' [3, 4] run at the job's parallelism, one number for "
            "all of them in Weir, and their bounds have none in common",
        ),
        (
            REQUIREMENTS,
            bounds((1, 1), (6, 8), (5, 8)),
            "job job-1: its bounds ask for parallelism 6 at least, the cluster has 4 slots for it (free ones and "
            "the job's own); add TaskManagers or lower the bound",
        ),
        (
            replace(REQUIREMENTS, status=JobStatus.CANCELED),
            bounds((1, 1), (1, 3), (1, 3)),
            "job job-1 is CANCELED: an ended job has no resource requirements",
        ),
    ],
)
def test_bounds_weir_cannot_run_the_job_within_are_refused_in_one_line(
    facts: rs.RequirementsFacts, requested: dict[str, rs.ParallelismBounds], reason: str
) -> None:
    assert rs.decide_requirements(facts, requested) == rs.RequirementsRefused(reason)


def test_a_vertex_the_bounds_do_not_name_keeps_its_parallelism() -> None:
    requested = {"windows": rs.ParallelismBounds(1, 8)}
    assert rs.decide_requirements(REQUIREMENTS, requested) == rs.RequirementsMet(3), "sink's [3, 3] holds it at 3"


def test_a_job_whose_every_vertex_has_its_own_parallelism_meets_bounds_that_include_them() -> None:
    pinned = replace(REQUIREMENTS, vertices=(SOURCE,))
    assert rs.decide_requirements(pinned, {"source": rs.ParallelismBounds(1, 5)}) == rs.RequirementsMet(3)


def test_every_decision_over_small_bounds_is_within_them_and_the_slots() -> None:
    """Over every pair of bounds for the two vertices that follow the job: a rescale goes to the
    highest parallelism inside both and the slots, never to the one the job runs at."""
    pairs = [(lo, hi) for lo in range(1, 6) for hi in range(lo, 6)]
    for windows, sink in itertools.product(pairs, pairs):
        decision = rs.decide_requirements(REQUIREMENTS, bounds((1, 1), windows, sink))
        lower, upper = max(windows[0], sink[0]), min(windows[1], sink[1])
        match decision:
            case rs.RescaleWithin(parallelism=n) | rs.RequirementsMet(parallelism=n):
                assert n == min(upper, REQUIREMENTS.slots_available) and lower <= n, (windows, sink, decision)
                assert isinstance(decision, rs.RequirementsMet) == (n == REQUIREMENTS.parallelism)
            case rs.RequirementsRefused(reason=reason):
                assert lower > min(upper, REQUIREMENTS.slots_available), (windows, sink, reason)
