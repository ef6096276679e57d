"""The generator source and the sinks that stay with the job (file, print, function): checked when
made, the same through ``from_source``/``sink_to`` as through the convenience methods."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from weir.api import Environment, FailOnError, FileSink, FunctionSink, GeneratorSource, OptionError, PrintSink
from weir.core.descriptors import GeneratorSourceSpec, SinkDelivery, SinkSpec, SinkSystem
from weir.core.errors import JobDefinitionError
from weir.operators.sinks import FileSinkOperator, FunctionSinkOperator, PrintSinkOperator
from weir.operators.sources import GeneratorSourceOperator


def square(i: int) -> int:
    return i * i


def test_a_generator_source_describes_itself_and_builds_its_operator() -> None:
    source = GeneratorSource(square, count=10, max_out_of_orderness_ms=timedelta(seconds=1), records_per_second=5)
    assert source.descriptor() == GeneratorSourceSpec(square, 10, None, 1_000, 5)
    assert source.descriptor() is source.descriptor()  # one spec for the graph and every subtask's operator
    assert isinstance(source.create_operator(), GeneratorSourceOperator)
    env = Environment("j")
    env.from_source(source, uid="squares", parallelism=2)
    t = env.graph.transformations["squares"]
    assert (t.name, t.parallelism, t.source_spec, t.on_error) == ("generator", 2, source.descriptor(), None)


def test_of_collection_is_a_bounded_generator_over_the_items() -> None:
    source = GeneratorSource.of_collection(iter(["a", "b", "c"]))
    spec = source.descriptor()
    assert spec.count == 3 and [spec.generate(i) for i in range(3)] == ["a", "b", "c"]


@pytest.mark.parametrize(
    ("options", "complaint"),
    [
        ({"generate": [1, 2]}, "generator source: generate must be a function of the record index, got [1, 2]"),
        ({"count": -1}, "generator source: count must be an int of at least 0 or None (unbounded), got -1"),
        ({"count": True}, "generator source: count must be an int of at least 0 or None (unbounded), got True"),
        ({"timestamp": "ts"}, "generator source: timestamp must be a function or None, got 'ts'"),
        (
            {"max_out_of_orderness_ms": -5},
            "generator source: max_out_of_orderness_ms must be an int of at least 0 (milliseconds) or "
            "datetime.timedelta, got -5",
        ),
        (
            {"records_per_second": 0},
            "generator source: records_per_second must be a positive number (records per second) or None, got 0",
        ),
    ],
)
def test_a_bad_generator_option_is_refused_in_one_line(options: dict[str, object], complaint: str) -> None:
    arguments: dict[str, object] = {"generate": square, **options}
    with pytest.raises(OptionError) as refused:
        GeneratorSource(**arguments)  # type: ignore[arg-type]
    assert str(refused.value) == complaint


def test_from_generator_names_the_operator() -> None:
    env = Environment("j")
    with pytest.raises(OptionError) as refused:
        env.from_generator(square, uid="numbers", count=-1)
    assert str(refused.value) == (
        "generator source 'numbers': count must be an int of at least 0 or None (unbounded), got -1"
    )
    with pytest.raises(OptionError, match="^generator source 'words': records_per_second must be a positive number"):
        env.from_collection(["a"], uid="words", records_per_second=-1)
    assert not env.graph.transformations


def test_the_local_sinks_describe_themselves_and_build_their_operators(tmp_path: Path) -> None:
    env = Environment("j")
    source = env.from_collection([1], uid="src")
    source.sink_to(FileSink(tmp_path / "out"), uid="file")
    source.sink_to(PrintSink(prefix="> "), uid="print")
    source.sink_to(FunctionSink(print), uid="fn", parallelism=1)
    transformations = env.graph.transformations
    assert {uid: (t.name, t.sink_spec, type(t.factory()), t.on_error) for uid, t in transformations.items()} == {
        "src": ("generator", None, GeneratorSourceOperator, None),
        "file": (
            f"file-sink:{tmp_path / 'out'}",
            SinkSpec(SinkSystem.FILE, str(tmp_path / "out"), SinkDelivery.AT_LEAST_ONCE),
            FileSinkOperator,
            None,
        ),
        "print": ("print", SinkSpec(SinkSystem.PRINT, "", SinkDelivery.AT_LEAST_ONCE), PrintSinkOperator, None),
        "fn": ("sink", SinkSpec(SinkSystem.FUNCTION, "", SinkDelivery.AT_LEAST_ONCE), FunctionSinkOperator, None),
    }


@pytest.mark.parametrize(
    ("make", "complaint"),
    [
        (lambda: FileSink(""), "file sink: path must be a path, got ''"),
        (
            lambda: FileSink("/tmp/out", serializer=b"json"),
            "file sink: serializer must be a function or None, got b'json'",
        ),
        (lambda: PrintSink(prefix=3), "print sink: prefix must be a string, got 3"),
        (lambda: FunctionSink("print"), "function sink: fn must be a function of the value, got 'print'"),
    ],
)
def test_a_bad_local_sink_option_is_refused_in_one_line(make: object, complaint: str) -> None:
    with pytest.raises(OptionError) as refused:
        make()  # type: ignore[operator]
    assert str(refused.value) == complaint


def test_the_local_sinks_take_no_on_error() -> None:
    """They hand no record to a user function they could reject it from, so an on_error would do nothing."""
    env = Environment("j")
    with pytest.raises(JobDefinitionError, match=r"^operator 'out' \(print\) takes no on_error"):
        env.from_collection([1], uid="src").sink_to(PrintSink(), uid="out", on_error=FailOnError())
    assert "out" not in env.graph.transformations
