"""What turns a benchmark's measurements into evidence, as pure functions: the order contenders run
in, the median and spread of repeated runs, the steady-state window read from per-process CPU
samples, the load gate, and output checked record for record.

- **Order**: a contender measured always first (or always after the same one) carries the
  machine's drift (a rising load, a warming page cache) into its figure. :func:`run_order` rotates
  the order from one run to the next (a Latin square's rows); with two contenders that is ABBA.
- **Repeats**: a figure is the median of its runs with their minimum and maximum beside it
  (:class:`Spread`), never one run. A run whose output is wrong is not averaged in: it fails the
  contender's figure (:func:`figure_of`).
- **Steady state**: from samples of (time, events consumed, CPU seconds of the contender's
  processes), the rate and CPU per event between 10 % and 90 % of the input (start-up and tail
  left out, as Flink's own benchmarks read a job after its warm-up) and the same over the halves
  of that window, whose ratio shows whether the run was still warming up (a JIT compiling).
- **Load gate**: before a run, the 1-minute load average must be at most the core count; the gate
  waits for it with a deadline and otherwise marks the run "under load".
- **Records**: expected and actual output compared as multisets of whole records; a duplicated,
  a missing, an unexpected and a changed record (same identity, other values) are each named. An
  updating query is compared as its final table, its upserts applied in order.
"""

from __future__ import annotations

import collections
import statistics
import time
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar

T = TypeVar("T")
Record = tuple[Any, ...]

# Order ------------------------------------------------------------------------------------------------


def run_order(contenders: Sequence[T], run: int) -> list[T]:
    """The order of ``contenders`` in run ``run`` (0-based): rotated by ``run`` places, so that each
    contender takes each position once every ``len(contenders)`` runs. Two contenders: A B, B A,
    A B, ... (ABBA)."""
    if not contenders:
        return []
    shift = run % len(contenders)
    return [*contenders[shift:], *contenders[:shift]]


# Repeats ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Spread:
    """The median of a figure over its runs, with the smallest and largest value."""

    median: float
    low: float
    high: float
    runs: int

    @property
    def relative_range(self) -> float | None:
        """(high - low) / median: how far apart the runs are (None for a zero median)."""
        return (self.high - self.low) / self.median if self.median else None

    def as_dict(self) -> dict[str, float | int]:
        return {"median": self.median, "min": self.low, "max": self.high, "runs": self.runs}


def spread_label(value: Mapping[str, Any], runs: int | None, fmt: str = "{:,.0f}") -> str:
    """``median (min-max)`` of a spread as the results files keep it (:meth:`Spread.as_dict`), with
    ``k of n runs`` when the value exists in fewer of the contender's ``runs`` than were made (a
    steady state in a run too short for it): a median of one run is not shown as one of three."""
    parts = [] if value["runs"] == 1 else [f"{fmt.format(value['min'])}-{fmt.format(value['max'])}"]
    if runs is not None and value["runs"] < runs:
        parts.append(f"{value['runs']} of {runs} runs")
    return fmt.format(value["median"]) + (f" ({'; '.join(parts)})" if parts else "")


def spread(values: Iterable[float | None]) -> Spread | None:
    """Median, min and max of the values present; None when there is none."""
    present = [float(v) for v in values if v is not None]
    if not present:
        return None
    return Spread(statistics.median(present), min(present), max(present), len(present))


@dataclass(frozen=True)
class RunOutcome:
    """One run of one contender, as far as its figure is concerned: its measured values, whether its
    output matched the reference, and what went wrong if anything did."""

    values: Mapping[str, float | None]
    output_ok: bool
    error: str | None = None
    under_load: bool = False


@dataclass(frozen=True)
class Figure:
    """A contender's figures over its runs: each value's spread, or why there is none.

    ``failed`` names the runs whose output mismatched or that failed: then no spread is given, so
    that a wrong output is never averaged into a figure."""

    spreads: Mapping[str, Spread | None]
    runs: int
    failed: tuple[str, ...] = ()
    under_load: int = 0

    @property
    def ok(self) -> bool:
        return not self.failed and self.runs > 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "runs": self.runs,
            "runs_under_load": self.under_load,
            "failed": list(self.failed),
            **{name: (s.as_dict() if s is not None else None) for name, s in self.spreads.items()},
        }


