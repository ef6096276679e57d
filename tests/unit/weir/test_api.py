"""The job API: loading job files, graph validation, automatic rebalancing and typed parameters."""

from __future__ import annotations

import pickle
import sys
import textwrap
from pathlib import Path

import pytest

from weir.api import (
    Environment,
    KeyedProcessFunction,
    KeyedStream,
    Parameters,
    StateSchema,
    TumblingEventTimeWindows,
    load_job_file,
    load_job_source,
)
from weir.core.errors import JobDefinitionError
from weir.core.state_schema import StoredSchema
from weir.graph import Edge, OperatorKind, Partitioning

GOOD_JOB = textwrap.dedent(
    """
    from dataclasses import dataclass

    from weir.api import Environment


    @dataclass(frozen=True)
    class Event:
        key: int
        value: int


    def build(env: Environment) -> None:
        n = env.params.get_int("events", 10)
        src = env.from_generator(lambda i: Event(i % 3, i), uid="gen", count=n)
        summed = src.key_by(lambda e: e.key).reduce(lambda a, b: Event(a.key, a.value + b.value), uid="sum")
        summed.print(uid=env.params.get_str("sink-uid", "out"))
    """
)


def job_with_build(body: str) -> str:
    return "from weir.api import Environment\n\n\ndef build(env: Environment) -> None:\n" + textwrap.indent(
        textwrap.dedent(body), "    "
    )


def test_a_good_job_loads_with_its_parameters_and_parallelism() -> None:
    loaded = load_job_source(GOOD_JOB.encode(), "jobs/my-job.py", {"sink-uid": "printed"}, parallelism=2)
    graph = loaded.graph
    assert graph.job_name == "my-job"
    assert graph.default_parallelism == 2
    assert list(graph.transformations) == ["gen", "sum", "printed"]
    assert graph.transformations["gen"].kind is OperatorKind.SOURCE
    assert graph.transformations["printed"].kind is OperatorKind.SINK
    assert [(e.source_uid, e.target_uid, e.partitioning) for e in graph.edges] == [
        ("gen", "sum", Partitioning.HASH),
        ("sum", "printed", Partitioning.FORWARD),
    ]
    # The job's classes are importable by module name, so values defined in the job file pickle.
    event = loaded.module.Event(1, 2)
    assert pickle.loads(pickle.dumps(event)) == event
    assert sys.modules[loaded.module.__name__] is loaded.module


def test_job_name_can_be_given() -> None:
    assert load_job_source(GOOD_JOB, "x.py", job_name="named").graph.job_name == "named"


def test_syntax_error_names_file_and_line() -> None:
    with pytest.raises(JobDefinitionError, match=r"job file bad\.py does not compile: .* \(line 2\)") as info:
        load_job_source("x = 1\ndef build(env:\n", "bad.py")
    assert info.value.fault == "user"


def test_import_error_is_a_job_definition_error_and_leaves_no_module_behind() -> None:
    before = set(sys.modules)
    with pytest.raises(JobDefinitionError, match="does not import: ModuleNotFoundError: .*no_such_module_xyz"):
        load_job_source("import no_such_module_xyz\n\ndef build(env):\n    pass\n", "imports.py")
    assert not {m for m in set(sys.modules) - before if m.startswith("weir_job_imports")}


def test_missing_or_non_callable_build() -> None:
    with pytest.raises(JobDefinitionError, match=r"nobuild\.py defines no build\(env\) function"):
        load_job_source("x = 1\n", "nobuild.py")
    with pytest.raises(JobDefinitionError, match="defines no build"):
        load_job_source("build = 3\n", "nobuild.py")


def test_build_raising_is_wrapped_with_the_cause() -> None:
    with pytest.raises(JobDefinitionError, match=r"raises\.py: build\(env\) failed: ValueError: boom") as info:
        load_job_source(job_with_build("raise ValueError('boom')\n"), "raises.py")
    assert isinstance(info.value.__cause__, ValueError)


