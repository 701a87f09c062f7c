"""The generic rules of every spec (docs/rules.md, family 8), through the real validate stage:
status-code-not-canonical (both relays, a raw HTTP/2 plugin), bad-request-accepted,
retry-without-change, not-idempotent and the service-level unimplemented-advertised. Each
rule: a planted violation from the party it judges, and the legitimate counterpart."""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import pytest

from plugproxy.api import Call, LazyMessage, Reject, Runtime, StatusCode
from plugproxy.core.log import Logger
from plugproxy.core.memory import HANDOVER
from plugproxy.fakes import FailureRule, FakeKnobs, FakePluginHandle, SpecClient, start_fake_plugin
from plugproxy.rules import TABLES
from plugproxy.rules.engine import Violation, compile_table
from plugproxy.rules.generic import (
    RETRY_TTL,
    BackoffSeries,
    GenericMemory,
    answered_by_plugin,
    backs_off,
    generic_rules,
    status_details_count,
    unreadable_text,
)
from plugproxy.rules.state import SpecState
from plugproxy.spec.registry import Registry, load_spec
from plugproxy.stages.validate import ValidateStage
from tests.integration.test_validation_lifecycle import stage_of, through_proxy
from tests.support import channel, start_proxy, wait_until
from tests.test_relay_conformance import (
    OK_HEADERS,
    FakePlugin,
    H2Client,
    PluginConn,
    S,
    connect,
    data,
    grpc_headers,
    headers,
    message,
)

