"""``weir plan``: the design card's dimensional formulas as a calculator (backlog, replay, recovery, state).

These are dimensional formulas over steady rates, not an SLA and not a benchmark: they say how the
figures scale with their inputs, under the assumptions :func:`compute_plan` prints with them.

Symbols (units in brackets), as :class:`PlanInputs` names them:

* ``λ`` input_records_per_s [records/s]: the rate records arrive at the job's sources;
* ``μ`` sink_records_per_s [records/s]: the rate the pipeline sustains into its sinks, in the same
  records as ``λ`` (one sink record per input record);
* ``T`` checkpoint_interval_s [s], ``D`` checkpoint_duration_s [s] (trigger to completion);
* ``d`` failure_detection_s [s], ``r`` restart_delay_s [s];
* ``K`` active_keys [keys], ``A`` aggregates_per_key [aggregates/key], ``B`` bytes_per_aggregate [bytes];
* ``ρ`` restore_bytes_per_s [bytes/s], optional.

Formulas (:func:`compute_plan`):

* backlog growth ``g = λ − μ`` [records/s], ``3600·g`` [records/h]; ``g ≤ 0`` is headroom (the sink
  keeps up). Unaligned checkpoints change how long a barrier takes, not ``λ`` or ``μ``: not the sign of ``g``.
* state size ``S = K·A·B`` [bytes]: it depends on the keys, the aggregates each keeps and their
  serialized size, not on a fixed ratio of RocksDB's.
* progress interval ``P = max(T, D)`` [s]: one checkpoint at a time, so with ``D > T`` they complete every ``D``.
* a failure at time ``t`` after the trigger of the latest completed checkpoint replays what the
  sources read since that trigger: ``λ·t`` records. Checkpoint ``k`` completes ``D`` after its
  trigger and ``k+1`` is triggered ``P`` later, so ``t`` lies in ``[D, P + D)``:
  worst case (the failure just before the next checkpoint completes) ``W_max = λ·(P + D)`` [records],
  average case (failure time uniform) ``W_avg = λ·(P/2 + D)`` [records].
* restore ``R = S/ρ`` [s] when ``ρ`` is given (else not counted); downtime ``d + r + R`` [s]; the backlog
  accumulated meanwhile ``Q = λ·(d + r + R)`` [records].
* catch-up ``C = (W + Q)/(μ − λ)`` [s] when ``μ > λ``; never (infinite) otherwise: the job falls
  further behind while it replays.
* recovery time bound ``d + r + R + C`` [s], for the worst and the average case.
"""

from __future__ import annotations

import enum
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, Final

from weir.core.errors import Fault, WeirError

SECONDS_PER_HOUR: Final = 3600.0

DISCLAIMER: Final = (
    "dimensional formulas over steady rates: they show how the figures scale with their inputs; "
    "not an SLA, not a benchmark of Weir or of any product"
)


class MissingInputError(WeirError):
    """A figure the formulas need was neither given as a flag nor measured: the message names the flag."""

    fault: Fault = Fault.USER


class InvalidInputError(WeirError):
    """A figure is negative, not finite, or otherwise outside what the formulas take."""

    fault: Fault = Fault.USER


@dataclass(frozen=True)
class PlanInputs:
    """The calculator's inputs, units in the names (see the module docstring for the symbols)."""

    input_records_per_s: float
    sink_records_per_s: float
    checkpoint_interval_s: float
    checkpoint_duration_s: float
    failure_detection_s: float
    restart_delay_s: float
    active_keys: float
    aggregates_per_key: float
    bytes_per_aggregate: float
    restore_bytes_per_s: float | None = None

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None:
                continue
            if not math.isfinite(value) or value < 0:
                raise InvalidInputError(f"{f.name} must be a finite number >= 0, got {value}")
        if self.checkpoint_interval_s <= 0:
            raise InvalidInputError(f"checkpoint_interval_s must be > 0, got {self.checkpoint_interval_s}")
        if self.restore_bytes_per_s is not None and self.restore_bytes_per_s <= 0:
            raise InvalidInputError(f"restore_bytes_per_s must be > 0 when given, got {self.restore_bytes_per_s}")


