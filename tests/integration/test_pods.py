"""Injected pods played by `podman kube play`, the kubelet of these tests.

Driver-shaped manifests (tests/fixtures/pods/) go through `plugproxy inject` as a user
runs it, and the shipped examples in deploy/ as they are; the project's image plays the
driver (the fake plugin), the registrar (the fake registrar) and the other CO sidecars.
All pods start in one pass, then each is checked from the host: a call through the
CO-side socket (or address) reaches the fake plugin, the admin server answers, the other
containers run as their manifest says and were not changed, and stopping the pod drains
the proxy (exit 0, socket removed). One pod's driver starts 5 s late: its registrar,
started at once, must still register at the first try; the same pod with a proxy that
listens at once must see the registrar fail.

What podman 4.3 does unlike a kubelet is bridged here, never in what inject wrote: the
template is played as a Pod restarted OnFailure, hostPath directories move under a
temporary root, each emptyDir gets a name of its own and a kubelet's mode 0777, each
containerPort a free hostPort (none on hostNetwork), and annotation values over 63
characters are left out (`for_podman`, `played`). Probes never run under podman here, so
the test calls the endpoints.
"""

from __future__ import annotations

import asyncio
import copy
import functools
import json
import os
import pathlib
import secrets
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import pytest
import yaml

from plugproxy.cli.inject import DEFAULT_IMAGE as IMAGE
from plugproxy.cli.inject import VIOLATIONS_FILE
from plugproxy.fakes import SpecClient
from tests.support import built_image, free_port

ROOT = pathlib.Path(__file__).resolve().parents[2]
RUN = secrets.token_hex(3)  # pods and volumes of one run never meet another run's
READY_TIMEOUT = 60.0  # 11 pods starting at once on two cores
IDLE = [
    "python",
    "-c",
    "import signal, sys; signal.signal(signal.SIGTERM, lambda *_: sys.exit(0)); signal.pause()",
]
INFO_METHOD = {
    "csi.v1": "GetPluginInfo",
    "cosi.v1alpha1": "DriverGetInfo",
    "cmi.v1": "GetPluginInfo",
}

# The first test waits for `make image`: a cold build (bases included) takes minutes.
pytestmark = pytest.mark.timeout(600)


@dataclass(frozen=True)
class Layout:
    name: str
    source: str  # relative to the repository
    spec: str
    plugin_name: str  # what the driver's fake answers, so a call proves it got there
    driver: str = "driver"
    registrars: tuple[str, ...] = ()  # fake registrars, which log "registered"
    inject: tuple[str, ...] = ()  # more `plugproxy inject` flags
    # Shipped examples: container -> the command of the fake replacing the real binary.
    fakes: dict[str, list[str]] = field(default_factory=dict)
    early: bool = False  # the negative control: the registrar must fail
    driver_args: tuple[str, ...] = ()  # appended to the played driver's args

    @property
    def shipped(self) -> bool:
        return self.source.startswith("deploy/")

    @property
    def pod(self) -> str:
        return f"pp{RUN}-{self.name}"


def _registrar(address: str) -> list[str]:
    return ["plugproxy", "fake-registrar", f"--csi-address={address}", "--stay"]