OK = grpc.StatusCode.OK
STAGE = "/var/lib/kubelet/plugins/kubernetes.io/csi/fake/abc/globalmount"
TARGET = "/var/lib/kubelet/pods/uid/volumes/kubernetes.io~csi/pv/mount"
GENERIC = ("status-code-not-canonical", "bad-request-accepted", "retry-without-change")
GENERIC += ("not-idempotent", "unimplemented-advertised")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Driver:
    """One real ValidateStage; calls are driven through its hooks as a relay drives them."""

    def __init__(
        self,
        mode: str = "audit",
        rules: dict[str, str] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.registry = Registry()
        runtime = Runtime(self.registry, upstream=None, logger=Logger(io.StringIO()), metrics=None)
        self.stage = ValidateStage(runtime, mode, rules or {}, clock=clock)
        self.paths = {(m.spec_name, m.name): m.path for m in self.registry.methods()}

    def state(self, spec: str) -> SpecState:
        path = next(p for (s, _), p in self.paths.items() if s == spec)
        return self.stage._plans[path].state

    def caps(self, spec: str, kind: str, *names: str) -> None:
        self.state(spec).set_capabilities(kind, frozenset(names))

    async def call(
        self,
        spec: str,
        rpc: str,
        request: Any = None,
        *,
        code: grpc.StatusCode = OK,
        details: str = "plugin says no",
        response: Any = None,
        raw_status: str | None = None,
        raw: bytes | None = None,
        **fields: Any,
    ) -> list[tuple[str, str]]:
        """One call answered with ``code`` (and ``response``); (rule suffix, party) found.
        ``raw``: the request's bytes as sent, instead of ``request`` serialized."""
        call = await self.begin(spec, rpc, request, raw=raw, **fields)
        return self.end(call, code=code, details=details, response=response, raw_status=raw_status)

    async def begin(
        self, spec: str, rpc: str, request: Any = None, *, raw: bytes | None = None, **fields: Any
    ) -> Call:
        """A call received and judged, not answered yet: it is in flight until ``end``."""
        method = self.registry.lookup(self.paths[(spec, rpc)])
        assert method.request_class is not None and method.response_class is not None
        if request is None:
            request = method.request_class(**fields)
        call = Call(method, (), [], 5.0)
        if raw is None:
            raw = request.SerializeToString()
        call.request = LazyMessage(raw, method.request_class)
        call.request_count = 1
        try:
            pending = self.stage.on_start(call)
            if pending is not None:
                await pending
        except Reject as rej:
            call.code, call.details, call.rejected = rej.code, rej.message, True
        self.last = call
        return call

    def end(
        self,
        call: Call,
        *,
        code: grpc.StatusCode = OK,
        details: str = "plugin says no",
        response: Any = None,
        raw_status: str | None = None,
    ) -> list[tuple[str, str]]:
        """The plugin's answer to a call ``begin`` started; (rule suffix, party) found."""
        method = call.method
        assert method.response_class is not None
        if not call.rejected:
            if code is OK:
                reply = response if response is not None else method.response_class()
                lazy = LazyMessage(reply.SerializeToString(), method.response_class)
                call.response = lazy
                call.response_count = 1
                self.stage.on_response(call, lazy)
            else:
                call.code, call.details = StatusCode.of(code), details
            call.raw_status = raw_status
        self.stage.on_finish(call)
        self.last = call
        return found(call)


def found(call: Call) -> list[tuple[str, str]]:
    return [
        (str(e.attributes["rule"]).split(".", 1)[1], str(e.attributes["party"]))
        for e in call.events
        if e.name == "violation"
    ]


def generic(violations: list[tuple[str, str]]) -> list[tuple[str, str]]:
    return [v for v in violations if v[0] in GENERIC]


def messages(call: Call, suffix: str) -> list[str]:
    return [
        str(e.attributes["message"])
        for e in call.events
        if e.name == "violation" and str(e.attributes["rule"]).endswith("." + suffix)
    ]


def v1(type_name: str, /, **fields: Any) -> Any:
    return load_spec("csi.v1").message_class(f"csi.v1.{type_name}")(**fields)


def v0(type_name: str, /, **fields: Any) -> Any:
    return load_spec("csi.v0").message_class(f"csi.v0.{type_name}")(**fields)


def mount(mode: str = "SINGLE_NODE_WRITER") -> dict[str, Any]:
    return {"mount": {}, "access_mode": {"mode": mode}}


def stage_request(volume: str = "vol-1", path: str = STAGE, **extra: Any) -> Any:
    return v1(
        "NodeStageVolumeRequest",
        volume_id=volume,
        staging_target_path=path,
        volume_capability=mount(),
        **extra,
    )


def publish_request(
    volume: str = "vol-1", target: str = TARGET, staging: str = STAGE, **extra: Any
) -> Any:
    return v1(
        "NodePublishVolumeRequest",
        volume_id=volume,
        staging_target_path=staging,
        target_path=target,
        volume_capability=mount(),
        **extra,
    )


@pytest.fixture
def driver() -> Driver:
    d = Driver()
    # what the checks ask for, known: no capability query of the proxy's own
    d.caps("csi.v1", "plugin", "CONTROLLER_SERVICE")
    d.caps("csi.v1", "controller", "CREATE_DELETE_VOLUME", "PUBLISH_UNPUBLISH_VOLUME")
    d.caps("csi.v1", "node", "STAGE_UNSTAGE_VOLUME")
    return d


@pytest.fixture
def clocked() -> tuple[Driver, Clock]:
    clock = Clock()
    d = Driver(clock=clock)
    d.caps("csi.v1", "node", "STAGE_UNSTAGE_VOLUME")
    d.caps("csi.v1", "controller", "CREATE_DELETE_VOLUME", "PUBLISH_UNPUBLISH_VOLUME")
    d.caps("csi.v1", "plugin", "CONTROLLER_SERVICE")
    return d, clock


# == status-code-not-canonical: a raw HTTP/2 plugin behind both relays =======================

INFO = "/csi.v1.Identity/GetPluginInfo"


def answering_with(end: Callable[[int], bytes]) -> Callable[[FakePlugin, PluginConn], Any]:
    """A plugin that answers every call with response headers, then ``end(stream)``."""

    async def script(plugin: FakePlugin, conn: PluginConn) -> None:
        conn.send(S)
        while (got := await conn.request()) is not None:
            plugin.requests += 1
            conn.send(headers(got[0], OK_HEADERS) + end(got[0]))

    return script


def trailers(*fields: tuple[bytes, bytes]) -> Callable[[int], bytes]:
    return lambda sid: headers(sid, list(fields), end_stream=True)


def ended_by_data(sid: int) -> bytes:
    return data(sid, message(b""), end_stream=True)


@pytest.fixture
async def raw_plugin(tmp_path) -> AsyncIterator[Callable[..., Any]]:
    """Starts a raw plugin with a script and a proxy (``relay``) in front of it."""
    started: list[tuple[Any, FakePlugin]] = []

    async def start(script: Any, relay: str) -> tuple[FakePlugin, str, Any]:
        upstream = str(tmp_path / f"plugin{len(started)}.sock")
        listen = str(tmp_path / f"proxy{len(started)}.sock")
        plugin = FakePlugin(script)
        await plugin.start(upstream)
        proxy = await start_proxy(listen, upstream, "--relay", relay, "--readiness-probe", "off")
        started.append((proxy, plugin))
        return plugin, listen, proxy

    yield start
    for proxy, plugin in started:
        await proxy.stop(0)
        await plugin.stop()


async def call_info(listen: str) -> grpc.aio.AioRpcError | None:
    async with channel(listen) as ch:
        try:
            await ch.unary_unary(INFO)(b"", timeout=5)
        except grpc.aio.AioRpcError as err:
            return err
    return None


def reported(proxy: Any) -> dict[str, dict[str, Any]]:
    return {e["rule"]: e for e in stage_of(proxy).report.snapshot()}


NOT_CANONICAL = "csi.status-code-not-canonical"


@pytest.mark.parametrize(
    ("end", "says"),
    [
        pytest.param(
            trailers((b"grpc-status", b"17"), (b"grpc-message", b"x")),
            "grpc-status 17 is outside the canonical codes 0-16",
            id="17",
        ),
        pytest.param(
            trailers((b"grpc-message", b"x")),
            "the plugin's trailers carry no grpc-status",
            id="none",
        ),
        pytest.param(
            trailers((b"grpc-status", b"abc")),
            "grpc-status is not a canonical code number (0-16)",
            id="not-a-number",
        ),
        pytest.param(ended_by_data, "the plugin's trailers carry no grpc-status", id="data-end"),
    ],
)
async def test_frame_relay_reports_a_status_that_is_not_canonical(raw_plugin, end, says):
    _plugin, listen, proxy = await raw_plugin(answering_with(end), "frames")
    err = await call_info(listen)
    assert err is not None  # the caller's own reading of what it got, as before
    entry = reported(proxy)[NOT_CANONICAL]
    assert entry["party"] == "plugin" and entry["level"] == "MUST"
    assert says in entry["last_message"]
    assert entry["section"] == "CSI v1.12 §Error Scheme"


async def test_frame_relay_passes_the_plugins_status_on_unchanged(raw_plugin):
    """Judging the status changes nothing the CO receives: the trailers are the plugin's."""
    end = trailers((b"grpc-status", b"17"), (b"grpc-message", b"odd"))
    _plugin, listen, proxy = await raw_plugin(answering_with(end), "frames")
    async with connect(listen) as peer:
        client = H2Client(peer)
        got = await client.response(client.request(grpc_headers(INFO), message(b"")))
    assert got.trailers[b"grpc-status"] == b"17" and got.trailers[b"grpc-message"] == b"odd"
    assert NOT_CANONICAL in reported(proxy)


@pytest.mark.parametrize("relay", ["frames", "grpc"])
async def test_a_canonical_error_status_is_not_reported(raw_plugin, relay):
    end = trailers((b"grpc-status", b"5"), (b"grpc-message", b"no such plugin info"))
    _plugin, listen, proxy = await raw_plugin(answering_with(end), relay)
    err = await call_info(listen)
    assert err is not None and err.code() is grpc.StatusCode.NOT_FOUND
    assert NOT_CANONICAL not in reported(proxy)


@pytest.mark.parametrize(
    "end",
    [
        pytest.param(trailers((b"grpc-message", b"x")), id="none"),
        pytest.param(trailers((b"grpc-status", b"abc")), id="not-a-number"),
        pytest.param(ended_by_data, id="data-end"),
    ],
)
async def test_grpc_relay_reports_a_missing_or_unreadable_status(raw_plugin, end):
    """grpc reads the status itself behind the gRPC relay; what it cannot read is seen."""
    _plugin, listen, proxy = await raw_plugin(answering_with(end), "grpc")
    assert await call_info(listen) is not None
    assert reported(proxy)[NOT_CANONICAL]["party"] == "plugin"


async def test_an_ok_status_and_the_proxys_own_answers_are_not_judged(driver):
    assert generic(await driver.call("csi.v1", "GetPluginInfo", raw_status="0")) == []
    # the proxy's own answers carry no raw status of the plugin
    got = await driver.call(
        "csi.v1", "Probe", code=grpc.StatusCode.UNAVAILABLE, details="plugproxy: upstream down"
    )
    assert generic(got) == []
    got = await driver.call("csi.v1", "Probe", code=grpc.StatusCode.UNKNOWN, raw_status="")
    assert ("status-code-not-canonical", "plugin") in got


@pytest.mark.parametrize(
    ("spec", "rpc"), [("cosi.v1alpha1", "DriverGetInfo"), ("cmi.v1", "GetPluginInfo")]
)
async def test_status_code_rule_per_spec(spec, rpc):
    d = Driver()
    got = await d.call(spec, rpc, code=grpc.StatusCode.UNKNOWN, raw_status="42")
    assert ("status-code-not-canonical", "plugin") in got
    assert messages(d.last, "status-code-not-canonical") == [
        "grpc-status 42 is outside the canonical codes 0-16 (read as UNKNOWN)"
    ]


# == bad-request-accepted ======================================================================


async def test_ok_to_a_request_missing_a_required_field_is_the_plugins_fault(driver):
    got = await driver.call("csi.v1", "DeleteVolume", v1("DeleteVolumeRequest"))
    assert ("required-field", "co") in got and ("bad-request-accepted", "plugin") in got
    (text,) = messages(driver.last, "bad-request-accepted")
    assert text == (
        "DeleteVolume answered OK to a request breaking csi.required-field at volume_id;"
        " the spec prescribes INVALID_ARGUMENT"
    )


async def test_the_prescribed_answer_and_a_good_request_are_fine(driver):
    refused = await driver.call(
        "csi.v1", "DeleteVolume", v1("DeleteVolumeRequest"), code=grpc.StatusCode.INVALID_ARGUMENT
    )
    assert ("required-field", "co") in refused
    assert ("bad-request-accepted", "plugin") not in refused
    good = await driver.call("csi.v1", "DeleteVolume", v1("DeleteVolumeRequest", volume_id="v"))
    assert generic(good) == []


async def test_several_breaches_make_one_violation_naming_the_first(driver):
    bad = v1("DeleteVolumeRequest", volume_id="v" * 10, secrets={"bad key": "x"})
    bad.secrets["k" * 5000] = "y"
    await driver.call("csi.v1", "DeleteVolume", bad)
    (text,) = messages(driver.last, "bad-request-accepted")
    assert "(and 1 more)" in text and "x" * 2 not in text


async def test_rules_switched_off_enforced_or_without_an_answer_do_not_count():
    off = Driver(rules={"csi.required-field": "off"})
    assert generic(await off.call("csi.v1", "DeleteVolume", v1("DeleteVolumeRequest"))) == []
    enforcing = Driver("enforce")
    await enforcing.call("csi.v1", "DeleteVolume", v1("DeleteVolumeRequest"))
    assert enforcing.last.rejected and generic(found(enforcing.last)) == []
    # csi.capability-not-advertised prescribes no answer: the plugin's OK is its own choice
    d = Driver()
    d.caps("csi.v1", "controller")
    got = await d.call("csi.v1", "DeleteVolume", v1("DeleteVolumeRequest", volume_id="v"))
    assert ("capability-not-advertised", "co") in got and generic(got) == []


async def test_call_order_breach_accepted_is_not_the_plugins_fault(driver):
    """NodePublishVolume of a volume unstaged on this node: enforce answers it, but no error
    row binds the plugin to (its row is for a missing staging_target_path)."""
    await driver.call("csi.v1", "NodeStageVolume", stage_request())
    unstage = v1("NodeUnstageVolumeRequest", volume_id="vol-1", staging_target_path=STAGE)
    await driver.call("csi.v1", "NodeUnstageVolume", unstage)
    got = await driver.call("csi.v1", "NodePublishVolume", publish_request())
    assert ("call-order", "co") in got and ("bad-request-accepted", "plugin") not in got


@pytest.mark.parametrize(
    ("spec", "rpc", "fields"),
    [
        ("cosi.v1alpha1", "DriverDeleteBucket", {}),
        ("cmi.v1", "DeleteMachine", {"ProviderSpec": b"x"}),
        ("csi.v0", "DeleteVolume", {}),
    ],
)
async def test_bad_request_accepted_per_spec(spec, rpc, fields):
    d = Driver()
    d.caps(spec, "controller", "CREATE_DELETE_VOLUME")
    got = await d.call(spec, rpc, **fields)
    assert ("required-field", "co") in got and ("bad-request-accepted", "plugin") in got


async def test_a_real_plugin_refusing_a_bad_request_is_not_reported(tmp_path):
    """The fake plugin answers INVALID_ARGUMENT to a missing volume_id, as prescribed."""
    async with through_proxy("csi.v1", tmp_path) as (client, proxy):
        await client.call("ControllerGetCapabilities")
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await client.call("DeleteVolume", volume_id="")
        assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        rules = {(e["rule"], e["party"]) for e in stage_of(proxy).report.snapshot()}
    assert rules == {("csi.required-field", "co")}


# == retry-without-change ======================================================================


def create_request(name: str = "pvc-1", **extra: Any) -> Any:
    return v1("CreateVolumeRequest", name=name, volume_capabilities=[mount()], **extra)


async def test_an_unchanged_retry_after_already_exists_is_the_cos_fault(driver):
    first = await driver.call(
        "csi.v1", "CreateVolume", create_request(), code=grpc.StatusCode.ALREADY_EXISTS
    )
    assert generic(first) == []
    again = await driver.call("csi.v1", "CreateVolume", create_request(), code=OK)
    assert ("retry-without-change", "co") in again
    (text,) = messages(driver.last, "retry-without-change")
    assert text.startswith("CreateVolume re-sent unchanged; the plugin answered the same request")
    assert "ALREADY_EXISTS" in text and "MUST fix the arguments or use another name" in text


async def test_a_changed_retry_or_one_after_a_transient_error_is_fine(driver):
    await driver.call(
        "csi.v1", "CreateVolume", create_request(), code=grpc.StatusCode.ALREADY_EXISTS
    )
    changed = create_request(capacity_range={"required_bytes": 1 << 30})
    assert generic(await driver.call("csi.v1", "CreateVolume", changed)) == []
    for code in (
        grpc.StatusCode.ABORTED,
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.NOT_FOUND,  # "MUST verify the source ... before retrying": allowed
        grpc.StatusCode.DEADLINE_EXCEEDED,
    ):
        request = create_request(name=f"pvc-{code.name}")
        await driver.call("csi.v1", "CreateVolume", request, code=code)
        assert generic(await driver.call("csi.v1", "CreateVolume", request)) == [], code


async def test_retry_is_never_enforced():
    d = Driver("enforce")
    d.caps("csi.v1", "controller", "CREATE_DELETE_VOLUME")
    d.caps("csi.v1", "plugin")
    await d.call("csi.v1", "CreateVolume", create_request(), code=grpc.StatusCode.OUT_OF_RANGE)
    got = await d.call("csi.v1", "CreateVolume", create_request())
    assert not d.last.rejected and ("retry-without-change", "co") in got


async def test_a_group_snapshot_get_or_delete_re_sent_after_a_mismatch_is_a_should(driver):
    # CSI v1.12 §DeleteVolumeGroupSnapshot, §GetVolumeGroupSnapshot errors: the
    # INVALID_ARGUMENT row only advises other snapshot_ids.
    for rpc in ("DeleteVolumeGroupSnapshot", "GetVolumeGroupSnapshot"):
        request = v1(f"{rpc}Request", group_snapshot_id="g-1", snapshot_ids=["s-1", "s-9"])
        await driver.call("csi.v1", rpc, request, code=grpc.StatusCode.INVALID_ARGUMENT)
        again = await driver.call("csi.v1", rpc, request, code=grpc.StatusCode.INVALID_ARGUMENT)
        assert ("retry-advised-unchanged", "co") in again, rpc
        assert ("retry-without-change", "co") not in again, rpc
        (text,) = messages(driver.last, "retry-advised-unchanged")
        assert "SHOULD use other snapshot_ids" in text


async def test_map_order_does_not_hide_a_retry(driver):
    """A Go CO writes maps in random order: the same request may come as other bytes."""
    base = create_request().SerializeToString()
    entry_a = create_request(parameters={"a": "1"}).SerializeToString()[len(base) :]
    entry_b = create_request(parameters={"b": "2"}).SerializeToString()[len(base) :]
    one, two = base + entry_a + entry_b, base + entry_b + entry_a
    assert one != two
    await driver.call("csi.v1", "CreateVolume", raw=one, code=grpc.StatusCode.INVALID_ARGUMENT)
    assert ("retry-without-change", "co") in await driver.call("csi.v1", "CreateVolume", raw=two)


async def test_the_plugins_ok_to_the_retry_forgets_the_refusal(driver):
    request = v1("NodeUnpublishVolumeRequest", volume_id="v", target_path=TARGET)
    await driver.call("csi.v1", "NodeUnpublishVolume", request, code=grpc.StatusCode.UNIMPLEMENTED)
    assert ("retry-without-change", "co") in await driver.call(
        "csi.v1", "NodeUnpublishVolume", request
    )
    assert generic(await driver.call("csi.v1", "NodeUnpublishVolume", request)) == []


async def test_a_read_only_call_polled_after_unimplemented_is_not_a_retry(driver):
    # kubelet polls NodeGetVolumeStats every minute, a health monitor ControllerGetVolume:
    # the next poll is a new read, not a retry of the refused one.
    stats = v1("NodeGetVolumeStatsRequest", volume_id="v", volume_path=TARGET)
    get = v1("ControllerGetVolumeRequest", volume_id="v")
    for rpc, request in (("NodeGetVolumeStats", stats), ("ControllerGetVolume", get)):
        await driver.call("csi.v1", rpc, request, code=grpc.StatusCode.UNIMPLEMENTED)
        assert generic(await driver.call("csi.v1", rpc, request)) == []


@pytest.mark.parametrize(
    ("rpc", "req", "code"),
    [
        # "Caller SHOULD stop calling DeleteSnapshot" (part of a group): advisory
        (
            "DeleteSnapshot",
            v1("DeleteSnapshotRequest", snapshot_id="s"),
            grpc.StatusCode.INVALID_ARGUMENT,
        ),
        # "Caller MAY verify volume capabilities ... and retry"
        (
            "ControllerExpandVolume",
            v1(
                "ControllerExpandVolumeRequest",
                volume_id="v",
                capacity_range={"required_bytes": 5},
            ),
            grpc.StatusCode.INVALID_ARGUMENT,
        ),
        # "The caller should correct the error and resubmit" (lower case)
        (
            "GetMetadataAllocated",
            v1("GetMetadataAllocatedRequest", snapshot_id="s"),
            grpc.StatusCode.INVALID_ARGUMENT,
        ),
        # "Caller SHOULD ensure that there are no other resources using the volume"
        (
            "DeleteVolume",
            v1("DeleteVolumeRequest", volume_id="v"),
            grpc.StatusCode.FAILED_PRECONDITION,
        ),
        # "MUST fix the configuration of the volumes": outside the request
        (
            "CreateVolumeGroupSnapshot",
            v1("CreateVolumeGroupSnapshotRequest", name="g", source_volume_ids=["a", "b"]),
            grpc.StatusCode.FAILED_PRECONDITION,
        ),
    ],
)
async def test_rows_that_only_advise_or_ask_a_change_elsewhere_are_not_judged(
    driver, rpc, req, code
):
    await driver.call("csi.v1", rpc, req, code=code)
    assert ("retry-without-change", "co") not in await driver.call("csi.v1", rpc, req)


async def test_staging_path_not_set_is_judged_only_when_that_is_the_condition(driver):
    missing = publish_request(staging="")
    await driver.call(
        "csi.v1", "NodePublishVolume", missing, code=grpc.StatusCode.FAILED_PRECONDITION
    )
    got = await driver.call("csi.v1", "NodePublishVolume", missing)
    assert ("retry-without-change", "co") in got
    assert "MUST stage the volume first" in messages(driver.last, "retry-without-change")[0]
    # Staging path set: "exceeds capabilities", whose recovery allows waiting and retrying.
    other = publish_request(volume="vol-2")
    await driver.call(
        "csi.v1", "NodePublishVolume", other, code=grpc.StatusCode.FAILED_PRECONDITION
    )
    assert ("retry-without-change", "co") not in await driver.call(
        "csi.v1", "NodePublishVolume", other
    )


async def test_node_expand_volume_in_use_must_not_be_retried(driver):
    request = v1("NodeExpandVolumeRequest", volume_id="v", volume_path=TARGET)
    await driver.call(
        "csi.v1", "NodeExpandVolume", request, code=grpc.StatusCode.FAILED_PRECONDITION
    )
    got = await driver.call("csi.v1", "NodeExpandVolume", request)
    assert ("retry-without-change", "co") in got
    assert messages(driver.last, "retry-without-change")[0].endswith("the caller MUST NOT retry")


async def test_requests_without_fields_are_never_judged_as_retries(driver):
    """Several sidecars ask ControllerGetCapabilities with the same empty bytes."""
    for _ in range(2):
        got = await driver.call(
            "csi.v1", "ControllerGetCapabilities", code=grpc.StatusCode.UNIMPLEMENTED
        )
        assert ("retry-without-change", "co") not in got
    # an empty ListVolumes has fields, all unset: independent callers too
    for _ in range(2):
        got = await driver.call("csi.v1", "ListVolumes", code=grpc.StatusCode.UNIMPLEMENTED)
        assert ("retry-without-change", "co") not in got


async def test_csi_v0_unimplemented_is_judged_only_where_its_table_says_so():
    d = Driver()
    d.caps("csi.v0", "controller", "CREATE_DELETE_VOLUME")
    d.caps("csi.v0", "plugin")
    create = v0("CreateVolumeRequest", name="pvc", volume_capabilities=[mount()])
    await d.call("csi.v0", "CreateVolume", create, code=grpc.StatusCode.UNIMPLEMENTED)
    assert ("retry-without-change", "co") in await d.call("csi.v0", "CreateVolume", create)
    validate_req = v0(
        "ValidateVolumeCapabilitiesRequest", volume_id="v", volume_capabilities=[mount()]
    )
    await d.call(
        "csi.v0", "ValidateVolumeCapabilities", validate_req, code=grpc.StatusCode.UNIMPLEMENTED
    )
    assert ("retry-without-change", "co") not in await d.call(
        "csi.v0", "ValidateVolumeCapabilities", validate_req
    )


async def test_cosi_and_cmi_retries():
    d = Driver()
    bucket = {"name": "bucket-a", "parameters": {"tier": "cold"}}
    await d.call("cosi.v1alpha1", "DriverCreateBucket", code=grpc.StatusCode.OUT_OF_RANGE, **bucket)
    got = await d.call("cosi.v1alpha1", "DriverCreateBucket", **bucket)
    assert ("retry-without-change", "co") in got
    # §Concurrency: a repeat of a call that succeeded early may get ALREADY_EXISTS
    other = {"name": "bucket-b"}
    await d.call(
        "cosi.v1alpha1", "DriverCreateBucket", code=grpc.StatusCode.ALREADY_EXISTS, **other
    )
    got = await d.call("cosi.v1alpha1", "DriverCreateBucket", **other)
    assert ("retry-without-change", "co") not in got
    machine = {"MachineName": "m-1", "ProviderSpec": b"{}"}
    await d.call("cmi.v1", "CreateMachine", code=grpc.StatusCode.INVALID_ARGUMENT, **machine)
    assert ("retry-without-change", "co") in await d.call("cmi.v1", "CreateMachine", **machine)


async def test_a_refusal_is_forgotten_after_ten_minutes(clocked):
    d, clock = clocked
    request = v1("ControllerGetVolumeRequest", volume_id="v")
    await d.call("csi.v1", "ControllerGetVolume", request, code=grpc.StatusCode.INVALID_ARGUMENT)
    clock.now += 599
    assert ("retry-without-change", "co") in await d.call(
        "csi.v1", "ControllerGetVolume", request, code=grpc.StatusCode.INVALID_ARGUMENT
    )
    assert "9m ago" in messages(d.last, "retry-without-change")[0]
    clock.now += 601
    assert generic(await d.call("csi.v1", "ControllerGetVolume", request)) == []


async def test_nothing_is_hashed_while_no_refusal_is_remembered(driver):
    request = v1("ControllerGetVolumeRequest", volume_id="v")
    await driver.call("csi.v1", "ControllerGetVolume", request)
    assert "validate.digest" not in driver.last.stage_state
    # neither a fix-first nor a back-off row's code
    await driver.call("csi.v1", "ControllerGetVolume", request, code=grpc.StatusCode.INTERNAL)
    assert "validate.digest" not in driver.last.stage_state


def test_memory_is_bounded():
    mem = GenericMemory(SpecState(max_volumes=3))
    for i in range(10):
        mem.refuse(("CreateVolume", bytes([i])), "INVALID_ARGUMENT")
        mem.changed[f"volume:{i}"] = ("NodeStageVolume", b"", 0.0)
    assert len(mem.refused) == 3 and len(mem.changed) == 3


async def test_a_real_co_retrying_a_refused_request(tmp_path):
    knobs = FakeKnobs(
        failures={"ControllerGetVolume": FailureRule(grpc.StatusCode.INVALID_ARGUMENT)}
    )
    async with through_proxy("csi.v1", tmp_path, knobs=knobs) as (client, proxy):
        for _ in range(2):
            with pytest.raises(grpc.aio.AioRpcError):
                await client.call("ControllerGetVolume", volume_id="vol-x")
        found_rules = {
            (e["rule"], e["party"], e["count"]) for e in stage_of(proxy).report.snapshot()
        }
    assert ("csi.retry-without-change", "co", 1) in found_rules


# == retry-while-pending ========================================================================

ABORTED = grpc.StatusCode.ABORTED


async def test_a_retry_after_aborted_while_another_call_for_the_volume_is_in_flight(driver):
    other = await driver.begin("csi.v1", "NodePublishVolume", publish_request(target=TARGET + "2"))
    await driver.call("csi.v1", "NodePublishVolume", publish_request(), code=ABORTED)
    got = await driver.call("csi.v1", "NodePublishVolume", publish_request())
    assert ("retry-while-pending", "co") in got
    (text,) = messages(driver.last, "retry-while-pending")
    assert "1 other call(s) for the same volume" in text and "vol-1" not in text
    assert generic(driver.end(other)) == []
    # the legitimate retry: the plugin aborted, the caller waited for the other call
    await driver.call("csi.v1", "NodePublishVolume", publish_request(), code=ABORTED)
    assert ("retry-while-pending", "co") not in await driver.call(
        "csi.v1", "NodePublishVolume", publish_request()
    )
    plan = driver.stage._plans[driver.paths[("csi.v1", "NodePublishVolume")]]
    assert plan.generic.memory.in_flight == {}


async def test_only_the_retry_of_the_aborted_call_for_the_same_object_is_judged(driver):
    busy = await driver.begin("csi.v1", "NodeStageVolume", stage_request("vol-2"))
    await driver.call("csi.v1", "NodePublishVolume", publish_request(), code=ABORTED)
    # another volume is busy, not this one
    assert generic(await driver.call("csi.v1", "NodePublishVolume", publish_request())) == []
    await driver.call("csi.v1", "NodePublishVolume", publish_request("vol-2"), code=ABORTED)
    # another RPC for the busy volume is not a retry of the aborted one
    unpublish = v1("NodeUnpublishVolumeRequest", volume_id="vol-2", target_path=TARGET)
    assert generic(await driver.call("csi.v1", "NodeUnpublishVolume", unpublish)) == []
    # the retry comes while the stage is still in flight
    got = await driver.call("csi.v1", "NodePublishVolume", publish_request("vol-2"))
    assert ("retry-while-pending", "co") in got
    # only the next call after ABORTED is the retry
    got = await driver.call("csi.v1", "NodePublishVolume", publish_request("vol-2"))
    assert ("retry-while-pending", "co") not in got
    driver.end(busy)


async def test_retry_while_pending_in_csi_v0_cosi_and_cmi():
    d = Driver()
    cases = [
        ("csi.v0", "NodeStageVolume", {"volume_id": "v", "staging_target_path": STAGE}),
        ("cosi.v1alpha1", "DriverCreateBucket", {"name": "bucket-a"}),
        ("cmi.v1", "CreateMachine", {"MachineName": "m-1", "ProviderSpec": b"{}"}),
    ]
    for spec, rpc, fields in cases:
        busy = await d.begin(spec, rpc, **fields)
        await d.call(spec, rpc, code=ABORTED, **fields)
        assert ("retry-while-pending", "co") in await d.call(spec, rpc, **fields), spec
        d.end(busy)
        await d.call(spec, rpc, code=ABORTED, **fields)
        assert ("retry-while-pending", "co") not in await d.call(spec, rpc, **fields), spec
    # csi.v0's ValidateVolumeCapabilities has no "operation pending" row
    fields = {"volume_id": "v", "volume_capabilities": [{"mount": {}}]}
    busy = await d.begin("csi.v0", "ValidateVolumeCapabilities", **fields)
    await d.call("csi.v0", "ValidateVolumeCapabilities", code=ABORTED, **fields)
    got = await d.call("csi.v0", "ValidateVolumeCapabilities", **fields)
    assert ("retry-while-pending", "co") not in got
    d.end(busy)


async def test_a_real_co_retrying_while_its_other_call_waits_for_the_volume(tmp_path):
    """Through the real proxy: the first call holds the volume (the plugin is slow), the
    second is answered ABORTED by the plugin, and retried while the first still runs."""
    knobs = FakeKnobs(
        delays={"ValidateVolumeCapabilities": 0.5},
        failures={"ControllerGetVolume": FailureRule(ABORTED, remaining=1)},
    )
    async with through_proxy("csi.v1", tmp_path, knobs=knobs) as (client, proxy):
        cap = client.new("VolumeCapability", mount={}, access_mode={"mode": "SINGLE_NODE_WRITER"})
        created = await client.call("CreateVolume", name="pvc-1", volume_capabilities=[cap])
        volume = created.volume.volume_id
        with pytest.raises(grpc.aio.AioRpcError):
            await client.call("ControllerGetVolume", volume_id=volume)
        slow = asyncio.ensure_future(
            client.call("ValidateVolumeCapabilities", volume_id=volume, volume_capabilities=[cap])
        )
        memory = stage_of(proxy)._plans["/csi.v1.Controller/ControllerGetVolume"].generic.memory
        await wait_until(lambda: bool(memory.in_flight))  # the slow call reached the proxy
        await client.call("ControllerGetVolume", volume_id=volume)
        await slow
        found_rules = {(e["rule"], e["party"]) for e in stage_of(proxy).report.snapshot()}
    assert ("csi.retry-while-pending", "co") in found_rules


# == retry-without-backoff ======================================================================

NOT_FOUND = grpc.StatusCode.NOT_FOUND


async def resend(d: Driver, clock: Clock, waits: list[float], *args: Any, **kw: Any) -> list[Any]:
    """The same request sent once, then again after each wait; every answer ``kw["code"]``."""
    found_per_send = [await d.call(*args, **kw)]
    for wait in waits:
        clock.now += wait
        found_per_send.append(await d.call(*args, **kw))
    return found_per_send


async def test_identical_retries_at_a_constant_short_pace_do_not_back_off(clocked):
    d, clock = clocked
    sends = await resend(
        d, clock, [1.0, 1.0, 1.0], "csi.v1", "NodeStageVolume", stage_request(), code=NOT_FOUND
    )
    assert [("retry-without-backoff", "co") in got for got in sends] == [False] * 3 + [True]
    (text,) = messages(d.last, "retry-without-backoff")
    assert "1.0s, 1.0s, 1.0s" in text and "NOT_FOUND" in text
    # ABORTED (the Error Scheme's row) for every RPC, in a shrinking series too
    sends = await resend(
        d,
        clock,
        [3.0, 2.0, 1.0],
        "csi.v1",
        "ControllerPublishVolume",
        volume_id="v",
        node_id="n",
        volume_capability=mount(),
        code=ABORTED,
    )
    assert ("retry-without-backoff", "co") in sends[-1]


async def test_real_backoffs_and_other_answers_are_not_judged(clocked):
    d, clock = clocked
    stage = stage_request()
    # kubelet: 0.5 s doubling; the CSI sidecars: 1 s doubling, then their 5 min cap
    for waits in ([0.5, 1.0, 2.0, 4.0, 8.0], [1.0, 2.0, 4.0, 8.0], [300.0] * 4, [10.0] * 4):
        sends = await resend(d, clock, waits, "csi.v1", "NodeStageVolume", stage, code=NOT_FOUND)
        assert not any(("retry-without-backoff", "co") in got for got in sends), waits
        await d.call("csi.v1", "NodeStageVolume", stage)  # OK: the series ends
    # a code whose row does not say back off; a listing's ABORTED asks for a restart
    for args, kw in (
        (("csi.v1", "NodeStageVolume", stage), {"code": grpc.StatusCode.INTERNAL}),
        (("csi.v1", "ListVolumes"), {"code": ABORTED, "starting_token": "t"}),
    ):
        sends = await resend(d, clock, [1.0] * 4, *args, **kw)
        assert not any(("retry-without-backoff", "co") in got for got in sends)
    # another answer in between starts a new series
    await d.call("csi.v1", "NodeStageVolume", stage, code=NOT_FOUND)
    for answer in (NOT_FOUND, OK, NOT_FOUND, NOT_FOUND, NOT_FOUND):
        clock.now += 1.0
        got = await d.call("csi.v1", "NodeStageVolume", stage, code=answer)
        assert ("retry-without-backoff", "co") not in got


async def test_a_burst_with_jitter_is_not_a_back_off_but_jittered_doubling_is(clocked):
    # CSI v1.12 §Error Scheme (ABORTED, and the per-RPC NOT_FOUND rows): exponential back off
    d, clock = clocked
    stage = stage_request()
    for waits in ([0.010, 0.013, 0.011], [0.010, 0.011, 0.012], [3.0, 1.0, 3.0]):
        sends = await resend(d, clock, waits, "csi.v1", "NodeStageVolume", stage, code=NOT_FOUND)
        assert ("retry-without-backoff", "co") in sends[-1], waits
        await d.call("csi.v1", "NodeStageVolume", stage)  # OK: the series ends
    for waits in (
        [1.1, 2.3, 3.9, 8.4],  # the sidecars' 1 s doubling with jitter
        [0.004, 0.011, 0.019, 0.043, 0.078],  # client-go's 5 ms limiter, jittered
        [0.030, 0.035, 0.045, 0.065, 0.105],  # 5 ms doubling behind a 25 ms overhead
        [0.6, 1.0, 2.1, 3.8, 8.3],  # kubelet's 0.5 s doubling with jitter
    ):
        sends = await resend(d, clock, waits, "csi.v1", "NodeStageVolume", stage, code=NOT_FOUND)
        assert not any(("retry-without-backoff", "co") in got for got in sends), waits
        await d.call("csi.v1", "NodeStageVolume", stage)


async def test_a_volume_stats_poll_is_not_a_retry(clocked):
    # kubelet polls NodeGetVolumeStats at a steady pace whatever it answered
    d, clock = clocked
    fields = {"volume_id": "v", "volume_path": "/var/lib/kubelet/pods/p/volumes/v/mount"}
    sends = await resend(
        d, clock, [2.0] * 4, "csi.v1", "NodeGetVolumeStats", code=NOT_FOUND, **fields
    )
    assert not any(("retry-without-backoff", "co") in got for got in sends)
    sends = await resend(
        d, clock, [0.05] * 3, "csi.v1", "NodeGetVolumeStats", code=NOT_FOUND, **fields
    )
    assert ("retry-without-backoff", "co") in sends[-1]


async def test_retry_without_backoff_in_csi_v0_and_cosi_not_cmi(clocked):
    d, clock = clocked
    cases = [
        ("csi.v0", "NodeStageVolume", {"volume_id": "v", "staging_target_path": STAGE}, True),
        ("cosi.v1alpha1", "DriverCreateBucket", {"name": "bucket-a"}, True),
        # CMI's row: "retry with after configured back off configuration" (any strategy)
        ("cmi.v1", "CreateMachine", {"MachineName": "m-1", "ProviderSpec": b"{}"}, False),
    ]
    for spec, rpc, fields, judged in cases:
        sends = await resend(d, clock, [1.0] * 3, spec, rpc, code=ABORTED, **fields)
        assert (("retry-without-backoff", "co") in sends[-1]) is judged, spec


def test_backoff_and_pending_memory_is_bounded():
    mem = GenericMemory(SpecState(max_volumes=3))
    for i in range(10):
        mem.aborted[("NodeStageVolume", f"volume:{i}")] = 0.0
        mem.backoff[("NodeStageVolume", bytes([i]))] = BackoffSeries("ABORTED", 0.0, [])
    assert len(mem.aborted) == 3 and len(mem.backoff) == 3


# == csi.v0 node-get-id-deprecated ===============================================================


async def test_node_get_id_while_the_plugin_serves_node_get_info(clocked):
    d, clock = clocked
    flagged = ("node-get-id-deprecated", "co")
    # a plugin not known to serve NodeGetInfo: the CO may fall back to NodeGetId
    assert flagged not in await d.call(
        "csi.v0", "NodeGetId", response=v0("NodeGetIdResponse", node_id="n")
    )
    await d.call("csi.v0", "NodeGetInfo", code=grpc.StatusCode.UNIMPLEMENTED)
    assert flagged not in await d.call("csi.v0", "NodeGetId")
    await d.call("csi.v0", "NodeGetInfo", response=v0("NodeGetInfoResponse", node_id="n"))
    clock.now += 5
    assert flagged in await d.call("csi.v0", "NodeGetId")
    assert "5s ago" in messages(d.last, "node-get-id-deprecated")[0]
    clock.now += 301  # past the capability lifetime: the plugin may have been replaced
    assert flagged not in await d.call("csi.v0", "NodeGetId")


# == group-without-get-snapshot (CSI v1 §GetSnapshot) ===========================================


def rpc_caps(response: str, *names: str) -> Any:
    return v1(response, capabilities=[{"rpc": {"type": n}} for n in names])


async def test_a_group_snapshot_plugin_should_offer_get_snapshot():
    d = Driver()
    flagged = ("group-without-get-snapshot", "plugin")
    group = rpc_caps(
        "GroupControllerGetCapabilitiesResponse", "CREATE_DELETE_GET_VOLUME_GROUP_SNAPSHOT"
    )
    # the controller capabilities are not known yet: not judged
    assert flagged not in await d.call("csi.v1", "GroupControllerGetCapabilities", response=group)
    without = rpc_caps("ControllerGetCapabilitiesResponse", "CREATE_DELETE_SNAPSHOT")
    assert flagged in await d.call("csi.v1", "ControllerGetCapabilities", response=without)
    assert flagged in await d.call("csi.v1", "GroupControllerGetCapabilities", response=group)
    with_get = rpc_caps(
        "ControllerGetCapabilitiesResponse", "CREATE_DELETE_SNAPSHOT", "GET_SNAPSHOT"
    )
    assert flagged not in await d.call("csi.v1", "ControllerGetCapabilities", response=with_get)
    assert flagged not in await d.call("csi.v1", "GroupControllerGetCapabilities", response=group)
    # an empty controller set (an instance not serving the controller) is not judged
    empty = rpc_caps("ControllerGetCapabilitiesResponse")
    assert flagged not in await d.call("csi.v1", "ControllerGetCapabilities", response=empty)


# == not-idempotent ============================================================================


async def test_a_repeated_stage_refused_as_already_existing_is_the_plugins_fault(driver):
    assert generic(await driver.call("csi.v1", "NodeStageVolume", stage_request())) == []
    got = await driver.call(
        "csi.v1", "NodeStageVolume", stage_request(), code=grpc.StatusCode.ALREADY_EXISTS
    )
    assert ("not-idempotent", "plugin") in got
    (text,) = messages(driver.last, "not-idempotent")
    assert text.startswith("NodeStageVolume repeated unchanged answered ALREADY_EXISTS")
    # the memory stays: the same answer again is reported again
    got = await driver.call(
        "csi.v1", "NodeStageVolume", stage_request(), code=grpc.StatusCode.FAILED_PRECONDITION
    )
    assert ("not-idempotent", "plugin") in got


async def test_repeats_answered_ok_or_transiently_are_fine(driver):
    await driver.call("csi.v1", "NodeStageVolume", stage_request())
    assert generic(await driver.call("csi.v1", "NodeStageVolume", stage_request())) == []
    for code in (
        grpc.StatusCode.ABORTED,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.NOT_FOUND,  # the volume deleted on the controller's socket
        grpc.StatusCode.PERMISSION_DENIED,
    ):
        got = await driver.call("csi.v1", "NodeStageVolume", stage_request(), code=code)
        assert ("not-idempotent", "plugin") not in got, code


async def test_another_state_change_in_between_ends_the_repeat(driver):
    await driver.call("csi.v1", "NodeStageVolume", stage_request())
    unstage = v1("NodeUnstageVolumeRequest", volume_id="vol-1", staging_target_path=STAGE)
    await driver.call("csi.v1", "NodeUnstageVolume", unstage)
    got = await driver.call(
        "csi.v1", "NodeStageVolume", stage_request(), code=grpc.StatusCode.ALREADY_EXISTS
    )
    assert generic(got) == []


async def test_a_failed_other_change_ends_the_repeat_too(driver):
    await driver.call("csi.v1", "NodePublishVolume", publish_request())
    readonly = publish_request(readonly=True)
    await driver.call("csi.v1", "NodePublishVolume", readonly, code=grpc.StatusCode.ALREADY_EXISTS)
    got = await driver.call(
        "csi.v1", "NodePublishVolume", publish_request(), code=grpc.StatusCode.ALREADY_EXISTS
    )
    assert ("not-idempotent", "plugin") not in got


async def test_reads_in_between_do_not_end_the_repeat(driver):
    await driver.call("csi.v1", "NodePublishVolume", publish_request())
    stats = v1("NodeGetVolumeStatsRequest", volume_id="vol-1", volume_path=TARGET)
    await driver.call("csi.v1", "NodeGetVolumeStats", stats)
    got = await driver.call(
        "csi.v1", "NodePublishVolume", publish_request(), code=grpc.StatusCode.FAILED_PRECONDITION
    )
    assert ("not-idempotent", "plugin") in got


async def test_another_volume_at_the_same_target_path_ends_the_repeat(driver):
    await driver.call("csi.v1", "NodePublishVolume", publish_request("vol-1"))
    await driver.call("csi.v1", "NodePublishVolume", publish_request("vol-2"))
    got = await driver.call(
        "csi.v1", "NodePublishVolume", publish_request("vol-1"), code=grpc.StatusCode.ALREADY_EXISTS
    )
    assert ("not-idempotent", "plugin") not in got


async def test_controller_repeats_are_judged_only_on_request_shaped_answers(clocked):
    """A peer replica may have moved the volume meanwhile: after a leader-election lease,
    FAILED_PRECONDITION (published elsewhere) and ALREADY_EXISTS (incompatible) are not
    judged on the controller; INVALID_ARGUMENT for what was valid is. Within the lease of
    the publication this proxy saw, no peer can have moved it."""
    d, clock = clocked
    publish = v1(
        "ControllerPublishVolumeRequest",
        volume_id="vol-1",
        node_id="node-1",
        volume_capability=mount(),
    )
    await d.call("csi.v1", "ControllerPublishVolume", publish)
    rotated = v1(
        "ControllerPublishVolumeRequest",
        volume_id="vol-1",
        node_id="node-1",
        volume_capability=mount(),
        secrets={"token": "new"},
    )
    for code in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.ALREADY_EXISTS):
        got = await d.call("csi.v1", "ControllerPublishVolume", rotated, code=code)
        assert ("not-idempotent", "plugin") in got
    await d.call("csi.v1", "ControllerPublishVolume", publish)
    clock.now += HANDOVER + 1
    for code in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.ALREADY_EXISTS):
        got = await d.call("csi.v1", "ControllerPublishVolume", publish, code=code)
        assert ("not-idempotent", "plugin") not in got
    got = await d.call(
        "csi.v1", "ControllerPublishVolume", publish, code=grpc.StatusCode.INVALID_ARGUMENT
    )
    assert ("not-idempotent", "plugin") in got


