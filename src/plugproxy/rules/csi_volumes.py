"""CSI volumes and their publications across calls (CSI v1.12 and v0.3): what one call about
a volume must agree with, of what earlier calls on this socket returned or did.

- Values the plugin made that never change: a volume's volume_context (v0.3: attributes),
  a publication's publish_context; one key prefix across the topology keys it returns.
- Values the CO must pass back as they were made: volume_context, publish_context; secrets
  that SHOULD stay the same between a publication and its unpublish.
- Node paths: one staging_target_path per volume, one volume per target_path; a second
  NodePublishVolume with another capability, and the plugin's answer to it.
- Order beyond csi_common's csi.call-order: NodeStage/NodePublish before ControllerPublish,
  NodeExpandVolume of a volume not staged nor published, ControllerExpandVolume of a
  published volume with only OFFLINE expansion; and a plugin with ONLINE expansion refusing
  a published volume, or publishing a single-node volume to a second node; sizes a volume
  was confirmed to reach, and a volume made smaller than its source snapshot (whose size
  csi_snapshots remembers).

Everything is learned from calls this proxy relayed and kept in :class:`VolumeMemory`
(bounded, expiring maps, like the lifecycle state), but for the controller publications,
which are one record shared with the lifecycle (:attr:`SpecState.publications
<plugproxy.rules.state.SpecState.publications>`) and kept by this family: history the proxy
did not see is unknown, never a violation. Contexts, secrets and tokens are kept and
compared as digests, never as values, and messages never quote them: blake2b, but a
volume_context as one keyed hash of the whole map (:func:`_fingerprint`), as listings
compare hundreds a call. No rule here is enforced: each judges memory, so it is reported
(``reject_code=None`` or ``enforceable=False``).

HA controllers: what only the controller side saw (a ControllerPublishVolume) may have been
undone through another replica. Such memory judges the plugin or the CO only while it is
fresh (:data:`~plugproxy.core.memory.HANDOVER`) or while this proxy's node side shows the
volume in use on the node (a unified socket), which no legitimate unpublish allows; the
order checks that only the plugin's answer can confirm are judged on that answer.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from plugproxy.core.memory import HANDOVER, ExpiringMap, ago, digest, map_digest, remember
from plugproxy.rules import csi_order
from plugproxy.rules.csi_snapshots import SnapshotMemory
from plugproxy.rules.engine import (
    CO,
    MUST,
    PLUGIN,
    SHOULD,
    Hooks,
    Rule,
    Violation,
    listed_entries,
)
from plugproxy.rules.state import CAPABILITY_TTL, MAX_PER_VOLUME, Publication

if TYPE_CHECKING:
    from plugproxy.api import Call
    from plugproxy.rules.engine import CompiledSpec
    from plugproxy.rules.state import SpecState

LISTED_MAX = 4096  # listed entries known by their bytes (a few pages' samples)
_EXPAND_JUDGED = "csi_volumes.expand"  # the request was found out of order already
_GET_SENT = "csi_volumes.get_sent"  # call.stage_state key: when a ControllerGetVolume came


def _value_digest(value: str) -> bytes:
    return hashlib.blake2b(value.encode(), digest_size=8).digest()


def _entries(values: Mapping[str, str]) -> tuple[tuple[str, bytes], ...]:
    """A context map as (key, value digest) pairs: keys to match a CO's copy, no values."""
    return tuple((key, _value_digest(values[key])) for key in sorted(values))


def _fingerprint(values: Mapping[str, str]) -> int:
    """One 64-bit hash of a whole context map, whatever order it was sent in.

    A listing compares hundreds of contexts a call: one hash of the sorted keys, then their
    values, as a tuple costs about a third of a blake2b digest per value (measured on a
    two-entry context, reading the map included). Python's string hash is keyed at random
    per process (SipHash), so what is kept says nothing of a value without that key; two
    different maps give the same hash once in 2**64."""
    keys = sorted(values)
    return hash((*keys, *map(values.__getitem__, keys)))


def _without(message: Any, name: str) -> bytes:
    """Digest of ``message`` with field ``name`` (secrets) cleared."""
    copy = type(message)()
    copy.CopyFrom(message)
    copy.ClearField(name)
    return digest(copy.SerializeToString(deterministic=True))


def _mode_name(capability: Any) -> str:
    if not capability.HasField("access_mode"):
        return ""
    mode = capability.access_mode
    value = mode.DESCRIPTOR.fields_by_name["mode"].enum_type.values_by_number.get(mode.mode)
    return value.name if value is not None else ""


def _norm(path: str) -> str:
    return path.rstrip("/") or path


def _trim(entries: dict[str, Any]) -> None:
    while len(entries) > MAX_PER_VOLUME:
        del entries[next(iter(entries))]


def _full(entries: dict[str, Any]) -> bool:
    """Whether ``entries`` (one volume's) may have dropped one: absence is no evidence."""
    return len(entries) >= MAX_PER_VOLUME


# -- memory -----------------------------------------------------------------------------------


@dataclass(slots=True)
class _Context:
    """A volume_context the plugin returned, as digests."""

    fingerprint: int  # of the whole map (_fingerprint)
    size: int  # its number of entries
    rpc: str  # CreateVolume, ListVolumes or ControllerGetVolume
    at: float
    # CreateVolume only: (key, value digest) pairs, to find which entries a CO's copy lacks
    # or changes; a listing's record needs only the fingerprint.
    entries: tuple[tuple[str, bytes], ...] = ()
    create_args: bytes = b""  # CreateVolume: digest of its request, secrets aside


# ControllerPublishVolume error rows that cannot hold for a volume published to the node
# with the capability and readonly asked (§ControllerPublishVolume errors).
_REPUBLISH_ROWS = {
    "ALREADY_EXISTS": "published but incompatible",
    "FAILED_PRECONDITION": "published to another node",
    "RESOURCE_EXHAUSTED": "no more volumes attach to the node",
}


def _publish_mode(req: Any) -> bytes:
    """Digest of what a publication's compatibility depends on: capability and readonly."""
    capability = req.volume_capability.SerializeToString(deterministic=True)
    return digest(capability + (b"\x01" if req.readonly else b"\x00"))


@dataclass(slots=True)
class _Target:
    capability: bytes  # digest of volume_capability
    at: float


@dataclass(slots=True)
class _Volume:
    """One volume as this proxy saw it: its creation, and the node side on this node."""

    created_at: float | None = None  # CreateVolume returned it through this proxy
    multi_node: bool = True  # a capability it was created with allows MULTI_NODE
    staged: dict[str, float] = field(default_factory=dict)  # staging path -> when
    targets: dict[str, _Target] = field(default_factory=dict)
    # Known neither staged nor published on this node since then (created, or all undone).
    empty_since: float | None = None
    empty_by: str = ""  # the call that made it so

    def in_use(self) -> bool:
        return bool(self.staged or self.targets)


