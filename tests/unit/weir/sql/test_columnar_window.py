"""weir.sql.columnar_window: a SQL window aggregation (TUMBLE, HOP) pre-aggregated on Arrow batches
emits what the per-record window operator emits, record for record (multisets of whole records with
their timestamps, late-data side output included), over random out-of-order streams with NULLs and
late rows, at odd batch sizes, restored mid-stream from either path's snapshot and at another
parallelism; what it does not vectorize stays per record and EXPLAIN says why."""

from __future__ import annotations

import json
import random
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.unit.conftest import CollectingOutput, MakeContext
from tests.unit.weir.sql.test_columnar import nexmark_script
from tests.unit.weir.tools.test_jobtest import no_services  # noqa: F401 (autouse: every client refused)
from weir.core.keygroups import key_group_for_key
from weir.core.process_functions import OutputTag
from weir.core.watermarks import MAX_WATERMARK
from weir.core.windows import SlidingEventTimeWindows, TumblingEventTimeWindows
from weir.operators.base import InheritedState, SideOutputs
from weir.operators.windows import WindowAggregateOperator
from weir.sql import columnar_window as cw
from weir.sql import explain, operators_of, plan_script
from weir.sql.columnar_window import ColumnarWindowOperator, WindowFallback, window_columnar
from weir.sql.compile import Accumulators, WindowAggregation
from weir.sql.plan import Aggregate, Node

if TYPE_CHECKING:
    from weir.testing import RunJob

pytest_plugins = ["weir.testing"]

LATE = OutputTag("late")
TABLE = """CREATE TABLE t (k BIGINT, g STRING, a BIGINT, s STRING, x DOUBLE, ts BIGINT,
  et AS CAST(ts AS TIMESTAMP(3)), WATERMARK FOR et AS et - INTERVAL '0' SECOND) WITH ('connector' = 'datagen');
CREATE TABLE out (k BIGINT, g STRING, window_start TIMESTAMP(3), window_end TIMESTAMP(3), n BIGINT, c BIGINT,
  total BIGINT, low BIGINT, high BIGINT, mean BIGINT, first_s STRING, last_s STRING) WITH ('connector' = 'print');
"""
CALLS = (
    "COUNT(*) AS n, COUNT(a) AS c, SUM(a) AS total, MIN(a) AS low, MAX(a) AS high, AVG(a) AS mean, "
    "MIN(s) AS first_s, MAX(s) AS last_s"
)
WINDOWS = {
    "tumble": ("TUMBLE(TABLE t, DESCRIPTOR(et), INTERVAL '0.05' SECOND)", TumblingEventTimeWindows(50)),
    "hop": ("HOP(TABLE t, DESCRIPTOR(et), INTERVAL '0.03' SECOND, INTERVAL '0.09' SECOND)", None),
    "hop-uneven": ("HOP(TABLE t, DESCRIPTOR(et), INTERVAL '0.02' SECOND, INTERVAL '0.1' SECOND)", None),
}
Step = tuple[str, Any]  # ("row", (row, ts)) or ("watermark", wm)


def statement(window: str, calls: str = CALLS, keys: str = "k, g") -> str:
    return (
        TABLE
        + f"INSERT INTO out SELECT {keys}, window_start, window_end, {calls}\n"
        + f"FROM TABLE({WINDOWS[window][0]}) GROUP BY {keys}, window_start, window_end;"
    )


def aggregate_of(text: str) -> Aggregate:
    (planned,) = plan_script(text).inserts
    node: Node = planned.plan.sink.input
    while not isinstance(node, Aggregate):
        node = node.input  # type: ignore[union-attr]
    return node


def name_of(node: Aggregate, function: str, argument: str = "a") -> str:
    """The aggregate's column of ``function(argument)``."""
    return next(c.name for c in node.calls if c.function == function and c.sql == f"{function}({argument})")


def assigner_of(node: Aggregate) -> TumblingEventTimeWindows | SlidingEventTimeWindows:
    window = node.window
    assert window is not None
    if window.kind == "TUMBLE":
        return TumblingEventTimeWindows(window.size_ms)
    return SlidingEventTimeWindows(window.size_ms, window.slide_ms)