async def test_delete_repeat_not_found_is_left_to_the_delete_rule(driver):
    delete = v1("DeleteVolumeRequest", volume_id="vol-1")
    await driver.call("csi.v1", "DeleteVolume", delete)
    got = await driver.call("csi.v1", "DeleteVolume", delete, code=grpc.StatusCode.NOT_FOUND)
    assert ("not-idempotent", "plugin") not in got
    got = await driver.call("csi.v1", "DeleteVolume", delete, code=grpc.StatusCode.UNIMPLEMENTED)
    assert ("not-idempotent", "plugin") in got


async def test_create_volume_repeat_already_exists_is_not_judged(driver):
    """An expansion since the create (by volume id) may make the repeat incompatible."""
    await driver.call(
        "csi.v1",
        "CreateVolume",
        create_request(),
        response=v1("CreateVolumeResponse", volume={"volume_id": "vol-1"}),
    )
    got = await driver.call(
        "csi.v1", "CreateVolume", create_request(), code=grpc.StatusCode.ALREADY_EXISTS
    )
    assert ("not-idempotent", "plugin") not in got


async def test_a_snapshot_is_judged_once_an_answer_said_it_is_ready(driver):
    request = v1("CreateSnapshotRequest", name="snap-1", source_volume_id="vol-1")

    def answer(ready: bool) -> Any:
        return v1(
            "CreateSnapshotResponse",
            snapshot={
                "snapshot_id": "s-1",
                "source_volume_id": "vol-1",
                "creation_time": {"seconds": 1},
                "ready_to_use": ready,
            },
        )

    await driver.call("csi.v1", "CreateSnapshot", request, response=answer(False))
    # uploading failed: "CreateSnapshot SHOULD return a corresponding gRPC error code"
    got = await driver.call(
        "csi.v1", "CreateSnapshot", request, code=grpc.StatusCode.ALREADY_EXISTS
    )
    assert ("not-idempotent", "plugin") not in got
    await driver.call("csi.v1", "CreateSnapshot", request, response=answer(True))
    got = await driver.call(
        "csi.v1", "CreateSnapshot", request, code=grpc.StatusCode.ALREADY_EXISTS
    )
    assert ("not-idempotent", "plugin") in got


