"""docs/remote-bridge.md, "Try it on one host", run as written: the certificate recipe, the
fake plugin, the appliance side and the node side, then a call through the mutual TLS chain
and a refused identity."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import yaml

from plugproxy.spec.registry import load_spec

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "remote-bridge.md"
INFO = "/csi.v1.Identity/GetPluginInfo"

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl not installed")


def section_blocks() -> list[tuple[str, str]]:
    """The section's shell blocks: (the shell their fence names, their text)."""
    text = PAGE.read_text()
    section = text[text.index("## Try it on one host") :]
    section = section[: section.find("\n## ", 5)] if "\n## " in section[5:] else section
    return re.findall(r"```(sh|bash)\n(.*?)```", section, re.DOTALL)


def test_the_blocks_are_run_by_the_shell_their_fence_names():
    """A block marked sh is run by sh (dash on Debian): a bash-only construct in it, such as
    a process substitution, fails here as it would for a reader."""
    assert [shell for shell, _ in section_blocks()] == ["sh", "sh", "sh"]
    if shutil.which("dash") is None:
        pytest.skip("dash is not installed: sh may be bash, which runs bash-only blocks too")
    refused = subprocess.run(
        ["dash", "-n", "-c", "cat <(true)"], capture_output=True, text=True, check=False
    )
    assert refused.returncode != 0  # what the recipe's process substitutions met under dash
    for _, block in section_blocks():
        checked = subprocess.run(
            ["dash", "-n", "-c", block], capture_output=True, text=True, check=False
        )
        assert checked.returncode == 0, checked.stderr


@pytest.fixture
def on_one_host(tmp_path: Path) -> Iterator[Path]:
    """Runs the page's blocks in an empty directory, `plugproxy` on the PATH; stops what the
    blocks started when the test ends."""
    (shell, certs), (servers_shell, appliance), (_, node) = section_blocks()
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    subprocess.run(
        [shell, "-c", f"set -e\n{certs}"], cwd=tmp_path, env=env, check=True, capture_output=True
    )
    # One shell runs the two blocks that start servers; it waits, and is stopped with them.
    script = f"set -e\n{appliance}\n{node}\nwait\n"
    log = (tmp_path / "servers.log").open("w")
    shell = subprocess.Popen(
        [servers_shell, "-c", script],
        cwd=tmp_path,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        yield tmp_path
    finally:
        os.killpg(shell.pid, signal.SIGTERM)
        shell.wait(timeout=30)
        log.close()


def wait_ready(url: str, log: Path, timeout: float = 30.0) -> str:
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                body: str = resp.read().decode()
                if resp.status == 200:
                    return body
        except OSError as exc:
            last = str(exc)
        time.sleep(0.2)
    raise AssertionError(f"{url} never ready ({last}); servers said:\n{log.read_text()}")


def test_the_one_host_recipe_bridges_a_call_over_mutual_tls(on_one_host: Path):
    here = on_one_host
    assert "ready" in wait_ready("http://127.0.0.1:19810/readyz", here / "servers.log")
    info = load_spec("csi.v1").message_class("csi.v1.GetPluginInfoResponse")
    with grpc.insecure_channel(f"unix://{here}/csi.sock") as ch:
        raw = ch.unary_unary(INFO)(b"", timeout=10)
    assert info.FromString(raw).name  # the fake plugin's answer, through both proxies

    # Another identity from the same CA: refused by the appliance's allow-list.
    def sign(name: str, san: str) -> None:
        subprocess.run(
            [
                "bash",
                "-c",
                f'openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN={name}"'
                f" -keyout {name}.key -out {name}.csr && openssl x509 -req -in {name}.csr"
                f" -CA ca.crt -CAkey ca.key -CAcreateserial -days 1 -out {name}.crt -extfile"
                f" <(printf '%s\\n' 'subjectAltName={san}' 'extendedKeyUsage=clientAuth')",
            ],
            cwd=here,
            check=True,
            capture_output=True,
        )

    sign("intruder", "URI:spiffe://example.org/ns/default/sa/intruder")
    credentials = grpc.ssl_channel_credentials(
        (here / "ca.crt").read_bytes(),
        (here / "intruder.key").read_bytes(),
        (here / "intruder.crt").read_bytes(),
    )
    with (
        grpc.secure_channel("localhost:17443", credentials) as ch,
        pytest.raises(grpc.RpcError) as refused,
    ):
        ch.unary_unary(INFO)(b"", timeout=10)
    assert refused.value.code() is grpc.StatusCode.PERMISSION_DENIED
    assert "spiffe://example.org/ns/default/sa/intruder" in (refused.value.details() or "")


def test_the_cert_manager_recipe_fits_the_shipped_manifest():
    """The page's Certificates parse, ask for the key usages each side needs, and the node
    side's Secret is the one deploy/csi-node-remote.yaml mounts."""
    text = PAGE.read_text()
    (block,) = re.findall(r"```yaml\n(.*?)```", text[text.index("### With cert-manager") :], re.S)
    node, appliance = yaml.safe_load_all(block)
    assert node["kind"] == appliance["kind"] == "Certificate"
    assert "client auth" in node["spec"]["usages"] and node["spec"]["uris"]
    assert "server auth" in appliance["spec"]["usages"] and appliance["spec"]["dnsNames"]
    manifest = (ROOT / "deploy" / "csi-node-remote.yaml").read_text()
    assert f"secretName: {node['spec']['secretName']}" in manifest