@dataclass(frozen=True)
class ReplayCase:
    """One failure time: how far back the restore goes, what is replayed and how long catching up takes."""

    since_restore_point_s: float  # t: the failure's time after the latest completed checkpoint's trigger
    replay_records: float  # λ·t
    downtime_backlog_records: float  # Q = λ·(d + r + R)
    catch_up_s: float  # (λ·t + Q)/(μ − λ); math.inf: never
    recovery_bound_s: float  # d + r + R + catch-up; math.inf: never

    @property
    def catches_up(self) -> bool:
        return math.isfinite(self.catch_up_s)


@dataclass(frozen=True)
class Plan:
    inputs: PlanInputs
    backlog_growth_records_per_s: float
    backlog_growth_records_per_h: float
    progress_interval_s: float  # P = max(T, D)
    state_size_bytes: float
    restore_s: float | None  # S/ρ; None: no restore rate given, not counted
    downtime_s: float  # d + r + R
    worst_case: ReplayCase
    average_case: ReplayCase
    assumptions: tuple[str, ...]

    @property
    def headroom(self) -> bool:
        """The sink keeps up: the backlog does not grow (``λ − μ ≤ 0``)."""
        return self.backlog_growth_records_per_s <= 0

    def to_json(self) -> dict[str, Any]:
        def number(x: float | None) -> float | str | None:
            return "never" if x is not None and math.isinf(x) else x

        def case(c: ReplayCase) -> dict[str, Any]:
            return {
                "since_restore_point_s": c.since_restore_point_s,
                "replay_records": c.replay_records,
                "downtime_backlog_records": c.downtime_backlog_records,
                "catch_up_s": number(c.catch_up_s),
                "recovery_bound_s": number(c.recovery_bound_s),
            }

        return {
            "inputs": {f.name: getattr(self.inputs, f.name) for f in fields(self.inputs)},
            "backlog_growth_records_per_s": self.backlog_growth_records_per_s,
            "backlog_growth_records_per_h": self.backlog_growth_records_per_h,
            "headroom": self.headroom,
            "progress_interval_s": self.progress_interval_s,
            "state_size_bytes": self.state_size_bytes,
            "restore_s": self.restore_s,
            "downtime_s": self.downtime_s,
            "worst_case": case(self.worst_case),
            "average_case": case(self.average_case),
            "assumptions": list(self.assumptions),
        }


def catch_up_s(work_records: float, input_records_per_s: float, sink_records_per_s: float) -> float:
    """Seconds to work off ``work_records`` while input keeps arriving: ``work/(μ − λ)``; ``math.inf``
    when ``μ ≤ λ`` (no work left: 0 s)."""
    if work_records <= 0:
        return 0.0
    spare = sink_records_per_s - input_records_per_s
    return work_records / spare if spare > 0 else math.inf


def compute_plan(inputs: PlanInputs) -> Plan:
    """Every figure of the plan from ``inputs``; the formulas are the module docstring's."""
    lam, mu = inputs.input_records_per_s, inputs.sink_records_per_s
    growth = lam - mu
    state = inputs.active_keys * inputs.aggregates_per_key * inputs.bytes_per_aggregate
    restore = state / inputs.restore_bytes_per_s if inputs.restore_bytes_per_s is not None else None
    downtime = inputs.failure_detection_s + inputs.restart_delay_s + (restore or 0.0)
    backlog = lam * downtime
    progress = max(inputs.checkpoint_interval_s, inputs.checkpoint_duration_s)
    duration = inputs.checkpoint_duration_s

    def case(since_s: float) -> ReplayCase:
        replay = lam * since_s
        catch = catch_up_s(replay + backlog, lam, mu)
        return ReplayCase(since_s, replay, backlog, catch, downtime + catch)

    assumptions = [
        DISCLAIMER,
        "rates are steady; the sink rate is in input records (one sink record per input record)",
        "every checkpoint completes; one at a time, so one completes every max(interval, duration)",
        "a restore goes back to the latest completed checkpoint; the sources replay from its trigger",
        "worst case: the failure comes just before the next checkpoint completes; average: failure time uniform",
        "unaligned checkpoints shorten the barriers' way, they do not change the sign of the backlog growth",
        "state size = keys x aggregates per key x serialized bytes per aggregate, not a fixed RocksDB ratio",
    ]
    if restore is None:
        assumptions.append("no restore rate given (--restore-rate): the state restore time is not counted")
    if inputs.checkpoint_duration_s > inputs.checkpoint_interval_s:
        assumptions.append("checkpoints take longer than the interval: progress comes every duration, not interval")
    return Plan(
        inputs=inputs,
        backlog_growth_records_per_s=growth,
        backlog_growth_records_per_h=growth * SECONDS_PER_HOUR,
        progress_interval_s=progress,
        state_size_bytes=state,
        restore_s=restore,
        downtime_s=downtime,
        worst_case=case(progress + duration),
        average_case=case(progress / 2 + duration),
        assumptions=tuple(assumptions),
    )