async def test_csi_v0_snapshot_ready_by_status():
    d = Driver()
    d.caps("csi.v0", "controller", "CREATE_DELETE_SNAPSHOT")
    request = v0("CreateSnapshotRequest", name="snap-1", source_volume_id="vol-1")

    def answer(status: str) -> Any:
        return v0(
            "CreateSnapshotResponse",
            snapshot={
                "id": "s",
                "source_volume_id": "vol-1",
                "created_at": 1,
                "status": {"type": status},
            },
        )

    await d.call("csi.v0", "CreateSnapshot", request, response=answer("UPLOADING"))
    got = await d.call("csi.v0", "CreateSnapshot", request, code=grpc.StatusCode.ALREADY_EXISTS)
    assert ("not-idempotent", "plugin") not in got
    await d.call("csi.v0", "CreateSnapshot", request, response=answer("READY"))
    got = await d.call("csi.v0", "CreateSnapshot", request, code=grpc.StatusCode.ALREADY_EXISTS)
    assert ("not-idempotent", "plugin") in got


async def test_cosi_and_cmi_repeats():
    d = Driver()
    bucket = {"name": "bucket-a"}
    await d.call("cosi.v1alpha1", "DriverCreateBucket", **bucket)
    got = await d.call(
        "cosi.v1alpha1", "DriverCreateBucket", code=grpc.StatusCode.ALREADY_EXISTS, **bucket
    )
    assert ("not-idempotent", "plugin") not in got  # §Concurrency allows it
    got = await d.call(
        "cosi.v1alpha1", "DriverCreateBucket", code=grpc.StatusCode.INVALID_ARGUMENT, **bucket
    )
    assert ("not-idempotent", "plugin") in got
    machine = {"MachineName": "m-1", "ProviderSpec": b"{}"}
    await d.call("cmi.v1", "CreateMachine", **machine)
    got = await d.call("cmi.v1", "CreateMachine", code=grpc.StatusCode.OUT_OF_RANGE, **machine)
    assert ("not-idempotent", "plugin") in got
    await d.call("cmi.v1", "DeleteMachine", **machine)
    got = await d.call("cmi.v1", "CreateMachine", code=grpc.StatusCode.OUT_OF_RANGE, **machine)
    assert ("not-idempotent", "plugin") not in got


