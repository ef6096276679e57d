"""Which of Apache Flink's REST endpoints Weir's REST API has: the operations (method and path, path
parameters' names ignored) of Flink's OpenAPI document (``rest_v1_dispatcher.yml``, published with
Flink's documentation) matched against Weir's ``/openapi.json``. Run as
``python -m weir.tools.flink_rest_diff FLINK_SPEC.yml``; prints the matched, Flink's missing in Weir and
Weir's own, as the note in docs/rest-api.md lists them."""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple, cast

import yaml

from weir.jobmanager.manager import JobManager
from weir.jobmanager.rest.app import create_app

METHODS = ("get", "put", "post", "delete", "patch")


class Operation(NamedTuple):
    method: str
    path: str  # parameters as {}

    def __str__(self) -> str:
        return f"{self.method.upper():6} {self.path}"


class Diff(NamedTuple):
    matched: list[Operation]
    flink_only: list[Operation]
    weir_only: list[Operation]


def operations(document: Mapping[str, Any]) -> set[Operation]:
    return {
        Operation(method, re.sub(r"\{[^}]*\}", "{}", path))
        for path, item in document.get("paths", {}).items()
        for method in item
        if method in METHODS
    }


def weir_document() -> dict[str, Any]:
    """Weir's OpenAPI document; building it reads no JobManager state, so none is given."""
    return create_app(cast(JobManager, None)).openapi()


def diff(flink: Mapping[str, Any], weir: Mapping[str, Any]) -> Diff:
    ours, theirs = operations(weir), operations(flink)
    return Diff(sorted(ours & theirs), sorted(theirs - ours), sorted(ours - theirs))


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m weir.tools.flink_rest_diff FLINK_SPEC.yml", file=sys.stderr)
        return 2
    result = diff(yaml.safe_load(Path(argv[0]).read_text()), weir_document())
    for title, ops in (
        ("matched", result.matched),
        ("Flink's, not in Weir", result.flink_only),
        ("Weir's own", result.weir_only),
    ):
        print(f"{title} ({len(ops)}):")
        print("\n".join(f"  {op}" for op in ops))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
