"""The validation stage: modes, per-rule overrides, enforce rejects, malformed bytes,
capability learning, call order, and the /violations and /metrics reports over HTTP."""

from __future__ import annotations

import asyncio
import dataclasses
import io
import json
import os
import urllib.request

import grpc
import pytest
from google.protobuf import any_pb2
from google.rpc import status_pb2
from prometheus_client import generate_latest

from plugproxy.api import Call, LazyMessage, Runtime
from plugproxy.cli import report
from plugproxy.cli.main import main
from plugproxy.cli.serve import parse_args, parse_settings
from plugproxy.core.endpoints import ConfigError
from plugproxy.core.log import Logger
from plugproxy.core.sampling import picked_indices
from plugproxy.fakes import FailureRule, FakeKnobs, SpecClient, start_fake_plugin
from plugproxy.rules.engine import RESPONSE_SAMPLE, _spread
from plugproxy.rules.state import MAX_OBJECTS
from plugproxy.spec.registry import Registry, load_spec
from plugproxy.stages import validate
from plugproxy.stages.validate import ValidateStage
from tests.integration.test_validation_lifecycle import mount_cap, stage_of, through_proxy
from tests.support import (
    VAULT,
    channel,
    generic_servicer,
    start_proxy,
    start_recorder,
    vault_descriptor_set,
)
from tests.test_rules_state import memories

CSI = load_spec("csi.v1")
DELETE = "/csi.v1.Controller/DeleteVolume"
SNAPSHOT = "/csi.v1.Controller/CreateSnapshot"
CONTROLLER_CAPS = "/csi.v1.Controller/ControllerGetCapabilities"


def csi(type_name: str, /, **fields):
    return CSI.message_class(f"csi.v1.{type_name}")(**fields)


@pytest.fixture
async def recorder(tmp_path):
    upstream = str(tmp_path / "plugin.sock")
    server, plugin = await start_recorder(upstream)
    plugin.raw[DELETE] = lambda req: b""
    yield plugin, upstream, str(tmp_path / "proxy.sock")
    await server.stop(0)


async def unary(listen: str, path: str, request: bytes, metadata=()):
    async with channel(listen) as ch:
        try:
            return await ch.unary_unary(path)(request, timeout=5, metadata=metadata), None
        except grpc.aio.AioRpcError as err:
            return None, err


def http_get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=5) as resp:
        body: bytes = resp.read()
    return body


def capture_log(proxy) -> io.StringIO:
    out = io.StringIO()
    stage_of(proxy).logger = Logger(out)
    return out


# -- modes ------------------------------------------------------------------------------------


async def test_enforce_rejects_a_bad_request_before_the_plugin(recorder):
    plugin, upstream, listen = recorder
    proxy = await start_proxy(listen, upstream, "--validation", "enforce")
    try:
        _, err = await unary(listen, DELETE, csi("DeleteVolumeRequest").SerializeToString())
    finally:
        await proxy.stop(0)
    assert err is not None and err.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "csi.required-field" in err.details() and "volume_id" in err.details()
    assert plugin.seen == []


async def test_audit_passes_the_call_and_logs_without_values(recorder):
    plugin, upstream, listen = recorder
    proxy = await start_proxy(listen, upstream)  # audit is the default
    out = capture_log(proxy)
    secrets = {"bad key": "hunter2", "k": "v" * 5000}
    bad = csi("DeleteVolumeRequest", volume_id="v" * 129, secrets=secrets)
    try:
        got, err = await unary(listen, DELETE, bad.SerializeToString(), (("csi.requestid", "77"),))
    finally:
        await proxy.stop(0)
    assert err is None and got == b""
    assert plugin.seen[0].requests == [bad.SerializeToString()]  # forwarded unchanged
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    violations = {line["rule"]: line for line in lines if line["event"] == "violation"}
    # The recorder answers OK to anything: it accepted a request it MUST refuse.
    assert set(violations) == {
        "csi.size-limit",
        "csi.size-limit-echoed",  # the id came from the plugin, not seen made here
        "csi.secret-key-format",
        "csi.bad-request-accepted",
    }
    assert violations["csi.bad-request-accepted"]["party"] == "plugin"
    line = violations["csi.size-limit"]
    assert line["rule_level"] == "MUST" and line["party"] == "co"
    assert line["method"] == DELETE and line["field"] == "secrets"  # not the plugin's volume_id
    assert line["section"] == "CSI v1.12 §Size Limits"
    assert line["request_id"] == "77"
    assert "hunter2" not in out.getvalue() and "v" * 129 not in out.getvalue()


async def test_shared_call_events_follow_the_convention():
    registry = Registry(["csi.v1"])
    runtime = Runtime(registry=registry, upstream=None, logger=Logger(io.StringIO()), metrics=None)
    stage = ValidateStage(runtime, "audit", {})
    method = registry.lookup(DELETE)
    call = Call(method, (), [], 5.0)
    call.request = LazyMessage(csi("DeleteVolumeRequest").SerializeToString(), method.request_class)
    pending = stage.on_start(call)  # DeleteVolume is gated: its capability is learnt first
    if pending is not None:
        await pending
    assert [(e.name, e.attributes) for e in call.events] == [
        (
            "violation",
            {
                "rule": "csi.required-field",
                "level": "MUST",
                "party": "co",
                "field": "volume_id",
                "section": "CSI v1.12 §DeleteVolume",
                "message": "volume_id is REQUIRED but empty",
            },
        )
    ]
    assert runtime.admin_routes["/violations"]()[0] == 200


async def test_per_rule_override_beats_the_global_mode(recorder):
    _plugin, upstream, listen = recorder
    bad = csi("DeleteVolumeRequest").SerializeToString()
    proxy = await start_proxy(
        listen, upstream, "--validation", "enforce", "--rule", "csi.required-field=audit"
    )
    try:
        _, err = await unary(listen, DELETE, bad)
        assert err is None
        # audited, and the recorder's OK to it is the plugin's csi.bad-request-accepted
        found = {(e["rule"], e["party"]) for e in stage_of(proxy).report.snapshot()}
        assert found == {("csi.required-field", "co"), ("csi.bad-request-accepted", "plugin")}
    finally:
        await proxy.stop(0)
    proxy = await start_proxy(
        listen, upstream, "--validation", "audit", "--rule", "csi.required-field=enforce"
    )
    try:
        _, err = await unary(listen, DELETE, bad)
    finally:
        await proxy.stop(0)
    assert err is not None and err.code() is grpc.StatusCode.INVALID_ARGUMENT
    proxy = await start_proxy(
        listen, upstream, "--validation", "audit", "--rule", "csi.required-field=off"
    )
    try:
        _, err = await unary(listen, DELETE, bad)
        assert err is None and stage_of(proxy).report.snapshot() == []
    finally:
        await proxy.stop(0)


