"""An injected pod, run without a cluster: each volume is a directory, each container sees
it at its mountPath, and the driver (the fake CSI plugin, started as its container says:
no wrapper, the usual umask 0022), plugproxy (with the injected container's own args, as
the user and group it says) and a CO-side client (at the address the CO container is
given, as a non-root user holding only the pod's fsGroup) talk over those paths end to end.

Other users than the test's own need the test to run as root, and a Python they can run;
where either is missing those cases are skipped, saying why.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import pathlib
import posixpath
import re
import shutil
import socket
import stat
import subprocess
import sys
import sysconfig
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

import plugproxy
from plugproxy.cli import inject, preparedir
from plugproxy.fakes import SpecClient
from plugproxy.net.sockets import socket_answers

ROOT = pathlib.Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "inject"
# Where the plugproxy under test lives (src/, or site-packages for an installed build).
PACKAGE_ROOT = pathlib.Path(plugproxy.__file__).resolve().parents[1]
ARG_VAR = re.compile(r"\$\((\w+)\)")
# fixture: (driver container, CO-side container)
CASES = {
    "csi-node-env.yaml": ("acme", "registrar"),  # user not stated: root proxy
    "csi-node-distroless.yaml": ("lean", "node-driver-registrar"),  # no command either
    "csi-controller-flag.yaml": ("driver", "csi-provisioner"),  # 65532
    "csi-node-nonroot.yaml": ("info-driver", "registrar"),  # 1001, host directory
}
CO_UID = 4242  # a non-root CO sidecar: it reaches plugproxy only through the pod's group
DRIVER_SCRIPT = "from plugproxy.fakes.cli import main; raise SystemExit(main())"
CO_SCRIPT = """
import asyncio, sys
from plugproxy.fakes import SpecClient
async def call():
    client = SpecClient(sys.argv[1], "csi.v1")
    try:
        info = await client.call("GetPluginInfo")
    finally:
        await client.close()
    print(info.name, info.vendor_version)
asyncio.run(call())
"""


def env_of(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: str(e["value"]) for e in container.get("env", []) if "value" in e}


def words(container: dict[str, Any]) -> list[str]:
    env = env_of(container)
    raw = [*container.get("command", []), *container.get("args", [])]
    return [ARG_VAR.sub(lambda m: env.get(m[1], m[0]), w) for w in raw]


def flag(container: dict[str, Any], *names: str) -> str:
    found = [w.split("=", 1)[1] for w in words(container) if w.split("=", 1)[0] in names]
    assert found, f"{container['name']} has none of {names}"
    return found[0]


@functools.cache
def python_for(uid: int) -> tuple[str, str] | None:
    """(interpreter, PYTHONPATH) with which `uid` can import plugproxy, or None: this Python
    may live where only its owner can reach it, so another of the same version is tried."""
    if uid == os.geteuid():
        return sys.executable, str(PACKAGE_ROOT)
    if os.geteuid() != 0:
        return None
    path = os.pathsep.join([str(PACKAGE_ROOT), sysconfig.get_paths()["purelib"]])
    version = "python{}.{}".format(*sys.version_info[:2])
    places = [*os.get_exec_path(), "/usr/local/bin", "/usr/bin"]
    found = (shutil.which(version, path=place) for place in places)
    for exe in dict.fromkeys(os.path.realpath(e) for e in [sys.executable, *found] if e):
        check = (
            f"import sys, grpc, plugproxy.cli.main; assert sys.version[:4] == {sys.version[:4]!r}"
        )
        env = {"PYTHONPATH": path, "PATH": "/usr/bin:/bin"}
        try:
            probe = subprocess.run(
                [exe, "-s", "-c", check], env=env, user=uid, capture_output=True, check=False
            )
        except OSError:
            continue  # not even executable for that user
        if probe.returncode == 0:
            return exe, path
    return None


def as_user(uid: int, gid: int, groups: list[int]) -> dict[str, Any]:
    """What kubelet gives a container: its user, its group, the pod's fsGroup."""
    if uid == os.geteuid() and gid == os.getegid():
        return {}
    return {"user": uid, "group": gid, "extra_groups": groups}


