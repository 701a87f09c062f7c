"""Small helpers of the rules that remember: digests instead of values, and ages in messages.

A stateful rule keeps what it must compare as a digest (a context, a secret map, a request),
never the value, which may be secret; its message says how long ago it saw the earlier state.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

# Memory of a controller-side answer that only this replica saw is trusted this long: a
# Kubernetes sidecar's leader-election lease lasts 15 s, so no other replica can have
# taken over and undone (or redone) the call in less time.
HANDOVER = 15.0


def digest(data: bytes) -> bytes:
    return hashlib.blake2b(data, digest_size=16).digest()


def parts_digest(*parts: bytes) -> bytes:
    """One digest of several byte strings, each length-prefixed so none can run into another."""
    h = hashlib.blake2b(digest_size=16)
    for part in parts:
        h.update(len(part).to_bytes(4, "big"))
        h.update(part)
    return h.digest()


def map_digest(values: Mapping[str, str]) -> bytes:
    """One digest of a map<string,string>, independent of order; empty maps digest alike."""
    return parts_digest(
        *(p for key in sorted(values) for p in (key.encode(), values[key].encode()))
    )


def message_digest(message: Any) -> bytes:
    """A digest of a protobuf message's fields, whatever order its maps were sent in."""
    return digest(message.SerializeToString(deterministic=True))


def ago(seconds: float) -> str:
    """'12s ago', '5m ago', '2h ago'; 'just before' within the second."""
    s = int(max(seconds, 0.0))
    if s < 1:
        return "just before"
    if s < 120:
        return f"{s}s ago"
    if s < 7200:
        return f"{s // 60}m ago"
    return f"{s // 3600}h ago"
