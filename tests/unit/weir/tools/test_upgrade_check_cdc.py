"""``weir upgrade check`` over a PostgreSQL CDC source's savepoint (``source-position``): the new job's
source parallelism against the state, decided by the restore's own function
(``weir.core.cdc.redistribute_stored``), so the check says what the restore then does: after the
snapshot any parallelism passes (info), mid-snapshot one below the snapshot's partitions fails with
the restore's line, a source of another slot fails as its restore would."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.conftest import MakeContext
from tests.unit.operators.test_inherited_state import inherited
from tests.unit.weir.tools.test_savepoint_inspect import CHECKPOINT, JOB, Built, build_savepoint
from weir.connectors.object_storage import FileCheckpointStorage
from weir.core.cdc import CdcState, ChunkRead, Phase, XidSnapshot, encode_cdc_state
from weir.core.descriptors import PostgresCdcSourceSpec
from weir.core.ids import OperatorUid, SubtaskIndex, TaskId
from weir.core.keygroups import key_group_range_for_subtask
from weir.core.paths import CheckpointPaths, external_path
from weir.core.task_state import InlineOperatorState, SubtaskLayout, TaskStateDocument, encode_task_state
from weir.jobmanager.checkpointing.metadata import encode_metadata
from weir.jobmanager.checkpointing.pending import TaskStateHandle
from weir.jobmanager.checkpointing.store import CompletedCheckpoint
from weir.operators.base import NO_SIDE_OUTPUTS, StateNotRedistributableError
from weir.operators.cdc_source import PostgresCdcSourceOperator
from weir.tools.upgrade_check import FindingKind, Severity, upgrade_check

UID = "orders-cdc"
SLOT = "orders_cdc"


def _chunk(partition: int) -> ChunkRead:
    return ChunkRead("public.orders", (9,), XidSnapshot(5, 5), 120, partition)


def cdc_savepoint(root: Path, states: list[CdcState]) -> Path:
    """A savepoint of a job whose only vertex is the CDC source, one subtask per state."""
    storage = FileCheckpointStorage(root / "storage")
    handles = []
    parallelism = len(states)
    for s, state in enumerate(states):
        kg = key_group_range_for_subtask(128, parallelism, SubtaskIndex(s))
        document = TaskStateDocument(
            job_id=JOB,
            vertex_uid=UID,
            subtask=s,
            attempt=1,
            checkpoint_id=CHECKPOINT,
            layout=SubtaskLayout(parallelism, 128, kg, (UID,), (), {}),
            operator_state=InlineOperatorState({UID: encode_cdc_state(state, SLOT)}),
            keyed_state=None,
        )
        task = TaskId(JOB, OperatorUid(UID), SubtaskIndex(s))
        handles.append(TaskStateHandle(task, (), inline_payload=encode_task_state(document)))
    key = CheckpointPaths().metadata(JOB, CHECKPOINT)
    checkpoint = CompletedCheckpoint(CHECKPOINT, JOB, 1764578000.25, 1764578001.5, tuple(handles), key)
    storage.put_bytes(key, encode_metadata(checkpoint))
    return build_savepoint(Built(storage, key, external_path(storage.uri, key), checkpoint), root / "savepoint")


def job(folder: Path, parallelism: int, slot: str = SLOT) -> Path:
    path = folder / f"cdc_job_{parallelism}_{slot}.py"
    path.write_text(
        "from weir.api import Environment\n\n\ndef build(env: Environment) -> None:\n"
        f'    changes = env.from_postgres_cdc(["orders"], uid="{UID}", slot_name="{slot}", parallelism={parallelism})\n'
        '    changes.sink_to_kafka("out", uid="out", serializer=lambda e: repr(e).encode())\n'
    )
    return path


MID_SNAPSHOT = [CdcState(Phase.SNAPSHOT, 100, (_chunk(s),), 3) for s in range(3)]
STREAMING = [
    CdcState(Phase.STREAMING, 200, (_chunk(0), _chunk(2)), 3),
    CdcState(Phase.PARTITION_READ, 100, (_chunk(1),), 3),
    CdcState(Phase.PARTITION_READ, 100, (_chunk(2),), 3),
]


def findings(tmp_path: Path, states: list[CdcState], parallelism: int, slot: str = SLOT) -> list[tuple[Severity, str]]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    savepoint = cdc_savepoint(tmp_path / "sp", states)
    report = upgrade_check(job(tmp_path, parallelism, slot), str(savepoint), work_dir=tmp_path / "work")
    return [(f.severity, f.reason) for f in report.findings if f.kind is FindingKind.SOURCE_POSITION and f.uid == UID]


def restore_line(states: list[CdcState], subtask: int, parallelism: int, make_context: MakeContext) -> str | None:
    """What the source's restore says (None: it takes the state)."""
    operator = PostgresCdcSourceOperator(PostgresCdcSourceSpec(("orders",), SLOT, SLOT))
    operator.setup(make_context(UID, subtask, parallelism), None, NO_SIDE_OUTPUTS)  # type: ignore[arg-type]
    try:
        operator.restore_inherited_state(
            [inherited(s, len(states), encode_cdc_state(state, SLOT)) for s, state in enumerate(states)]
        )
    except StateNotRedistributableError as exc:
        return str(exc)
    return None


@pytest.mark.parametrize("parallelism", [1, 2, 4])
def test_after_the_snapshot_another_parallelism_passes_and_says_how(
    tmp_path: Path, make_context: MakeContext, parallelism: int
) -> None:
    phases = ", ".join(["#0 streaming", *(f"#{i} idle" for i in range(1, parallelism))])
    assert findings(tmp_path, STREAMING, parallelism) == [
        (Severity.INFO, f"restored from parallelism 3 at {parallelism}: {phases}")
    ]
    assert all(restore_line(STREAMING, s, parallelism, make_context) is None for s in range(parallelism))


def test_mid_snapshot_below_its_partitions_fails_with_the_restores_line(
    tmp_path: Path, make_context: MakeContext
) -> None:
    found = findings(tmp_path, MID_SNAPSHOT, 2)
    line = restore_line(MID_SNAPSHOT, 0, 2, make_context)
    assert line is not None and line.startswith(f"postgres cdc source {UID!r}: the checkpoint was taken while 3")
    assert found == [(Severity.FATAL, line)], "the check says what the restore says"


def test_mid_snapshot_above_and_at_its_partitions_passes_as_the_restore_takes_it(
    tmp_path: Path, make_context: MakeContext
) -> None:
    assert findings(tmp_path, MID_SNAPSHOT, 3) == [], "its own parallelism: nothing to say"
    assert findings(tmp_path / "up", MID_SNAPSHOT, 4) == [
        (Severity.INFO, "restored from parallelism 3 at 4: #0 snapshot, #1 snapshot, #2 snapshot, #3 idle")
    ]
    assert all(restore_line(MID_SNAPSHOT, s, 4, make_context) is None for s in range(4))


def test_another_slot_fails_as_its_restore_would(tmp_path: Path) -> None:
    found = findings(tmp_path, STREAMING, 3, slot="other_slot")
    assert [s for s, _ in found] == [Severity.FATAL]
    assert "the restored state is of replication slot 'orders_cdc', this source reads 'other_slot'" in found[0][1]
