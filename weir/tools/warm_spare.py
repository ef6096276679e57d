"""A warm spare of a supervised process: ``python -m weir.tools.warm_spare MODULE`` imports what
``python -m MODULE`` would import, then waits on its standard input for one line, ``{"argv": [...]}``,
and runs MODULE as ``__main__`` with those arguments.

A restarted JobManager spent most of its start-up importing (gRPC, FastAPI, boto3, pydantic: 1.5 s of
CPU, 4 s and more of wall time on a busy machine) before it could take its jobs over; a spare has done
that while nothing was wrong, so the supervisor (``weir.tools.supervisor``) hands it the dead child's
command line and the process only has to run ``main()``. Flink keeps standby JobManagers for the same
reason (high availability with a leader election); here one machine's supervisor plays that part.

The spare binds no port and opens no file before the line comes; at the end of its input (the
supervisor went away) it exits.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import runpy
import sys


def main_module(module: str) -> str:
    """The module ``python -m MODULE`` executes: ``MODULE.__main__`` for a package."""
    spec = importlib.util.find_spec(module)
    if spec is None:
        raise SystemExit(f"warm spare: no module named {module!r}")
    return f"{module}.__main__" if spec.submodule_search_locations is not None else module


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print('usage: python -m weir.tools.warm_spare MODULE  (then one line on stdin: {"argv": [...]})')
        return 2
    module = args[0]
    importlib.import_module(main_module(module))  # its `if __name__ == "__main__"` does not run here
    line = sys.stdin.readline()
    if not line:
        return 0  # the supervisor went away before it needed this spare
    child_args = json.loads(line)["argv"]
    sys.argv = [sys.argv[0], *child_args]
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)  # as a child started cold: stdin is /dev/null
    runpy.run_module(module, run_name="__main__", alter_sys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
