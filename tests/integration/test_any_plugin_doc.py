"""docs/any-plugin.md run as written, by the shell its fences name, with what `make demo`
installs: the example .proto saved where the page says, the set built with the page's
commands (grpcio-tools and googleapis-common-protos, no googleapis checkout, no $GOOGLEAPIS
to set by hand), and the page's `plugproxy serve` in front of a plugin built from the set.
The call line it logs is the one the page shows."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from plugproxy.net.sockets import socket_answers
from tests.support import channel, generic_servicer

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "any-plugin.md"
PUT = "/acme.vault.v1.Vault/PutSecret"


def fenced(language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", PAGE.read_text(), re.DOTALL | re.MULTILINE)


def page_shell_blocks() -> list[tuple[str, str]]:
    """(shell, text) of every shell block of the page, in page order."""
    return re.findall(r"^```(sh|bash)\n(.*?)^```", PAGE.read_text(), re.DOTALL | re.MULTILINE)


def test_the_page_needs_nothing_undefined() -> None:
    """Every variable a block uses is set by an earlier block or the shell itself."""
    defined = {"PWD", "HOME", "PATH"}
    for _, block in page_shell_blocks():
        used = set(re.findall(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)", block))
        assigned = set(re.findall(r"^([A-Za-z_][A-Za-z0-9_]*)=", block, re.MULTILINE))
        assert used <= defined | assigned, used - defined - assigned
        defined |= assigned


def run_block(
    shell: str, text: str, cwd: Path, env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [shell, "-c", text], cwd=cwd, env=env, capture_output=True, text=True, check=False
    )


def start_block(
    shell: str, text: str, cwd: Path, env: dict[str, str], log: Path
) -> subprocess.Popen[bytes]:
    """A block that serves, in the background, in a session of its own."""
    with log.open("w") as out:
        return subprocess.Popen(
            [shell, "-c", text],
            cwd=cwd,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


@pytest.fixture
def reader_env(tmp_path: Path) -> dict[str, str]:
    """The README's activation line: the venv's commands first on the PATH. pip must find
    grpcio-tools installed already (the suite's venv has it), never ask an index."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PLUGPROXY_", "OTEL_"))}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["HOME"] = str(tmp_path)
    env["PIP_NO_INDEX"] = "1"
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


async def test_the_page_builds_the_set_and_serves_it_as_it_says(
    tmp_path: Path, reader_env: dict[str, str]
) -> None:
    (proto,) = fenced("proto")
    (build_shell, build), (serve_shell, serve) = page_shell_blocks()
    assert "grpcio-tools" in build and "plugproxy serve" in serve
    where = tmp_path / "acme" / "vault" / "v1"
    where.mkdir(parents=True)
    (where / "vault.proto").write_text(proto)  # "Saved as acme/vault/v1/vault.proto"

    built = run_block(build_shell, f"set -e\n{build}", tmp_path, reader_env)
    assert built.returncode == 0, built.stdout + built.stderr
    descriptor_set = tmp_path / "vault.binpb"
    assert descriptor_set.stat().st_size > 0

    # The plugin the page's proxy fronts: built from the set the page's commands made.
    async def put(request: Any, context: Any) -> bytes:
        return b""

    plugin = grpc.aio.server()
    plugin.add_generic_rpc_handlers([generic_servicer(str(descriptor_set), {PUT: put})])
    plugin.add_insecure_port(f"unix:{tmp_path}/plugin.sock")
    await plugin.start()
    log = tmp_path / "proxy.log"
    proxy = start_block(
        serve_shell,
        f"exec {serve.strip()}",
        tmp_path,
        {**reader_env, "PLUGPROXY_ADMIN_LISTEN": "off"},
        log,
    )
    try:
        listen = tmp_path / "vault.sock"
        deadline = time.monotonic() + 30
        while not socket_answers(str(listen), 0.2):
            assert proxy.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            await asyncio.sleep(0.05)
        request = _put_request(descriptor_set)
        async with channel(str(listen)) as ch:
            await ch.unary_unary(PUT)(request, timeout=10)
        deadline = time.monotonic() + 10
        while '"event":"call"' not in log.read_text():
            assert time.monotonic() < deadline, log.read_text()
            await asyncio.sleep(0.05)
    finally:
        os.killpg(proxy.pid, signal.SIGTERM)
        proxy.wait(15)
        await plugin.stop(0)

    line = next(json.loads(ln) for ln in log.read_text().splitlines() if '"event":"call"' in ln)
    (shown,) = fenced("json")
    expected = json.loads(shown)  # "The call line, some fields left out"
    assert {k: line.get(k) for k in expected} == expected
    assert "s3cret" not in log.read_text()


def _put_request(descriptor_set: Path) -> bytes:
    """The page's PutSecret without `name`, its payload a secret."""
    pool = descriptor_pool.DescriptorPool()
    for file in descriptor_pb2.FileDescriptorSet.FromString(descriptor_set.read_bytes()).file:
        pool.Add(file)
    cls = message_factory.GetMessageClass(
        pool.FindMessageTypeByName("acme.vault.v1.PutSecretRequest")
    )
    return bytes(cls(vault="prod", payload=b"s3cret").SerializeToString())