def test_off_builds_no_stage_unless_a_rule_is_switched_on():
    argv = ["--listen", "unix:///tmp/a.sock", "--upstream", "unix:///tmp/b.sock"]
    runtime = Runtime(Registry(), upstream=None, logger=Logger(io.StringIO()), metrics=None)
    assert validate.build(validate.ValidateSettings(validation="off"), runtime) is None
    settings = parse_settings([*argv, "--validation", "off"], environ={})
    assert validate.build(settings.stages.validation, runtime) is None
    ns = parse_args(
        argv,
        environ={
            "PLUGPROXY_VALIDATION": "off",
            "PLUGPROXY_RULE": "csi.size-limit=audit, csi.call-order=enforce",
        },
    )
    assert ns.rule == ["csi.size-limit=audit", "csi.call-order=enforce"]
    assert validate.parse_rule_modes(ns.rule, validate.all_rules()) == {
        "csi.size-limit": "audit",
        "csi.call-order": "enforce",
    }


def test_max_remembered_objects_bounds_each_memory_from_the_flag_or_its_environment_twin():
    argv = ["--listen", "unix:///tmp/a.sock", "--upstream", "unix:///tmp/b.sock"]
    runtime = Runtime(
        registry=Registry(), upstream=None, logger=Logger(io.StringIO()), metrics=None
    )
    create = "/csi.v1.Controller/CreateVolume"
    for extra, environ, bound in (
        ([], {}, MAX_OBJECTS),
        (["--max-remembered-objects", "7"], {}, 7),
        ([], {"PLUGPROXY_MAX_REMEMBERED_OBJECTS": "9"}, 9),
        (["--max-remembered-objects", "7"], {"PLUGPROXY_MAX_REMEMBERED_OBJECTS": "9"}, 7),
    ):
        settings = parse_settings([*argv, *extra], environ=environ)
        stage = validate.build(settings.stages.validation, runtime)
        assert isinstance(stage, ValidateStage) and stage.max_objects == bound
        state = stage._plans[create].state
        assert state.max_volumes == bound and state.volumes.maxsize == bound
        assert state.creates.maxsize == bound
    assert MAX_OBJECTS == 10_000  # docs/performance.md measures this default
    settings = parse_settings(argv, environ={"PLUGPROXY_MAX_REMEMBERED_OBJECTS": "0"})
    with pytest.raises(ConfigError, match=r"^PLUGPROXY_MAX_REMEMBERED_OBJECTS must be at least 1"):
        validate.build(settings.stages.validation, runtime)
    settings = parse_settings([*argv, "--max-remembered-objects", "-1"], environ={})
    with pytest.raises(ConfigError, match=r"^--max-remembered-objects must be at least 1"):
        validate.build(settings.stages.validation, runtime)


async def test_a_proxy_remembers_at_most_max_remembered_objects_per_memory(tmp_path):
    """Through a real proxy and the fake plugin, volumes created, published, staged and
    mounted, a bound of 4: after every call no memory of the spec holds more than 4, the
    oldest volumes are forgotten, and the legitimate calls stay unreported."""
    async with through_proxy("csi.v1", tmp_path, "--max-remembered-objects", "4") as (c, proxy):
        info = await c.call("NodeGetInfo")
        cap = mount_cap(c)
        state = stage_of(proxy)._plans[DELETE].state
        vids = []
        for n in range(12):
            made = await c.call("CreateVolume", name=f"pvc-{n}", volume_capabilities=[cap])
            vid = made.volume.volume_id
            vids.append(vid)
            pub = await c.call(
                "ControllerPublishVolume",
                volume_id=vid,
                node_id=info.node_id,
                volume_capability=cap,
            )
            node = {"volume_id": vid, "volume_capability": cap}
            node["publish_context"] = dict(pub.publish_context)
            await c.call("NodeStageVolume", staging_target_path=f"/stage/{n}", **node)
            await c.call(
                "NodePublishVolume",
                staging_target_path=f"/stage/{n}",
                target_path=f"/t/{n}",
                **node,
            )
            await asyncio.sleep(0)  # the finish hooks run once the answer went out
            for name, memory in memories(state):
                assert len(memory) <= 4, name
        assert len(state.volumes) == 4
        assert state.peek(vids[0]) is None and state.peek(vids[-1]) is not None
        assert stage_of(proxy).report.snapshot() == []
        # Nor does any metric keep a series per volume.
        exposition = generate_latest(proxy.metrics).decode()
        assert "ControllerPublishVolume" in exposition
        assert not any(vid in exposition for vid in vids)


@pytest.mark.parametrize(
    ("item", "words"),
    [
        ("csi.no-such-rule=off", "unknown rule id"),
        ("csi.size-limit=loud", "mode must be"),
        ("csi.size-limit", "expected ID="),
    ],
)
def test_bad_rule_overrides_are_one_line_config_errors(item, words):
    with pytest.raises(ConfigError, match=words) as info:
        validate.parse_rule_modes([item], validate.all_rules())
    assert "\n" not in str(info.value)


def test_cli_exits_2_on_an_unknown_rule(tmp_path, capsys):
    code = main(
        [
            "serve",
            "--listen",
            f"unix://{tmp_path}/p.sock",
            "--upstream",
            f"unix://{tmp_path}/u.sock",
            "--admin-listen",
            "off",
            "--rule",
            "csi.nope=off",
        ]
    )
    assert code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "csi.nope" in err


# -- malformed bytes --------------------------------------------------------------------------


