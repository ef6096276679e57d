"""The TaskManager registry: incarnations, heartbeats (progress, stale-attempt cancels), liveness, slots."""

from __future__ import annotations

from tests.unit.jobmanager.conftest import FakeClock, FakeGateway, Harness
from weir.core.states import JobStatus
from weir.jobmanager.jobs import JobMaster
from weir.jobmanager.messages import Heartbeat, JobAttempt, TaskProgress
from weir.jobmanager.registry import HEARTBEAT_TIMEOUT_S, RegisteredTaskManager, TaskManagerRegistry
from weir.jobmanager.scheduler import SlotOffer


def registry(jobs: dict[str, JobMaster] | None = None) -> tuple[TaskManagerRegistry, list[tuple[str, str]], FakeClock]:
    lost: list[tuple[str, str]] = []
    clock = FakeClock()

    def on_lost(tm: RegisteredTaskManager, why: str) -> None:
        lost.append((tm.taskmanager_id, why))

    return TaskManagerRegistry(jobs or {}, FakeGateway(), clock, on_lost), lost, clock


def test_a_new_incarnation_under_a_known_name_reports_the_old_one_lost() -> None:
    reg, lost, _ = registry()
    reg.register("tm-a", "a:1", 4, 0, incarnation="first")
    reg.register("tm-a", "a:1", 4, 0, incarnation="first")  # the same process again: nothing lost
    assert lost == []
    reg.register("tm-a", "a:2", 4, 0, incarnation="second")
    assert lost == [("tm-a", "restarted: registered again as a new process")]
    assert reg.taskmanagers["tm-a"].address == "a:2" and reg.taskmanagers["tm-a"].incarnation == "second"


def test_the_same_incarnation_registering_again_refreshes_its_heartbeat() -> None:
    reg, _, clock = registry()
    reg.register("tm-a", "a:1", 4, 0, incarnation="first")
    clock.advance(5.0)
    reg.register("tm-a", "a:1", 4, 0, incarnation="first")
    assert reg.taskmanagers["tm-a"].last_heartbeat == clock()


def test_an_unknown_or_lost_taskmanager_is_asked_to_register_again() -> None:
    reg, _, _ = registry()
    assert reg.heartbeat(Heartbeat("tm-x", ())).reregister
    reg.register("tm-a", "a:1", 4, 0, incarnation="first")
    reg.mark_lost(reg.taskmanagers["tm-a"], "test")
    assert reg.heartbeat(Heartbeat("tm-a", ())).reregister


def test_a_heartbeat_applies_progress_of_the_current_attempt_and_cancels_the_rest(harness: Harness) -> None:
    job = harness.job()
    answer = harness.jm.registry.heartbeat(
        Heartbeat(
            "tm-a",
            (
                TaskProgress("job-1", "gen", 0, job.attempt, records_in=7, records_out=5),
                TaskProgress("job-1", "gen", 0, 3, records_in=0, records_out=0),  # not the current attempt
                TaskProgress("ghost", "x", 0, 1, records_in=0, records_out=0),
            ),
        )
    )
    assert not answer.reregister
    assert answer.cancel == (JobAttempt("ghost", 1), JobAttempt("job-1", 3))
    assert (job.tasks[("gen", 0)].records_in, job.tasks[("gen", 0)].records_out) == (7, 5)


def test_a_taskmanager_silent_past_the_timeout_is_reported(harness: Harness) -> None:
    reg = harness.jm.registry
    assert reg.silent(harness.clock()) == []
    harness.clock.advance(HEARTBEAT_TIMEOUT_S + 0.5)
    ((tm, why),) = reg.silent(harness.clock())
    assert tm.taskmanager_id == "tm-a" and why == f"no heartbeat for {HEARTBEAT_TIMEOUT_S + 0.5:.1f}s"


def test_offers_count_the_slots_running_jobs_use_on_live_taskmanagers(make_harness) -> None:  # type: ignore[no-untyped-def]
    h: Harness = make_harness(taskmanagers=("tm-a", "tm-b"))
    job = h.job()
    assert job.status is JobStatus.RUNNING
    assert sorted(h.jm.registry.offers(), key=lambda o: o.taskmanager_id) == [
        SlotOffer("tm-a", 3),
        SlotOffer("tm-b", 4),
    ]
    h.jm.registry.mark_lost(h.jm.taskmanagers["tm-b"], "test")
    assert h.jm.registry.offers() == [SlotOffer("tm-a", 3)]
    assert h.jm.registry.addresses() == {"tm-a": "tm-a:6124"}