class VolumeMemory:
    """What this family remembers per spec table; bounded and expiring like the lifecycle."""

    def __init__(self, st: SpecState) -> None:
        n, ttl, clock = st.max_volumes, st.lifecycle_ttl, st.clock
        self.clock = clock
        self.contexts: ExpiringMap[str, _Context] = ExpiringMap(n, ttl, clock)
        self.volumes: ExpiringMap[str, _Volume] = ExpiringMap(n, ttl, clock)
        self.targets: ExpiringMap[str, tuple[str, float]] = ExpiringMap(n, ttl, clock)
        # volume id -> the largest capacity the plugin confirmed for it, by side:
        # (bytes, rpc, when); a volume never shrinks.
        self.sizes: ExpiringMap[tuple[str, str], tuple[int, str, float]] = ExpiringMap(
            n, ttl, clock
        )
        # volume id -> when a ControllerUnpublishVolume of it last arrived; for a lease.
        self.unpublish_sent: ExpiringMap[str, float] = ExpiringMap(n, HANDOVER, clock)
        # The topology key prefix the plugin last returned: (prefix, rpc, when).
        self.prefix: tuple[str, str, float] | None = None
        # Hash of a listed entry's wire bytes -> (volume id, fingerprint of its context),
        # for entries without topology: what those bytes say, read once however often
        # a CO lists them. Bounded by count; the bytes decide, so nothing expires.
        self.listed: OrderedDict[int, tuple[str, int]] = OrderedDict()

    def volume(self, volume_id: str) -> _Volume:
        """The record of ``volume_id`` to update, made if need be; its TTL starts again."""
        vol = self.volumes.get(volume_id)
        if vol is None:
            vol = _Volume()
        self.volumes[volume_id] = vol
        return vol

    def confirmed(self, side: str, volume_id: str, size: int, rpc: str) -> None:
        """The plugin answered that ``volume_id`` holds ``size`` bytes (``side``: controller
        or node, whose sizes differ: a file system grows after its device)."""
        if size <= 0 or not volume_id:
            return
        prev = self.sizes.get((side, volume_id))
        if prev is None or size >= prev[0]:
            self.sizes[(side, volume_id)] = (size, rpc, self.clock())

    def forget_volume(self, volume_id: str) -> None:
        self.sizes.pop(("controller", volume_id), None)
        self.sizes.pop(("node", volume_id), None)
        vol = self.volumes.pop(volume_id, None)
        if vol is not None:
            for target in vol.targets:
                owner = self.targets.get(target)
                if owner is not None and owner[0] == volume_id:
                    del self.targets[target]
        self.contexts.pop(volume_id, None)


def _mem(st: SpecState) -> VolumeMemory:
    return st.part(VolumeMemory)


def _topology_prefixes(
    cs: CompiledSpec,
    mem: VolumeMemory,
    rpc: str,
    topologies: Iterable[Any],
    where: str,
    now: float | None = None,
) -> Iterable[Violation]:
    """One key prefix across every topology key the plugin returns (§Topology)."""
    if now is None:
        now = mem.clock()
    for topology in topologies:
        for key in topology.segments:
            prefix, slash, _ = key.rpartition("/")
            if not slash or _kubernetes_owned(prefix):
                continue
            prev = mem.prefix
            if prev is not None and prev[0] == prefix and prev[1] == rpc and prev[2] == now:
                continue  # this answer's own keys already remembered it
            if prev is not None and now - prev[2] > CAPABILITY_TTL:
                prev = None  # the plugin may have been replaced since
            if prev is not None and prev[0] != prefix:
                yield Violation(
                    cs.rule("topology-prefix-inconsistent"),
                    where,
                    f"{where} has a topology key whose prefix differs from the prefix of a key"
                    f" {prev[1]} returned {ago(now - prev[2])}; a key prefix MUST be identical"
                    " across all topology keys the plugin returns",
                )
                return
            mem.prefix = (prefix, rpc, now)


def _kubernetes_owned(prefix: str) -> bool:
    """Kubernetes' reserved key prefixes: keys the CO defines (topology.kubernetes.io/zone),
    which drivers return besides their own so the CO can schedule by its standard labels."""
    return prefix in ("kubernetes.io", "k8s.io") or prefix.endswith((".kubernetes.io", ".k8s.io"))


def _unpublish_sent(mem: VolumeMemory, vid: str, at: float) -> bool:
    """Whether a ControllerUnpublishVolume of ``vid`` may have been sent at ``at`` or later
    (one dropped to make room counts)."""
    undone = mem.unpublish_sent.get(vid)
    if undone is not None:
        return undone >= at
    return mem.unpublish_sent.dropped_after(at)


# -- rules --------------------------------------------------------------------------------