async def test_malformed_request_audit_forwards_enforce_rejects(recorder):
    plugin, upstream, listen = recorder
    garbage = b"\xff\xff\xff"
    proxy = await start_proxy(listen, upstream)
    try:
        _got, err = await unary(listen, DELETE, garbage)
        assert err is None and plugin.seen[-1].requests == [garbage]
        assert stage_of(proxy).report.snapshot()[0]["rule"] == "csi.malformed-message"
    finally:
        await proxy.stop(0)
    proxy = await start_proxy(listen, upstream, "--validation", "enforce")
    try:
        _, err = await unary(listen, DELETE, garbage)
    finally:
        await proxy.stop(0)
    assert err is not None and err.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "cannot decode" in err.details()
    assert len(plugin.seen) == 1


async def test_a_failing_request_check_fails_closed(recorder):
    plugin, upstream, listen = recorder
    proxy = await start_proxy(listen, upstream)
    stage = stage_of(proxy)

    def broken(*args):
        raise RuntimeError("bug")

    assert stage.wants(proxy.registry.lookup(DELETE))  # plans csi.v1, as its first call does
    plan = stage._plans[DELETE]
    stage._plans[DELETE] = dataclasses.replace(plan, request_checks=(broken,))
    try:
        _, err = await unary(
            listen, DELETE, csi("DeleteVolumeRequest", volume_id="v").SerializeToString()
        )
    finally:
        await proxy.stop(0)
    assert err is not None and err.code() is grpc.StatusCode.INTERNAL
    assert plugin.seen == []


# -- error scheme --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        (grpc.StatusCode.NOT_FOUND, {("csi.error-code-unexpected", "SHOULD")}),  # not in its table
        (grpc.StatusCode.ALREADY_EXISTS, set()),  # in CreateSnapshot's table
        (grpc.StatusCode.UNAVAILABLE, set()),  # a general code
        (grpc.StatusCode.UNIMPLEMENTED, {("csi.unimplemented-advertised", "MUST")}),
    ],
)
async def test_error_codes_against_the_rpc_error_table(code, expected, tmp_path):
    knobs = FakeKnobs(failures={"CreateSnapshot": FailureRule(code)})
    async with through_proxy("csi.v1", tmp_path, knobs=knobs) as (c, proxy):
        await c.call("ControllerGetCapabilities")  # CREATE_DELETE_SNAPSHOT is advertised
        with pytest.raises(grpc.aio.AioRpcError) as exc:
            await c.call("CreateSnapshot", name="s", source_volume_id="v")
        assert exc.value.code() is code  # audited, never altered
        found = {(e["rule"], e["level"]) for e in stage_of(proxy).report.snapshot()}
    assert found == expected


# -- reports over HTTP ------------------------------------------------------------------------


async def test_violations_and_metrics_over_http(recorder):
    _plugin, upstream, listen = recorder
    # The recorder's OK to these bad requests is not what this test counts.
    proxy = await start_proxy(
        listen, upstream, "--admin-listen", "127.0.0.1:0", "--rule", "csi.bad-request-accepted=off"
    )
    try:
        for _ in range(3):
            await unary(listen, DELETE, csi("DeleteVolumeRequest").SerializeToString())
        base = f"http://127.0.0.1:{proxy.admin.port}"
        report = json.loads(await asyncio.to_thread(http_get, base + "/violations"))
        metrics = (await asyncio.to_thread(http_get, base + "/metrics")).decode()
    finally:
        await proxy.stop(0)
    assert report["total"] == 3
    (entry,) = report["violations"]
    assert entry["rule"] == "csi.required-field" and entry["method"] == DELETE
    assert entry["party"] == "co" and entry["level"] == "MUST" and entry["count"] == 3
    assert entry["section"] == "CSI v1.12 §DeleteVolume"
    assert entry["last_message"] == "volume_id is REQUIRED but empty"
    assert entry["last_seen"].endswith("Z")
    assert (
        'plugproxy_violations_total{level="MUST",method="/csi.v1.Controller/DeleteVolume",'
        'party="co",rule="csi.required-field",spec="csi.v1"} 3.0'
    ) in metrics


async def test_violations_say_how_many_calls_enforce_rejected(recorder):
    """Enforce answers requests breaking a MUST with a prescribed answer itself; the report
    counts those calls per entry, and plugin-side violations stay reported only."""
    plugin, upstream, listen = recorder
    plugin.raw["/csi.v1.Identity/GetPluginInfo"] = lambda req: b""  # no name, no version
    proxy = await start_proxy(
        listen, upstream, "--admin-listen", "127.0.0.1:0", "--validation", "enforce"
    )
    out = capture_log(proxy)
    try:
        for _ in range(2):
            _, err = await unary(listen, DELETE, csi("DeleteVolumeRequest").SerializeToString())
            assert err is not None and err.code() is grpc.StatusCode.INVALID_ARGUMENT
        await unary(listen, "/csi.v1.Identity/GetPluginInfo", b"")
        base = f"http://127.0.0.1:{proxy.admin.port}"
        data = json.loads(await asyncio.to_thread(http_get, base + "/violations"))
    finally:
        await proxy.stop(0)
    assert data["mode"] == "enforce" and data["calls_judged"] == 3
    assert data["calls_judged_by_spec"] == {"csi.v1": 3}
    counts = {
        (e["method"].rsplit("/", 1)[1], e["party"]): (e["count"], e["rejected"])
        for e in data["violations"]
    }
    # (name and vendor_version are both missing: two occurrences in one call)
    assert counts == {("DeleteVolume", "co"): (2, 2), ("GetPluginInfo", "plugin"): (2, 0)}
    assert data["total"] == 4 and data["rejected"] == 2
    logged = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [line.get("rejected") for line in logged if line["event"] == "violation"] == [
        True,
        True,
        None,
        None,
    ]
    text = io.StringIO()
    report.render(data, text, width=100)
    assert (
        "count       2\n   rejected    2 of 2: the proxy answered those calls itself"
        in text.getvalue()
    )
    assert "rejected    0: reported only" in text.getvalue()


# -- capabilities -----------------------------------------------------------------------------


def controller_caps(*names: str) -> bytes:
    resp = csi("ControllerGetCapabilitiesResponse")
    enum = CSI.descriptor("csi.v1.ControllerServiceCapability.RPC").enum_types_by_name["Type"]
    for name in names:
        resp.capabilities.add().rpc.type = enum.values_by_name[name].number
    return resp.SerializeToString()


