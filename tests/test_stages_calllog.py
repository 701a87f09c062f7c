"""The call log stage: one line per call, request ids, redacted and capped payloads."""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Iterable
from typing import Any

import grpc
import pytest

from plugproxy.api import Call, Reject, Runtime, Stage
from plugproxy.cli import serve
from plugproxy.core.endpoints import ConfigError
from plugproxy.core.log import Logger
from plugproxy.core.sampling import picked_indices
from plugproxy.spec import redact
from plugproxy.spec.registry import Registry, load_spec
from plugproxy.stages import calllog
from plugproxy.stages.calllog import CallLogStage, PayloadCallLogStage
from tests.support import RecorderPlugin, channel

CSI = load_spec("csi.v1")
STAGE = "/csi.v1.Node/NodeStageVolume"
LIST = "/csi.v1.Controller/ListVolumes"
ALLOCATED = "/csi.v1.SnapshotMetadata/GetMetadataAllocated"
SECRET = "hunter2-canary-value"


class Plugin(RecorderPlugin):
    """RecorderPlugin plus failing unary paths and server-streaming paths."""

    def __init__(self) -> None:
        super().__init__()
        self.fail: dict[str, tuple[grpc.StatusCode, str]] = {}
        self.stream: dict[str, Callable[[bytes], Iterable[bytes]]] = {}

    def service(self, details: Any) -> grpc.RpcMethodHandler | None:
        path = details.method
        if path in self.fail:
            code, message = self.fail[path]

            async def failing(request: bytes, context: Any) -> bytes:
                self._record(path, context).requests.append(request)
                await context.abort(code, message)
                return b""

            return grpc.unary_unary_rpc_method_handler(failing)
        if path in self.stream:
            fn = self.stream[path]

            async def streaming(request: bytes, context: Any):
                self._record(path, context).requests.append(request)
                for item in fn(request):
                    yield item

            return grpc.unary_stream_rpc_method_handler(streaming)
        return super().service(details)


@pytest.fixture
async def plugin(tmp_path):
    path = str(tmp_path / "plugin.sock")
    plugin = Plugin()
    server = grpc.aio.server()
    server.add_generic_rpc_handlers([plugin])
    server.add_insecure_port(f"unix:{path}")
    await server.start()
    plugin.path = path  # type: ignore[attr-defined]
    yield plugin
    await server.stop(0)


class Proxy:
    def __init__(self, server: serve.ProxyServer, out: io.StringIO, listen: str) -> None:
        self.server, self.out, self.listen = server, out, listen

    def lines(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.out.getvalue().splitlines()]

    def calls(self) -> list[dict[str, Any]]:
        return [line for line in self.lines() if line["event"] == "call"]


@pytest.fixture
async def make_proxy(tmp_path, plugin):
    started: list[serve.ProxyServer] = []

    async def make(*args: str, stages: list[Stage] | None = None, fmt: str = "json") -> Proxy:
        listen = str(tmp_path / f"proxy{len(started)}.sock")
        argv = ["--listen", f"unix://{listen}", "--upstream", f"unix://{plugin.path}"]
        settings = serve.parse_settings([*argv, "--admin-listen", "off", *args], environ={})
        out = io.StringIO()
        server = serve.ProxyServer(settings, logger=Logger(out, fmt=fmt), stages=stages)
        await server.start()
        started.append(server)
        return Proxy(server, out, listen)

    yield make
    for server in started:
        await server.stop(0)


def stage_request(secret: str = SECRET) -> bytes:
    msg = CSI.message_class("csi.v1.NodeStageVolumeRequest")(
        volume_id="vol-1", staging_target_path="/var/stage/vol-1"
    )
    msg.secrets["password"] = secret
    msg.volume_capability.mount.fs_type = "ext4"
    msg.volume_capability.mount.mount_flags.append("token=mountflag-canary")
    msg.volume_capability.access_mode.mode = 1
    return msg.SerializeToString()


async def unary(listen: str, path: str, request: bytes, metadata=()) -> tuple[bytes, Any]:
    async with channel(listen) as ch:
        try:
            return await ch.unary_unary(path)(request, metadata=metadata, timeout=5), None
        except grpc.aio.AioRpcError as err:
            return b"", err