def _rules(title: str, v1: bool) -> tuple[Rule, ...]:
    seen = "(seen on this socket; reported, never enforced)"
    rules = [
        Rule(
            "csi.volume-context-changed",
            MUST,
            (PLUGIN,),
            f"{title} §CreateVolume",
            "A volume id's volume_context (v0.3: attributes) differs from the one the plugin"
            " returned for it before (CreateVolume, ListVolumes, ControllerGetVolume).",
            reject_code=None,
            note="The contents SHALL NOT be mutable and a volume SHALL always report the same."
            " An empty map is not compared (proto3 cannot tell it from one not reported); a"
            " CreateVolume answer is compared only with an identical earlier CreateVolume"
            " (secrets aside), since another one returning the same id re-created the volume."
            " Compared as digests.",
        ),
        Rule(
            "csi.volume-context-mismatch",
            MUST,
            (CO,),
            f"{title} §{{rpc}}",
            "ControllerPublishVolume, ValidateVolumeCapabilities, NodeStageVolume or"
            " NodePublishVolume passes a volume_context (v0.3: volume_attributes) lacking or"
            " changing entries CreateVolume returned for that volume on this socket.",
            reject_code=None,
            note="Every entry the plugin returned must be passed as it was; entries the CO"
            " adds (Kubernetes: the provisioner identity, pod info, service account tokens)"
            " are tolerated, and an empty map is not judged (the request field is OPTIONAL and"
            " proto3 cannot tell it from one not passed). Only what CreateVolume returned"
            " through this proxy counts: a pre-provisioned volume's context is the"
            " administrator's. Compared as digests;"
            f" {seen}.",
        ),
        Rule(
            "csi.publish-context-mismatch",
            MUST,
            (CO,),
            f"{title} §{{rpc}}",
            "NodeStageVolume or NodePublishVolume passes a publish_context (v0.3:"
            " publish_info) other than ControllerPublishVolume returned for that volume and"
            " this node on this socket (unified socket).",
            reject_code=None,
            note="Judged only when this proxy saw the ControllerPublishVolume for the volume"
            " and its own node (NodeGetInfo); an empty map (the request field is OPTIONAL, and"
            " proto3 cannot tell empty from not passed) only when that publication returned"
            " entries, which the CO MUST then pass; and only while an unpublish"
            f" through another HA replica is impossible: within {HANDOVER:.0f} s of it (a"
            " leader-election lease), or while the volume is staged or published on the node."
            f" Compared as digests; {seen}.",
        ),
        Rule(
            "csi.staging-path-conflict",
            MUST,
            (CO,),
            f"{title} §NodeStageVolume",
            "NodeStageVolume of a volume already staged at another staging_target_path on this"
            " node (the CO SHALL ensure only one per volume).",
            reject_code=None,
            note=f"Node-side memory of this proxy; {seen}.",
        ),
        Rule(
            "csi.target-path-conflict",
            MUST,
            (CO,),
            f"{title} §NodePublishVolume",
            "NodePublishVolume at a target_path where another volume is published (the CO SHALL"
            " ensure uniqueness of target_path per volume).",
            reject_code=None,
            note=f"Node-side memory of this proxy; {seen}.",
        ),
        Rule(
            "csi.republish-answer",
            SHOULD,
            (PLUGIN,),
            f"{title} §NodePublishVolume",
            "A second NodePublishVolume the second-publish table answers with an error was"
            " answered OK: the same target_path with another volume_capability"
            + (
                ", or another target_path of a SINGLE_NODE_SINGLE_WRITER volume (answered"
                " ALREADY_EXISTS there too: the table answers FAILED_PRECONDITION)."
                if v1
                else "."
            ),
            reject_code=None,
            note="For a different volume_capability at the same target_path the text says"
            " FAILED_PRECONDITION and the table ALREADY_EXISTS: either is accepted, OK is not."
            " Other differences are not judged: Kubernetes re-publishes with fresh service"
            " account tokens in volume_context (requiresRepublish) and expects OK, and"
            " publishes a ReadWriteOnce (SINGLE_NODE_WRITER) volume once per pod on a node.",
        ),
        Rule(
            "csi.publish-conflict-accepted",
            MUST,
            (PLUGIN,),
            f"{title} §ControllerPublishVolume",
            "ControllerPublishVolume of a volume created with single-node capabilities only,"
            " still published to another node with a single-node access mode, answered OK"
            " (the errors table answers FAILED_PRECONDITION).",
            reject_code=None,
            note="Judged only while the earlier publication cannot have been undone through"
            f" another HA replica: within {HANDOVER:.0f} s of it, or while the volume is staged"
            " or published on that node, this proxy's own (unified socket).",
        ),
        Rule(
            "csi.secrets-changed",
            SHOULD,
            (CO,),
            f"{title} §{{rpc}}",
            "ControllerUnpublishVolume secrets differ from the ControllerPublishVolume's"
            + (
                "; or a group snapshot operation's secrets differ from an earlier one's"
                " on the same group snapshot."
                if v1
                else "."
            ),
            reject_code=None,
            note="Compared as digests, never kept or quoted. Advisory: an administrator may"
            " rotate secrets in between.",
        ),
        Rule(
            "csi.topology-prefix-inconsistent",
            MUST,
            (PLUGIN,),
            f"{title} §CreateVolume",
            "A topology key the plugin returns (CreateVolume, ListVolumes,"
            + (" ControllerGetVolume," if v1 else "")
            + " NodeGetInfo) has another key prefix than the keys it returned before.",
            reject_code=None,
            note='Topology: "If a key prefix is specified, it MUST be identical across all'
            ' topology keys returned by the SP (across all RPCs)"; keys without a prefix are'
            f" not compared. Compared with the last prefixed key within {CAPABILITY_TTL:.0f} s"
            " (a plugin replaced on the socket may use another prefix). Keys under"
            " Kubernetes' reserved prefixes (kubernetes.io, k8s.io) are not compared: they are"
            " the CO's own well-known keys (topology.kubernetes.io/zone), which drivers such as"
            " AWS EBS and Azure Disk return besides their own for the CO's scheduler; flagging"
            " them would be a false alarm on every such cluster.",
        ),
        Rule(
            "csi.volume-smaller-than-snapshot",
            MUST,
            (PLUGIN,),
            f"{title} §CreateSnapshot",
            "CreateVolume from a snapshot seen on this socket returns a capacity_bytes below"
            " the snapshot's size_bytes.",
            reject_code=None,
            note="Snapshot.size_bytes: the size of the volume MUST NOT be less than the size"
            " of the source snapshot. Zero sizes (unknown) are not compared.",
        ),
    ]
    context = "publish_context" if v1 else "publish_info"
    rules.append(
        Rule(
            "csi.publish-context-changed",
            MUST,
            (PLUGIN,),
            f"{title} §ControllerPublishVolume",
            "An identical repeat (secrets aside) of a successful ControllerPublishVolume"
            f" returns another {context}.",
            reject_code=None,
            note=(
                "publish_context SHALL NOT be mutable."
                if v1
                else "publish_info answers the publication: an idempotent ControllerPublishVolume"
                " repeated unchanged answers the same."
            )
            + " Judged only while the earlier publication cannot have been undone through"
            f" another HA replica: within {HANDOVER:.0f} s of it, or while the volume is staged"
            " or published on this proxy's node.",
        )
    )
    if v1:
        rules += [
            Rule(
                "csi.republish-different-capability",
                SHOULD,
                (CO,),
                f"{title} §NodePublishVolume",
                "A second NodePublishVolume of a volume at the same target_path with another"
                " volume_capability.",
                reject_code=None,
            ),
            Rule(
                "csi.expand-published-refused",
                MUST,
                (PLUGIN,),
                f"{title} §GetPluginCapabilities",
                "With ONLINE expansion and controller EXPAND_VOLUME, ControllerExpandVolume of a"
                " volume seen published answered FAILED_PRECONDITION.",
                reject_code=None,
                note="VolumeExpansion ONLINE: such a plugin MUST support expanding volumes"
                " currently published; the FAILED_PRECONDITION row is for plugins without"
                " ONLINE.",
            ),
            Rule(
                "csi.expand-already-large-refused",
                SHOULD,
                (PLUGIN,),
                f"{title} §{{rpc}}",
                "ControllerExpandVolume or NodeExpandVolume answered OUT_OF_RANGE to a target"
                " no larger than a capacity the plugin confirmed for the volume before; a"
                " volume already that large SHOULD get 0 OK.",
                reject_code=None,
                note="Confirmed: the capacity_bytes of CreateVolume or ControllerExpandVolume"
                " (controller side), of NodeExpandVolume (node side: a file system grows after"
                " its device, so the controller's answer says nothing of it). A volume never"
                " shrinks. Only OUT_OF_RANGE is judged: NOT_FOUND, FAILED_PRECONDITION and"
                " INVALID_ARGUMENT have causes outside the size (a delete, a publication, the"
                " capability).",
            ),
        ]
    return tuple(rules)


# -- checks -------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Fields:
    """Field names of one CSI version."""

    v1: bool
    volume_id: str  # Volume's id
    volume_context: str  # Volume's context map
    request_context: str  # the CO's copy in publish, validate and node requests
    publish_context: str  # ControllerPublishVolumeResponse's map and node requests' copy
    create_secrets: str
    publish_secrets: str
    unpublish_secrets: str
    snapshot_id: str  # Snapshot's id and VolumeContentSource.SnapshotSource's