async def test_proxy_asks_for_capabilities_once_and_reports_without_rejecting(recorder):
    """Calling an RPC the plugin did not advertise is advisory: the plugin's own
    UNIMPLEMENTED is the answer, never a FAILED_PRECONDITION from the proxy (FP-12)."""
    plugin, upstream, listen = recorder
    plugin.raw[CONTROLLER_CAPS] = lambda req: controller_caps("CREATE_DELETE_VOLUME")
    plugin.raw[SNAPSHOT] = lambda req: b""
    proxy = await start_proxy(listen, upstream, "--validation", "enforce")
    req = csi("CreateSnapshotRequest", name="s", source_volume_id="v").SerializeToString()
    try:
        _, err1 = await unary(listen, SNAPSHOT, req)
        _, err2 = await unary(listen, SNAPSHOT, req)
        report = [e for e in stage_of(proxy).report.snapshot() if e["party"] == "co"]
    finally:
        await proxy.stop(0)
    assert err1 is None and err2 is None
    assert [s.method for s in plugin.seen] == [CONTROLLER_CAPS, SNAPSHOT, SNAPSHOT]  # asked once
    (entry,) = report
    assert (entry["rule"], entry["level"], entry["party"], entry["count"]) == (
        "csi.capability-not-advertised",
        "SHOULD",
        "co",
        2,
    )
    assert "CREATE_DELETE_SNAPSHOT" in entry["last_message"]


async def test_capability_query_failure_fails_open(recorder):
    plugin, upstream, listen = recorder  # the recorder does not answer capability queries
    plugin.raw[SNAPSHOT] = lambda req: b""
    proxy = await start_proxy(listen, upstream, "--validation", "enforce")
    req = csi("CreateSnapshotRequest", name="s", source_volume_id="v").SerializeToString()
    try:
        _, err = await unary(listen, SNAPSHOT, req)
        _, err2 = await unary(listen, SNAPSHOT, req)
    finally:
        await proxy.stop(0)
    assert err is None and err2 is None
    assert [s.method for s in plugin.seen] == [SNAPSHOT, SNAPSHOT]


async def test_capabilities_seen_on_the_wire_are_used(recorder):
    plugin, upstream, listen = recorder
    plugin.raw[CONTROLLER_CAPS] = lambda req: controller_caps("CREATE_DELETE_SNAPSHOT")
    plugin.raw[SNAPSHOT] = lambda req: csi(
        "CreateSnapshotResponse",
        snapshot={"snapshot_id": "s1", "source_volume_id": "v", "creation_time": {"seconds": 1}},
    ).SerializeToString()
    proxy = await start_proxy(listen, upstream, "--validation", "enforce")
    try:
        await unary(listen, CONTROLLER_CAPS, b"")
        got, err = await unary(
            listen,
            SNAPSHOT,
            csi("CreateSnapshotRequest", name="s", source_volume_id="v").SerializeToString(),
        )
    finally:
        await proxy.stop(0)
    assert err is None and got
    assert stage_of(proxy).report.snapshot() == []


# -- call order -------------------------------------------------------------------------------


async def test_call_order_enforces_only_the_case_with_a_prescribed_answer(tmp_path):
    async with through_proxy("csi.v1", tmp_path, "--validation", "enforce") as (c, proxy):
        info = await c.call("NodeGetInfo")
        await c.call("NodeGetCapabilities")
        cap = mount_cap(c)
        vid = (await c.call("CreateVolume", name="p", volume_capabilities=[cap])).volume.volume_id
        # NodePublish of a volume known not to be staged, with STAGE_UNSTAGE advertised:
        # §NodePublishVolume prescribes FAILED_PRECONDITION, which enforce gives.
        with pytest.raises(grpc.aio.AioRpcError) as exc:
            await c.call(
                "NodePublishVolume",
                volume_id=vid,
                staging_target_path="/s",
                target_path="/t",
                volume_capability=cap,
            )
        assert exc.value.code() is grpc.StatusCode.FAILED_PRECONDITION
        assert exc.value.details().startswith("plugproxy: csi.call-order")
        published = await c.call(
            "ControllerPublishVolume", volume_id=vid, node_id=info.node_id, volume_capability=cap
        )
        context = dict(published.publish_context)  # the node calls MUST pass it on
        await c.call(
            "NodeStageVolume",
            volume_id=vid,
            staging_target_path="/s",
            volume_capability=cap,
            publish_context=context,
        )
        await c.call(
            "NodePublishVolume",
            volume_id=vid,
            staging_target_path="/s",
            target_path="/t",
            volume_capability=cap,
            publish_context=context,
        )
        # Out of order, with no answer prescribed: reported, and the plugin answers itself.
        for rpc, fields in (
            ("NodeUnstageVolume", {"staging_target_path": "/s"}),
            ("ControllerUnpublishVolume", {"node_id": info.node_id}),
            ("DeleteVolume", {}),
        ):
            with pytest.raises(grpc.aio.AioRpcError) as exc:
                await c.call(rpc, volume_id=vid, **fields)
            assert exc.value.code() is grpc.StatusCode.FAILED_PRECONDITION, rpc
            assert not exc.value.details().startswith("plugproxy:"), rpc  # the plugin's answer
        found = {
            (e["rule"], e["level"], e["party"], e["method"].rsplit("/", 1)[-1]): e["count"]
            for e in stage_of(proxy).report.snapshot()
            if e["party"] == "co"
        }
        assert found == {
            ("csi.call-order", "MUST", "co", "NodePublishVolume"): 1,
            ("csi.call-order", "MUST", "co", "NodeUnstageVolume"): 1,
            ("csi.call-order", "MUST", "co", "ControllerUnpublishVolume"): 1,
            ("csi.delete-while-published", "SHOULD", "co", "DeleteVolume"): 1,
        }
        # in order, everything passes and nothing more is reported
        await c.call("NodeUnpublishVolume", volume_id=vid, target_path="/t")
        await c.call("NodeUnstageVolume", volume_id=vid, staging_target_path="/s")
        await c.call("ControllerUnpublishVolume", volume_id=vid, node_id=info.node_id)
        await c.call("DeleteVolume", volume_id=vid)
        after = sum(e["count"] for e in stage_of(proxy).report.snapshot() if e["party"] == "co")
        assert after == 4