async def test_a_repeat_is_forgotten_after_ten_minutes(clocked):
    d, clock = clocked
    await d.call("csi.v1", "NodeStageVolume", stage_request())
    clock.now += 601
    got = await d.call(
        "csi.v1", "NodeStageVolume", stage_request(), code=grpc.StatusCode.ALREADY_EXISTS
    )
    assert generic(got) == []


@contextlib.asynccontextmanager
async def fake_behind_proxy(
    spec: str, tmp_path: Any, knobs: FakeKnobs | None = None
) -> AsyncIterator[tuple[SpecClient, Any, FakePluginHandle]]:
    """A bundled fake plugin behind a proxy in audit mode; its knobs may change live."""
    plugin_sock = os.path.join(tmp_path, "fake.sock")
    proxy_sock = os.path.join(tmp_path, "front.sock")
    handle = await start_fake_plugin(spec, f"unix://{plugin_sock}", knobs)
    proxy = await start_proxy(proxy_sock, plugin_sock)
    client = SpecClient(f"unix://{proxy_sock}", spec)
    try:
        yield client, proxy, handle
    finally:
        await client.close()
        await proxy.stop(0)
        await handle.stop(0)


async def test_a_real_plugin_forgetting_what_it_staged(tmp_path):
    async with fake_behind_proxy("csi.v1", tmp_path) as (client, proxy, handle):
        await client.call("ControllerGetCapabilities")
        await client.call("NodeGetCapabilities")
        node = (await client.call("NodeGetInfo")).node_id
        cap = client.new("VolumeCapability", mount={}, access_mode={"mode": "SINGLE_NODE_WRITER"})
        vol = (await client.call("CreateVolume", name="pvc-1", volume_capabilities=[cap])).volume
        published = await client.call(
            "ControllerPublishVolume",
            volume_id=vol.volume_id,
            node_id=node,
            volume_capability=cap,
            volume_context=dict(vol.volume_context),
        )
        fields = {
            "volume_id": vol.volume_id,
            "staging_target_path": STAGE,
            "volume_capability": cap,
            "publish_context": dict(published.publish_context),
            "volume_context": dict(vol.volume_context),
        }
        await client.call("NodeStageVolume", **fields)
        await client.call("NodeStageVolume", **fields)  # the fake plugin is idempotent
        assert stage_of(proxy).report.snapshot() == []
        # now it forgets it staged the volume
        handle.plugin.knobs.failures["NodeStageVolume"] = FailureRule(
            grpc.StatusCode.ALREADY_EXISTS, 1
        )
        with pytest.raises(grpc.aio.AioRpcError):
            await client.call("NodeStageVolume", **fields)
        rules = {(e["rule"], e["party"]) for e in stage_of(proxy).report.snapshot()}
    assert rules == {("csi.not-idempotent", "plugin")}


