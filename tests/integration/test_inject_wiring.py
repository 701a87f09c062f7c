"""An injected pod, run without a cluster: each volume is a directory, each container sees
it at its mountPath, and the driver (the fake CSI plugin, started through the injected
command wrapper), plugproxy (with the injected container's own args) and a CO-side client
(at the address the CO container is given) talk over those paths end to end.
"""

from __future__ import annotations

import asyncio
import os
import pathlib
import posixpath
import re
import socket
import stat
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from plugproxy import inject
from plugproxy.fakes import SpecClient
from plugproxy.sockets import socket_answers

ROOT = pathlib.Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "inject"
ARG_VAR = re.compile(r"\$\((\w+)\)")
# fixture: (workload, driver container, CO-side container)
CASES = {
    "csi-node-env.yaml": ("acme", "registrar"),
    "csi-controller-flag.yaml": ("driver", "csi-provisioner"),
}


def env_of(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: str(e["value"]) for e in container.get("env", []) if "value" in e}


def words(container: dict[str, Any]) -> list[str]:
    env = env_of(container)
    raw = [*container.get("command", []), *container.get("args", [])]
    return [ARG_VAR.sub(lambda m: env.get(m[1], m[0]), w) for w in raw]


def flag(container: dict[str, Any], name: str) -> str:
    found = [w.split("=", 1)[1] for w in words(container) if w.startswith(name + "=")]
    assert found, f"{container['name']} has no {name}"
    return found[0]


class PodOnDisk:
    """Volumes as directories; a container's path mapped through its own mounts."""

    def __init__(self, spec: dict[str, Any], root: pathlib.Path) -> None:
        self.spec = spec
        self.root = root
        for volume in spec["volumes"]:
            (root / volume["name"]).mkdir()

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
    text, _ = inject.transform_text(
        (FIXTURES / name).read_text(encoding="utf-8"), name, inject.InjectOptions()
    )
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

    # The driver listens where its own flags say, seen through its own mounts.
    endpoint = flag(driver, "--endpoint")
    driver_sock = pod.host_path(driver, endpoint)
    fake = [sys.executable, "-m", "plugproxy.fakes.cli", "--spec", "csi.v1"]
    fake += ["--listen", f"unix://{driver_sock}"]
    # Started through the command wrapper inject gave it, if any (umask for the socket).
    wrapper = driver.get("command", [])[:3] if driver.get("command", [])[:1] == ["/bin/sh"] else []
    # The proxy runs with the container's args; only the admin port is made free locally,
    # and the socket paths are mapped to where its mounts put them.
    admin_port = free_port()
    args = []
    for word in proxy["args"]:
        key, _, value = word.partition("=")
        if key in ("--listen", "--upstream"):
            args.append(f"{key}=unix://{pod.host_path(proxy, value)}")
        elif key == "--admin-listen":
            args.append(f"{key}=127.0.0.1:{admin_port}")
        else:
            args.append(word)
    procs: list[asyncio.subprocess.Process] = []
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    try:
        quiet = {"env": env, "stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
        procs.append(await asyncio.create_subprocess_exec(*wrapper, *fake, **quiet))
        proxy_cmd = [sys.executable, "-m", "plugproxy", *args]
        procs.append(await asyncio.create_subprocess_exec(*proxy_cmd, **quiet))
        co_sock = pod.host_path(co, flag(co, "--csi-address"))
        await wait_for(lambda: socket_answers(str(driver_sock), 0.2), "driver socket", procs)
        await wait_for(lambda: socket_answers(str(co_sock), 0.2), "proxy socket", procs)
        # The CO side reaches plugproxy, and only plugproxy: the driver's socket is not in
        # any directory the CO container mounts.
        assert co_sock.parent != driver_sock.parent
        assert not (co_sock.parent / driver_sock.name).samefile(driver_sock)
        if wrapper:
            assert stat.S_IMODE(driver_sock.stat().st_mode) & 0o070 == 0o070
        client = SpecClient(f"unix:{co_sock}", "csi.v1")
        try:
            info = await client.call("GetPluginInfo")
        finally:
            await client.close()
        assert info.name and info.vendor_version
        # kubelet's readiness probe, on the injected admin port path.
        await wait_for(lambda: ready(admin_port), "/readyz 200", procs)
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                await asyncio.wait_for(proc.wait(), 10)
            except TimeoutError:
                proc.kill()
                await proc.wait()
