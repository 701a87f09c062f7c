"""`plugproxy call` as a user runs it: real plugins and proxies on temporary sockets, the
call run as a process (and through cli.main), its answer read back from stdout."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from plugproxy.cli import demo, serve
from plugproxy.cli import main as cli
from plugproxy.core.log import Logger
from plugproxy.fakes import start_fake_plugin
from plugproxy.fakes.knobs import FakeKnobs
from plugproxy.spec.registry import SPEC_NAMES, declared_paths, load_spec
from tests.support import build_descriptor_set, start_proxy, start_recorder, wait_until
from tests.test_net_transport import CA, SecretDir

ROOT = Path(__file__).resolve().parents[1]
PLUGIN_NAME = "csi.call-test.example"
CREATE = "/csi.v1.Controller/CreateVolume"
CAPABILITY = {"mount": {}, "access_mode": {"mode": "SINGLE_NODE_WRITER"}}
ENDPOINT_VARIABLES = ("CSI_ENDPOINT", "COSI_ENDPOINT", "CMI_ENDPOINT")
CLEAN_ENV = {
    k: v
    for k, v in os.environ.items()
    if not k.startswith("PLUGPROXY_") and k not in ENDPOINT_VARIABLES
}
# `plugproxy` on the PATH, as the README assumes.
SHELL_ENV = {**CLEAN_ENV, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}


@dataclass
class Ran:
    code: int
    out: str
    err: str

    def answers(self) -> list[Any]:
        """The JSON documents at the start of stdout, in order (up to the first line that is
        not JSON, such as the method names of --list)."""
        decoder, text, found, position = json.JSONDecoder(), self.out, [], 0
        while True:
            while position < len(text) and text[position].isspace():
                position += 1
            if position == len(text) or text[position] not in "{[":
                return found
            value, position = decoder.raw_decode(text, position)
            found.append(value)

    @property
    def error_line(self) -> str:
        lines = self.err.strip().splitlines()
        assert len(lines) == 1, self.err
        return lines[0]


def run_call(*args: str, stdin: str | None = None, env: dict[str, str] | None = None) -> Ran:
    result = subprocess.run(
        [sys.executable, "-m", "plugproxy", "call", *args],
        input=stdin,
        stdin=subprocess.DEVNULL if stdin is None else None,
        capture_output=True,
        text=True,
        timeout=60,
        env={**CLEAN_ENV, **(env or {})},
        check=False,
    )
    return Ran(result.returncode, result.stdout, result.stderr)


async def acall(*args: str, stdin: str = "", env: dict[str, str] | None = None) -> Ran:
    """run_call for tests whose servers run on their own event loop."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "plugproxy",
        "call",
        *args,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**CLEAN_ENV, **(env or {})},
    )
    out, err = await asyncio.wait_for(proc.communicate(stdin.encode()), 60)
    assert proc.returncode is not None
    return Ran(proc.returncode, out.decode(), err.decode())


def main_call(capsys: pytest.CaptureFixture[str], *args: str) -> Ran:
    """The same through cli.main, in this process."""
    try:
        code = cli.main(["call", *args])
    except SystemExit as exc:  # argparse's own errors
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return Ran(code, out, err)


def wait_for_path(path: Path, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


# -- plugins and a proxy as processes, shared by the module's synchronous tests ------------


@dataclass
class Stack:
    plugin: Path  # the fake CSI plugin's socket
    proxy: Path  # the proxy's socket in front of it
    device_plugin: Path  # a fake device plugin's socket

    @property
    def endpoint(self) -> str:
        return f"unix://{self.proxy}"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("call")
    s = Stack(tmp / "plugin.sock", tmp / "csi.sock", tmp / "dp.sock")
    commands = [
        ["fake-plugin", "--spec", "csi.v1", "--listen", f"unix://{s.plugin}",
         "--plugin-name", PLUGIN_NAME, "--delay", "GetCapacity=5"],
        ["serve", "--listen", s.endpoint, "--upstream", f"unix://{s.plugin}",
         "--admin-listen", "off"],
        ["fake-plugin", "--spec", "device-plugin", "--listen", f"unix://{s.device_plugin}",
         "--stream-period", "0.05"],
    ]  # fmt: skip
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "plugproxy", *argv],
            env=CLEAN_ENV,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for argv in commands
    ]
    try:
        for path in (s.plugin, s.proxy, s.device_plugin):
            wait_for_path(path)
        yield s
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(timeout=30)