def figure_of(outcomes: Sequence[RunOutcome], names: Sequence[str]) -> Figure:
    """The figure of a contender's runs: the spread of each named value over every run, unless a run
    failed or its output mismatched, which fails the figure (every failure named, no spread)."""
    failed = tuple(
        f"run {n}: {o.error}" if o.error is not None else f"run {n}: output does not match the reference"
        for n, o in enumerate(outcomes, start=1)
        if o.error is not None or not o.output_ok
    )
    under_load = sum(1 for o in outcomes if o.under_load)
    if failed or not outcomes:
        return Figure({name: None for name in names}, len(outcomes), failed, under_load)
    return Figure({name: spread(o.values.get(name) for o in outcomes) for name in names}, len(outcomes), (), under_load)


# Steady state -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Sample:
    """At ``t`` seconds into a run: ``consumed`` input events, ``cpu_s`` CPU seconds spent so far by
    the contender's processes (every one of them, sampled together)."""

    t: float
    consumed: float
    cpu_s: float


@dataclass(frozen=True)
class Window:
    """What happened between two points of the input."""

    events: float
    seconds: float
    cpu_s: float

    @property
    def events_per_s(self) -> float | None:
        return self.events / self.seconds if self.seconds > 0 else None

    @property
    def cpu_s_per_million(self) -> float | None:
        return self.cpu_s / self.events * 1e6 if self.events > 0 else None


def crossing(samples: Sequence[Sample], count: float) -> tuple[float, float] | None:
    """(time, CPU seconds) when ``consumed`` first reached ``count``, linearly interpolated between
    the samples around it; None when it never did."""
    previous: Sample | None = None
    for s in samples:
        if s.consumed >= count:
            if previous is None or s.consumed == previous.consumed:
                return s.t, s.cpu_s
            share = (count - previous.consumed) / (s.consumed - previous.consumed)
            return previous.t + (s.t - previous.t) * share, previous.cpu_s + (s.cpu_s - previous.cpu_s) * share
        previous = s
    return None


def window(samples: Sequence[Sample], total: float, low: float, high: float) -> Window | None:
    """The part of the run between ``low`` and ``high`` (fractions of ``total``) of the input
    consumed; None when the samples do not reach both points, or reach them at once."""
    start, end = crossing(samples, total * low), crossing(samples, total * high)
    if start is None or end is None or end[0] <= start[0]:
        return None
    return Window(total * (high - low), end[0] - start[0], end[1] - start[1])


STEADY: Final = (0.1, 0.9)
MIN_PROGRESS_STEPS: Final = 3
"""Progress values the samples must show strictly inside the 10-90 % window: a counter that moved
only once or twice in it (a TaskManager's metrics move twice a second) would make the window's
ends an interpolation, not a measurement."""


def progress_steps(samples: Sequence[Sample], low: float, high: float) -> int:
    """Distinct progress values strictly between ``low`` and ``high`` events."""
    return len({s.consumed for s in samples if low < s.consumed < high})


@dataclass(frozen=True)
class SteadyState:
    """The 10-90 % window, and the ratio of CPU per event in its first half (10-50 %) to its second
    (50-90 %): near 1 when the contender had warmed up by 10 % of the input, above 1 while it was
    still getting faster (JIT compilation, caches filling)."""

    window: Window
    warmup_ratio: float | None

    def as_dict(self) -> dict[str, float | None]:
        return {
            "events": self.window.events,
            "seconds": self.window.seconds,
            "cpu_s": self.window.cpu_s,
            "events_per_s": self.window.events_per_s,
            "cpu_s_per_million": self.window.cpu_s_per_million,
            "warmup_ratio": self.warmup_ratio,
        }


def steady_state(samples: Sequence[Sample], total: float) -> SteadyState | None:
    """The steady state of a run over ``total`` input events, from its samples; None when the
    progress moved fewer than :data:`MIN_PROGRESS_STEPS` times inside the window (a run too short
    for its progress counter)."""
    low, high = STEADY
    if progress_steps(samples, total * low, total * high) < MIN_PROGRESS_STEPS:
        return None
    whole = window(samples, total, low, high)
    if whole is None:
        return None
    middle = (low + high) / 2
    first, second = window(samples, total, low, middle), window(samples, total, middle, high)
    ratio = None
    if first is not None and second is not None:
        a, b = first.cpu_s_per_million, second.cpu_s_per_million
        ratio = a / b if a is not None and b else None
    return SteadyState(whole, ratio)


