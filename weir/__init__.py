"""Weir: a distributed stream processor on the model of Apache Flink."""

from importlib import metadata as _metadata

try:
    __version__ = _metadata.version("weir-streaming")  # one source: pyproject.toml's version, as installed
except _metadata.PackageNotFoundError:  # a source tree that was never installed (pip install .)
    __version__ = "0+unknown"
