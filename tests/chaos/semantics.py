"""The chaos run's invariant, after Flink's ``SemanticsCheckMapper``: per key, the sequence number
advances by exactly one.

The input holds, per key, ``seq`` 1, 2, ..., N in order. The job's keyed state keeps the last ``seq``
it saw for the key and stamps each output with it (``prev``): with exactly-once state, ``prev`` is
always ``seq - 1``; a restore that lost state (``prev`` too small) or counted a record twice (``prev``
too large, or equal to ``seq``) shows in every output written after it. Each sink must then hold each
``(key, seq)`` once, for every ``seq`` 1..N of the key: no gap, no repeat.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

SAMPLES = 5


@dataclass(frozen=True)
class Output:
    key: str
    seq: int
    prev: int  # the state's last seq for the key when this record was processed


@dataclass
class SinkCheck:
    """One sink's content against the input: the sequence per key, and the state's view of it."""

    sink: str
    records: int = 0
    keys: int = 0
    missing: int = 0  # (key, seq) of the input the sink does not hold: a gap
    repeated: int = 0  # copies beyond the first of a (key, seq): a repeat
    unexpected: int = 0  # (key, seq) the input does not have
    wrong_prev: int = 0  # outputs whose prev is not seq - 1: state lost or double-counted a record
    samples: list[str] = field(default_factory=list)

    @property
    def exact(self) -> bool:
        return self.records > 0 and not (self.missing or self.repeated or self.unexpected or self.wrong_prev)

    def summary(self) -> str:
        return (
            f"{self.sink}: {self.records} records over {self.keys} keys, missing {self.missing}, "
            f"repeated {self.repeated}, unexpected {self.unexpected}, prev != seq-1 {self.wrong_prev}"
        )

    def _sample(self, text: str) -> None:
        if len(self.samples) < SAMPLES:
            self.samples.append(text)


def check_sink(sink: str, outputs: Iterable[Output], expected: Mapping[str, int]) -> SinkCheck:
    """``expected``: per key its last seq N (the input has 1..N)."""
    result = SinkCheck(sink)
    copies: Counter[tuple[str, int]] = Counter()
    for out in outputs:
        result.records += 1
        copies[(out.key, out.seq)] += 1
        if out.prev != out.seq - 1:
            result.wrong_prev += 1
            result._sample(f"{out.key} seq {out.seq} had prev {out.prev}")
    seen: dict[str, set[int]] = defaultdict(set)
    for (key, seq), n in copies.items():
        last = expected.get(key, 0)
        if not 1 <= seq <= last:
            result.unexpected += n
            result._sample(f"{key} seq {seq} is not in the input (its last seq is {last})")
            continue
        seen[key].add(seq)
        if n > 1:
            result.repeated += n - 1
            result._sample(f"{key} seq {seq} {n} times")
    for key, last in expected.items():
        gaps = last - len(seen.get(key, ()))
        if gaps:
            result.missing += gaps
            first = next(s for s in range(1, last + 1) if s not in seen.get(key, ()))
            result._sample(f"{key}: {gaps} of 1..{last} missing, the first {first}")
    result.keys = len(seen)
    return result
