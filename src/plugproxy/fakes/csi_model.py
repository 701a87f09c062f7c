"""In-memory storage system behind the CSI fakes (plain Python, no protobuf).

csi.v1 and csi.v0 front ends translate messages to these calls. Error codes follow the
error tables of CSI v1.12 (and v0.3, which agrees on every case the v0 fake serves).

What the fake storage is:

- one pool of ``POOL_CAPACITY`` bytes; volumes from 1 byte to ``MAX_VOLUME_SIZE``,
  ``DEFAULT_VOLUME_SIZE`` when no capacity range is given; sizes are exact (no rounding);
- three nodes (``KNOWN_NODES``); this plugin's node service is ``NODE_ID``, in zone-a;
  topology key ``TOPOLOGY_KEY`` with zones ``ZONES``;
- mount access with fs_type "", "ext4" or "xfs", and block access; a volume may later be
  used with any capability it was created with, or a weaker access mode of the same type;
- mutable parameters ``iops``, ``throughput`` and ``tier`` (see ``MUTABLE_PARAMETERS``);
- snapshots are independent of their volume; metadata of a snapshot is a deterministic
  pattern of allocated 1 MiB blocks.
"""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import grpc

from plugproxy.fakes.common import (
    FakeError,
    aborted,
    already_exists,
    exhausted,
    invalid,
    not_found,
    out_of_range,
    precondition,
    require,
)

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB
TiB = 1024 * GiB

DEFAULT_VOLUME_SIZE = GiB
MAX_VOLUME_SIZE = 16 * TiB
POOL_CAPACITY = 1024 * TiB
MAX_VOLUMES_PER_NODE = 16
NODE_ID = "node-1"
KNOWN_NODES = ("node-1", "node-2", "node-3")
TOPOLOGY_KEY = "topology.fake.plugproxy.io/zone"
ZONES = ("zone-a", "zone-b", "zone-c")
NODE_TOPOLOGY = {TOPOLOGY_KEY: "zone-a"}
FS_TYPES = ("", "ext4", "xfs")
BLOCK_SIZE = MiB
DEFAULT_METADATA_BATCH = 64
MAX_STRING = 128  # CSI v1.12 §Size Limits
VOLUME_CONTEXT = {"fake.plugproxy.io/pool": "default"}
CBT_PARAMETER = "fake.plugproxy.io/changed-block-tracking"
CO_CONTEXT_PREFIX = "csi.storage.k8s.io/"  # volume_context keys Kubernetes adds itself

# access mode -> (usable from several nodes, writers: 0 none, 1 one, 2 many)
MODES: dict[str, tuple[bool, int]] = {
    "SINGLE_NODE_READER_ONLY": (False, 0),
    "SINGLE_NODE_WRITER": (False, 1),
    "SINGLE_NODE_SINGLE_WRITER": (False, 1),
    "SINGLE_NODE_MULTI_WRITER": (False, 2),
    "MULTI_NODE_READER_ONLY": (True, 0),
    "MULTI_NODE_SINGLE_WRITER": (True, 1),
    "MULTI_NODE_MULTI_WRITER": (True, 2),
}


def _int_between(low: int, high: int) -> Callable[[str], bool]:
    return lambda v: v.isdigit() and low <= int(v) <= high


MUTABLE_PARAMETERS: dict[str, Callable[[str], bool]] = {
    "iops": _int_between(100, 256_000),
    "throughput": _int_between(1, 10_000),  # MiB/s
    "tier": lambda v: v in ("standard", "premium"),
}

T = TypeVar("T")


@dataclass(frozen=True)
class Capability:
    access_type: str  # "block" or "mount"
    mode: str  # an AccessMode.Mode enum name
    fs_type: str = ""
    mount_flags: tuple[str, ...] = ()
    mount_group: str = ""

    @property
    def multi_node(self) -> bool:
        return MODES[self.mode][0]

    def covered_by(self, other: Capability) -> bool:
        """Whether a volume created with ``other`` can be used as ``self``."""
        if self.access_type != other.access_type:
            return False
        if self.fs_type not in FS_TYPES:
            return False
        if self.fs_type and other.fs_type and self.fs_type != other.fs_type:
            return False
        mine, theirs = MODES[self.mode], MODES[other.mode]
        return theirs[0] >= mine[0] and theirs[1] >= mine[1]


