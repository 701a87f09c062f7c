"""`plugproxy inject`: manifests in the shapes real drivers ship, injected, validated against
the Kubernetes API schema, wired container by container, idempotent and reversible byte for
byte; ambiguous workloads refused with nothing written.
"""

from __future__ import annotations

import copy
import difflib
import io
import pathlib
import posixpath
import re
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

import kubernetes_validate
import pytest
import yaml

from plugproxy.cli import inject, serve
from plugproxy.cli import main as cli
from plugproxy.core import options
from plugproxy.core.options import duration

ROOT = pathlib.Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "inject"
DEPLOY = ROOT / "deploy"
IMAGE = "registry.example.com/plugproxy:0.1.0"
# Oldest supported, a middle one and the newest the schema bundle knows.
K8S_VERSIONS = ("1.30", "1.33", kubernetes_validate.latest_version())
INJECTABLE = sorted(p.name for p in FIXTURES.glob("*.yaml") if not p.name.startswith("ambiguous"))
ARG_VAR = re.compile(r"\$\((\w+)\)")
# Flags and variables that name a plugin address, for reading the wiring back.
ADDRESS_FLAGS = ("--csi-address", "--endpoint", "--csi-endpoint", "--listen")
ADDRESS_ENV = ("CSI_ENDPOINT", "COSI_ENDPOINT", "CMI_ENDPOINT")
# Each fixture's plugin socket: the driver container and the CO-side containers dialling it.
EXPECTED = {
    "csi-node-env.yaml": {"acme-csi-node": ("acme", {"registrar", "liveness-probe"})},
    "csi-controller-flag.yaml": {
        "acme-csi-controller": (
            "driver",
            {"csi-provisioner", "csi-attacher", "csi-resizer", "csi-snapshotter"},
        )
    },
    "cosi.yaml": {"acme-cosi": ("cosi-driver", {"objectstorage-provisioner-sidecar"})},
    "cmi.yaml": {"acme-machines": ("provider", {"machine-controller"})},
    "helm-rendered.yaml": {"acme-csi-node": ("node", set())},
    "pod-list.yaml": {"hostpath-csi": ("hostpath", {"csi-provisioner"})},
    "job-without-template-metadata.yaml": {"j": ("driver", {"client"})},
    "kustomize-built.yaml": {"acme-csi-controller": ("driver", {"csi-provisioner"})},
    "csi-node-distroless.yaml": {"lean-csi-node": ("lean", {"node-driver-registrar"})},
    "csi-node-nonroot.yaml": {"info-csi-node": ("info-driver", {"registrar"})},
}
# Who plugproxy runs as, by what each driver states: its UID and capabilities, and whether
# a root-owned host directory must first be given to its group.
DAC = {"drop": ["ALL"], "add": ["DAC_OVERRIDE"]}
NONE = {"drop": ["ALL"]}
IDENTITY = {
    "csi-node-env.yaml": (0, DAC, False),  # no runAsUser: the image's user, nearly always root
    "csi-node-distroless.yaml": (0, DAC, False),
    "csi-node-nonroot.yaml": (1001, NONE, True),  # the driver's own user
    "csi-controller-flag.yaml": (65532, NONE, False),
    "cosi.yaml": (0, DAC, False),
    "cmi.yaml": (65532, NONE, False),  # TCP: no socket file to reach
    "helm-rendered.yaml": (0, DAC, False),
    "pod-list.yaml": (0, DAC, False),
    "job-without-template-metadata.yaml": (0, DAC, False),
    "kustomize-built.yaml": (0, DAC, False),
}
LEGACY = FIXTURES / "earlier" / "csi-node-env.wrapped.yaml"  # injected with a umask wrapper
# Injected when the init container ran `/bin/sh -c "mkdir ... && chown ... && chmod ..."`.
LEGACY_PREPARE = FIXTURES / "earlier" / "csi-node-nonroot.shell-prepare.yaml"


def run(
    capsys: pytest.CaptureFixture[str], *args: str, stdin: str | None = None
) -> tuple[int, str, str]:
    with pytest.MonkeyPatch.context() as mp:
        if stdin is not None:
            mp.setattr("sys.stdin", io.StringIO(stdin))
        code = cli.main(["inject", *args])
    out, err = capsys.readouterr()
    return code, out, err


def injected_text(capsys: pytest.CaptureFixture[str], name: str, *extra: str) -> str:
    code, out, err = run(capsys, "--image", IMAGE, *extra, str(FIXTURES / name))
    assert code == 0, err
    return out


# ------------------------------------------------------------------------ reading it back


@dataclass
class Pod:
    name: str
    spec: dict[str, Any]
    annotations: dict[str, str]

    def container(self, name: str) -> dict[str, Any]:
        return next(c for c in self.spec["containers"] if c["name"] == name)

    def volume(self, name: str) -> dict[str, Any]:
        return next(v for v in self.spec["volumes"] if v["name"] == name)

    def mounters(self, volume: str) -> set[str]:
        return {
            c["name"]
            for c in self.spec["containers"]
            if any(m["name"] == volume for m in c.get("volumeMounts", []))
        }


def pods(text: str) -> dict[str, Pod]:
    found = {}
    for doc in yaml.safe_load_all(text):
        for item in doc.get("items", [doc]) if doc else []:
            if item["kind"] == "Pod":
                meta, spec = item["metadata"], item["spec"]
            elif "template" in item.get("spec", {}):
                template = item["spec"]["template"]
                meta, spec = template.get("metadata", {}), template["spec"]
            else:
                continue
            found[item["metadata"]["name"]] = Pod(
                item["metadata"]["name"], spec, meta.get("annotations") or {}
            )
    return found


def env_of(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: str(e["value"]) for e in container.get("env", []) if "value" in e}


def addresses(container: dict[str, Any]) -> list[str]:
    """Plugin addresses a container is given, $(VAR) expanded as kubelet does."""
    env = env_of(container)
    found = [v for k, v in env.items() if k in ADDRESS_ENV]
    words = [
        ARG_VAR.sub(lambda m: env.get(m[1], m[0]), w)
        for w in [*container.get("command", []), *container.get("args", [])]
    ]
    for i, word in enumerate(words):
        flag, sep, value = word.partition("=")
        if flag in ADDRESS_FLAGS:
            found.append(value if sep else words[i + 1])
    return found


