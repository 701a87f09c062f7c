"""The fake DRA plugin: DRAPlugin v1 and v1beta1 sharing one set of claims, and the device
health stream in both versions on the same socket."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest

from plugproxy.core.endpoints import ConfigError
from plugproxy.fakes import FakeKnobs, SpecClient, knobs_from_flags, start_fake_plugin
from plugproxy.fakes import cli as fake_cli
from plugproxy.fakes.dra import POOL, FakeDraV1


def _claim(i: int) -> dict[str, str]:
    return {"namespace": "default", "uid": f"uid-{i}", "name": f"claim-{i}"}


async def _updates(
    c: SpecClient, count: int | None, opened: asyncio.Event | None = None
) -> tuple[list, grpc.StatusCode]:
    """``count`` updates (then cancelled), or all until the plugin ends the stream;
    ``opened`` is set once the first has arrived."""
    info = c.method("NodeWatchResources")
    call = c.channel.unary_stream(
        info.path,
        request_serializer=lambda m: m.SerializeToString(),
        response_deserializer=info.response_class.FromString,
    )(c.new("NodeWatchResourcesRequest"))
    got = []
    async for update in call:
        got.append(update)
        if opened is not None:
            opened.set()
        if len(got) == count:
            call.cancel()
            return got, grpc.StatusCode.CANCELLED
    return got, await call.code()


async def test_both_versions_prepare_from_one_pool(tmp_path: Path):
    handle = await start_fake_plugin("dra.v1", f"unix://{tmp_path}/dra.sock")
    v1, beta = SpecClient(handle.target, "dra.v1"), SpecClient(handle.target, "dra.v1beta1")
    try:
        first = await v1.call("NodePrepareResources", claims=[_claim(0), _claim(1)])
        devices = {uid: [d.device_name for d in e.devices] for uid, e in first.claims.items()}
        assert devices == {"uid-0": ["gpu-0"], "uid-1": ["gpu-1"]}
        entry = first.claims["uid-0"].devices[0]
        assert entry.pool_name == POOL and list(entry.cdi_device_ids) == [
            "fake.plugproxy.io/gpu=gpu-0"
        ]
        assert not entry.HasField("share_id")  # v1's optional field, left unset
        # The same claim again, in the other version: the same device (idempotent).
        again = await beta.call("NodePrepareResources", claims=[_claim(1), _claim(2)])
        assert [d.device_name for d in again.claims["uid-1"].devices] == ["gpu-1"]
        assert [d.device_name for d in again.claims["uid-2"].devices] == ["gpu-2"]
        # Unprepare answers every claim, prepared or not, and frees the device.
        gone = await beta.call("NodeUnprepareResources", claims=[_claim(0), _claim(9)])
        assert set(gone.claims) == {"uid-0", "uid-9"} and not gone.claims["uid-9"].error
        reused = await v1.call("NodePrepareResources", claims=[_claim(3)])
        assert [d.device_name for d in reused.claims["uid-3"].devices] == ["gpu-0"]
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await v1.call("NodePrepareResources", claims=[{**_claim(4), "uid": ""}])
        assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert "claims[0].uid" in (err.value.details() or "")
    finally:
        await v1.close()
        await beta.close()
        await handle.stop(0)


async def test_a_claim_with_no_device_left_fails_in_its_entry(tmp_path: Path):
    handle = await start_fake_plugin("dra.v1", f"unix://{tmp_path}/dra.sock")
    try:
        async with SpecClient(handle.target, "dra.v1") as c:
            answer = await c.call("NodePrepareResources", claims=[_claim(i) for i in range(9)])
        assert all(answer.claims[f"uid-{i}"].devices for i in range(8))
        last = answer.claims["uid-8"]
        assert not last.devices and "no free device" in last.error
    finally:
        await handle.stop(0)


@pytest.mark.parametrize("spec", ["drahealth.v1", "drahealth.v1alpha1"])
async def test_health_streams_every_device_and_flips_one_per_update(spec, tmp_path: Path):
    handle = await start_fake_plugin(
        "dra.v1", f"unix://{tmp_path}/dra.sock", FakeKnobs(stream_period=0.001)
    )
    plugin = handle.plugin
    assert isinstance(plugin, FakeDraV1)
    try:
        async with SpecClient(handle.target, spec) as c:
            updates, code = await _updates(c, 5)
            assert code is grpc.StatusCode.CANCELLED
            healthy = [sum(d.health == 1 for d in u.devices) for u in updates]
            assert healthy == [8, 7, 6, 5, 4]
            first = updates[0].devices[0]
            assert (first.device.pool_name, first.device.device_name) == (POOL, "gpu-0")
            assert (
                first.last_updated_time > 1_600_000_000 and first.health_check_timeout_seconds > 0
            )
            # end_streams ends an open stream (OK) after what it sends; a later one runs.
            opened = asyncio.Event()
            reader = asyncio.ensure_future(_updates(c, None, opened))
            await opened.wait()
            plugin.end_streams()
            got, code = await reader
            assert code is grpc.StatusCode.OK and got
            later, code = await _updates(c, 2)
            assert len(later) == 2 and code is grpc.StatusCode.CANCELLED
            plugin.knobs.misbehave = {"drahealth-value-unknown", "drahealth-device-twice"}
            (bent,), _ = await _updates(c, 1)
            assert bent.devices[0].health == 3 and len(bent.devices) == 9
    finally:
        await handle.stop(0)


def test_knobs_name_the_methods_of_every_served_spec():
    knobs = knobs_from_flags(
        "dra.v1",
        delays=["/v1alpha1.DRAResourceHealth/NodeWatchResources=0.5"],
        failures=["DRAPlugin/NodeUnprepareResources=UNAVAILABLE:1"],
        misbehave=["drahealth-time-milliseconds"],
        stream_period=0.1,
    )
    assert knobs.delays == {"NodeWatchResources": 0.5}
    assert list(knobs.failures) == ["NodeUnprepareResources"]
    with pytest.raises(ConfigError, match=r"ListAndWatch' is not a method of dra\.v1"):
        knobs_from_flags("dra.v1", delays=["ListAndWatch=1"])
    with pytest.raises(ConfigError, match=r"does not apply to deviceplugin\.v1beta1"):
        FakeKnobs(misbehave={"drahealth-device-twice"}).checked("deviceplugin.v1beta1")


@pytest.mark.parametrize(
    "name", ["dra", "dra.v1", "dra.v1beta1", "dra-health", "drahealth.v1alpha1"]
)
def test_the_cli_serves_the_dra_fake_for_every_spec_it_serves(name, capsys):
    assert fake_cli.main(["--spec", name, "--list-misbehaviours"]) == 0
    out = capsys.readouterr().out
    assert "drahealth-value-unknown  [dra.v1]" in out and "dra-claim-left-out" in out
    assert "device-health-lower-case" not in out