V1 = _Fields(
    v1=True,
    volume_id="volume_id",
    volume_context="volume_context",
    request_context="volume_context",
    publish_context="publish_context",
    create_secrets="secrets",
    publish_secrets="secrets",
    unpublish_secrets="secrets",
    snapshot_id="snapshot_id",
)
V0 = _Fields(
    v1=False,
    volume_id="id",
    volume_context="attributes",
    request_context="volume_attributes",
    publish_context="publish_info",
    create_secrets="controller_create_secrets",
    publish_secrets="controller_publish_secrets",
    unpublish_secrets="controller_unpublish_secrets",
    snapshot_id="id",
)


@dataclass(frozen=True)
class VolumeChecks:
    """The family's checks, bound to one CSI version's field names."""

    f: _Fields

    # -- volume_context ---------------------------------------------------------------

    def _plugin_context(
        self, cs: CompiledSpec, mem: VolumeMemory, vol: Any, rpc: str, where: str, now: float
    ) -> Violation | None:
        """Compare a Volume ControllerGetVolume returned; remember it (list_volumes_response
        does the same inline)."""
        vid = getattr(vol, self.f.volume_id)
        values = getattr(vol, self.f.volume_context)
        if not vid or not values:
            return None
        fingerprint = _fingerprint(values)
        prev = mem.contexts.touch(vid)  # the same: kept as it came, for longer; else replaced
        if prev is not None and prev.fingerprint == fingerprint:
            return None
        return self._other_context(cs, mem, vid, values, fingerprint, prev, rpc, where, now)

    def _other_context(
        self,
        cs: CompiledSpec,
        mem: VolumeMemory,
        vid: str,
        values: Mapping[str, str],
        fingerprint: int,
        prev: _Context | None,
        rpc: str,
        where: str,
        now: float,
    ) -> Violation | None:
        """Remember a context other than the one remembered for ``vid``: a change if one was."""
        mem.contexts[vid] = _Context(fingerprint, len(values), rpc, now)
        if prev is None:
            return None
        return Violation(
            cs.rule("volume-context-changed"),
            f"{where}.{self.f.volume_context}",
            f"{where}.{self.f.volume_context} ({len(values)} entries) differs from the"
            f" one {prev.rpc} returned for this volume id {ago(now - prev.at)}"
            f" ({prev.size} entries)",
        )

    def create_volume_response(
        self, cs: CompiledSpec, st: SpecState, call: Call, req: Any, resp: Any
    ) -> Iterable[Violation]:
        if not resp.HasField("volume"):
            return
        vol = resp.volume
        yield from _topology_prefixes(
            cs, _mem(st), "CreateVolume", vol.accessible_topology, "volume.accessible_topology"
        )
        vid = getattr(vol, self.f.volume_id)
        if not vid:
            return
        mem = _mem(st)
        now = mem.clock()
        cap = vol.capacity_bytes
        mem.confirmed("controller", vid, cap, "CreateVolume")
        if cap > 0 and req.HasField("volume_content_source"):
            source = req.volume_content_source
            if source.HasField("snapshot"):
                sid = getattr(source.snapshot, self.f.snapshot_id)
                snap = st.part(SnapshotMemory).snapshots.get(sid)
                if snap is not None and snap.size > cap:
                    yield Violation(
                        cs.rule("volume-smaller-than-snapshot"),
                        "volume.capacity_bytes",
                        f"volume.capacity_bytes {cap} is below the size_bytes {snap.size} that"
                        f" {snap.rpc} returned for the source snapshot {ago(now - snap.at)}",
                    )
        values = getattr(vol, self.f.volume_context)
        prev = mem.contexts.get(vid)
        if values:
            fingerprint = _fingerprint(values)
            args = _without(req, self.f.create_secrets)
            if (
                prev is not None
                and prev.rpc == "CreateVolume"
                and prev.create_args == args
                and prev.fingerprint != fingerprint
            ):
                yield Violation(
                    cs.rule("volume-context-changed"),
                    f"volume.{self.f.volume_context}",
                    f"volume.{self.f.volume_context} ({len(values)} entries) differs from the"
                    " one an identical CreateVolume returned for this volume id"
                    f" {ago(now - prev.at)} ({prev.size} entries)",
                )
            if prev is None or prev.fingerprint != fingerprint or prev.rpc != "CreateVolume":
                mem.contexts[vid] = _Context(
                    fingerprint, len(values), "CreateVolume", now, _entries(values), args
                )
            else:
                mem.contexts[vid] = prev

    def node_info_response(
        self, cs: CompiledSpec, st: SpecState, call: Call, req: Any, resp: Any
    ) -> Iterable[Violation]:
        if resp.HasField("accessible_topology"):
            yield from _topology_prefixes(
                cs, _mem(st), "NodeGetInfo", (resp.accessible_topology,), "accessible_topology"
            )

    def list_volumes_response(
        self, cs: CompiledSpec, st: SpecState, call: Call, req: Any, resp: Any
    ) -> Iterable[Violation]:
        mem = _mem(st)
        now = mem.clock()  # one answer: one time for all its entries
        contexts, listed = mem.contexts, mem.listed
        id_field, context_field = self.f.volume_id, self.f.volume_context
        entries = resp.entries
        # A sampled page: entries known by their bytes skip reading them (the same check).
        raws = listed_entries(call, resp, "entries") or ()
        # Hundreds of entries a call: _plugin_context's work inline, names made on a finding.
        for i in range(len(entries)):
            key = hash(raws[i]) if raws else None
            known = listed.get(key) if key is not None else None
            if known is not None:
                vid, fingerprint = known
                if not vid:
                    continue
                prev = contexts.touch(vid)  # as below
                if prev is not None and prev.fingerprint == fingerprint:
                    continue
            vol = entries[i].volume  # unset: an empty Volume, without id, context or topology
            topologies = vol.accessible_topology
            if topologies:
                yield from _topology_prefixes(
                    cs,
                    mem,
                    "ListVolumes",
                    topologies,
                    f"entries[{i}].volume.accessible_topology",
                    now,
                )
            vid = getattr(vol, id_field)
            values = getattr(vol, context_field)
            fingerprint = _fingerprint(values) if vid and values else 0
            if key is not None and not topologies:
                remember(listed, key, (vid if values else "", fingerprint), LISTED_MAX)
            if not vid or not values:
                continue
            prev = contexts.touch(vid)  # the same: kept as it came, for longer; else replaced
            if prev is not None and prev.fingerprint == fingerprint:
                continue
            changed = self._other_context(
                cs, mem, vid, values, fingerprint, prev, "ListVolumes", f"entries[{i}].volume", now
            )
            if changed is not None:
                yield changed

    def controller_get_volume_response(
        self, cs: CompiledSpec, st: SpecState, call: Call, req: Any, resp: Any
    ) -> Iterable[Violation]:
        if resp.HasField("volume"):
            mem = _mem(st)
            now = mem.clock()
            yield from _topology_prefixes(
                cs,
                mem,
                "ControllerGetVolume",
                resp.volume.accessible_topology,
                "volume.accessible_topology",
                now,
            )
            changed = self._plugin_context(
                cs, mem, resp.volume, "ControllerGetVolume", "volume", now
            )
            if changed is not None:
                yield changed
        yield from self._published_nodes_left_out(cs, st, call, req, resp)

    def controller_get_volume_request(
        self, cs: CompiledSpec, st: SpecState, call: Call, req: Any
    ) -> Iterable[Violation]:
        call.stage_state[_GET_SENT] = _mem(st).clock()
        return ()

    def _published_nodes_left_out(
        self, cs: CompiledSpec, st: SpecState, call: Call, req: Any, resp: Any
    ) -> Iterable[Violation]:
        """§ControllerGetVolume: with LIST_VOLUMES_PUBLISHED_NODES the status names the nodes
        the volume is published to. proto3 cannot tell an empty list from none, and empty is
        right for a volume published nowhere; but not for one this socket saw published
        before the call was sent, within a lease (no other replica can have unpublished it)
        and with no unpublish of it sent since."""
        if resp.status.published_node_ids or not resp.HasField("status"):
            return  # a missing status is csi.required-field's
        controller = st.known_capabilities("controller")
        if controller is None or "LIST_VOLUMES_PUBLISHED_NODES" not in controller:
            return
        mem = _mem(st)
        vid = req.volume_id
        pubs = st.publications.get(vid)
        sent = call.stage_state.get(_GET_SENT)
        if not pubs or sent is None:
            return
        now = mem.clock()
        held = [
            p.at
            for p in pubs.values()
            if p.at <= sent and now - p.at <= HANDOVER and not _unpublish_sent(mem, vid, p.at)
        ]
        if held:
            yield Violation(
                cs.rule("response-field-missing"),
                "status.published_node_ids",
                f"status.published_node_ids is empty but ControllerPublishVolume published the"
                f" volume to {len(held)} node(s) {ago(now - max(held))} through this socket,"
                " with no unpublish since, and the controller advertises"
                " LIST_VOLUMES_PUBLISHED_NODES",
            )

    def _context_mismatch(self, cs: CompiledSpec, st: SpecState, req: Any) -> Iterable[Violation]:
        prev = _mem(st).contexts.get(req.volume_id)
        if prev is None or prev.rpc != "CreateVolume":
            return
        name = self.f.request_context
        given = getattr(req, name)
        if not given:
            return  # OPTIONAL in the request; proto3 cannot tell empty from not passed
        since = ago(_mem(st).clock() - prev.at)
        n = len(prev.entries)
        missing = differ = 0
        for key, kept in prev.entries:
            if key not in given:
                missing += 1
            elif _value_digest(given[key]) != kept:
                differ += 1
        if missing or differ:
            yield Violation(
                cs.rule("volume-context-mismatch"),
                name,
                f"{name} lacks {missing} and changes {differ} of the {n} entries CreateVolume"
                f" returned for this volume {since}",
            )

    # -- publish_context and ControllerPublishVolume ------------------------------------

    def _trusted(self, mem: VolumeMemory, st: SpecState, vid: str, node: str, at: float) -> bool:
        """Whether a publication this proxy saw cannot have been undone elsewhere since."""
        if mem.clock() - at <= HANDOVER:
            return True
        vol = mem.volumes.get(vid)
        return node == st.node_id and vol is not None and vol.in_use()

    def controller_publish_response(
        self, cs: CompiledSpec, st: SpecState, call: Call, req: Any, resp: Any
    ) -> Iterable[Violation]:
        vid, node = req.volume_id, req.node_id
        mem = _mem(st)
        pubs = st.publications.get(vid)
        if not pubs or not node:
            return
        prev = pubs.get(node)
        if (
            prev is not None
            and map_digest(getattr(resp, self.f.publish_context)) != prev.context
            and prev.args == _without(req, self.f.publish_secrets)
            and self._trusted(mem, st, vid, node, prev.at)
        ):
            yield Violation(
                cs.rule("publish-context-changed"),
                self.f.publish_context,
                f"{self.f.publish_context} differs from the one an identical"
                f" ControllerPublishVolume returned {ago(mem.clock() - prev.at)}, and the"
                " volume was not unpublished since",
            )
        if not _mode_name(req.volume_capability).startswith("SINGLE_NODE"):
            return
        vol = mem.volumes.get(vid)
        if vol is None or vol.created_at is None or vol.multi_node:
            return  # the volume's own capabilities are unknown, or allow MULTI_NODE
        for other, pub in pubs.items():
            if other != node and pub.single_node and self._trusted(mem, st, vid, other, pub.at):
                yield Violation(
                    cs.rule("publish-conflict-accepted"),
                    "node_id",
                    "ControllerPublishVolume answered OK although the volume, created with"
                    " single-node capabilities only, was ControllerPublished to another node"
                    f" {ago(mem.clock() - pub.at)} and not unpublished since; the errors"
                    " table answers FAILED_PRECONDITION",
                )
                return

    def controller_published(self, st: SpecState, call: Call, req: Any, resp: Any) -> None:
        vid, node = req.volume_id, req.node_id
        if not vid or not node or resp is None:
            return
        context = getattr(resp, self.f.publish_context)
        publication = Publication(
            args=_without(req, self.f.publish_secrets),
            context=map_digest(context),
            context_size=len(context),
            secrets=map_digest(getattr(req, self.f.publish_secrets)),
            single_node=_mode_name(req.volume_capability).startswith("SINGLE_NODE"),
            at=st.clock(),
            mode=_publish_mode(req),
        )
        st.controller_published(vid, node, publication)

    def controller_publish_error(
        self, cs: CompiledSpec, st: SpecState, call: Call, req: Any, code: str
    ) -> Iterable[Violation]:
        """§ControllerPublishVolume: a volume already published to the node compatibly with
        the capability and readonly asked gets 0 OK. For the capability and readonly of the
        publication this socket saw, within a lease of it and with no unpublish of the
        volume sent since, a row that needs the volume unpublished from this node denies
        it: published but incompatible, published to another node, no attachment left."""
        row = _REPUBLISH_ROWS.get(code)
        if row is None or not req.node_id:
            return
        mem = _mem(st)
        pubs = st.publications.get(req.volume_id)
        pub = pubs.get(req.node_id) if pubs else None
        if pub is None or not pub.mode or pub.mode != _publish_mode(req):
            return
        now = mem.clock()
        if now - pub.at > HANDOVER or _unpublish_sent(mem, req.volume_id, pub.at):
            return
        yield Violation(
            cs.rule("not-idempotent"),
            "volume_capability",
            f"ControllerPublishVolume answered {code} ({row}), though it published the"
            f" volume to this node {ago(now - pub.at)} with the same"
            " volume_capability and readonly, and no unpublish of it was sent since",
            party=PLUGIN,
        )

    def controller_unpublished(self, st: SpecState, call: Call, req: Any, resp: Any) -> None:
        st.controller_unpublished(req.volume_id, req.node_id)

    def controller_unpublish_error(
        self, cs: CompiledSpec, st: SpecState, call: Call, req: Any, code: str
    ) -> Iterable[Violation]:
        if code == "NOT_FOUND":  # volume or node gone: tabled, nothing stays published
            self.controller_unpublished(st, call, req, None)
        return ()

    def controller_unpublish_request(
        self, cs: CompiledSpec, st: SpecState, call: Call, req: Any
    ) -> Iterable[Violation]:
        mem = _mem(st)
        if req.volume_id:
            mem.unpublish_sent[req.volume_id] = mem.clock()
        pubs = st.publications.get(req.volume_id)
        if not pubs:
            return
        if req.node_id:
            found = pubs.get(req.node_id)
            candidates = [found] if found is not None else []
        else:
            candidates = list(pubs.values())
        if not candidates:
            return
        name = self.f.unpublish_secrets
        secrets = map_digest(getattr(req, name))
        if all(p.secrets != secrets for p in candidates):
            latest = max(p.at for p in candidates)
            yield Violation(
                cs.rule("secrets-changed"),
                name,
                f"{name} differ from the secrets ControllerPublishVolume passed for this volume"
                f" {ago(mem.clock() - latest)} (compared as digests); they SHOULD be the same",
            )

    def _publish_context_mismatch(
        self, cs: CompiledSpec, st: SpecState, req: Any
    ) -> Iterable[Violation]:
        node = st.node_id
        if node is None:
            return
        mem = _mem(st)
        pubs = st.publications.get(req.volume_id)
        pub = pubs.get(node) if pubs else None
        if pub is None or not self._trusted(mem, st, req.volume_id, node, pub.at):
            return
        name = self.f.publish_context
        given = getattr(req, name)
        # OPTIONAL in the request, as the plugin may return none; proto3 cannot tell empty
        # from not passed, and both break the MUST when the publication returned entries.
        if map_digest(given) == pub.context:
            return
        what = f"({len(given)} entries) differs from" if given else "is empty, not passing"
        yield Violation(
            cs.rule("publish-context-mismatch"),
            name,
            f"{name} {what} the one ControllerPublishVolume returned for this volume and node"
            f" {ago(mem.clock() - pub.at)} ({pub.context_size} entries)",
        )

    # -- validate ---------------------------------------------------------------------

    def validate_request(
        self, cs: CompiledSpec, st: SpecState, call: Call, req: Any
    ) -> Iterable[Violation]:
        yield from self._context_mismatch(cs, st, req)

    def controller_publish_request(
        self, cs: CompiledSpec, st: SpecState, call: Call, req: Any
    ) -> Iterable[Violation]:
        yield from self._context_mismatch(cs, st, req)

    # -- volumes: creation and deletion -----------------------------------------------

    def created(self, st: SpecState, call: Call, req: Any, resp: Any) -> None:
        vid = getattr(resp.volume, self.f.volume_id) if resp is not None else ""
        if not vid:
            return
        mem = _mem(st)
        if vid in mem.volumes:
            return  # an idempotent repeat: what is known of the volume stays
        now = mem.clock()
        vol = mem.volume(vid)
        vol.created_at = now
        vol.multi_node = any(
            not _mode_name(c).startswith("SINGLE_NODE") for c in req.volume_capabilities
        )
        vol.empty_since, vol.empty_by = now, "CreateVolume returned it"

    def deleted(self, st: SpecState, call: Call, req: Any, resp: Any) -> None:
        _mem(st).forget_volume(req.volume_id)
        st.publications.pop(req.volume_id, None)

    def delete_volume_error(
        self, cs: CompiledSpec, st: SpecState, call: Call, req: Any, code: str
    ) -> Iterable[Violation]:
        if code == "NOT_FOUND":  # gone either way
            self.deleted(st, call, req, None)
        return ()

    # -- node side ----------------------------------------------------------------------

    def node_stage_request(
        self, cs: CompiledSpec, st: SpecState, call: Call, req: Any
    ) -> Iterable[Violation]:
        mem = _mem(st)
        vol = mem.volumes.get(req.volume_id)
        if vol is not None and vol.staged:
            path = _norm(req.staging_target_path)
            others = [at for p, at in vol.staged.items() if p != path]
            if others:
                yield Violation(
                    cs.rule("staging-path-conflict"),
                    "staging_target_path",
                    "the volume is already staged at another staging_target_path on this node"
                    f" (NodeStageVolume {ago(mem.clock() - max(others))}, not unstaged since);"
                    " the CO SHALL ensure only one per volume",
                )
        yield from self._context_mismatch(cs, st, req)
        yield from self._publish_context_mismatch(cs, st, req)

    def node_publish_request(
        self, cs: CompiledSpec, st: SpecState, call: Call, req: Any
    ) -> Iterable[Violation]:
        mem = _mem(st)
        target = _norm(req.target_path)
        owner = mem.targets.get(target)
        if owner is not None and owner[0] != req.volume_id:
            yield Violation(
                cs.rule("target-path-conflict"),
                "target_path",
                f"target_path is where another volume was published {ago(mem.clock() - owner[1])}"
                " and not unpublished since; the CO SHALL ensure uniqueness of target_path per"
                " volume",
            )
        if self.f.v1:
            vol = mem.volumes.get(req.volume_id)
            first = vol.targets.get(target) if vol is not None else None
            if first is not None and first.capability != digest(
                req.volume_capability.SerializeToString(deterministic=True)
            ):
                yield Violation(
                    cs.rule("republish-different-capability"),
                    "volume_capability",
                    "NodePublishVolume again at the same target_path with another"
                    f" volume_capability than the publication {ago(mem.clock() - first.at)},"
                    " not unpublished since",
                )
        yield from self._context_mismatch(cs, st, req)
        yield from self._publish_context_mismatch(cs, st, req)

    def node_publish_response(
        self, cs: CompiledSpec, st: SpecState, call: Call, req: Any, resp: Any
    ) -> Iterable[Violation]:
        mem = _mem(st)
        vol = mem.volumes.get(req.volume_id)
        if vol is None or not vol.targets:
            return
        target = _norm(req.target_path)
        first = vol.targets.get(target)
        now = mem.clock()
        if first is not None:
            capability = digest(req.volume_capability.SerializeToString(deterministic=True))
            if first.capability != capability:
                yield Violation(
                    cs.rule("republish-answer"),
                    "",
                    "a second NodePublishVolume at the same target_path with another"
                    f" volume_capability (the first {ago(now - first.at)}) was answered OK;"
                    " the plugin SHOULD answer FAILED_PRECONDITION (the table: ALREADY_EXISTS)",
                )
        elif (
            self.f.v1
            and _mode_name(req.volume_capability) == "SINGLE_NODE_SINGLE_WRITER"
            and not _full(vol.targets)  # the same target_path may have been dropped
        ):
            latest = max(t.at for t in vol.targets.values())
            yield Violation(
                cs.rule("republish-answer"),
                "",
                "a second NodePublishVolume of a SINGLE_NODE_SINGLE_WRITER volume at another"
                f" target_path (published at {len(vol.targets)} since {ago(now - latest)}) was"
                " answered OK; the second-publish table answers FAILED_PRECONDITION",
            )

    def node_publish_error(
        self, cs: CompiledSpec, st: SpecState, call: Call, req: Any, code: str
    ) -> Iterable[Violation]:
        """CSI v1.12 §NodePublishVolume: the second-publish table answers another
        target_path of a SINGLE_NODE_SINGLE_WRITER volume with FAILED_PRECONDITION; the
        ALREADY_EXISTS row is for the same target_path."""
        if not self.f.v1 or code != "ALREADY_EXISTS":
            return
        if _mode_name(req.volume_capability) != "SINGLE_NODE_SINGLE_WRITER":
            return
        vol = _mem(st).volumes.get(req.volume_id)
        if vol is None or not vol.targets or _norm(req.target_path) in vol.targets:
            return
        if _full(vol.targets):
            return  # the same target_path may have been dropped
        latest = max(t.at for t in vol.targets.values())
        yield Violation(
            cs.rule("republish-answer"),
            "",
            "a second NodePublishVolume of a SINGLE_NODE_SINGLE_WRITER volume at another"
            f" target_path (published at {len(vol.targets)} since"
            f" {ago(_mem(st).clock() - latest)}) was answered ALREADY_EXISTS, the row for the"
            " same target_path; the second-publish table answers FAILED_PRECONDITION",
            party=PLUGIN,
        )

    def staged(self, st: SpecState, call: Call, req: Any, resp: Any) -> None:
        if not req.volume_id:
            return
        mem = _mem(st)
        vol = mem.volume(req.volume_id)
        path = _norm(req.staging_target_path)
        vol.staged.pop(path, None)
        vol.staged[path] = mem.clock()
        _trim(vol.staged)
        vol.empty_since = None

    def _emptied(self, mem: VolumeMemory, vol: _Volume, by: str) -> None:
        if not vol.in_use():
            vol.empty_since, vol.empty_by = mem.clock(), by

    def unstaged(self, st: SpecState, call: Call, req: Any, resp: Any) -> None:
        mem = _mem(st)
        vol = mem.volumes.get(req.volume_id)
        if vol is not None and vol.staged.pop(_norm(req.staging_target_path), None) is not None:
            self._emptied(mem, vol, "NodeUnstageVolume")

    def published(self, st: SpecState, call: Call, req: Any, resp: Any) -> None:
        if not req.volume_id:
            return
        mem = _mem(st)
        now = mem.clock()
        vol = mem.volume(req.volume_id)
        target = _norm(req.target_path)
        vol.targets.pop(target, None)
        vol.targets[target] = _Target(
            digest(req.volume_capability.SerializeToString(deterministic=True)), now
        )
        _trim(vol.targets)
        vol.empty_since = None
        mem.targets[target] = (req.volume_id, now)

    def unpublished(self, st: SpecState, call: Call, req: Any, resp: Any) -> None:
        mem = _mem(st)
        target = _norm(req.target_path)
        owner = mem.targets.get(target)
        if owner is not None and owner[0] == req.volume_id:
            del mem.targets[target]
        vol = mem.volumes.get(req.volume_id)
        if vol is not None and vol.targets.pop(target, None) is not None:
            self._emptied(mem, vol, "NodeUnpublishVolume")

    def node_unstage_error(
        self, cs: CompiledSpec, st: SpecState, call: Call, req: Any, code: str
    ) -> Iterable[Violation]:
        if code == "NOT_FOUND":  # the volume is gone: nothing stays staged
            self.unstaged(st, call, req, None)
        return ()

    def node_unpublish_error(
        self, cs: CompiledSpec, st: SpecState, call: Call, req: Any, code: str
    ) -> Iterable[Violation]:
        if code == "NOT_FOUND":
            self.unpublished(st, call, req, None)
        return ()

    def in_use(self, st: SpecState, call: Call, req: Any, resp: Any) -> None:
        mem = _mem(st)
        vol = mem.volumes.get(req.volume_id)
        if vol is not None:
            mem.volumes[req.volume_id] = vol  # kubelet polls mounted volumes: keep it

    # -- order ------------------------------------------------------------------------

    def not_controller_published(
        self, cs: CompiledSpec, st: SpecState, call: Call, req: Any, code: str
    ) -> Iterable[Violation]:
        """NodeStage/NodePublish of a volume created here and not ControllerPublished to this
        node, judged on the plugin's refusal: the publish may have passed through another
        HA replica, and then the plugin stages or publishes it fine."""
        node = st.node_id
        if code not in ("FAILED_PRECONDITION", "NOT_FOUND") or node is None:
            return
        if csi_order.stage_judged(call):
            return  # reported at the request already (csi_order)
        if getattr(req, self.f.publish_context):
            return  # the CO passes what some ControllerPublishVolume returned
        mem = _mem(st)
        vol = mem.volumes.get(req.volume_id)
        if vol is None or vol.created_at is None or vol.in_use():
            return
        pubs = st.publications.get(req.volume_id)
        if pubs and (node in pubs or _full(pubs)):
            return
        if st.publications.dropped_after(vol.created_at):
            return  # a publish to the node may have been dropped to make room
        controller = st.known_capabilities("controller")
        if controller is None or "PUBLISH_UNPUBLISH_VOLUME" not in controller:
            return
        rpc = call.method.name
        if rpc == "NodePublishVolume":
            # With STAGE_UNSTAGE_VOLUME the order is judged at NodeStageVolume.
            nodecaps = st.known_capabilities("node")
            if nodecaps is None or "STAGE_UNSTAGE_VOLUME" in nodecaps:
                return
        yield Violation(
            cs.rule("call-order"),
            "volume_id",
            f"{rpc} of a volume CreateVolume returned {ago(mem.clock() - vol.created_at)} and"
            " not ControllerPublished to this node through this socket, while the controller"
            f" advertises PUBLISH_UNPUBLISH_VOLUME; the plugin answered {code}",
            enforceable=False,
        )

    def node_expand_request(
        self, cs: CompiledSpec, st: SpecState, call: Call, req: Any
    ) -> Iterable[Violation]:
        mem = _mem(st)
        vol = mem.volumes.get(req.volume_id)
        if vol is None or vol.in_use() or vol.empty_since is None:
            return
        yield Violation(
            cs.rule("call-order"),
            "volume_id",
            "NodeExpandVolume of a volume neither staged nor published on this node"
            f" ({vol.empty_by} {ago(mem.clock() - vol.empty_since)}); it MUST follow"
            " NodeStageVolume or NodePublishVolume",
            enforceable=False,
        )

    def _published_where(self, st: SpecState, mem: VolumeMemory, vid: str) -> str | None:
        now = mem.clock()
        pubs = st.publications.get(vid)
        if pubs:
            latest = max(p.at for p in pubs.values())
            return f"ControllerPublished to {len(pubs)} node(s), the latest {ago(now - latest)}"
        vol = mem.volumes.get(vid)
        if vol is not None and vol.in_use():
            since = min([*vol.staged.values(), *(t.at for t in vol.targets.values())])
            return f"staged or published on this node since {ago(now - since)}"
        return None

    def controller_expanded(self, st: SpecState, call: Call, req: Any, resp: Any) -> None:
        if resp is not None:
            _mem(st).confirmed("controller", req.volume_id, resp.capacity_bytes, call.method.name)

    def node_expanded(self, st: SpecState, call: Call, req: Any, resp: Any) -> None:
        if resp is not None:
            _mem(st).confirmed("node", req.volume_id, resp.capacity_bytes, call.method.name)

    def _already_large(
        self, cs: CompiledSpec, st: SpecState, call: Call, req: Any, side: str
    ) -> Iterable[Violation]:
        """OUT_OF_RANGE to a target the volume was confirmed to reach already."""
        mem = _mem(st)
        known = mem.sizes.get((side, req.volume_id))
        cr = req.capacity_range
        target = cr.required_bytes or cr.limit_bytes
        if known is None or target <= 0 or target > known[0]:
            return
        yield Violation(
            cs.rule("expand-already-large-refused"),
            "capacity_range",
            f"{call.method.name} to {target} bytes answered OUT_OF_RANGE, but {known[1]}"
            f" answered {known[0]} bytes for this volume {ago(mem.clock() - known[2])}: a"
            " volume already that large SHOULD get 0 OK",
            party=PLUGIN,
        )

    def node_expand_error(
        self, cs: CompiledSpec, st: SpecState, call: Call, req: Any, code: str
    ) -> Iterable[Violation]:
        if code == "OUT_OF_RANGE":
            yield from self._already_large(cs, st, call, req, "node")

    def controller_expand_request(
        self, cs: CompiledSpec, st: SpecState, call: Call, req: Any
    ) -> Iterable[Violation]:
        """§ControllerExpandVolume: with OFFLINE expansion only, a volume published or in use
        on a node is expanded only after it was unpublished (or unstaged) there."""
        plugin = st.known_capabilities("plugin")
        if plugin is None or "OFFLINE" not in plugin or "ONLINE" in plugin:
            return
        mem = _mem(st)
        vid = req.volume_id
        where = None
        vol = mem.volumes.get(vid)
        if vol is not None and vol.in_use():
            since = min([*vol.staged.values(), *(t.at for t in vol.targets.values())])
            where = f"staged or published on this node since {ago(mem.clock() - since)}"
        else:
            for node, pub in (st.publications.get(vid) or {}).items():
                if self._trusted(mem, st, vid, node, pub.at):
                    where = f"ControllerPublished {ago(mem.clock() - pub.at)} and not unpublished"
                    break
        if where is None:
            return
        call.stage_state[_EXPAND_JUDGED] = True
        yield Violation(
            cs.rule("call-order"),
            "volume_id",
            f"ControllerExpandVolume of a volume {where} while the plugin advertises only"
            " OFFLINE expansion; it MUST be unpublished first",
            enforceable=False,
        )

    def controller_expand_error(
        self, cs: CompiledSpec, st: SpecState, call: Call, req: Any, code: str
    ) -> Iterable[Violation]:
        if code == "OUT_OF_RANGE":
            yield from self._already_large(cs, st, call, req, "controller")
        if code != "FAILED_PRECONDITION" or call.stage_state.get(_EXPAND_JUDGED):
            return
        plugin = st.known_capabilities("plugin")
        if plugin is None:
            return
        where = self._published_where(st, _mem(st), req.volume_id)
        if where is None:
            return
        if "OFFLINE" in plugin and "ONLINE" not in plugin:
            # The plugin's "volume in use" confirms the publication the proxy saw.
            yield Violation(
                cs.rule("call-order"),
                "volume_id",
                f"ControllerExpandVolume of a volume {where} while the plugin advertises only"
                " OFFLINE expansion; it MUST be unpublished first (the plugin answered"
                " FAILED_PRECONDITION)",
                party=CO,
                enforceable=False,
            )
            return
        controller = st.known_capabilities("controller")
        if "ONLINE" in plugin and controller is not None and "EXPAND_VOLUME" in controller:
            yield Violation(
                cs.rule("expand-published-refused"),
                "",
                f"ControllerExpandVolume of a volume {where} answered FAILED_PRECONDITION"
                " although the plugin advertises ONLINE expansion and controller EXPAND_VOLUME",
                party=PLUGIN,
            )


