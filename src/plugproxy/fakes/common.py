"""Small pieces shared by every fake plugin: the error type and message helpers."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import grpc

# A message of one of the dynamic per-spec classes. Its fields are only known from the
# descriptors at runtime, so static typing cannot follow them; plugin code that reads and
# writes fields uses this alias, the generic plumbing uses google.protobuf Message.
DynMessage = Any

MetadataPairs = tuple[tuple[str, str | bytes], ...]

# The grpc.aio.ServicerContext of a call; grpcio ships without type information.
ServicerContext = Any


class FakeError(Exception):
    """Raised by a fake plugin method: the call ends with this status.

    ``trailing`` is extra trailing metadata; only the misbehaviour catalogue sets it (a
    well-behaved plugin never sends status details).
    """

    def __init__(self, code: grpc.StatusCode, message: str, trailing: MetadataPairs = ()) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.trailing = trailing

    def __repr__(self) -> str:
        return f"FakeError({self.code.name}, {self.message!r})"


def invalid(message: str) -> FakeError:
    return FakeError(grpc.StatusCode.INVALID_ARGUMENT, message)


def not_found(message: str) -> FakeError:
    return FakeError(grpc.StatusCode.NOT_FOUND, message)


def already_exists(message: str) -> FakeError:
    return FakeError(grpc.StatusCode.ALREADY_EXISTS, message)


def precondition(message: str) -> FakeError:
    return FakeError(grpc.StatusCode.FAILED_PRECONDITION, message)


def out_of_range(message: str) -> FakeError:
    return FakeError(grpc.StatusCode.OUT_OF_RANGE, message)


def exhausted(message: str) -> FakeError:
    return FakeError(grpc.StatusCode.RESOURCE_EXHAUSTED, message)


def aborted(message: str) -> FakeError:
    return FakeError(grpc.StatusCode.ABORTED, message)


def require(value: object, field: str) -> None:
    """INVALID_ARGUMENT when a REQUIRED field is empty (scalars, maps and lists alike)."""
    if not value:
        raise invalid(f"{field} is required")


def has_field(msg: DynMessage, name: str) -> bool:
    """True when a singular message field is present on the wire."""
    return bool(msg.HasField(name))


def has_descriptor_field(msg: DynMessage, name: str) -> bool:
    """Whether the message type declares a field called ``name`` (v0 and v1 differ)."""
    return name in msg.DESCRIPTOR.fields_by_name


def enum_name(msg: DynMessage, field: str) -> str:
    """Name of the enum value held in ``msg.<field>`` ('UNKNOWN' style names)."""
    fd = msg.DESCRIPTOR.fields_by_name[field]
    value = getattr(msg, field)
    ev = fd.enum_type.values_by_number.get(value)
    return ev.name if ev is not None else str(value)


def enum_number(msg_or_class: DynMessage, field: str, name: str) -> int:
    """Number of enum value ``name`` for ``field`` of a message (class or instance)."""
    fd = msg_or_class.DESCRIPTOR.fields_by_name[field]
    return int(fd.enum_type.values_by_name[name].number)


def set_map(target: DynMessage, values: Mapping[str, str]) -> None:
    """Replace a map<string,string> field's content."""
    target.clear()
    target.update(values)


def deterministic_key(msg: DynMessage) -> bytes:
    """Stable bytes for comparing two messages for equality of content."""
    return bytes(msg.SerializeToString(deterministic=True))


def sorted_pairs(values: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(values.items()))


def first_nonempty(msg: DynMessage, fields: Sequence[str]) -> str | None:
    """Value of the first non-empty string field among ``fields`` that the type declares."""
    declared = msg.DESCRIPTOR.fields_by_name
    for name in fields:
        fd = declared.get(name)
        if fd is None or fd.type != fd.TYPE_STRING or fd.is_repeated:
            continue
        value = getattr(msg, name)
        if value:
            return str(value)
    return None


def add_capabilities(response: DynMessage, kind: str, names: Iterable[str]) -> None:
    """Append ``capabilities`` entries whose oneof member ``kind`` has enum ``type`` = name."""
    for name in names:
        inner = getattr(response.capabilities.add(), kind)
        inner.type = enum_number(inner, "type", name)
