"""`plugproxy inject` on the manifests real drivers publish (tests/fixtures/inject/drivers/,
each with its source in its first lines): which container is the driver, where plugproxy
listens and where the driver went, the admin address, every other container untouched,
distinct node ports for a driver's hostNetwork workloads, refusals, and `--remove`.
"""

from __future__ import annotations

import difflib
import pathlib
import posixpath
import re
import shutil
from dataclasses import dataclass, field
from typing import Any

import kubernetes_validate
import pytest
import yaml

from plugproxy.cli import inject
from tests.test_cli_inject import IMAGE, Pod, env_of, pods, proxy_flags, run, where

DRIVERS = pathlib.Path(__file__).resolve().parent / "fixtures" / "inject" / "drivers"
ARG_VAR = re.compile(r"\$\((\w+)\)")
PORT_WORD = re.compile(r"^-{1,2}[\w-]*(?:port|address|endpoint|listen)[\w-]*=\S*?:?(\d{2,5})$")


@dataclass(frozen=True)
class Wired:
    driver: str
    listen: str
    upstream: str
    admin: str  # --admin-listen
    user: int  # runAsUser of plugproxy
    co_side: frozenset[str]  # containers that dial the socket, now plugproxy's


@dataclass(frozen=True)
class Case:
    args: tuple[str, ...] = ()
    wired: dict[str, Wired] = field(default_factory=dict)
    refused: tuple[str, ...] = ()  # without `args`: workloads refused, exit 2


def co(*names: str) -> frozenset[str]:
    return frozenset(names)


