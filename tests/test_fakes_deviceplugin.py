"""The fake device plugin: ListAndWatch health updates at the knob's period, allocation."""

from __future__ import annotations

import time
from pathlib import Path

import grpc
import pytest

from plugproxy.core.endpoints import ConfigError
from plugproxy.fakes import FakeKnobs, SpecClient, knobs_from_flags, start_fake_plugin
from plugproxy.fakes.deviceplugin import VISIBLE_ENV


async def _plugin(tmp_path: Path, knobs: FakeKnobs | None = None):
    handle = await start_fake_plugin("deviceplugin.v1beta1", f"unix://{tmp_path}/dp.sock", knobs)
    return handle, SpecClient(handle.target, "deviceplugin.v1beta1")


async def _updates(c: SpecClient, count: int) -> list:
    info = c.method("ListAndWatch")
    call = c.channel.unary_stream(
        info.path,
        request_serializer=lambda m: m.SerializeToString(),
        response_deserializer=info.response_class.FromString,
    )(c.new("Empty"))
    got = []
    async for update in call:
        got.append(update)
        if len(got) == count:
            call.cancel()
            break
    return got


async def test_listandwatch_streams_health_changes_at_the_period(tmp_path):
    handle, c = await _plugin(tmp_path, FakeKnobs(stream_period=0.02))
    try:
        start = time.monotonic()
        updates = await _updates(c, 6)
        took = time.monotonic() - start
        healthy = [sum(d.health == "Healthy" for d in u.devices) for u in updates]
        assert healthy == [8, 7, 6, 5, 4, 3]  # one device turns unhealthy per update
        assert 0.09 < took < 2.0
        assert all(d.topology.nodes for d in updates[0].devices)
        handle.plugin.knobs.misbehave = {"device-health-lower-case"}
        assert {d.health for d in (await _updates(c, 1))[0].devices} <= {"healthy", "unhealthy"}
    finally:
        await c.close()
        await handle.stop(0)


async def test_allocation_calls(tmp_path):
    handle, c = await _plugin(tmp_path)
    try:
        options = await c.call("GetDevicePluginOptions")
        assert options.pre_start_required and options.get_preferred_allocation_available
        ids = [f"acc-{i}" for i in range(8)]
        preferred = await c.call(
            "GetPreferredAllocation",
            container_requests=[
                {
                    "available_deviceIDs": ids[::-1],
                    "must_include_deviceIDs": ["acc-5"],
                    "allocation_size": 3,
                }
            ],
        )
        assert list(preferred.container_responses[0].deviceIDs) == ["acc-5", "acc-0", "acc-1"]
        allocated = await c.call(
            "Allocate",
            container_requests=[{"devices_ids": ["acc-1", "acc-2"]}, {"devices_ids": ["acc-3"]}],
        )
        first = allocated.container_responses[0]
        assert first.envs[VISIBLE_ENV] == "acc-1,acc-2"
        assert [d.host_path for d in first.devices] == ["/dev/acc-1", "/dev/acc-2"]
        assert first.cdi_devices[0].name.endswith("=acc-1")
        await c.call("PreStartContainer", devices_ids=["acc-1"])
        for rpc, fields in (
            ("Allocate", {"container_requests": [{"devices_ids": ["gpu-x"]}]}),
            ("PreStartContainer", {"devices_ids": ["gpu-x"]}),
        ):
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await c.call(rpc, **fields)
            assert err.value.code() is grpc.StatusCode.NOT_FOUND
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await c.call("Allocate", container_requests=[{}])
        assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        # kubelet serves Registration; the plugin does not.
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await c.call("Register", version="v1beta1")
        assert err.value.code() is grpc.StatusCode.UNIMPLEMENTED
    finally:
        await c.close()
        await handle.stop(0)


def test_stream_period_knob_is_checked():
    assert knobs_from_flags("deviceplugin.v1beta1", stream_period=0.5).stream_period == 0.5
    for bad in (-1.0, float("nan")):
        with pytest.raises(ConfigError, match="stream period"):
            FakeKnobs(stream_period=bad).checked("deviceplugin.v1beta1")