@dataclass
class Volume:
    id: str
    name: str
    seq: int
    capacity: int
    caps: tuple[Capability, ...]
    parameters: dict[str, str]
    mutable: dict[str, str]
    created_mutable: dict[str, str]
    source: tuple[str, str] | None  # ("snapshot" | "volume", id)
    topology: list[dict[str, str]]
    context: dict[str, str]
    published: dict[str, tuple[Capability, bool]] = field(default_factory=dict)

    def supports(self, cap: Capability) -> bool:
        return any(cap.covered_by(c) for c in self.caps)

    @property
    def mount(self) -> bool:
        return any(c.access_type == "mount" for c in self.caps)


@dataclass
class Snapshot:
    id: str
    name: str
    seq: int
    source_volume_id: str
    size: int
    created_ns: int
    parameters: dict[str, str]
    group_id: str = ""
    tracking: bool = True  # changed block tracking on the source volume


@dataclass
class Group:
    id: str
    name: str
    seq: int
    source_volume_ids: tuple[str, ...]
    snapshot_ids: tuple[str, ...]
    parameters: dict[str, str]
    created_ns: int


@dataclass(frozen=True)
class NodePublication:
    target: str
    cap: Capability
    readonly: bool
    staging_path: str
    contexts: tuple[tuple[tuple[str, str], ...], ...]  # publish and volume context


@dataclass(frozen=True)
class TopologyRequirement:
    requisite: tuple[dict[str, str], ...]
    preferred: tuple[dict[str, str], ...]


def check_name(name: str, what: str) -> None:
    """REQUIRED, at most 128 bytes, none of the banned control characters."""
    require(name, what)
    if len(name.encode()) > MAX_STRING:
        raise invalid(f"{what} is longer than {MAX_STRING} bytes")
    for ch in name:
        o = ord(ch)
        if o <= 0x08 or o in (0x0B, 0x0C) or 0x0E <= o <= 0x1F or 0x7F <= o <= 0x9F:
            raise invalid(f"{what} contains the banned control character U+{o:04X}")


def check_absolute(path: str, what: str) -> str:
    require(path, what)
    if not os.path.isabs(path):
        raise invalid(f"{what} {path!r} is not an absolute path")
    return os.path.normpath(path)


def check_mutable(params: Mapping[str, str]) -> None:
    for key, value in params.items():
        check = MUTABLE_PARAMETERS.get(key)
        if check is None:
            known = ", ".join(MUTABLE_PARAMETERS)
            raise invalid(f"mutable parameter {key!r} is not supported; supported: {known}")
        if not check(value):
            raise invalid(f"mutable parameter {key}={value!r} has an unsupported value")


def check_capacity_range(required: int, limit: int) -> None:
    if required < 0 or limit < 0:
        raise invalid("capacity_range values must not be negative")
    if limit and required > limit:
        raise invalid(f"capacity_range required_bytes {required} exceeds limit_bytes {limit}")


def _known_topology(t: Mapping[str, str]) -> bool:
    return set(t) == {TOPOLOGY_KEY} and t[TOPOLOGY_KEY] in ZONES


def _mix(a: int, b: int) -> int:
    """Deterministic pseudo-random 32-bit value of two integers."""
    x = ((a + 1) * 0x9E3779B1 ^ (b + 1) * 0x85EBCA77) & 0xFFFFFFFF
    x ^= x >> 15
    x = (x * 0x2C1B3C6D) & 0xFFFFFFFF
    return x ^ (x >> 12)


