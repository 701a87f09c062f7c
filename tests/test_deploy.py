"""The Kubernetes manifests in deploy/: valid objects, settings the CLI accepts, sockets,
ports and paths that line up between containers, and a locked-down proxy container that
reaches its plugin the way `plugproxy inject` makes it: as the plugin's user, the plugin
started as its image says.

Everything runs offline: kubernetes-validate bundles the API schemas.
"""

from __future__ import annotations

import argparse
import copy
import ipaddress
import pathlib
import posixpath
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import kubernetes_validate
import pytest
import trustme
import yaml

from plugproxy.cli import inject, preparedir, serve
from plugproxy.cli import main as cli
from plugproxy.core import options
from plugproxy.core.endpoints import Scheme, parse_endpoint

ROOT = pathlib.Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
# Kubernetes version the manifests must be valid for (oldest supported release we target).
K8S_VERSION = "1.30"
# Prometheus rule groups are a CRD kind and belong to the observability set, not here; their
# promtool unit tests are not a Kubernetes document at all (tests/test_deploy_alerts.py).
NOT_WORKLOADS = {"prometheus-alerts.yaml", "prometheus-alerts.test.yaml"}
EXPECTED = {
    "csi-node.yaml",
    "csi-controller.yaml",
    "csi-node-remote.yaml",
    "cosi-provisioner.yaml",
    "cmi-plugin.yaml",
    "kms-plugin.yaml",
    "device-plugin.yaml",
}
# How the other containers name a plugin endpoint: CSI sidecar flags, the specs' env vars,
# and the flag KMS plugins commonly listen by.
ENDPOINT_FLAGS = ("--csi-address", "--endpoint", "--listen-addr")
ENDPOINT_ENV = ("CSI_ENDPOINT", "COSI_ENDPOINT", "CMI_ENDPOINT")
ARG_VAR = re.compile(r"\$\((\w+)\)")
SHELL_VAR = re.compile(r"\$\{?(\w+)\}?")


def manifest_files() -> list[pathlib.Path]:
    return sorted(p for p in DEPLOY.glob("*.yaml") if p.name not in NOT_WORKLOADS)