# The answers. Admin ports: 9808 is plugproxy's default, and also the CSI livenessprobe's
# default when it is given no port flag, so any CSI client without a port flag keeps it
# taken; on hostNetwork every port of the driver's other workloads is taken too.
CASES: dict[str, Case] = {
    "aws-ebs": Case(
        wired={
            # Pod network; the driver declares 9808 (its livenessprobe serves it).
            "ebs-csi-controller": Wired(
                "ebs-plugin",
                "unix:///var/lib/csi/sockets/pluginproxy/csi.sock",
                "unix:///plugin/csi.sock",
                "0.0.0.0:9809",
                1000,
                co(
                    "csi-provisioner",
                    "csi-attacher",
                    "csi-snapshotter",
                    "csi-resizer",
                    "liveness-probe",
                ),
            ),
            "ebs-csi-node": Wired(
                "ebs-plugin",
                "unix:///csi/csi.sock",
                "unix:///plugin/csi.sock",
                "0.0.0.0:9809",
                0,
                co("node-driver-registrar", "liveness-probe"),
            ),
        }
    ),
    "gcp-pd": Case(
        wired={
            # Both on hostNetwork: the node's registrar has no port flag (9808), so the
            # controller takes 9809 and the node, which comes after, 9810.
            "csi-gce-pd-controller": Wired(
                "gce-pd-driver",
                "unix:///csi/csi.sock",
                "unix:///plugin/csi.sock",
                "127.0.0.1:9809",
                0,
                co("csi-provisioner", "csi-attacher", "csi-resizer", "csi-snapshotter"),
            ),
            "csi-gce-pd-node": Wired(
                "gce-pd-driver",
                "unix:///csi/csi.sock",
                "unix:///plugin/csi.sock",
                "127.0.0.1:9810",
                0,
                co("csi-driver-registrar"),
            ),
        }
    ),
    "azuredisk": Case(
        wired={
            "csi-azuredisk-controller": Wired(
                "azuredisk",
                "unix:///csi/csi.sock",
                "unix:///plugin/csi.sock",
                "127.0.0.1:9809",
                0,
                co("csi-provisioner", "csi-attacher", "csi-snapshotter", "csi-resizer"),
            ),
            "csi-azuredisk-node": Wired(
                "azuredisk",
                "unix:///csi/csi.sock",
                "unix:///plugin/csi.sock",
                "127.0.0.1:9810",
                0,
                co("liveness-probe", "node-driver-registrar"),
            ),
        }
    ),
    "nfs": Case(
        wired={
            "csi-nfs-controller": Wired(
                "nfs",
                "unix:///csi/csi.sock",
                "unix:///plugin/csi.sock",
                "127.0.0.1:9809",
                0,
                co("csi-provisioner", "liveness-probe"),
            ),
            "csi-nfs-node": Wired(
                "nfs",
                "unix:///csi/csi.sock",
                "unix:///plugin/csi.sock",
                "127.0.0.1:9810",
                0,
                co("liveness-probe", "node-driver-registrar"),
            ),
        }
    ),
    "smb": Case(
        wired={
            "csi-smb-node": Wired(
                "smb",
                "unix:///csi/csi.sock",
                "unix:///plugin/csi.sock",
                "127.0.0.1:9809",
                0,
                co("liveness-probe", "node-driver-registrar"),
            ),
        }
    ),
    # ceph-csi's liveness-prometheus is given the driver's own --endpoint and CSI_ENDPOINT:
    # only the user can say which of the two serves the socket.
    "ceph-rbd": Case(
        args=("--driver-container=csi-rbdplugin",),
        wired={
            # Every sidecar has a port flag, and the pod is on its own network.
            "csi-rbdplugin-provisioner": Wired(
                "csi-rbdplugin",
                "unix:///csi/csi-provisioner.sock",
                "unix:///plugin/csi-provisioner.sock",
                "0.0.0.0:9808",
                0,
                co("csi-provisioner", "csi-attacher", "liveness-prometheus"),
            ),
            "csi-rbdplugin": Wired(
                "csi-rbdplugin",
                "unix:///csi/csi.sock",
                "unix:///plugin/csi.sock",
                "127.0.0.1:9809",
                0,
                co("driver-registrar", "liveness-prometheus"),
            ),
        },
        refused=("Deployment/default/csi-rbdplugin-provisioner", "DaemonSet/default/csi-rbdplugin"),
    ),
    "hostpath": Case(
        wired={
            "csi-hostpathplugin": Wired(
                "hostpath",
                "unix:///csi/csi.sock",
                "unix:///plugin/csi.sock",
                "0.0.0.0:9809",
                0,
                co(
                    "csi-external-health-monitor-controller",
                    "node-driver-registrar",
                    "liveness-probe",
                    "csi-attacher",
                    "csi-provisioner",
                    "csi-resizer",
                    "csi-snapshotter",
                ),
            ),
        }
    ),
    "lvm-localpv": Case(
        wired={
            "openebs-lvm-controller": Wired(
                "openebs-lvm-plugin",
                "unix:///var/lib/csi/sockets/pluginproxy/csi.sock",
                "unix:///plugin/csi.sock",
                "0.0.0.0:9809",
                0,
                co("csi-resizer", "csi-snapshotter", "csi-provisioner"),
            ),
            # The driver's socket directory is /plugin already: its private one goes aside.
            "openebs-lvm-node": Wired(
                "openebs-lvm-plugin",
                "unix:///plugin/csi.sock",
                "unix:///plugproxy-plugin/csi.sock",
                "127.0.0.1:9809",
                0,
                co("csi-node-driver-registrar"),
            ),
        }
    ),
    # Sidecar and driver name no socket: both use COSI's default, and either could serve it.
    "scality-cosi": Case(
        args=("--driver-container=scality-cosi-driver",),
        wired={
            "scality-cosi-driver": Wired(
                "scality-cosi-driver",
                "unix:///var/lib/cosi/cosi.sock",
                "unix:///plugin/cosi.sock",
                "0.0.0.0:9808",
                0,
                co("objectstorage-provisioner-sidecar"),
            ),
        },
        refused=("Deployment/scality-cosi-driver",),
    ),
    # COSI v0.2 (the v1alpha2 sidecar): no socket named either, but the pod marks the driver
    # as its default container, so no flag is needed.
    "hpe-cosi": Case(
        wired={
            "hpe-cosi-provisioner": Wired(
                "hpe-cosi-driver",
                "unix:///var/lib/cosi/cosi.sock",
                "unix:///plugin/cosi.sock",
                "0.0.0.0:9808",
                0,
                co("hpe-cosi-provisioner-sidecar"),
            ),
        }
    ),
    # Machine controller and provider linked in-process: no CMI socket, nothing to do.
    "gardener-mcm": Case(),
    # The provider's metrics flag holds 8081: its CMI endpoint moves to 8082.
    "cmi-example": Case(
        wired={
            "example-machine-controller": Wired(
                "example-machine-provider",
                "tcp://127.0.0.1:8080",
                "tcp://127.0.0.1:8082",
                "0.0.0.0:9808",
                65532,
                co("machine-controller"),
            ),
        }
    ),
}
DEFAULTS = {"csi": "unix:///run/csi/socket", "cosi": "unix:///var/lib/cosi/cosi.sock"}
# Driver sets with a plugin socket inject wires; the others are "nothing to inject".
WIREABLE = sorted(d for d, c in CASES.items() if c.wired)