class CsiBackend:
    """All controller, node and group-controller state of one fake CSI plugin."""

    def __init__(
        self, *, multi_writer_modes: bool = True, id_bytes: int = 0, token_bytes: int = 0
    ) -> None:
        self.multi_writer_modes = multi_writer_modes  # SINGLE_NODE_MULTI_WRITER semantics
        self.id_bytes = id_bytes  # pad minted ids to this length (0: no padding)
        self.token_bytes = token_bytes  # pad page tokens to this length (0: no padding)
        self.volumes: dict[str, Volume] = {}
        self.volume_names: dict[str, str] = {}
        self.snapshots: dict[str, Snapshot] = {}
        self.snapshot_names: dict[str, str] = {}
        self.groups: dict[str, Group] = {}
        self.group_names: dict[str, str] = {}
        self.staged: dict[str, tuple[str, Capability]] = {}  # volume id -> (path, cap)
        self.node_published: dict[tuple[str, str], NodePublication] = {}
        self._seq = 0

    def _next(self, prefix: str) -> tuple[str, int]:
        self._seq += 1
        pad = max(self.id_bytes - len(prefix) - 7, 0)
        return f"{prefix}-{'x' * pad}{self._seq:06d}", self._seq

    # -- lookups ----------------------------------------------------------------------

    def volume(self, volume_id: str) -> Volume:
        vol = self.volumes.get(volume_id)
        if vol is None:
            raise not_found(f"volume {volume_id!r} does not exist")
        return vol

    def snapshot(self, snapshot_id: str) -> Snapshot:
        snap = self.snapshots.get(snapshot_id)
        if snap is None:
            raise not_found(f"snapshot {snapshot_id!r} does not exist")
        return snap

    def used_capacity(self) -> int:
        return sum(v.capacity for v in self.volumes.values())

    def node_publications(self, volume_id: str) -> list[NodePublication]:
        return [p for (vid, _), p in self.node_published.items() if vid == volume_id]

    def check_context(self, vol: Volume, given: Mapping[str, str]) -> None:
        # Kubernetes adds its own keys (pod info, service account tokens) on NodePublish;
        # plugins take them as extra information, not as a different volume context.
        mine = {k: v for k, v in given.items() if not k.startswith(CO_CONTEXT_PREFIX)}
        if mine and mine != vol.context:
            raise invalid(f"volume_context does not match the one of volume {vol.id}")

    # -- controller: volumes ------------------------------------------------------------

    def create_volume(
        self,
        name: str,
        caps: Sequence[Capability],
        capacity_range: tuple[int, int] | None,
        parameters: Mapping[str, str],
        mutable: Mapping[str, str],
        source: tuple[str, str] | None,
        topology: TopologyRequirement | None,
    ) -> Volume:
        check_name(name, "name")
        require(caps, "volume_capabilities")
        for cap in caps:
            if cap.fs_type not in FS_TYPES:
                known = ", ".join(repr(f) for f in FS_TYPES)
                raise invalid(f"fs_type {cap.fs_type!r} is not supported; supported: {known}")
        required, limit = capacity_range or (0, 0)
        check_capacity_range(required, limit)
        check_mutable(mutable)
        if topology is not None:
            self._check_topology_requirement(topology)

        existing = self.volume_names.get(name)
        if existing is not None:
            vol = self.volumes[existing]
            self._check_compatible(
                vol, caps, required, limit, parameters, mutable, source, topology
            )
            return vol

        minimum = 0
        if source is not None:
            kind, source_id = source
            if kind == "snapshot":
                minimum = self.snapshot(source_id).size
            else:
                minimum = self.volume(source_id).capacity
        capacity = self._choose_capacity(required, limit, minimum)
        zone = self._choose_topology(topology)
        if self.used_capacity() + capacity > POOL_CAPACITY:
            raise exhausted("the storage pool has not enough free capacity")
        vol_id, seq = self._next("vol")
        vol = Volume(
            id=vol_id,
            name=name,
            seq=seq,
            capacity=capacity,
            caps=tuple(caps),
            parameters=dict(parameters),
            mutable=dict(mutable),
            created_mutable=dict(mutable),
            source=source,
            topology=[zone],
            context=dict(VOLUME_CONTEXT),
        )
        self.volumes[vol_id] = vol
        self.volume_names[name] = vol_id
        return vol

    @staticmethod
    def _check_topology_requirement(req: TopologyRequirement) -> None:
        if not req.requisite and not req.preferred:
            raise invalid("accessibility_requirements needs requisite or preferred topologies")
        for t in (*req.requisite, *req.preferred):
            if not t:
                raise invalid("accessibility_requirements contains an empty topology")
        if req.requisite:
            for t in req.preferred:
                if t not in req.requisite:
                    raise invalid("a preferred topology is missing from the requisite list")

    @staticmethod
    def _choose_topology(req: TopologyRequirement | None) -> dict[str, str]:
        if req is None:
            return dict(NODE_TOPOLOGY)
        for t in (*req.preferred, *req.requisite):
            if _known_topology(t):
                return dict(t)
        if req.requisite:
            raise exhausted(
                "no requisite topology can host the volume; this plugin serves "
                f"{TOPOLOGY_KEY} in {', '.join(ZONES)}"
            )
        return dict(NODE_TOPOLOGY)

    @staticmethod
    def _choose_capacity(required: int, limit: int, minimum: int) -> int:
        if required:
            capacity = max(required, minimum)
        elif limit:
            capacity = max(min(DEFAULT_VOLUME_SIZE, limit), minimum)
        else:
            capacity = max(DEFAULT_VOLUME_SIZE, minimum)
        if limit and capacity > limit:
            raise out_of_range(f"the source holds {minimum} bytes, more than limit_bytes {limit}")
        if capacity > MAX_VOLUME_SIZE:
            raise out_of_range(f"volumes are at most {MAX_VOLUME_SIZE} bytes")
        return capacity

    def _check_compatible(
        self,
        vol: Volume,
        caps: Sequence[Capability],
        required: int,
        limit: int,
        parameters: Mapping[str, str],
        mutable: Mapping[str, str],
        source: tuple[str, str] | None,
        topology: TopologyRequirement | None,
    ) -> None:
        problems = []
        if vol.capacity < required or (limit and vol.capacity > limit):
            problems.append(f"its capacity {vol.capacity} is outside the requested range")
        if not all(vol.supports(c) for c in caps):
            problems.append("it was created with other volume capabilities")
        if dict(parameters) != vol.parameters:
            problems.append("its parameters differ")
        if dict(mutable) != vol.created_mutable:
            problems.append("its mutable parameters differ")
        if source != vol.source:
            problems.append("its content source differs")
        if (
            topology is not None
            and topology.requisite
            and not any(t in topology.requisite for t in vol.topology)
        ):
            problems.append("it is not accessible from the requisite topologies")
        if problems:
            raise already_exists(
                f"volume {vol.name!r} already exists as {vol.id} but " + "; ".join(problems)
            )

    def delete_volume(self, volume_id: str) -> None:
        require(volume_id, "volume_id")
        vol = self.volumes.get(volume_id)
        if vol is None:
            return
        if vol.published:
            nodes = ", ".join(sorted(vol.published))
            raise precondition(f"volume {volume_id} is still published to node(s) {nodes}")
        if volume_id in self.staged or self.node_publications(volume_id):
            raise precondition(f"volume {volume_id} is still staged or published on {NODE_ID}")
        del self.volumes[volume_id]
        del self.volume_names[vol.name]

    def controller_publish(
        self,
        volume_id: str,
        node_id: str,
        cap: Capability | None,
        readonly: bool,
        volume_context: Mapping[str, str],
    ) -> dict[str, str]:
        require(volume_id, "volume_id")
        require(node_id, "node_id")
        if cap is None:
            raise invalid("volume_capability is required")
        vol = self.volume(volume_id)
        if node_id not in KNOWN_NODES:
            raise not_found(f"node {node_id!r} does not exist")
        self.check_context(vol, volume_context)
        if not vol.supports(cap):
            raise invalid(f"volume {volume_id} was not created for the requested capability")
        context = {"devicePath": f"/dev/fake/{volume_id}"}
        current = vol.published.get(node_id)
        if current is not None:
            if current != (cap, readonly):
                raise already_exists(
                    f"volume {volume_id} is already published to {node_id} with another"
                    " capability or readonly flag"
                )
            return context
        others = [n for n in vol.published if n != node_id]
        if others and not (cap.multi_node and all(c.multi_node for c, _ in vol.published.values())):
            raise precondition(
                f"volume {volume_id} is published to node {others[0]} and is not multi-node"
            )
        attached = sum(1 for v in self.volumes.values() if node_id in v.published)
        if attached >= MAX_VOLUMES_PER_NODE:
            raise exhausted(f"node {node_id} already has {attached} volumes attached")
        vol.published[node_id] = (cap, readonly)
        return context

    def controller_unpublish(self, volume_id: str, node_id: str) -> None:
        require(volume_id, "volume_id")
        vol = self.volumes.get(volume_id)
        if vol is None:
            return  # nothing attached any more: safely regarded as unpublished
        nodes = [node_id] if node_id else list(vol.published)
        node_busy = volume_id in self.staged or bool(self.node_publications(volume_id))
        if NODE_ID in nodes and NODE_ID in vol.published and node_busy:
            raise precondition(
                f"volume {volume_id} is still staged or published on {NODE_ID};"
                " unstage and unpublish it on the node first"
            )
        for node in nodes:
            vol.published.pop(node, None)

    def validate(
        self,
        volume_id: str,
        caps: Sequence[Capability],
        volume_context: Mapping[str, str],
        parameters: Mapping[str, str],
        mutable: Mapping[str, str],
    ) -> tuple[Volume, str]:
        """The volume and "" when everything requested is supported, else the reason."""
        require(volume_id, "volume_id")
        require(caps, "volume_capabilities")
        vol = self.volume(volume_id)
        if volume_context and dict(volume_context) != vol.context:
            return vol, "volume_context does not match the volume"
        if parameters and dict(parameters) != vol.parameters:
            return vol, "parameters differ from the ones the volume was created with"
        for key, value in mutable.items():
            if vol.mutable.get(key) != value:
                return vol, f"mutable parameter {key} is not {value!r} on this volume"
        for cap in caps:
            if not vol.supports(cap):
                return vol, f"capability {cap.access_type}/{cap.mode} is not supported"
        return vol, ""

    def expand(
        self, volume_id: str, capacity_range: tuple[int, int] | None, cap: Capability | None
    ) -> tuple[Volume, bool]:
        """ControllerExpandVolume: (volume, node expansion required)."""
        require(volume_id, "volume_id")
        if capacity_range is None or not any(capacity_range):
            raise invalid("capacity_range is required")
        required, limit = capacity_range
        check_capacity_range(required, limit)
        vol = self.volume(volume_id)
        if cap is not None and not vol.supports(cap):
            raise invalid(f"volume {volume_id} does not support the given volume_capability")
        target = required or limit
        if target > vol.capacity:
            if target > MAX_VOLUME_SIZE:
                raise out_of_range(f"volumes are at most {MAX_VOLUME_SIZE} bytes")
            if self.used_capacity() - vol.capacity + target > POOL_CAPACITY:
                raise exhausted("the storage pool has not enough free capacity")
            vol.capacity = target
        mount = cap.access_type == "mount" if cap is not None else vol.mount
        return vol, mount

    def modify(self, volume_id: str, mutable: Mapping[str, str]) -> None:
        require(volume_id, "volume_id")
        require(mutable, "mutable_parameters")
        vol = self.volume(volume_id)
        check_mutable(mutable)
        vol.mutable.update(mutable)

    def available_capacity(
        self, caps: Sequence[Capability], topology: Mapping[str, str] | None
    ) -> int:
        if topology and not _known_topology(topology):
            return 0
        if any(cap.fs_type not in FS_TYPES for cap in caps):
            return 0  # no volume with these capabilities can be provisioned
        return max(POOL_CAPACITY - self.used_capacity(), 0)

    # -- pagination -------------------------------------------------------------------

    def page(
        self, items: list[T], seq: Callable[[T], int], max_entries: int, token: str, kind: str
    ) -> tuple[list[T], str]:
        """Entries after ``token`` (the seq of the last entry already returned)."""
        if max_entries < 0:
            raise invalid("max_entries must not be negative")
        if token:
            prefix, _, rest = token.partition(":")
            number = rest.partition(":")[0]
            if prefix != kind or not number.isdigit() or not 0 < int(number) <= self._seq:
                raise aborted(f"starting_token {token!r} is not valid; start again without it")
            after = int(number)
            items = [i for i in items if seq(i) > after]
        if max_entries and len(items) > max_entries:
            items = items[:max_entries]
            token = f"{kind}:{seq(items[-1])}"
            if len(token) < self.token_bytes:
                token = f"{token}:{'t' * (self.token_bytes - len(token) - 1)}"
            return items, token
        return items, ""

    def list_volumes(self, max_entries: int, token: str) -> tuple[list[Volume], str]:
        vols = sorted(self.volumes.values(), key=lambda v: v.seq)
        return self.page(vols, lambda v: v.seq, max_entries, token, "v")

    def list_snapshots(
        self, max_entries: int, token: str, snapshot_id: str, source_volume_id: str
    ) -> tuple[list[Snapshot], str]:
        snaps = sorted(self.snapshots.values(), key=lambda s: s.seq)
        if snapshot_id:
            snaps = [s for s in snaps if s.id == snapshot_id]
        if source_volume_id:
            snaps = [s for s in snaps if s.source_volume_id == source_volume_id]
        return self.page(snaps, lambda s: s.seq, max_entries, token, "s")

    # -- snapshots ----------------------------------------------------------------------

    def create_snapshot(
        self, name: str, source_volume_id: str, parameters: Mapping[str, str]
    ) -> Snapshot:
        check_name(name, "name")
        require(source_volume_id, "source_volume_id")
        existing = self.snapshot_names.get(name)
        if existing is not None:
            snap = self.snapshots[existing]
            if snap.source_volume_id != source_volume_id or snap.parameters != dict(parameters):
                raise already_exists(
                    f"snapshot {name!r} already exists as {snap.id} of volume"
                    f" {snap.source_volume_id} with its own parameters"
                )
            return snap
        vol = self.volume(source_volume_id)
        snap = self._cut(vol, dict(parameters), "", name)
        self.snapshot_names[name] = snap.id
        return snap

    def _cut(self, vol: Volume, parameters: dict[str, str], group_id: str, name: str) -> Snapshot:
        snap_id, seq = self._next("snap")
        snap = Snapshot(
            id=snap_id,
            name=name,
            seq=seq,
            source_volume_id=vol.id,
            size=vol.capacity,
            created_ns=time.time_ns(),
            parameters=parameters,
            group_id=group_id,
            tracking=vol.parameters.get(CBT_PARAMETER, "true") != "false",
        )
        self.snapshots[snap_id] = snap
        return snap

    def delete_snapshot(self, snapshot_id: str) -> None:
        require(snapshot_id, "snapshot_id")
        snap = self.snapshots.get(snapshot_id)
        if snap is None:
            return
        if snap.group_id:
            raise invalid(
                f"snapshot {snapshot_id} belongs to group snapshot {snap.group_id};"
                " delete the group snapshot instead"
            )
        self._forget_snapshot(snap)

    def _forget_snapshot(self, snap: Snapshot) -> None:
        del self.snapshots[snap.id]
        if snap.name and self.snapshot_names.get(snap.name) == snap.id:
            del self.snapshot_names[snap.name]

    # -- group snapshots ----------------------------------------------------------------

    def create_group(
        self, name: str, source_volume_ids: Sequence[str], parameters: Mapping[str, str]
    ) -> Group:
        check_name(name, "name")
        require(source_volume_ids, "source_volume_ids")
        if len(set(source_volume_ids)) != len(source_volume_ids):
            raise invalid("source_volume_ids lists a volume twice")
        existing = self.group_names.get(name)
        if existing is not None:
            group = self.groups[existing]
            if set(group.source_volume_ids) != set(source_volume_ids) or group.parameters != dict(
                parameters
            ):
                raise already_exists(
                    f"group snapshot {name!r} already exists as {group.id} with other source"
                    " volumes or parameters"
                )
            return group
        vols = [self.volume(v) for v in source_volume_ids]
        group_id, seq = self._next("group")
        members = [self._cut(v, dict(parameters), group_id, "") for v in vols]
        group = Group(
            id=group_id,
            name=name,
            seq=seq,
            source_volume_ids=tuple(source_volume_ids),
            snapshot_ids=tuple(s.id for s in members),
            parameters=dict(parameters),
            created_ns=min(s.created_ns for s in members),
        )
        self.groups[group_id] = group
        self.group_names[name] = group_id
        return group

    def _check_members(self, group: Group, snapshot_ids: Sequence[str]) -> None:
        require(snapshot_ids, "snapshot_ids")
        if set(snapshot_ids) != set(group.snapshot_ids):
            raise invalid(
                f"snapshot_ids do not match the members of group snapshot {group.id}:"
                f" {', '.join(group.snapshot_ids)}"
            )

    def get_group(self, group_id: str, snapshot_ids: Sequence[str]) -> Group:
        require(group_id, "group_snapshot_id")
        group = self.groups.get(group_id)
        if group is None:
            raise not_found(f"group snapshot {group_id!r} does not exist")
        self._check_members(group, snapshot_ids)
        return group

    def delete_group(self, group_id: str, snapshot_ids: Sequence[str]) -> None:
        require(group_id, "group_snapshot_id")
        group = self.groups.get(group_id)
        if group is None:
            return
        self._check_members(group, snapshot_ids)
        for sid in group.snapshot_ids:
            snap = self.snapshots.get(sid)
            if snap is not None:
                self._forget_snapshot(snap)
        del self.groups[group_id]
        del self.group_names[group.name]

    # -- snapshot metadata --------------------------------------------------------------

    @staticmethod
    def _allocated(snap: Snapshot, index: int) -> bool:
        return _mix(snap.seq, index) % 4 != 0

    def allocated_blocks(self, snap: Snapshot) -> Iterator[tuple[int, int]]:
        """FIXED_LENGTH tuples of the allocated blocks; a partial last block is omitted."""
        for i in range(snap.size // BLOCK_SIZE):
            if self._allocated(snap, i):
                yield i * BLOCK_SIZE, BLOCK_SIZE

    def changed_extents(self, base: Snapshot, target: Snapshot) -> Iterator[tuple[int, int]]:
        """VARIABLE_LENGTH extents of blocks that differ between two snapshots."""
        start = -1
        blocks = min(base.size, target.size) // BLOCK_SIZE
        for i in range(blocks + 1):
            changed = False
            if i < blocks:
                a, b = self._allocated(base, i), self._allocated(target, i)
                changed = a != b or (b and _mix(base.seq * 131 + target.seq, i) % 3 == 0)
            if changed and start < 0:
                start = i
            elif not changed and start >= 0:
                yield start * BLOCK_SIZE, (i - start) * BLOCK_SIZE
                start = -1
        if target.size > base.size:  # grown volume: the new range counts as changed
            grown_from = blocks * BLOCK_SIZE
            yield grown_from, target.size - grown_from

    @staticmethod
    def check_stream_args(snap: Snapshot, starting_offset: int, max_results: int) -> None:
        if max_results < 0:
            raise invalid("max_results must not be negative")
        if starting_offset < 0 or starting_offset > snap.size:
            raise out_of_range(
                f"starting_offset {starting_offset} is outside the volume (0-{snap.size})"
            )

    def delta_pair(self, base_id: str, target_id: str) -> tuple[Snapshot, Snapshot]:
        require(base_id, "base_snapshot_id")
        require(target_id, "target_snapshot_id")
        base, target = self.snapshot(base_id), self.snapshot(target_id)
        if base.source_volume_id != target.source_volume_id:
            raise invalid("base and target snapshots are not of the same volume")
        if base.seq >= target.seq:
            raise invalid("the target snapshot must be newer than the base snapshot")
        if not (base.tracking and target.tracking):
            raise precondition("changed block tracking is not enabled for this volume")
        return base, target

    # -- node ---------------------------------------------------------------------------

    def node_stage(
        self,
        volume_id: str,
        staging_path: str,
        cap: Capability | None,
        volume_context: Mapping[str, str],
    ) -> None:
        require(volume_id, "volume_id")
        path = check_absolute(staging_path, "staging_target_path")
        if cap is None:
            raise invalid("volume_capability is required")
        vol = self.volume(volume_id)
        self.check_context(vol, volume_context)
        if NODE_ID not in vol.published:
            raise precondition(f"volume {volume_id} is not controller-published to node {NODE_ID}")
        current = self.staged.get(volume_id)
        if current is not None:
            if current[0] != path:
                raise precondition(f"volume {volume_id} is already staged at {current[0]}")
            if current[1] != cap:
                raise already_exists(
                    f"volume {volume_id} is staged at {path} with another capability"
                )
            return
        if not vol.supports(cap):
            raise precondition(f"volume {volume_id} does not support the requested capability")
        self.staged[volume_id] = (path, cap)

    def node_unstage(self, volume_id: str, staging_path: str) -> None:
        require(volume_id, "volume_id")
        require(staging_path, "staging_target_path")
        self.volume(volume_id)
        current = self.staged.get(volume_id)
        if current is None or current[0] != os.path.normpath(staging_path):
            return
        if self.node_publications(volume_id):
            raise precondition(
                f"volume {volume_id} is still published from {current[0]}; unpublish it first"
            )
        del self.staged[volume_id]

    def node_publish(
        self,
        volume_id: str,
        target_path: str,
        staging_path: str,
        cap: Capability | None,
        readonly: bool,
        publish_context: Mapping[str, str],
        volume_context: Mapping[str, str],
    ) -> None:
        require(volume_id, "volume_id")
        target = check_absolute(target_path, "target_path")
        if cap is None:
            raise invalid("volume_capability is required")
        vol = self.volume(volume_id)
        self.check_context(vol, volume_context)
        if not staging_path:
            raise precondition("staging_target_path is required: this plugin stages volumes")
        stage = self.staged.get(volume_id)
        if stage is None or stage[0] != os.path.normpath(staging_path):
            raise precondition(f"volume {volume_id} is not staged at {staging_path}")
        if not vol.supports(cap):
            raise precondition(f"volume {volume_id} does not support the requested capability")
        pub = NodePublication(
            target,
            cap,
            readonly,
            os.path.normpath(staging_path),
            (tuple(sorted(publish_context.items())), tuple(sorted(volume_context.items()))),
        )
        current = self.node_published.get((volume_id, target))
        if current is not None:
            if current != pub:
                raise already_exists(
                    f"volume {volume_id} is already published at {target} with other arguments"
                )
            return
        others = self.node_publications(volume_id)
        if others and not all(self._shareable(p.cap) for p in (*others, pub)):
            raise precondition(
                f"volume {volume_id} is already published at {others[0].target} and its"
                " access mode does not allow another target"
            )
        self.node_published[(volume_id, target)] = pub
        _make_target(target, cap)

    def _shareable(self, cap: Capability) -> bool:
        return cap.multi_node or (
            self.multi_writer_modes and cap.mode == "SINGLE_NODE_MULTI_WRITER"
        )

    def node_unpublish(self, volume_id: str, target_path: str) -> None:
        require(volume_id, "volume_id")
        require(target_path, "target_path")
        self.volume(volume_id)
        pub = self.node_published.pop((volume_id, os.path.normpath(target_path)), None)
        if pub is not None:
            _remove_target(pub.target)

    def path_of(self, volume_id: str, volume_path: str) -> Volume:
        """The volume when it is staged or published at ``volume_path``, else NOT_FOUND."""
        require(volume_id, "volume_id")
        require(volume_path, "volume_path")
        vol = self.volume(volume_id)
        path = os.path.normpath(volume_path)
        stage = self.staged.get(volume_id)
        if (stage is not None and stage[0] == path) or (volume_id, path) in self.node_published:
            return vol
        raise not_found(f"volume {volume_id} is neither staged nor published at {volume_path}")

    def node_expand(
        self,
        volume_id: str,
        volume_path: str,
        capacity_range: tuple[int, int] | None,
        cap: Capability | None,
    ) -> int:
        vol = self.path_of(volume_id, volume_path)
        if cap is not None and not vol.supports(cap):
            raise invalid(f"volume {volume_id} does not support the given volume_capability")
        if capacity_range is not None:
            required, limit = capacity_range
            check_capacity_range(required, limit)
            if required > vol.capacity:
                raise out_of_range(
                    f"volume {volume_id} has {vol.capacity} bytes; expand it on the controller"
                    " first"
                )
        return vol.capacity


def _make_target(target: str, cap: Capability) -> None:
    """Create the target path (directory for mount, file for block) when its parent exists."""
    if not os.path.isdir(os.path.dirname(target)):
        return
    try:
        if cap.access_type == "mount":
            os.makedirs(target, exist_ok=True)
        elif not os.path.exists(target):
            with open(target, "a"):
                pass
    except OSError as exc:
        raise FakeError(
            grpc.StatusCode.INTERNAL, f"cannot create target path {target}: {exc}"
        ) from exc


def _remove_target(target: str) -> None:
    """Remove what NodePublish created: an empty directory or an empty file, nothing else."""
    try:
        st = os.lstat(target)
    except FileNotFoundError:
        return
    try:
        if stat.S_ISDIR(st.st_mode):
            os.rmdir(target)
        elif stat.S_ISREG(st.st_mode) and st.st_size == 0:
            os.unlink(target)
    except OSError:
        pass  # not empty: left alone, the fake never deletes data it did not create