# -- unary calls ---------------------------------------------------------------------------


def test_get_plugin_info_through_the_proxy_prints_the_plugins_answer(stack: Stack):
    ran = run_call("--endpoint", stack.endpoint, "--spec", "csi.v1", "GetPluginInfo")
    assert ran.code == 0, ran.err
    assert ran.err == ""
    (answer,) = ran.answers()
    assert answer["name"] == PLUGIN_NAME
    assert answer["vendor_version"]  # the spec's field names, not lowerCamel JSON names
    assert ran.out.startswith("{\n  ")  # indented, one document


@pytest.mark.parametrize(
    "method",
    [
        ["/csi.v1.Identity/GetPluginInfo"],
        ["csi.v1.Identity/GetPluginInfo"],
        ["csi.v1.Identity.GetPluginInfo"],
        ["--spec", "csi.v1", "Identity/GetPluginInfo"],
        ["--spec", "csi.v1", "GetPluginInfo"],
    ],
)
def test_a_method_is_found_by_its_full_name_or_its_tail(stack, capsys, method):
    ran = main_call(capsys, "-e", stack.endpoint, *method)
    assert ran.code == 0, ran.err
    assert ran.answers() == [
        {
            "name": PLUGIN_NAME,
            "vendor_version": "0.1.0",
            "manifest": {"implementation": "plugproxy fake plugin"},
        }
    ]


async def test_create_volume_reaches_the_plugin_with_its_parameters(tmp_path):
    plugin_sock, proxy_sock = tmp_path / "plugin.sock", tmp_path / "csi.sock"
    fake = await start_fake_plugin("csi.v1", f"unix://{plugin_sock}")
    proxy = await start_proxy(str(proxy_sock), str(plugin_sock))
    try:
        request = {
            "name": "pvc-call-1",
            "capacity_range": {"required_bytes": str(2 << 30)},
            "volume_capabilities": [CAPABILITY],
            "parameters": {"tier": "fast", "replicas": "3"},
            "secrets": {"password": "pa55-w0rd-value"},
        }
        ran = await acall("-e", f"unix://{proxy_sock}", CREATE, json.dumps(request))
        assert ran.code == 0, ran.err
        (answer,) = ran.answers()
        volume_id = answer["volume"]["volume_id"]
        assert answer["volume"]["capacity_bytes"] == str(2 << 30)  # int64 as JSON strings
        assert fake.plugin.backend.volumes[volume_id].parameters == request["parameters"]
    finally:
        await proxy.stop(0)
        await fake.stop(0)


async def test_secrets_and_metadata_reach_the_plugin_as_given(tmp_path):
    """The request's bytes as the plugin got them (secrets too), the metadata it saw, and
    with -v its response headers, trailers and the status on stderr."""
    create = load_spec("csi.v1").message_class("csi.v1.CreateVolumeRequest")
    answer = load_spec("csi.v1").message_class("csi.v1.CreateVolumeResponse")
    plugin_sock, proxy_sock = tmp_path / "plugin.sock", tmp_path / "csi.sock"
    server, plugin = await start_recorder(str(plugin_sock))
    plugin.raw[CREATE] = lambda request: answer(
        volume={"volume_id": "vol-recorded", "capacity_bytes": 1}
    ).SerializeToString()
    proxy = await start_proxy(str(proxy_sock), str(plugin_sock))
    try:
        request = {
            "name": "pvc-call-2",
            "volume_capabilities": [CAPABILITY],
            "parameters": {"tier": "fast"},
            "secrets": {"password": "pa55-w0rd-value", "token": "t0ken-value"},
        }
        blob = base64.b64encode(b"\x00\x01\xff").decode()
        ran = await acall(
            "-e", f"unix://{proxy_sock}", "--spec", "csi.v1", "CreateVolume", json.dumps(request),
            "-H", "x-tenant=blue", "--metadata", "X-Case=kept", "-H", f"x-blob-bin={blob}", "-v",
        )  # fmt: skip
        assert ran.code == 0, ran.err
        assert ran.answers() == [{"volume": {"volume_id": "vol-recorded", "capacity_bytes": "1"}}]
        seen = plugin.last()
        sent = create.FromString(seen.requests[0])
        assert dict(sent.secrets) == request["secrets"]
        assert dict(sent.parameters) == {"tier": "fast"}
        assert sent.name == "pvc-call-2"
        assert seen.metadata["x-tenant"] == "blue"
        assert seen.metadata["x-case"] == "kept"  # gRPC metadata keys are lower case
        assert seen.metadata["x-blob-bin"] == b"\x00\x01\xff"
        err = ran.err.splitlines()
        assert err[0].startswith(f"call: {CREATE} (unary) at unix://{proxy_sock}")
        assert "header x-initial: hello" in err
        assert "header x-initial-bin: AAE=" in err  # binary values in base64
        assert "trailer x-trailer: bye" in err
        assert re.fullmatch(r"status: OK, [0-9.]+ ms", err[-1])
    finally:
        await proxy.stop(0)
        await server.stop(0)