# == unimplemented-advertised: services =========================================================


async def test_a_controller_plugin_must_implement_validate_volume_capabilities():
    d = Driver()
    request = v1("ValidateVolumeCapabilitiesRequest", volume_id="v", volume_capabilities=[mount()])
    got = await d.call(
        "csi.v1", "ValidateVolumeCapabilities", request, code=grpc.StatusCode.UNIMPLEMENTED
    )
    assert ("unimplemented-advertised", "plugin") not in got  # nothing says it serves it
    caps = v1(
        "GetPluginCapabilitiesResponse", capabilities=[{"service": {"type": "CONTROLLER_SERVICE"}}]
    )
    await d.call("csi.v1", "GetPluginCapabilities", response=caps)
    got = await d.call(
        "csi.v1", "ValidateVolumeCapabilities", request, code=grpc.StatusCode.UNIMPLEMENTED
    )
    assert ("unimplemented-advertised", "plugin") in got
    (text,) = messages(d.last, "unimplemented-advertised")
    assert text == (
        "ValidateVolumeCapabilities answered UNIMPLEMENTED but it is required of a plugin"
        " serving the Controller service, which this plugin does (it advertises"
        " CONTROLLER_SERVICE)"
    )


async def test_a_node_plugin_is_known_by_its_answers(clocked):
    d, clock = clocked
    unpublish = v1("NodeUnpublishVolumeRequest", volume_id="v", target_path=TARGET)
    got = await d.call(
        "csi.v1", "NodeUnpublishVolume", unpublish, code=grpc.StatusCode.UNIMPLEMENTED
    )
    assert ("unimplemented-advertised", "plugin") not in got
    await d.call("csi.v1", "NodeStageVolume", stage_request())
    clock.now += 3
    got = await d.call(
        "csi.v1", "NodeUnpublishVolume", unpublish, code=grpc.StatusCode.UNIMPLEMENTED
    )
    assert ("unimplemented-advertised", "plugin") in got
    assert "(NodeStageVolume answered OK 3s ago)" in messages(d.last, "unimplemented-advertised")[0]
    clock.now += 301  # the evidence is forgotten with the capabilities' five minutes
    got = await d.call(
        "csi.v1", "NodeUnpublishVolume", unpublish, code=grpc.StatusCode.UNIMPLEMENTED
    )
    assert ("unimplemented-advertised", "plugin") not in got


async def test_node_get_info_is_required_with_controller_publish():
    d = Driver()
    await d.call("csi.v1", "NodeGetCapabilities")
    got = await d.call("csi.v1", "NodeGetInfo", code=grpc.StatusCode.UNIMPLEMENTED)
    assert ("unimplemented-advertised", "plugin") not in got  # controller unknown
    d.caps("csi.v1", "controller", "CREATE_DELETE_VOLUME")
    got = await d.call("csi.v1", "NodeGetInfo", code=grpc.StatusCode.UNIMPLEMENTED)
    assert ("unimplemented-advertised", "plugin") not in got
    d.caps("csi.v1", "controller", "PUBLISH_UNPUBLISH_VOLUME")
    got = await d.call("csi.v1", "NodeGetInfo", code=grpc.StatusCode.UNIMPLEMENTED)
    assert ("unimplemented-advertised", "plugin") in got
    assert (
        "while the plugin advertises PUBLISH_UNPUBLISH_VOLUME"
        in messages(d.last, "unimplemented-advertised")[0]
    )


async def test_csi_v0_node_plugins_implement_both_node_id_rpcs():
    d = Driver()
    got = await d.call("csi.v0", "NodeGetId", code=grpc.StatusCode.UNIMPLEMENTED)
    assert ("unimplemented-advertised", "plugin") not in got
    await d.call("csi.v0", "NodeGetCapabilities")
    for rpc in ("NodeGetId", "NodeGetInfo"):
        got = await d.call("csi.v0", rpc, code=grpc.StatusCode.UNIMPLEMENTED)
        assert ("unimplemented-advertised", "plugin") in got, rpc


@pytest.mark.parametrize(
    ("service", "rpc", "req"),
    [
        ("GROUP_CONTROLLER_SERVICE", "GroupControllerGetCapabilities", None),
        (
            "SNAPSHOT_METADATA_SERVICE",
            "GetMetadataDelta",
            v1("GetMetadataDeltaRequest", base_snapshot_id="a", target_snapshot_id="b"),
        ),
    ],
)
async def test_advertised_services_must_have_their_rpcs(service, rpc, req):
    d = Driver()
    got = await d.call("csi.v1", rpc, req, code=grpc.StatusCode.UNIMPLEMENTED)
    assert ("unimplemented-advertised", "plugin") not in got
    d.caps("csi.v1", "plugin", service)
    got = await d.call("csi.v1", rpc, req, code=grpc.StatusCode.UNIMPLEMENTED)
    assert ("unimplemented-advertised", "plugin") in got


async def test_optional_rpcs_of_a_served_service_stay_optional(driver):
    """CONTROLLER_SERVICE advertised, ControllerGetVolume without GET_VOLUME: UNIMPLEMENTED
    is the right answer."""
    request = v1("ControllerGetVolumeRequest", volume_id="v")
    got = await driver.call(
        "csi.v1", "ControllerGetVolume", request, code=grpc.StatusCode.UNIMPLEMENTED
    )
    assert ("unimplemented-advertised", "plugin") not in got


async def test_a_real_controller_plugin_without_validate_volume_capabilities(tmp_path):
    knobs = FakeKnobs(
        failures={"ValidateVolumeCapabilities": FailureRule(grpc.StatusCode.UNIMPLEMENTED)}
    )
    async with through_proxy("csi.v1", tmp_path, knobs=knobs) as (client, proxy):
        await client.call("GetPluginCapabilities")
        with pytest.raises(grpc.aio.AioRpcError):
            await client.call(
                "ValidateVolumeCapabilities",
                volume_id="vol-x",
                volume_capabilities=[
                    client.new(
                        "VolumeCapability", mount={}, access_mode={"mode": "SINGLE_NODE_WRITER"}
                    )
                ],
            )
        rules = {(e["rule"], e["party"]) for e in stage_of(proxy).report.snapshot()}
    assert ("csi.unimplemented-advertised", "plugin") in rules


