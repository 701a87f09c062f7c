"""Per-volume serialization end to end: a real proxy in front of a slow plugin that records
how many calls it had in flight per volume."""

from __future__ import annotations

import asyncio
import re
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import grpc
import pytest

from plugproxy.cli.serve import ProxyServer
from plugproxy.fakes import FakeKnobs, start_fake_plugin
from plugproxy.spec.registry import Registry
from plugproxy.stages.serialize import SerializeStage
from tests.support import channel, start_proxy, wait_until

REG = Registry()
NODE_STAGE = "/csi.v1.Node/NodeStageVolume"
NODE_UNSTAGE = "/csi.v1.Node/NodeUnstageVolume"
CREATE_SNAPSHOT = "/csi.v1.Controller/CreateSnapshot"
GROUP_SNAPSHOT = "/csi.v1.GroupController/CreateVolumeGroupSnapshot"
PROBE = "/csi.v1.Identity/Probe"
VOLUME_FIELDS = ("volume_id", "source_volume_id", "source_volume_ids")


class OverlapPlugin(grpc.GenericRpcHandler):
    """Answers every unary method of the registry with an empty message, after a delay for
    calls naming a volume (``x-delay`` metadata overrides it), recording the calls in flight
    per volume."""

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.inflight: Counter[str] = Counter()
        self.max_overlap: Counter[str] = Counter()
        self.max_total = 0
        self.total = 0
        self.seen: list[tuple[str, tuple[str, ...]]] = []

    def keyed(self) -> int:
        """Calls seen that name a volume (other stages may send identity calls of their own)."""
        return sum(1 for _, volumes in self.seen if volumes)

    def volumes(self, path: str, request: bytes) -> tuple[str, ...]:
        info = REG.lookup(path)
        message = info.request_class.FromString(request)
        out: list[str] = []
        for name in VOLUME_FIELDS:
            if name in message.DESCRIPTOR.fields_by_name:
                value = getattr(message, name)
                out.extend([value] if isinstance(value, str) else list(value))
        return tuple(v for v in out if v)

    def service(self, details: Any) -> grpc.RpcMethodHandler | None:
        path = details.method
        if not REG.lookup(path).known:
            return None

        async def handle(request: bytes, context: Any) -> bytes:
            volumes = self.volumes(path, request)
            metadata = dict(context.invocation_metadata() or ())
            self.seen.append((path, volumes))
            self.total += 1
            self.max_total = max(self.max_total, self.total)
            for v in volumes:
                self.inflight[v] += 1
                self.max_overlap[v] = max(self.max_overlap[v], self.inflight[v])
            try:
                # Keyless calls (the proxy's own capability queries among them) are quick.
                await asyncio.sleep(float(metadata.get("x-delay", self.delay if volumes else 0)))
                if "x-fail" in metadata:
                    await context.abort(grpc.StatusCode.INTERNAL, "plugin failed on purpose")
                return b""
            finally:
                self.total -= 1
                for v in volumes:
                    self.inflight[v] -= 1

        return grpc.unary_unary_rpc_method_handler(handle)


@dataclass
class Setup:
    plugin: OverlapPlugin
    proxy: ProxyServer
    listen: str

    @property
    def stage(self) -> SerializeStage:
        return next(s for s in self.proxy.stages if isinstance(s, SerializeStage))

    def metric(self, name: str, **labels: str) -> float:
        value = self.proxy.metrics.get_sample_value(name, labels)
        return 0.0 if value is None else value


@pytest.fixture
async def make(tmp_path) -> AsyncIterator[Any]:
    started: list[tuple[grpc.aio.Server, ProxyServer]] = []

    async def _make(*args: str, delay: float = 0.02) -> Setup:
        upstream = str(tmp_path / f"plugin{len(started)}.sock")
        listen = str(tmp_path / f"proxy{len(started)}.sock")
        plugin = OverlapPlugin(delay)
        server = grpc.aio.server()
        server.add_generic_rpc_handlers([plugin])
        server.add_insecure_port(f"unix:{upstream}")
        await server.start()
        proxy = await start_proxy(listen, upstream, *args)
        started.append((server, proxy))
        assert await proxy.upstream.wait_ready(5)
        return Setup(plugin, proxy, listen)

    yield _make
    for server, proxy in started:
        await proxy.stop(0)
        await server.stop(0)


def request(path: str, **fields: Any) -> bytes:
    info = REG.lookup(path)
    return info.request_class(**fields).SerializeToString()


async def send(
    ch: grpc.aio.Channel,
    path: str,
    payload: bytes,
    timeout: float = 10.0,
    metadata: tuple[tuple[str, str], ...] = (),
) -> grpc.StatusCode:
    try:
        await ch.unary_unary(path)(payload, timeout=timeout, metadata=metadata)
    except grpc.aio.AioRpcError as err:
        return err.code()
    return grpc.StatusCode.OK


def stage_calls(n: int, volumes: int) -> list[tuple[str, bytes]]:
    calls = []
    for i in range(n):
        path = NODE_STAGE if i % 2 == 0 else NODE_UNSTAGE
        calls.append((path, request(path, volume_id=f"vol-{i % volumes}")))
    return calls


