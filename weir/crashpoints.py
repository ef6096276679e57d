"""Named crash points: armed by ``WEIR_CRASH_POINT=name[:count]``, they end the process hard."""

from __future__ import annotations

import os
from typing import Any

import structlog

_hits: dict[str, int] = {}


def crash_point(name: str, **context: Any) -> None:
    armed = os.environ.get("WEIR_CRASH_POINT", "")
    if not armed:
        return
    point, _, count = armed.partition(":")
    if point != name:
        return
    _hits[name] = _hits.get(name, 0) + 1
    if _hits[name] >= int(count or "1"):
        structlog.get_logger("weir.crash").error("crash_point_hit", point=name, **context)
        os._exit(137)
