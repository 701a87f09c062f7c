"""The serialization stage driven directly: modes, messages, metrics, key order, cleanup."""

from __future__ import annotations

import asyncio
import io
import re
import time
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from plugproxy.api import Call, LazyMessage, Reject, Runtime, StatusCode
from plugproxy.cli import serve
from plugproxy.core.log import Logger
from plugproxy.spec.registry import Registry
from plugproxy.stages import serialize
from plugproxy.stages.serialize import HELD, WAIT_SECONDS, SerializeStage

REG = Registry()
STAGE = "/csi.v1.Node/NodeStageVolume"
SNAP = "/csi.v1.Controller/CreateSnapshot"


def make_call(path: str, timeout: float | None = None, request_id: str | None = None, **fields):
    info = REG.lookup(path)
    call = Call(info, (), [], timeout)
    call.request = LazyMessage(info.request_class(**fields).SerializeToString(), info.request_class)
    if request_id is not None:
        call.stage_state["request_id"] = request_id
    return call


async def start(stage: SerializeStage, call: Call) -> None:
    """on_start as the pipeline runs it: inline, awaiting only what it returns."""
    pending = stage.on_start(call)
    if pending is not None:
        await pending


def build(*args: str) -> tuple[SerializeStage | None, CollectorRegistry]:
    settings = serve.parse_settings(
        ["--listen", "unix:///tmp/l.sock", "--upstream", "unix:///tmp/u.sock", *args], {}
    )
    metrics = CollectorRegistry()
    runtime = Runtime(registry=REG, upstream=None, logger=Logger(io.StringIO()), metrics=metrics)
    stage = serialize.build(settings.stages.serialization, runtime)
    if stage is not None:
        for info in REG.methods():
            stage.wants(info)
    return stage, metrics


def sample(metrics: CollectorRegistry, name: str, **labels: Any) -> float:
    value = metrics.get_sample_value(name, labels)
    return 0.0 if value is None else value


def test_options_defaults_and_off():
    stage, _ = build()
    assert stage is not None and stage.wait_mode and stage.timeout == 60.0
    stage, _ = build("--serialize", "abort", "--serialize-timeout", "500ms")
    assert stage is not None and not stage.wait_mode and stage.timeout == 0.5
    assert build("--serialize", "off")[0] is None
    ns = serve.parse_args(
        ["--listen", "unix:///a", "--upstream", "unix:///b"], {"PLUGPROXY_SERIALIZE": "abort"}
    )
    assert ns.serialize == "abort"
    with pytest.raises(SystemExit):
        serve.parse_args(["--serialize", "sometimes"], {})


def test_only_keyed_methods_take_part():
    stage, _ = build()
    assert stage is not None
    for path in (
        STAGE,
        SNAP,
        "/cosi.v1alpha1.Provisioner/DriverDeleteBucket",
        "/cmi.v1.Machine/DeleteMachine",
        "/csi.v0.Node/NodeUnstageVolume",
        "/csi.v1.SnapshotMetadata/GetMetadataDelta",
    ):
        assert stage.wants(REG.lookup(path)), path
    for path in (
        "/csi.v1.Identity/Probe",
        "/csi.v1.Identity/GetPluginInfo",
        "/csi.v1.Controller/ListVolumes",
        "/csi.v1.Node/NodeGetCapabilities",
        "/cmi.v1.Machine/ListMachines",
        "/unknown.Svc/Call",
    ):
        assert not stage.wants(REG.lookup(path)), path


async def test_uncontended_call_records_zero_wait_and_frees_its_key():
    stage, metrics = build()
    assert stage is not None
    call = make_call(STAGE, volume_id="v1")
    assert stage.on_start(call) is None  # a free key is taken inline: nothing to await
    assert stage.table.holder("volume:v1") is call
    assert call.stage_state[WAIT_SECONDS] == 0.0
    assert not [e for e in call.events if e.name == "serialization.wait"]
    stage.on_finish(call)
    assert len(stage.table) == 0
    assert sample(metrics, "plugproxy_serialization_wait_seconds_count", method=STAGE) == 1


async def test_call_without_key_values_is_not_serialized():
    stage, _ = build()
    assert stage is not None
    a, b = make_call(STAGE), make_call(STAGE)  # volume_id empty: nothing to lock
    await start(stage, a)
    await start(stage, b)
    assert len(stage.table) == 0


async def test_abort_mode_names_key_holder_and_request_id():
    stage, metrics = build("--serialize", "abort")
    assert stage is not None
    holder = make_call(STAGE, request_id="42", volume_id="pvc-1")
    await start(stage, holder)
    late = make_call("/csi.v1.Node/NodeUnstageVolume", volume_id="pvc-1")
    with pytest.raises(Reject) as exc:
        await start(stage, late)
    assert exc.value.code is StatusCode.ABORTED
    assert "operation pending for volume pvc-1" in exc.value.message
    assert f"{STAGE} (request id 42)" in exc.value.message
    stage.on_finish(late)  # the pipeline runs it for a rejected call too
    assert stage.table.holder("volume:pvc-1") is holder
    assert (
        sample(
            metrics,
            "plugproxy_serialization_aborted_total",
            method="/csi.v1.Node/NodeUnstageVolume",
            reason="busy",
        )
        == 1
    )
    stage.on_finish(holder)
    assert len(stage.table) == 0


