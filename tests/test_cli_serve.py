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
from collections.abc import Sequence
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest

import plugproxy
from plugproxy.spec.registry import SPEC_NAMES as SPEC_ORDER

# Where the plugproxy under test lives (src/, or site-packages for an installed build).
SRC = Path(plugproxy.__file__).resolve().parents[1]
HEAVY = ("grpc", "opentelemetry.sdk", "plugproxy.net.tlsfiles", "plugproxy.net.tlslog")

PROBE = textwrap.dedent(
    """
    import asyncio, json, sys
    from plugproxy.cli import serve

    HEAVY = tuple(sys.argv[1].split(","))

    async def main() -> None:
        server = serve.ProxyServer(serve.parse_settings(sys.argv[2:]))
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


def run_probe(
    tmp_path: Path,
    probe: str,
    args: Sequence[str],
    env: dict[str, str] | None = None,
    probe_args: Sequence[str] = (),
) -> dict[str, Any]:
    """Run ``probe`` (given ``probe_args``, then the serve flags: endpoints and ``args``)
    in a fresh interpreter, against a gRPC server without services in this process; what
    it printed last, as JSON."""
    plugin = tmp_path / "plugin.sock"
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    server.add_insecure_port(f"unix:{plugin}")
    server.start()
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "PLUGPROXY_"))}
    environ["PYTHONPATH"] = os.pathsep.join([str(SRC), *sys.path])
    environ.update(env or {})
    argv = ["--listen", f"unix://{tmp_path / 'proxy.sock'}", "--upstream", f"unix://{plugin}"]
    try:
        done = subprocess.run(
            [
                sys.executable,
                "-c",
                probe,
                *probe_args,
                *argv,
                "--admin-listen",
                "127.0.0.1:0",
                *args,
            ],
            env=environ,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        server.stop(0)
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return result


def loaded_by(
    tmp_path: Path, *args: str, env: dict[str, str] | None = None
) -> tuple[bool, list[str]]:
    """Whether a proxy with ``args`` reached its plugin, and what it imported among HEAVY."""
    result = run_probe(tmp_path, PROBE, args, env, probe_args=[",".join(HEAVY)])
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


# A proxy builds a bundled spec (its pool, rule table, checkers and plans) on the first call
# of one of its methods. The probe lists, before and after one CSI v1 call, which specs have
# read their descriptors and which rule tables are imported.
LAZY_PROBE = textwrap.dedent(
    """
    import asyncio, json, sys
    import grpc
    from plugproxy.cli import serve
    from plugproxy.spec.registry import SPEC_NAMES

    def built(server):
        return {
            "pools": [n for n in SPEC_NAMES if server.registry.specs[n].loaded],
            "tables": [
                n for n in SPEC_NAMES if "plugproxy.rules." + n.replace(".", "_") in sys.modules
            ],
        }

    def call(target):
        with grpc.insecure_channel(target) as channel:
            try:
                channel.unary_unary("/csi.v1.Identity/GetPluginInfo")(b"", timeout=10)
            except grpc.RpcError as err:
                return err.code().name
        return "OK"

    async def main() -> None:
        settings = serve.parse_settings(sys.argv[1:])
        server = serve.ProxyServer(settings)
        await server.start()
        await server.upstream.wait_ready(3)
        before = built(server)
        code = await asyncio.to_thread(call, "unix:" + settings.listen.removeprefix("unix://"))
        after = built(server)
        await server.stop(0)
        print(json.dumps({"before": before, "after": after, "code": code}))

    asyncio.run(main())
    """
)


@pytest.mark.parametrize(
    ("args", "at_start"),
    [
        ((), {}),
        # Startup checks of rule ids and field paths read only the specs they name.
        (("--rule", "kms.size-limit=off"), {"tables": ["kms.v2"]}),
        (("--redact", "v2.EncryptRequest.uid"), {"pools": ["kms.v2"]}),
    ],
)
def test_a_spec_is_built_on_its_first_call(
    tmp_path: Path, args: tuple[str, ...], at_start: dict[str, list[str]]
) -> None:
    result = run_probe(tmp_path, LAZY_PROBE, args)
    assert result["code"] == "UNIMPLEMENTED"  # the plugin's answer, relayed
    expected = {kind: at_start.get(kind, []) for kind in ("pools", "tables")}
    assert result["before"] == expected
    assert result["after"] == {
        kind: sorted({"csi.v1", *names}, key=SPEC_ORDER.index) for kind, names in expected.items()
    }