async def test_one_line_per_call_with_a_generated_request_id_sent_upstream(plugin, make_proxy):
    plugin.raw[STAGE] = lambda req: b""
    proxy = await make_proxy()
    _, err = await unary(proxy.listen, STAGE, stage_request())
    assert err is None
    (line,) = proxy.calls()
    assert line["level"] == "info" and line["time"].endswith("Z")
    assert line["spec"] == "csi.v1"
    assert line["method"] == STAGE
    assert line["keys"] == ["volume:vol-1"]
    assert line["code"] == "OK" and "message" not in line
    assert isinstance(line["duration_ms"], float) and line["duration_ms"] >= 0
    assert "request" not in line and "rejected" not in line  # no payloads unless asked
    assert "request_count" not in line  # unary calls need no counts
    assert plugin.last().metadata["csi.requestid"] == line["request_id"]
    prefix, _, number = line["request_id"].rpartition("-")
    assert len(prefix) == 6 and number.isdigit()
    _, err = await unary(proxy.listen, STAGE, stage_request())
    second = proxy.calls()[1]["request_id"]
    assert second == f"{prefix}-{int(number) + 1}"  # cheap: prefix + counter


async def test_incoming_request_id_is_adopted_and_forwarded_once(plugin, make_proxy):
    plugin.raw[STAGE] = lambda req: b""
    proxy = await make_proxy()
    await unary(proxy.listen, STAGE, stage_request(), metadata=(("csi.requestid", "co-42"),))
    assert proxy.calls()[0]["request_id"] == "co-42"
    seen = plugin.last()
    assert seen.metadata["csi.requestid"] == "co-42"
    # An id that cannot be shown as it is (too long) is replaced in our log, not adopted.
    await unary(proxy.listen, STAGE, stage_request(), metadata=(("csi.requestid", "x" * 500),))
    assert proxy.calls()[1]["request_id"] != "x" * 500


async def test_plugin_error_repeating_a_secret_is_masked_in_the_log_only(plugin, make_proxy):
    message = f"mount failed: bad password {SECRET} for vol-1"
    plugin.fail[STAGE] = (grpc.StatusCode.INTERNAL, message)
    proxy = await make_proxy("--log-payloads")
    _, err = await unary(proxy.listen, STAGE, stage_request())
    assert err is not None and err.details() == message  # the CO gets it unchanged
    (line,) = proxy.calls()
    assert line["code"] == "INTERNAL"
    assert line["message"] == "mount failed: bad password *** for vol-1"
    assert SECRET not in proxy.out.getvalue()
    assert "response" not in line  # an error has no response message


async def test_payloads_are_rendered_redacted(plugin, make_proxy):
    response = CSI.message_class("csi.v1.NodeGetInfoResponse")(
        node_id="node-7", max_volumes_per_node=3
    ).SerializeToString()
    plugin.raw[STAGE] = lambda req: b""
    plugin.raw["/csi.v1.Node/NodeGetInfo"] = lambda req: response
    proxy = await make_proxy("--log-payloads")
    await unary(proxy.listen, STAGE, stage_request())
    await unary(proxy.listen, "/csi.v1.Node/NodeGetInfo", b"")
    stage_line, info_line = proxy.calls()
    assert stage_line["request"] == {
        "volume_id": "vol-1",
        "staging_target_path": "/var/stage/vol-1",
        "volume_capability": {
            "mount": {"fs_type": "ext4", "mount_flags": "***"},
            "access_mode": {"mode": "SINGLE_NODE_WRITER"},
        },
        "secrets": {"password": "***"},
    }
    assert stage_line["request_bytes"] == len(stage_request())
    assert stage_line["response"] == {}
    assert info_line["response"] == {"node_id": "node-7", "max_volumes_per_node": "3"}
    text = proxy.out.getvalue()
    assert SECRET not in text and "mountflag-canary" not in text


async def test_large_list_is_capped_with_a_visible_mark(plugin, make_proxy):
    big = CSI.message_class("csi.v1.ListVolumesResponse")(next_token="more")
    for i in range(10_000):
        big.entries.add().volume.volume_id = f"vol-{i:05d}"
    raw = big.SerializeToString()
    plugin.raw[LIST] = lambda req: raw
    proxy = await make_proxy("--log-payloads", "--log-payload-max-bytes", "4KiB")
    got, err = await unary(proxy.listen, LIST, b"")
    assert err is None and got == raw  # the CO gets the whole answer
    line_text = proxy.out.getvalue().splitlines()[-1]
    assert len(line_text) < 4096 + 1024
    line = json.loads(line_text)
    assert line["response_bytes"] == len(raw)
    assert "stopped at entries[" in line["response"][redact.TRUNCATED_KEY]
    assert "of 10000]" in line["response"][redact.TRUNCATED_KEY]
    assert line["response"]["entries"][0] == {"volume": {"volume_id": "vol-00000"}}
    # 1 MB-class pages are rendered from a sample; the line gives the real list length.
    assert line["response_sampled"] == {"entries": 10_000}


