"""The committed generated modules are exactly what proto/generate.py makes from proto/, and the proto
keeps the house rules (one Request and one Response per RPC, enums starting at *_UNSPECIFIED = 0)."""
from __future__ import annotations

import filecmp
import pathlib
import subprocess
import sys

from dbvt_proto.v1 import broadphase_pb2 as pb

REPO = pathlib.Path(__file__).resolve().parent.parent
COMMITTED = REPO / "client" / "dbvt_proto"


def _files(root: pathlib.Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts}


def test_generated_code_matches_the_proto(tmp_path):
    subprocess.run([sys.executable, str(REPO / "proto" / "generate.py"), "--out", str(tmp_path)], check=True,
                   capture_output=True, text=True)
    fresh = tmp_path / "dbvt_proto"
    assert _files(fresh) == _files(COMMITTED), "generated files added or missing: run proto/generate.py"
    differing = [name for name in sorted(_files(fresh))
                 if not filecmp.cmp(fresh / name, COMMITTED / name, shallow=False)]
    assert not differing, f"{differing} drifted from proto/: run proto/generate.py and commit the result"


def test_every_rpc_has_its_own_request_and_response():
    service = pb.DESCRIPTOR.services_by_name["BroadphaseService"]
    assert service.full_name == "dbvt.v1.BroadphaseService"
    inputs, outputs = [], []
    for method in service.methods:
        assert method.input_type.name == method.name + "Request"
        assert method.output_type.name == method.name + "Response"
        inputs.append(method.input_type.name)
        outputs.append(method.output_type.name)
    assert len(set(inputs + outputs)) == 2 * len(service.methods)


def test_enums_start_unspecified():
    for enum in pb.DESCRIPTOR.enum_types_by_name.values():
        first = enum.values_by_number[0]
        assert first.name.endswith("_UNSPECIFIED"), enum.name
