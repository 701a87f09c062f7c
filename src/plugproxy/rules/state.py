"""What the validation stage remembers between calls: capabilities, volume lifecycles and
controller publications.

Everything here is learned from calls seen on the wire, bounded in memory and forgotten
with time: capabilities expire after a TTL, volumes live in bounded, expiring maps
(:class:`~plugproxy.core.memory.ExpiringMap`) that drop what was not updated for an hour
(the one updated longest ago first when full). Only what
the proxy saw counts: a volume it never saw staged is not "unstaged", it is unknown, and
unknown history is never a violation. Memory that went stale (an HA peer relayed the
next step, an answer was lost) thus ages into "unknown" instead of blocking a volume.
Forgetting by the bound (--max-remembered-objects) works the same way: a rule finding no
entry judges nothing, and one taking an absence as evidence first asks whether an entry
was dropped to make room (ExpiringMap.dropped_after), so forgetting may cost a missed
violation, never a false one.
All access happens on the event loop, so no locks are needed.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from plugproxy.core.memory import ExpiringMap

CAPABILITY_TTL = 300.0  # a plugin upgrade may change them; re-learn after five minutes
QUERY_RETRY = 30.0  # after a failed query of our own, wait this long before the next
# Call order faults show within minutes of the call they follow; older memory of a volume
# nobody touched is more likely stale (another replica relayed the next step) than useful.
LIFECYCLE_TTL = 3600.0
# Objects (volumes, snapshots, nodes, paths, requests) each memory of a spec holds at most
# (--max-remembered-objects). ControllerPublishVolume of distinct volumes keeps about 2.5 KB
# of RSS per volume over four memories (bench/rsscost.py objects: +25 MiB at the bound); a
# node sees a few hundred volumes, and a controller acting on more within the hour forgets
# the one set longest ago first: unknown history, never a fault.
MAX_OBJECTS = 10_000
# Nodes, staging and target paths kept per volume (the oldest dropped first).
MAX_PER_VOLUME = 256

_Part = TypeVar("_Part")


@dataclass(slots=True)
class VolumeState:
    """What was seen of one volume id. Empty fields mean "never seen either way".

    The collections are tuples, changed with :func:`added` and :func:`removed`: most hold
    none or one item, and an empty tuple costs nothing where each empty set took 216 bytes
    (a controller remembers thousands of volumes)."""

    # Node side (this proxy's node): staging paths staged and target paths published.
    staged: tuple[str, ...] = ()
    published: tuple[str, ...] = ()
    # True once the proxy saw the volume created or unstaged: it is known not staged.
    known_unstaged: bool = False
    created_name: str = ""  # the CreateVolume name that returned this id, when seen


@dataclass(slots=True)
class Publication:
    """A successful ControllerPublishVolume of one volume to one node, as digests: what
    rules/csi_volumes, which keeps it, compares later calls with."""

    args: bytes  # digest of the request, secrets aside
    context: bytes  # digest of publish_context
    context_size: int
    secrets: bytes
    single_node: bool  # published with a single-node access mode
    at: float
    mode: bytes = b""  # digest of volume_capability and readonly


def added(items: tuple[str, ...], item: str) -> tuple[str, ...]:
    """``items`` with ``item``, held once."""
    return items if item in items else (*items, item)


def removed(items: tuple[str, ...], item: str) -> tuple[str, ...]:
    """``items`` without ``item``."""
    return tuple(x for x in items if x != item) if item in items else items


class SpecState:
    """Per-spec memory of one validation stage."""

    def __init__(
        self,
        max_volumes: int = MAX_OBJECTS,
        capability_ttl: float = CAPABILITY_TTL,
        lifecycle_ttl: float = LIFECYCLE_TTL,
        clock: Callable[[], float] = time.monotonic,
    ):
        # kind -> (names, expiry); a handful of kinds, read on every gated call
        self._capabilities: dict[str, tuple[frozenset[str], float]] = {}
        self._ttl = capability_ttl
        self._query_failed: dict[str, float] = {}
        self.volumes: ExpiringMap[str, VolumeState] = ExpiringMap(max_volumes, lifecycle_ttl, clock)
        # CreateVolume name -> (argument digest, volume id, when) of the last successful create.
        self.creates: ExpiringMap[str, tuple[bytes, str, float]] = ExpiringMap(
            max_volumes, lifecycle_ttl, clock
        )
        # Volume id -> node id -> its publication there (ControllerPublishVolume answered OK,
        # no unpublish since), the latest last; MAX_PER_VOLUME nodes a volume at most.
        self.publications: ExpiringMap[str, dict[str, Publication]] = ExpiringMap(
            max_volumes, lifecycle_ttl, clock
        )
        self.node_id: str | None = None  # this proxy's node, from NodeGetInfo
        self._parts: dict[type, object] = {}
        self.max_volumes = max_volumes
        self.lifecycle_ttl = lifecycle_ttl
        self.clock = clock

    def part(self, kind: type[_Part]) -> _Part:
        """The memory a rule family keeps for this spec, made by ``kind(self)`` on first use.

        A family module owns its state class; it bounds and expires it itself (ExpiringMap
        with ``max_volumes``, ``lifecycle_ttl`` and ``clock``), and where one of its rules
        takes an absence as evidence it asks the map's ``dropped_after`` first.
        """
        found = self._parts.get(kind)
        if found is None:
            found = self._parts[kind] = kind(self)  # type: ignore[call-arg]
        return found  # type: ignore[return-value]

    def parts(self) -> list[object]:
        """The memories the rule families made with :meth:`part` so far."""
        return list(self._parts.values())

    # -- capabilities ---------------------------------------------------------------------

    def set_capabilities(self, kind: str, names: frozenset[str]) -> None:
        self._capabilities[kind] = (names, self.clock() + self._ttl)
        self._query_failed.pop(kind, None)

    def known_capabilities(self, kind: str) -> frozenset[str] | None:
        """The capabilities of ``kind`` seen recently, or None when unknown."""
        entry = self._capabilities.get(kind)
        if entry is None:
            return None
        if entry[1] < self.clock():
            del self._capabilities[kind]
            return None
        return entry[0]

    def may_query(self, kind: str) -> bool:
        failed = self._query_failed.get(kind)
        return failed is None or self.clock() - failed > QUERY_RETRY

    def query_failed(self, kind: str) -> None:
        self._query_failed[kind] = self.clock()

    # -- lifecycle ------------------------------------------------------------------------

    def volume(self, volume_id: str) -> VolumeState:
        """The state of ``volume_id`` to update, created if need be; its TTL starts again."""
        state = self.volumes.get(volume_id)
        if state is None:
            state = VolumeState()
        self.volumes[volume_id] = state
        self._keep_publications(volume_id)
        return state

    def touch(self, volume_id: str) -> None:
        """Keep what is known of ``volume_id`` for another TTL (the volume is in use)."""
        state = self.volumes.get(volume_id)
        if state is not None:
            self.volumes[volume_id] = state
            self._keep_publications(volume_id)

    def peek(self, volume_id: str) -> VolumeState | None:
        return self.volumes.get(volume_id)

    def forget(self, volume_id: str) -> None:
        self.volumes.pop(volume_id, None)
        self.publications.pop(volume_id, None)

    # -- controller publications ------------------------------------------------------------

    def _keep_publications(self, volume_id: str) -> None:
        # A volume's publications live as long as what is known of the volume: a volume in
        # use on its nodes is still published there, however long ago that was.
        publications = self.publications.get(volume_id)
        if publications is not None:
            self.publications[volume_id] = publications

    def controller_nodes(self, volume_id: str) -> tuple[str, ...]:
        """The nodes ``volume_id`` is known ControllerPublished to, the latest last."""
        publications = self.publications.get(volume_id)
        return tuple(publications) if publications else ()

    def controller_published(self, volume_id: str, node_id: str, publication: Publication) -> None:
        publications = self.publications.get(volume_id) or {}
        publications.pop(node_id, None)  # re-inserted last: the oldest go first when trimmed
        publications[node_id] = publication
        while len(publications) > MAX_PER_VOLUME:
            del publications[next(iter(publications))]
        self.publications[volume_id] = publications

    def controller_unpublished(self, volume_id: str, node_id: str) -> None:
        """``volume_id`` unpublished from ``node_id``; from every node when it is empty."""
        publications = self.publications.get(volume_id)
        if publications is None:
            return
        if node_id:
            publications.pop(node_id, None)
        else:
            publications.clear()
        if not publications:
            del self.publications[volume_id]