# Where each input came from -----------------------------------------------------------------------


class Origin(enum.StrEnum):
    FLAG = "flag"
    MEASURED = "measured"
    DEFAULT = "default"


@dataclass(frozen=True)
class Figure:
    """One input value, where it came from and how it was found (a PromQL expression, a savepoint...)."""

    value: float
    origin: Origin
    how: str = ""


FLAGS: Final[Mapping[str, str]] = {
    "input_records_per_s": "--input-rate",
    "sink_records_per_s": "--sink-rate",
    "checkpoint_interval_s": "--checkpoint-interval",
    "checkpoint_duration_s": "--checkpoint-duration",
    "failure_detection_s": "--failure-detection",
    "restart_delay_s": "--restart-delay",
    "active_keys": "--active-keys",
    "aggregates_per_key": "--aggregates-per-key",
    "bytes_per_aggregate": "--bytes-per-aggregate",
    "restore_bytes_per_s": "--restore-rate",
}
"""The command-line flag of each :class:`PlanInputs` field."""

_OPTIONAL: Final = frozenset({"restore_bytes_per_s"})


@dataclass(frozen=True)
class ResolvedInputs:
    inputs: PlanInputs
    figures: Mapping[str, Figure]  # by PlanInputs field; an optional input not given is absent


def resolve_inputs(
    flags: Mapping[str, float | None],
    measured: Mapping[str, Figure],
    defaults: Mapping[str, Figure] | None = None,
    *,
    hints: Mapping[str, str] | None = None,
) -> ResolvedInputs:
    """Merge by field name: a flag given wins over a measurement, a measurement over a default. A
    required field with none of the three is a MissingInputError naming its flag (and ``hints[field]``,
    why it was not measured, when known)."""
    figures: dict[str, Figure] = {}
    missing: list[str] = []
    for f in fields(PlanInputs):
        name = f.name
        flag = flags.get(name)
        if flag is not None:
            figures[name] = Figure(float(flag), Origin.FLAG, FLAGS[name])
        elif name in measured:
            figures[name] = measured[name]
        elif defaults is not None and name in defaults:
            figures[name] = defaults[name]
        elif name not in _OPTIONAL:
            hint = (hints or {}).get(name)
            missing.append(f"{FLAGS[name]} ({name}{': ' + hint if hint else ''})")
    if missing:
        raise MissingInputError(
            "weir plan needs " + "; ".join(missing) + ": give the flag, or measure it with --job / --savepoint"
        )
    values = {name: figure.value for name, figure in figures.items()}
    return ResolvedInputs(PlanInputs(**values), figures)


# Prometheus answers ------------------------------------------------------------------------------


class PrometheusQueryError(WeirError):
    """Prometheus refused a query or answered something that is not an instant vector."""

    fault: Fault = Fault.EXTERNAL


def vector_sum(answer: Mapping[str, Any], expr: str) -> float | None:
    """The sum of the samples of an instant-vector answer of ``/api/v1/query`` (None: no series).

    A sample's value is ``[timestamp, "string"]``; NaN samples (e.g. a rate over too few points) are
    left out; only NaNs is None, like no series."""
    if answer.get("status") != "success":
        raise PrometheusQueryError(
            f"Prometheus refused {expr!r}: {answer.get('errorType', 'error')}: {answer.get('error', 'no reason given')}"
        )
    data = answer.get("data")
    if not isinstance(data, Mapping) or data.get("resultType") != "vector":
        kind = data.get("resultType") if isinstance(data, Mapping) else type(data).__name__
        raise PrometheusQueryError(f"Prometheus answered {expr!r} with a {kind}, not an instant vector")
    values: list[float] = []
    for sample in data.get("result", []):
        try:
            value = float(sample["value"][1])
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise PrometheusQueryError(f"Prometheus answered {expr!r} with a malformed sample {sample!r}") from exc
        if not math.isnan(value):
            values.append(value)
    return sum(values) if values else None


_REGEX_SPECIAL: Final = re.compile(r"([\\.+*?()|\[\]{}^$])")