def files(driver: str) -> list[pathlib.Path]:
    return sorted((DRIVERS / driver).glob("*.yaml"))


def source_text(driver: str) -> str:
    """What `inject` prints for the unchanged files: one stream."""
    texts = [p.read_text(encoding="utf-8") for p in files(driver)]
    return "".join(t if i == 0 or t.startswith("---") else "---\n" + t for i, t in enumerate(texts))


def injected(capsys: pytest.CaptureFixture[str], driver: str, *extra: str) -> str:
    code, out, err = run(
        capsys, "--image", IMAGE, *CASES[driver].args, *extra, str(DRIVERS / driver)
    )
    assert code == 0, err
    return out


def dialled(container: dict[str, Any]) -> list[str]:
    """The plugin addresses a container is given, or the default socket it mounts."""
    env = env_of(container)
    found = [v for k, v in env.items() if k in ("CSI_ENDPOINT", "COSI_ENDPOINT", "CMI_ENDPOINT")]
    for word in [*container.get("command", []), *container.get("args", [])]:
        flag, sep, value = ARG_VAR.sub(lambda m: env.get(m[1], m[0]), word).partition("=")
        if sep and flag.lstrip("-") in ("csi-address", "endpoint", "csi-endpoint"):
            found.append(value)
    mounted = {posixpath.normpath(m["mountPath"]) for m in container.get("volumeMounts", [])}
    return found or [a for a in DEFAULTS.values() if posixpath.dirname(a[7:]) in mounted]


def ports_of(container: dict[str, Any]) -> set[int]:
    """Ports a container states: declared, or in a flag ($(VAR) expanded)."""
    env = env_of(container)
    words = [ARG_VAR.sub(lambda m: env.get(m[1], m[0]), w) for w in container.get("args", [])]
    found = {int(m[1]) for w in words if (m := PORT_WORD.match(w))}
    return found | {p["containerPort"] for p in container.get("ports", [])}


def hostnetwork_ports(pod: Pod) -> set[int]:
    return set().union(*(ports_of(c) for c in pod.spec["containers"]))


# ------------------------------------------------------------------------ the answers