def test_a_failing_call_prints_its_status_and_exits_1(stack: Stack):
    request = '{"volume_id": "vol-9", "volume_path": "/mnt/vol-9"}'
    ran = run_call("-e", stack.endpoint, "csi.v1.Node/NodeGetVolumeStats", request)
    assert ran.code == 1
    assert ran.out == ""
    assert ran.error_line == "NOT_FOUND: volume 'vol-9' does not exist"


def test_a_deadline_ends_the_call_with_deadline_exceeded(stack: Stack, capsys):
    started = time.monotonic()
    ran = main_call(
        capsys, "-e", stack.endpoint, "--spec", "csi.v1", "GetCapacity", "--timeout", "300ms"
    )
    assert time.monotonic() - started < 4  # the plugin takes 5 s to answer
    assert ran.code == 1
    assert ran.error_line.startswith("DEADLINE_EXCEEDED")
    assert ran.out == ""


def test_the_request_may_come_from_stdin(stack: Stack):
    request = {"name": "pvc-from-stdin", "volume_capabilities": [CAPABILITY]}
    ran = run_call(
        "-e", stack.endpoint, "--spec", "csi.v1", "CreateVolume", "-", stdin=json.dumps(request)
    )
    assert ran.code == 0, ran.err
    (answer,) = ran.answers()
    assert answer["volume"]["volume_id"]
    # the same name again: the fake answers with the same volume (the call is idempotent)
    again = run_call(
        "-e", stack.endpoint, "--spec", "csi.v1", "CreateVolume", "-", stdin=json.dumps(request)
    )
    assert again.answers() == [answer]


def test_the_endpoint_defaults_to_the_specs_variable(stack: Stack, capsys):
    ran = run_call("--spec", "csi.v1", "Probe", env={"CSI_ENDPOINT": str(stack.proxy)})
    assert ran.code == 0, ran.err
    assert ran.answers() == [{"ready": True}]
    missing = main_call(capsys, "--spec", "csi.v1", "Probe")
    assert missing.code == 2
    assert "--endpoint is required (or CSI_ENDPOINT)" in missing.error_line


# -- method names ---------------------------------------------------------------------------


def test_a_name_several_specs_define_is_refused_with_the_candidates(capsys):
    ran = main_call(capsys, "-e", "unix:///nonexistent.sock", "GetPluginInfo")
    assert ran.code == 2
    line = ran.error_line
    assert line.startswith("plugproxy: error: method 'GetPluginInfo' is ambiguous")
    for path in (
        "/csi.v1.Identity/GetPluginInfo",
        "/csi.v0.Identity/GetPluginInfo",
        "/cmi.v1.Identity/GetPluginInfo",
    ):
        assert path in line
    assert "--spec" in line
    # --spec picks one of them
    narrowed = main_call(capsys, "--list", "--spec", "csi.v0", "GetPluginInfo")
    assert narrowed.out.splitlines() == ["/csi.v0.Identity/GetPluginInfo"]


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--spec", "csi.v1", "GetPlugnInfo"], "did you mean /csi.v1.Identity/GetPluginInfo"),
        (["csi.v1.Identity/GetPluginInf"], "did you mean /csi.v1.Identity/GetPluginInfo"),
        (["--spec", "kms", "Encrypts"], "did you mean /v2.KeyManagementService/Encrypt"),
        (["/acme.Unknown/Thing"], "unknown method '/acme.Unknown/Thing'"),
    ],
)
def test_an_unknown_method_is_one_line_naming_close_matches(capsys, args, expected):
    ran = main_call(capsys, "-e", "unix:///nonexistent.sock", *args)
    assert ran.code == 2
    assert ran.error_line.startswith("plugproxy: error: unknown method")
    assert expected in ran.error_line