async def test_delete_of_a_volume_seen_published_is_judged_on_the_plugins_answer(tmp_path):
    """FP-4/X-3: the proxy saw the volume published; another replica unpublished it. The
    plugin deletes it (OK): nothing to report; had it refused, the advisory names the CO."""
    async with through_proxy("csi.v1", tmp_path, "--validation", "enforce") as (c, proxy):
        info = await c.call("NodeGetInfo")
        cap = mount_cap(c)
        vid = (await c.call("CreateVolume", name="p", volume_capabilities=[cap])).volume.volume_id
        await c.call(
            "ControllerPublishVolume", volume_id=vid, node_id=info.node_id, volume_capability=cap
        )
        state = stage_of(proxy)._plans[DELETE].state  # the proxy's memory: "published"
        assert state.peek(vid) is not None and state.controller_nodes(vid)
        # the unpublish went through another replica, straight to the storage system
        direct = SpecClient(f"unix://{tmp_path}/plugin.sock", "csi.v1")
        try:
            await direct.call("ControllerUnpublishVolume", volume_id=vid, node_id=info.node_id)
        finally:
            await direct.close()
        await c.call("DeleteVolume", volume_id=vid)
        assert stage_of(proxy).report.snapshot() == []
        assert state.peek(vid) is None  # deleted: forgotten


async def test_history_the_proxy_never_saw_is_not_a_violation(tmp_path):
    plugin_sock = os.path.join(tmp_path, "plugin.sock")
    proxy_sock = os.path.join(tmp_path, "proxy.sock")
    handle = await start_fake_plugin("csi.v1", f"unix://{plugin_sock}")
    direct = SpecClient(f"unix://{plugin_sock}", "csi.v1")
    cap = mount_cap(direct)
    info = await direct.call("NodeGetInfo")
    vid = (await direct.call("CreateVolume", name="p", volume_capabilities=[cap])).volume.volume_id
    await direct.call(
        "ControllerPublishVolume", volume_id=vid, node_id=info.node_id, volume_capability=cap
    )
    await direct.call(
        "NodeStageVolume", volume_id=vid, staging_target_path="/s", volume_capability=cap
    )
    await direct.call(
        "NodePublishVolume",
        volume_id=vid,
        staging_target_path="/s",
        target_path="/t",
        volume_capability=cap,
    )
    # The proxy starts mid-life and sees only the tail of the lifecycle.
    proxy = await start_proxy(proxy_sock, plugin_sock, "--validation", "enforce")
    client = SpecClient(f"unix://{proxy_sock}", "csi.v1")
    try:
        await client.call("NodeGetInfo")
        await client.call("NodeGetCapabilities")
        await client.call("NodeUnpublishVolume", volume_id=vid, target_path="/t")
        await client.call(
            "NodePublishVolume",
            volume_id=vid,
            staging_target_path="/s",
            target_path="/t2",
            volume_capability=cap,
        )
        await client.call("NodeUnpublishVolume", volume_id=vid, target_path="/t2")
        await client.call("NodeUnstageVolume", volume_id=vid, staging_target_path="/s")
        await client.call("ControllerUnpublishVolume", volume_id=vid, node_id=info.node_id)
        await client.call("DeleteVolume", volume_id=vid)
        assert stage_of(proxy).report.snapshot() == []
    finally:
        await client.close()
        await direct.close()
        await proxy.stop(0)
        await handle.stop(0)


# -- large responses --------------------------------------------------------------------------


