"""JSON decode and encode CPU cost per event on the keyed benchmark's own records (``make bench-json``).

Decode: the input events of ``bench/dataset.py`` (``{"id", "key", "value", "ts"}``, ~60 bytes) from
bytes to Python values. Encode: the keyed job's window results (``{"key", "window_start",
"window_end", "count", "sum"}``) from a dict to bytes, compact with sorted keys, as Weir's Kafka sink
writes them. Each way is timed with ``time.process_time`` over ``--events`` records, ``--repeats``
times; the figure is the median, in CPU µs per event. Every candidate's output is checked against
the stdlib's (the same Python values; for encoding, bytes that decode to the same values) before it
is timed, so a fast but wrong candidate is reported as such.

Candidates: the stdlib ``json`` (as Weir used it before: ``json.loads(raw.decode())``, and of bytes),
orjson, msgspec (generic, and a typed ``msgspec.Struct`` decode that also checks the four fields'
types, the work ``examples/keyed_aggregation.py``'s ``parse_event`` does in Python), ujson, and
``weir.core.json_codec`` (the codec Weir uses, with its fallbacks). A library that is not installed
is reported as missing. Writes ``bench/results/json.json`` and ``json.md``.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import importlib.metadata
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import provenance
from bench.dataset import WINDOW_MS, event_bytes

RESULTS = Path(__file__).resolve().parent / "results"
REPO_ROOT = Path(__file__).resolve().parent.parent


def _maybe(module: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError:
        return None


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def inputs(n: int) -> list[bytes]:
    return [event_bytes(i)[2] for i in range(n)]


def results(n: int) -> list[dict[str, Any]]:
    """Window results shaped as the job emits them (keys in the job's insertion order)."""
    out = []
    for i in range(n):
        start = 1_700_000_000_000 + (i // 1000) * WINDOW_MS
        key = f"key-{i % 1000:04d}"
        out.append({"key": key, "window_start": start, "window_end": start + WINDOW_MS, "count": 8, "sum": i % 800})
    return out


def _typed_event_decoder() -> Callable[[bytes], Any]:
    """msgspec decoding an event into a Struct, checking the four fields' types as it goes."""
    import msgspec

    class Event(msgspec.Struct):
        id: str
        key: str
        value: int
        ts: int

    return msgspec.json.Decoder(Event).decode


def decoders() -> dict[str, Callable[[bytes], Any] | str]:
    """name -> decode function, or the reason it is absent."""
    out: dict[str, Callable[[bytes], Any] | str] = {}
    loads = json.loads
    out["json (stdlib), loads(raw.decode())"] = lambda raw: loads(raw.decode())
    out["json (stdlib), loads(raw)"] = loads
    orjson = _maybe("orjson")
    out["orjson.loads"] = orjson.loads if orjson else "orjson is not installed"
    msgspec = _maybe("msgspec")
    if msgspec:
        out["msgspec.json.decode (generic)"] = msgspec.json.Decoder().decode
        out["msgspec.json.decode (typed Struct, fields checked)"] = _typed_event_decoder()
    else:
        out["msgspec.json.decode (generic)"] = "msgspec is not installed"
    ujson = _maybe("ujson")
    out["ujson.loads"] = ujson.loads if ujson else "ujson is not installed"
    codec = _maybe("weir.core.json_codec")
    out["weir.core.json_codec.decode"] = codec.decode if codec else "weir.core.json_codec is not there"
    return out


def encoders() -> dict[str, Callable[[Any], bytes] | str]:
    out: dict[str, Callable[[Any], bytes] | str] = {}
    stdlib = json.JSONEncoder(separators=(",", ":"), sort_keys=True).encode
    out["json (stdlib), JSONEncoder(compact, sort_keys).encode().encode()"] = lambda v: stdlib(v).encode()
    orjson = _maybe("orjson")
    if orjson:
        sort = orjson.OPT_SORT_KEYS
        dumps = orjson.dumps
        out["orjson.dumps(OPT_SORT_KEYS)"] = lambda v: dumps(v, option=sort)
    else:
        out["orjson.dumps(OPT_SORT_KEYS)"] = "orjson is not installed"
    msgspec = _maybe("msgspec")
    out["msgspec.json.Encoder(order='sorted').encode"] = (
        msgspec.json.Encoder(order="sorted").encode if msgspec else "msgspec is not installed"
    )
    ujson = _maybe("ujson")
    if ujson:
        udumps = ujson.dumps
        out["ujson.dumps(sort_keys).encode()"] = lambda v: udumps(v, sort_keys=True, ensure_ascii=False).encode()
    else:
        out["ujson.dumps(sort_keys).encode()"] = "ujson is not installed"
    codec = _maybe("weir.core.json_codec")
    out["weir.core.json_codec.encode"] = codec.encode if codec else "weir.core.json_codec is not there"
    return out


def _plain(value: Any) -> Any:
    """A decoded value as plain Python (a msgspec Struct as the dict it stands for)."""
    fields = getattr(value, "__struct_fields__", None)
    if fields is not None:
        return {f: getattr(value, f) for f in fields}
    return value


def time_passes(candidates: dict[str, Callable[[Any], Any]], items: list[Any], repeats: int) -> dict[str, list[float]]:
    """CPU seconds of one pass over ``items`` per candidate and repetition. The candidates take turns
    within each repetition, so a slower stretch of the machine falls on all of them alike."""
    for fn in candidates.values():  # warm-up
        for item in items[:1000]:
            fn(item)
    samples: dict[str, list[float]] = {name: [] for name in candidates}
    for _ in range(repeats):
        for name, fn in candidates.items():
            gc.collect()
            started = time.process_time()
            for item in items:
                fn(item)
            samples[name].append(time.process_time() - started)
    return samples


def measure(events: int, repeats: int) -> dict[str, list[dict[str, Any]]]:
    raw = inputs(events)
    values = results(events)
    expected_decoded = [json.loads(r) for r in raw[:2000]]

    def check_decode(fn: Callable[[bytes], Any]) -> bool:
        return [_plain(fn(r)) for r in raw[:2000]] == expected_decoded

    def check_encode(fn: Callable[[Any], bytes]) -> bool:
        return [json.loads(fn(v)) for v in values[:2000]] == values[:2000]

    rows: dict[str, list[dict[str, Any]]] = {}
    for way, found, items, check in (
        ("decode", decoders(), raw, check_decode),
        ("encode", encoders(), values, check_encode),
    ):
        present = {name: fn for name, fn in found.items() if not isinstance(fn, str)}
        samples = time_passes(present, items, repeats)
        rows[way] = [
            {"name": name, "missing": fn} if isinstance(fn, str) else _row(name, samples[name], events, check(fn))
            for name, fn in found.items()
        ]
    return rows


def _row(name: str, samples: list[float], events: int, same: bool) -> dict[str, Any]:
    median = statistics.median(samples)
    return {
        "name": name,
        "us_per_event": median / events * 1e6,
        "min_us_per_event": min(samples) / events * 1e6,
        "samples_s": samples,
        "spread_pct": (max(samples) - min(samples)) / median * 100 if median else 0.0,
        "same_values_as_stdlib": same,
    }


def _commit() -> str | None:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def markdown(document: dict[str, Any]) -> str:
    lines = [
        "# JSON codecs on the benchmark's records (`make bench-json`)",
        "",
        provenance.markdown_line(document.get("provenance")),
        "",
        f"{document['events']:,} records per pass, median of {document['repeats']} passes, CPU µs per record "
        f"(`time.process_time`); Python {document['python']}, commit {document['commit']}, load average "
        f"{document['load_average']} at the start. Spread: (max - min) / median over the passes.",
        "",
    ]
    ways = (
        ("decode", "Decode: an input event, bytes → Python values"),
        ("encode", "Encode: a window result, dict → compact JSON bytes, sorted keys"),
    )
    for way, what in ways:
        rows = document["results"][way]
        base = next((r["us_per_event"] for r in rows if "us_per_event" in r), None)
        lines += [
            f"## {what}",
            "",
            "| library | µs / record (median) | min | vs first row | spread | same values as stdlib |",
            "| --- | ---: | ---: | ---: | ---: | --- |",
        ]
        for r in rows:
            if "missing" in r:
                lines.append(f"| {r['name']} | – | – | – | – | {r['missing']} |")
                continue
            ratio = f"{base / r['us_per_event']:.2f}x" if base else "–"
            lines.append(
                f"| {r['name']} | {r['us_per_event']:.3f} | {r['min_us_per_event']:.3f} | {ratio} | "
                f"{r['spread_pct']:.0f} % | "
                f"{'yes' if r['same_values_as_stdlib'] else '**no**'} |"
            )
        lines.append("")
    versions = ", ".join(f"{k} {v}" for k, v in document["versions"].items() if v)
    lines += [f"Versions: {versions}.", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.json_bench", description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    block = provenance.collect(REPO_ROOT, java=None)

    document = {
        "benchmark": "json",
        "events": args.events,
        "repeats": args.repeats,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "commit": _commit(),
        "load_average": " / ".join(f"{x:.2f}" for x in os.getloadavg()),
        "versions": {d: _version(d) for d in ("orjson", "msgspec", "ujson")},
        "results": measure(args.events, args.repeats),
    }
    document["provenance"] = provenance.finish(block)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "json.json").write_text(json.dumps(document, indent=2) + "\n")
    text = markdown(document)
    (args.out / "json.md").write_text(text)
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
