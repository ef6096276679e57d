"""The pure placement of a TaskManager's job slots onto its slot workers (``slot_table``): a key keeps
its worker across attempts, two jobs never share one, a worker's death names exactly the tasks it
still ran, and the TaskManager never needs more workers than slots while a worker can be freed."""

from __future__ import annotations

import itertools
import random

import pytest

from weir.taskmanager.slot_table import SlotKey, SlotTable, StartWorker, UseWorker, WorkerId
from weir.taskmanager.task_types import TaskAddress

W1, W2, W3 = WorkerId(1), WorkerId(2), WorkerId(3)


def table(slots: int, spares: int) -> SlotTable:
    t = SlotTable(slots)
    for w in range(1, spares + 1):
        t.add_spare(WorkerId(w))
    return t


def test_each_job_slot_gets_a_spare_of_its_own_and_keeps_it() -> None:
    t = table(2, 2)
    assert t.place(SlotKey("a", 0)) == UseWorker(W1)
    assert t.place(SlotKey("a", 1)) == UseWorker(W2)
    assert t.place(SlotKey("a", 0)) == UseWorker(W1), "the second task of slot 0 joins its pipeline"
    assert t.spares_wanted() == 0


def test_a_key_keeps_its_worker_across_attempts() -> None:
    t = table(2, 2)
    t.place(SlotKey("a", 1))
    t.task_deployed(W1, TaskAddress("a", "map", 1, 1))
    t.task_ended(TaskAddress("a", "map", 1, 1))  # the attempt failed over
    assert t.place(SlotKey("a", 1)) == UseWorker(W1), "the warm worker of that slot, not the spare"


def test_two_jobs_never_share_a_worker() -> None:
    t = table(2, 1)
    t.place(SlotKey("a", 0))
    decision = t.place(SlotKey("b", 0))
    assert decision == StartWorker(retire=None), "job a's worker has no task, but it is job a's"
    with pytest.raises(ValueError, match="runs job a"):
        t.bind(W1, SlotKey("b", 0))


def test_a_slot_that_moved_takes_its_jobs_idle_worker_when_no_spare_is_left() -> None:
    t = table(2, 2)
    t.place(SlotKey("a", 0))
    t.place(SlotKey("a", 1))
    t.task_deployed(W1, TaskAddress("a", "src", 0, 1))
    decision = t.place(SlotKey("a", 2))  # after a fail-over the job's slots here are 1 and 2
    assert decision == UseWorker(W2), "slot 1's worker had no task: it takes slot 2"
    assert t.worker_of_key(SlotKey("a", 1)) is None
    assert t.worker_of_key(SlotKey("a", 2)) == W2


def test_a_busy_worker_is_never_rebound() -> None:
    t = table(1, 1)
    t.place(SlotKey("a", 0))
    t.task_deployed(W1, TaskAddress("a", "src", 0, 1))
    assert t.place(SlotKey("a", 1)) == StartWorker(retire=None)
    assert t.worker_of_key(SlotKey("a", 0)) == W1


def test_at_capacity_a_task_less_worker_of_another_job_is_retired_for_a_new_one() -> None:
    t = table(2, 2)
    t.place(SlotKey("a", 0))
    t.place(SlotKey("b", 0))
    t.task_deployed(W2, TaskAddress("b", "src", 0, 1))
    assert t.place(SlotKey("c", 0)) == StartWorker(retire=W1)


def test_at_capacity_with_every_worker_busy_nothing_is_retired() -> None:
    t = table(1, 1)
    t.place(SlotKey("a", 0))
    t.task_deployed(W1, TaskAddress("a", "src", 0, 1))
    assert t.place(SlotKey("b", 0)) == StartWorker(retire=None)