# == retry-unfixed ===============================================================================

OUT_OF_RANGE = grpc.StatusCode.OUT_OF_RANGE
UNIMPLEMENTED = grpc.StatusCode.UNIMPLEMENTED


def unfixed(violations: list[tuple[str, str]]) -> bool:
    return ("retry-unfixed", "co") in violations


async def test_a_retry_after_out_of_range_keeping_the_capacity_range(driver):
    size = {"required_bytes": 1 << 40}
    await driver.call(
        "csi.v1", "CreateVolume", create_request(capacity_range=size), code=OUT_OF_RANGE
    )
    other_params = create_request(capacity_range=size, parameters={"tier": "fast"})
    got = await driver.call("csi.v1", "CreateVolume", other_params, code=OUT_OF_RANGE)
    assert unfixed(got) and ("retry-without-change", "co") not in got
    (text,) = messages(driver.last, "retry-unfixed")
    assert text.startswith("CreateVolume called again for the same volume-name")
    assert "(capacity_range unchanged)" in text and "OUT_OF_RANGE" in text
    assert "MUST fix the capacity range" in text and "pvc-1" not in text and "fast" not in text
    # the fix: another capacity range, though the parameters stay as they were
    fixed = create_request(capacity_range={"required_bytes": 1 << 30}, parameters={"tier": "fast"})
    assert not unfixed(await driver.call("csi.v1", "CreateVolume", fixed))
    # the OK ended the refusal: the old range is a new request now
    slow = create_request(capacity_range=size, parameters={"tier": "slow"})
    assert generic(got := await driver.call("csi.v1", "CreateVolume", slow)) == []
    assert not unfixed(got)


async def test_a_retry_after_already_exists_keeping_the_volume_arguments(driver):
    # CSI v1.12 §CreateVolume errors: the name's volume is incompatible with one of its
    # arguments; new secrets leave every argument as it was, so nothing is fixed.
    code = grpc.StatusCode.ALREADY_EXISTS
    await driver.call("csi.v1", "CreateVolume", create_request(parameters={"t": "a"}), code=code)
    rotated = create_request(parameters={"t": "a"}, secrets={"token": "new"})
    got = await driver.call("csi.v1", "CreateVolume", rotated, code=code)
    assert unfixed(got) and ("retry-without-change", "co") not in got
    assert "MUST fix the arguments or use another name" in messages(driver.last, "retry-unfixed")[0]
    # another parameter may be the fix, and another name is another volume
    changed = create_request(parameters={"t": "b"})
    assert not unfixed(await driver.call("csi.v1", "CreateVolume", changed, code=code))
    other = create_request(name="pvc-2", parameters={"t": "b"}, secrets={"token": "x"})
    assert not unfixed(await driver.call("csi.v1", "CreateVolume", other))


async def test_an_identical_retry_is_retry_without_change_only(driver):
    request = create_request(capacity_range={"required_bytes": 1 << 40})
    await driver.call("csi.v1", "CreateVolume", request, code=OUT_OF_RANGE)
    got = await driver.call("csi.v1", "CreateVolume", request)
    assert ("retry-without-change", "co") in got and not unfixed(got)


async def test_expansion_out_of_range_and_node_expand_in_use(driver):
    def expand(size: int, **extra: Any) -> Any:
        return v1(
            "ControllerExpandVolumeRequest",
            volume_id="v",
            capacity_range={"required_bytes": size},
            **extra,
        )

    await driver.call("csi.v1", "ControllerExpandVolume", expand(50), code=OUT_OF_RANGE)
    rotated = expand(50, secrets={"token": "new"})
    assert unfixed(await driver.call("csi.v1", "ControllerExpandVolume", rotated))
    assert "token" not in messages(driver.last, "retry-unfixed")[0]
    await driver.call("csi.v1", "ControllerExpandVolume", expand(70), code=OUT_OF_RANGE)
    assert not unfixed(await driver.call("csi.v1", "ControllerExpandVolume", expand(60)))

    # "Volume in use" (FAILED_PRECONDITION): "Caller MUST NOT retry", with any change
    node = v1("NodeExpandVolumeRequest", volume_id="v", volume_path=TARGET)
    await driver.call("csi.v1", "NodeExpandVolume", node, code=grpc.StatusCode.FAILED_PRECONDITION)
    bigger = v1(
        "NodeExpandVolumeRequest",
        volume_id="v",
        volume_path=TARGET,
        capacity_range={"required_bytes": 1 << 30},
    )
    assert unfixed(await driver.call("csi.v1", "NodeExpandVolume", bigger))
    assert messages(driver.last, "retry-unfixed")[0].endswith("the caller MUST NOT retry")
    # another volume's expansion is no retry
    other = v1("NodeExpandVolumeRequest", volume_id="w", volume_path=TARGET + "2")
    assert not unfixed(await driver.call("csi.v1", "NodeExpandVolume", other))


async def test_a_call_for_the_same_object_after_unimplemented(driver):
    def unpublish(path: str, volume: str = "v") -> Any:
        return v1("NodeUnpublishVolumeRequest", volume_id=volume, target_path=path)

    await driver.call("csi.v1", "NodeUnpublishVolume", unpublish(TARGET), code=UNIMPLEMENTED)
    assert unfixed(await driver.call("csi.v1", "NodeUnpublishVolume", unpublish(STAGE)))
    # a first call for another volume, or another answer first, is not judged
    assert not unfixed(await driver.call("csi.v1", "NodeUnpublishVolume", unpublish(TARGET, "w")))
    await driver.call("csi.v1", "NodeUnpublishVolume", unpublish(TARGET, "x"), code=UNIMPLEMENTED)
    await driver.call(
        "csi.v1", "NodeUnpublishVolume", unpublish(STAGE, "x"), code=grpc.StatusCode.INTERNAL
    )
    assert not unfixed(
        await driver.call("csi.v1", "NodeUnpublishVolume", unpublish(TARGET + "2", "x"))
    )
    # RPCs naming no object are not judged: another caller may list for itself
    await driver.call("csi.v1", "ListVolumes", code=UNIMPLEMENTED, max_entries=5)
    assert not unfixed(await driver.call("csi.v1", "ListVolumes", max_entries=10))
    # rows whose recovery names no field: any change may be the fix
    await driver.call(
        "csi.v1", "NodeStageVolume", stage_request(), code=grpc.StatusCode.ALREADY_EXISTS
    )
    assert not unfixed(
        await driver.call("csi.v1", "NodeStageVolume", stage_request(publish_context={"a": "b"}))
    )


async def test_retry_unfixed_in_csi_v0_cosi_and_cmi():
    d = Driver()
    d.caps("csi.v0", "controller", "CREATE_DELETE_VOLUME")
    d.caps("csi.v0", "plugin")
    delete = v0("DeleteVolumeRequest", volume_id="v")
    await d.call("csi.v0", "DeleteVolume", delete, code=UNIMPLEMENTED)
    again = v0("DeleteVolumeRequest", volume_id="v", controller_delete_secrets={"k": "s"})
    assert unfixed(await d.call("csi.v0", "DeleteVolume", again))
    # v0.3's ValidateVolumeCapabilities has no UNIMPLEMENTED row
    validate_req = v0(
        "ValidateVolumeCapabilitiesRequest", volume_id="v", volume_capabilities=[mount()]
    )
    await d.call("csi.v0", "ValidateVolumeCapabilities", validate_req, code=UNIMPLEMENTED)
    validate_ro = v0(
        "ValidateVolumeCapabilitiesRequest",
        volume_id="v",
        volume_capabilities=[mount("SINGLE_NODE_READER_ONLY")],
    )
    assert not unfixed(await d.call("csi.v0", "ValidateVolumeCapabilities", validate_ro))
    await d.call("cosi.v1alpha1", "DriverDeleteBucket", code=UNIMPLEMENTED, bucket_id="b")
    got = await d.call(
        "cosi.v1alpha1", "DriverDeleteBucket", bucket_id="b", delete_context={"k": "v"}
    )
    assert unfixed(got)
    await d.call("cmi.v1", "DeleteMachine", code=UNIMPLEMENTED, MachineName="m-1")
    assert unfixed(await d.call("cmi.v1", "DeleteMachine", MachineName="m-1", Secrets={"k": b"v"}))


async def test_an_unfixed_retry_is_forgotten_after_ten_minutes_and_memory_is_bounded(clocked):
    d, clock = clocked
    request = create_request(capacity_range={"required_bytes": 1 << 40})
    await d.call("csi.v1", "CreateVolume", request, code=OUT_OF_RANGE)
    clock.now += 601
    changed = create_request(capacity_range={"required_bytes": 1 << 40}, parameters={"a": "b"})
    assert not unfixed(await d.call("csi.v1", "CreateVolume", changed))
    mem = d.stage._plans[d.paths[("csi.v1", "CreateVolume")]].generic.memory
    assert mem.unfixed.maxsize == mem.refused.maxsize


async def test_a_real_co_changing_a_retry_but_not_the_capacity_range(tmp_path):
    knobs = FakeKnobs(failures={"ControllerExpandVolume": FailureRule(OUT_OF_RANGE)})
    async with through_proxy("csi.v1", tmp_path, knobs=knobs) as (client, proxy):
        for secret in ("one", "two"):
            with pytest.raises(grpc.aio.AioRpcError):
                await client.call(
                    "ControllerExpandVolume",
                    volume_id="vol-x",
                    capacity_range={"required_bytes": 1 << 40},
                    secrets={"token": secret},
                )
        found_rules = {
            (e["rule"], e["party"], e["count"]) for e in stage_of(proxy).report.snapshot()
        }
    assert ("csi.retry-unfixed", "co", 1) in found_rules
    assert not any(r == "csi.retry-without-change" for r, _, _ in found_rules)


# == the family alone: each step of a call told by hand, no stage =================================


RWO_CAP = {"mount": {}, "access_mode": {"mode": "SINGLE_NODE_WRITER"}}