def _regex_literal(value: str) -> str:
    """``value`` as an RE2 literal inside a PromQL string: each metacharacter backslashed, and each
    backslash doubled for the string (``a.b`` becomes ``a\\\\.b``); ``-`` is left as it is."""
    return _REGEX_SPECIAL.sub(r"\\\1", value).replace("\\", "\\\\")


def label_matcher(values: Mapping[str, str] | None = None, **labels: str | list[str]) -> str:
    """``{a="x",b=~"y|z"}``: a list becomes an anchored alternation of its (regex-escaped) items."""
    parts: list[str] = []
    for name, value in {**(values or {}), **labels}.items():
        if isinstance(value, list):
            parts.append(f'{name}=~"{"|".join(_regex_literal(v) for v in value)}"')
        else:
            parts.append(f"{name}={json.dumps(value)}")  # a Go string literal: quotes and backslashes escaped
    return "{" + ",".join(parts) + "}"


# Text --------------------------------------------------------------------------------------------


def records(n: float) -> str:
    return f"{n:,.0f} records" if abs(n) >= 10 else f"{n:,.2f} records"


def rate(n: float, per: str = "s") -> str:
    return f"{n:,.1f} records/{per}"


def seconds(s: float | None) -> str:
    if s is None:
        return "not counted"
    if math.isinf(s):
        return "never (the sink does not outpace the input)"
    if s >= 3600:
        return f"{s:,.1f} s ({s / 3600:,.2f} h)"
    return f"{s:,.1f} s"


def size(n: float) -> str:
    for unit, factor in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= factor:
            return f"{n:,.0f} bytes ({n / factor:,.1f} {unit})"
    return f"{n:,.0f} bytes"


def _number(v: float) -> str:
    return f"{v:,.0f}" if v == int(v) else f"{v:,.4g}" if abs(v) < 1000 else f"{v:,.1f}"


def input_rows(resolved: ResolvedInputs) -> list[tuple[str, str, str, str]]:
    """(field, value with unit, origin, how) for every input given."""
    units = {
        "input_records_per_s": "records/s",
        "sink_records_per_s": "records/s",
        "checkpoint_interval_s": "s",
        "checkpoint_duration_s": "s",
        "failure_detection_s": "s",
        "restart_delay_s": "s",
        "active_keys": "keys",
        "aggregates_per_key": "aggregates/key",
        "bytes_per_aggregate": "bytes",
        "restore_bytes_per_s": "bytes/s",
    }
    return [
        (name, f"{_number(figure.value)} {units[name]}", figure.origin.value, figure.how)
        for name, figure in resolved.figures.items()
    ]


def result_rows(plan: Plan) -> list[tuple[str, str, str]]:
    """(figure, value with unit, formula) for the table."""
    g = plan.backlog_growth_records_per_s
    growth_note = "headroom: the sink keeps up" if plan.headroom else "grows: the sink falls behind"
    w, a = plan.worst_case, plan.average_case
    return [
        ("backlog growth", f"{rate(g)} ({growth_note})", "λ − μ"),
        ("backlog growth per hour", rate(plan.backlog_growth_records_per_h, "h"), "3600·(λ − μ)"),
        ("state size", size(plan.state_size_bytes), "K·A·B"),
        ("state restore", seconds(plan.restore_s), "S/ρ"),
        ("downtime", seconds(plan.downtime_s), "d + r + R"),
        ("backlog during downtime", records(w.downtime_backlog_records), "λ·(d + r + R)"),
        ("progress interval", seconds(plan.progress_interval_s), "P = max(T, D)"),
        ("replay, worst case", f"{records(w.replay_records)} ({w.since_restore_point_s:,.1f} s of input)", "λ·(P + D)"),
        (
            "replay, average case",
            f"{records(a.replay_records)} ({a.since_restore_point_s:,.1f} s of input)",
            "λ·(P/2 + D)",
        ),
        ("catch-up, worst case", seconds(w.catch_up_s), "(λ·(P + D) + Q)/(μ − λ)"),
        ("catch-up, average case", seconds(a.catch_up_s), "(λ·(P/2 + D) + Q)/(μ − λ)"),
        ("recovery bound, worst case", seconds(w.recovery_bound_s), "d + r + R + C"),
        ("recovery bound, average case", seconds(a.recovery_bound_s), "d + r + R + C"),
    ]