async def test_a_large_page_is_judged_on_a_sample_naming_real_entries(recorder):
    """A 10,000-entry page: the late bad entry is found under its real index, and
    csi.list-max-entries counts every entry, not the sample (CSI v1.12 §ListVolumes)."""
    plugin, upstream, listen = recorder
    kept = picked_indices(10_000)
    # An entry the sample keeps past its head and the rules' own spread then judges.
    position = [p for p in _spread(len(kept), RESPONSE_SAMPLE) if len(kept) // 2 < p][-2]
    late = kept[position]
    assert late != position and late < 9_999
    page = csi("ListVolumesResponse")
    for i in range(10_000):
        if i != late:
            page.entries.add().volume.volume_id = f"vol-{i:05d}"
        else:
            page.entries.add()  # no volume: a REQUIRED field missing
    raw = page.SerializeToString()
    plugin.raw["/csi.v1.Controller/ListVolumes"] = lambda req: raw
    proxy = await start_proxy(listen, upstream)
    out = capture_log(proxy)
    request = csi("ListVolumesRequest", max_entries=100).SerializeToString()
    try:
        got, err = await unary(listen, "/csi.v1.Controller/ListVolumes", request)
    finally:
        await proxy.stop(0)
    assert err is None and got == raw
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    found = {(line["rule"], line["field"]): line for line in lines if line["event"] == "violation"}
    assert set(found) == {
        ("csi.required-field", f"entries[{late}].volume"),
        ("csi.list-max-entries", "entries"),
    }
    assert found["csi.list-max-entries", "entries"]["message"].startswith("10000 entries")
    assert str(late) in found["csi.required-field", f"entries[{late}].volume"]["message"]


async def test_a_page_listed_again_is_judged_again_on_what_changed(recorder):
    """Entries the checks found clean are known by their wire bytes and not read again: the
    same bad entry is reported on every listing, an entry whose bytes change is judged
    anew, and each listing judges entries the one before did not."""
    plugin, upstream, listen = recorder
    kept = picked_indices(10_000)
    judged_first = [kept[p] for p in _spread(len(kept), RESPONSE_SAMPLE)]
    bad, turned = judged_first[-2], judged_first[-3]

    def page(broken: set[int]) -> bytes:
        message = csi("ListVolumesResponse")
        for i in range(10_000):
            entry = message.entries.add()
            if i not in broken:
                entry.volume.volume_id = f"vol-{i:05d}"
        return message.SerializeToString()

    answers = [page({bad}), page({bad}), page({bad, turned})]
    plugin.raw["/csi.v1.Controller/ListVolumes"] = lambda req: answers.pop(0)
    proxy = await start_proxy(listen, upstream)
    out = capture_log(proxy)
    request = csi("ListVolumesRequest").SerializeToString()
    clean: list[int] = []
    try:
        for _ in range(3):
            _, err = await unary(listen, "/csi.v1.Controller/ListVolumes", request)
            assert err is None
            clean.append(
                len(stage_of(proxy)._plans["/csi.v1.Controller/ListVolumes"].clean_entries)
            )
    finally:
        await proxy.stop(0)
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    found = [line["field"] for line in lines if line["event"] == "violation"]
    assert found == [f"entries[{n}].volume" for n in (bad, bad, turned, bad)]
    assert clean[0] == len(judged_first) - 1  # all judged but the bad one
    assert clean[0] < clean[1] <= clean[2]  # the second listing judged other entries too


# -- spec-coverage audit §5 and §6: each changed family, planted and legitimate ---------------


def co_and_plugin(proxy) -> set[tuple[str, str, str, str]]:
    return {
        (e["rule"], e["level"], e["party"], e["method"].rsplit("/", 1)[-1])
        for e in stage_of(proxy).report.snapshot()
    }


@pytest.mark.parametrize(
    ("knobs", "expected"),
    [
        (FakeKnobs(status_in_trailer=True), set()),  # a Status with zero details (FP-5)
        (
            FakeKnobs(misbehave={"error-with-details"}),
            {("csi.status-details-nonempty", "MUST", "plugin", "ControllerGetVolume")},
        ),
    ],
)
async def test_status_details_nonempty_judges_the_details_not_the_trailer(
    knobs, expected, tmp_path
):
    async with through_proxy("csi.v1", tmp_path, knobs=knobs) as (c, proxy):
        with pytest.raises(grpc.aio.AioRpcError) as exc:
            await c.call("ControllerGetVolume", volume_id="vol-missing")
        assert exc.value.code() is grpc.StatusCode.NOT_FOUND
        assert "grpc-status-details-bin" in dict(exc.value.trailing_metadata() or ())
        assert co_and_plugin(proxy) == expected


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        # what a gRPC library answers for a message over its limit: a transport code
        (grpc.StatusCode.RESOURCE_EXHAUSTED, set()),
        (
            grpc.StatusCode.NOT_FOUND,
            {("csi.error-code-unexpected", "SHOULD", "plugin", "ListVolumes")},
        ),
    ],
)
async def test_resource_exhausted_is_a_transport_code(code, expected, tmp_path):
    knobs = FakeKnobs(failures={"ListVolumes": FailureRule(code)})
    async with through_proxy("csi.v1", tmp_path, knobs=knobs) as (c, proxy):
        with pytest.raises(grpc.aio.AioRpcError):
            await c.call("ListVolumes")
        assert co_and_plugin(proxy) == expected


async def test_cosi_rpcs_other_than_create_bucket_are_should_implement(tmp_path):
    """FP-11/X-8: only DriverCreateBucket (and Identity) MUST be implemented."""
    unimplemented = FailureRule(grpc.StatusCode.UNIMPLEMENTED)
    knobs = FakeKnobs(
        failures={"DriverGrantBucketAccess": unimplemented, "DriverCreateBucket": unimplemented}
    )
    async with through_proxy("cosi.v1alpha1", tmp_path, knobs=knobs) as (c, proxy):
        for rpc, fields in (
            ("DriverGrantBucketAccess", {"bucket_id": "b", "name": "a", "authentication_type": 1}),
            ("DriverCreateBucket", {"name": "bucket-1"}),
        ):
            with pytest.raises(grpc.aio.AioRpcError):
                await c.call(rpc, **fields)
        assert co_and_plugin(proxy) == {
            ("cosi.unimplemented-recommended", "SHOULD", "plugin", "DriverGrantBucketAccess"),
            ("cosi.unimplemented-advertised", "MUST", "plugin", "DriverCreateBucket"),
        }


async def test_accessibility_requirements_without_the_capability_is_a_must(tmp_path):
    """The field "SHALL NOT be specified" without the capability: enforced with the
    §Error Scheme answer for a field the plugin does not allow, INVALID_ARGUMENT."""
    knobs = FakeKnobs(hide_capabilities={"VOLUME_ACCESSIBILITY_CONSTRAINTS"})
    async with through_proxy("csi.v1", tmp_path, "--validation", "enforce", knobs=knobs) as (
        c,
        proxy,
    ):
        cap = mount_cap(c)
        topology = {"requisite": [{"segments": {"topology.fake.plugproxy.io/zone": "zone-a"}}]}
        with pytest.raises(grpc.aio.AioRpcError) as exc:
            await c.call(
                "CreateVolume",
                name="p",
                volume_capabilities=[cap],
                accessibility_requirements=topology,
            )
        assert exc.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert exc.value.details().startswith(
            "plugproxy: csi.topology-requirement-without-capability"
        )
        await c.call("CreateVolume", name="p", volume_capabilities=[cap])  # without it: fine
        # (the fake still answers with accessible_topology: the plugin's own breach)
        assert {f for f in co_and_plugin(proxy) if f[2] == "co"} == {
            ("csi.topology-requirement-without-capability", "MUST", "co", "CreateVolume")
        }