async def test_an_uncapped_large_list_shows_its_head_then_a_spread(plugin, make_proxy):
    big = CSI.message_class("csi.v1.ListVolumesResponse")()
    for i in range(10_000):
        big.entries.add().volume.volume_id = f"vol-{i:05d}"
    raw = big.SerializeToString()
    plugin.raw[LIST] = lambda req: raw
    proxy = await make_proxy("--log-payloads", "--log-payload-max-bytes", "1MiB")
    got, err = await unary(proxy.listen, LIST, b"")
    assert err is None and got == raw
    (line,) = proxy.calls()
    shown = [e["volume"]["volume_id"] for e in line["response"]["entries"]]
    assert shown == [f"vol-{i:05d}" for i in picked_indices(10_000)]
    assert shown[-1] == "vol-09999" and redact.TRUNCATED_KEY not in line["response"]


async def test_streamed_responses_are_counted_and_only_the_first_is_logged(plugin, make_proxy):
    block = CSI.message_class("csi.v1.GetMetadataAllocatedResponse")

    def blocks(request: bytes) -> Iterable[bytes]:
        for i in range(5):
            msg = block(volume_capacity_bytes=1000 + i)
            yield msg.SerializeToString()

    plugin.stream[ALLOCATED] = blocks
    proxy = await make_proxy("--log-payloads")
    request = CSI.message_class("csi.v1.GetMetadataAllocatedRequest")(snapshot_id="snap-1")
    request.secrets["token"] = SECRET
    async with channel(proxy.listen) as ch:
        got = [m async for m in ch.unary_stream(ALLOCATED)(request.SerializeToString())]
    assert len(got) == 5
    (line,) = proxy.calls()
    assert line["request_count"] == 1 and line["response_count"] == 5
    assert line["keys"] == ["snapshot:snap-1"]
    assert line["request"] == {"snapshot_id": "snap-1", "secrets": {"token": "***"}}
    assert line["first_response"] == {"volume_capacity_bytes": "1000"}
    assert "response" not in line


class _Rejecting(Stage):
    name = "rejecting"

    def on_start(self, call: Call) -> None:
        call.add_event("violation", rule="csi.volume_id.required", level="MUST", party="co")
        raise Reject(grpc.StatusCode.INVALID_ARGUMENT, "volume_id is required")


class _Waited(Stage):
    name = "waited"

    def on_start(self, call: Call) -> None:
        call.add_event("violation", rule="rule.a", level="SHOULD", party="plugin")
        call.add_event("violation", rule="rule.b", level="MUST", party="plugin")
        call.add_event("violation", rule="rule.a", level="SHOULD", party="plugin")
        call.stage_state["serialize.wait_seconds"] = 0.25


def _stage(**kwargs: Any) -> tuple[CallLogStage, io.StringIO]:
    out = io.StringIO()
    return CallLogStage(Logger(out), redact.for_specs(), **kwargs), out


async def test_rejected_calls_are_logged_with_their_violations(plugin, make_proxy):
    stage, out = _stage()
    proxy = await make_proxy(stages=[stage, _Rejecting()])
    _, err = await unary(proxy.listen, STAGE, stage_request())
    assert err is not None and err.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert plugin.seen == []
    line = json.loads(out.getvalue())
    assert line["rejected"] is True
    assert line["code"] == "INVALID_ARGUMENT"
    assert line["message"] == "volume_id is required"
    assert line["violations"] == ["csi.volume_id.required"]
    assert line["request_id"]


async def test_wait_and_violation_ids_are_reported_once_each(plugin, make_proxy):
    plugin.raw[STAGE] = lambda req: b""
    stage, out = _stage()
    proxy = await make_proxy(stages=[stage, _Waited()])
    await unary(proxy.listen, STAGE, stage_request())
    line = json.loads(out.getvalue())
    assert line["violations"] == ["rule.a", "rule.b"]
    assert line["serialize_wait_ms"] == 250.0


