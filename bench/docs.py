"""docs/benchmarks.md's results, generated from the results files: ``python -m bench.docs``
(``make bench-docs``; the bench targets run it after they write their files), ``--check`` to fail
when the page is not what the files say.

The page's prose says how each benchmark measures; every figure on it sits in a generated block::

    <!-- generated from bench/results/nexmark.json by `python -m bench.docs`: do not edit -->
    ...
    <!-- end of generated block -->

A block holds the results file's own Markdown (rendered from its JSON by the benchmark's renderer,
headings moved under the page's), opened by a line naming the file, the run, the commit (and
whether the tree had uncommitted changes), the machine, the dates and the load. A figure is never
copied by hand: a new run rewrites its file, and this script the page. Results files of an older
format are rendered as far as their renderer reads them; their commit line is built from the
fields they had (``commit``, ``git``, ``measured_at``, ``host``, ``load_average_*``).
"""

from __future__ import annotations

import argparse
import difflib
import json
import re
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final

from bench import provenance
from bench.harness import REPO_ROOT

DOC: Final = REPO_ROOT / "docs" / "benchmarks.md"
BEGIN: Final = re.compile(
    r"^<!-- generated from (bench/results/[\w.-]+\.json) by `python -m bench\.docs`: do not edit -->$", re.MULTILINE
)
END: Final = "<!-- end of generated block -->"


class DocsError(Exception):
    """The page's blocks cannot be generated (a block without its end, an unknown results file)."""


def _keyed(document: dict[str, Any]) -> str:
    from bench import report

    doc = dict(document)
    doc.setdefault("ratios", report.ratios(doc))
    doc.setdefault("targets", report.targets(doc))
    return report.markdown(doc)


def _nexmark(document: dict[str, Any]) -> str:
    from bench import nexmark_bench

    return nexmark_bench.render_markdown(document)


def _state(document: dict[str, Any]) -> str:
    from bench import state_report

    return state_report.markdown(document)


def _backpressure(document: dict[str, Any]) -> str:
    from bench import backpressure_bench

    return backpressure_bench.render_markdown(document)


def _recovery(document: dict[str, Any]) -> str:
    from bench import recovery_bench

    return recovery_bench.render_markdown(document)


def _json_codecs(document: dict[str, Any]) -> str:
    from bench import json_bench

    return json_bench.markdown(document)


def _jobtest(document: dict[str, Any]) -> str:
    from bench import jobtest_bench

    return jobtest_bench.markdown(document)


def _exchange(document: dict[str, Any]) -> str:
    """``make bench-exchange`` writes JSON only: its table is rendered here."""
    lines = [
        "# The data plane (`make bench-exchange`)",
        "",
        "| figure | records | seconds | records/s | what runs |",
        "| --- | ---: | ---: | ---: | --- |",
    ]
    for f in document.get("figures", []):
        lines.append(
            f"| {f['name']} | {f['records']:,} | {f['seconds']:.2f} | {f['records_per_s']:,.0f} | {f.get('note', '')} |"
        )
    ratios = document.get("ratios", {})
    if ratios:
        lines += ["", "| ratio | value |", "| --- | ---: |"]
        lines += [f"| {name.replace('_', ' ')} | {value:.3f} |" for name, value in ratios.items()]
    return "\n".join(lines) + "\n"


RENDERERS: Final[Mapping[str, Callable[[dict[str, Any]], str]]] = {
    "results.json": _keyed,
    "throughput.json": _keyed,
    "nexmark.json": _nexmark,
    "nexmark-sql.json": _nexmark,
    "state.json": _state,
    "backpressure.json": _backpressure,
    "recovery.json": _recovery,
    "json.json": _json_codecs,
    "exchange.json": _exchange,
    "jobtest.json": _jobtest,
}


