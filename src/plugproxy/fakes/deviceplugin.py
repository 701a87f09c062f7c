"""Fake device plugin (v1beta1): a handful of devices whose health changes over time.

ListAndWatch sends the whole device list at once, then a new list every
``FakeKnobs.stream_period`` seconds with one device's health flipped in turn, until kubelet
(or the test) cancels the stream. Allocate answers each container with device nodes, an
environment variable naming its devices, a CDI device per device and an annotation;
GetPreferredAllocation prefers the must-include devices, then the lowest-numbered
available ones; PreStartContainer checks the devices exist.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import ClassVar

from plugproxy.fakes.base import FakePlugin
from plugproxy.fakes.common import DynMessage, ServicerContext, invalid, not_found
from plugproxy.fakes.knobs import FakeKnobs

RESOURCE_NAME = "fake.plugproxy.io/accelerator"
DEVICE_COUNT = 8
HEALTHY, UNHEALTHY = "Healthy", "Unhealthy"
VISIBLE_ENV = "FAKE_VISIBLE_DEVICES"
CDI_KIND = "fake.plugproxy.io/accelerator"


class FakeDevicePluginV1Beta1(FakePlugin):
    spec_name = "deviceplugin.v1beta1"
    default_plugin_name = RESOURCE_NAME
    # kubelet serves Registration; a device plugin only calls it.
    served_by_kubelet: ClassVar[frozenset[str]] = frozenset({"/v1beta1.Registration/Register"})

    def __init__(self, knobs: FakeKnobs | None = None, devices: int = DEVICE_COUNT) -> None:
        super().__init__(knobs)
        self.health = {f"acc-{i}": HEALTHY for i in range(devices)}
        self.updates_sent = 0
        self.allocated: dict[str, int] = {}  # device id -> times allocated

    def _listing(self) -> DynMessage:
        response = self.new("ListAndWatchResponse")
        for i, (device_id, health) in enumerate(self.health.items()):
            response.devices.add(ID=device_id, health=health).topology.nodes.add(ID=i % 2)
        return response

    def _flip(self, step: int) -> None:
        device_id = list(self.health)[step % len(self.health)]
        self.health[device_id] = UNHEALTHY if self.health[device_id] == HEALTHY else HEALTHY

    def _known(self, device_ids: list[str]) -> None:
        unknown = [d for d in device_ids if d not in self.health]
        if unknown:
            raise not_found(f"{len(unknown)} device id(s) this plugin does not have")

    async def GetDevicePluginOptions(
        self, request: DynMessage, context: ServicerContext
    ) -> DynMessage:
        return self.new(
            "DevicePluginOptions", pre_start_required=True, get_preferred_allocation_available=True
        )

    async def ListAndWatch(
        self, request: DynMessage, context: ServicerContext
    ) -> AsyncIterator[DynMessage]:
        step = 0
        while True:
            self.updates_sent += 1
            yield self._listing()
            await asyncio.sleep(self.knobs.stream_period)
            self._flip(step)
            step += 1

    async def GetPreferredAllocation(
        self, request: DynMessage, context: ServicerContext
    ) -> DynMessage:
        response = self.new("PreferredAllocationResponse")
        for want in request.container_requests:
            available = list(want.available_deviceIDs)
            must = [d for d in want.must_include_deviceIDs if d in available]
            rest = sorted((d for d in available if d not in must), key=_device_order)
            chosen = (must + rest)[: max(want.allocation_size, len(must))]
            response.container_responses.add(deviceIDs=chosen)
        return response

    async def Allocate(self, request: DynMessage, context: ServicerContext) -> DynMessage:
        response = self.new("AllocateResponse")
        for want in request.container_requests:
            ids = list(want.devices_ids)
            if not ids:
                raise invalid("a container request names no devices")
            self._known(ids)
            answer = response.container_responses.add()
            answer.envs[VISIBLE_ENV] = ",".join(ids)
            answer.annotations["fake.plugproxy.io/devices"] = ",".join(ids)
            for device_id in ids:
                self.allocated[device_id] = self.allocated.get(device_id, 0) + 1
                answer.devices.add(
                    container_path=f"/dev/{device_id}",
                    host_path=f"/dev/{device_id}",
                    permissions="rw",
                )
                answer.cdi_devices.add(name=f"{CDI_KIND}={device_id}")
        return response

    async def PreStartContainer(self, request: DynMessage, context: ServicerContext) -> DynMessage:
        self._known(list(request.devices_ids))
        return self.new("PreStartContainerResponse")


def _device_order(device_id: str) -> tuple[int, str]:
    number = device_id.rpartition("-")[2]
    return (int(number), device_id) if number.isdigit() else (1 << 30, device_id)
