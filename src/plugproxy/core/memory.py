"""Small helpers of the rules that remember: digests instead of values, ages in messages, and
a bounded map whose entries expire.

A stateful rule keeps what it must compare as a digest (a context, a secret map, a request),
never the value, which may be secret; its message says how long ago it saw the earlier state.
"""

from __future__ import annotations

import hashlib
import math
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Generic, TypeVar, overload

K = TypeVar("K")
V = TypeVar("V")
D = TypeVar("D")

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


def remember(table: dict[K, V], key: K, value: V, limit: int) -> None:
    """Set ``key`` in a table kept to ``limit`` entries, the oldest set dropped first: for
    memories whose values depend only on their key (an entry's bytes), so nothing expires
    and no ExpiringMap is needed. Give it an OrderedDict when ``limit`` is more than a few
    hundred: a plain dict emptied from the front scans the holes left there, 82,000
    instructions to drop one of 20,000 entries against a few hundred (bench/mapcost.py)."""
    table[key] = value
    if len(table) > limit:
        if isinstance(table, OrderedDict):
            table.popitem(last=False)
        else:
            del table[next(iter(table))]


_MISSING: Any = object()


# An entry's set time is read back as its expiry minus the TTL, which may round it by an
# ulp: a drop counts as after a time this close to it (erring toward forgetting).
_SLACK = 1e-6


class ExpiringMap(Generic[K, V]):
    """A map holding at most ``maxsize`` entries, each for ``ttl`` seconds after it was last
    set (a set refreshes it); when full, the entry set longest ago goes first.

    Forgetting, by age or by the bound, may cost a rule a violation, never make one: a
    rule finding no entry judges nothing. Where a rule takes a key's absence as evidence
    instead ("no unpublish was sent since"), it asks :meth:`dropped_after` first: an entry
    dropped to make room is no evidence that nothing happened.

    Built for the rules' per-entry paths (a listing judges hundreds of volumes a call): every
    operation is O(1) amortised on one C ordered dict, with no lock, link object or timer
    wrapper per entry. Entries are kept in the order they were last set, which is also the
    order they expire in (one ``ttl`` for all), so expiry only ever looks at the front. An
    entry is alive while ``clock() < set time + ttl``; ``get``, ``in`` and ``[]`` never
    refresh it, :meth:`touch` does.
    """

    __slots__ = ("_clock", "_data", "_dropped", "maxsize", "ttl")

    def __init__(
        self, maxsize: int, ttl: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if maxsize < 1 or ttl <= 0:
            raise ValueError("an ExpiringMap needs maxsize >= 1 and ttl > 0")
        self.maxsize = maxsize
        self.ttl = ttl
        self._clock = clock
        self._data: OrderedDict[K, tuple[float, V]] = OrderedDict()  # key -> (expiry, value)
        self._dropped = -math.inf  # set time of the newest entry dropped to make room

    def _expire(self, now: float) -> None:
        data = self._data
        while data:
            oldest = next(iter(data))
            if now < data[oldest][0]:
                return
            del data[oldest]

    def __setitem__(self, key: K, value: V) -> None:
        now = self._clock()
        data = self._data
        if data and not now < data[next(iter(data))][0]:  # the oldest expired: maybe more
            self._expire(now)
        if key in data:
            data.move_to_end(key)
        data[key] = (now + self.ttl, value)
        if len(data) > self.maxsize:
            self._dropped = data.popitem(last=False)[1][0] - self.ttl

    def dropped_after(self, when: float) -> bool:
        """Whether an entry set at ``when`` or later was dropped to make room: then a key
        missing here says nothing of what happened since ``when``. Entries are dropped in
        the order they were set, so one time tells."""
        return self._dropped + _SLACK >= when

    def lossy(self) -> bool:
        """Whether an entry that would still be alive was dropped to make room: a key
        missing here says nothing, whenever it may have been set."""
        return self.dropped_after(self._clock() - self.ttl)

    @overload
    def get(self, key: K) -> V | None: ...
    @overload
    def get(self, key: K, default: D) -> V | D: ...
    def get(self, key: K, default: Any = None) -> Any:
        entry = self._data.get(key)
        if entry is None or not self._clock() < entry[0]:
            return default
        return entry[1]

    def touch(self, key: K) -> V | None:
        """The value of ``key`` with its ``ttl`` started again (as setting it again would,
        in one step); None when it is absent or expired."""
        data = self._data
        entry = data.get(key)
        if entry is None:
            return None
        now = self._clock()
        if not now < entry[0]:
            return None
        data.move_to_end(key)
        data[key] = (now + self.ttl, entry[1])
        return entry[1]

    def __getitem__(self, key: K) -> V:
        entry = self._data.get(key)
        if entry is None or not self._clock() < entry[0]:
            raise KeyError(key)
        return entry[1]

    def __contains__(self, key: object) -> bool:
        entry = self._data.get(key)  # type: ignore[arg-type]
        return entry is not None and self._clock() < entry[0]

    @overload
    def pop(self, key: K) -> V: ...
    @overload
    def pop(self, key: K, default: V | D) -> V | D: ...
    def pop(self, key: K, default: Any = _MISSING) -> Any:
        """Remove ``key``; its value if it was alive, else ``default`` (KeyError if none)."""
        entry = self._data.pop(key, None)
        if entry is not None and self._clock() < entry[0]:
            return entry[1]
        if default is _MISSING:
            raise KeyError(key)
        return default

    def __delitem__(self, key: K) -> None:
        self.pop(key)

    def __len__(self) -> int:
        self._expire(self._clock())
        return len(self._data)

    def __iter__(self) -> Iterator[K]:
        """The keys alive now, the one set longest ago first."""
        self._expire(self._clock())
        return iter(list(self._data))

    def clear(self) -> None:
        self._data.clear()