LAYOUTS = [
    Layout(
        "node",
        "tests/fixtures/pods/csi-node.yaml",
        "csi.v1",
        "node.csi.example.com",
        registrars=("node-driver-registrar", "liveness-probe"),
    ),
    Layout(
        "hostnet",
        "tests/fixtures/pods/csi-node-hostnetwork.yaml",
        "csi.v1",
        "hostnet.csi.example.com",
        registrars=("node-driver-registrar",),
    ),
    Layout(
        "controller",
        "tests/fixtures/pods/csi-controller.yaml",
        "csi.v1",
        "controller.csi.example.com",
        registrars=("csi-provisioner", "csi-attacher"),
    ),
    Layout(
        "default-socket",
        "tests/fixtures/pods/csi-default-socket.yaml",
        "csi.v1",
        "default.csi.example.com",
        registrars=("csi-provisioner",),
    ),
    Layout(
        "cosi-env",
        "tests/fixtures/pods/cosi-endpoint.yaml",
        "cosi.v1alpha1",
        "endpoint.cosi.example.com",
    ),
    Layout(
        "cosi-default",
        "tests/fixtures/pods/cosi-default.yaml",
        "cosi.v1alpha1",
        "default.cosi.example.com",
        inject=("--driver-container=driver",),
    ),
    Layout(
        "cmi",
        "tests/fixtures/pods/cmi.yaml",
        "cmi.v1",
        "provider.cmi.example.com",
        driver="provider",
    ),
    Layout(
        "deploy-node",
        "deploy/csi-node.yaml",
        "csi.v1",
        "example.csi.vendor.com",
        driver="example-csi-driver",
        registrars=("node-driver-registrar",),
        fakes={
            "example-csi-driver": [
                "plugproxy",
                "fake-plugin",
                "--spec=csi.v1",
                "--plugin-name=example.csi.vendor.com",
            ],
            "node-driver-registrar": _registrar("/csi/csi.sock"),
        },
    ),
    Layout(
        "deploy-cosi",
        "deploy/cosi-provisioner.yaml",
        "cosi.v1alpha1",
        "example.cosi.vendor.com",
        driver="example-cosi-driver",
        fakes={
            "example-cosi-driver": [
                "plugproxy",
                "fake-plugin",
                "--spec=cosi.v1alpha1",
                "--plugin-name=example.cosi.vendor.com",
            ],
            "objectstorage-provisioner-sidecar": IDLE,
        },
    ),
    Layout(
        "deploy-cmi",
        "deploy/cmi-plugin.yaml",
        "cmi.v1",
        "example.cmi.vendor.com",
        driver="example-machine-provider",
        fakes={
            "example-machine-provider": [
                "plugproxy",
                "fake-plugin",
                "--spec=cmi.v1",
                "--plugin-name=example.cmi.vendor.com",
            ],
            "machine-controller": IDLE,
        },
    ),
    Layout(
        "early",
        "tests/fixtures/pods/csi-node.yaml",
        "csi.v1",
        "node.csi.example.com",
        registrars=("node-driver-registrar", "liveness-probe"),
        inject=("--serve-arg=--listen-when=start",),
        early=True,
        # The registrar fails only if it calls before the plugin is up: 11 pods starting
        # at once on two cores once delayed it past 5 s.
        driver_args=("--start-delay=20s",),
    ),
]


# -- podman ----------------------------------------------------------------------------------


def podman(*args: str, check: bool = True, timeout: float = 60) -> str:
    done = subprocess.run(
        ["podman", *args], capture_output=True, text=True, timeout=timeout, check=False
    )
    if check and done.returncode != 0:
        raise AssertionError(f"podman {' '.join(args)}: exit {done.returncode}\n{done.stderr}")
    return done.stdout


def container_logs(container: str, tail: int = 20) -> str:
    """A container's stdout and stderr, for failure messages."""
    done = subprocess.run(
        ["podman", "logs", f"--tail={tail}", container],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=30,
        check=False,
    )
    return done.stdout


def inspect(*containers: str) -> dict[str, dict[str, Any]]:
    found = json.loads(podman("inspect", "--format=json", *containers))
    return {c["Name"]: c for c in found}