class PodOnDisk:
    """Volumes as directories; a container's path mapped through its own mounts."""

    def __init__(self, spec: dict[str, Any], root: pathlib.Path) -> None:
        self.spec = spec
        self.root = root
        self.fs_group = int(spec.get("securityContext", {}).get("fsGroup", os.getegid()))
        root.chmod(0o755)
        for volume in spec["volumes"]:
            path = root / volume["name"]
            path.mkdir()
            if "emptyDir" in volume:
                # kubelet: world-writable, and with fsGroup set-group-ID to that group.
                os.chown(path, -1, self.fs_group)
                path.chmod(0o2777)
            else:
                path.chmod(0o755)  # hostPath DirectoryOrCreate: root's, 0755
        for init in spec.get("initContainers", []):
            # The prepare-socket-dir container, run as its args say (`plugproxy prepare-dir`)
            # on the directory its mount maps to.
            assert init["name"] == inject.PREPARE and "command" not in init
            parser = argparse.ArgumentParser()
            preparedir.add_arguments(parser)
            assert init["args"][0] == "prepare-dir"
            ns = parser.parse_args(init["args"][1:])
            owner = preparedir.parse_owner(ns.owner)
            assert owner == (0, self.fs_group)
            for target in ns.paths:
                preparedir.prepare(
                    self.host_path(init, target), owner, preparedir.parse_mode(ns.mode)
                )

    def container(self, name: str) -> dict[str, Any]:
        return next(c for c in self.spec["containers"] if c["name"] == name)

    def host_path(self, container: dict[str, Any], address: str) -> pathlib.Path:
        path = "/" + address.removeprefix("unix:").lstrip("/")
        mounts = [
            m
            for m in container.get("volumeMounts", [])
            if (path + "/").startswith(m["mountPath"].rstrip("/") + "/")
        ]
        assert mounts, f"{container['name']} cannot see {path}"
        mount = max(mounts, key=lambda m: len(m["mountPath"]))
        rel = posixpath.relpath(path, mount["mountPath"])
        return self.root / mount["name"] / mount.get("subPath", "") / rel


@pytest.fixture
def short_tmp() -> Iterator[pathlib.Path]:
    # UNIX socket paths are limited to 107 bytes; pytest's tmp_path can be longer.
    with tempfile.TemporaryDirectory(prefix="inj", dir="/tmp") as tmp:
        yield pathlib.Path(tmp)


def injected_pod(name: str, workload_driver: str) -> dict[str, Any]:
    text, warnings = inject.transform_text(
        (FIXTURES / name).read_text(encoding="utf-8"), name, inject.InjectOptions()
    )
    assert warnings == []
    (doc,) = [d for d in yaml.safe_load_all(text) if d]
    spec: dict[str, Any] = doc["spec"]["template"]["spec"]
    assert any(c["name"] == workload_driver for c in spec["containers"])
    return spec


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def wait_for(check: Any, what: str, procs: list[asyncio.subprocess.Process]) -> None:
    deadline = time.monotonic() + 20
    while not check():
        for proc in procs:
            assert proc.returncode is None, f"a process exited with {proc.returncode}"
        assert time.monotonic() < deadline, f"{what} did not happen in time"
        await asyncio.sleep(0.02)


def ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


