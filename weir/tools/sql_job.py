"""A SQL script as a job: the job file ``weir sql`` submits for it, and what ``weir test SCRIPT.sql``
needs besides (the tables whose sources take input, by name and by uid).

The job file is the one way a script becomes a job: ``build(env)`` calls ``weir.sql.sql(env,
SCRIPT)``, so ``weir sql`` (which submits it), ``weir test`` (which runs it in this process, loading
it again at every failure as a new process would) and a Python job that calls ``sql()`` itself run
the same operators with the same uids. This module imports no SQL parser at import time (``weir
--help`` imports it): :func:`script_sources` imports ``weir.sql`` when it runs."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from weir.core.errors import CommandLineError, JobDefinitionError


def sql_job_source(script: str, functions_module: str | None = None) -> str:
    """The job file ``weir sql`` submits: the script, run by ``weir.sql.sql`` in ``build(env)``; with
    ``functions_module`` (``--functions FILE.py``, shipped beside it), the functions defined in it."""
    if functions_module is None:
        return (
            '"""A streaming SQL job (weir sql): the script below, compiled to job API calls by weir.sql."""\n\n'
            "from weir.sql import sql\n\n"
            f"SCRIPT = {script!r}\n\n\n"
            "def build(env):\n"
            "    sql(env, SCRIPT)\n"
        )
    return (
        '"""A streaming SQL job (weir sql): the script below, compiled to job API calls by weir.sql."""\n\n'
        f"import {functions_module}\n"
        "from weir.sql import sql\n"
        "from weir.sql.functions import defined_in\n\n"
        f"SCRIPT = {script!r}\n\n\n"
        "def build(env):\n"
        f"    sql(env, SCRIPT, functions=defined_in({functions_module}))\n"
    )


def read_script(path: Path) -> str:
    """A SQL file's text; one line naming the file when it cannot be read."""
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        message = "does not exist" if not path.exists() else f"cannot be read: {exc.strerror}"
        raise JobDefinitionError(f"SQL file {path} {message}") from exc


def job_file_name(name: str) -> str:
    """The job file's name for a job called ``name`` (a script's stem, or its ``pipeline.name``)."""
    return f"{''.join(c if c.isalnum() else '_' for c in name)}.py"


@dataclass(frozen=True)
class ScriptSources:
    """The tables of a script, and of those the ones its INSERTs read, each with the uid of its source
    operator (``sql-source-<table>``): what ``weir test SCRIPT.sql --source NAME=FILE`` names."""

    script: str
    """The script's file, for messages."""
    tables: tuple[str, ...]
    read: Mapping[str, str]
    """Table -> its source's uid, for each table an INSERT reads."""
    keyed: frozenset[str] = frozenset()
    """The tables read whose records need a key ('upsert-kafka'): a file of values cannot feed them."""

    def uid_of(self, name: str) -> str:
        """The source uid ``--source NAME=...`` means: a table read by the script, by its name or by
        its source's uid; anything else is one line saying what the script reads."""
        table = next((t for t, uid in self.read.items() if name in (t, uid)), None)
        if table in self.keyed:
            raise CommandLineError(
                f"--source {name}: table {table} of {self.script} is an 'upsert-kafka' table, whose records need "
                "their key (the primary key): weir test feeds record values only"
            )
        if table is not None:
            return self.read[table]
        readable = ", ".join(f"{table} ({uid})" for table, uid in self.read.items()) or "none"
        if name in self.tables:
            raise CommandLineError(
                f"--source {name}: table {name} of {self.script} is not read by its INSERTs, so it takes no input "
                f"(the tables it reads: {readable})"
            )
        raise CommandLineError(f"--source {name}: {self.script} has no table {name} (the tables it reads: {readable})")


def script_sources(script: str, script_name: str, functions: Mapping[str, Any] | None = None) -> ScriptSources:
    """Plan the script (a construct Weir does not run is refused here, one line with its
    ``line:column``) and name the tables its INSERTs read. ``functions``: the Python functions it
    calls by name (``--functions FILE.py``)."""
    from weir.sql import operators_of, plan_script, source_uid
    from weir.sql.catalog import KafkaTable
    from weir.sql.functions import registered

    planned = plan_script(script, functions)
    with registered(planned.functions):  # compiling a call of a Python function looks it up
        operators = [op for statement in planned.inserts for op in operators_of(statement, script)]
    uids = {op.uid for op in operators if op.kind == "source"}
    read = {table: source_uid(table) for table in planned.tables if source_uid(table) in uids}
    keyed = frozenset(t for t in read if isinstance(c := planned.tables[t].connector, KafkaTable) and c.upsert)
    return ScriptSources(script_name, tuple(planned.tables), read, keyed)


__all__ = ["ScriptSources", "job_file_name", "read_script", "script_sources", "sql_job_source"]