def node_address() -> str | None:
    """A non-loopback IPv4 address of this machine, if it has one."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("203.0.113.1", 9))  # TEST-NET-3: nothing is sent, a route is picked
        except OSError:
            return None
        address = str(s.getsockname()[0])
    return None if address.startswith("127.") else address


# -- manifests -------------------------------------------------------------------------------


def workload(docs: list[Any]) -> dict[str, Any]:
    (found,) = [d for d in docs if d and d.get("kind") in ("Pod", "Deployment", "DaemonSet")]
    return dict(found)


def pod_template(doc: dict[str, Any]) -> dict[str, Any]:
    if doc["kind"] == "Pod":
        return {"metadata": doc["metadata"], "spec": doc["spec"]}
    return dict(doc["spec"]["template"])


def containers(spec: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in spec["containers"]}


def inject(layout: Layout) -> tuple[str, str]:
    """The source and what `plugproxy inject` makes of it, as a user runs it."""
    source = (ROOT / layout.source).read_text()
    done = subprocess.run(
        [sys.executable, "-m", "plugproxy", "inject", f"--image={IMAGE}", *layout.inject, "-"],
        input=source,
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    assert done.returncode == 0, f"{layout.source}: inject failed\n{done.stderr}"
    return source, done.stdout


def for_podman(layout: Layout, injected: str, host_root: pathlib.Path) -> dict[str, Any]:
    """The injected workload as the Pod podman plays, bridging what podman does unlike a
    kubelet (module docstring); for shipped examples, fakes in the real binaries' places."""
    template = copy.deepcopy(pod_template(workload(list(yaml.safe_load_all(injected)))))
    meta = template.get("metadata") or {}
    meta["name"] = layout.pod
    # podman refuses longer annotation values (plugproxy.io/injected is one).
    meta["annotations"] = {
        k: v for k, v in (meta.get("annotations") or {}).items() if len(str(v)) <= 63
    }
    spec = template["spec"]
    # podman applies Always to init containers too, so a run-once init container never
    # ends; OnFailure still restarts a sidecar that exits 1.
    spec["restartPolicy"] = "OnFailure"
    everyone = spec["containers"] + spec.get("initContainers", [])
    renamed = {}
    for volume in spec.get("volumes", []):
        if "hostPath" in volume and volume["hostPath"]["path"] != "/dev":  # runc needs /dev
            path = host_root / layout.name / volume["hostPath"]["path"].lstrip("/")
            path.mkdir(parents=True, exist_ok=True)
            volume["hostPath"]["path"] = str(path)
        elif "emptyDir" in volume:
            # podman names the volume after the emptyDir and shares it by that name.
            renamed[volume["name"]] = volume["name"] = f"{layout.pod}-{volume['name']}"
    for container in everyone:
        for mount in container.get("volumeMounts", []):
            mount["name"] = renamed.get(mount["name"], mount["name"])
        if container["image"].rsplit("/", 1)[-1].startswith("plugproxy:"):
            container["image"] = IMAGE
        if container["name"] == layout.driver:
            container["args"] = [*container.get("args", []), *layout.driver_args]
        if container["name"] in layout.fakes:
            container["image"] = IMAGE
            container["command"] = layout.fakes[container["name"]]
            container.pop("args", None)
            # podman has no fieldRef: spec.nodeName, and no Secret to take variables from.
            container["env"] = [e for e in container.get("env", []) if "valueFrom" not in e]
            container.pop("envFrom", None)
        if spec.get("hostNetwork"):
            # podman takes no port list on the host's network; the ports are the node's.
            container.pop("ports", None)
        else:
            for port in container.get("ports", []):
                # podman publishes every containerPort on the host, so pods would collide.
                port["hostPort"] = free_port()
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


# -- the proxy container's settings, read from the played pod --------------------------------


def setting(container: dict[str, Any], flag: str, variable: str) -> str:
    for arg in container.get("args", []):
        if arg.startswith(f"--{flag}="):
            return str(arg.split("=", 1)[1])
    for env in container.get("env", []):
        if env["name"] == variable:
            return str(env["value"])
    raise AssertionError(f"plugproxy container sets neither --{flag} nor {variable}")