def test_list_prints_every_method_or_those_of_one_spec(capsys):
    every = main_call(capsys, "--list")
    assert every.code == 0
    expected = sorted(path for name in SPEC_NAMES for path in declared_paths(name))
    assert every.out.splitlines() == expected
    kms = main_call(capsys, "--list", "--spec", "kms")
    assert kms.out.splitlines() == [
        "/v2.KeyManagementService/Decrypt",
        "/v2.KeyManagementService/Encrypt",
        "/v2.KeyManagementService/Status",
    ]
    unknown_spec = main_call(capsys, "--list", "--spec", "csi.v9")
    assert unknown_spec.code == 2
    assert "--spec 'csi.v9'" in unknown_spec.error_line


def test_help_documents_the_exit_status_and_completion():
    result = subprocess.run(
        [sys.executable, "-m", "plugproxy", "call", "--help"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 0
    assert result.stdout.startswith("usage: plugproxy call")
    assert "exit status: 0 OK; 1 the call ended with a gRPC status" in result.stdout
    assert 'complete -W "$(plugproxy call --list)" plugproxy' in result.stdout


# -- requests that do not fit ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("request_text", "expected"),
    [
        ('{"nme": "pvc-1"}', "unknown field 'nme'; did you mean name?"),
        (
            '{"volume_capabilities": [{"mount": {"fs_tpe": "ext4"}}]}',
            "unknown field 'fs_tpe' at CreateVolumeRequest.volume_capabilities[0].mount"
            " (csi.v1.VolumeCapability.MountVolume); did you mean fs_type?",
        ),
        ('{"capacity_range": {"required_bytes": "lots"}}', "field capacity_range.required_bytes:"),
        ('{"volume_capabilities": {"mount": {}}}', "field volume_capabilities:"),
        ('{"name": ', "REQUEST is not JSON: Expecting value (line 1 column 10)"),
        ("[]", "expected a JSON object (csi.v1.CreateVolumeRequest), got an array"),
    ],
)
def test_a_request_that_does_not_fit_is_one_line_naming_the_field(capsys, request_text, expected):
    # No endpoint needed: the request is checked before anything is dialled.
    ran = main_call(capsys, "--spec", "csi.v1", "CreateVolume", request_text)
    assert ran.code == 2
    assert ran.error_line.startswith("plugproxy: error: ")
    assert expected in ran.error_line
    assert ran.out == ""


@pytest.mark.parametrize(
    ("method", "request_text"),
    [
        ("CreateVolume", '{"secrets": "hunter2-value"}'),
        ("CreateVolume", '{"secrets": {"password": ["hunter2-value"]}}'),
        ("NodeStageVolume", '{"secrets": {"password": {"hunter2-value": 1}}}'),
    ],
)
def test_a_secret_that_does_not_fit_is_named_but_not_shown(capsys, method, request_text):
    ran = main_call(capsys, "--spec", "csi.v1", method, request_text)
    assert ran.code == 2
    assert "field secrets: not a valid value (not shown: the field is secret)" in ran.error_line
    assert "hunter2" not in ran.err


# -- streams --------------------------------------------------------------------------------


def test_a_server_stream_prints_each_message_and_max_messages_stops_it(stack: Stack, capsys):
    started = time.monotonic()
    ran = main_call(
        capsys, "-e", f"unix://{stack.device_plugin}", "ListAndWatch", "--max-messages", "3", "-v"
    )
    assert ran.code == 0, ran.err
    answers = ran.answers()
    assert len(answers) == 3
    for answer in answers:
        assert [d["ID"] for d in answer["devices"]] == [f"acc-{i}" for i in range(8)]
    # the fake flips one device's health per update: each message is a new one
    health = [[d["health"] for d in answer["devices"]] for answer in answers]
    assert health[0] != health[1] != health[2]
    assert "status: stopped after 3 message(s) (--max-messages)" in ran.err
    assert time.monotonic() - started < 10
    compact = main_call(
        capsys, "-e", str(stack.device_plugin), "--compact", "ListAndWatch", "--max-messages", "2"
    )
    lines = compact.out.splitlines()
    assert len(lines) == 2
    assert all(len(json.loads(line)["devices"]) == 8 for line in lines)


TALLY_PROTO = """
syntax = "proto3";
package acme.tally.v1;

service Tally {
  rpc Sum(stream Number) returns (Total);
  rpc Running(stream Number) returns (stream Total);
  rpc Login(Credentials) returns (Total);
}

message Number { int64 value = 1; }
message Total { int64 total = 1; int32 count = 2; }
message Credentials {
  string user = 1;
  string password = 2 [debug_redact = true];
}
"""


@dataclass
class Tally:
    """A plugin of the tally API: what it summed, and the calls it saw end."""

    received: list[int] = field(default_factory=list)
    completed: list[int] = field(default_factory=list)
    cancelled: int = 0


@pytest.fixture
async def tally(tmp_path: Path) -> AsyncIterator[tuple[str, str, Tally]]:
    descriptor_set = build_descriptor_set(tmp_path, {"acme/tally/v1/tally.proto": TALLY_PROTO})
    pool = descriptor_pool.DescriptorPool()
    with open(descriptor_set, "rb") as f:
        for fdp in descriptor_pb2.FileDescriptorSet.FromString(f.read()).file:
            pool.Add(fdp)
    number, total = (
        message_factory.GetMessageClass(pool.FindMessageTypeByName(f"acme.tally.v1.{name}"))
        for name in ("Number", "Total")
    )
    credentials = message_factory.GetMessageClass(
        pool.FindMessageTypeByName("acme.tally.v1.Credentials")
    )
    state = Tally()

    async def sum_(requests: Any, context: Any) -> Any:
        values = []
        try:
            async for request in requests:
                values.append(request.value)
                state.received.append(request.value)
            # The requests end alike when the client half-closes and when it cancels; a
            # cancellation cancels this handler a moment later.
            await asyncio.sleep(0.3)
        except asyncio.CancelledError:
            state.cancelled += 1
            raise
        state.completed.append(sum(values))
        return total(total=sum(values), count=len(values))

    async def running(requests: Any, context: Any) -> Any:
        so_far, count = 0, 0
        async for request in requests:
            so_far, count = so_far + request.value, count + 1
            yield total(total=so_far, count=count)

    async def login(request: Any, context: Any) -> Any:
        await context.abort(
            grpc.StatusCode.PERMISSION_DENIED,
            f"wrong password {request.password!r} for {request.user}",
        )

    ser = total.SerializeToString
    handlers = {
        "Sum": grpc.stream_unary_rpc_method_handler(sum_, number.FromString, ser),
        "Running": grpc.stream_stream_rpc_method_handler(running, number.FromString, ser),
        "Login": grpc.unary_unary_rpc_method_handler(login, credentials.FromString, ser),
    }
    sock = tmp_path / "tally.sock"
    server = grpc.aio.server()
    server.add_generic_rpc_handlers(
        [grpc.method_handlers_generic_handler("acme.tally.v1.Tally", handlers)]
    )
    server.add_insecure_port(f"unix:{sock}")
    await server.start()
    try:
        yield f"unix://{sock}", descriptor_set, state
    finally:
        await server.stop(0)


async def test_client_streaming_takes_a_json_array_or_json_lines_from_stdin(tally):
    endpoint, descriptor_set, state = tally
    common = ("-e", endpoint, "--descriptor-set", descriptor_set)
    ran = await acall(*common, "Tally/Sum", '[{"value": 1}, {"value": "2"}, {}]')
    assert ran.code == 0, ran.err
    assert ran.answers() == [{"total": "3", "count": 3}]
    lines = '{"value": 10}\n{"value": 20}\n\n{"value":\n 30}\n'
    ran = await acall(*common, "acme.tally.v1.Tally.Sum", stdin=lines)
    assert ran.code == 0, ran.err
    assert ran.answers() == [{"total": "60", "count": 3}]
    assert state.completed == [3, 60]


async def test_a_bad_request_in_a_stream_cancels_the_call(tally):
    """Requests go out as standard input gives them; a bad one cancels the call, it does not
    half-close it: the plugin never takes the requests before it for a whole stream."""
    endpoint, descriptor_set, state = tally
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "plugproxy", "call", "-e", endpoint,
        "--descriptor-set", descriptor_set, "Sum",
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, env=CLEAN_ENV,
    )  # fmt: skip
    assert proc.stdin is not None
    proc.stdin.write(b'{"value": 1}\n')
    await proc.stdin.drain()
    await wait_until(lambda: state.received == [1], timeout=30)  # stdin still open
    out, err = await asyncio.wait_for(proc.communicate(b'{"valeu": 2}\n{"value": 3}\n'), 60)
    ran = Ran(proc.returncode or 0, out.decode(), err.decode())
    assert ran.code == 2
    assert "request 2 (acme.tally.v1.Number): unknown field 'valeu'" in ran.error_line
    assert "did you mean value?" in ran.error_line
    await wait_until(lambda: state.cancelled == 1)
    assert state.completed == []
    # given inline, a bad request is found before the call starts
    ran = await acall("-e", endpoint, "--descriptor-set", descriptor_set, "Sum", '[{}, "x"]')
    assert ran.code == 2
    assert "request 2: expected a JSON object (acme.tally.v1.Number), got a string" in ran.err
    assert state.cancelled == 1 and state.completed == []