class Steps:
    """csi.v1's generic rules (plugproxy.rules.generic) as the stage tells them a call's steps,
    with a clock of the test's own."""

    def __init__(self) -> None:
        self.clock = Clock()
        self.registry = Registry(["csi.v1"])
        self.methods = {m.name: m for m in self.registry.methods("csi.v1")}
        spec = self.methods["CreateVolume"].spec
        assert spec is not None
        self.cs = compile_table(TABLES["csi.v1"], spec)
        self.state = SpecState(clock=self.clock)
        self.rules = {n: generic_rules(self.cs, self.state, m) for n, m in self.methods.items()}

    def arrive(self, rpc: str, connection: int = 0, **fields: Any) -> tuple[Call, list[str]]:
        """A request came and was checked: the call and what arrived and retried found."""
        method = self.methods[rpc]
        assert method.request_class is not None
        call = Call(method, (), [], None, connection=connection)
        raw = method.request_class(**fields).SerializeToString()
        call.request = LazyMessage(raw, method.request_class)
        rules = self.rules[rpc]
        found = [*rules.arrived(call)] if rules.judges_arrival else []
        retried = rules.retried(call)
        if retried is not None:
            found.append(retried)
        return call, [v.rule.id for v in found]

    def answer(
        self,
        call: Call,
        code: StatusCode = StatusCode.OK,
        details: str = "the plugin says no",
        accepted: list[Violation] | None = None,
        raw_status: str | None = None,
    ) -> list[str]:
        """The call ended with ``code``: the rule ids the family found, in order."""
        rules = self.rules[call.method.name]
        call.code, call.details, call.raw_status = code, details, raw_status
        found = [*rules.ended(call, accepted)]
        if code is not StatusCode.OK and answered_by_plugin(call):
            found += rules.error_status(call)
        return [v.rule.id for v in found]

    def call(self, rpc: str, code: StatusCode = StatusCode.OK, **fields: Any) -> list[str]:
        call, before = self.arrive(rpc, **fields)
        return before + self.answer(call, code)


def test_backs_off_only_for_waits_that_grow():
    assert backs_off([0.5, 1.0, 2.0])  # kubelet: doubling
    assert backs_off([1.0, 1.2, 1.6])  # the last at least half as long again as the first
    assert not backs_off([1.0, 1.0, 1.0])  # a steady pace
    assert not backs_off([1.0, 1.001, 1.0015])  # a steady pace's timing noise
    assert not backs_off([1.0, 1.3, 0.8])  # a burst with jitter
    # a doubling wait behind a steady overhead of the caller's own: steps that double
    assert backs_off([1.0, 1.1, 1.3])


def test_the_family_judges_an_unchanged_retry_of_a_refused_request():
    f = Steps()
    bad = {"name": "pvc-1", "capacity_range": {"required_bytes": 1 << 40}}
    call, found = f.arrive("CreateVolume", **bad)
    assert found == []
    assert f.answer(call, StatusCode.INVALID_ARGUMENT) == []
    assert f.call("CreateVolume", StatusCode.INVALID_ARGUMENT, **bad) == [
        "csi.retry-without-change"
    ]
    # a changed request is the fix; ten minutes later the refusal is forgotten
    assert f.arrive("CreateVolume", name="pvc-2")[1] == []
    f.clock.now += RETRY_TTL + 1
    assert f.arrive("CreateVolume", **bad)[1] == []


def test_the_family_forgets_a_refusal_the_plugin_answered_otherwise_since():
    f = Steps()
    bad = {"name": "pvc-1"}
    f.call("CreateVolume", StatusCode.INVALID_ARGUMENT, **bad)
    call, found = f.arrive("CreateVolume", **bad)
    assert found == ["csi.retry-without-change"]
    assert f.answer(call) == []  # OK this time
    assert f.arrive("CreateVolume", **bad)[1] == []


def test_the_family_judges_a_retry_keeping_the_fields_the_refusal_names():
    f = Steps()
    big = {"volume_id": "vol-1", "capacity_range": {"required_bytes": 1 << 40}}
    f.call("ControllerExpandVolume", StatusCode.OUT_OF_RANGE, **big)
    assert f.arrive("ControllerExpandVolume", **big, secrets={"k": "v"})[1] == ["csi.retry-unfixed"]
    small = {"volume_id": "vol-1", "capacity_range": {"required_bytes": 1 << 30}}
    assert f.arrive("ControllerExpandVolume", **small)[1] == []


def test_the_family_judges_a_failed_repeat_of_a_successful_state_change():
    f = Steps()
    stage = {"volume_id": "vol-1", "staging_target_path": "/s", "volume_capability": RWO_CAP}
    assert f.call("NodeStageVolume", **stage) == []
    assert f.call("NodeStageVolume", StatusCode.UNAVAILABLE, **stage) == []  # transient
    assert f.call("NodeStageVolume", StatusCode.FAILED_PRECONDITION, **stage) == [
        "csi.not-idempotent"
    ]
    # another change of the volume since: the repeat is unknown ground again
    f.call("NodeUnstageVolume", volume_id="vol-1", staging_target_path="/s")
    assert f.call("NodeStageVolume", StatusCode.FAILED_PRECONDITION, **stage) == []


def test_the_family_judges_a_retry_while_the_pending_operation_is_in_flight():
    f = Steps()
    stage = {"volume_id": "vol-1", "staging_target_path": "/s", "volume_capability": RWO_CAP}
    busy, _ = f.arrive("NodeStageVolume", **stage)
    f.call("NodeStageVolume", StatusCode.ABORTED, **stage)
    call, found = f.arrive("NodeStageVolume", **stage)
    assert "csi.retry-while-pending" in found
    f.answer(call)
    f.answer(busy)
    assert f.rules["NodeStageVolume"].memory.in_flight == {}  # landed: counted no more
    # the caller waited for the other call this time
    f.call("NodeStageVolume", StatusCode.ABORTED, **stage)
    assert "csi.retry-while-pending" not in f.arrive("NodeStageVolume", **stage)[1]


def test_the_family_judges_resends_after_back_off_answers_that_do_not_wait_longer():
    f = Steps()
    for waits, judged in (([1.0, 1.0, 1.0], True), ([1.0, 2.0, 4.0], False)):
        found: list[str] = []
        name = f"pvc-{judged}"
        f.call("CreateVolume", StatusCode.ABORTED, name=name)
        for wait in waits:
            f.clock.now += wait
            found += f.call("CreateVolume", StatusCode.ABORTED, name=name)
        assert ("csi.retry-without-backoff" in found) is judged, waits


def test_the_family_judges_an_unimplemented_rpc_once_the_service_shows_served():
    f = Steps()
    f.state.set_capabilities("controller", frozenset())
    # the Node service not yet seen served: nothing to judge yet, but remembered
    assert f.call("NodeGetCapabilities", StatusCode.UNIMPLEMENTED) == []
    f.clock.now += 3600
    assert f.call("NodeGetInfo") == ["csi.unimplemented-advertised"]
    assert f.call("NodeGetInfo") == []  # judged once
    # once served, an UNIMPLEMENTED of an RPC the service requires is judged at once
    assert f.call("NodePublishVolume", StatusCode.UNIMPLEMENTED) == ["csi.unimplemented-advertised"]


def test_the_family_judges_the_plugins_answer_to_a_bad_request():
    f = Steps()
    bad = f.cs.rule("required-field")
    breach = [Violation(bad, "name", "name is missing")]
    call, _ = f.arrive("CreateVolume")
    assert f.answer(call, accepted=breach) == ["csi.bad-request-accepted"]
    call, _ = f.arrive("CreateVolume")
    assert f.answer(call, StatusCode.NOT_FOUND, accepted=breach) == ["csi.bad-request-wrong-code"]
    for code in (StatusCode.INVALID_ARGUMENT, StatusCode.UNAVAILABLE):  # prescribed; first
        call, _ = f.arrive("CreateVolume")
        assert "csi.bad-request-wrong-code" not in f.answer(call, code, accepted=breach)


def test_the_family_judges_the_status_the_plugin_sent():
    f = Steps()
    call, _ = f.arrive("ControllerGetVolume", volume_id="vol-1")
    assert f.answer(call, StatusCode.UNKNOWN, raw_status="17") == ["csi.status-code-not-canonical"]
    call, _ = f.arrive("ControllerGetVolume", volume_id="vol-1")
    assert f.answer(call, StatusCode.NOT_FOUND, details="", raw_status="5") == [
        "csi.error-message-empty"
    ]
    call, _ = f.arrive("ControllerGetVolume", volume_id="vol-1")
    assert f.answer(call, StatusCode.ALREADY_EXISTS) == ["csi.error-code-unexpected"]


def test_the_proxys_own_answers_and_cancellations_are_not_the_plugins():
    f = Steps()
    call, _ = f.arrive("ControllerGetVolume", volume_id="vol-1")
    call.code, call.details = StatusCode.NOT_FOUND, "gone"
    assert answered_by_plugin(call)
    call.details = "plugproxy: not ready"
    assert not answered_by_plugin(call)
    call.code, call.details = StatusCode.CANCELLED, "gone"
    assert not answered_by_plugin(call)
    # not the plugin's: no status judgement, and no refusal remembered
    assert f.answer(call, StatusCode.DEADLINE_EXCEEDED, details="") == []
    assert f.rules["ControllerGetVolume"].memory.refused_until == 0.0


def test_status_details_are_counted_in_the_decoded_status():
    from plugproxy.fakes.misbehave import status_bytes, status_details_bytes

    code = grpc.StatusCode.NOT_FOUND
    assert status_details_count(status_bytes(code, "volume gone")) == 0
    assert status_details_count(b"") == 0
    assert status_details_count(status_details_bytes(code, "x")) == 1
    assert status_details_count(b"\xff\xff\xff") is None  # not a message
    assert status_details_count(b"\x1a\x05ab") is None  # cut short


def test_unreadable_text_names_control_characters_and_bytes_that_were_not_utf8():
    assert unreadable_text("volume not found:\n\tno such volume\r\n") is None
    assert unreadable_text("naïve — ünïcode ✓") is None
    assert unreadable_text("bad\x00\x1b[31m") == "2 control character(s)"
    assert unreadable_text("caf\ufffd") == (
        "1 byte sequence(s) that are not UTF-8 (read as U+FFFD)"
    )
    # what the frame relay makes of a message whose bytes are not UTF-8
    from plugproxy.relay.hpackcodec import percent_decode

    assert unreadable_text(percent_decode(b"caf%C3")) is not None