def operators(
    node: Aggregate, lateness: int
) -> tuple[Callable[[], WindowAggregateOperator], Callable[[], ColumnarWindowOperator]]:
    """Factories of the per-record operator and the columnar one, as weir.sql.compile builds them."""
    keys = tuple(k.evaluate for k in node.keys)
    names = tuple(k.name for k in node.keys)

    def key_of(row: Any) -> tuple[Any, ...]:
        return tuple(f(row) for f in keys)

    def fn() -> WindowAggregation:
        return WindowAggregation(names, Accumulators(node.calls))

    return (
        lambda: WindowAggregateOperator(fn(), key_of, assigner_of(node), lateness, late_data=LATE),
        lambda: ColumnarWindowOperator(fn(), key_of, node.calls, assigner_of(node), lateness, late_data=LATE),
    )


def random_steps(rng: random.Random, n: int, big: bool = False) -> list[Step]:
    """Rows of 9 keys (k and g, NULLs among both), NULL and non-NULL values, out of order by up to
    60 ms, some (5 %) up to 400 ms behind; a watermark every few rows, 40 ms behind the largest
    timestamp (so some rows are late)."""
    steps: list[Step] = []
    top = 0
    for i in range(n):
        ts = i + rng.randrange(-60, 10)
        if rng.random() < 0.05:
            ts -= rng.randrange(400)
        top = max(top, ts)
        a = None if rng.random() < 0.2 else rng.randrange(-50, 100) * (2**60 if big else 1)
        row = {
            "k": None if rng.random() < 0.05 else rng.randrange(3),
            "g": rng.choice([None, "x", "yé", "z"]),
            "a": a,
            "s": None if rng.random() < 0.3 else rng.choice(["b", "ab", "é", "z", ""]),
            "x": rng.random(),
            "ts": ts,
        }
        row["et"] = ts
        steps.append(("row", (row, ts)))
        if rng.random() < 0.15:
            steps.append(("watermark", top - 40 - rng.randrange(30)))
    return steps


def frozen(value: Any) -> Any:
    return tuple(sorted(value.items())) if isinstance(value, dict) else value


class Run:
    """Operators of one job fed steps: results and late-data side output as multisets of whole
    records with their timestamps, over all its incarnations."""

    def __init__(self, make_context: MakeContext) -> None:
        self.make_context = make_context
        self.main = CollectingOutput()
        self.late = CollectingOutput()
        self.dropped = 0

    def start(self, op: Any, uid: str, restore: bytes | None = None, subtask: int = 0, parallelism: int = 1) -> Any:
        op.setup(
            self.make_context(uid, subtask=subtask, parallelism=parallelism),
            self.main,
            SideOutputs({"late": self.late}),
        )
        if restore is not None:
            op.restore_state(restore)
        op.open()
        return op

    def feed(self, op: Any, steps: list[Step]) -> None:
        before = op.late_records_dropped
        for kind, item in steps:
            if kind == "row":
                op.process(*item)
            else:
                op.process_watermark(item)
        self.dropped += op.late_records_dropped - before

    def finish(self, op: Any) -> None:
        self.feed(op, [("watermark", MAX_WATERMARK)])
        op.end_input()

    def results(self) -> Counter[Any]:
        return Counter((frozen(v), ts) for v, ts in self.main.records)

    def late_values(self) -> Counter[Any]:
        return Counter((frozen(v), ts) for v, ts in self.late.records)


def whole(make_context: MakeContext, factory: Callable[[], Any], steps: list[Step], uid: str) -> Run:
    run = Run(make_context)
    op = run.start(factory(), uid)
    run.feed(op, steps)
    run.finish(op)
    return run


