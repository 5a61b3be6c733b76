"""Generate the Python protobuf and gRPC stubs in ``shared/gen`` from ``protos/``.

The output is a pure function of the .proto files and the pinned grpcio-tools, so CI can
regenerate and fail when the committed stubs drift.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
PROTOS = ROOT / "protos"
OUT = ROOT / "shared" / "gen"


def main() -> None:
    """Regenerate every stub from scratch."""
    shutil.rmtree(OUT / "millpond", ignore_errors=True)
    OUT.mkdir(parents=True, exist_ok=True)
    files = sorted(str(p.relative_to(PROTOS)) for p in PROTOS.rglob("*.proto"))
    include = Path(protoc.__file__).parent / "_proto"
    code = protoc.main([
        "grpc_tools.protoc",
        f"-I{PROTOS}",
        f"-I{include}",
        f"--python_out={OUT}",
        f"--pyi_out={OUT}",
        f"--grpc_python_out={OUT}",
        *files,
    ])
    if code != 0:
        sys.exit(code)
    # Regular packages, so setuptools' find maps `millpond.*` to shared/gen.
    for directory in [OUT / "millpond", *(OUT / "millpond").rglob("*")]:
        if directory.is_dir():
            (directory / "__init__.py").touch()


if __name__ == "__main__":
    main()