# Load gate --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LoadCheck:
    """The load gate before one run: the 1-minute load average when the run started, how long the
    gate waited for it to fall to the core count, and whether it never did (the run is then marked
    "under load")."""

    load_1m: float
    cores: int
    waited_s: float
    under_load: bool

    def as_dict(self) -> dict[str, Any]:
        return {"load_1m": self.load_1m, "cores": self.cores, "waited_s": self.waited_s, "under_load": self.under_load}


def wait_for_quiet(
    cores: int,
    deadline_s: float,
    *,
    load_1m: Callable[[], float],
    clock: Callable[[], float] = time.monotonic,
    pause: Callable[[float], None] = time.sleep,
    poll_s: float = 5.0,
) -> LoadCheck:
    """Poll the 1-minute load average until it is at most ``cores`` or ``deadline_s`` has passed.

    The load average moves every 5 s (the kernel's sampling period), so polling faster would read the
    same value. A load still above the cores at the deadline marks the run ``under_load``: it runs
    anyway and the results say so."""
    started = clock()
    while True:
        load = load_1m()
        waited = clock() - started
        if load <= cores:
            return LoadCheck(load, cores, waited, False)
        if waited >= deadline_s:
            return LoadCheck(load, cores, waited, True)
        pause(min(poll_s, max(0.0, deadline_s - waited)))


# Records ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RecordDiff:
    """How an output differs from its reference, record by record (whole records, counted).

    ``duplicated``: records the output holds more often than the reference (with how many too
    many); ``missing``: records it holds less often (how many too few); ``unexpected``: records the
    reference does not hold; ``changed``: a missing and an unexpected record with the same identity
    (the same key, other values), paired."""

    expected: int
    actual: int
    duplicated: tuple[tuple[Record, int], ...] = ()
    missing: tuple[tuple[Record, int], ...] = ()
    unexpected: tuple[tuple[Record, int], ...] = ()
    changed: tuple[tuple[Record, Record], ...] = ()
    notes: tuple[str, ...] = field(default=())

    @property
    def ok(self) -> bool:
        return not (self.duplicated or self.missing or self.unexpected or self.changed or self.notes)

    def summary(self, examples: int = 3) -> str:
        """One line: "ok" or what differs, with the first few records of each kind."""
        if self.ok:
            return f"ok ({self.actual:,} records, as the reference)"
        parts = [f"{self.actual:,} records where the reference has {self.expected:,}"]
        for name, items in (
            ("duplicated", self.duplicated),
            ("missing", self.missing),
            ("unexpected", self.unexpected),
        ):
            if items:
                n = sum(count for _r, count in items)
                shown = ", ".join(f"{_show(r)} x{count}" for r, count in items[:examples])
                parts.append(f"{n:,} {name} (e.g. {shown})")
        if self.changed:
            shown = ", ".join(f"{_show(a)} -> {_show(b)}" for a, b in self.changed[:examples])
            parts.append(f"{len(self.changed):,} changed (e.g. {shown})")
        parts.extend(self.notes)
        return "; ".join(parts)

    def as_dict(self, examples: int = 5) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "expected_records": self.expected,
            "actual_records": self.actual,
            "duplicated": sum(c for _r, c in self.duplicated),
            "missing": sum(c for _r, c in self.missing),
            "unexpected": sum(c for _r, c in self.unexpected),
            "changed": len(self.changed),
            "notes": list(self.notes),
            "examples": {
                "duplicated": [[_jsonable(r), c] for r, c in self.duplicated[:examples]],
                "missing": [[_jsonable(r), c] for r, c in self.missing[:examples]],
                "unexpected": [[_jsonable(r), c] for r, c in self.unexpected[:examples]],
                "changed": [[_jsonable(a), _jsonable(b)] for a, b in self.changed[:examples]],
            },
            "summary": self.summary(),
        }


def _show(record: Record) -> str:
    text = repr(tuple(_jsonable(record)))
    return text if len(text) <= 120 else text[:117] + "..."


def _jsonable(record: Record) -> list[Any]:
    return [v if isinstance(v, int | float | str | bool) or v is None else str(v) for v in record]