@pytest.mark.parametrize("batch", [1, 7, 4_096])
@pytest.mark.parametrize("lateness", [0, 45])
@pytest.mark.parametrize("seed", [1, 2])
@pytest.mark.parametrize("window", list(WINDOWS))
def test_columnar_windows_emit_what_the_per_record_path_emits(
    make_context: MakeContext, monkeypatch: pytest.MonkeyPatch, window: str, seed: int, lateness: int, batch: int
) -> None:
    monkeypatch.setattr(cw, "BATCH_ROWS", batch)
    node = aggregate_of(statement(window))
    assert window_columnar(node) is None
    per_record, columnar = operators(node, lateness)
    steps = random_steps(random.Random(seed), 2_500)
    expected = whole(make_context, per_record, steps, "per-record")
    run = Run(make_context)
    op = run.start(columnar(), "columnar")
    run.feed(op, steps)
    run.finish(op)
    assert run.results() == expected.results()
    assert sum(expected.results().values()) > 100
    assert run.late_values() == expected.late_values() != Counter()  # the stream has late rows
    assert run.dropped == expected.dropped > 0
    assert op.rows_grouped > 1_500  # most rows aggregated on batches
    assert op.batches_per_record == 0
    records = [v for v, _ts in expected.main.records]
    total = name_of(node, "SUM")
    assert any(r["k"] is None for r in records) and any(r[total] is None for r in records)  # NULL keys, NULL sums
    if lateness:  # late firings: some window emitted more than once
        assert len({(r["k"], r["g"], r["window_start"]) for r in records}) < len(records)


@pytest.mark.parametrize("window", ["tumble", "hop"])
def test_sums_beyond_int64_are_exact(make_context: MakeContext, window: str) -> None:
    node = aggregate_of(statement(window))
    per_record, columnar = operators(node, 0)
    steps = random_steps(random.Random(3), 1_500, big=True)
    expected = whole(make_context, per_record, steps, "per-record")
    run = whole(make_context, columnar, steps, "columnar")
    assert run.results() == expected.results()
    total = name_of(node, "SUM")
    assert any(abs(v[total] or 0) >= 2**63 for v, _ts in expected.main.records)


def test_a_double_argument_is_aggregated_per_record(make_context: MakeContext) -> None:
    """A float sum depends on the order of its terms: such a batch takes the per-record path, whole."""
    node = aggregate_of(statement("tumble", CALLS.replace("MAX(s)", "SUM(x)")))
    per_record, columnar = operators(node, 0)
    steps = random_steps(random.Random(4), 1_500)
    expected = whole(make_context, per_record, steps, "per-record")
    run = Run(make_context)
    op = run.start(columnar(), "columnar")
    run.feed(op, steps)
    run.finish(op)
    assert run.results() == expected.results() != Counter()
    assert op.batches_per_record > 0