def volume_dir(pod: dict[str, Any], container: dict[str, Any], path: str) -> pathlib.Path:
    """Where `path` of a container's mounts is on the host."""
    for mount in container["volumeMounts"]:
        if path == mount["mountPath"] or path.startswith(mount["mountPath"].rstrip("/") + "/"):
            rest = path[len(mount["mountPath"]) :].lstrip("/")
            (volume,) = [v for v in pod["spec"]["volumes"] if v["name"] == mount["name"]]
            if "hostPath" in volume:
                base = pathlib.Path(volume["hostPath"]["path"])
            else:
                base = pathlib.Path(
                    podman("volume", "inspect", "--format={{.Mountpoint}}", volume["name"]).strip()
                )
            return base / rest
    raise AssertionError(f"{path} is on no volume of the plugproxy container")


@dataclass
class Played:
    layout: Layout
    source: str
    injected: str
    pod: dict[str, Any]
    file: pathlib.Path

    @property
    def proxy(self) -> dict[str, Any]:
        return containers(self.pod["spec"])["plugproxy"]

    def name(self, container: str) -> str:
        return f"{self.layout.pod}-{container}"

    @property
    def listen(self) -> str:
        return setting(self.proxy, "listen", "PLUGPROXY_LISTEN")

    def socket_path(self) -> pathlib.Path:
        path = self.listen.removeprefix("unix://")
        return volume_dir(self.pod, self.proxy, path)

    def admin_url(self) -> str:
        host, port = setting(self.proxy, "admin-listen", "PLUGPROXY_ADMIN_LISTEN").rsplit(":", 1)
        if self.pod["spec"].get("hostNetwork"):
            assert host == "127.0.0.1", "hostNetwork admin must stay on the node's loopback"
            return f"http://127.0.0.1:{port}"
        published = podman("port", self.name("plugproxy"), f"{port}/tcp").split()
        assert published, f"podman published no port for the admin port {port}"
        return f"http://127.0.0.1:{published[0].rsplit(':', 1)[1]}"


@pytest.fixture(scope="module")
def played() -> Iterator[dict[str, Played]]:
    built_image()
    host_root = pathlib.Path(tempfile.mkdtemp(prefix="pods-"))  # short: socket paths
    with ThreadPoolExecutor(4) as pool:
        injected = list(pool.map(inject, LAYOUTS))
    pods = {}
    for layout, (source, output) in zip(LAYOUTS, injected, strict=True):
        pod = for_podman(layout, output, host_root)
        file = host_root / f"{layout.name}.yaml"
        file.write_text(yaml.safe_dump(pod, sort_keys=False))
        pods[layout.name] = Played(layout, source, output, pod, file)
    volumes = [
        v["name"] for p in pods.values() for v in p.pod["spec"]["volumes"] if "emptyDir" in v
    ]
    try:
        for volume in volumes:
            # A kubelet makes an emptyDir 0777; podman's volume would be 0755 and owned by
            # whichever container mounts it first, so a non-root driver could not listen.
            podman("volume", "create", volume)
            mountpoint = podman("volume", "inspect", "--format={{.Mountpoint}}", volume)
            os.chmod(mountpoint.strip(), 0o777)
        started = [
            subprocess.Popen(
                ["podman", "kube", "play", str(p.file)],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
            for p in pods.values()
        ]
        # Every play ends before any failure is raised, so the cleanup meets no half pod.
        errors = [proc.communicate(timeout=120)[1] for proc in started]
        for p, proc, err in zip(pods.values(), started, errors, strict=True):
            assert proc.returncode == 0, f"kube play {p.layout.name}: {err}"
        yield pods
    finally:
        with ThreadPoolExecutor(4) as pool:
            list(
                pool.map(lambda p: podman("kube", "down", str(p.file), check=False), pods.values())
            )
        if volumes:
            podman("volume", "rm", "--force", *volumes, check=False)
        shutil.rmtree(host_root, ignore_errors=True)


# -- checks ----------------------------------------------------------------------------------


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=3) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()
    except OSError as exc:
        return 0, str(exc)


