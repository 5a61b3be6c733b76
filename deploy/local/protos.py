"""Generate the Python protobuf and gRPC stubs in ``shared/gen`` from ``protos/``.

The output is a pure function of the .proto files and the pinned grpcio-tools, so CI can
regenerate and fail when the committed stubs drift. Each proto area
(``protos/millpond/<area>``) is linked into the ``millpond`` namespace as
``src/millpond/<area>``, so the stubs import as ``millpond.<area>.v1``.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parents[2]
PROTOS = ROOT / "protos"
OUT = ROOT / "shared" / "gen"
NAMESPACE = ROOT / "src" / "millpond"


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
    # Regular packages below the namespace root (src/millpond has the handwritten __init__).
    for directory in (OUT / "millpond").rglob("*"):
        if directory.is_dir():
            (directory / "__init__.py").touch()
    for area in sorted(p for p in (OUT / "millpond").iterdir() if p.is_dir()):
        link = NAMESPACE / area.name
        if not link.is_symlink():
            link.symlink_to(Path("..", "..", area.relative_to(ROOT)))


if __name__ == "__main__":
    main()