def test_build_raising_a_job_definition_error_passes_it_unchanged() -> None:
    with pytest.raises(JobDefinitionError, match="^allowed_lateness_ms must be >= 0$"):
        load_job_source(
            job_with_build(
                """
                from weir.api import TumblingEventTimeWindows
                src = env.from_generator(lambda i: i, uid="gen", count=1)
                src.key_by(lambda v: v).window(TumblingEventTimeWindows(10), allowed_lateness_ms=-1)
                """
            ),
            "late.py",
        )


def test_duplicate_uid_is_rejected() -> None:
    with pytest.raises(JobDefinitionError, match="two operators share the uid 'gen'"):
        load_job_source(
            job_with_build(
                """
                env.from_generator(lambda i: i, uid="gen", count=1).map(lambda v: v, uid="gen")
                """
            ),
            "dup.py",
        )


def test_empty_uid_is_rejected() -> None:
    env = Environment("j")
    src = env.from_generator(lambda i: i, uid="gen", count=1)
    with pytest.raises(JobDefinitionError, match="operator 'map' needs a non-empty uid"):
        src.map(lambda v: v, uid="")


def test_a_job_without_operators_or_sources_is_rejected() -> None:
    with pytest.raises(JobDefinitionError, match="defines no operators"):
        load_job_source(job_with_build("pass\n"), "empty.py")
    env = Environment("j")
    env.from_generator(lambda i: i, uid="gen", count=1)
    env.graph.transformations["gen"].kind = OperatorKind.ONE_INPUT
    with pytest.raises(JobDefinitionError, match="no source"):
        env.graph.validate()


def test_parallelism_above_max_parallelism_is_rejected() -> None:
    with pytest.raises(JobDefinitionError, match=r"'gen': parallelism 5 must be between 1 and max parallelism 4"):
        load_job_source(
            job_with_build(
                """
                env.set_max_parallelism(4)
                env.from_generator(lambda i: i, uid="gen", count=1, parallelism=5).print(uid="out")
                """
            ),
            "wide.py",
        )


def test_forward_between_different_parallelisms_becomes_rebalance() -> None:
    env = Environment("j", parallelism=2)
    src = env.from_generator(lambda i: i, uid="gen", count=10)
    src.map(lambda v: v, uid="wide", parallelism=3).map(lambda v: v, uid="narrow").print(uid="out")
    src.map(lambda v: v, uid="same").print(uid="same-out")
    src.key_by(lambda v: v).reduce(lambda a, b: a + b, uid="sum", parallelism=3).print(uid="sum-out")
    edges = {(e.source_uid, e.target_uid): e.partitioning for e in env.graph.edges}
    assert edges[("gen", "wide")] is Partitioning.REBALANCE
    assert edges[("wide", "narrow")] is Partitioning.REBALANCE
    assert edges[("narrow", "out")] is Partitioning.FORWARD
    assert edges[("gen", "same")] is Partitioning.FORWARD
    assert edges[("gen", "sum")] is Partitioning.HASH  # a key_by keeps hash partitioning
    env.graph.validate()


def test_a_forward_edge_added_by_hand_between_parallelisms_fails_validation() -> None:
    env = Environment("j", parallelism=2)
    env.from_generator(lambda i: i, uid="gen", count=10)
    env.from_generator(lambda i: i, uid="other", count=10, parallelism=3)
    env.graph.connect(Edge("gen", "other", Partitioning.FORWARD))
    with pytest.raises(JobDefinitionError, match="forward edge 'gen' -> 'other' joins different parallelisms"):
        env.graph.validate()


def test_operator_without_input_fails_validation() -> None:
    env = Environment("j")
    env.from_generator(lambda i: i, uid="gen", count=10)
    src = env.from_generator(lambda i: i, uid="lonely", count=10)
    src.map(lambda v: v, uid="m")
    env.graph.edges.clear()
    with pytest.raises(JobDefinitionError, match="operator 'm' has no input"):
        env.graph.validate()


