"""`plugproxy serve` loads only what its configuration uses.

A proxy runs beside every plugin on every node: the default configuration (frame relay,
plaintext sockets, no trace exporter) must not load grpc's C core, the OpenTelemetry SDK
or the TLS modules (``ssl`` itself comes with asyncio, whatever the configuration). Each
case runs a real proxy in a fresh interpreter and lists what it imported once it listened
and reached the plugin.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from concurrent import futures
from pathlib import Path

import grpc
import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
HEAVY = ("grpc", "opentelemetry.sdk", "plugproxy.tlsfiles", "plugproxy.tlslog")

PROBE = textwrap.dedent(
    """
    import asyncio, json, sys
    from plugproxy import serve

    HEAVY = tuple(sys.argv[1].split(","))

    async def main() -> None:
        ns = serve.parse_args(sys.argv[2:])
        server = serve.ProxyServer(ns)
        await server.start()
        ready = await server.upstream.wait_ready(3)
        loaded = sorted(
            name for name in sys.modules if name.startswith(HEAVY) or name == "grpc"
        )
        await server.stop(0)
        print(json.dumps({"ready": ready, "loaded": loaded}))

    asyncio.run(main())
    """
)


def loaded_by(
    tmp_path: Path, *args: str, env: dict[str, str] | None = None
) -> tuple[bool, list[str]]:
    """Whether a proxy with ``args`` reached its plugin (a gRPC server without services,
    in this process), and what it imported among HEAVY."""
    plugin = tmp_path / "plugin.sock"
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    server.add_insecure_port(f"unix:{plugin}")
    server.start()
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "PLUGPROXY_"))}
    environ["PYTHONPATH"] = os.pathsep.join([str(SRC), *sys.path])
    environ.update(env or {})
    argv = [
        "--listen",
        f"unix://{tmp_path / 'proxy.sock'}",
        "--upstream",
        f"unix://{plugin}",
        "--admin-listen",
        "127.0.0.1:0",
        *args,
    ]
    try:
        done = subprocess.run(
            [sys.executable, "-c", PROBE, ",".join(HEAVY), *argv],
            env=environ,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        server.stop(0)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.splitlines()[-1])
    return result["ready"], [name for name in result["loaded"] if name.startswith(HEAVY)]


def test_the_default_configuration_loads_no_grpc_otel_sdk_or_tls(tmp_path: Path) -> None:
    assert loaded_by(tmp_path) == (True, [])


@pytest.mark.parametrize(
    ("args", "env", "expected"),
    [
        (("--relay", "grpc"), {}, "grpc"),
        ((), {"OTEL_TRACES_EXPORTER": "console"}, "opentelemetry.sdk"),
    ],
)
def test_a_flag_that_needs_them_loads_them(
    tmp_path: Path, args: tuple[str, ...], env: dict[str, str], expected: str
) -> None:
    # The same check sees them when a configuration asks for them.
    assert expected in loaded_by(tmp_path, *args, env=env)[1]