@pytest.mark.parametrize("window", ["tumble", "hop-uneven"])
@pytest.mark.parametrize(
    ("first", "then"), [("columnar", "columnar"), ("per-record", "columnar"), ("columnar", "per-record")]
)
def test_restored_mid_stream_from_either_paths_snapshot(
    make_context: MakeContext, monkeypatch: pytest.MonkeyPatch, window: str, first: str, then: str
) -> None:
    """The two paths share the state layout: a snapshot of either restores into either."""
    monkeypatch.setattr(cw, "BATCH_ROWS", 333)
    node = aggregate_of(statement(window))
    per_record, columnar = operators(node, 45)
    factory = {"columnar": columnar, "per-record": per_record}
    steps = random_steps(random.Random(5), 2_500)
    expected = whole(make_context, per_record, steps, "reference")
    for cut in (len(steps) // 3, 2 * len(steps) // 3 + 1):
        run = Run(make_context)
        uid = f"restored-{cut}"
        before = run.start(factory[first](), uid)
        run.feed(before, steps[:cut])
        snapshot = before.snapshot_state(1)
        assert snapshot is not None
        assert json.loads(snapshot)["format"] == (2 if window != "tumble" else 1)
        after = run.start(factory[then](), uid, restore=snapshot)
        run.feed(after, steps[cut:])
        run.finish(after)
        assert run.results() == expected.results()
        assert run.late_values() == expected.late_values()
        assert run.dropped == expected.dropped


def rescaled_run(make_context: MakeContext, factory: Callable[[], Any], steps: list[Step], uid: str) -> Run:
    """Two subtasks take the first half (each its keys' rows; subtask 1's watermark lags 60 ms), then
    one subtask restored from both (``restore_inherited_state``) takes the rest."""
    run = Run(make_context)
    cut = len(steps) // 2
    old = [run.start(factory(), uid, subtask=s, parallelism=2) for s in range(2)]
    for kind, item in steps[:cut]:
        if kind == "row":
            row, _ts = item
            owner = old[0] if key_group_for_key((row["k"], row["g"]), 128) in old[0].ctx.key_group_range else old[1]
            run.feed(owner, [(kind, item)])
        else:
            run.feed(old[0], [(kind, item)])
            run.feed(old[1], [(kind, item - 60)])
    states = []
    for s, op in enumerate(old):
        data = op.snapshot_state(1)
        assert data is not None
        states.append(InheritedState(s, 2, op.ctx.key_group_range, data))
    new = factory()
    new.setup(make_context(uid, subtask=0, parallelism=1), run.main, SideOutputs({"late": run.late}))
    new.restore_inherited_state(states)
    new.open()
    run.feed(new, steps[cut:])
    run.finish(new)
    return run


@pytest.mark.parametrize("lateness", [0, 45])
@pytest.mark.parametrize("window", ["tumble", "hop"])
def test_restored_at_another_parallelism(
    make_context: MakeContext, monkeypatch: pytest.MonkeyPatch, window: str, lateness: int
) -> None:
    monkeypatch.setattr(cw, "BATCH_ROWS", 97)
    node = aggregate_of(statement(window))
    per_record, columnar = operators(node, lateness)
    steps = random_steps(random.Random(11), 2_500)
    expected = rescaled_run(make_context, per_record, steps, "per-record")
    run = rescaled_run(make_context, columnar, steps, "columnar")
    assert run.results() == expected.results() != Counter()
    assert run.late_values() == expected.late_values()
    assert run.dropped == expected.dropped


def test_nothing_gathered_is_left_out_of_a_snapshot(make_context: MakeContext) -> None:
    node = aggregate_of(statement("tumble"))
    _per_record, columnar = operators(node, 0)
    run = Run(make_context)
    op = run.start(columnar(), "snap")
    op.process({"k": 1, "g": "x", "a": 5, "s": "q", "x": 0.5, "ts": 10, "et": 10}, 10)
    assert op._rows  # gathered, not yet in the state
    op.snapshot_state(1)
    assert not op._rows
    restored = run.start(columnar(), "snap", restore=op.snapshot_state(2))
    run.finish(restored)
    ((row, ts),) = run.main.records
    assert (row["k"], row[name_of(node, "SUM")], row[name_of(node, "MIN", "s")], ts) == (1, 5, "q", 49)


@pytest.mark.parametrize(
    ("calls", "window", "why"),
    [
        ("COUNT(DISTINCT a)", "tumble", "the aggregate COUNT(DISTINCT a)"),
        ("COUNT(a)", "cumulate", "CUMULATE windows"),
    ],
)
def test_what_is_not_vectorized_stays_per_record(calls: str, window: str, why: str) -> None:
    text = statement("tumble", CALLS.replace("COUNT(a) AS c", f"{calls} AS c"))
    if window == "cumulate":
        text = text.replace(
            WINDOWS["tumble"][0], "CUMULATE(TABLE t, DESCRIPTOR(et), INTERVAL '0.01' SECOND, INTERVAL '0.05' SECOND)"
        )
    assert window_columnar(aggregate_of(text)) == WindowFallback(why)
    assert f"[per record; not columnar: {why}]" in explain("SET 'weir.columnar' = 'true';\n" + text)


def test_explain_names_the_columnar_window_aggregate() -> None:
    text = statement("hop")
    on = explain("SET 'weir.columnar' = 'true';\n" + text)
    assert "[columnar: pre-aggregated per key and slice on Arrow batches]" in on
    assert "not columnar" in on  # the chain (not a scan -> filter/projection) says so; the aggregate does not
    off = explain(text)
    assert "columnar" not in off
    uid_on = [line.split()[0] for line in on.splitlines() if "window-aggregate" in line]
    uid_off = [line.split()[0] for line in off.splitlines() if "window-aggregate" in line]
    assert uid_on == uid_off != []  # the same uid: savepoints restore across the setting


JOB_EVENTS = 20_000


@pytest.mark.parametrize("query", ["q5", "q11-tumble"])
def test_columnar_window_job_sink_equals_per_record_job_sink(tmp_path: Path, weir_job: RunJob, query: str) -> None:
    """The whole job (in-process runner, checkpoints on): SET 'weir.columnar' = 'true' changes the
    window operators, not the sink's records."""
    if query == "q5":
        text = nexmark_script("q5")
    else:
        text = nexmark_script("q0").split("CREATE TABLE nexmark_q0")[0] + Q11_TUMBLE
    text = text.replace("'events.num' = '100000'", f"'events.num' = '{JOB_EVENTS}'")
    text = text.replace("'first-event.rate' = '10000'", "'first-event.rate' = '1000'")  # 20 s of event time
    sinks = []
    for columnar in (False, True):
        script_text = ("SET 'weir.columnar' = 'true';\n" if columnar else "") + text
        job = tmp_path / f"{query}_{columnar}.py"
        job.write_text(
            f"from weir.sql import sql\n\nSCRIPT = {script_text!r}\n\n\ndef build(env):\n    sql(env, SCRIPT)\n"
        )
        run = weir_job(job)
        (planned,) = plan_script(script_text).inserts
        details = [op.detail for op in operators_of(planned, script_text) if op.kind == "window-aggregate"]
        assert details and all(("[columnar:" in d) is columnar for d in details)
        (sink,) = [uid for uid in run.sinks if uid.startswith(planned.uid_prefix + "-")]
        sinks.append(Counter(frozen(r) for r in run.sinks[sink]))
    per_record_sink, columnar_sink = sinks
    assert sum(per_record_sink.values()) >= (8 if query == "q5" else 200)
    assert columnar_sink == per_record_sink


Q11_TUMBLE = """
CREATE TABLE nexmark_q11t (bidder BIGINT, bid_count BIGINT, total BIGINT, top BIGINT, starttime TIMESTAMP(3),
  endtime TIMESTAMP(3)) WITH ('connector' = 'kafka', 'topic' = 'nexmark-out', 'format' = 'json',
  'sink.delivery-guarantee' = 'exactly-once');
INSERT INTO nexmark_q11t
SELECT bidder, COUNT(*), SUM(price), MAX(price), window_start, window_end
FROM TABLE(TUMBLE(TABLE bid, DESCRIPTOR(`dateTime`), INTERVAL '10' SECOND))
GROUP BY bidder, window_start, window_end;
"""


def test_double_keys_zero_and_minus_zero_stay_apart(make_context: MakeContext) -> None:
    """0.0 and -0.0 are one dict key but two keys to the state (their bytes differ): a batch holding
    a float zero key is aggregated per record, so each keeps its own windows, as per record."""
    text = (
        statement("tumble")
        .replace("GROUP BY k, g,", "GROUP BY k, x,")
        .replace("SELECT k, g,", "SELECT k, CAST(x AS STRING),")
    )
    node = aggregate_of(text)
    assert [k.name for k in node.keys] == ["k", "x"]
    per_record, columnar = operators(node, 0)
    steps = random_steps(random.Random(6), 600)
    for n, (kind, item) in enumerate(steps):
        if kind == "row":
            item[0]["x"] = (0.0, -0.0, 1.5, None)[n % 4]
    expected = whole(make_context, per_record, steps, "per-record")
    run = Run(make_context)
    op = run.start(columnar(), "columnar")
    run.feed(op, steps)
    run.finish(op)
    assert run.results() == expected.results()
    assert {str(r["x"]) for r, _ts in expected.main.records} >= {"0.0", "-0.0"}
    assert op.batches_per_record > 0