def test_window_keeps_the_key_selector_on_the_operator() -> None:
    env = Environment("j")
    keyed = env.from_generator(lambda i: {"k": i}, uid="gen", count=1, timestamp=lambda e: e["k"]).key_by(
        lambda e: e["k"]
    )
    out = keyed.window(TumblingEventTimeWindows(10)).aggregate(object(), uid="win")
    t = env.graph.transformations[out.uid]
    assert t.key_selector is not None and t.key_selector({"k": 4}) == 4


def test_parameters_typed_getters() -> None:
    params = Parameters({"n": "42", "flag": " Yes ", "off": "0", "name": "x"})
    assert params.get_int("n", 1) == 42
    assert params.get_int("missing", 7) == 7
    assert params.get_bool("flag", False) is True
    assert params.get_bool("off", True) is False
    assert params.get_bool("missing", True) is True
    assert params.get_str("name", "d") == "x"
    assert params.get_str("missing", "d") == "d"
    assert dict(params) == {"n": "42", "flag": " Yes ", "off": "0", "name": "x"}
    assert len(params) == 4 and params["n"] == "42"


@pytest.mark.parametrize("raw", ["4.5", "ten", ""])
def test_parameters_bad_integer(raw: str) -> None:
    with pytest.raises(JobDefinitionError, match=f"parameter n={raw!r} is not an integer"):
        Parameters({"n": raw}).get_int("n", 0)


@pytest.mark.parametrize("raw", ["maybe", "2", ""])
def test_parameters_bad_boolean(raw: str) -> None:
    with pytest.raises(JobDefinitionError, match=r"is not a boolean \(true/false\)"):
        Parameters({"b": raw}).get_bool("b", False)


def test_bad_parameter_in_build_fails_the_load() -> None:
    with pytest.raises(JobDefinitionError, match="parameter events='many' is not an integer"):
        load_job_source(GOOD_JOB, "job.py", {"events": "many"})


def test_load_job_file_reads_the_file(tmp_path: Path) -> None:
    path = tmp_path / "file-job.py"
    path.write_text(GOOD_JOB)
    assert load_job_file(path, parallelism=3).graph.default_parallelism == 3
    with pytest.raises(JobDefinitionError, match="does not exist"):
        load_job_file(tmp_path / "missing.py")


# State schemas ------------------------------------------------------------------------------------


def keyed_stream(env: Environment) -> KeyedStream:
    return env.from_generator(lambda i: {"k": i}, uid="gen", count=1, timestamp=lambda e: e["k"]).key_by(
        lambda e: e["k"]
    )


def schemas_of(env: Environment, uid: str) -> tuple[StateSchema, ...]:
    op = env.graph.transformations[uid].factory()
    return op.state_schemas()  # type: ignore[no-any-return]


def migrate_fn(stored_version: int, value: object) -> object:
    return value


class Count:
    def create(self) -> int:
        return 0

    def add(self, acc: int, value: object) -> int:
        return acc + 1

    def result(self, key: object, window_start: int, window_end: int, acc: int) -> int:
        return acc


def test_keyed_operators_declare_version_1_of_their_state_by_default() -> None:
    env = Environment("j")
    keyed = keyed_stream(env)
    keyed.window(TumblingEventTimeWindows(10)).aggregate(Count(), uid="win")
    keyed.reduce(lambda a, b: a, uid="sum")
    keyed.process(KeyedProcessFunction(), uid="proc")
    assert schemas_of(env, "win") == (StateSchema("win"),)
    assert schemas_of(env, "sum") == (StateSchema("reduce"),)
    assert schemas_of(env, "proc") == ()


def test_state_version_and_migrate_reach_the_operator() -> None:
    env = Environment("j")
    keyed = keyed_stream(env)
    keyed.window(TumblingEventTimeWindows(10)).aggregate(Count(), uid="win", state_version=3, migrate=migrate_fn)
    keyed.reduce(lambda a, b: a, uid="sum", state_version=2, migrate=migrate_fn)
    keyed.process(
        KeyedProcessFunction(), uid="proc", state_schemas=[StateSchema("count", version=2, migrate=migrate_fn)]
    )
    (win,) = schemas_of(env, "win")
    assert (win.name, win.version, win.migrate) == ("win", 3, migrate_fn)
    (total,) = schemas_of(env, "sum")
    assert (total.name, total.version, total.migrate) == ("reduce", 2, migrate_fn)
    assert [s.stored() for s in schemas_of(env, "proc")] == [StoredSchema("count", "pickle", 2)]


