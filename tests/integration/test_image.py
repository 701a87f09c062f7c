"""The container image as a user runs it: built with `make image`, run with podman as
65532 on a read-only root filesystem, serving a call through a socket directory of the host,
answering /readyz and /metrics, and draining on SIGTERM; and what it must not hold: a shell,
pip, or the CA bundle the build downloaded through.
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
import tarfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from tests.support import admin_get, built_image, free_port, require_tool

REPO = Path(__file__).resolve().parents[2]
BUILD_CA = Path("/etc/ssl/certs/ca-certificates.crt")  # the Makefile's default BUILD_CA
# Measured 98.8 MB (podman's size of the image, 2026-11-26): room for dependency updates,
# not for a second Python or a package manager.
SIZE_BOUND = 120_000_000
GET_PLUGIN_INFO = "/csi.v1.Identity/GetPluginInfo"

# A cold build also builds the bases (debootstrap): minutes, not seconds.
pytestmark = pytest.mark.timeout(900)


def run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, check=False)


@pytest.fixture(scope="session")
def podman() -> str:
    return require_tool("podman", "Debian: apt-get install podman runc")


@pytest.fixture(scope="session")
def image(podman: str) -> str:
    return built_image()


def wait_for(predicate: object, what: str, timeout: float = 30.0) -> None:
    assert callable(predicate)
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"{what}: not within {timeout:.0f}s"
        time.sleep(0.1)


def call(sock: Path, method: str) -> bytes:
    with grpc.insecure_channel(f"unix:{sock}") as channel:
        answer: bytes = channel.unary_unary(method)(b"", timeout=10)
        return answer


@pytest.fixture
def plugin_dir(tmp_path: Path) -> Iterator[Path]:
    """A host directory holding a fake CSI plugin's socket, open to the container's user."""
    directory = tmp_path / "csi"
    directory.mkdir()
    directory.chmod(0o777)  # uid 65532 creates the proxy's socket here
    plugin_sock = directory / "plugin.sock"
    fake = ["fake-plugin", "--spec", "csi.v1", "--listen", f"unix://{plugin_sock}"]
    plugin = subprocess.Popen(
        [sys.executable, "-m", "plugproxy", *fake],
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(plugin_sock.exists, "the fake plugin's socket")
        plugin_sock.chmod(0o666)  # connecting takes write permission on the socket
        yield directory
    finally:
        plugin.terminate()
        plugin.wait(timeout=10)


def test_the_image_serves_through_a_host_socket_and_drains_on_sigterm(
    podman: str, image: str, plugin_dir: Path
) -> None:
    name = f"plugproxy-test-{uuid.uuid4().hex[:8]}"
    port = free_port()
    listen = plugin_dir / "csi.sock"
    started = run(
        podman, "run", "--detach", "--name", name,
        "--user", "65532:65532",
        "--read-only", "--read-only-tmpfs=false", "--tmpfs", "/tmp",
        "--volume", f"{plugin_dir}:/csi",
        "--publish", f"127.0.0.1:{port}:9808",
        image,
        "serve", "--listen", "unix:///csi/csi.sock", "--upstream", "unix:///csi/plugin.sock",
    )  # fmt: skip
    assert started.returncode == 0, started.stderr
    try:
        wait_for(lambda: admin_get(port, "/readyz")[0] == 200, "/readyz answering 200")
        assert listen.is_socket()
        answer = call(listen, GET_PLUGIN_INFO)
        assert answer and answer == call(plugin_dir / "plugin.sock", GET_PLUGIN_INFO)

        status, metrics = admin_get(port, "/metrics")
        assert status == 200
        assert re.search(r'plugproxy_build_info\{version="[^"]+"\} 1\.0', metrics)
        assert re.search(r"plugproxy_rpc_duration_seconds_count\{[^}]*GetPluginInfo", metrics)

        pid = run(podman, "inspect", "--format", "{{.State.Pid}}", name).stdout.strip()
        status_lines = Path(f"/proc/{pid}/status").read_text().splitlines()
        uids = next(line for line in status_lines if line.startswith("Uid:")).split()[1:]
        assert uids == ["65532"] * 4

        assert run(podman, "kill", "--signal", "TERM", name).returncode == 0
        waited = run(podman, "wait", name, timeout=60)
        assert waited.stdout.strip() == "0", run(podman, "logs", name).stderr
        assert not listen.exists(), "the proxy removes its socket on the way out"
        assert (plugin_dir / "plugin.sock").exists(), "and only its own"
    finally:
        run(podman, "rm", "--force", "--time", "0", name)


def test_the_image_runs_as_65532_and_stays_small(podman: str, image: str) -> None:
    (info,) = json.loads(run(podman, "image", "inspect", image).stdout)
    assert info["Config"]["User"] == "65532:65532"
    assert info["Size"] < SIZE_BOUND, f"{info['Size'] / 1e6:.1f} MB"


def test_the_image_runs_the_compiled_build(podman: str, image: str) -> None:
    # Its build stage has gcc and Python's headers: the hot path is compiled (setup.py).
    version = run(podman, "run", "--rm", image, "--version")
    assert version.returncode == 0, version.stderr
    assert version.stdout.strip().endswith("(compiled)"), version.stdout


def test_the_image_has_no_shell(podman: str, image: str) -> None:
    shell = run(podman, "run", "--rm", "--entrypoint", "/bin/sh", image, "-c", "true")
    assert shell.returncode != 0
    assert "/bin/sh" in shell.stderr and "no such file" in shell.stderr.lower(), shell.stderr


def test_the_venv_has_no_pip_setuptools_or_wheel(podman: str, image: str) -> None:
    probe = (
        "import importlib.util, json;"
        "print(json.dumps([m for m in ('pip', 'setuptools', 'wheel', 'pkg_resources',"
        " 'plugproxy', 'grpc') if importlib.util.find_spec(m)]))"
    )
    found = run(
        podman, "run", "--rm", "--read-only", "--entrypoint", "/opt/plugproxy/bin/python",
        image, "-c", probe,
    )  # fmt: skip
    assert found.returncode == 0, found.stderr
    assert json.loads(found.stdout) == ["plugproxy", "grpc"]


def pem_blocks(data: bytes) -> set[bytes]:
    return set(re.findall(rb"-----BEGIN CERTIFICATE-----\n(.*?)-----END", data, re.DOTALL))


def test_the_filesystem_holds_no_tools_and_not_the_build_ca(podman: str, image: str) -> None:
    (info,) = json.loads(run(podman, "image", "inspect", image).stdout)
    env = {e.partition("=")[0] for e in info["Config"]["Env"]}
    assert not env & {"PIP_CERT", "REQUESTS_CA_BUNDLE", "PIP_INDEX_URL"}
    created = run(podman, "create", image)
    assert created.returncode == 0, created.stderr
    container = created.stdout.strip()
    files: dict[str, bytes] = {}
    commands: set[str] = set()  # names of executables and links anywhere in the image
    try:
        with subprocess.Popen([podman, "export", container], stdout=subprocess.PIPE) as export:
            assert export.stdout is not None
            with tarfile.open(fileobj=export.stdout, mode="r|") as tar:
                for member in tar:
                    name = member.name.removeprefix("./")
                    if member.issym() or (member.isfile() and member.mode & 0o111):
                        commands.add(Path(name).name)
                    reader = tar.extractfile(member) if member.isfile() else None
                    files[name] = reader.read() if reader else b""
    finally:
        run(podman, "rm", container)
    assert "usr/bin/python3.11" in files and "plugproxy" in commands
    for tool in ("sh", "bash", "dash", "apt", "apt-get", "dpkg", "perl", "pip", "pip3"):
        assert tool not in commands, f"the image holds {tool}"

    if not BUILD_CA.exists():
        return
    bundle = BUILD_CA.read_bytes()
    digest = hashlib.sha256(bundle).digest()
    # The certificates the build trusted beyond those the image ships (a proxy's CA).
    extra = pem_blocks(bundle) - pem_blocks(files.get("etc/ssl/certs/ca-certificates.crt", b""))
    for name, data in files.items():
        assert hashlib.sha256(data).digest() != digest, f"{name} is the build's CA bundle"
        for block in extra:
            assert block.splitlines()[0] not in data, f"{name} holds a certificate of BUILD_CA"