def compare_records(
    expected: Iterable[Record],
    actual: Iterable[Record],
    identity: Callable[[Record], Hashable] | None = None,
) -> RecordDiff:
    """``actual`` against ``expected`` as multisets of whole records. With ``identity`` (e.g. the
    key and window of a result), a missing and an unexpected record of the same identity are
    reported as one changed record."""
    want: collections.Counter[Record] = collections.Counter(expected)
    got: collections.Counter[Record] = collections.Counter(actual)
    duplicated: list[tuple[Record, int]] = []
    missing: list[tuple[Record, int]] = []
    unexpected: list[tuple[Record, int]] = []
    for record, n in got.items():
        wanted = want.get(record, 0)
        if wanted == 0:
            unexpected.append((record, n))
        elif n > wanted:
            duplicated.append((record, n - wanted))
    for record, n in want.items():
        if got.get(record, 0) < n:
            missing.append((record, n - got.get(record, 0)))
    changed: list[tuple[Record, Record]] = []
    if identity is not None and missing and unexpected:
        missing, unexpected, changed = _pair_changed(missing, unexpected, identity)
    order = _sort_key
    return RecordDiff(
        expected=sum(want.values()),
        actual=sum(got.values()),
        duplicated=tuple(sorted(duplicated, key=order)),
        missing=tuple(sorted(missing, key=order)),
        unexpected=tuple(sorted(unexpected, key=order)),
        changed=tuple(sorted(changed, key=lambda pair: repr(pair[0]))),
    )


def _sort_key(item: tuple[Record, int]) -> str:
    return repr(item[0])


def _pair_changed(
    missing: list[tuple[Record, int]],
    unexpected: list[tuple[Record, int]],
    identity: Callable[[Record], Hashable],
) -> tuple[list[tuple[Record, int]], list[tuple[Record, int]], list[tuple[Record, Record]]]:
    """Pair missing and unexpected records one to one by identity."""
    extra_by_id: dict[Hashable, list[Record]] = collections.defaultdict(list)
    for record, n in unexpected:
        extra_by_id[identity(record)].extend([record] * n)
    still_missing: list[tuple[Record, int]] = []
    changed: list[tuple[Record, Record]] = []
    for record, n in missing:
        candidates = extra_by_id.get(identity(record), [])
        paired = min(n, len(candidates))
        changed.extend((record, candidates.pop()) for _ in range(paired))
        if n > paired:
            still_missing.append((record, n - paired))
    left = collections.Counter(r for records in extra_by_id.values() for r in records)
    return still_missing, list(left.items()), changed


@dataclass(frozen=True)
class Upsert:
    """One record of an updating output: ``key`` identifies the row; ``row`` is its new value, or
    None for a deletion (a Kafka tombstone). ``partition`` and ``offset`` say where it was read."""

    key: Hashable
    row: Record | None
    partition: int = 0
    offset: int = 0


@dataclass(frozen=True)
class FinalTable:
    """The rows an updating output leaves once its upserts are applied in order, and what made the
    order undefined (a key written to several partitions), if anything."""

    rows: tuple[Record, ...]
    updates: int
    notes: tuple[str, ...] = ()


def final_table(upserts: Iterable[Upsert]) -> FinalTable:
    """Apply the upserts in partition-offset order (Kafka orders records within a partition only;
    an upsert sink writes each key to one partition). A key found in several partitions has no
    defined last value: noted, and the later partition's value kept."""
    ordered = sorted(upserts, key=lambda u: (u.partition, u.offset))
    rows: dict[Hashable, Record] = {}
    partitions: dict[Hashable, set[int]] = collections.defaultdict(set)
    for u in ordered:
        partitions[u.key].add(u.partition)
        if u.row is None:
            rows.pop(u.key, None)
        else:
            rows[u.key] = u.row
    spread_keys = sorted((repr(k) for k, ps in partitions.items() if len(ps) > 1))
    notes = (
        (f"{len(spread_keys)} key(s) written to several partitions, order undefined (e.g. {spread_keys[0]})",)
        if spread_keys
        else ()
    )
    return FinalTable(tuple(rows.values()), len(ordered), notes)


def with_notes(diff: RecordDiff, notes: Sequence[str]) -> RecordDiff:
    """The same diff with notes that also fail it (e.g. an undefined upsert order)."""
    if not notes:
        return diff
    return RecordDiff(
        diff.expected,
        diff.actual,
        diff.duplicated,
        diff.missing,
        diff.unexpected,
        diff.changed,
        (*diff.notes, *notes),
    )