async def test_wait_mode_keeps_one_call_per_volume_and_completes_all(make):
    s = await make()
    async with channel(s.listen) as ch:
        codes = await asyncio.gather(*(send(ch, p, b) for p, b in stage_calls(64, 4)))
    assert codes == [grpc.StatusCode.OK] * 64
    assert s.plugin.keyed() == 64
    assert dict(s.plugin.max_overlap) == {f"vol-{i}": 1 for i in range(4)}
    assert s.plugin.max_total > 1  # different volumes still run side by side
    assert s.metric("plugproxy_serialization_wait_seconds_count", method=NODE_STAGE) == 32
    assert s.metric("plugproxy_serialization_queue_depth") == 0
    assert len(s.stage.table) == 0


async def test_serialize_off_lets_calls_overlap(make):
    s = await make("--serialize", "off")
    assert not any(isinstance(st, SerializeStage) for st in s.proxy.stages)
    async with channel(s.listen) as ch:
        codes = await asyncio.gather(*(send(ch, p, b) for p, b in stage_calls(64, 4)))
    assert codes == [grpc.StatusCode.OK] * 64
    assert max(s.plugin.max_overlap.values()) > 1


async def test_abort_mode_answers_overlapping_calls_aborted(make):
    s = await make("--serialize", "abort", delay=0.2)
    async with channel(s.listen) as ch:
        results = await asyncio.gather(
            *(ch.unary_unary(p)(b, timeout=10) for p, b in stage_calls(64, 4)),
            return_exceptions=True,
        )
    errors = [r for r in results if isinstance(r, grpc.aio.AioRpcError)]
    assert 4 <= 64 - len(errors) < 64
    assert {e.code() for e in errors} == {grpc.StatusCode.ABORTED}
    assert all("operation pending for volume vol-" in (e.details() or "") for e in errors)
    assert max(s.plugin.max_overlap.values()) == 1
    assert s.plugin.keyed() == 64 - len(errors)
    busy = sum(
        s.metric("plugproxy_serialization_aborted_total", method=m, reason="busy")
        for m in (NODE_STAGE, NODE_UNSTAGE)
    )
    assert busy == len(errors)


async def test_queued_call_deadline_is_honoured(make):
    s = await make(delay=3.0)
    async with channel(s.listen) as ch:
        holder = asyncio.ensure_future(send(ch, NODE_STAGE, request(NODE_STAGE, volume_id="v")))
        await wait_until(lambda: s.plugin.keyed() == 1)
        started = time.monotonic()
        code = await send(ch, NODE_UNSTAGE, request(NODE_UNSTAGE, volume_id="v"), timeout=0.5)
        elapsed = time.monotonic() - started
        assert code in (grpc.StatusCode.ABORTED, grpc.StatusCode.DEADLINE_EXCEEDED)
        assert elapsed < 1.0  # promptly, not after the holder's 3 s
        assert s.plugin.keyed() == 1  # the queued call never reached the plugin
        assert s.stage.table.waiting == 0
        holder.cancel()


async def test_aborted_after_wait_names_the_holder_and_request_id(make):
    s = await make("--serialize-timeout", "200ms", delay=2.0)
    async with channel(s.listen) as ch:
        stage_req = request(NODE_STAGE, volume_id="v")
        holder = asyncio.ensure_future(
            ch.unary_unary(NODE_STAGE)(stage_req, timeout=10, metadata=(("csi.requestid", "77"),))
        )
        await wait_until(lambda: s.plugin.keyed() == 1)
        with pytest.raises(grpc.aio.AioRpcError) as exc:
            await ch.unary_unary(NODE_UNSTAGE)(request(NODE_UNSTAGE, volume_id="v"), timeout=10)
        assert exc.value.code() is grpc.StatusCode.ABORTED
        details = exc.value.details() or ""
        assert re.match(r"operation pending for volume v: waited \d+\.\d{3}s behind ", details)
        assert NODE_STAGE in details
        if any(stage.name == "calllog" for stage in s.proxy.stages):
            assert f"behind {NODE_STAGE} (request id 77)" in details
        holder.cancel()


async def test_cancel_while_queued_leaves_the_queue(make):
    s = await make(delay=0.6)
    async with channel(s.listen) as ch:
        payload = request(NODE_STAGE, volume_id="v")
        holder = asyncio.ensure_future(send(ch, NODE_STAGE, payload))
        await wait_until(lambda: s.plugin.keyed() == 1)
        quitter = ch.unary_unary(NODE_STAGE)(payload, timeout=10)
        await wait_until(lambda: s.stage.table.waiting == 1)
        patient = asyncio.ensure_future(send(ch, NODE_STAGE, payload))
        await wait_until(lambda: s.stage.table.waiting == 2)
        quitter.cancel()
        await wait_until(lambda: s.stage.table.waiting == 1)
        assert s.metric("plugproxy_serialization_queue_depth") == 1
        assert await holder == grpc.StatusCode.OK
        assert await asyncio.wait_for(patient, 5) == grpc.StatusCode.OK
    assert s.plugin.keyed() == 2  # the cancelled call never reached the plugin
    assert s.metric("plugproxy_serialization_queue_depth") == 0
    assert len(s.stage.table) == 0


