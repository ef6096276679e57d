"""The fenced code blocks of README.md and docs/, each classified by how a test runs it.

A block's class comes from an HTML comment on the line right before its fence,
``<!-- test: KIND ... -->``, or else from its info string:

- ``<!-- test: skip REASON -->``: not run here, for the reason given (Docker, kubectl, a cloud); the
  tests count and list them.
- ``<!-- test: file PATH -->``: a ``python`` block that is the whole of the repository file PATH (a
  job: built into its job graph, not submitted; a test module ``test_*.py``: run by the test suite).
- ``<!-- test: fragment [given NAME ...] -->``: a ``python`` excerpt of a job's ``build(env)``: run
  inside one, ``env`` given, each NAME a stream of one record, ``fn:NAME`` the identity function.
- ``<!-- test: local -->``: a shell block run here, without services (``weir --help``, ...).
- ``<!-- test: cluster [after VAR ended] -->``: a shell block run against the test session's cluster
  (tests/integration/docs/); shell variables it assigns carry over to the next cluster block of the
  same page, and ``after VAR ended`` waits first until the job whose id ``$VAR`` holds has ended,
  as a reader waits for ``weir status`` to say so.
- info string ``python`` without a marker: a complete job file (it defines ``build``), built.
- info string ``sql`` without a marker: a streaming SQL script (docs/sql.md), planned by
  ``weir.sql.plan_script`` after the page's earlier ``sql`` blocks (a page's script grows as a
  reader's does): it must plan, not be refused.
- info string ``text``, ``json`` or ``yaml`` without a marker: data (output, a format, a diagram,
  a configuration sketch), neither a job nor a command: not run.

Any other block (a shell block without a marker, a block without an info string) is unclassified,
and a test fails naming it.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Final

REPO_ROOT: Final = Path(__file__).resolve().parents[3]
DATA_LANGUAGES: Final = frozenset({"text", "json", "yaml"})
SHELL_LANGUAGES: Final = frozenset({"sh", "bash", "console"})
_FENCE = re.compile(r"^(?P<indent> *)(?P<fence>```+)(?P<info>[^`]*)$")
_MARKER = re.compile(r"^\s*<!--\s*test:\s*(?P<kind>[a-z]+)\s*(?P<rest>.*?)\s*-->\s*$")
_AFTER = re.compile(r"^after (?P<var>[A-Z_][A-Z0-9_]*) ended$")


class Kind(enum.Enum):
    SKIP = "skip"
    FILE = "file"
    FRAGMENT = "fragment"
    JOB = "job"
    LOCAL = "local"
    CLUSTER = "cluster"
    SQL = "sql"
    DATA = "data"
    UNCLASSIFIED = "unclassified"


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # of the opening fence, 1-based
    language: str
    text: str
    kind: Kind
    argument: str  # the skip's reason, the file's path, a fragment's given names, a cluster block's wait
    problem: str = ""  # why the block is unclassified

    @property
    def name(self) -> str:
        return f"{self.page.relative_to(REPO_ROOT)}:{self.line}"


def pages() -> list[Path]:
    """README.md and every page under docs/."""
    return [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").rglob("*.md"))]


def blocks(page: Path) -> list[Block]:
    lines = page.read_text(encoding="utf-8").split("\n")
    found: list[Block] = []
    i = 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if opening is None:
            i += 1
            continue
        indent, fence = opening["indent"], opening["fence"]
        end = i + 1
        while end < len(lines) and lines[end].strip() != fence:
            end += 1
        body = "\n".join(line[len(indent) :] if line.startswith(indent) else line for line in lines[i + 1 : end])
        marker = _MARKER.match(lines[i - 1]) if i > 0 else None
        found.append(_classify(page, i + 1, opening["info"].strip(), body + "\n", marker))
        i = end + 1
    return found


def _classify(page: Path, line: int, language: str, text: str, marker: re.Match[str] | None) -> Block:
    def block(kind: Kind, argument: str = "", problem: str = "") -> Block:
        return Block(page, line, language, text, kind, argument, problem)

    if marker is None:
        if language == "python":
            return (
                block(Kind.JOB)
                if re.search(r"^def build\(", text, re.M)
                else block(
                    Kind.UNCLASSIFIED,
                    problem="a python block that defines no build(env) needs a marker (fragment, file, skip)",
                )
            )
        if language == "sql":
            return block(Kind.SQL)
        if language in DATA_LANGUAGES:
            return block(Kind.DATA)
        if language in SHELL_LANGUAGES:
            return block(Kind.UNCLASSIFIED, problem="a shell block needs <!-- test: local|cluster|skip REASON -->")
        return block(Kind.UNCLASSIFIED, problem=f"info string {language!r}: say text, json, yaml, python, sql or sh")
    kind, rest = marker["kind"], marker["rest"]
    match kind:
        case "skip":
            return block(Kind.SKIP, rest) if rest else block(Kind.UNCLASSIFIED, problem="a skip without a reason")
        case "file":
            exists = rest and (REPO_ROOT / rest).is_file()
            return block(Kind.FILE, rest) if exists else block(Kind.UNCLASSIFIED, problem=f"no file {rest!r}")
        case "fragment" if language == "python" and (not rest or rest.startswith("given ")):
            return block(Kind.FRAGMENT, rest.removeprefix("given ").strip())
        case "local" if language in SHELL_LANGUAGES and not rest:
            return block(Kind.LOCAL)
        case "cluster" if language in SHELL_LANGUAGES and (not rest or _AFTER.match(rest)):
            return block(Kind.CLUSTER, rest)
    return block(Kind.UNCLASSIFIED, problem=f"marker {marker.group(0).strip()!r} does not fit a {language!r} block")


def every_block() -> list[Block]:
    return [b for page in pages() for b in blocks(page)]


def waits_for(block: Block) -> str | None:
    """The shell variable holding the job a cluster block waits for, if it waits."""
    match = _AFTER.match(block.argument)
    return match["var"] if match else None


def assigned_variables(block: Block) -> list[str]:
    """The shell variables a block assigns at the start of a line (``JOB_ID=$(weir run ...)``)."""
    return re.findall(r"^([A-Z_][A-Z0-9_]*)=", block.text, re.M)
