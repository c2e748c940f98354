"""A Docker daemon of our own, for CI machines that have no usable one.

Everything it creates lives under one temporary directory (data root, exec root, pid file,
socket, config) plus one network bridge named after that directory, so it never meets a
system daemon and tear-down removes exactly what it made.

Networking choice: dockerd runs with --iptables=false --ip-forward=false --ip-masq=false.
 - `docker build` runs with the host's network (network_mode="host"), so apt and pip in the
   builder stage reach the package registries without NAT rules.
 - The container under test runs on our own bridge and its port is published on 127.0.0.1
   by docker's userland proxy (docker-proxy), which needs neither iptables nor forwarding:
   the host reaches the bridge subnet directly.
So no firewall rule or kernel setting of the machine changes; tear-down still checks for
Docker's iptables chains and removes any that appeared while it ran.
"""

import ipaddress
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import docker

STORAGE_DRIVERS = ("overlay2", "vfs")  # overlay2 is fast; vfs works on any filesystem
START_TIMEOUT_S = 60
STOP_TIMEOUT_S = 30
DOCKER_CHAINS = ("DOCKER", "DOCKER-USER", "DOCKER-ISOLATION-STAGE-1", "DOCKER-ISOLATION-STAGE-2")
# Candidate subnets for our bridge; the first that overlaps no existing route is taken.
BRIDGE_SUBNETS = ("172.29.251.0/24", "172.29.252.0/24", "10.213.47.0/24", "192.168.213.0/24")


class DockerdError(RuntimeError):
    pass


def ensure_installed():
    """Install Debian's docker.io (and debootstrap) when missing, without starting any service."""
    missing = [pkg for pkg, tool in (("docker.io", "dockerd"), ("debootstrap", "debootstrap"),
                                      ("iproute2", "ip"), ("iptables", "iptables"))
               if shutil.which(tool) is None]
    if not missing:
        return
    print(f"    installing {' '.join(missing)} with apt-get", flush=True)
    # Without a policy-rc.d denying it, the package's init script would start a system dockerd.
    policy = Path("/usr/sbin/policy-rc.d")
    made_policy = not policy.exists()
    if made_policy:
        policy.write_text("#!/bin/sh\nexit 101\n")
        policy.chmod(0o755)
    try:
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        _run(["apt-get", "update", "-qq"], env=env)
        _run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing], env=env)
    finally:
        if made_policy:
            policy.unlink()
    if shutil.which("dockerd") is None or shutil.which("docker-proxy") is None:
        raise DockerdError("docker.io was installed but dockerd or docker-proxy is still not on PATH")