async def test_a_bidi_stream_answers_each_request(tally):
    endpoint, descriptor_set, _ = tally
    lines = "".join(json.dumps({"value": v}) + "\n" for v in (5, 6, 7))
    ran = await acall(
        "-e", endpoint, "--descriptor-set", descriptor_set, "--compact", "Running", stdin=lines
    )
    assert ran.code == 0, ran.err
    assert [json.loads(line) for line in ran.out.splitlines()] == [
        {"total": "5", "count": 1},
        {"total": "11", "count": 2},
        {"total": "18", "count": 3},
    ]


async def test_a_plugin_error_repeating_a_request_secret_is_masked(tally):
    endpoint, descriptor_set, _ = tally
    request = '{"user": "alice", "password": "hunter2-pass"}'
    ran = await acall("-e", endpoint, "--descriptor-set", descriptor_set, "Login", request)
    assert ran.code == 1
    assert ran.error_line == "PERMISSION_DENIED: wrong password '***' for alice"


def test_list_knows_the_methods_of_a_descriptor_set(tmp_path, capsys):
    descriptor_set = build_descriptor_set(tmp_path, {"acme/tally/v1/tally.proto": TALLY_PROTO})
    ran = main_call(capsys, "--descriptor-set", descriptor_set, "--list", "--spec", "acme.tally.v1")
    assert ran.out.splitlines() == [
        "/acme.tally.v1.Tally/Login",
        "/acme.tally.v1.Tally/Running",
        "/acme.tally.v1.Tally/Sum",
    ]
    broken = main_call(capsys, "--descriptor-set", str(tmp_path / "missing.binpb"), "--list")
    assert broken.code == 2
    assert "--descriptor-set" in broken.error_line and "missing.binpb" in broken.error_line