class VersionedCountSum:
    state_version = 2

    def create(self) -> tuple[int, int, int]:
        return 0, 0, 0

    def add(self, acc: tuple[int, int, int], value: int) -> tuple[int, int, int]:
        return acc[0] + 1, acc[1] + value, max(acc[2], value)

    def result(self, key: object, window_start: int, window_end: int, acc: tuple[int, int, int]) -> object:
        return acc

    def migrate(self, stored_version: int, acc: tuple[int, int]) -> tuple[int, int, int]:
        return (*acc, 0)


def test_an_aggregate_function_may_carry_its_own_state_version_and_migration() -> None:
    env = Environment("j")
    fn = VersionedCountSum()
    keyed_stream(env).window(TumblingEventTimeWindows(10)).aggregate(fn, uid="win")
    (win,) = schemas_of(env, "win")
    assert win.version == 2 and win.migrate is not None and win.migrate(1, (1, 2)) == (1, 2, 0)


class Counter(KeyedProcessFunction):
    state_schemas = (StateSchema("count", version=2, migrate=migrate_fn),)


def test_a_keyed_process_function_may_carry_its_state_schemas() -> None:
    env = Environment("j")
    keyed_stream(env).process(Counter(), uid="proc")
    assert [s.name for s in schemas_of(env, "proc")] == ["count"]


@pytest.mark.parametrize(
    ("kwargs", "complaint"),
    [
        ({"state_version": 0}, "operator 'win': state 'win': state_version must be an int of at least 1, got 0"),
        ({"state_version": "2"}, "state_version must be an int of at least 1, got '2'"),
        ({"state_version": 2, "migrate": "fn"}, "operator 'win': state 'win': migrate must be a function"),
        ({"migrate": migrate_fn}, "migrate is given but state_version is 1"),
    ],
)
def test_a_bad_state_version_or_migration_fails_the_build(kwargs: dict[str, object], complaint: str) -> None:
    keyed = keyed_stream(Environment("j"))
    with pytest.raises(JobDefinitionError, match=complaint):
        keyed.window(TumblingEventTimeWindows(10)).aggregate(Count(), uid="win", **kwargs)  # type: ignore[arg-type]
    with pytest.raises(JobDefinitionError, match=complaint.replace("'win': state 'win'", "'sum': state 'reduce'")):
        keyed.reduce(lambda a, b: a, uid="sum", **kwargs)  # type: ignore[arg-type]


def test_process_state_schemas_are_checked_at_build_time() -> None:
    keyed = keyed_stream(Environment("j"))
    with pytest.raises(JobDefinitionError, match="operator 'p': state 'n' is declared twice"):
        keyed.process(KeyedProcessFunction(), uid="p", state_schemas=[StateSchema("n"), StateSchema("n")])
    with pytest.raises(JobDefinitionError, match="operator 'p': state_schemas holds 2, not a StateSchema"):
        keyed.process(KeyedProcessFunction(), uid="p", state_schemas=[2])  # type: ignore[list-item]


def test_the_process_function_names_are_exported() -> None:
    import weir.api as api

    for name in (
        "TimeDomain",
        "StateTtlConfig",
        "TtlUpdateType",
        "TimerService",
        "KeyedProcessContext",
        "OnTimerContext",
        "ValueState",
        "ListState",
        "MapState",
        "ReducingState",
        "AggregatingState",
        "StateAggregateFunction",
    ):
        assert name in api.__all__ and hasattr(api, name), name
    assert api.KeyedProcessFunction().on_timer(1, None, None) is None  # type: ignore[arg-type,func-returns-value]