def wait_for(
    what: str, predicate: Any, timeout: float = READY_TIMEOUT, container: str = ""
) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(
                f"not within {timeout:.0f} s: {what}\n{container_logs(container) if container else ''}"
            )
        time.sleep(0.25)


def log_events(container: str) -> list[str]:
    events = []
    for line in podman("logs", container).splitlines():
        if line.startswith("{"):
            events.append(json.loads(line).get("event", ""))
    return events


def counted(admin: str, method: str) -> bool:
    return any(
        line.startswith("plugproxy_rpc_duration_seconds_count") and method in line
        for line in get(admin + "/metrics")[1].splitlines()
    )


def calls_in_flight(admin: str) -> bool:
    """The proxy counts a call in flight (so a stop now must drain it, not refuse it)."""
    for line in get(admin + "/metrics")[1].splitlines():
        if line.startswith("plugproxy_rpc_in_flight{") and float(line.rsplit(" ", 1)[1]) > 0:
            return True
    return False


def registered(container: str) -> bool:
    return "registered" in log_events(container)


async def plugin_name(played: Played) -> str:
    method = INFO_METHOD[played.layout.spec]
    if played.listen.startswith("unix://"):
        async with SpecClient("unix:" + str(played.socket_path()), played.layout.spec) as c:
            return str((await c.call(method)).name)
    # A TCP address on the pod's loopback: called from the CO's container, as the CO would.
    co_side = [
        n for n in containers(played.pod["spec"]) if n not in ("plugproxy", played.layout.driver)
    ]
    script = (
        "import asyncio, sys\n"
        "from plugproxy.fakes import SpecClient\n"
        "async def main():\n"
        "    async with SpecClient(sys.argv[1], sys.argv[2]) as c:\n"
        "        print((await c.call(sys.argv[3])).name)\n"
        "asyncio.run(main())\n"
    )
    target = played.listen.removeprefix("tcp://")
    out = await asyncio.to_thread(
        podman,
        "exec",
        played.name(co_side[0]),
        "python",
        "-c",
        script,
        target,
        played.layout.spec,
        method,
    )
    return out.strip()


def check_untouched(played: Played) -> None:
    """inject adds the proxy and moves only the driver's socket mount or address."""
    if played.layout.shipped:
        assert played.injected == played.source, "inject changed a manifest that has plugproxy"
        return
    before = containers(pod_template(workload(list(yaml.safe_load_all(played.source))))["spec"])
    after = containers(pod_template(workload(list(yaml.safe_load_all(played.injected))))["spec"])
    assert set(after) == set(before) | {"plugproxy"}
    for name, original in before.items():
        if name == played.layout.driver:
            for key in ("image", "command", "args", "securityContext"):
                assert after[name].get(key) == original.get(key), f"driver's {key} changed"
        else:
            assert after[name] == original, f"inject changed container {name}"


def check_prepared(pod: dict[str, Any], init: dict[str, Any]) -> None:
    """A `prepare-dir DIR --owner=UID:GID --mode=MODE` init container left DIR so (podman
    removes init containers once they ran, so their exit status cannot be read)."""
    command = init.get("command", []) + init.get("args", [])
    assert "prepare-dir" in command, f"unexpected init container {init['name']}"
    directory = command[command.index("prepare-dir") + 1]
    flags = dict(a.removeprefix("--").split("=", 1) for a in command if a.startswith("--"))
    found = volume_dir(pod, init, directory).stat()
    uid, gid = flags["owner"].split(":")
    assert (found.st_uid, found.st_gid) == (int(uid), int(gid)), f"{directory} owner"
    assert stat.S_IMODE(found.st_mode) == int(flags["mode"], 8), f"{directory} mode"