def legacy_provenance(document: Mapping[str, Any]) -> dict[str, Any]:
    """A provenance block from the fields a results file of format 1 had (no tree state, no machine
    beyond the cores; what is absent stays absent)."""
    git = document.get("git")
    commit = git.get("commit") if isinstance(git, dict) else document.get("commit")
    dirty = git.get("dirty") if isinstance(git, dict) else None
    host = document.get("host") or {}
    loads_before = document.get("load_average_at_start")
    if isinstance(document.get("load_average"), str):  # bench-json wrote "a / b / c"
        loads_before = [float(x) for x in document["load_average"].split("/")]
    return {
        "results_format": 1,
        "commit_short": commit[:7] if commit else None,
        "dirty": dirty,
        "started_at": document.get("measured_at") or document.get("date") or "?",
        "ended_at": "?",
        "machine": {
            "cores": host.get("cpus", "?"),
            "cpu_model": host.get("cpu_model"),
            "memory_bytes": host.get("memory_bytes"),
            "kernel": host.get("platform", "?"),
            "python": host.get("python") or document.get("python", "?"),
            "java": None,
        },
        "load_average_before": loads_before,
        "load_average_after": document.get("load_average_at_end"),
    }


def source_line(relative: str, document: Mapping[str, Any]) -> str:
    """The line opening a block: which file, which run, which commit, where and when."""
    block = document.get("provenance")
    what = [f"run `{document['run_id']}`"] if document.get("run_id") else []
    if "quick" in document:
        what.append("quick run" if document["quick"] else "full run")
    if block:
        what.append(f"results format {block.get('results_format', '?')}")
        return f"**From `{relative}`** ({', '.join(what)}). " + provenance.markdown_line(block)
    what.append("results format 1, without a provenance block: commit and machine as far as the file recorded them")
    return f"**From `{relative}`** ({', '.join(what)}). " + provenance.markdown_line(legacy_provenance(document))


def demote(markdown: str) -> str:
    """The results file's Markdown under a page section: its title dropped, ``##`` to ``####``."""
    lines = markdown.strip("\n").splitlines()
    if lines and lines[0].startswith("# "):
        lines = lines[1:]
    out = [("##" + line) if re.match(r"^#{1,4} ", line) else line for line in lines]
    return "\n".join(out).strip("\n")


def without_provenance(markdown: str, document: Mapping[str, Any]) -> str:
    """The renderer's Markdown without its own provenance paragraph (``Run ... Commit ...``): the
    block's opening line (:func:`source_line`) says it."""
    lines = [provenance.markdown_line(document.get("provenance")), provenance.markdown_line(None)]
    return "\n".join(line for line in markdown.split("\n") if not any(own in line for own in lines))


def render_block(relative: str, repo: Path = REPO_ROOT) -> str:
    """The block's body for one results file (a missing or unreadable file says so)."""
    name = Path(relative).name
    renderer = RENDERERS.get(name)
    if renderer is None:
        raise DocsError(f"{relative}: no renderer for this results file (bench/docs.py RENDERERS)")
    path = repo / relative
    if not path.is_file():
        return f"`{relative}` is not there: run its benchmark to fill this block."
    document = json.loads(path.read_text())
    try:
        body = demote(without_provenance(renderer(document), document))
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        body = (
            f"`{relative}` is in a format the current renderer cannot read ({type(exc).__name__}: {exc}); "
            "rerun its benchmark."
        )
    return source_line(relative, document) + "\n\n" + body


def regenerate(text: str, repo: Path = REPO_ROOT) -> str:
    """The page with every generated block rendered anew from its results file."""
    out: list[str] = []
    position = 0
    for match in BEGIN.finditer(text):
        end = text.find(END, match.end())
        if end < 0:
            raise DocsError(f"the block for {match.group(1)} has no {END!r}")
        out.append(text[position : match.end()])
        out.append("\n" + render_block(match.group(1), repo) + "\n")
        position = end
    out.append(text[position:])
    return "".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.docs", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail (exit 1) when the page differs from the files")
    parser.add_argument("--doc", type=Path, default=DOC)
    parser.add_argument("--repo", type=Path, default=REPO_ROOT, help="where bench/results/ is")
    args = parser.parse_args(argv)
    current = args.doc.read_text()
    generated = regenerate(current, args.repo)
    if args.check:
        if generated != current:
            sys.stdout.writelines(
                difflib.unified_diff(
                    current.splitlines(keepends=True), generated.splitlines(keepends=True), str(args.doc), "generated"
                )
            )
            print(
                f"{args.doc} is not what {args.repo / 'bench' / 'results'} says: run python -m bench.docs",
                file=sys.stderr,
            )
            return 1
        return 0
    if generated != current:
        args.doc.write_text(generated)
        print(f"rewrote the generated blocks of {args.doc}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except DocsError as exc:
        print(f"bench.docs: error: {exc}", file=sys.stderr)
        sys.exit(1)
