"""The JobManager's environment in Flink's ``EnvironmentInfo`` (``GET /jobmanager/environment`` and a
job's ``GET /jobs/{id}/jobmanager/environment``): Flink's ``jvm`` block describes the process's
runtime, here the Python interpreter's, and ``classpath`` where the runtime finds its code, here the
module search path.

- ``jvm.version``: the interpreter's implementation and version (``CPython 3.12.3``), as Flink's names
  its JVM and its version;
- ``jvm.arch``: the machine the interpreter runs on (``platform.machine()``, e.g. ``x86_64``; Java's
  ``os.arch`` would say ``amd64`` for the same);
- ``jvm.options``: the interpreter's own options from its command line (``-X dev``, ``-u``, ``-W
  error``...), what comes before ``-m module`` or the script, as Flink's lists the JVM's startup
  options and not the program's arguments;
- ``classpath``: ``sys.path``, in order.

No field is a constant: each is read from the running process when asked."""

from __future__ import annotations

import platform
import sys
from collections.abc import Sequence
from typing import Final

from weir.jobmanager.rest.views import Model

_OPTIONS_WITH_VALUE: Final = frozenset({"-X", "-W", "--check-hash-based-pycs"})
_PROGRAM_STARTS: Final = frozenset({"-m", "-c", "-"})


class RuntimeInfo(Model):
    """Flink's ``EnvironmentInfo.JVMInfo``, of the Python interpreter."""

    version: str
    arch: str
    options: list[str]


class EnvironmentInfo(Model):
    """Flink's ``EnvironmentInfo``."""

    jvm: RuntimeInfo
    classpath: list[str]


def interpreter_options(argv: Sequence[str]) -> list[str]:
    """The interpreter's options in its command line (``sys.orig_argv``): every argument after the
    executable up to the program (``-m``, ``-c``, ``-`` or a script path), an option's value with it."""
    options: list[str] = []
    rest = list(argv[1:])
    while rest:
        arg = rest.pop(0)
        if arg in _PROGRAM_STARTS or not arg.startswith("-"):
            break
        options.append(arg)
        if arg in _OPTIONS_WITH_VALUE and rest:
            options.append(rest.pop(0))
    return options


def environment_info() -> EnvironmentInfo:
    return EnvironmentInfo(
        jvm=RuntimeInfo(
            version=f"{platform.python_implementation()} {platform.python_version()}",
            arch=platform.machine(),
            options=interpreter_options(sys.orig_argv),
        ),
        classpath=list(sys.path),
    )