# -- TLS ------------------------------------------------------------------------------------

SERVER_NAME = "appliance.example"
NODE_ID = "spiffe://example.org/ns/kube-system/sa/csi-node"


async def test_a_tls_endpoint_is_called_with_the_bridges_flags(tmp_path):
    """The appliance side of a bridge (tls:// in front of the fake plugin, one client
    identity allowed): the call gets through with the node's certificate, is refused with
    another's, and unusable TLS settings are one-line errors."""
    ca = CA("call-ca")
    appliance, node, intruder = (
        SecretDir(tmp_path / name) for name in ("appliance", "node", "intruder")
    )
    appliance.write(ca.pem, ca.issue("appliance", dns=(SERVER_NAME,), ips=("127.0.0.1",)))
    node.write(ca.pem, ca.issue("csi-node", uris=(NODE_ID,)))
    intruder.write(ca.pem, ca.issue("intruder", uris=("spiffe://example.org/ns/x/sa/y",)))
    plugin_sock = tmp_path / "plugin.sock"
    fake = await start_fake_plugin(
        "csi.v1", f"unix://{plugin_sock}", FakeKnobs(plugin_name=PLUGIN_NAME)
    )
    settings = serve.parse_settings(
        ["--listen", "tls://127.0.0.1:0", "--upstream", f"unix://{plugin_sock}",
         *appliance.args(), "--tls-allow-identity", NODE_ID, "--admin-listen", "off"],
        environ={},
    )  # fmt: skip
    proxy = serve.ProxyServer(settings, logger=Logger(io.StringIO()))
    await proxy.start()
    try:
        endpoint = f"tls://127.0.0.1:{proxy.port}"
        named = ("--tls-server-name", SERVER_NAME, "--spec", "csi.v1", "GetPluginInfo")
        ran = await acall("-e", endpoint, *node.args(), *named)
        assert ran.code == 0, ran.err
        assert ran.answers()[0]["name"] == PLUGIN_NAME
        refused = await acall("-e", endpoint, *intruder.args(), *named)
        assert refused.code == 1
        assert refused.error_line.startswith("PERMISSION_DENIED: plugproxy: client identity")
        no_key = await acall("-e", endpoint, "--tls-ca", node.ca, "--tls-cert", node.cert, *named)
        assert no_key.code == 2
        assert no_key.error_line == (
            f"plugproxy: error: --endpoint {endpoint} needs --tls-key"
            " (mutual TLS: CA, certificate, key)"
        )
        bad_ca = await acall(
            "-e", endpoint, "--tls-ca", str(tmp_path / "nope.pem"), "--tls-cert", node.cert,
            "--tls-key", node.key, *named,
        )  # fmt: skip
        assert bad_ca.code == 2
        assert (
            bad_ca.error_line == f"plugproxy: error: --tls-ca {tmp_path / 'nope.pem'}: no such file"
        )
        plain = await acall("-e", f"unix://{plugin_sock}", *node.args(), *named)
        assert plain.code == 2
        assert "--tls-ca, --tls-cert, --tls-key, --tls-server-name given but" in plain.error_line
    finally:
        await proxy.stop(0)
        await fake.stop(0)


