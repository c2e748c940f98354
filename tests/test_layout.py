"""The distributions' boundaries: the SDK stands alone, and imports run one way (dbvt_server -> dbvt, dbvt_client).

The SDK must install without a compiler and without the server's dependencies, so no module of
`dbvt_client` may import `dbvt` or `dbvt_server` when it is imported; only `Client.local()` reaches
for the server, and says how to install it when it is missing.
"""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

SDK = Path(__file__).resolve().parents[1] / "client" / "dbvt_client"
SERVER_SIDE = ("dbvt", "dbvt_server")


def _top_level_imports(path: Path) -> list[str]:
    """Modules imported by statements that run when `path` is imported (not those inside functions)."""
    names = []
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.append(node.module)
    return names


@pytest.mark.parametrize("module", sorted(SDK.glob("*.py")), ids=lambda p: p.name)
def test_no_sdk_module_imports_the_server_side_at_import_time(module):
    forbidden = [name for name in _top_level_imports(module) if name.split(".")[0] in SERVER_SIDE]
    assert not forbidden, f"{module.name} imports {forbidden} at import time"


# Run in a child whose import system refuses dbvt and dbvt_server, as on a machine with only dbvt-client.
WITHOUT_SERVER = """
import asyncio, sys

class Refuse:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("dbvt", "dbvt_server"):
            raise ModuleNotFoundError(f"No module named {name!r}")

sys.meta_path.insert(0, Refuse())
import dbvt_client
for local in (dbvt_client.Client.local, dbvt_client.AsyncClient.local):
    try:
        local()
    except ImportError as exc:
        print("ImportError:", exc)
print("loaded:", sorted(name for name in sys.modules if name.split(".")[0] in ("dbvt", "dbvt_server")))
"""


def test_sdk_imports_alone_and_local_asks_for_the_server():
    shown = subprocess.run([sys.executable, "-c", WITHOUT_SERVER], capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert len([line for line in lines if line.startswith("ImportError:") and "pip install dbvt-server" in line]) == 2
    assert lines[-1] == "loaded: []"