@pytest.mark.parametrize("driver", WIREABLE)
def test_each_workload_is_wired_as_expected(
    driver: str, capsys: pytest.CaptureFixture[str]
) -> None:
    case = CASES[driver]
    before, after = pods(source_text(driver)), pods(injected(capsys, driver))
    assert set(before) == set(after)
    for name, pod in after.items():
        if name not in case.wired:
            assert pod == before[name], f"{name} is no plugin and must pass through"
            continue
        want, old = case.wired[name], before[name]
        proxy = pod.container("plugproxy")
        flags = proxy_flags(proxy)
        assert (flags["--listen"], flags["--upstream"], flags["--admin-listen"]) == (
            want.listen,
            want.upstream,
            want.admin,
        ), name
        assert proxy["securityContext"]["runAsUser"] == want.user, name
        # plugproxy listens where the driver was reached, and the driver serves its upstream.
        old_driver, new_driver = old.container(want.driver), pod.container(want.driver)
        (old_address,) = set(dialled(old_driver))
        assert where(proxy, flags["--listen"]) == where(old_driver, old_address)
        assert {where(new_driver, a) for a in dialled(new_driver)} == {
            where(proxy, flags["--upstream"])
        }
        # Every CO-side container still dials the same place, now plugproxy's.
        for co_name in want.co_side:
            for address in dialled(pod.container(co_name)):
                assert where(pod.container(co_name), address) == where(proxy, flags["--listen"])
        # All containers but the driver are as they were; the proxy is first.
        assert [c["name"] for c in pod.spec["containers"]] == [
            "plugproxy",
            *(c["name"] for c in old.spec["containers"]),
        ]
        for container in old.spec["containers"]:
            if container["name"] != want.driver:
                assert pod.container(container["name"]) == container, container["name"]