async def test_unadvertised_rpcs_and_sources_are_advisory_and_reach_the_plugin(tmp_path):
    """FP-12, X-1, X-2, FP-3: calling an RPC or asking for a content source the plugin did
    not advertise is reported as a SHOULD and passes in enforce mode; NodeGetVolumeStats
    is served with GET_VOLUME_STATS or VOLUME_CONDITION."""
    knobs = FakeKnobs(hide_capabilities={"CLONE_VOLUME", "GET_VOLUME_STATS", "VOLUME_CONDITION"})
    async with through_proxy("csi.v1", tmp_path, "--validation", "enforce", knobs=knobs) as (
        c,
        proxy,
    ):
        info = await c.call("NodeGetInfo")
        cap = mount_cap(c)
        vol = (await c.call("CreateVolume", name="p", volume_capabilities=[cap])).volume
        clone = await c.call(
            "CreateVolume",
            name="q",
            volume_capabilities=[cap],
            volume_content_source={"volume": {"volume_id": vol.volume_id}},
        )
        assert clone.volume.volume_id
        published = await c.call(
            "ControllerPublishVolume",
            volume_id=vol.volume_id,
            node_id=info.node_id,
            volume_capability=cap,
        )
        await c.call(
            "NodeStageVolume",
            volume_id=vol.volume_id,
            staging_target_path="/s",
            volume_capability=cap,
            publish_context=dict(published.publish_context),
        )
        await c.call("NodeGetVolumeStats", volume_id=vol.volume_id, volume_path="/s")
        assert co_and_plugin(proxy) == {
            ("csi.capability-not-advertised", "SHOULD", "co", "CreateVolume"),
            ("csi.capability-not-advertised", "SHOULD", "co", "NodeGetVolumeStats"),
        }
        # VOLUME_CONDITION alone is enough for NodeGetVolumeStats: nothing more reported
        stage = stage_of(proxy)
        stage._plans["/csi.v1.Node/NodeGetVolumeStats"].state.set_capabilities(
            "node", frozenset({"STAGE_UNSTAGE_VOLUME", "VOLUME_CONDITION"})
        )
        await c.call("NodeGetVolumeStats", volume_id=vol.volume_id, volume_path="/s")
        counts = {e["method"].rsplit("/", 1)[-1]: e["count"] for e in stage.report.snapshot()}
        assert counts["NodeGetVolumeStats"] == 1


async def test_cmi_capabilities_follow_the_proto_numbers_and_say_so(tmp_path):
    """FP-10: the spec text numbers SHUTDOWN_MACHINE and LIST_MACHINES the other way round
    than the proto; plugproxy follows the wire (the proto) and its messages say so."""
    knobs = FakeKnobs(hide_capabilities={"SHUTDOWN_MACHINE"})
    async with through_proxy("cmi.v1", tmp_path, "--validation", "enforce", knobs=knobs) as (
        c,
        proxy,
    ):
        caps = await c.call("GetPluginCapabilities")
        assert 4 in {cap.rpc.type for cap in caps.capabilities}  # LIST_MACHINES on the wire
        spec = b'{"vmPool": "p", "size": "small", "tags": {}}'
        await c.call("CreateMachine", MachineName="m", ProviderSpec=spec)  # a non-empty listing
        await c.call("ListMachines", ProviderSpec=spec)  # advertised as 4: nothing to say
        await c.call("ShutDownMachine", MachineName="m", ProviderSpec=spec)  # passes
        (entry,) = stage_of(proxy).report.snapshot()
    assert (entry["rule"], entry["level"], entry["method"]) == (
        "cmi.capability-not-advertised",
        "SHOULD",
        "/cmi.v1.Machine/ShutDownMachine",
    )
    assert "SHUTDOWN_MACHINE" in entry["last_message"]
    assert "proto" in entry["last_message"] and "swaps" in entry["last_message"]


# -- absolute paths and topology: enforce rejects the CO, reports the plugin ------------------

NODE_PUBLISH = "/csi.v1.Node/NodePublishVolume"
NODE_GET_INFO = "/csi.v1.Node/NodeGetInfo"
CREATE = "/csi.v1.Controller/CreateVolume"
POD_UID = "0b1c2d3e-4f50-6172-8394-a5b6c7d8e9f0"
PV = "pvc-3f0e4a6e-9a43-4c3e-8a5e-3b1f3e0c9d11"
KUBELET_TARGET = f"/var/lib/kubelet/pods/{POD_UID}/volumes/kubernetes.io~csi/{PV}/mount"
KUBELET_STAGE = (
    f"/var/lib/kubelet/plugins/kubernetes.io/csi/ebs.csi.aws.com/{'5e' * 32}/globalmount"
)
MOUNT = {"mount": {}, "access_mode": {"mode": 1}}
EBS = {"topology.ebs.csi.aws.com/zone": "us-east-1a", "kubernetes.io/hostname": "ip-10-0-1-23"}


def logged_violations(out: io.StringIO) -> list[tuple[str, str, str, str]]:
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    return [
        (line["rule"], line["party"], line["method"].rsplit("/", 1)[-1], line["field"])
        for line in lines
        if line["event"] == "violation"
    ]


async def test_enforce_reports_a_relative_node_path_and_lets_the_plugin_answer(recorder):
    """A relative node path is reported, never enforced: csi-sanity sends one to test the
    plugin's NOT_FOUND, and no error row names the case."""
    plugin, upstream, listen = recorder
    plugin.raw[NODE_PUBLISH] = lambda req: b""
    proxy = await start_proxy(listen, upstream, "--validation", "enforce")
    out = capture_log(proxy)

    def publish(target: str) -> bytes:
        return csi(
            "NodePublishVolumeRequest",
            volume_id="vol-1",
            staging_target_path=KUBELET_STAGE,
            target_path=target,
            volume_capability=MOUNT,
        ).SerializeToString()

    try:
        _, err = await unary(listen, NODE_PUBLISH, publish("pods/x/mount"))
        got, ok = await unary(listen, NODE_PUBLISH, publish(KUBELET_TARGET))
    finally:
        await proxy.stop(0)
    assert err is None and ok is None and got == b""
    assert [s.method for s in plugin.seen] == [NODE_PUBLISH, NODE_PUBLISH]
    assert logged_violations(out) == [
        ("csi.path-not-absolute", "co", "NodePublishVolume", "target_path")
    ]