async def test_partial_acquisition_releases_what_was_taken():
    stage, _ = build("--serialize", "abort")
    assert stage is not None
    busy = make_call(STAGE, volume_id="v9")
    await start(stage, busy)
    snap = make_call(SNAP, name="snap-a", source_volume_id="v9")
    with pytest.raises(Reject):
        await start(stage, snap)
    assert stage.table.holder("snapshot-name:snap-a") is None
    assert snap.stage_state[HELD] == []
    stage.on_finish(busy)
    assert len(stage.table) == 0


async def test_wait_mode_queues_then_proceeds_and_records_the_wait():
    stage, metrics = build()
    assert stage is not None
    holder = make_call(STAGE, volume_id="v1")
    await start(stage, holder)
    waiter = make_call(STAGE, volume_id="v1")
    task = asyncio.create_task(start(stage, waiter))
    await asyncio.sleep(0.05)
    assert sample(metrics, "plugproxy_serialization_queue_depth") == 1
    stage.on_finish(holder)
    await asyncio.wait_for(task, 1.0)
    assert stage.table.holder("volume:v1") is waiter
    assert waiter.stage_state[WAIT_SECONDS] >= 0.04
    [event] = [e for e in waiter.events if e.name == "serialization.wait"]
    assert event.attributes["keys"] == "volume:v1" and event.attributes["seconds"] >= 0.04
    assert sample(metrics, "plugproxy_serialization_queue_depth") == 0
    stage.on_finish(waiter)
    assert len(stage.table) == 0


async def test_wait_mode_times_out_with_aborted_naming_the_holder():
    stage, metrics = build("--serialize-timeout", "100ms")
    assert stage is not None
    holder = make_call(SNAP, request_id="7", name="s1", source_volume_id="v1")
    await start(stage, holder)
    late = make_call(STAGE, volume_id="v1")
    started = time.monotonic()
    with pytest.raises(Reject) as exc:
        await start(stage, late)
    assert 0.09 <= time.monotonic() - started < 1.0
    assert exc.value.code is StatusCode.ABORTED
    pattern = r"operation pending for volume v1: waited \d+\.\d{3}s behind "
    assert re.match(pattern, exc.value.message)
    assert f"behind {SNAP} (request id 7)" in exc.value.message
    assert (
        sample(metrics, "plugproxy_serialization_aborted_total", method=STAGE, reason="timeout")
        == 1
    )
    assert stage.table.waiting == 0
    stage.on_finish(holder)
    assert len(stage.table) == 0


async def test_wait_is_bounded_by_the_call_deadline():
    stage, _ = build()  # --serialize-timeout 60s
    assert stage is not None
    await start(stage, make_call(STAGE, volume_id="v1"))
    late = make_call(STAGE, timeout=0.3, volume_id="v1")
    started = time.monotonic()
    with pytest.raises(Reject) as exc:
        await start(stage, late)
    waited = time.monotonic() - started
    assert 0.2 <= waited < 1.0  # gives up at (just before) the deadline, not after 60 s
    assert exc.value.code is StatusCode.ABORTED


async def test_cancelled_waiter_releases_keys_taken_before_it_queued():
    stage, _ = build()
    assert stage is not None
    holder = make_call(STAGE, volume_id="v2")
    await start(stage, holder)
    snap = make_call(SNAP, name="a", source_volume_id="v2")  # takes snapshot-name:a, queues on v2
    task = asyncio.create_task(start(stage, snap))
    await asyncio.sleep(0.02)
    assert stage.table.holder("snapshot-name:a") is snap and stage.table.waiting == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert stage.table.holder("snapshot-name:a") is None and stage.table.waiting == 0
    stage.on_finish(snap)
    stage.on_finish(holder)
    assert len(stage.table) == 0


async def test_keys_are_taken_in_one_global_order():
    stage, _ = build()
    assert stage is not None
    group = "/csi.v1.GroupController/CreateVolumeGroupSnapshot"
    one = make_call(group, name="g1", source_volume_ids=["b", "a"])
    two = make_call(group, name="g2", source_volume_ids=["a", "b"])
    blocker = make_call(STAGE, volume_id="a")
    await start(stage, blocker)
    tasks = [asyncio.create_task(start(stage, c)) for c in (one, two)]
    await asyncio.sleep(0.02)
    # Both queue on "a" first; neither can hold "b" while waiting for "a".
    assert stage.table.holder("volume:b") is None
    stage.on_finish(blocker)
    await asyncio.wait_for(tasks[0], 1.0)
    stage.on_finish(one)
    await asyncio.wait_for(tasks[1], 1.0)
    stage.on_finish(two)
    assert len(stage.table) == 0


async def test_many_distinct_volumes_leave_nothing_behind():
    stage, _ = build()
    assert stage is not None
    for i in range(5_000):
        call = make_call(STAGE, volume_id=f"pvc-{i}")
        await start(stage, call)
        stage.on_finish(call)
    assert len(stage.table) == 0 and not stage.table._queues
