"""Which slot worker runs which of a TaskManager's slots: a pure table, no process in it.

The JobManager shares slots as Flink does: job slot ``i`` runs subtask ``i`` of every vertex, so the
tasks of one job with one subtask index form one slot's pipeline. The TaskManager gives each such
:class:`SlotKey` a worker process of its own (one core each), and never puts two jobs in one worker
(each job's code in its own interpreter). A key keeps its worker across the job's attempts, so a
fail-over redeploys into the same warm process; a worker is retired when its job is over here.

:meth:`SlotTable.place` decides in this order: the worker the key already has; a spare (started
ahead, bound to no job); a worker of the same job left without tasks (the job's slots here moved);
else a new worker, retiring a task-less worker of another job when the TaskManager already runs as
many workers as it has slots. Flink's ``TaskSlotTable`` keeps the same bookkeeping for threads.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NewType, assert_never

from weir.taskmanager.task_types import TaskAddress

WorkerId = NewType("WorkerId", int)


@dataclass(frozen=True, order=True)
class SlotKey:
    """One job slot on this TaskManager: the tasks of ``job_id`` with this subtask index."""

    job_id: str
    subtask: int

    @classmethod
    def of(cls, task: TaskAddress) -> SlotKey:
        return cls(task.job_id, task.subtask)


@dataclass(frozen=True)
class UseWorker:
    """The key runs in ``worker`` (bound to it now, if it was not)."""

    worker: WorkerId


@dataclass(frozen=True)
class StartWorker:
    """No worker can take the key: start one, then :meth:`SlotTable.bind` it; ``retire``: a
    task-less worker of another job to stop first (the TaskManager runs a worker per slot already)."""

    retire: WorkerId | None = None


Placement = UseWorker | StartWorker


@dataclass
class _Worker:
    job_id: str | None = None  # None: a spare
    keys: set[SlotKey] = field(default_factory=set)
    tasks: set[TaskAddress] = field(default_factory=set)  # deployed and not ended


class SlotTable:
    """The workers of one TaskManager with ``slots`` slots, by id; see the module."""

    def __init__(self, slots: int) -> None:
        self.slots = slots
        self._workers: dict[WorkerId, _Worker] = {}
        self._keys: dict[SlotKey, WorkerId] = {}
        self._tasks: dict[TaskAddress, WorkerId] = {}

    # Workers ------------------------------------------------------------------------------------------

    def add_spare(self, worker: WorkerId) -> None:
        """A new worker is ready, bound to no job."""
        self._workers[worker] = _Worker()

    def spares_wanted(self, starting: int = 0) -> int:
        """Workers to start so that the TaskManager runs one per slot (``starting``: already on their way)."""
        return max(0, self.slots - len(self._workers) - starting)

    def workers(self) -> list[WorkerId]:
        return sorted(self._workers)

    def job_of(self, worker: WorkerId) -> str | None:
        return self._workers[worker].job_id

    def remove(self, worker: WorkerId) -> tuple[TaskAddress, ...]:
        """The worker is gone (it died, or it was retired): answers the tasks it still ran, which
        the TaskManager reports FAILED."""
        gone = self._workers.pop(worker, None)
        if gone is None:
            return ()
        for key in gone.keys:
            if self._keys.get(key) == worker:
                del self._keys[key]
        for task in gone.tasks:
            self._tasks.pop(task, None)
        return tuple(sorted(gone.tasks, key=str))

    # Placement ----------------------------------------------------------------------------------------

    def place(self, key: SlotKey) -> Placement:
        """Where the key's tasks run; see the module for the order of the rules. Binds the worker
        it answers."""
        bound = self._keys.get(key)
        if bound is not None:
            return UseWorker(bound)
        spare = next((w for w, s in sorted(self._workers.items()) if s.job_id is None), None)
        if spare is not None:
            self.bind(spare, key)
            return UseWorker(spare)
        idle_same_job = next(
            (w for w, s in sorted(self._workers.items()) if s.job_id == key.job_id and not s.tasks), None
        )
        if idle_same_job is not None:
            self.bind(idle_same_job, key)
            return UseWorker(idle_same_job)
        if len(self._workers) < self.slots:
            return StartWorker()
        idle_other = next((w for w, s in sorted(self._workers.items()) if not s.tasks), None)
        return StartWorker(retire=idle_other)

    def bind(self, worker: WorkerId, key: SlotKey) -> None:
        """The worker runs the key's tasks from now on; a worker of the same job keeps no other key
        it had (its tasks ended: that slot moved)."""
        state = self._workers[worker]
        if state.job_id is not None and state.job_id != key.job_id:
            raise ValueError(f"worker {worker} runs job {state.job_id}: it cannot take a slot of job {key.job_id}")
        for old in state.keys - {key}:
            if self._keys.get(old) == worker:
                del self._keys[old]
        state.job_id = key.job_id
        state.keys = {key}
        self._keys[key] = worker

    def worker_of_key(self, key: SlotKey) -> WorkerId | None:
        return self._keys.get(key)

    # Tasks ---------------------------------------------------------------------------------------------

    def task_deployed(self, worker: WorkerId, task: TaskAddress) -> None:
        if worker not in self._workers:
            return  # it died meanwhile: remove() answered its tasks already
        self._workers[worker].tasks.add(task)
        self._tasks[task] = worker

    def task_ended(self, task: TaskAddress) -> None:
        worker = self._tasks.pop(task, None)
        if worker is not None and worker in self._workers:
            self._workers[worker].tasks.discard(task)

    def worker_of(self, task: TaskAddress) -> WorkerId | None:
        return self._tasks.get(task)

    def tasks_of(self, worker: WorkerId) -> tuple[TaskAddress, ...]:
        state = self._workers.get(worker)
        return tuple(sorted(state.tasks, key=str)) if state is not None else ()

    def workers_of_job(self, job_id: str) -> list[WorkerId]:
        return [w for w, s in sorted(self._workers.items()) if s.job_id == job_id]

    def job_over(self, job_id: str) -> list[WorkerId]:
        """The job ended here (cancelled for good, or its last task here finished): its workers, to
        retire. A worker never runs a second job."""
        return self.workers_of_job(job_id)

    def job_has_tasks(self, job_id: str) -> bool:
        return any(t.job_id == job_id for t in self._tasks)


def describe(placement: Placement) -> str:
    match placement:
        case UseWorker(worker=worker):
            return f"worker {worker}"
        case StartWorker(retire=retire):
            return "a new worker" + (f", retiring worker {retire}" if retire is not None else "")
        case _:
            assert_never(placement)
