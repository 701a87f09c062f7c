"""Compile protos/*.proto into descriptor sets under src/plugproxy/descriptors/.

Why descriptor sets and not *_pb2 modules: csi.v1's csi_secret and cmi.v1's cmi_secret both
extend google.protobuf.FieldOptions with number 1059, so the two specs cannot live in
protobuf's one default pool. plugproxy loads each set into a pool of its own at startup.

Usage: python tools/gen_descriptors.py [--check]
  --check  exit 1 if the committed sets differ from what protos/ compiles to.
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import tempfile

from grpc_tools import protoc

ROOT = pathlib.Path(__file__).resolve().parent.parent
PROTOS = ROOT / "protos"
OUT = ROOT / "src" / "plugproxy" / "descriptors"


def compile_one(proto: pathlib.Path, out: pathlib.Path) -> None:
    include = pathlib.Path(protoc.__file__).parent / "_proto"
    args = [
        "protoc",
        f"-I{PROTOS}",
        f"-I{include}",
        "--include_imports",
        f"--descriptor_set_out={out}",
        str(proto),
    ]
    if protoc.main(args) != 0:
        raise SystemExit(f"protoc failed on {proto}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true")
    ns = parser.parse_args()
    stale = []
    with tempfile.TemporaryDirectory() as tmp:
        for proto in sorted(PROTOS.glob("*.proto")):
            fresh = pathlib.Path(tmp) / f"{proto.stem}.binpb"
            compile_one(proto, fresh)
            target = OUT / fresh.name
            if ns.check:
                if not target.exists() or target.read_bytes() != fresh.read_bytes():
                    stale.append(target.name)
            else:
                target.write_bytes(fresh.read_bytes())
    if stale:
        print(f"stale descriptor sets: {', '.join(stale)}; run: python tools/gen_descriptors.py")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