def where(container: dict[str, Any], address: str) -> tuple[str, str]:
    """(volume, path inside it) of a unix address, or ("tcp", port)."""
    if not address.startswith(("unix:", "/")):
        return ("tcp", address.rpartition(":")[2])
    path = "/" + address.removeprefix("unix:").lstrip("/")
    mounts = [
        m
        for m in container.get("volumeMounts", [])
        if (path + "/").startswith(m["mountPath"].rstrip("/") + "/")
    ]
    assert mounts, f"{container['name']}: {address} is on no volume"
    mount = max(mounts, key=lambda m: len(m["mountPath"]))
    return mount["name"], posixpath.relpath(path, mount["mountPath"])


def proxy_flags(container: dict[str, Any]) -> dict[str, str]:
    return dict(w.partition("=")[::2] for w in container["args"][1:] if w.startswith("--"))


# ------------------------------------------------------------------------ the result


@pytest.mark.parametrize("name", INJECTABLE)
def test_injected_output_validates_against_several_kubernetes_versions(
    name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    text = injected_text(capsys, name, "--driver-container", "cosi-driver")
    docs = [d for d in yaml.safe_load_all(text) if d]
    for version in K8S_VERSIONS:
        for doc in docs:
            for item in doc["items"] if doc["kind"] == "List" else [doc]:
                kubernetes_validate.validate(item, version, strict=True)


@pytest.mark.parametrize("name", INJECTABLE)
def test_socket_wiring_container_by_container(
    name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    source = (FIXTURES / name).read_text(encoding="utf-8")
    before = pods(source)
    after = pods(injected_text(capsys, name))
    assert set(before) == set(after)
    for pod_name, (driver_name, co_side) in EXPECTED[name].items():
        old, new = before[pod_name], after[pod_name]
        proxy = new.container("plugproxy")
        flags = proxy_flags(proxy)
        listen, upstream = flags["--listen"], flags["--upstream"]
        old_driver, driver = old.container(driver_name), new.container(driver_name)
        # plugproxy listens exactly where the driver used to be reached...
        assert where(proxy, listen) == where(old_driver, addresses(old_driver)[0])
        # ... the driver now serves plugproxy's upstream ...
        assert {where(driver, a) for a in addresses(driver)} == {where(proxy, upstream)}
        # ... and every CO-side container is untouched and dials plugproxy.
        for co_name in co_side:
            assert new.container(co_name) == old.container(co_name)
            for address in addresses(new.container(co_name)):
                assert where(new.container(co_name), address) == where(proxy, listen)
        # Nothing else in the pod changed in the other containers.
        others = {c["name"] for c in old.spec["containers"]} - {driver_name}
        for other in others:
            assert new.container(other) == old.container(other)
        if listen.startswith("unix:"):
            inner, _ = where(proxy, upstream)
            outer, _ = where(proxy, listen)
            assert inner != outer
            assert new.mounters(inner) == {"plugproxy", driver_name}
            assert "emptyDir" in new.volume(inner)
            # The driver keeps its flags and variables: only its mount moved.
            assert env_of(driver) == env_of(old_driver)
            assert driver.get("args") == old_driver.get("args")
            assert new.spec["securityContext"]["fsGroup"] == proxy["securityContext"]["runAsGroup"]
        else:
            assert listen.startswith("tcp://127.0.0.1:") and upstream.startswith("tcp://127.0.0.1:")
            assert "--insecure-tcp" in proxy["args"]


def test_node_plugin_registration_path_names_the_proxy_socket_on_the_host(
    capsys: pytest.CaptureFixture[str],
) -> None:
    pod = pods(injected_text(capsys, "csi-node-env.yaml"))["acme-csi-node"]
    proxy, registrar = pod.container("plugproxy"), pod.container("registrar")
    volume, rel = where(proxy, proxy_flags(proxy)["--listen"])
    env = env_of(registrar)
    host_path = env["DRIVER_REG_SOCK_PATH"]
    assert host_path == posixpath.join(pod.volume(volume)["hostPath"]["path"], rel)
    # A root proxy creates its socket in the root-owned host directory as it is.
    assert "initContainers" not in pod.spec


def test_a_socket_on_the_node_waits_for_a_draining_predecessor(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A hostPath socket outlives its pod: in a DaemonSet update the new proxy may start
    while the old one drains, so it waits for the path (up to the pod's grace) instead of
    exiting. An emptyDir socket belongs to its pod alone: nothing to wait for."""
    node = pods(injected_text(capsys, "csi-node-env.yaml"))["acme-csi-node"]
    assert proxy_flags(node.container("plugproxy"))["--listen-wait"] == "30s"
    controller = pods(injected_text(capsys, "csi-controller-flag.yaml"))["acme-csi-controller"]
    assert "--listen-wait" not in proxy_flags(controller.container("plugproxy"))


def test_a_non_root_proxy_gets_the_host_directory_first(
    capsys: pytest.CaptureFixture[str],
) -> None:
    pod = pods(injected_text(capsys, "csi-node-nonroot.yaml"))["info-csi-node"]
    volume, _ = where(pod.container("plugproxy"), "/run/csi/csi.sock")
    (prepare,) = pod.spec["initContainers"]
    assert prepare["volumeMounts"][0] == {"name": volume, "mountPath": "/run/csi"}
    # plugproxy's own subcommand: the image has no shell.
    assert "command" not in prepare
    assert prepare["args"] == ["prepare-dir", "/run/csi", "--owner=0:65532", "--mode=0770"]
    assert prepare["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["CHOWN"]}


@pytest.mark.parametrize("name", sorted(n for n in INJECTABLE if n != "cmi.yaml"))
def test_the_driver_container_keeps_every_byte_but_its_socket_mount_name(
    name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    source = (FIXTURES / name).read_text(encoding="utf-8")
    code, out, err = run(capsys, "--image", IMAGE, str(FIXTURES / name))
    assert code == 0, err
    # No warning about how the driver starts: nothing about it changes.
    assert "command" not in err and "umask" not in err
    # Every line of the input is still there, but one: the driver's mount of the socket
    # directory, now naming the private emptyDir. Its command, args, user: as they were.
    lines = difflib.ndiff(source.splitlines(), out.splitlines())
    removed = [line[2:] for line in lines if line.startswith("- ")]
    (pod_name, (driver_name, _)), *_ = EXPECTED[name].items()
    old_driver = pods(source)[pod_name].container(driver_name)
    driver = pods(out)[pod_name].container(driver_name)
    (old_mount,) = [m for m in old_driver["volumeMounts"] if m not in driver["volumeMounts"]]
    assert len(removed) == 1 and old_mount["name"] in removed[0], removed
    moved = [m for m in driver["volumeMounts"] if m["name"] == inject.INNER_VOLUME]
    assert moved == [{**old_mount, "name": inject.INNER_VOLUME}]
    assert {k: v for k, v in driver.items() if k != "volumeMounts"} == {
        k: v for k, v in old_driver.items() if k != "volumeMounts"
    }


@pytest.mark.parametrize("name", INJECTABLE)
def test_the_proxy_runs_as_the_drivers_user(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    uid, capabilities, prepares = IDENTITY[name]
    (pod_name, _), *_ = EXPECTED[name].items()
    pod = pods(injected_text(capsys, name))[pod_name]
    sc = pod.container("plugproxy")["securityContext"]
    assert sc["runAsUser"] == uid
    assert sc["runAsNonRoot"] is (uid != 0)
    assert sc["capabilities"] == capabilities
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    # Its socket's group is the pod's fsGroup, which every CO-side container has.
    assert sc["runAsGroup"] == pod.spec.get("securityContext", {}).get("fsGroup", 65532)
    names = [c["name"] for c in pod.spec.get("initContainers", [])]
    assert (inject.PREPARE in names) is prepares


def stated(container_sc: dict[str, Any] | None, pod_sc: dict[str, Any] | None) -> str:
    """pod-list.yaml's pod with the driver's user stated in its container or its pod."""
    doc = yaml.safe_load((FIXTURES / "pod-list.yaml").read_text())["items"][0]
    if container_sc is not None:
        doc["spec"]["containers"][0]["securityContext"] = container_sc
    if pod_sc is not None:
        doc["spec"]["securityContext"] = pod_sc
    return yaml.safe_dump(doc)


@pytest.mark.parametrize(
    ("stdin", "args", "uid", "capabilities"),
    [
        # Root stated: root owns the socket, no capability needed.
        (stated({"runAsUser": 0}, None), (), 0, NONE),
        (stated(None, {"runAsUser": 0}), (), 0, NONE),
        # The container's user wins over the pod's.
        (stated({"runAsUser": 2000}, {"runAsUser": 0}), (), 2000, NONE),
        (stated({"runAsUser": 0}, {"runAsUser": 2000}), (), 0, NONE),
        (stated(None, {"runAsUser": 3000, "fsGroup": 3000}), (), 3000, NONE),
        # --proxy-user overrides; root reaching another user's socket keeps DAC_OVERRIDE.
        (stated(None, None), ("--proxy-user=65532",), 65532, NONE),
        (stated({"runAsUser": 1001}, None), ("--proxy-user", "0"), 0, DAC),
        (stated({"runAsUser": 0}, None), ("--proxy-user=0",), 0, NONE),
    ],
)
def test_stated_users_and_the_override(
    stdin: str,
    args: tuple[str, ...],
    uid: int,
    capabilities: dict[str, list[str]],
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, err = run(capsys, *args, "-", stdin=stdin)
    assert code == 0, err
    pod = pods(out)["hostpath-csi"]
    sc = pod.container("plugproxy")["securityContext"]
    assert (sc["runAsUser"], sc["runAsNonRoot"], sc["capabilities"]) == (
        uid,
        uid != 0,
        capabilities,
    )
    assert sc["runAsGroup"] == pod.spec["securityContext"]["fsGroup"]
    code, removed, err = run(capsys, "--remove", "-", stdin=out)
    assert (code, removed) == (0, stdin), err


def test_proxy_user_over_a_host_directory_brings_the_init_container(
    capsys: pytest.CaptureFixture[str],
) -> None:
    text = injected_text(capsys, "csi-node-distroless.yaml", "--proxy-user=65532")
    pod = pods(text)["lean-csi-node"]
    assert pod.container("plugproxy")["securityContext"]["runAsUser"] == 65532
    assert [c["name"] for c in pod.spec["initContainers"]] == [inject.PREPARE]


def test_a_manifest_injected_with_the_umask_wrapper_still_removes_cleanly(
    capsys: pytest.CaptureFixture[str],
) -> None:
    text = LEGACY.read_text(encoding="utf-8")
    assert '"wrapped":true' in text and 'umask 0007 && exec "$0" "$@"' in text
    # Injected already: left as it is...
    code, out, err = run(capsys, "--image", IMAGE, "-", stdin=text)
    assert (code, out) == (0, text), err
    # ... and taken out, the driver's own command comes back, byte for byte.
    code, out, err = run(capsys, "--remove", "-", stdin=text)
    assert code == 0, err
    assert out == (FIXTURES / "csi-node-env.yaml").read_text(encoding="utf-8")


def test_a_manifest_injected_with_a_shell_init_container_still_removes_cleanly(
    capsys: pytest.CaptureFixture[str],
) -> None:
    text = LEGACY_PREPARE.read_text(encoding="utf-8")
    assert "- /bin/sh" in text and "name: plugproxy-prepare-socket-dir" in text
    code, out, err = run(capsys, "--remove", "-", stdin=text)
    assert code == 0, err
    assert out == (FIXTURES / "csi-node-nonroot.yaml").read_text(encoding="utf-8")


@pytest.mark.parametrize("name", INJECTABLE)
def test_proxy_container_probes_ports_grace_and_security(
    name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    source = pods((FIXTURES / name).read_text(encoding="utf-8"))
    for pod_name, pod in pods(injected_text(capsys, name)).items():
        if pod_name not in EXPECTED[name]:
            assert pod == source[pod_name]
            continue
        proxy = pod.container("plugproxy")
        flags = proxy_flags(proxy)
        # The args are ones `plugproxy serve` accepts and checks.
        serve.resolve(serve.parse_settings(proxy["args"][1:], environ={}))
        port = int(flags["--admin-listen"].rpartition(":")[2])
        # On hostNetwork the admin stays on the node's loopback, where kubelet probes it.
        host_network = pod.spec.get("hostNetwork", False)
        bind = "127.0.0.1" if host_network else "0.0.0.0"
        assert flags["--admin-listen"] == f"{bind}:{port}"
        assert proxy["ports"] == [
            {"name": "plugproxy-admin", "containerPort": port, "protocol": "TCP"}
        ]
        host = {"host": "127.0.0.1"} if host_network else {}
        assert proxy["livenessProbe"]["httpGet"] == {
            **host,
            "path": "/healthz",
            "port": "plugproxy-admin",
        }
        assert proxy["readinessProbe"]["httpGet"] == {
            **host,
            "path": "/readyz",
            "port": "plugproxy-admin",
        }
        for other in pod.spec["containers"]:
            if other is not proxy:
                assert port not in {p["containerPort"] for p in other.get("ports", [])}
                assert f"--health-port={port}" not in other.get("args", [])
        if host_network:  # Prometheus cannot reach the node's loopback
            assert not any(k.startswith("prometheus.io/") for k in pod.annotations)
        else:
            assert pod.annotations["prometheus.io/scrape"] == "true"
            assert pod.annotations["prometheus.io/port"] == str(port)
            assert pod.annotations["prometheus.io/path"] == "/metrics"
        grace = duration(flags["--shutdown-grace"])
        assert grace < pod.spec.get("terminationGracePeriodSeconds", 30)
        tmp = next(m for m in proxy["volumeMounts"] if m["mountPath"] == "/tmp")
        assert "emptyDir" in pod.volume(tmp["name"])
        assert {"cpu", "memory"} <= set(proxy["resources"]["requests"])
        assert proxy["image"] == IMAGE


def test_the_admin_port_avoids_the_livenessprobe_sidecar(
    capsys: pytest.CaptureFixture[str],
) -> None:
    pod = pods(injected_text(capsys, "csi-node-env.yaml"))["acme-csi-node"]
    assert proxy_flags(pod.container("plugproxy"))["--admin-listen"] == "0.0.0.0:9809"


def test_grace_follows_the_pods_termination_grace(capsys: pytest.CaptureFixture[str]) -> None:
    pod = pods(injected_text(capsys, "csi-controller-flag.yaml"))["acme-csi-controller"]
    assert proxy_flags(pod.container("plugproxy"))["--shutdown-grace"] == "55s"


def test_flags_reach_the_proxy(capsys: pytest.CaptureFixture[str]) -> None:
    text = injected_text(
        capsys,
        "csi-controller-flag.yaml",
        "--validation=enforce",
        "--serve-arg=--serialize=wait",
        "--serve-arg=--log-level=debug",
        "--spec=auto",
    )
    proxy = pods(text)["acme-csi-controller"].container("plugproxy")
    assert "--validation=enforce" in proxy["args"]
    assert "--spec=auto" in proxy["args"]
    assert proxy["args"][-2:] == ["--serialize=wait", "--log-level=debug"]


RECORD_FLAGS = ("--violations-file", "--violations-file-max-bytes")


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ((), (inject.VIOLATIONS_FILE, inject.VIOLATIONS_MAX_BYTES)),
        (("--validation=enforce",), (inject.VIOLATIONS_FILE, inject.VIOLATIONS_MAX_BYTES)),
        (("--serve-arg=--validation=off",), (None, None)),  # no record to keep
        # The user's own file: theirs alone, with their bound or serve's default.
        (("--serve-arg=--violations-file=/record/v.jsonl",), ("/record/v.jsonl", None)),
        (("--serve-arg=--violations-file-max-bytes=4MiB",), (inject.VIOLATIONS_FILE, "4MiB")),
    ],
)
def test_the_violation_record_is_kept_in_the_proxys_tmp_volume(
    extra: tuple[str, ...],
    expected: tuple[str | None, str | None],
    capsys: pytest.CaptureFixture[str],
) -> None:
    source = (FIXTURES / "csi-node-env.yaml").read_text(encoding="utf-8")
    code, out, err = run(capsys, "--image", IMAGE, *extra, "-", stdin=source)
    assert code == 0, err
    pod = pods(out)["acme-csi-node"]
    proxy = pod.container("plugproxy")
    for flag in RECORD_FLAGS:
        assert sum(w.partition("=")[0] == flag for w in proxy["args"]) <= 1, flag
    flags = proxy_flags(proxy)
    assert tuple(flags.get(f) for f in RECORD_FLAGS) == expected
    if expected[0] == inject.VIOLATIONS_FILE:
        # Directly on the emptyDir at /tmp (serve makes no directory), bounded within it.
        tmp = next(m for m in proxy["volumeMounts"] if m["mountPath"] == "/tmp")
        assert posixpath.dirname(inject.VIOLATIONS_FILE) == tmp["mountPath"]
        empty_dir = pod.volume(tmp["name"])["emptyDir"]
        bound = options.byte_size(flags["--violations-file-max-bytes"])
        assert bound <= options.byte_size(empty_dir["sizeLimit"]) // 2
    # --remove takes the record's flags away with the container.
    code, removed, err = run(capsys, "--remove", "-", stdin=out)
    assert (code, removed) == (0, source), err
    assert "violations" not in removed


def test_cmi_provider_moves_to_the_next_free_port(capsys: pytest.CaptureFixture[str]) -> None:
    pod = pods(injected_text(capsys, "cmi.yaml"))["acme-machines"]
    assert env_of(pod.container("provider"))["CMI_ENDPOINT"] == "tcp://127.0.0.1:8081"
    assert env_of(pod.container("machine-controller"))["CMI_ENDPOINT"] == "tcp://127.0.0.1:8080"
    assert proxy_flags(pod.container("plugproxy"))["--spec"] == "cmi.v1"


# ------------------------------------------------------------------------ bytes


@pytest.mark.parametrize("name", INJECTABLE)
def test_injecting_twice_changes_nothing(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    once = injected_text(capsys, name)
    code, twice, err = run(capsys, "--image", IMAGE, "-", stdin=once)
    assert code == 0, err
    assert twice == once


@pytest.mark.parametrize("name", INJECTABLE)
def test_remove_restores_the_original_byte_for_byte(
    name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    source = (FIXTURES / name).read_text(encoding="utf-8")
    once = injected_text(capsys, name)
    assert once != source
    code, removed, err = run(capsys, "--remove", "-", stdin=once)
    assert code == 0, err
    assert removed == source


def test_the_documents_own_sequence_style_is_kept(capsys: pytest.CaptureFixture[str]) -> None:
    # kustomize writes sequences flush with their key; the injected parts follow suit.
    text = injected_text(capsys, "kustomize-built.yaml")
    assert "      containers:\n      - name: plugproxy\n" in text
    assert (
        "        volumeMounts:\n        - mountPath: /csi\n          name: plugproxy-upstream\n"
        in text
    )


def test_documents_without_a_plugin_keep_their_bytes(capsys: pytest.CaptureFixture[str]) -> None:
    source = (FIXTURES / "helm-rendered.yaml").read_text(encoding="utf-8")
    before = inject.split_documents(source)
    after = inject.split_documents(injected_text(capsys, "helm-rendered.yaml"))
    assert len(before) == len(after) == 7
    changed = [i for i, (a, b) in enumerate(zip(before, after, strict=True)) if a != b]
    assert changed == [4]  # the driver's DaemonSet; the split registrar DaemonSet is CO side only
    # The edited document keeps its comments and its quoting.
    assert after[4].startswith("---\n# Source: acme-csi/templates/node.yaml\n# The driver alone;")
    assert '- "--nodeid=$(NODE_NAME)"' in after[4]


def test_already_injected_deploy_manifests_pass_through(capsys: pytest.CaptureFixture[str]) -> None:
    for path in sorted(DEPLOY.glob("c*.yaml")):
        code, out, err = run(capsys, str(path))
        assert code == 0, err
        assert out == path.read_text(encoding="utf-8"), path.name


def test_diff_and_in_place(capsys: pytest.CaptureFixture[str], tmp_path: pathlib.Path) -> None:
    target = tmp_path / "manifests" / "node.yaml"
    target.parent.mkdir()
    target.write_text((FIXTURES / "csi-node-env.yaml").read_text(encoding="utf-8"))
    (tmp_path / "manifests" / "notes.txt").write_text("not yaml")
    code, out, _ = run(capsys, "--diff", str(target.parent))
    assert code == 0
    assert out.startswith(f"--- a/{target}\n+++ b/{target}\n")
    assert "+        - name: plugproxy\n" in out
    assert "-            - name: plugin-dir\n+            - name: plugproxy-upstream\n" in out
    code, out, _ = run(capsys, "--in-place", "--image", IMAGE, str(target.parent))
    assert code == 0 and out == ""
    assert target.read_text() == injected_text(capsys, "csi-node-env.yaml")


def test_several_files_become_one_stream(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, str(FIXTURES / "cmi.yaml"), str(FIXTURES / "cosi.yaml"))
    assert code == 0
    assert [d["metadata"]["name"] for d in yaml.safe_load_all(out)] == [
        "acme-machines",
        "acme-cosi",
    ]


# ------------------------------------------------------------------------ refusals


def test_an_ambiguous_workload_is_refused_and_nothing_is_written(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, err = run(capsys, str(FIXTURES / "cmi.yaml"), str(FIXTURES / "ambiguous-cosi.yaml"))
    assert code == 2
    assert out == ""
    (line,) = err.strip().splitlines()
    assert "Deployment/cosi/acme-cosi" in line
    assert "cosi-driver, objectstorage-provisioner-sidecar" in line
    assert "--driver-container" in line
    # Said once which container it is, the same workload injects.
    code, out, err = run(
        capsys, "--driver-container=cosi-driver", str(FIXTURES / "ambiguous-cosi.yaml")
    )
    assert code == 0, err
    assert pods(out)["acme-cosi"].container("plugproxy")


def pod_doc(**changes: Any) -> str:
    doc = yaml.safe_load((FIXTURES / "pod-list.yaml").read_text())["items"][0]
    for path, value in changes.items():
        node = doc
        *parents, last = path.split("__")
        for part in parents:
            node = node[int(part)] if part.isdigit() else node[part]
        node[last] = value
    return yaml.safe_dump(doc)


@pytest.mark.parametrize(
    ("stdin", "args", "message"),
    [
        (
            pod_doc(
                spec__containers__0__volumeMounts=[
                    {"name": "socket-dir", "mountPath": "/csi", "mountPropagation": "Bidirectional"}
                ]
            ),
            (),
            "Pod/default/hostpath-csi: the socket of hostpath is in volume socket-dir",
        ),
        (pod_doc(), ("--serve-arg=--no-such-flag",), "--serve-arg: not accepted"),
        (pod_doc(), ("--serve-arg=--listen=unix:///x.sock",), "inject sets it"),
        (
            pod_doc(spec__terminationGracePeriodSeconds=10),
            ("--serve-arg=--shutdown-grace=20s",),
            "not below the pod's terminationGracePeriodSeconds (10)",
        ),
        (
            pod_doc(metadata__annotations={"plugproxy.io/driver-container": "nope"}),
            (),
            "plugproxy.io/driver-container='nope' names no container",
        ),
        ("kind: Pod\nspec:\n  containers: [unclosed\n", (), "stdin:4: not valid YAML: expected"),
        (pod_doc(), ("--proxy-user=root",), "--proxy-user 'root': expected a numeric UID"),
        (pod_doc(), ("--proxy-user=-1",), "--proxy-user '-1': expected a numeric UID"),
        (pod_doc(), ("--proxy-user=2147483648",), "expected a numeric UID, 0 to 2147483647"),
    ],
)
def test_bad_input_gets_one_line_and_exit_2(
    stdin: str, args: tuple[str, ...], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(capsys, *args, "-", stdin=stdin)
    assert code == 2
    assert out == ""
    assert len(err.strip().splitlines()) == 1
    assert message in err


def test_missing_path_is_an_error(
    capsys: pytest.CaptureFixture[str], tmp_path: pathlib.Path
) -> None:
    code, out, err = run(capsys, str(tmp_path / "nope.yaml"))
    assert (code, out) == (2, "")
    assert "no such file or directory" in err


WEB = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web  # a comment\nspec:\n  containers:\n  - name: nginx\n    image: nginx\n"


def beside_a_plugin(capsys: pytest.CaptureFixture[str], text: str) -> str:
    """Inject `text` and a plugin's manifest in one run: exit 0, `text` kept byte for
    byte at the head of the stream; stderr."""
    code, out, err = run(capsys, "--image", IMAGE, "-", str(FIXTURES / "cmi.yaml"), stdin=text)
    assert code == 0, err
    assert out.startswith(text if text.endswith("\n") else text + "\n")
    assert pods(out)["acme-machines"].container("plugproxy")
    return err


def test_a_pod_without_a_plugin_socket_passes_through(capsys: pytest.CaptureFixture[str]) -> None:
    err = beside_a_plugin(capsys, WEB)
    assert "Pod/web" not in err  # an ordinary workload: counted, not listed
    assert err.endswith("plugproxy inject: injected 1 of 2 workloads; 1 left unchanged\n")


def test_input_without_a_plugin_is_nothing_to_inject(capsys: pytest.CaptureFixture[str]) -> None:
    """Exit 1, nothing on stdout, one line saying how inject recognises a plugin; and the
    same answer from --remove on input with nothing to remove."""
    for args in ((), ("--diff",), ("--remove",)):
        code, out, err = run(capsys, *args, "-", stdin=WEB)
        assert (code, out) == (1, ""), args
        (line,) = err.splitlines()
        verb = "remove" if "--remove" in args else "inject"
        assert line.startswith(
            f"plugproxy inject: error: nothing to {verb}: none of the 1 workloads read runs a "
            "plugin; inject looks for a container given a plugin address (--endpoint, "
        ), line
        assert "--driver-container NAME" in line
    code, out, err = run(capsys, "-", stdin="apiVersion: v1\nkind: ConfigMap\n")
    assert (code, out) == (1, "")
    assert "nothing to inject: no workload (Deployment, DaemonSet, Pod, ...) in the input" in err


@pytest.mark.parametrize(
    "container",
    [
        # A metrics listener is not a plugin endpoint: nobody in the pod dials it.
        {"name": "web", "image": "web", "args": ["--endpoint=tcp://0.0.0.0:8080"]},
        # A client of a host socket that is not a plugin's.
        {
            "name": "agent",
            "image": "agent",
            "args": ["--endpoint=unix:///var/run/docker.sock"],
            "volumeMounts": [{"name": "run", "mountPath": "/var/run"}],
        },
        # A CSI endpoint nobody can reach: the container's own emptyDir.
        {
            "name": "lonely",
            "image": "lonely",
            "env": [{"name": "CSI_ENDPOINT", "value": "unix:///csi/csi.sock"}],
            "volumeMounts": [{"name": "scratch", "mountPath": "/csi"}],
        },
    ],
    ids=["tcp-listener", "host-socket-client", "unreachable"],
)
def test_look_alike_endpoints_are_not_plugins(
    container: dict[str, Any], request: pytest.FixtureRequest, capsys: pytest.CaptureFixture[str]
) -> None:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p"},
        "spec": {
            "containers": [container],
            "volumes": [
                {"name": "run", "hostPath": {"path": "/var/run"}},
                {"name": "scratch", "emptyDir": {}},
            ],
        },
    }
    text = yaml.safe_dump(pod)
    err = beside_a_plugin(capsys, text)
    warnings = [line for line in err.splitlines() if "warning: Pod/p" in line]
    if request.node.callspec.id == "unreachable":
        # One of the specs' own addresses that nothing reaches: said, never silently passed.
        assert warnings == [
            "plugproxy inject: warning: Pod/p: left unchanged: lonely is given the CSI address "
            "unix:///csi/csi.sock, but no other container dials it and it is in no hostPath "
            "that kubelet reaches"
        ]
    else:
        assert warnings == []  # generic flags that only look like an endpoint
    code, out, err = run(capsys, "-", stdin=text)
    assert (code, out) == (1, "")
    assert "nothing to inject" in err


def test_a_workload_can_opt_out(capsys: pytest.CaptureFixture[str]) -> None:
    text = pod_doc(metadata__annotations={"plugproxy.io/inject": "false"})
    code, out, err = run(capsys, "-", stdin=text)
    assert (code, out) == (0, text)
    assert err == (
        'plugproxy inject: Pod/default/hostpath-csi: opted out (plugproxy.io/inject: "false"), '
        "left unchanged\nplugproxy inject: injected 0 of 1 workloads; 1 left unchanged\n"
    )


def test_the_plain_dict_api_matches_the_yaml_one(capsys: pytest.CaptureFixture[str]) -> None:
    """The webhook injects into JSON (plain dicts); the result must equal the CLI's."""
    source = yaml.safe_load((FIXTURES / "pod-list.yaml").read_text())["items"][0]
    pod = copy.deepcopy(source)
    outcome = inject.transform(pod, inject.InjectOptions(image=IMAGE))
    assert outcome.changed
    from_cli = yaml.safe_load(injected_text(capsys, "pod-list.yaml"))["items"][0]
    assert pod == from_cli


# ------------------------------------------------------------------------ what it says


def test_the_summary_says_what_was_done_on_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    """stdout is the manifest stream alone; stderr a line per workload changed (driver,
    the socket the CO side now dials through the proxy, the driver's new socket, admin,
    user and why), one per workload left as it was for a reason, and the count."""
    sources = [FIXTURES / n for n in ("csi-node-env.yaml", "csi-node-nonroot.yaml", "cmi.yaml")]
    code, out, err = run(capsys, "--image", IMAGE, *map(str, sources), "-", stdin=WEB)
    assert code == 0, err
    assert len(pods(out)) == 4 and "plugproxy inject" not in out
    assert err.splitlines() == [
        "plugproxy inject: DaemonSet/kube-system/acme-csi-node: injected: driver acme; the CO "
        "side (liveness-probe, registrar) now dials unix:///csi/csi.sock through plugproxy; the "
        "driver listens in the private volume plugproxy-upstream (unix:///plugin/csi.sock for "
        "plugproxy); spec csi.v1; admin 0.0.0.0:9809; plugproxy runs as root with DAC_OVERRIDE "
        "(the driver's user is not stated, so its image's, nearly always root)",
        "plugproxy inject: DaemonSet/kube-system/info-csi-node: injected: driver info-driver; "
        "the CO side (registrar) now dials unix:///run/csi/csi.sock through plugproxy; the "
        "driver listens in the private volume plugproxy-upstream (unix:///plugin/csi.sock for "
        "plugproxy); spec csi.v1; admin 0.0.0.0:9809; plugproxy runs as UID 1001 (the driver's "
        "user); plugproxy-prepare-socket-dir gives /run/csi to group 65532 first",
        "plugproxy inject: StatefulSet/acme-machines: injected: driver provider; the CO side "
        "(machine-controller) now dials tcp://127.0.0.1:8080 through plugproxy; the driver "
        "moved to tcp://127.0.0.1:8081; spec cmi.v1; admin 0.0.0.0:9808; plugproxy runs as "
        "UID 65532 (TCP: no socket file to share with the driver)",
        "plugproxy inject: injected 3 of 4 workloads; 1 left unchanged",
    ]
    # --quiet: the same manifests, no summary.
    code, quiet_out, quiet_err = run(
        capsys, "--quiet", "--image", IMAGE, *map(str, sources), "-", stdin=WEB
    )
    assert (code, quiet_out, quiet_err) == (0, out, "")


def test_a_hostnetwork_admin_and_a_split_registrar_are_said(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, _, err = run(capsys, "--image", IMAGE, str(FIXTURES / "helm-rendered.yaml"))
    assert code == 0, err
    lines = err.splitlines()
    assert "; admin 127.0.0.1:9808 (hostNetwork: the node's loopback, not scraped); " in lines[0]
    assert "the CO side (kubelet) now dials unix:///var/lib/kubelet/plugins/" in lines[0]
    assert lines[1:] == [
        "plugproxy inject: DaemonSet/acme-csi-registrar: left unchanged: only the CO side of "
        "the socket csi.sock in volume socket-dir (registrar); the proxy goes into the pod of "
        "the driver that serves it",
        "plugproxy inject: injected 1 of 2 workloads; 1 left unchanged",
    ]


def test_already_injected_is_said_and_changes_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    once = injected_text(capsys, "csi-node-env.yaml")
    code, twice, err = run(capsys, "--image", IMAGE, "-", str(DEPLOY / "csi-node.yaml"), stdin=once)
    assert code == 0, err
    assert twice == once + "---\n" + (DEPLOY / "csi-node.yaml").read_text(encoding="utf-8")
    assert err.splitlines() == [
        "plugproxy inject: DaemonSet/kube-system/acme-csi-node: already injected, left unchanged",
        "plugproxy inject: DaemonSet/example-csi-node: already injected, left unchanged: "
        "plugproxy is there, not added by inject",
        "plugproxy inject: injected 0 of 2 workloads; 2 left unchanged (2 already injected)",
    ]
    # --remove, twice: the second run finds it removed already, and succeeds alike.
    code, removed, err = run(capsys, "--remove", "-", stdin=once)
    assert code == 0, err
    assert err.splitlines() == [
        "plugproxy inject: DaemonSet/kube-system/acme-csi-node: removed: driver acme wired as "
        "before",
        "plugproxy inject: removed plugproxy from 1 of 1 workloads",
    ]
    code, again, err = run(capsys, "--remove", "-", stdin=removed)
    assert (code, again) == (0, removed)
    assert err.splitlines() == [
        "plugproxy inject: DaemonSet/kube-system/acme-csi-node: not injected, left unchanged",
        "plugproxy inject: removed plugproxy from 0 of 1 workloads; 1 left unchanged "
        "(1 not injected)",
    ]
    # A hand-written proxy is not inject's to take out: said, and left.
    code, out, err = run(capsys, "--remove", str(DEPLOY / "csi-node.yaml"))
    assert (code, out) == (0, (DEPLOY / "csi-node.yaml").read_text(encoding="utf-8"))
    assert err.splitlines()[0] == (
        "plugproxy inject: warning: DaemonSet/example-csi-node: left unchanged: plugproxy was "
        "not added by `plugproxy inject`, so --remove leaves it"
    )


def test_the_default_image_is_published_and_warned_about(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The image inject uses without --image is the one `make image` tags, named in
    `--help` and on the page; the README's one-liner names an image, and a run without
    --image says it used the default, which no registry serves."""
    assert f"plugproxy:{inject.__version__}" == inject.DEFAULT_IMAGE
    with pytest.raises(SystemExit):
        cli.main(["inject", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert f"--image IMAGE plugproxy image to run (default: {inject.DEFAULT_IMAGE}," in help_text
    assert "Exit status: 0 done; 1 nothing to inject" in help_text
    page = (ROOT / "docs" / "injecting.md").read_text(encoding="utf-8")
    assert f"| `--image` | plugproxy image; default `{inject.DEFAULT_IMAGE}`" in page
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    one_liners = [line for line in readme.splitlines() if "| plugproxy inject" in line]
    assert one_liners
    for line in [*one_liners, *(x for x in page.splitlines() if "| plugproxy inject" in x)]:
        assert f"plugproxy inject --image {IMAGE} -" in line, line
    code, out, err = run(capsys, str(FIXTURES / "cmi.yaml"))
    assert code == 0, err
    assert pods(out)["acme-machines"].container("plugproxy")["image"] == inject.DEFAULT_IMAGE
    warning = (
        f"plugproxy inject: warning: no --image given: the proxy runs {inject.DEFAULT_IMAGE}, "
        "the local name `make image` builds"
    )
    assert err.startswith(warning)
    code, _, err = run(capsys, "--quiet", str(FIXTURES / "cmi.yaml"))
    assert code == 0 and err.startswith(warning) and len(err.splitlines()) == 1
    code, _, err = run(capsys, "--image", IMAGE, str(FIXTURES / "cmi.yaml"))
    assert code == 0 and "warning" not in err


@pytest.mark.parametrize(
    ("text", "line", "problem"),
    [
        # A ConfigMap, never parsed for a pod spec, is still checked: line 7 of the file.
        (
            "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec: {}\n---\n"
            "kind: ConfigMap\ndata:\n\tkey: value\n",
            8,
            "found character '\\t' that cannot start any token",
        ),
        ("kind: Pod\nspec:\n  containers: [unclosed\n", 4, "expected ',' or ']'"),
        ("a: 1\n---\nkind: Pod\nspec:\n  containers:\n  - image: x\n    image: y\n", 7, "dup"),
    ],
    ids=["tab-in-a-configmap", "unclosed-flow", "duplicate-key"],
)
def test_broken_yaml_names_the_file_and_line_and_exits_2(
    text: str, line: int, problem: str, capsys: pytest.CaptureFixture[str], tmp_path: pathlib.Path
) -> None:
    path = tmp_path / "manifests" / "node.yaml"
    path.parent.mkdir()
    path.write_text(text)
    (path.parent / "other.yaml").write_text((FIXTURES / "cmi.yaml").read_text())
    for args in ((str(path.parent),), ("--diff", str(path.parent)), ("--remove", str(path))):
        code, out, err = run(capsys, *args)
        assert (code, out) == (2, ""), args
        (single,) = err.splitlines()
        assert single.startswith(f"plugproxy inject: error: {path}:{line}: not valid YAML: "), (
            single
        )
        assert problem in single
    assert (path.parent / "other.yaml").read_text() == (FIXTURES / "cmi.yaml").read_text()


def test_a_file_that_is_not_text_is_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: pathlib.Path
) -> None:
    path = tmp_path / "image.yaml"
    path.write_bytes(b"kind: Pod\n\xff\xfe\n")
    code, out, err = run(capsys, str(path))
    assert (code, out) == (2, "")
    assert err == f"plugproxy inject: error: {path}: not UTF-8 text (byte 10)\n"


def plugproxy_command() -> list[str]:
    return [sys.executable, "-m", "plugproxy"]


def test_a_reader_that_stops_early_gets_no_traceback(tmp_path: pathlib.Path) -> None:
    """`plugproxy inject --diff manifests/ | head -1` through a real pipe: head's line,
    nothing on stderr, and the status of a command killed by SIGPIPE (with pipefail)."""
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    source = (FIXTURES / "csi-node-env.yaml").read_text()
    for i in range(40):  # a diff far larger than a pipe holds: the writer must block
        (manifests / f"node-{i:02}.yaml").write_text(source.replace("acme-csi-node", f"n{i}"))
    command = " ".join([*plugproxy_command(), "inject", "--image", IMAGE, "--diff"])
    done = subprocess.run(
        ["bash", "-c", f'set -o pipefail; {command} "$1" | head -1', "bash", str(manifests)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        check=False,
    )
    assert done.stdout == f"--- a/{manifests}/node-00.yaml\n"
    assert done.stderr == ""
    assert done.returncode == 141


@pytest.mark.parametrize(
    "args",
    [("inject", "--help"), ("--help",), ("inject", "--image", IMAGE, str(FIXTURES / "cmi.yaml"))],
    ids=["inject-help", "help", "inject"],
)
def test_a_closed_stdout_ends_quietly(args: tuple[str, ...]) -> None:
    """Whatever the command writes, a stdout nobody reads any more is no traceback."""
    proc = subprocess.Popen(
        [*plugproxy_command(), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=ROOT,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader is gone before a byte is written
    err = proc.stderr.read().decode()
    code = proc.wait(timeout=60)
    assert "Traceback" not in err and "BrokenPipe" not in err
    if "--help" in args:
        assert code in (0, 141)  # argparse itself may drop help a closed pipe refuses
    else:
        assert (code, err) == (141, "")  # no summary after the output was cut short


# ------------------------------------------------------------------------ the page


def page_example() -> tuple[str, str, str]:
    """The manifest, the diff and the summary of docs/injecting.md's step-by-step example."""
    page = (ROOT / "docs" / "injecting.md").read_text(encoding="utf-8")
    section = page.split("### A CSI node plugin, step by step\n", 1)[1].split("\n#### ", 1)[0]
    blocks = {}
    for kind in ("yaml", "diff", "text"):
        found = re.search(rf"^```{kind}\n(.*?)^```$", section, re.S | re.M)
        assert found, f"no {kind} block in the step-by-step example"
        blocks[kind] = found[1]
    return blocks["yaml"], blocks["diff"], blocks["text"]


def test_the_pages_step_by_step_diff_is_what_inject_writes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The manual recipe is inject's own: the page's diff is generated by inject on the
    page's manifest, so the two cannot contradict each other again."""
    before, diff, said = page_example()
    for doc in yaml.safe_load_all(before):
        kubernetes_validate.validate(doc, kubernetes_validate.latest_version(), strict=True)
    code, after, err = run(capsys, "--image", IMAGE, "-", stdin=before)
    assert code == 0, err
    made = "".join(
        list(
            difflib.unified_diff(
                before.splitlines(keepends=True), after.splitlines(keepends=True), n=10**6
            )
        )[3:]  # ---, +++ and the one hunk's @@ line
    )
    assert diff == made, "docs/injecting.md's step-by-step diff is stale; inject writes:\n" + made
    assert said == err
    # The recipe the page explains: the driver untouched but for its mount, no wrapper, the
    # proxy as the driver's (unstated, so root) user with DAC_OVERRIDE alone, no init
    # container for a root proxy.
    pod = pods(after)["example-csi-node"]
    assert pod.container("example-csi-driver")["args"] == [
        "--endpoint=$(CSI_ENDPOINT)",
        "--nodeid=$(NODE_ID)",
    ]
    assert "command" not in pod.container("example-csi-driver")
    security = pod.container("plugproxy")["securityContext"]
    assert (security["runAsUser"], security["capabilities"]) == (0, DAC)
    assert "initContainers" not in pod.spec
    page = (ROOT / "docs" / "injecting.md").read_text(encoding="utf-8")
    assert "umask 0007 && exec" not in page