async def test_enforce_rejects_bad_requirements_and_only_reports_topology_formats(recorder):
    """A CO's own requirement structure (empty; preferred outside requisite) is enforced.
    Topology keys and values it sends usually repeat the plugin's or an administrator's,
    so their format is reported, from either party, and never blocks a call."""
    plugin, upstream, listen = recorder
    plugin.raw[CREATE] = lambda req: csi(
        "CreateVolumeResponse",
        volume={"volume_id": "vol-1", "accessible_topology": [{"segments": EBS}]},
    ).SerializeToString()
    # The plugin's node topology: a key with an upper-case prefix and an empty value.
    bad_node = {"Topology.Example.com/zone": ""}
    plugin.raw[NODE_GET_INFO] = lambda req: csi(
        "NodeGetInfoResponse", node_id="node-1", accessible_topology={"segments": bad_node}
    ).SerializeToString()
    proxy = await start_proxy(listen, upstream, "--validation", "enforce")
    out = capture_log(proxy)

    def create(**requirement) -> bytes:
        return csi(
            "CreateVolumeRequest",
            name="pvc-1",
            volume_capabilities=[MOUNT],
            accessibility_requirements=requirement,
        ).SerializeToString()

    zone = {"topology.kubernetes.io/zone": "us-east-1a"}
    try:
        rejected = [
            (await unary(listen, CREATE, body))[1]
            for body in (
                create(),
                create(requisite=[{"segments": zone}], preferred=[{"segments": EBS}]),
            )
        ]
        passed = [
            await unary(listen, CREATE, body)
            for body in (
                create(requisite=[{"segments": {"topology.kubernetes.io/zone": "-a"}}]),
                create(preferred=[{"segments": {"Zone": "a", "zone": "b"}}]),
                create(
                    requisite=[{"segments": EBS}, {"segments": zone}],
                    preferred=[{"segments": EBS}],
                ),
            )
        ]
        info, info_err = await unary(listen, NODE_GET_INFO, b"")
    finally:
        await proxy.stop(0)
    assert all(e is not None and e.code() is grpc.StatusCode.INVALID_ARGUMENT for e in rejected)
    assert [e.details().split(": ")[1] for e in rejected] == [
        "csi.topology-requirement-empty",
        "csi.topology-preferred-not-requisite",
    ]
    assert "accessibility_requirements.preferred[0]" in rejected[1].details()
    assert all(err is None and got for got, err in passed)
    assert info_err is None and info
    assert [s.method for s in plugin.seen] == [CREATE, CREATE, CREATE, NODE_GET_INFO]
    violations = logged_violations(out)
    co_side = sorted(v[0] for v in violations if v[1] == "co")
    assert co_side == [
        "csi.topology-key-duplicate",
        "csi.topology-preferred-not-requisite",
        "csi.topology-requirement-empty",
        "csi.topology-value-format",
    ]
    assert (
        "csi.topology-value-format",
        "co",
        "CreateVolume",
        "accessibility_requirements.requisite[0].segments[value 0]",
    ) in violations
    # EBS's answer has its own prefix besides Kubernetes' well-known key: not flagged; the
    # node's key has another prefix than that answer's: flagged (reported only).
    plugin_side = [v for v in violations if v[1] == "plugin"]
    assert sorted(plugin_side) == [
        ("csi.topology-key-format", "plugin", "NodeGetInfo", "accessible_topology.segments[key 0]"),
        ("csi.topology-prefix-inconsistent", "plugin", "NodeGetInfo", "accessible_topology"),
        (
            "csi.topology-value-format",
            "plugin",
            "NodeGetInfo",
            "accessible_topology.segments[value 0]",
        ),
    ]


async def test_get_capacity_topology_without_the_capability_is_rejected(tmp_path):
    """GetCapacityRequest.accessible_topology "SHALL NOT be set unless" the plugin
    advertises VOLUME_ACCESSIBILITY_CONSTRAINTS: enforced as INVALID_ARGUMENT."""
    zone = {"segments": {"topology.fake.plugproxy.io/zone": "zone-a"}}
    knobs = FakeKnobs(hide_capabilities={"VOLUME_ACCESSIBILITY_CONSTRAINTS"})
    async with through_proxy("csi.v1", tmp_path, "--validation", "enforce", knobs=knobs) as (
        c,
        proxy,
    ):
        with pytest.raises(grpc.aio.AioRpcError) as exc:
            await c.call("GetCapacity", accessible_topology=zone)
        assert exc.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert exc.value.details().startswith(
            "plugproxy: csi.capacity-topology-without-capability: accessible_topology "
        )
        await c.call("GetCapacity")  # without it: fine
        assert co_and_plugin(proxy) == {
            ("csi.capacity-topology-without-capability", "MUST", "co", "GetCapacity")
        }
    async with through_proxy("csi.v1", tmp_path, "--validation", "enforce") as (c, proxy):
        await c.call("GetCapacity", accessible_topology=zone)  # advertised: fine
        assert co_and_plugin(proxy) == set()


# -- descriptor sets ----------------------------------------------------------------------------


async def test_a_descriptor_sets_rules_take_modes_and_judge_no_spec_error_scheme(tmp_path):
    upstream, listen = str(tmp_path / "plugin.sock"), str(tmp_path / "proxy.sock")
    put_path = f"/{VAULT}.Vault/PutSecret"
    details = status_pb2.Status(code=9, details=[any_pb2.Any(type_url="x/y")]).SerializeToString()

    async def put(request, context):
        # What the bundled specs' error schemes forbid: an empty message, status details.
        await context.abort(
            grpc.StatusCode.FAILED_PRECONDITION, "", (("grpc-status-details-bin", details),)
        )

    server = grpc.aio.server()
    server.add_generic_rpc_handlers([generic_servicer(vault_descriptor_set(), {put_path: put})])
    server.add_insecure_port(f"unix:{upstream}")
    await server.start()
    proxy = await start_proxy(
        listen,
        upstream,
        "--descriptor-set",
        vault_descriptor_set(),
        "--rule",
        f"{VAULT}.required-field=enforce",
    )
    try:
        put_class = proxy.registry.lookup(put_path).request_class
        complete = put_class(vault="v", secret={"name": "n"}, ttl_days=1).SerializeToString()
        _, err = await unary(listen, put_path, complete)
        assert err is not None and err.code() is grpc.StatusCode.FAILED_PRECONDITION
        assert stage_of(proxy).report.snapshot() == []
        _, err = await unary(listen, put_path, put_class(ttl_days=1).SerializeToString())
        assert err is not None and err.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert err.details() == (
            f"plugproxy: {VAULT}.required-field: vault is REQUIRED but empty (and 1 more)"
        )
    finally:
        await proxy.stop(0)
        await server.stop(0)
    # A descriptor set's rule ids exist only where the set is served.
    with pytest.raises(ConfigError, match="unknown rule id"):
        validate.parse_rule_modes(
            [f"{VAULT}.required-field=off"], validate.known_rules(Registry(["csi.v1"]))
        )
