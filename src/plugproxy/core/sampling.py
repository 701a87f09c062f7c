"""Large messages judged and logged from a sample of their long lists, the rest never decoded.

A 10,000-entry ListVolumes page is about 1 MB; decoding it whole takes longer than relaying
it. Rules and the call log need only part of it: response rules judge a bounded spread of
a list's entries (``plugproxy.rules.engine.RESPONSE_SAMPLE``), and a logged payload stops at
a few kilobytes.

For every message type with repeated message fields at the top level, a *skeleton* type is
built once at startup: the same field numbers, those fields read as raw bytes, every other
field left unknown (upb keeps unknown fields and writes them back). Parsing the skeleton
only finds where each entry starts and ends. The skeleton keeps only the entries picked and
is written out again, then decoded as one small message of the real type (the same bytes
under the same field numbers); the others stay bytes.

Entries kept of a list of ``n > SAMPLE_SIZE``: the first half of the sample in order (what a
log line shows), then the other half spread evenly over the rest, the last entry included
(what catches a plugin that goes wrong late in a page). :class:`Sample` remembers the real
index of each kept entry and the real length of each cut list.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import DecodeError, Message

# Messages smaller than this are decoded whole: sampling would save nothing worth its cost.
SAMPLE_MIN_BYTES = 64 * 1024
# Entries kept of one list: its first half is more than a logged payload shows at the default
# 4 KiB (or at 16 KiB), and the response rules' own spread (128 entries) covers all of it.
SAMPLE_SIZE = 256

_BYTES = descriptor_pb2.FieldDescriptorProto.TYPE_BYTES
_REPEATED = descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED


@dataclass(frozen=True, slots=True)
class Sample:
    """A message of the real type holding only the kept entries of its cut lists."""

    message: Message
    totals: Mapping[str, int]  # cut field -> how many entries the wire message holds
    indices: Mapping[str, Sequence[int]]  # cut field -> real index of each kept entry
    # cut field -> each kept entry's wire bytes, in the order of message's list: what
    # judged an entry before can know it again without reading it.
    raw: Mapping[str, Sequence[bytes]]
    skeleton: Message  # the skeleton, its cut lists empty (see subset)

    def subset(self, keep: Mapping[str, Sequence[int]]) -> Message:
        """The message with only the entries at ``keep[field]`` (positions in the sample) of
        each cut list named there; written and read by upb, not entry by entry."""
        skeleton = self.skeleton
        for name, raws in self.raw.items():
            positions = keep.get(name)
            getattr(skeleton, name).extend(
                raws if positions is None else [raws[p] for p in positions]
            )
        try:
            data = skeleton.SerializeToString()
        finally:
            for name in self.raw:
                del getattr(skeleton, name)[:]
        return type(self.message).FromString(data)


def picked_indices(n: int, size: int = SAMPLE_SIZE) -> list[int]:
    """Which of ``n`` entries a sample of ``size`` keeps: a head, then a spread to the end."""
    if n <= size:
        return list(range(n))
    head = size // 2
    spread = size - head
    rest = n - head
    # spread points over [head, n), the first at head and the last at n - 1.
    if spread == 1:
        return [*range(head), n - 1]
    return [*range(head), *(head + (rest - 1) * i // (spread - 1) for i in range(spread))]


def varint(value: int) -> bytes:
    """Protobuf's base-128 varint of a non-negative integer."""
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


class Skeleton:
    """Reads one message type's top-level repeated message fields as raw entries."""

    def __init__(self, descriptor: Descriptor, fields: Sequence[FieldDescriptor]) -> None:
        package = "plugproxy_skeleton." + descriptor.full_name.replace(".", "_")
        proto = descriptor_pb2.FileDescriptorProto(
            name=f"plugproxy_skeleton/{descriptor.full_name}.proto",
            package=package,
            syntax="proto3",
        )
        shape = proto.message_type.add(name="Skeleton")
        for fd in fields:
            shape.field.add(name=fd.name, number=fd.number, type=_BYTES, label=_REPEATED)
        pool = descriptor_pool.DescriptorPool()
        pool.Add(proto)
        shape_descriptor = pool.FindMessageTypeByName(package + ".Skeleton")
        self.cls = message_factory.GetMessageClass(shape_descriptor)
        self.fields = tuple((fd.name, fd.number) for fd in fields)

    def sample(self, raw: bytes, cls: type[Message], size: int = SAMPLE_SIZE) -> Sample | None:
        """The sampled message, or None when no list is longer than ``size`` or the bytes do
        not parse (the caller then decodes ``raw`` whole and reports what is wrong)."""
        try:
            skeleton = self.cls.FromString(raw)
        except DecodeError:
            return None
        totals: dict[str, int] = {}
        indices: dict[str, list[int]] = {}
        kept_raw: dict[str, list[bytes]] = {}
        for name, _ in self.fields:
            entries = getattr(skeleton, name)
            n = len(entries)
            if n <= size:
                continue
            picked = picked_indices(n, size)
            totals[name] = n
            indices[name] = picked
            # Kept in the skeleton, so upb writes their tags and lengths (in C), in order.
            kept = kept_raw[name] = [entries[i] for i in picked]
            del entries[:]
            entries.extend(kept)
        if not totals:
            return None
        try:
            message = cls.FromString(skeleton.SerializeToString())
        except DecodeError:
            return None
        for name in kept_raw:
            del getattr(skeleton, name)[:]
        return Sample(message, totals, indices, kept_raw, skeleton)


def _list_fields(descriptor: Descriptor) -> list[FieldDescriptor]:
    return [
        fd
        for fd in descriptor.fields
        if fd.is_repeated
        and fd.message_type is not None
        and not fd.message_type.GetOptions().map_entry
    ]


_SKELETONS: dict[type[Message], Skeleton | None] = {}


def prepare(cls: type[Message]) -> Skeleton | None:
    """Build (once) the skeleton of ``cls``; None when it has no list to cut."""
    if cls in _SKELETONS:
        return _SKELETONS[cls]
    descriptor: Any = cls.DESCRIPTOR
    fields = _list_fields(descriptor)
    skeleton = Skeleton(descriptor, fields) if fields else None
    _SKELETONS[cls] = skeleton
    return skeleton


def skeleton_of(cls: type[Message]) -> Skeleton | None:
    """The skeleton of ``cls`` if it was prepared (by the registry, listing its spec)."""
    return _SKELETONS.get(cls)
