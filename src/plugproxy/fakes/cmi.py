"""Fake CMI v1 plugin: Identity and Machine service with in-memory virtual machines.

``ProviderSpec`` is a JSON object (CMI §ProviderSpec): ``vmPool`` and ``size`` strings and a
``tags`` object are required, ``rootFsSize`` (GB, 1-4096) is optional. ``size`` is one of
``SIZES``; an unknown size or root size makes CreateMachine answer OUT_OF_RANGE (CMI
§CreateMachine errors). The cluster a machine belongs to is the ``kubernetes.io/cluster``
tag; Delete, GetMachineStatus, ShutDown and ListMachines only see machines of that cluster.
``PVSpecList`` is a JSON list of PersistentVolume specs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import plugproxy
from plugproxy.fakes.base import FakePlugin
from plugproxy.fakes.common import (
    DynMessage,
    ServicerContext,
    add_capabilities,
    already_exists,
    invalid,
    not_found,
    out_of_range,
)
from plugproxy.fakes.knobs import FakeKnobs

SIZES = ("xsmall", "small", "medium", "large", "xlarge")
CLUSTER_TAG = "kubernetes.io/cluster"
CAPABILITIES = (
    "CREATE_MACHINE",
    "DELETE_MACHINE",
    "GET_MACHINE_STATUS",
    "LIST_MACHINES",
    "SHUTDOWN_MACHINE",
    "GET_VOLUME_IDS",
)
# where PersistentVolume sources keep their volume id
VOLUME_ID_FIELDS = (
    ("csi", "volumeHandle"),
    ("awsElasticBlockStore", "volumeID"),
    ("gcePersistentDisk", "pdName"),
    ("azureDisk", "diskURI"),
    ("cinder", "volumeID"),
)


@dataclass
class Machine:
    name: str
    provider_spec: bytes
    cluster: str
    provider_id: str
    running: bool = True


def parse_provider_spec(raw: bytes, *, check_ranges: bool) -> dict[str, Any]:
    if not raw:
        raise invalid("ProviderSpec is required")
    try:
        spec = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise invalid("ProviderSpec is not valid JSON") from None
    if not isinstance(spec, dict):
        raise invalid("ProviderSpec must be a JSON object")
    for key in ("vmPool", "size"):
        if not isinstance(spec.get(key), str) or not spec[key]:
            raise invalid(f"ProviderSpec.{key} is required (a non-empty string)")
    tags = spec.get("tags")
    if not isinstance(tags, dict) or not all(isinstance(v, str) for v in tags.values()):
        raise invalid("ProviderSpec.tags is required (an object of strings)")
    if check_ranges:
        if spec["size"] not in SIZES:
            raise out_of_range(f"size {spec['size']!r} is not one of {', '.join(SIZES)}")
        root = spec.get("rootFsSize")
        if root is not None and (not isinstance(root, int) or not 1 <= root <= 4096):
            raise out_of_range(f"rootFsSize {root!r} is outside 1-4096 GB")
    return spec


def _cluster(spec: dict[str, Any]) -> str:
    return str(spec["tags"].get(CLUSTER_TAG, "default"))


class FakeCmiV1(FakePlugin):
    spec_name = "cmi.v1"
    default_plugin_name = "cmi.fake.plugproxy.io"
    key_fields = ("MachineName", "ProviderID")

    def __init__(self, knobs: FakeKnobs | None = None) -> None:
        super().__init__(knobs)
        self.machines: dict[str, Machine] = {}
        self._seq = 0

    def _mine(self, name: str, raw_spec: bytes) -> tuple[Machine | None, str]:
        """The named machine if it belongs to the cluster of ``raw_spec``, and that cluster."""
        if not name:
            raise invalid("MachineName is required")
        cluster = _cluster(parse_provider_spec(raw_spec, check_ranges=False))
        machine = self.machines.get(name)
        if machine is not None and machine.cluster != cluster:
            machine = None
        return machine, cluster

    @staticmethod
    def _state(machine: Machine, state: str) -> bytes:
        return json.dumps({"state": state, "providerID": machine.provider_id}).encode()

    # -- Identity -------------------------------------------------------------------------

    async def GetPluginInfo(self, request: DynMessage, context: ServicerContext) -> DynMessage:
        return self.new(
            "GetPluginInfoResponse",
            name=self.plugin_name,
            version=plugproxy.__version__,
            manifest={"implementation": "plugproxy fake plugin"},
        )

    async def GetPluginCapabilities(
        self, request: DynMessage, context: ServicerContext
    ) -> DynMessage:
        resp = self.new("GetPluginCapabilitiesResponse")
        add_capabilities(resp, "rpc", CAPABILITIES)
        return resp

    async def Probe(self, request: DynMessage, context: ServicerContext) -> DynMessage:
        resp = self.new("ProbeResponse")
        resp.ready.value = True
        return resp

    # -- Machine --------------------------------------------------------------------------

    async def CreateMachine(self, request: DynMessage, context: ServicerContext) -> DynMessage:
        if not request.MachineName:
            raise invalid("MachineName is required")
        spec = parse_provider_spec(request.ProviderSpec, check_ranges=True)
        machine = self.machines.get(request.MachineName)
        if machine is not None:
            if json.loads(machine.provider_spec) != spec:
                raise already_exists(
                    f"machine {request.MachineName!r} exists with another ProviderSpec"
                )
        else:
            self._seq += 1
            cluster = _cluster(spec)
            machine = Machine(
                request.MachineName,
                bytes(request.ProviderSpec),
                cluster,
                f"fake://{cluster}/vm-{self._seq:06d}",
            )
            self.machines[machine.name] = machine
        return self.new(
            "CreateMachineResponse",
            ProviderID=machine.provider_id,
            NodeName=machine.name,
            LastKnownState=self._state(machine, "Running" if machine.running else "Stopped"),
        )

    async def DeleteMachine(self, request: DynMessage, context: ServicerContext) -> DynMessage:
        machine, _ = self._mine(request.MachineName, request.ProviderSpec)
        if machine is None:
            return self.new("DeleteMachineResponse")
        del self.machines[machine.name]
        return self.new("DeleteMachineResponse", LastKnownState=self._state(machine, "Deleted"))

    async def GetMachineStatus(self, request: DynMessage, context: ServicerContext) -> DynMessage:
        machine, _ = self._mine(request.MachineName, request.ProviderSpec)
        if machine is None:
            raise not_found(f"machine {request.MachineName!r} is not found at the provider")
        return self.new(
            "GetMachineStatusResponse", ProviderID=machine.provider_id, NodeName=machine.name
        )

    async def ShutDownMachine(self, request: DynMessage, context: ServicerContext) -> DynMessage:
        machine, _ = self._mine(request.MachineName, request.ProviderSpec)
        if machine is None:
            return self.new("ShutDownMachineResponse")  # nothing runs: already terminated
        machine.running = False
        return self.new("ShutDownMachineResponse", LastKnownState=self._state(machine, "Stopped"))

    async def ListMachines(self, request: DynMessage, context: ServicerContext) -> DynMessage:
        cluster = _cluster(parse_provider_spec(request.ProviderSpec, check_ranges=False))
        return self.new(
            "ListMachinesResponse",
            MachineList={
                m.provider_id: m.name for m in self.machines.values() if m.cluster == cluster
            },
        )

    async def GetVolumeIDs(self, request: DynMessage, context: ServicerContext) -> DynMessage:
        if not request.PVSpecList:
            raise invalid("PVSpecList is required")
        try:
            specs = json.loads(request.PVSpecList)
        except (ValueError, UnicodeDecodeError):
            raise invalid("PVSpecList is not valid JSON") from None
        if not isinstance(specs, list) or not all(isinstance(s, dict) for s in specs):
            raise invalid("PVSpecList must be a JSON list of PersistentVolume specs")
        ids = []
        for pv in specs:
            spec = pv.get("spec", pv)
            for source, key in VOLUME_ID_FIELDS:
                value = (
                    spec.get(source, {}).get(key) if isinstance(spec.get(source), dict) else None
                )
                if isinstance(value, str) and value:
                    ids.append(value)
                    break
        return self.new("GetVolumeIDsResponse", VolumeIDs=ids)
