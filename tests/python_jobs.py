"""Jobs of many files for the tests: a job file, a package and a helper module, and a third-party
requirement written as a real wheel (``weir run --py-files``, ``--py-requirements``)."""

from __future__ import annotations

import base64
import hashlib
import zipfile
from pathlib import Path


def write_wheel(directory: Path, name: str, version: str, modules: dict[str, str]) -> Path:
    """A pure-Python wheel of ``modules`` (path inside the wheel -> source), as ``pip wheel`` writes one."""
    dist_info = f"{name}-{version}.dist-info"
    files = {
        **modules,
        f"{dist_info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{dist_info}/WHEEL": "Wheel-Version: 1.0\nGenerator: weir-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(text.encode())}")
    record.append(f"{dist_info}/RECORD,,")
    files[f"{dist_info}/RECORD"] = "\n".join(record) + "\n"
    directory.mkdir(parents=True, exist_ok=True)
    wheel = directory / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for path, text in files.items():
            archive.writestr(path, text)
    return wheel


SCALE_PACKAGE = "tinyscale"


def write_scale_wheel(directory: Path, version: str = "1.0", factor: int = 3) -> Path:
    """The third-party requirement: ``tinyscale.scale(v)`` multiplies by ``factor``."""
    return write_wheel(
        directory,
        SCALE_PACKAGE,
        version,
        {f"{SCALE_PACKAGE}/__init__.py": f"__version__ = {version!r}\n\n\ndef scale(v):\n    return v * {factor}\n"},
    )


JOB_FILE = '''
from windowjob.pipeline import build_pipeline


def build(env):
    build_pipeline(env)
'''

PIPELINE = '''
from helpers import CountAndSum, Pair, parse_event, tag_of

import tinyscale
from weir.api import TumblingEventTimeWindows


def build_pipeline(env):
    p = env.params
    events = env.from_kafka(
        p.get_str("source.topic", "events"),
        uid="events-source",
        bounded=True,
        deserializer=parse_event,
        timestamp=lambda e: e["ts"],
        dead_letter_topic=p.get_str("source.dlq_topic", "events-dlq"),
        records_per_second=p.get_int("source.records_per_second", 0) or None,
    )
    results = (
        events.map(lambda e: Pair(tag_of(e["key"]), tinyscale.scale(e["value"])), uid="key-value")
        .key_by(lambda pair: pair.key)
        .window(TumblingEventTimeWindows(1000))
        .aggregate(CountAndSum(), uid="window-count-sum")
    )
    results.sink_to_kafka(p.get_str("sink.topic", "window-results"), uid="kafka-sink", key=lambda r: r["key"])
    results.sink_to_postgres(
        p.get_str("sink.table", "window_results"),
        uid="postgres-sink",
        columns=("key", "window_start", "window_end", "count", "sum"),
        key_columns=("key", "window_start"),
    )
'''

HELPERS = '''
import json
from dataclasses import dataclass

TAG = {tag!r}


@dataclass(frozen=True)
class Pair:
    """A record of this job's own class: it crosses the network between TaskManagers (pickled by name)."""

    key: str
    value: int


def tag_of(key):
    return TAG + "-" + key


def parse_event(raw):
    event = json.loads(raw)
    return {{"key": str(event["key"]), "value": int(event["value"]), "ts": int(event["ts"])}}


class CountAndSum:
    def create(self):
        return (0, 0)

    def add(self, acc, pair):
        assert isinstance(pair, Pair), type(pair)
        return (acc[0] + 1, acc[1] + pair.value)

    def result(self, key, window_start, window_end, acc):
        return {{"key": key, "window_start": window_start, "window_end": window_end, "count": acc[0], "sum": acc[1]}}
'''


def write_job(directory: Path, tag: str) -> tuple[Path, Path]:
    """A job of three modules (``job.py``, ``windowjob.pipeline``, ``helpers``; ``helpers.TAG`` differs by
    ``tag``); answers the job file and the source root to ship with ``--py-files``."""
    src = directory / "src"
    (src / "windowjob").mkdir(parents=True, exist_ok=True)
    (src / "windowjob" / "__init__.py").write_text("", encoding="utf-8")
    (src / "windowjob" / "pipeline.py").write_text(PIPELINE, encoding="utf-8")
    (src / "helpers.py").write_text(HELPERS.format(tag=tag), encoding="utf-8")
    job = directory / "job.py"
    job.write_text(JOB_FILE, encoding="utf-8")
    return job, src
