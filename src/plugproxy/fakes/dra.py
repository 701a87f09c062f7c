"""Fake DRA kubelet plugin: DRAPlugin v1 and v1beta1 and DRA device health v1 and v1alpha1,
all on one socket, as a driver built on Kubernetes' kubelet plugin helper serves them.

A pool of eight devices on one node. NodePrepareResources gives each claim one free
device (the same one again for a claim already prepared; a claim with no device left gets
its entry's ``error``, the API's per-claim failure), with a CDI id per device;
NodeUnprepareResources frees a claim's device and answers every claim, known or not.
Both versions share that state: a claim prepared in v1 is unprepared in v1beta1 alike.

NodeWatchResources sends every device's health at once, then a new list every
``FakeKnobs.stream_period`` seconds with one device's health flipped in turn, until kubelet
(or the test) cancels it or :meth:`FakeDraV1.end_streams` ends it (OK) after the update
being sent; streams opened later run as before.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from plugproxy.api import MethodInfo, SpecInfo
from plugproxy.fakes.base import FakePlugin
from plugproxy.fakes.common import DynMessage, ServicerContext, invalid
from plugproxy.fakes.knobs import FakeKnobs, served_specs
from plugproxy.spec.registry import SPECS, load_spec

DRIVER_NAME = "gpu.fake.plugproxy.io"
POOL = "fake-node"
DEVICE_COUNT = 8
CDI_KIND = "fake.plugproxy.io/gpu"
HEALTH_TIMEOUT_SECONDS = 60
HEALTHY, UNHEALTHY = 1, 2  # HealthStatus numbers, the same in both health versions


class FakeDraV1(FakePlugin):
    spec_name = "dra.v1"
    default_plugin_name = DRIVER_NAME

    def __init__(self, knobs: FakeKnobs | None = None, devices: int = DEVICE_COUNT) -> None:
        super().__init__(knobs)
        # proto package -> its spec: answers are built in the version of the request.
        self._by_package: dict[str, SpecInfo] = {
            SPECS[s][1]: load_spec(s) for s in served_specs(self.spec_name)
        }
        self.devices = [f"gpu-{i}" for i in range(devices)]
        self.health = dict.fromkeys(self.devices, HEALTHY)
        self.prepared: dict[str, str] = {}  # claim uid -> its device
        self.updates_sent = 0
        self._generation = 0  # streams of an earlier generation end

    def end_streams(self) -> None:
        """End every open NodeWatchResources stream, OK, after the update it is sending."""
        self._generation += 1

    def resource_key(self, method: MethodInfo, request: Any) -> str | None:
        claims = getattr(request, "claims", None)
        return str(claims[0].uid) if claims else None

    def _reply(self, request: DynMessage, short_name: str, **fields: Any) -> DynMessage:
        package = request.DESCRIPTOR.file.package
        return self._by_package[package].message_class(f"{package}.{short_name}")(**fields)

    @staticmethod
    def _check_claims(request: DynMessage) -> None:
        for i, claim in enumerate(request.claims):
            if not claim.uid:
                raise invalid(f"claims[{i}].uid is empty")

    async def NodePrepareResources(
        self, request: DynMessage, context: ServicerContext
    ) -> DynMessage:
        self._check_claims(request)
        response = self._reply(request, "NodePrepareResourcesResponse")
        for claim in request.claims:
            entry = response.claims[claim.uid]
            device = self.prepared.get(claim.uid)
            if device is None:
                taken = set(self.prepared.values())
                device = next((d for d in self.devices if d not in taken), None)
                if device is None:
                    entry.error = f"no free device in pool {POOL} for this claim"
                    continue
                self.prepared[claim.uid] = device
            entry.devices.add(
                pool_name=POOL, device_name=device, cdi_device_ids=[f"{CDI_KIND}={device}"]
            )
        return response

    async def NodeUnprepareResources(
        self, request: DynMessage, context: ServicerContext
    ) -> DynMessage:
        self._check_claims(request)
        response = self._reply(request, "NodeUnprepareResourcesResponse")
        for claim in request.claims:
            self.prepared.pop(claim.uid, None)
            response.claims[claim.uid].SetInParent()  # an entry even when nothing was prepared
        return response

    def _health_update(self, request: DynMessage) -> DynMessage:
        response = self._reply(request, "NodeWatchResourcesResponse")
        now = int(time.time())
        for device, health in self.health.items():
            response.devices.add(
                device={"pool_name": POOL, "device_name": device},
                health=health,
                last_updated_time=now,
                health_check_timeout_seconds=HEALTH_TIMEOUT_SECONDS,
                message="" if health == HEALTHY else "the fake flipped it",
            )
        return response

    def _flip(self, step: int) -> None:
        device = self.devices[step % len(self.devices)]
        self.health[device] = UNHEALTHY if self.health[device] == HEALTHY else HEALTHY

    async def NodeWatchResources(
        self, request: DynMessage, context: ServicerContext
    ) -> AsyncIterator[DynMessage]:
        step, generation = 0, self._generation
        while generation == self._generation:
            self.updates_sent += 1
            yield self._health_update(request)
            await asyncio.sleep(self.knobs.stream_period)
            self._flip(step)
            step += 1