async def test_errors_mode_logs_only_failures_and_violations(plugin, make_proxy):
    plugin.raw[STAGE] = lambda req: b""
    stage, out = _stage(errors_only=True)
    proxy = await make_proxy(stages=[stage])
    await unary(proxy.listen, STAGE, stage_request())
    assert out.getvalue() == ""
    await unary(proxy.listen, "/csi.v1.Node/NodeGetInfo", b"")  # UNIMPLEMENTED by the plugin
    (line,) = [json.loads(x) for x in out.getvalue().splitlines()]
    assert line["code"] == "UNIMPLEMENTED"
    stage.logger = Logger(out, level="warning")  # info lines below the level cost nothing
    await unary(proxy.listen, "/csi.v1.Node/NodeGetInfo", b"")
    assert len(out.getvalue().splitlines()) == 1


async def test_text_format_carries_the_same_fields(plugin, make_proxy):
    plugin.raw[STAGE] = lambda req: b""
    proxy = await make_proxy("--log-payloads", "--log-format", "text", fmt="text")
    await unary(proxy.listen, STAGE, stage_request())
    line = next(x for x in proxy.out.getvalue().splitlines() if " call " in x)
    assert "method=/csi.v1.Node/NodeStageVolume" in line
    assert '"password":"***"' in line and SECRET not in line


def test_build_honours_the_options():
    def ns(*args: str) -> Any:
        argv = ["--listen", "unix:///a", "--upstream", "unix:///b", *args]
        return serve.parse_settings(argv, {}).stages.call_log

    runtime = Runtime(
        Registry(["csi.v1"]), upstream=None, logger=Logger(io.StringIO()), metrics=None
    )
    assert calllog.build(ns("--call-log", "off"), runtime) is None
    plain = calllog.build(ns(), runtime)
    assert type(plain) is CallLogStage and not hasattr(plain, "on_response")
    payloads = calllog.build(ns("--log-payloads"), runtime)
    assert isinstance(payloads, PayloadCallLogStage) and payloads.payload_max_bytes == 4096
    with pytest.raises(ConfigError, match=r"--redact csi\.v1\.Nope\.x: csi\.v1 has no message"):
        calllog.build(ns("--redact", "csi.v1.Nope.x"), runtime)


def answer_echoing_the_secret(plugin: Any) -> tuple[str, bytes]:
    """The plugin answers CreateVolume with a volume_context quoting SECRET."""
    create = "/csi.v1.Controller/CreateVolume"
    echo = CSI.message_class("csi.v1.CreateVolumeResponse")()
    echo.volume.volume_id = "pvc-9"
    echo.volume.volume_context["debug"] = f"created with password {SECRET}"
    raw = echo.SerializeToString()
    plugin.raw[create] = lambda req: raw
    return create, raw


async def test_a_response_echoing_a_request_secret_is_masked_in_the_log(plugin, make_proxy):
    create, raw = answer_echoing_the_secret(plugin)
    proxy = await make_proxy("--log-payloads")
    request = CSI.message_class("csi.v1.CreateVolumeRequest")(name="pvc-9")
    request.secrets["password"] = SECRET
    got, _ = await unary(proxy.listen, create, request.SerializeToString())
    assert got == raw  # the CO still gets the plugin's bytes
    (line,) = proxy.calls()
    assert line["response"]["volume"]["volume_context"] == {"debug": "created with password ***"}
    assert SECRET not in proxy.out.getvalue()


async def test_a_remembered_render_is_still_masked_for_the_call_whose_secret_it_shows(
    plugin, make_proxy
):
    """Small messages are rendered once per distinct bytes; the secrets of each call are
    masked afterwards, so the same response bytes show a secret only for calls without it."""
    create, raw = answer_echoing_the_secret(plugin)
    proxy = await make_proxy("--log-payloads")
    without = CSI.message_class("csi.v1.CreateVolumeRequest")(name="pvc-9")
    with_secret = CSI.message_class("csi.v1.CreateVolumeRequest")(name="pvc-9")
    with_secret.secrets["password"] = SECRET
    for request in (without, with_secret, without):
        got, _ = await unary(proxy.listen, create, request.SerializeToString())
        assert got == raw
    first, second, third = (line["response"]["volume"]["volume_context"] for line in proxy.calls())
    # Not a secret of the first and third calls: the plugin's text as it is.
    assert first == third == {"debug": f"created with password {SECRET}"}
    assert second == {"debug": "created with password ***"}