def load(path: pathlib.Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")) if doc]


@dataclass
class Workload:
    file: str
    name: str
    pod: dict[str, Any]
    annotations: dict[str, str]

    @property
    def containers(self) -> list[dict[str, Any]]:
        return list(self.pod["containers"])

    @property
    def proxy(self) -> dict[str, Any]:
        found = [c for c in self.containers if is_proxy(c)]
        assert len(found) == 1, f"{self.file}: expected one plugproxy container"
        return found[0]

    def volume(self, name: str) -> dict[str, Any]:
        return next(v for v in self.pod["volumes"] if v["name"] == name)


def is_proxy(container: dict[str, Any]) -> bool:
    return "/plugproxy:" in container["image"] and container.get("args", ["serve"])[:1] == ["serve"]


def workloads() -> Iterator[Workload]:
    for path in manifest_files():
        for doc in load(path):
            if doc["kind"] in ("Deployment", "DaemonSet", "StatefulSet"):
                template = doc["spec"]["template"]
                yield Workload(
                    path.name,
                    doc["metadata"]["name"],
                    template["spec"],
                    template["metadata"].get("annotations", {}),
                )
            elif doc["kind"] == "Pod":  # a static pod (kubelet runs it from a file)
                yield Workload(
                    path.name,
                    doc["metadata"]["name"],
                    doc["spec"],
                    doc["metadata"].get("annotations", {}),
                )


WORKLOADS = list(workloads())
WORKLOAD_IDS = [w.file for w in WORKLOADS]


def env_of(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: str(e["value"]) for e in container.get("env", []) if "value" in e}


def proxy_env(w: Workload) -> dict[str, str]:
    return {k: v for k, v in env_of(w.proxy).items() if k.startswith(options.ENV_PREFIX)}


def command_words(container: dict[str, Any]) -> list[str]:
    """Command and args with $(VAR) expanded as kubelet does, and shell $VAR in `sh -c`."""
    env = env_of(container)
    words = []
    for raw in [*container.get("command", []), *container.get("args", [])]:
        word = ARG_VAR.sub(lambda m: env.get(m[1], m[0]), raw)
        if container.get("command", [])[:2] == ["/bin/sh", "-c"]:
            words += SHELL_VAR.sub(lambda m: env.get(m[1], m[0]), word).replace('"', "").split()
        else:
            words.append(word)
    return words


def endpoints_named(container: dict[str, Any]) -> list[str]:
    """The plugin addresses a non-proxy container is configured with."""
    found = [v for k, v in env_of(container).items() if k in ENDPOINT_ENV]
    for word in command_words(container):
        flag, sep, value = word.partition("=")
        if sep and flag in ENDPOINT_FLAGS:
            found.append(value)
    return sorted(set(found))


def location(container: dict[str, Any], address: str) -> tuple[str, str]:
    """(volume name, path inside it) of a UNIX socket address as seen in `container`."""
    path = parse_endpoint(address).path
    best: tuple[str, str] | None = None
    best_len = -1
    for mount in container.get("volumeMounts", []):
        base = mount["mountPath"].rstrip("/")
        if (path == base or path.startswith(base + "/")) and len(base) > best_len:
            assert "subPath" not in mount, f"{container['name']}: socket under a subPath mount"
            best, best_len = (mount["name"], posixpath.relpath(path, base)), len(base)
    assert best is not None, f"{container['name']}: {address} is on no mounted volume"
    return best


def mounters(w: Workload, volume: str) -> set[str]:
    return {
        c["name"]
        for c in w.containers
        if any(m["name"] == volume for m in c.get("volumeMounts", []))
    }


# ------------------------------------------------------------------------------ structure


def test_every_deployment_shape_is_shipped() -> None:
    assert {p.name for p in manifest_files()} >= EXPECTED
    assert {w.file for w in WORKLOADS} >= EXPECTED


@pytest.mark.parametrize("path", manifest_files(), ids=lambda p: p.name)
def test_manifest_is_commented_and_validates_against_the_kubernetes_schema(
    path: pathlib.Path,
) -> None:
    text = path.read_text(encoding="utf-8")
    assert text.startswith("#"), f"{path.name}: open with a comment saying what it deploys"
    docs = load(path)
    assert docs
    for doc in docs:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_schema_validation_catches_a_misspelt_field() -> None:
    doc = copy.deepcopy(load(DEPLOY / "csi-node.yaml")[0])
    doc["spec"]["template"]["spec"]["containers"][0]["securityContex"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


# ------------------------------------------------------------------------------ settings


@pytest.mark.parametrize("w", WORKLOADS, ids=WORKLOAD_IDS)
def test_proxy_is_configured_only_by_known_environment_variables(w: Workload) -> None:
    known = {opt.env for opt in serve.all_options()}
    assert w.proxy.get("args") == ["serve"], "settings go in PLUGPROXY_* variables, not flags"
    assert "command" not in w.proxy, "keep the image's entrypoint"
    names = [e["name"] for e in w.proxy["env"]]
    assert len(names) == len(set(names)), "a variable is set twice"
    unknown = sorted(n for n in names if n.startswith(options.ENV_PREFIX) and n not in known)
    assert not unknown, f"not options of `plugproxy serve`: {unknown}"
    for container in w.containers:
        if not is_proxy(container):
            stray = [k for k in env_of(container) if k.startswith(options.ENV_PREFIX)]
            assert not stray, f"{container['name']} sets {stray}"


def materialize_tls_files(env: dict[str, str], tmp: pathlib.Path) -> dict[str, str]:
    """Point the TLS paths at real files under tmp: only file existence is not checked."""
    ca = trustme.CA()
    cert = ca.issue_cert("node.example.com")
    contents = {
        "PLUGPROXY_TLS_CA": ca.cert_pem.bytes(),
        "PLUGPROXY_TLS_CERT": b"".join(blob.bytes() for blob in cert.cert_chain_pems),
        "PLUGPROXY_TLS_KEY": cert.private_key_pem.bytes(),
    }
    env = dict(env)
    for name, data in contents.items():
        if name in env:
            target = tmp / env[name].lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
            env[name] = str(target)
    return env


@pytest.mark.parametrize("w", WORKLOADS, ids=WORKLOAD_IDS)
def test_every_value_is_accepted_by_the_cli(w: Workload, tmp_path: pathlib.Path) -> None:
    env = materialize_tls_files(proxy_env(w), tmp_path)
    ns = serve.parse_args([], environ=env)
    settings = serve.resolve(serve.parse_settings([], environ=env))
    # The parsed values are the manifest's, not defaults.
    assert settings.listen.url == env["PLUGPROXY_LISTEN"]
    assert settings.upstream.url == env["PLUGPROXY_UPSTREAM"]
    for opt in serve.all_options():
        if opt.env in env and not opt.is_switch and not opt.repeatable:
            assert getattr(ns, opt.dest) == opt.type(env[opt.env]), opt.env


def test_a_bad_value_in_a_manifest_would_be_caught() -> None:
    env = {**proxy_env(WORKLOADS[0]), "PLUGPROXY_MAX_MESSAGE_BYTES": "lots"}
    with pytest.raises(Exception, match="PLUGPROXY_MAX_MESSAGE_BYTES"):
        serve.parse_args([], environ=env)


# ------------------------------------------------------------------------------ ports


def admin_address(w: Workload) -> tuple[str, int]:
    raw = proxy_env(w).get("PLUGPROXY_ADMIN_LISTEN")
    assert raw, "set PLUGPROXY_ADMIN_LISTEN explicitly: probes depend on it"
    host, _, port = raw.rpartition(":")
    return host, int(port)


def resolve_port(container: dict[str, Any], port: int | str) -> int:
    if isinstance(port, int):
        return port
    named = [p["containerPort"] for p in container.get("ports", []) if p.get("name") == port]
    assert named, f"{container['name']}: no port named {port}"
    return int(named[0])


@pytest.mark.parametrize("w", WORKLOADS, ids=WORKLOAD_IDS)
def test_probes_and_scrape_use_the_admin_port(w: Workload) -> None:
    host, port = admin_address(w)
    # kubelet probes and Prometheus come from outside the pod: loopback would fail them.
    assert not ipaddress.ip_address(host).is_loopback
    proxy = w.proxy
    live, ready = proxy["livenessProbe"]["httpGet"], proxy["readinessProbe"]["httpGet"]
    assert live["path"] == "/healthz"
    assert ready["path"] == "/readyz"
    assert resolve_port(proxy, live["port"]) == port
    assert resolve_port(proxy, ready["port"]) == port
    assert w.annotations["prometheus.io/scrape"] == "true"
    assert int(w.annotations["prometheus.io/port"]) == port
    assert w.annotations["prometheus.io/path"] == "/metrics"
    for container in w.containers:
        if container is not proxy:
            used = {p["containerPort"] for p in container.get("ports", [])}
            assert port not in used, f"{container['name']} also uses port {port}"


@pytest.mark.parametrize("w", WORKLOADS, ids=WORKLOAD_IDS)
def test_proxy_drains_within_the_pod_termination_grace(w: Workload) -> None:
    grace = options.duration(proxy_env(w)["PLUGPROXY_SHUTDOWN_GRACE"])
    assert grace < w.pod.get("terminationGracePeriodSeconds", 30)


# ------------------------------------------------------------------------------ sockets


@pytest.mark.parametrize("w", WORKLOADS, ids=WORKLOAD_IDS)
def test_co_dials_the_proxy_and_only_the_proxy_reaches_the_plugin(w: Workload) -> None:
    env = proxy_env(w)
    listen = parse_endpoint(env["PLUGPROXY_LISTEN"])
    upstream = parse_endpoint(env["PLUGPROXY_UPSTREAM"])
    co_side, plugin_side = [], []
    for container in w.containers:
        if is_proxy(container):
            continue
        for address in endpoints_named(container):
            ep = parse_endpoint(address)
            if listen.is_unix and ep.is_unix:
                where = location(container, address)
                if where == location(w.proxy, listen.url):
                    co_side.append(container["name"])
                    continue
                assert upstream.is_unix, f"{container['name']}: {address} is nobody's socket"
                assert where == location(w.proxy, upstream.url), (
                    f"{container['name']}: {address} is neither plugproxy's listen socket "
                    "nor its upstream"
                )
                plugin_side.append(container["name"])
            else:
                assert ep.grpc_target in (listen.grpc_target, upstream.grpc_target), address
                (co_side if ep.grpc_target == listen.grpc_target else plugin_side).append(
                    container["name"]
                )
    if not co_side:
        # The CO is no container of this pod (kube-apiserver, kubelet): it dials the
        # socket on the host.
        assert listen.is_unix, "no CO container dials plugproxy"
        outer, _ = location(w.proxy, listen.url)
        assert "hostPath" in w.volume(outer), "the CO outside the pod cannot reach the socket"
    if w in DEVICE_PLUGIN_WORKLOADS:
        return  # the plugin names no socket; its own test follows
    if upstream.scheme is Scheme.TLS:
        assert not plugin_side  # the plugin is remote
        return
    assert len(plugin_side) == 1, f"exactly one plugin container, got {plugin_side}"
    if upstream.is_unix:
        # The plugin's socket sits in a volume only the proxy and the plugin mount.
        inner, _ = location(w.proxy, upstream.url)
        assert mounters(w, inner) == {w.proxy["name"], plugin_side[0]}
        assert "emptyDir" in w.volume(inner)
        outer, _ = location(w.proxy, listen.url)
        assert inner != outer
    else:
        # Plain TCP only on the pod's loopback, and only with the explicit switch.
        assert ipaddress.ip_address(listen.host).is_loopback
        assert ipaddress.ip_address(upstream.host).is_loopback
        assert env.get("PLUGPROXY_INSECURE_TCP") == "true"


NODE_WORKLOADS = [
    w for w in WORKLOADS if any("node-driver-registrar" in c["image"] for c in w.containers)
]
DEVICE_PLUGIN_DIR = "/var/lib/kubelet/device-plugins"
DEVICE_PLUGIN_WORKLOADS = [
    w for w in WORKLOADS if proxy_env(w).get("PLUGPROXY_SPEC") == "deviceplugin.v1beta1"
]


def test_a_device_plugin_is_among_the_manifests() -> None:
    assert DEVICE_PLUGIN_WORKLOADS


@pytest.mark.parametrize(
    "w", DEVICE_PLUGIN_WORKLOADS, ids=[w.file for w in DEVICE_PLUGIN_WORKLOADS]
)
def test_the_device_plugin_registers_the_proxy_socket(w: Workload) -> None:
    """The plugin sees a private device plugin directory holding the host's kubelet.sock:
    its socket lands where only the proxy dials it, and the name it registers with kubelet
    is the proxy's socket in the host's directory."""
    env = proxy_env(w)
    listen, upstream = (
        parse_endpoint(env["PLUGPROXY_LISTEN"]),
        parse_endpoint(env["PLUGPROXY_UPSTREAM"]),
    )
    outer, name = location(w.proxy, listen.url)
    assert w.volume(outer)["hostPath"]["path"] == DEVICE_PLUGIN_DIR and "/" not in name
    inner, inner_name = location(w.proxy, upstream.url)
    assert inner_name == name  # the same name: the one the plugin registers
    assert "emptyDir" in w.volume(inner)
    plugins = [c for c in w.containers if c is not w.proxy and inner in mounters_of(c)]
    assert len(plugins) == 1 and mounters(w, inner) == {w.proxy["name"], plugins[0]["name"]}
    mounts = {m["mountPath"]: m["name"] for m in plugins[0]["volumeMounts"]}
    assert mounts[DEVICE_PLUGIN_DIR] == inner
    kubelet_sock = w.volume(mounts[f"{DEVICE_PLUGIN_DIR}/kubelet.sock"])["hostPath"]
    assert kubelet_sock == {"path": f"{DEVICE_PLUGIN_DIR}/kubelet.sock", "type": "Socket"}
    assert outer not in mounters_of(plugins[0])  # the plugin never sees the proxy's socket
    # ListAndWatch lives as long as the plugin: connection ageing must not cut it.
    assert listen.is_unix or options.duration(env.get("PLUGPROXY_MAX_CONNECTION_AGE", "1h")) == 0


@pytest.mark.parametrize("w", NODE_WORKLOADS, ids=[w.file for w in NODE_WORKLOADS])
def test_kubelet_registration_path_is_the_proxy_socket_on_the_host(w: Workload) -> None:
    registrar = next(c for c in w.containers if "node-driver-registrar" in c["image"])
    flags = dict(word.partition("=")[::2] for word in command_words(registrar))
    volume, relpath = location(w.proxy, proxy_env(w)["PLUGPROXY_LISTEN"])
    host_dir = w.volume(volume)["hostPath"]["path"]
    assert flags["--kubelet-registration-path"] == posixpath.join(host_dir, relpath)
    # The registrar asks the proxy (GetPluginInfo) through the same socket.
    assert location(registrar, flags["--csi-address"]) == (volume, relpath)
    # A non-root proxy gets the host directory given to its group before it starts; a root
    # one creates its socket in kubelet's directory as it is.
    prepare = [c for c in w.pod.get("initContainers", []) if volume in mounters_of(c)]
    if w.proxy["securityContext"]["runAsUser"] == 0:
        assert not prepare, "a root proxy needs no prepared directory"
    else:
        assert prepare, "the host socket directory must be made writable for the proxy"
        assert_prepares(prepare[0], volume)


def assert_prepares(init: dict[str, Any], volume: str) -> None:
    """The init container gives the volume's directory to group 65532, with plugproxy's
    own subcommand: the image has no shell."""
    assert "command" not in init, "keep the image's entrypoint: it has no shell"
    assert init["args"][0] == "prepare-dir"
    parser = argparse.ArgumentParser()
    preparedir.add_arguments(parser)
    ns = parser.parse_args(init["args"][1:])
    mount = next(m for m in init["volumeMounts"] if m["name"] == volume)
    assert ns.paths == [mount["mountPath"]]
    assert preparedir.parse_owner(ns.owner) == (0, 65532)
    assert preparedir.parse_mode(ns.mode) == 0o770


@pytest.mark.parametrize("w", WORKLOADS, ids=[w.file for w in WORKLOADS])
def test_init_containers_of_the_plugproxy_image_run_its_subcommands(w: Workload) -> None:
    for init in w.pod.get("initContainers", []):
        if init["image"] == w.proxy["image"]:
            assert "command" not in init, f"{init['name']}: the image has no shell"
            assert init["args"][0] in cli.SUBCOMMANDS
            if init["args"][0] == "prepare-dir":
                (mount,) = init["volumeMounts"]
                assert_prepares(init, mount["name"])


def mounters_of(container: dict[str, Any]) -> set[str]:
    return {m["name"] for m in container.get("volumeMounts", [])}


TLS_WORKLOADS = [w for w in WORKLOADS if proxy_env(w)["PLUGPROXY_UPSTREAM"].startswith("tls://")]
UNIX_WORKLOADS = [w for w in WORKLOADS if proxy_env(w)["PLUGPROXY_LISTEN"].startswith("unix://")]


def test_the_remote_bridge_is_among_the_manifests() -> None:
    assert TLS_WORKLOADS


@pytest.mark.parametrize("w", TLS_WORKLOADS, ids=[w.file for w in TLS_WORKLOADS])
def test_tls_material_comes_from_a_whole_secret_directory(w: Workload) -> None:
    env = proxy_env(w)
    paths = [
        env[k] for k in ("PLUGPROXY_TLS_CA", "PLUGPROXY_TLS_CERT", "PLUGPROXY_TLS_KEY") if k in env
    ]
    assert len(paths) == 3
    for path in paths:
        mount = next(
            m for m in w.proxy["volumeMounts"] if posixpath.dirname(path) == m["mountPath"]
        )
        # subPath mounts never see Kubernetes' symlink swap, so rotation would be lost.
        assert "subPath" not in mount
        assert mount.get("readOnly") is True
        assert "secret" in w.volume(mount["name"])


# ------------------------------------------------------------------------------ security


def plugin_container(w: Workload) -> dict[str, Any] | None:
    """The container serving the proxy's upstream socket; None where no socket file is
    shared with a plugin of the pod (a TCP upstream, a remote one over TLS)."""
    upstream = parse_endpoint(proxy_env(w)["PLUGPROXY_UPSTREAM"])
    if not upstream.is_unix:
        return None
    inner, _ = location(w.proxy, upstream.url)
    (plugin,) = [c for c in w.containers if c is not w.proxy and inner in mounters_of(c)]
    return plugin


@pytest.mark.parametrize("w", WORKLOADS, ids=WORKLOAD_IDS)
def test_the_proxy_runs_as_inject_would_run_it(w: Workload) -> None:
    """One recipe: the proxy reaches the plugin's socket as the plugin's user (root with
    DAC_OVERRIDE alone where the plugin's user is its image's), exactly as inject decides;
    the image's user where no socket file is shared."""
    plugin = plugin_container(w)
    if plugin is None:
        uid, keep = inject.UID, []
    else:
        uid, keep = inject.proxy_identity(inject.run_as_user(w.pod, plugin), None)
    sc = w.proxy["securityContext"]
    assert (sc["runAsUser"], sc["runAsNonRoot"]) == (uid, uid != 0)
    assert sc["capabilities"].get("add", []) == keep


@pytest.mark.parametrize("w", WORKLOADS, ids=WORKLOAD_IDS)
def test_every_container_starts_as_its_image_says(w: Workload) -> None:
    """No shell wrapper (`sh -c "umask ... && exec ..."`) around a plugin or anything else:
    distroless and scratch images have no shell, and the plugin stays as its vendor ships
    it."""
    for container in [*w.pod.get("initContainers", []), *w.containers]:
        command = [*container.get("command", []), *container.get("args", [])]
        shells = ("sh", "bash", "/bin/sh", "/bin/bash")
        assert not command or command[0] not in shells, container["name"]
        assert not any("umask" in str(word) for word in command), container["name"]


@pytest.mark.parametrize("w", WORKLOADS, ids=WORKLOAD_IDS)
def test_proxy_container_is_locked_down(w: Workload) -> None:
    sc = w.proxy["securityContext"]
    assert isinstance(sc["runAsUser"], int)  # which one: test_the_proxy_runs_as_inject_would
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"]
    assert set(sc["capabilities"].get("add", [])) <= {"DAC_OVERRIDE"}
    assert sc["seccompProfile"]["type"] == "RuntimeDefault"
    assert not sc.get("privileged", False)
    # A read-only root needs a writable /tmp of its own.
    tmp = next(m for m in w.proxy["volumeMounts"] if m["mountPath"] == "/tmp")
    assert "emptyDir" in w.volume(tmp["name"])
    for container in w.pod.get("initContainers", []):
        isc = container["securityContext"]
        assert isc["allowPrivilegeEscalation"] is False
        assert isc["capabilities"]["drop"] == ["ALL"]
        assert set(isc["capabilities"].get("add", [])) <= {"CHOWN"}


@pytest.mark.parametrize("w", WORKLOADS, ids=WORKLOAD_IDS)
def test_the_violation_record_is_kept_where_inject_keeps_it(w: Workload) -> None:
    """Validation on: the record survives a restart of the proxy's container in its /tmp
    emptyDir, bounded well inside the volume's sizeLimit (past it the pod is evicted)."""
    env = proxy_env(w)
    assert env.get("PLUGPROXY_VALIDATION", "audit") != "off"
    assert env.get("PLUGPROXY_VIOLATIONS_FILE") == inject.VIOLATIONS_FILE
    assert env.get("PLUGPROXY_VIOLATIONS_FILE_MAX_BYTES") == inject.VIOLATIONS_MAX_BYTES
    directory = posixpath.dirname(inject.VIOLATIONS_FILE)
    mount = next(m for m in w.proxy["volumeMounts"] if m["mountPath"] == directory)
    assert "subPath" not in mount
    empty_dir = w.volume(mount["name"])["emptyDir"]
    assert empty_dir.get("medium") != "Memory", "the record would count against memory"
    bound = options.byte_size(inject.VIOLATIONS_MAX_BYTES)
    assert bound <= options.byte_size(empty_dir["sizeLimit"]) // 2
    assert empty_dir["sizeLimit"] == inject.TMP_SIZE


@pytest.mark.parametrize("w", WORKLOADS, ids=WORKLOAD_IDS)
def test_every_container_has_requests_and_a_memory_limit(w: Workload) -> None:
    for container in [*w.pod.get("initContainers", []), *w.containers]:
        resources = container["resources"]
        assert {"cpu", "memory"} <= set(resources["requests"]), container["name"]
        assert "memory" in resources["limits"], container["name"]
    assert {"cpu", "memory"} <= set(w.proxy["resources"]["limits"])


@pytest.mark.parametrize("w", UNIX_WORKLOADS, ids=[w.file for w in UNIX_WORKLOADS])
def test_co_containers_can_open_the_proxy_socket(w: Workload) -> None:
    mode = options.octal_mode(proxy_env(w).get("PLUGPROXY_SOCKET_MODE", "0660"))
    assert mode & 0o007 == 0, "the socket is not for everyone on the node"
    # Owner and group only: every container must share the proxy's group.
    assert w.pod["securityContext"]["fsGroup"] == w.proxy["securityContext"]["runAsGroup"]


# ------------------------------------------------------------------------ webhook

WEBHOOK_DIR = DEPLOY / "webhook"
WEBHOOK_FILES = sorted(WEBHOOK_DIR.glob("*.yaml"))
# Custom resources the API schema bundle does not know; checked field by field below.
CERT_MANAGER = "cert-manager.io/v1"


def webhook_docs(name: str) -> list[dict[str, Any]]:
    return load(WEBHOOK_DIR / name)


def one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (found,) = [d for d in docs if d["kind"] == kind]
    return found


def test_webhook_manifests_are_shipped() -> None:
    assert {p.name for p in WEBHOOK_FILES} == {
        "webhook.yaml",
        "webhook-cert-manager.yaml",
        "webhook-static-cert.yaml",
    }


@pytest.mark.parametrize("path", WEBHOOK_FILES, ids=lambda p: p.name)
def test_webhook_manifest_validates_against_the_kubernetes_schema(path: pathlib.Path) -> None:
    assert path.read_text(encoding="utf-8").startswith("#"), path.name
    for doc in load(path):
        if doc["apiVersion"] != CERT_MANAGER:
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_webhook_deployment_args_certificate_and_service_line_up() -> None:
    from plugproxy.cli import main as cli

    docs = webhook_docs("webhook.yaml")
    deployment, service = one(docs, "Deployment"), one(docs, "Service")
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    ns = cli.build_parser().parse_args(container["args"])
    assert ns.command == "webhook"
    assert not ns.fail_closed  # matches failurePolicy Ignore
    # The serving port: Service -> container port -> --listen.
    port = next(
        p for p in container["ports"] if p["name"] == service["spec"]["ports"][0]["targetPort"]
    )
    assert ns.listen.endswith(f":{port['containerPort']}")
    for probe in ("livenessProbe", "readinessProbe"):
        get = container[probe]["httpGet"]
        assert (get["path"], get["port"], get["scheme"]) == ("/healthz", "https", "HTTPS")
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    # Certificate files come from a whole Secret directory, so rotation is seen.
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    for path in (ns.tls_cert, ns.tls_key):
        mount = mounts[posixpath.dirname(path)]
        assert "subPath" not in mount and mount["readOnly"] is True
    volume = next(
        v for v in pod["volumes"] if v["name"] == mounts[posixpath.dirname(ns.tls_cert)]["name"]
    )
    certificate = one(webhook_docs("webhook-cert-manager.yaml"), "Certificate")
    assert volume["secret"]["secretName"] == certificate["spec"]["secretName"]
    dns = f"{service['metadata']['name']}.{service['metadata']['namespace']}.svc"
    assert dns in certificate["spec"]["dnsNames"]
    issuer = one(webhook_docs("webhook-cert-manager.yaml"), "Issuer")
    assert certificate["spec"]["issuerRef"] == {
        "kind": "Issuer",
        "name": issuer["metadata"]["name"],
    }
    assert issuer["metadata"]["namespace"] == certificate["metadata"]["namespace"]
    # Locked down like the proxy.
    sc = container["securityContext"]
    assert sc["runAsNonRoot"] is True and sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"] == {"drop": ["ALL"]}
    assert {"cpu", "memory"} <= set(container["resources"]["requests"])


@pytest.mark.parametrize("name", ["webhook-cert-manager.yaml", "webhook-static-cert.yaml"])
def test_webhook_registration(name: str) -> None:
    from plugproxy.cli import inject

    service = one(webhook_docs("webhook.yaml"), "Service")
    config = one(webhook_docs(name), "MutatingWebhookConfiguration")
    (hook,) = config["webhooks"]
    assert hook["failurePolicy"] == "Ignore"  # a down webhook never blocks a pod
    assert hook["sideEffects"] == "None"
    assert "v1" in hook["admissionReviewVersions"]
    assert hook["rules"] == [
        {
            "operations": ["CREATE"],
            "apiGroups": [""],
            "apiVersions": ["v1"],
            "resources": ["pods"],
            "scope": "Namespaced",
        }
    ]
    target = hook["clientConfig"]["service"]
    assert (target["name"], target["namespace"]) == (
        service["metadata"]["name"],
        service["metadata"]["namespace"],
    )
    assert target["path"] == "/mutate"
    assert target["port"] == service["spec"]["ports"][0]["port"]
    assert inject.OPT_IN in hook["namespaceSelector"]["matchLabels"]
    assert hook["objectSelector"]["matchExpressions"][0]["key"] == inject.OPT_IN
    if name == "webhook-cert-manager.yaml":
        certificate = one(webhook_docs(name), "Certificate")
        meta = certificate["metadata"]
        assert config["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == (
            f"{meta['namespace']}/{meta['name']}"
        )
        assert "caBundle" not in hook["clientConfig"]
    else:
        assert hook["clientConfig"]["caBundle"]