async def test_cancelled_holder_frees_its_volume(make):
    s = await make(delay=5.0)
    async with channel(s.listen) as ch:
        payload = request(NODE_STAGE, volume_id="v")
        holder = ch.unary_unary(NODE_STAGE)(payload, timeout=10)
        await wait_until(lambda: s.plugin.keyed() == 1)
        started = time.monotonic()
        nxt = asyncio.ensure_future(send(ch, NODE_UNSTAGE, payload, metadata=(("x-delay", "0"),)))
        await wait_until(lambda: s.stage.table.waiting == 1)
        holder.cancel()  # on_finish runs for the cancelled call and releases the key
        assert await asyncio.wait_for(nxt, 3) == grpc.StatusCode.OK
        assert time.monotonic() - started < 2.0
    await wait_until(lambda: len(s.stage.table) == 0)


async def test_failed_call_frees_its_volume(make):
    s = await make(delay=0.05)
    async with channel(s.listen) as ch:
        payload = request(NODE_STAGE, volume_id="v")
        codes = await asyncio.gather(
            send(ch, NODE_STAGE, payload, metadata=(("x-fail", "1"),)),
            send(ch, NODE_STAGE, payload),
        )
    assert sorted(c.name for c in codes) == ["INTERNAL", "OK"]
    assert s.plugin.max_overlap["v"] == 1
    assert len(s.stage.table) == 0


async def test_keyless_calls_pass_a_busy_volume(make):
    s = await make(delay=2.0)
    async with channel(s.listen) as ch:
        holder = asyncio.ensure_future(send(ch, NODE_STAGE, request(NODE_STAGE, volume_id="v")))
        await wait_until(lambda: s.plugin.keyed() == 1)
        started = time.monotonic()
        assert await send(ch, PROBE, b"", metadata=(("x-delay", "0"),)) == grpc.StatusCode.OK
        assert time.monotonic() - started < 1.0
        holder.cancel()


async def test_calls_holding_two_keys_do_not_deadlock(make):
    s = await make(delay=0.01)
    calls: list[tuple[str, bytes]] = []
    for i in range(24):
        calls.append((NODE_STAGE, request(NODE_STAGE, volume_id="va")))
        calls.append(
            (CREATE_SNAPSHOT, request(CREATE_SNAPSHOT, name=f"s{i % 3}", source_volume_id="va"))
        )
        calls.append((NODE_UNSTAGE, request(NODE_UNSTAGE, volume_id="vb")))
        # The same two volumes named in opposite orders by different calls.
        ids = ["va", "vb"] if i % 2 else ["vb", "va"]
        calls.append((GROUP_SNAPSHOT, request(GROUP_SNAPSHOT, name=f"g{i}", source_volume_ids=ids)))
    async with channel(s.listen) as ch:
        codes = await asyncio.wait_for(
            asyncio.gather(*(send(ch, p, b) for p, b in calls)), timeout=20
        )
    assert codes == [grpc.StatusCode.OK] * len(calls)
    assert dict(s.plugin.max_overlap) == {"va": 1, "vb": 1}
    assert len(s.stage.table) == 0 and s.stage.table.waiting == 0


# The bundled fake plugins record the calls in flight per resource key themselves.
FAKE_CASES = [
    ("csi.v1", "/csi.v1.Node/NodeGetVolumeStats", "NodeGetVolumeStats", "volume_id"),
    (
        "cosi.v1alpha1",
        "/cosi.v1alpha1.Provisioner/DriverDeleteBucket",
        "DriverDeleteBucket",
        "bucket_id",
    ),
    ("cmi.v1", "/cmi.v1.Machine/GetMachineStatus", "GetMachineStatus", "MachineName"),
]


@pytest.mark.parametrize(("spec", "path", "rpc", "field"), FAKE_CASES)
@pytest.mark.parametrize("mode", ["wait", "off"])
async def test_bundled_fake_sees_one_call_per_resource(tmp_path, spec, path, rpc, field, mode):
    upstream, listen = str(tmp_path / "fake.sock"), str(tmp_path / "proxy.sock")
    handle = await start_fake_plugin(spec, f"unix://{upstream}", FakeKnobs(delays={rpc: 0.02}))
    proxy = await start_proxy(listen, upstream, "--serialize", mode)
    try:
        assert await proxy.upstream.wait_ready(5)
        calls = [request(path, **{field: f"res-{i % 3}"}) for i in range(24)]
        async with channel(listen) as ch:
            codes = await asyncio.gather(*(send(ch, path, b) for b in calls))
        # Unknown resources may get NOT_FOUND from the fake; the proxy itself never aborts.
        assert grpc.StatusCode.ABORTED not in codes
        overlap = handle.plugin.max_overlap_per_key()
        assert set(overlap) == {"res-0", "res-1", "res-2"}
        if mode == "wait":
            assert set(overlap.values()) == {1}
        else:
            assert max(overlap.values()) > 1
    finally:
        await proxy.stop(0)
        await handle.stop()
