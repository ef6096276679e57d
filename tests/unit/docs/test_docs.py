"""README.md and docs/ stay true: every code block that is a job or a command runs (the shell blocks
that need the session's cluster run in tests/integration/docs/), every relative link resolves, the
README stays short, and no internal word of the project's own planning appears.

How a block is classified and run: tests/unit/docs/blocks.py.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.unit.docs import blocks
from tests.unit.docs.blocks import REPO_ROOT, Block, Kind
from weir.api import load_job_file, load_job_source
from weir.sql import plan_script

EVERY_BLOCK = blocks.every_block()
RUN_HERE = [
    b for b in EVERY_BLOCK if b.kind in (Kind.SKIP, Kind.FILE, Kind.FRAGMENT, Kind.JOB, Kind.LOCAL, Kind.SQL)
]
GIVEN_RECORD = {"key": "k", "value": 1, "total": 1, "ts": 0, "window_start": 0, "count": 1}
LOCAL_TIMEOUT_S = 60.0
README_MAX_LINES = 250
INTERNAL_WORDS = re.compile(r"design card|\bcards?\b|card's|\bseeds\b|seed's|\bissues? #?\d+", re.I)


def test_every_block_is_classified() -> None:
    unclassified = [f"{b.name}: {b.problem}" for b in EVERY_BLOCK if b.kind is Kind.UNCLASSIFIED]
    assert not unclassified, "blocks no test knows how to run:\n" + "\n".join(unclassified)
    counts = {kind.value: sum(b.kind is kind for b in EVERY_BLOCK) for kind in Kind}
    print(f"\ndocs blocks: {counts}")
    for b in EVERY_BLOCK:
        if b.kind is Kind.SKIP:
            print(f"  skipped {b.name}: {b.argument}")


def shell_environment(shims: Path) -> dict[str, str]:
    """``weir`` and ``python`` as a reader with Weir installed has them: this interpreter's."""
    shims.mkdir(exist_ok=True)
    for name, command in (
        ("weir", f'exec {sys.executable} -m weir.tools.cli "$@"'),
        ("python", f'exec {sys.executable} "$@"'),
    ):
        shim = shims / name
        shim.write_text(f"#!/bin/sh\n{command}\n")
        shim.chmod(0o755)
    env = dict(os.environ)
    env["PATH"] = f"{shims}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(REPO_ROOT), env.get("PYTHONPATH"))))
    return env


def run_fragment(block: Block) -> None:
    given = block.argument.split()
    lines = ["def build(env):"]
    for name in given:
        if name.startswith("fn:"):
            lines.append(f"    {name[3:]} = lambda value: value")
        else:
            lines.append(f"    {name} = env.from_collection([{GIVEN_RECORD!r}], uid='given-{name}')")
    lines.append(textwrap.indent(block.text, "    "))
    load_job_source("\n".join(lines).encode(), block.name, {}, 1)


@pytest.mark.parametrize("block", RUN_HERE, ids=[f"{b.name}[{b.kind.value}]" for b in RUN_HERE])
def test_block(block: Block, tmp_path: Path) -> None:
    match block.kind:
        case Kind.SKIP:
            pytest.skip(f"{block.name}: {block.argument}")
        case Kind.FILE:
            path = REPO_ROOT / block.argument
            assert block.text == path.read_text(encoding="utf-8"), f"{block.name} is not {block.argument} as it is"
            if path.suffix == ".py" and not path.name.startswith("test_"):  # a test module: the suite runs it
                graph = load_job_file(path, {}, 1).graph
                assert graph.transformations, f"{block.argument} builds an empty job"
        case Kind.JOB:
            assert load_job_source(block.text.encode(), block.name, {}, 1).graph.transformations
        case Kind.FRAGMENT:
            run_fragment(block)
        case Kind.SQL:
            page = [b for b in EVERY_BLOCK if b.page == block.page and b.kind is Kind.SQL]
            earlier = [b.text for b in page if b.line < block.line]
            plan_script("".join(earlier) + block.text)
        case Kind.LOCAL:
            done = subprocess.run(
                ["bash", "-e", "-o", "pipefail", "-c", block.text],
                cwd=REPO_ROOT,
                env=shell_environment(tmp_path / "bin"),
                capture_output=True,
                text=True,
                timeout=LOCAL_TIMEOUT_S,
            )
            assert done.returncode == 0, f"{block.name} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
        case _:
            raise AssertionError(f"{block.name}: {block.kind} is not run here")


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = re.sub(r"^ *```.*?^ *```", "", page.read_text(encoding="utf-8"), flags=re.M | re.S)
    return {slug(m) for m in re.findall(r"^#+ (.+)$", text, re.M)}


def test_relative_links_resolve() -> None:
    broken = []
    for page in blocks.pages():
        text = re.sub(r"^ *```.*?^ *```", "", page.read_text(encoding="utf-8"), flags=re.M | re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"^[a-z]+:", target):
                continue  # http(s), mailto: not checked here
            path, _, anchor = target.partition("#")
            resolved = (page.parent / path).resolve() if path else page
            if not resolved.exists():
                broken.append(f"{page.relative_to(REPO_ROOT)}: {target} (no such file)")
            elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
                broken.append(f"{page.relative_to(REPO_ROOT)}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


def test_the_readme_is_short() -> None:
    lines = (REPO_ROOT / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; move detail to docs/"


def test_no_internal_words() -> None:
    found = [
        f"{page.relative_to(REPO_ROOT)}:{n}: {m.group(0)!r}"
        for page in blocks.pages()
        for n, line in enumerate(page.read_text(encoding="utf-8").split("\n"), 1)
        for m in INTERNAL_WORDS.finditer(line)
    ]
    assert not found, "words of the project's planning, not of Weir:\n" + "\n".join(found)