class PrivateDockerd:
    """Start with start(); always call stop() (it is safe after a failed or partial start)."""

    def __init__(self, root: Path):
        self.root = root
        self.socket = root / "docker.sock"
        self.bridge = "dbvt-" + root.name[-8:]  # interface names have at most 15 characters
        self.storage_driver = None
        self.log_path = None
        self._process = None
        self._bridge_made = False
        self._chains_before = _docker_chains()

    @property
    def url(self) -> str:
        return f"unix://{self.socket}"

    def start(self) -> docker.DockerClient:
        self._make_bridge()
        (self.root / "daemon.json").write_text("{}")  # never read /etc/docker/daemon.json
        failures = []
        for driver in STORAGE_DRIVERS:
            self.log_path = self.root / f"dockerd-{driver}.log"
            self._launch(driver)
            reason = self._wait_ready()
            if reason is None:
                self.storage_driver = driver
                return docker.DockerClient(base_url=self.url, timeout=600)
            failures.append(f"storage driver {driver}: {reason}\n{_tail(self.log_path, 15)}")
            self._stop_process()
            self._kill_leftovers()
            self._unmount_all()
        raise DockerdError("dockerd could not start:\n" + "\n".join(failures))

    def _make_bridge(self):
        subnet = _free_subnet()
        gateway = next(subnet.hosts())
        _run(["ip", "link", "add", self.bridge, "type", "bridge"])
        self._bridge_made = True
        _run(["ip", "addr", "add", f"{gateway}/{subnet.prefixlen}", "dev", self.bridge])
        _run(["ip", "link", "set", self.bridge, "up"])

    def _launch(self, driver: str):
        exec_root = self.root / "exec"
        data_root = self.root / "data"
        for path in (exec_root, data_root):  # a failed attempt with another driver may have left them
            shutil.rmtree(path, ignore_errors=True)
            path.mkdir(exist_ok=True)
        command = [
            "dockerd",
            "--config-file", str(self.root / "daemon.json"),
            "--data-root", str(data_root),
            "--exec-root", str(exec_root),
            "--pidfile", str(self.root / "dockerd.pid"),
            "--host", self.url,
            "--storage-driver", driver,
            "--bridge", self.bridge,
            "--iptables=false", "--ip-forward=false", "--ip-masq=false",
            "--userland-proxy=true",
        ]
        with open(self.log_path, "wb") as log:
            self._process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                             stdin=subprocess.DEVNULL, start_new_session=True)

    def _wait_ready(self):
        """None once the daemon answers on its socket, else why not."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                return f"dockerd exited with status {self._process.returncode}"
            if self.socket.exists():
                try:
                    # The client asks the daemon for its API version as it is made: that is the ping.
                    docker.DockerClient(base_url=self.url, timeout=5).close()
                    return None
                except docker.errors.DockerException:
                    pass
            time.sleep(0.5)
        return f"no answer on {self.socket} within {START_TIMEOUT_S} s"

    def stop(self):
        """Stop the daemon by its PID and remove everything it made; collect, don't raise, problems."""
        problems = []
        for action in (self._stop_process, self._kill_leftovers, self._unmount_all,
                       self._remove_bridge, self._remove_new_chains):
            try:
                action()
            except (OSError, subprocess.SubprocessError, DockerdError) as error:
                problems.append(f"{action.__name__}: {error}")
        shutil.rmtree(self.root, ignore_errors=True)
        if self.root.exists():
            problems.append(f"could not remove {self.root}")
        return problems

    def _stop_process(self):
        if self._process is None or self._process.poll() is not None:
            return
        self._process.send_signal(signal.SIGTERM)
        try:
            self._process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait(10)

    def _kill_leftovers(self):
        """containerd and shims started for us carry our root in their command line."""
        marker = str(self.root).encode()
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit() or int(proc.name) == os.getpid():
                continue
            try:
                if marker in (proc / "cmdline").read_bytes():
                    os.kill(int(proc.name), signal.SIGKILL)
            except (FileNotFoundError, ProcessLookupError, PermissionError):
                pass

    def _unmount_all(self):
        prefix = str(self.root) + "/"
        with open("/proc/self/mountinfo") as mounts:
            points = [line.split()[4] for line in mounts if line.split()[4].startswith(prefix)]
        for point in sorted(points, key=len, reverse=True):
            subprocess.run(["umount", "-l", point], check=False, capture_output=True)

    def _remove_bridge(self):
        if self._bridge_made:
            _run(["ip", "link", "delete", self.bridge])
            self._bridge_made = False

    def _remove_new_chains(self):
        new_chains = _docker_chains() - self._chains_before
        for table in {table for table, _ in new_chains}:
            for rule in _run(["iptables", "-t", table, "-S"]).splitlines():
                words = rule.split()
                jumps_to_new = any(words[i] == "-j" and (table, words[i + 1]) in new_chains
                                   for i in range(len(words) - 1))
                if words[0] == "-A" and jumps_to_new:
                    _run(["iptables", "-t", table, "-D", *words[1:]])
        for table, chain in new_chains:
            _run(["iptables", "-t", table, "-F", chain])
        for table, chain in new_chains:
            _run(["iptables", "-t", table, "-X", chain])


def _docker_chains():
    if shutil.which("iptables") is None:
        return set()
    found = set()
    for table in ("filter", "nat"):
        result = subprocess.run(["iptables", "-t", table, "-S"], capture_output=True, text=True)
        for line in result.stdout.splitlines():
            parts = line.split()
            if len(parts) >= 2 and parts[0] == "-N" and parts[1] in DOCKER_CHAINS:
                found.add((table, parts[1]))
    return found


def _free_subnet():
    routes = json.loads(_run(["ip", "-j", "route", "show", "table", "all"]) or "[]")
    taken = []
    for route in routes:
        dst = route.get("dst", "")
        if dst and dst != "default":
            try:
                taken.append(ipaddress.ip_network(dst, strict=False))
            except ValueError:
                pass
    for candidate in map(ipaddress.ip_network, BRIDGE_SUBNETS):
        if not any(candidate.version == net.version and candidate.overlaps(net) for net in taken):
            return candidate
    raise DockerdError(f"every candidate bridge subnet {BRIDGE_SUBNETS} overlaps a route of this machine")


def _run(command, env=None):
    result = subprocess.run(command, capture_output=True, text=True, env=env)
    if result.returncode != 0:
        raise DockerdError(f"{' '.join(command)} failed ({result.returncode}): {result.stderr.strip()[-2000:]}")
    return result.stdout


def _tail(path: Path, lines: int) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
