"""Weir's one gRPC code generator: ``proto/weir/wire/*.proto`` -> ``weir/wire/*_pb2*.py`` and ``.pyi``.

Called by the build backend (``setup.py`` hooks it into ``build_py``, so ``pip install .``, ``pip
install -e .`` and ``python -m build`` generate the code from the source tree) and by ``make proto``
(``python build_hooks.py``). The generated files are written beside the ``.proto`` package in the
source tree, never committed, and regenerated when a ``.proto`` is newer than its output.
"""

from __future__ import annotations

import sys
from pathlib import Path

from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
PROTO_ROOT = "proto"
WIRE_PACKAGE = Path("weir") / "wire"
SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")


def _outputs(root: Path, proto: Path) -> list[Path]:
    return [root / WIRE_PACKAGE / f"{proto.stem}{suffix}" for suffix in SUFFIXES]


def generate(root: Path = ROOT, *, force: bool = False) -> list[Path]:
    """Compile every stale ``.proto`` under ``root/proto/weir/wire`` into ``root/weir/wire``; answer the
    files written. ``grpc_tools`` (the ``grpcio-tools`` package) must be importable."""
    protos = sorted((root / PROTO_ROOT / WIRE_PACKAGE).glob("*.proto"))
    if not protos:
        raise RuntimeError(f"no .proto files under {root / PROTO_ROOT / WIRE_PACKAGE}")
    stale = [
        p
        for p in protos
        if force or any(not out.exists() or out.stat().st_mtime < p.stat().st_mtime for out in _outputs(root, p))
    ]
    if not stale:
        return []
    from grpc_tools import protoc  # build-time only: grpcio-tools is in build-system.requires and the dev extra

    include = str(Path(protoc.__file__).parent / "_proto")  # google/protobuf/*.proto shipped with grpc_tools
    args = [
        "grpc_tools.protoc",
        f"-I{root / PROTO_ROOT}",
        f"-I{include}",
        f"--python_out={root}",
        f"--grpc_python_out={root}",
        f"--pyi_out={root}",
        *(str(p) for p in stale),
    ]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed on {', '.join(p.name for p in stale)}")
    return [out for p in stale for out in _outputs(root, p)]


class BuildPyWithProtos(build_py):
    """``build_py`` that first generates the gRPC code into the source tree, so that the regular copy
    puts it in the wheel and an editable install finds it where it imports from."""

    def run(self) -> None:
        for written in generate(ROOT):
            self.announce(f"generated {written.relative_to(ROOT)}", level=2)
        super().run()


if __name__ == "__main__":
    for path in generate(ROOT, force="--force" in sys.argv[1:]):
        print(f"generated {path.relative_to(ROOT)}")