@pytest.mark.parametrize("driver", WIREABLE)
def test_only_the_drivers_mount_or_address_line_changes(
    driver: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Byte for byte: of the input's lines only one per wired workload is replaced."""
    source, out = source_text(driver), injected(capsys, driver)
    lines = list(difflib.ndiff(source.splitlines(), out.splitlines()))
    removed = [line[2:].strip() for line in lines if line.startswith("- ")]
    assert len(removed) == len(CASES[driver].wired), removed
    for line in removed:  # a socket volume's name, or (TCP) the driver's endpoint
        assert line.startswith(("name: ", "- name: ", "value: tcp://")), line


@pytest.mark.parametrize("driver", WIREABLE)
def test_admin_ports_and_binding(driver: str, capsys: pytest.CaptureFixture[str]) -> None:
    after = pods(injected(capsys, driver))
    node_ports: list[int] = []
    taken_on_node: set[int] = set()
    for name in CASES[driver].wired:
        pod = after[name]
        proxy = pod.container("plugproxy")
        host, _, raw = proxy_flags(proxy)["--admin-listen"].rpartition(":")
        port = int(raw)
        others = [c for c in pod.spec["containers"] if c is not proxy]
        assert port not in set().union(*(ports_of(c) for c in others)), name
        probe = proxy["readinessProbe"]["httpGet"]
        if pod.spec.get("hostNetwork"):
            # Loopback of the node: kubelet reaches it, the node's network does not.
            assert host == "127.0.0.1"
            assert probe["host"] == proxy["livenessProbe"]["httpGet"]["host"] == "127.0.0.1"
            assert not [k for k in pod.annotations if k.startswith("prometheus.io/")]
            node_ports.append(port)
            taken_on_node |= hostnetwork_ports(pod) - {port}
        else:
            assert host == "0.0.0.0" and "host" not in probe
            assert pod.annotations["prometheus.io/port"] == str(port)
    # No two hostNetwork workloads of the driver on one port, nor on another's port.
    assert len(node_ports) == len(set(node_ports))
    assert not set(node_ports) & taken_on_node


def test_a_node_reachable_admin_is_asked_for(capsys: pytest.CaptureFixture[str]) -> None:
    after = pods(injected(capsys, "nfs", "--node-reachable-admin"))
    ports = []
    for name in CASES["nfs"].wired:
        proxy = after[name].container("plugproxy")
        host, _, port = proxy_flags(proxy)["--admin-listen"].rpartition(":")
        assert host == "0.0.0.0"
        assert "host" not in proxy["livenessProbe"]["httpGet"]
        assert after[name].annotations["prometheus.io/port"] == port
        ports.append(port)
    assert len(set(ports)) == 2


@pytest.mark.parametrize(
    ("driver", "admin", "message"),
    [
        # One port for two hostNetwork workloads: they would meet on a node.
        ("nfs", "0.0.0.0:9900", "port 9900 is already used on the node (hostNetwork)"),
        ("smb", "0.0.0.0:29645", "port 29645 is already used on the node"),  # smb's metrics
        ("hostpath", "127.0.0.1:9900", "kubelet cannot probe the pod's loopback"),
    ],
)
def test_a_given_admin_address_that_cannot_work_is_refused(
    driver: str, admin: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(capsys, f"--serve-arg=--admin-listen={admin}", str(DRIVERS / driver))
    assert (code, out) == (2, "")
    assert message in err


def test_a_given_admin_address_on_one_hostnetwork_workload(
    capsys: pytest.CaptureFixture[str],
) -> None:
    pod = pods(injected(capsys, "smb", "--serve-arg=--admin-listen=127.0.0.1:9900"))["csi-smb-node"]
    proxy = pod.container("plugproxy")
    assert "--admin-listen=127.0.0.1:9900" in proxy["args"]
    assert proxy["ports"][0]["containerPort"] == 9900
    assert proxy["livenessProbe"]["httpGet"]["host"] == "127.0.0.1"


@pytest.mark.parametrize("driver", WIREABLE)
def test_injected_output_validates(driver: str, capsys: pytest.CaptureFixture[str]) -> None:
    for doc in yaml.safe_load_all(injected(capsys, driver)):
        if doc:
            for version in ("1.30", kubernetes_validate.latest_version()):
                kubernetes_validate.validate(doc, version, strict=True)


@pytest.mark.parametrize("driver", WIREABLE)
def test_in_place_twice_then_remove_restores_every_file(
    driver: str, capsys: pytest.CaptureFixture[str], tmp_path: pathlib.Path
) -> None:
    copy = tmp_path / driver
    shutil.copytree(DRIVERS / driver, copy)
    code, _, err = run(capsys, "-i", "--image", IMAGE, *CASES[driver].args, str(copy))
    assert code == 0, err
    once = {p.name: p.read_text() for p in copy.iterdir()}
    code, _, err = run(capsys, "-i", "--image", IMAGE, *CASES[driver].args, str(copy))
    assert code == 0, err
    assert {p.name: p.read_text() for p in copy.iterdir()} == once
    code, _, err = run(capsys, "-i", "--remove", str(copy))
    assert code == 0, err
    for original in files(driver):
        assert (copy / original.name).read_text() == original.read_text(), original.name


# ------------------------------------------------------------------------ refusals


@pytest.mark.parametrize("driver", sorted(d for d, c in CASES.items() if c.refused))
def test_without_the_hint_each_unwireable_workload_is_named(
    driver: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(capsys, str(DRIVERS / driver))
    assert (code, out) == (2, "")
    lines = err.strip().splitlines()
    assert len(lines) == len(CASES[driver].refused)
    for who in CASES[driver].refused:
        (line,) = [line for line in lines if f"error: {who}: " in line]
        assert "cannot tell which container serves" in line and "--driver-container" in line


def ebs_controller() -> dict[str, Any]:
    docs = yaml.safe_load_all((DRIVERS / "aws-ebs" / "rendered.yaml").read_text())
    (doc,) = [d for d in docs if d and d["kind"] == "Deployment"]
    return dict(doc)


def test_a_driver_configured_out_of_sight_is_refused_then_wired_when_named(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # The driver's address from a ConfigMap: the sidecars still dial a socket on a volume
    # the driver mounts, so this is a plugin, and which container serves it is unsaid.
    doc = ebs_controller()
    driver = doc["spec"]["template"]["spec"]["containers"][0]
    driver["args"] = [a for a in driver["args"] if not a.startswith("--endpoint")]
    driver["env"][0] = {
        "name": "CSI_ENDPOINT",
        "valueFrom": {"configMapKeyRef": {"name": "ebs", "key": "endpoint"}},
    }
    text = yaml.safe_dump(doc)
    code, out, err = run(capsys, "-", stdin=text)
    assert (code, out) == (2, "")
    assert err.strip() == (
        "plugproxy inject: error: Deployment/ebs-csi-controller: csi-attacher, "
        "csi-provisioner, csi-resizer, csi-snapshotter, liveness-probe dial the socket "
        "csi.sock in volume socket-dir, but no container is given its address (the volume is also mounted by "
        "ebs-plugin); say which serves it with --driver-container NAME or the "
        "plugproxy.io/driver-container annotation"
    )
    code, out, err = run(capsys, "--driver-container=ebs-plugin", "-", stdin=text)
    assert code == 0, err
    pod = pods(out)["ebs-csi-controller"]
    flags = proxy_flags(pod.container("plugproxy"))
    assert flags["--listen"] == "unix:///var/lib/csi/sockets/pluginproxy/csi.sock"
    mounts = pod.container("ebs-plugin")["volumeMounts"]
    assert mounts == [
        {"name": inject.INNER_VOLUME, "mountPath": "/var/lib/csi/sockets/pluginproxy/"}
    ]
    assert where(pod.container("plugproxy"), flags["--upstream"]) == (
        inject.INNER_VOLUME,
        "csi.sock",
    )


@pytest.mark.parametrize(
    "shape",
    [
        "webhook",  # a Deployment with ports and secrets, no socket
        "registrar-only",  # the CO side of a driver that runs in another pod
    ],
)
def test_ordinary_workloads_are_no_error(shape: str, capsys: pytest.CaptureFixture[str]) -> None:
    if shape == "webhook":
        text = (DRIVERS / "gcp-pd" / "webhook.yaml").read_text()
    else:
        docs = yaml.safe_load_all((DRIVERS / "gcp-pd" / "node.yaml").read_text())
        doc = next(d for d in docs if d)
        spec = doc["spec"]["template"]["spec"]
        spec["containers"] = spec["containers"][:1]  # the registrar alone
        text = yaml.safe_dump(doc)
    # Beside a plugin, they pass through byte for byte; no error.
    cmi = DRIVERS / "cmi-example"
    code, out, err = run(capsys, "--image", IMAGE, "-", str(cmi), stdin=text)
    assert code == 0, err
    assert out.startswith(text + "---\n")
    assert "error" not in err and err.endswith("injected 1 of 2 workloads; 1 left unchanged\n")
    if shape == "registrar-only":
        assert (
            "DaemonSet/csi-gce-pd-node: left unchanged: only the CO side of the socket csi.sock "
            "in volume plugin-dir (csi-driver-registrar); the proxy goes into the pod of the "
            "driver that serves it\n"
        ) in err
    # Alone, there is nothing to inject: exit 1, one line, nothing written.
    code, out, err = run(capsys, "-", stdin=text)
    assert (code, out) == (1, "")
    (line,) = err.splitlines()
    assert line.startswith(
        "plugproxy inject: error: nothing to inject: none of the 1 workloads read runs a plugin;"
    )
    assert "--driver-container" in line


def test_a_driver_set_without_a_plugin_socket_is_nothing_to_inject(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """gardener-mcm links controller and provider in-process: no socket to put a proxy on.
    Nothing to inject and nothing to remove are the same answer: exit 1, one line."""
    for args in ((), ("--remove",), ("--diff",), ("-i",)):
        code, out, err = run(capsys, *args, str(DRIVERS / "gardener-mcm"))
        assert (code, out) == (1, ""), args
        (line,) = err.splitlines()
        verb = "remove" if args == ("--remove",) else "inject"
        assert line.startswith(f"plugproxy inject: error: nothing to {verb}: none of the "), args


# ------------------------------------------------------------------------ defaults and ports


def test_the_csi_sidecars_default_address_is_found(capsys: pytest.CaptureFixture[str]) -> None:
    # A livenessprobe given nothing dials /run/csi/socket and serves /healthz on 9808.
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p"},
        "spec": {
            "containers": [
                {
                    "name": "driver",
                    "image": "driver",
                    "args": ["--endpoint=unix:///run/csi/socket"],
                    "volumeMounts": [{"name": "socket", "mountPath": "/run/csi"}],
                },
                {
                    "name": "liveness-probe",
                    "image": "livenessprobe",
                    "volumeMounts": [{"name": "socket", "mountPath": "/run/csi/"}],
                },
            ],
            "volumes": [{"name": "socket", "emptyDir": {}}],
        },
    }
    code, out, err = run(capsys, "-", stdin=yaml.safe_dump(pod))
    assert code == 0, err
    new = pods(out)["p"]
    flags = proxy_flags(new.container("plugproxy"))
    assert flags["--listen"] == "unix:///run/csi/socket"
    assert flags["--spec"] == "csi.v1"
    assert flags["--admin-listen"] == "0.0.0.0:9809"  # 9808 is the probe's
    assert new.container("liveness-probe") == pod["spec"]["containers"][1]


@pytest.mark.parametrize(
    ("container", "ports"),
    [
        ({"args": ["--csi-address=/csi/csi.sock"]}, {9808}),  # livenessprobe's default
        ({"args": ["--csi-address=/csi/csi.sock", "--health-port=29652"]}, {29652}),
        ({"args": ["--csi-address=/csi/csi.sock", "--health-port", "29652"]}, {29652}),
        ({"args": ["--csi-address=/csi/csi.sock", "--http-endpoint=localhost:29653"]}, {29653}),
        ({"args": ["-csi-address=/csi/csi.sock", "-metrics-address=:8080"]}, {8080}),
        ({"args": ["--webhook-port=9443"]}, {9443}),
        (
            {
                "args": ["--listen-address=$(METRICS)"],
                "env": [{"name": "METRICS", "value": ":9500"}],
            },
            {9500},
        ),
        ({"args": ["--v=5"], "ports": [{"containerPort": 80, "hostPort": 8080}]}, {80, 8080}),
        ({"args": ["--endpoint=unix:///csi/csi.sock"]}, set()),  # a driver: no default port
    ],
)
def test_ports_a_container_uses(container: dict[str, Any], ports: set[int]) -> None:
    assert inject.container_ports(0, {"name": "c", **container}) == ports


def test_ports_are_shared_by_the_hostnetwork_workloads_of_all_files(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Two drivers' files in one run: every hostNetwork workload gets its own admin port.
    code, out, err = run(capsys, str(DRIVERS / "nfs"), str(DRIVERS / "smb"))
    assert code == 0, err
    admins = [
        proxy_flags(p.container("plugproxy"))["--admin-listen"]
        for p in pods(out).values()
        if p.spec.get("hostNetwork")
    ]
    assert len(admins) == 3 and len(set(admins)) == 3


def test_a_workload_injected_earlier_keeps_its_port_from_the_next_ones(
    capsys: pytest.CaptureFixture[str], tmp_path: pathlib.Path
) -> None:
    # The node DaemonSet injected first, on its own; then the whole driver.
    shutil.copytree(DRIVERS / "nfs", tmp_path / "nfs")
    code, _, err = run(capsys, "-i", str(tmp_path / "nfs" / "csi-nfs-node.yaml"))
    assert code == 0, err
    first = pods((tmp_path / "nfs" / "csi-nfs-node.yaml").read_text())["csi-nfs-node"]
    node_admin = proxy_flags(first.container("plugproxy"))["--admin-listen"]
    code, out, err = run(capsys, str(tmp_path / "nfs"))
    assert code == 0, err
    after = pods(out)
    assert proxy_flags(after["csi-nfs-node"].container("plugproxy"))["--admin-listen"] == node_admin
    controller_admin = proxy_flags(after["csi-nfs-controller"].container("plugproxy"))
    assert controller_admin["--admin-listen"] != node_admin


def test_a_node_driver_without_any_address_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    # gcp-pd's node driver alone, its endpoint left to a config file: nothing names a
    # socket, but the driver mounts its own directory under kubelet's plugins.
    doc = next(d for d in yaml.safe_load_all((DRIVERS / "gcp-pd" / "node.yaml").read_text()) if d)
    spec = doc["spec"]["template"]["spec"]
    spec["containers"] = spec["containers"][1:]
    spec["containers"][0]["args"].remove("--endpoint=unix:/csi/csi.sock")
    code, out, err = run(capsys, "-", stdin=yaml.safe_dump(doc))
    assert (code, out) == (2, "")
    assert err.strip() == (
        "plugproxy inject: error: DaemonSet/csi-gce-pd-node: gce-pd-driver mounts the kubelet "
        "plugin directory /var/lib/kubelet/plugins/pd.csi.storage.gke.io/ but no container is "
        "given a plugin address (--endpoint, CSI_ENDPOINT, --csi-address, ...); name it in "
        'the manifest, or opt out with the plugproxy.io/inject: "false" annotation'
    )
    # Opted out, it passes as it is, and the summary says why.
    doc["spec"]["template"]["metadata"]["annotations"] = {"plugproxy.io/inject": "false"}
    text = yaml.safe_dump(doc)
    code, out, err = run(capsys, "-", stdin=text)
    assert (code, out) == (0, text)
    assert err == (
        'plugproxy inject: DaemonSet/csi-gce-pd-node: opted out (plugproxy.io/inject: "false"), '
        "left unchanged\n"
        "plugproxy inject: injected 0 of 1 workloads; 1 left unchanged\n"
    )


def test_a_cosi_v02_driver_on_the_default_socket_is_its_pods_default_container(
    capsys: pytest.CaptureFixture[str], tmp_path: pathlib.Path
) -> None:
    """HPE's COSI v0.2 chart names no socket: the driver is the container the pod marks
    for kubectl (kubectl.kubernetes.io/default-container), and the proxy decodes with
    --spec=auto, where v1alpha2 calls are known by their package."""
    source = (DRIVERS / "hpe-cosi" / "deployment.yaml").read_text(encoding="utf-8")
    code, out, err = run(capsys, "--image", IMAGE, str(DRIVERS / "hpe-cosi"))
    assert code == 0, err
    assert "driver hpe-cosi-driver (by the kubectl.kubernetes.io/default-container" in err
    pod = pods(out)["hpe-cosi-provisioner"]
    assert proxy_flags(pod.container("plugproxy"))["--spec"] == "auto"

    def injected(text: str, *args: str) -> tuple[int, str, str]:
        path = tmp_path / "deployment.yaml"
        path.write_text(text, encoding="utf-8")
        return run(capsys, "--image", IMAGE, *args, str(path))

    # Without the annotation, which of the two serves the default socket is the user's to say.
    marked = "        kubectl.kubernetes.io/default-container: hpe-cosi-driver\n"
    unmarked = source.replace("      annotations:\n" + marked, "")
    assert unmarked != source
    code, out, err = injected(unmarked)
    assert code == 2 and "hpe-cosi-driver, hpe-cosi-provisioner-sidecar" in err
    code, out, err = injected(unmarked, "--driver-container=hpe-cosi-driver")
    assert code == 0 and pods(out)["hpe-cosi-provisioner"].container("plugproxy")
    # The flag outranks the annotation.
    sidecar_marked = source.replace(
        marked, marked.replace("hpe-cosi-driver", "hpe-cosi-provisioner-sidecar")
    )
    code, out, err = injected(sidecar_marked, "--driver-container=hpe-cosi-driver")
    assert code == 0 and "driver hpe-cosi-driver;" in err


def test_a_cosi_endpoint_socket_is_decoded_by_its_package(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """COSI_ENDPOINT names the socket of COSI v0.1 and v0.2 binaries alike: --spec=auto."""
    fixtures = DRIVERS.parent
    code, out, err = run(
        capsys,
        "--image",
        IMAGE,
        "--driver-container=cosi-driver",
        str(fixtures / "ambiguous-cosi.yaml"),
    )
    assert code == 0, err
    assert proxy_flags(pods(out)["acme-cosi"].container("plugproxy"))["--spec"] == "auto"