def test_a_dead_worker_names_the_tasks_it_still_ran_and_only_those() -> None:
    t = table(2, 2)
    t.place(SlotKey("a", 0))
    t.place(SlotKey("a", 1))
    running, finished, elsewhere = (
        TaskAddress("a", "src", 0, 2),
        TaskAddress("a", "sink", 0, 2),
        TaskAddress("a", "src", 1, 2),
    )
    t.task_deployed(W1, running)
    t.task_deployed(W1, finished)
    t.task_deployed(W2, elsewhere)
    t.task_ended(finished)
    assert t.remove(W1) == (running,)
    assert t.worker_of(running) is None and t.worker_of_key(SlotKey("a", 0)) is None
    assert t.worker_of(elsewhere) == W2
    assert t.remove(W1) == (), "a second removal (retired, then its link ended) reports nothing"
    assert t.spares_wanted() == 1 and t.spares_wanted(starting=1) == 0


def test_a_task_reported_for_a_worker_already_gone_is_not_tracked() -> None:
    t = table(1, 1)
    t.place(SlotKey("a", 0))
    t.remove(W1)
    t.task_deployed(W1, TaskAddress("a", "src", 0, 1))
    assert t.worker_of(TaskAddress("a", "src", 0, 1)) is None
    assert not t.job_has_tasks("a")


def test_a_job_over_retires_exactly_its_workers() -> None:
    t = table(3, 3)
    t.place(SlotKey("a", 0))
    t.place(SlotKey("b", 0))
    t.place(SlotKey("a", 1))
    assert t.job_over("a") == [W1, W3]
    assert t.workers_of_job("b") == [W2]


@pytest.mark.parametrize("seed", range(30))
def test_random_deploys_and_deaths_keep_the_invariants(seed: int) -> None:
    """Random placements, deployments, task ends, deaths and job ends: a worker runs one job's tasks;
    a key has one worker; a busy worker's key is never taken; every worker the table answers exists;
    the table never wants more spares than free slots; and while every slot is taken by a busy
    worker, no placement takes a worker away."""
    rng = random.Random(seed)
    slots = rng.randint(1, 3)
    t = SlotTable(slots)
    ids = itertools.count(1)
    for _ in range(t.spares_wanted()):
        t.add_spare(WorkerId(next(ids)))
    live: dict[TaskAddress, WorkerId] = {}
    attempt = 1
    for _step in range(200):
        action = rng.choice(["deploy", "deploy", "end", "die", "job_over"])
        if action == "deploy":
            key = SlotKey(rng.choice("ab"), rng.randrange(3))
            busy_before = {w: t.tasks_of(w) for w in t.workers()}
            decision = t.place(key)
            match decision:
                case UseWorker(worker=worker):
                    assert t.job_of(worker) == key.job_id
                    if worker in busy_before and busy_before[worker]:
                        assert all(SlotKey.of(a) == key for a in busy_before[worker]), "a busy worker was rebound"
                case StartWorker(retire=retire):
                    if retire is not None:
                        assert not t.tasks_of(retire), "a busy worker was retired"
                        t.remove(retire)
                    worker = WorkerId(next(ids))
                    t.add_spare(worker)
                    t.bind(worker, key)
            task = TaskAddress(key.job_id, rng.choice(["src", "sink"]), key.subtask, attempt)
            if task not in live:
                t.task_deployed(worker, task)
                live[task] = worker
        elif action == "end" and live:
            task = rng.choice(sorted(live, key=str))
            t.task_ended(task)
            del live[task]
        elif action == "die" and t.workers():
            worker = rng.choice(t.workers())
            lost = t.remove(worker)
            assert set(lost) == {a for a, w in live.items() if w == worker}
            for task in lost:
                del live[task]
            attempt += 1
        elif action == "job_over":
            job = rng.choice("ab")
            for worker in t.job_over(job):
                for task in t.remove(worker):
                    del live[task]
        for worker in t.workers():
            jobs = {a.job_id for a in t.tasks_of(worker)}
            assert jobs <= {t.job_of(worker)}, "one job per worker"
        assert {a: t.worker_of(a) for a in live} == live
        assert t.spares_wanted() == max(0, slots - len(t.workers()))