@pytest.mark.parametrize("layout", [x for x in LAYOUTS if not x.early], ids=lambda x: x.name)
async def test_played_pod(layout: Layout, played: dict[str, Played]) -> None:
    p = played[layout.name]
    check_untouched(p)
    admin = p.admin_url()
    await asyncio.to_thread(
        wait_for,
        f"{layout.pod}: /readyz 200",
        lambda: get(admin + "/readyz")[0] == 200,
        container=p.name("plugproxy"),
    )
    assert get(admin + "/healthz")[0] == 200
    address = node_address()
    if p.pod["spec"].get("hostNetwork") and address:
        # On the host's network the admin port must stay off the node's addresses.
        port = admin.rsplit(":", 1)[1]
        assert get(f"http://{address}:{port}/healthz")[0] == 0, "admin port open on the node"
    assert await plugin_name(p) == layout.plugin_name
    assert get(admin + "/metrics")[0] == 200
    # The proxy counts a call once its status is sent, a moment after the client has it.
    await asyncio.to_thread(
        wait_for,
        f"plugproxy_ metrics of {INFO_METHOD[layout.spec]}",
        functools.partial(counted, admin, INFO_METHOD[layout.spec]),
        5,
    )

    # Registered at the first try: a failed GetPluginInfo would have restarted it.
    for registrar in layout.registrars:
        await asyncio.to_thread(
            wait_for,
            f"{registrar} registered",
            functools.partial(registered, p.name(registrar)),
            container=p.name(registrar),
        )
    spec = p.pod["spec"]
    for init in spec.get("initContainers", []):
        check_prepared(p.pod, init)
    states = inspect(*(p.name(c) for c in containers(spec)))
    for name in containers(spec):
        state = states[p.name(name)]
        assert state["State"]["Status"] == "running", f"{name}: {state['State']}"
        assert state["RestartCount"] == 0, f"{name} restarted: {container_logs(p.name(name))}"

    # The violation record (inject's flag, the shipped manifests' variable) is kept in the
    # proxy's /tmp emptyDir, and `plugproxy report --file` reads it there as the docs say.
    out = await asyncio.to_thread(
        podman,
        "exec",
        p.name("plugproxy"),
        "plugproxy",
        "report",
        "--file",
        VIOLATIONS_FILE,
        "--format=json",
    )
    assert [run["mode"] for run in json.loads(out)["runs"]] == ["audit"]

    # SIGTERM to the whole pod; a call in flight (the controller's GetCapacity takes 1 s)
    # must still complete.
    in_flight = None
    if layout.name == "controller":
        client = SpecClient("unix:" + str(p.socket_path()), layout.spec)
        in_flight = asyncio.create_task(client.call("GetCapacity"))
        await asyncio.to_thread(
            wait_for, "GetCapacity in flight", functools.partial(calls_in_flight, admin), 5
        )
        assert not in_flight.done(), "GetCapacity was over before the pod stopped"
    await asyncio.to_thread(podman, "pod", "stop", "--time=15", layout.pod)
    if in_flight is not None:
        await in_flight
        await client.close()
    proxy = inspect(p.name("plugproxy"))[p.name("plugproxy")]
    assert proxy["State"]["ExitCode"] == 0, container_logs(p.name("plugproxy"))
    if p.listen.startswith("unix://"):
        assert not p.socket_path().exists(), "the proxy left its socket behind"


async def test_registrar_fails_when_the_proxy_listens_early(played: dict[str, Played]) -> None:
    """The negative control: with --listen-when=start the registrar meets a socket whose
    plugin is not there yet and exits 1, as it would in a cluster."""
    p = played["early"]
    registrar = p.name("node-driver-registrar")
    await asyncio.to_thread(
        wait_for,
        f"the registrar failed once; plugproxy said:\n{container_logs(p.name('plugproxy'))}",
        lambda: "GetPluginInfo failed; exiting" in log_events(registrar),
        30,
        container=registrar,
    )
    # Exited 1, and the pod's restart policy started it again.
    assert inspect(registrar)[registrar]["RestartCount"] >= 1