def hooks(title: str, v1: bool) -> Hooks:
    """The family's rules and checks for the CSI version cited as ``title``."""
    c = VolumeChecks(V1 if v1 else V0)
    request: dict[str, tuple[Any, ...]] = {
        "ControllerPublishVolume": (c.controller_publish_request,),
        "ControllerUnpublishVolume": (c.controller_unpublish_request,),
        "ValidateVolumeCapabilities": (c.validate_request,),
        "NodeStageVolume": (c.node_stage_request,),
        "NodePublishVolume": (c.node_publish_request,),
    }
    response: dict[str, tuple[Any, ...]] = {
        "CreateVolume": (c.create_volume_response,),
        "ListVolumes": (c.list_volumes_response,),
        "ControllerPublishVolume": (c.controller_publish_response,),
        "NodePublishVolume": (c.node_publish_response,),
        "NodeGetInfo": (c.node_info_response,),
    }
    success: dict[str, tuple[Any, ...]] = {
        "CreateVolume": (c.created,),
        "DeleteVolume": (c.deleted,),
        "ControllerPublishVolume": (c.controller_published,),
        "ControllerUnpublishVolume": (c.controller_unpublished,),
        "NodeStageVolume": (c.staged,),
        "NodeUnstageVolume": (c.unstaged,),
        "NodePublishVolume": (c.published,),
        "NodeUnpublishVolume": (c.unpublished,),
    }
    error: dict[str, tuple[Any, ...]] = {
        "ControllerPublishVolume": (c.controller_publish_error,),
        "DeleteVolume": (c.delete_volume_error,),
        "ControllerUnpublishVolume": (c.controller_unpublish_error,),
        "NodeStageVolume": (c.not_controller_published,),
        "NodeUnstageVolume": (c.node_unstage_error,),
        "NodePublishVolume": (c.not_controller_published, c.node_publish_error),
        "NodeUnpublishVolume": (c.node_unpublish_error,),
    }
    needs: dict[str, tuple[str, ...]] = {}
    if v1:
        request |= {
            "ControllerExpandVolume": (c.controller_expand_request,),
            "NodeExpandVolume": (c.node_expand_request,),
            "ControllerGetVolume": (c.controller_get_volume_request,),
        }
        response |= {"ControllerGetVolume": (c.controller_get_volume_response,)}
        success |= {
            "NodeGetVolumeStats": (c.in_use,),
            "ControllerExpandVolume": (c.controller_expanded,),
            "NodeExpandVolume": (c.node_expanded,),
        }
        error |= {
            "ControllerExpandVolume": (c.controller_expand_error,),
            "NodeExpandVolume": (c.node_expand_error,),
        }
        # ONLINE/OFFLINE expansion is a plugin capability, EXPAND_VOLUME a controller one.
        needs = {"ControllerExpandVolume": ("plugin", "controller")}
    return Hooks(
        rules=_rules(title, v1),
        request_checks=request,
        response_checks=response,
        on_success=success,
        on_error=error,
        capability_needs=needs,
    )