# -- the commands the demo and the README show ------------------------------------------------


def run_recipe(servers: str, calls: str, tmp_path: Path, sockets: list[str]) -> Ran:
    """The servers' commands in a shell of their own (stopped at the end), then, once their
    sockets are there, the calls' commands in another, as a reader pastes them. /tmp/ is
    the test's own directory; the proxy's admin server is off (it would want port 9808)."""
    here = f"{tmp_path}/"
    env = {**SHELL_ENV, "PLUGPROXY_ADMIN_LISTEN": "off"}
    shell = subprocess.Popen(
        ["bash", "-c", f"set -e\n{servers.replace('/tmp/', here)}\nwait\n"],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        for name in sockets:
            wait_for_path(tmp_path / name)
        result = subprocess.run(
            ["bash", "-ec", calls.replace("/tmp/", here)],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        return Ran(result.returncode, result.stdout, result.stderr)
    finally:
        os.killpg(shell.pid, signal.SIGTERM)
        shell.wait(timeout=30)


def test_the_demos_try_it_yourself_lines_work(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "plugproxy", "demo"],
        capture_output=True,
        text=True,
        timeout=120,
        env=CLEAN_ENV,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    hint = result.stdout.split("\nTry it yourself", 1)[1]
    assert ". .venv/bin/activate" in hint.splitlines()[0]  # the README's activation line
    lines = [line.strip() for line in hint.splitlines() if line.startswith("  plugproxy ")]
    assert lines == [*demo.TRY_IT_SERVERS, *demo.TRY_IT_CALLS]
    ran = run_recipe(
        "\n".join(demo.TRY_IT_SERVERS),
        "\n".join(demo.TRY_IT_CALLS),
        tmp_path,
        ["plugin.sock", "csi.sock"],
    )
    assert ran.code == 0, ran.err
    info, created = ran.answers()[:2]
    assert info["name"] == "csi.fake.plugproxy.io"
    assert created["volume"]["volume_id"]
    assert "/csi.v1.Identity/GetPluginInfo\n" in ran.out  # --list


def test_the_readmes_sending_a_call_commands_work_as_pasted(tmp_path):
    text = (ROOT / "README.md").read_text()
    section = text.split("### Sending a call\n", 1)[1].split("\n#", 1)[0]
    servers, calls = re.findall(r"```sh\n(.*?)```", section, re.DOTALL)
    ran = run_recipe(servers, calls, tmp_path, ["plugin.sock", "csi.sock"])
    assert ran.code == 0, ran.err
    info, created = ran.answers()[:2]
    assert info["name"] == "csi.fake.plugproxy.io"
    assert created["volume"]["volume_id"]
    assert "NOT_FOUND: volume 'vol-9' does not exist" in ran.err
    assert "exit status 1" in ran.out
    assert "/csi.v1.Node/NodeGetVolumeStats" in ran.out.splitlines()  # --list
    completion = re.search(r'`(complete -W "\$\(plugproxy call --list\)" plugproxy)`', section)
    assert completion is not None
    words = subprocess.run(
        ["bash", "-c", f"{completion.group(1)} && complete -p plugproxy"],
        env=SHELL_ENV,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert "/csi.v1.Identity/GetPluginInfo" in words.stdout
