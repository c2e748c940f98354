#!/usr/bin/env python3
"""Generate the Python modules of `proto/dbvt_proto/v1/*.proto` into `client/dbvt_proto/`.

The output is committed, so the client installs without grpcio-tools; the generator versions are
pinned because their output differs between versions, and tests/test_proto_drift.py regenerates into
a temporary directory and fails if anything differs from the committed files.

    python proto/generate.py            # rewrite client/dbvt_proto
    python proto/generate.py --out DIR  # write DIR/dbvt_proto instead
"""
from __future__ import annotations

import argparse
import importlib.metadata
import pathlib
import shutil
import subprocess
import sys

PINNED = {"grpcio-tools": "1.85.1", "mypy-protobuf": "5.1.0"}
PROTO_ROOT = pathlib.Path(__file__).resolve().parent
REPO = PROTO_ROOT.parent
PACKAGE = "dbvt_proto"
PACKAGE_DOC = '"""Generated from proto/ by proto/generate.py; do not edit."""\n'


def check_versions() -> None:
    for dist, wanted in PINNED.items():
        try:
            found = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            found = None
        if found != wanted:
            sys.exit(f"generate.py needs {dist}=={wanted} (found {found}): pip install {dist}=={wanted}")


def plugin(name: str) -> str:
    """A mypy-protobuf plugin (they write the .pyi stubs), installed beside this interpreter."""
    beside = pathlib.Path(sys.executable).parent / name
    found = str(beside) if beside.exists() else shutil.which(name)
    if not found:
        sys.exit(f"{name} not found: pip install mypy-protobuf==" + PINNED["mypy-protobuf"])
    return found


def generate(out: pathlib.Path) -> None:
    check_versions()
    target = out / PACKAGE
    if target.exists():
        shutil.rmtree(target)
    protos = sorted(p.relative_to(PROTO_ROOT).as_posix() for p in (PROTO_ROOT / PACKAGE).rglob("*.proto"))
    out.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable, "-m", "grpc_tools.protoc",
        f"--proto_path={PROTO_ROOT}",
        f"--plugin=protoc-gen-mypy={plugin('protoc-gen-mypy')}",
        f"--plugin=protoc-gen-mypy_grpc={plugin('protoc-gen-mypy_grpc')}",
        f"--python_out={out}", f"--grpc_python_out={out}",
        f"--mypy_out={out}", f"--mypy_grpc_out={out}",
        *protos,
    ]
    subprocess.run(command, check=True, cwd=PROTO_ROOT)
    # protoc writes modules only; the packages around them, and the PEP 561 marker, are ours.
    for directory in [target, *(p for p in target.rglob("*") if p.is_dir())]:
        (directory / "__init__.py").write_text(PACKAGE_DOC)
    (target / "py.typed").write_text("")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=pathlib.Path, default=REPO / "client", help="directory to write dbvt_proto/ into")
    generate(parser.parse_args().out.resolve())


if __name__ == "__main__":
    main()