@pytest.mark.parametrize("name", sorted(CASES))
async def test_get_plugin_info_crosses_the_injected_pod(name: str, short_tmp: pathlib.Path) -> None:
    driver_name, co_name = CASES[name]
    spec = injected_pod(name, driver_name)
    pod = PodOnDisk(spec, short_tmp)
    driver, proxy, co = (pod.container(n) for n in (driver_name, "plugproxy", co_name))
    original = yaml.safe_load((FIXTURES / name).read_text(encoding="utf-8"))
    original_driver = next(
        c for c in original["spec"]["template"]["spec"]["containers"] if c["name"] == driver_name
    )
    assert driver.get("command") == original_driver.get("command")  # started as it always was

    # Each process as its container says: the driver as its stated user (else the image's,
    # root), plugproxy as the injected runAsUser/runAsGroup; all with the pod's fsGroup.
    driver_sc = driver.get("securityContext", {})
    driver_uid = inject.run_as_user(spec, driver)
    driver_uid = os.geteuid() if driver_uid is None else driver_uid
    proxy_sc = proxy["securityContext"]
    users = {
        "driver": (driver_uid, int(driver_sc.get("runAsGroup", pod.fs_group))),
        "plugproxy": (int(proxy_sc["runAsUser"]), int(proxy_sc["runAsGroup"])),
        "CO side": (CO_UID, CO_UID),
    }
    pythons = {}
    for who, (uid, _) in users.items():
        found = python_for(uid)
        if found is None and who == "CO side":
            continue  # the test's own user dials instead
        if found is None:
            pytest.skip(f"cannot run the {who} as UID {uid}: needs root and a Python it can run")
        pythons[who] = found

    # The driver listens where its own flags say, seen through its own mounts.
    driver_sock = pod.host_path(driver, flag(driver, "--endpoint", "--csi-endpoint"))
    # The proxy runs with the container's args; only the admin port is made free locally,
    # and the socket and violations file paths are mapped to where its mounts put them.
    admin_port = free_port()
    args = []
    record = None
    for word in proxy["args"]:
        key, _, value = word.partition("=")
        if key in ("--listen", "--upstream"):
            args.append(f"{key}=unix://{pod.host_path(proxy, value)}")
        elif key == "--violations-file":
            record = pod.host_path(proxy, value)
            args.append(f"{key}={record}")
        elif key == "--admin-listen":
            args.append(f"{key}=127.0.0.1:{admin_port}")
        else:
            args.append(word)
    # The violation record is in the pod's plugproxy-tmp emptyDir, which outlives the
    # proxy container's restarts.
    assert record == short_tmp / inject.TMP_VOLUME / posixpath.basename(inject.VIOLATIONS_FILE)
    procs: list[asyncio.subprocess.Process] = []

    async def start(who: str, *argv: str) -> None:
        exe, path = pythons[who]
        uid, gid = users[who]
        procs.append(
            await asyncio.create_subprocess_exec(
                exe,
                "-s",
                *argv,
                env={**os.environ, "PYTHONPATH": path},
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                umask=0o022,  # what a container gets when nobody sets one
                **as_user(uid, gid, [pod.fs_group]),
            )
        )

    try:
        # A vendor_version over 128 bytes: a violation for the record (audit passes it on).
        await start(
            "driver",
            "-c",
            DRIVER_SCRIPT,
            "--spec",
            "csi.v1",
            "--listen",
            f"unix://{driver_sock}",
            "--misbehave",
            "string-too-long",
        )
        await start("plugproxy", "-m", "plugproxy", *args)
        co_sock = pod.host_path(co, flag(co, "--csi-address"))
        await wait_for(lambda: socket_answers(str(driver_sock), 0.2), "driver socket", procs)
        await wait_for(lambda: socket_answers(str(co_sock), 0.2), "proxy socket", procs)
        # The driver's socket is as its umask made it: only its owner may connect.
        driver_stat = driver_sock.stat()
        assert stat.S_IMODE(driver_stat.st_mode) & 0o022 == 0
        assert driver_stat.st_uid == users["driver"][0]
        # plugproxy's own socket is 0660 and the pod group's, which the CO side has.
        proxy_stat = co_sock.stat()
        assert stat.S_IMODE(proxy_stat.st_mode) == 0o660
        assert proxy_stat.st_gid == pod.fs_group
        # The CO side reaches plugproxy, and only plugproxy: the driver's socket is not in
        # any directory the CO container mounts.
        assert co_sock.parent != driver_sock.parent
        assert not (co_sock.parent / driver_sock.name).samefile(driver_sock)
        if "CO side" in pythons:
            exe, path = pythons["CO side"]
            call = await asyncio.create_subprocess_exec(
                exe,
                "-s",
                "-c",
                CO_SCRIPT,
                f"unix:{co_sock}",
                env={**os.environ, "PYTHONPATH": path},
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                **as_user(CO_UID, CO_UID, [pod.fs_group]),
            )
            out, err = await asyncio.wait_for(call.communicate(), 30)
            assert call.returncode == 0, err.decode()
            assert out.split()[0] == b"csi.fake.plugproxy.io"
        else:
            client = SpecClient(f"unix:{co_sock}", "csi.v1")
            try:
                info = await client.call("GetPluginInfo")
            finally:
                await client.close()
            assert info.name and info.vendor_version
        # kubelet's readiness probe, on the injected admin port path.
        await wait_for(lambda: ready(admin_port), "/readyz 200", procs)
        # The violation reaches the file within a second or so.
        await wait_for(
            lambda: b'"event":"violation"' in record.read_bytes(), "violation written", procs
        )
    finally:
        for proc in procs:
            if proc.returncode is None:
                proc.terminate()
        for proc in procs:
            try:
                await asyncio.wait_for(proc.wait(), 10)
            except TimeoutError:
                proc.kill()
                await proc.wait()
    # What `kubectl exec <pod> -c plugproxy -- plugproxy report --file ...` prints.
    reader = await asyncio.create_subprocess_exec(
        sys.executable,
        *("-m", "plugproxy", "report", "--file", str(record), "--format", "json"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(reader.communicate(), 60)
    assert reader.returncode == 0, err.decode()
    report = json.loads(out)
    assert report["total"] >= 1 and report["mode"] == "audit"
    assert {v["method"] for v in report["violations"]} == {"/csi.v1.Identity/GetPluginInfo"}
    (run,) = report["runs"]
    assert run["stopped"], "the proxy stopped in order and said so in the file"
