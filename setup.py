"""The build hook only: everything else about the package is in pyproject.toml.

``build_py`` generates the gRPC code from ``proto/`` first (``build_hooks.py``), so a wheel, an sdist's
wheel and an editable install all carry ``weir/wire/*_pb2*``.
"""

import sys
from pathlib import Path

from setuptools import setup

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the build backend runs this file without its folder

from build_hooks import BuildPyWithProtos  # noqa: E402

setup(cmdclass={"build_py": BuildPyWithProtos})
