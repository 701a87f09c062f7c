"""Every bound the frame relay keeps on a peer, in one table.

Each limit applies to each side on its own: the CO's connection and the plugin's connection
have their own windows, header budgets and counters. docs/hardening.md shows this table
(generated from ``NOTES``) with the memory the bounds imply.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

MAX_WINDOW = 2**31 - 1  # RFC 9113 §6.9.1
DEFAULT_WINDOW = 65_535  # RFC 9113 §6.9.2: every window starts here
MIN_MAX_FRAME, MAX_MAX_FRAME = 16_384, 2**24 - 1  # RFC 9113 §6.5.2


@dataclass(frozen=True, slots=True)
class Limits:
    """Bounds per peer. What we advertise in SETTINGS is also what we enforce."""

    max_frame_size: int = 16_384
    max_header_list_size: int = 65_536
    max_header_block_bytes: int = 65_536
    header_block_seconds: float = 10.0
    max_continuation_frames: int = 32
    max_concurrent_streams: int = 1_000
    stream_window: int = 1 << 20
    connection_window: int = 4 << 20
    max_queued_control_frames: int = 10_000
    reset_burst: int = 1_000
    reset_rate: float = 33.0
    closed_streams_remembered: int = 1_024
    collect_budget: int = 32 << 20

    def rows(self) -> list[tuple[str, float, str, str]]:
        """(name, value, what, source) per limit: the table in docs/hardening.md."""
        return [(f.name, getattr(self, f.name), *NOTES[f.name]) for f in fields(self)]


# What each limit bounds, and where the rule or the number comes from.
NOTES: dict[str, tuple[str, str]] = {
    "max_frame_size": (
        "largest frame accepted (SETTINGS_MAX_FRAME_SIZE, left at its default); a larger one "
        "is a FRAME_SIZE_ERROR before its payload is read",
        "RFC 9113 §4.2",
    ),
    "max_header_list_size": (
        "decoded size of one header block (name + value + 32 per field, advertised as "
        "SETTINGS_MAX_HEADER_LIST_SIZE); decoding stops as soon as it is passed",
        "RFC 9113 §6.5.2, RFC 7541 §4.1",
    ),
    "max_header_block_bytes": (
        "encoded bytes of one header block (HEADERS + CONTINUATION), checked as each "
        "fragment arrives",
        "RFC 9113 §10.5.1",
    ),
    "header_block_seconds": (
        "time a header block may stay open between HEADERS and its last CONTINUATION",
        "RFC 9113 §10.5.1",
    ),
    "max_continuation_frames": (
        "CONTINUATION frames one header block may take (nghttp2 allows 8); empty ones cost "
        "no bytes, so the byte bound alone would not stop them",
        "RFC 9113 §10.5, CVE-2024-27316",
    ),
    "max_concurrent_streams": (
        "streams one CO connection may have open (advertised as SETTINGS_MAX_CONCURRENT_"
        "STREAMS); one more is refused with REFUSED_STREAM, which gRPC clients retry",
        "RFC 9113 §5.1.2",
    ),
    "stream_window": (
        "bytes a peer may send on one stream before we credit it (SETTINGS_INITIAL_WINDOW_"
        "SIZE, both sides); credit is given back only as the bytes move on",
        "RFC 9113 §6.9.2",
    ),
    "connection_window": (
        "bytes a peer may send on all streams of one connection before we credit it",
        "RFC 9113 §6.9.1",
    ),
    "max_queued_control_frames": (
        "replies (SETTINGS and PING acknowledgements, RST_STREAM) queued for a peer that "
        "does not read them; past it, GOAWAY ENHANCE_YOUR_CALM (as Go's x/net/http2)",
        "RFC 9113 §10.5",
    ),
    "reset_burst": (
        "streams a peer may reset before they finish, in one burst (nghttp2's default)",
        "CVE-2023-44487",
    ),
    "reset_rate": (
        "resets per second that refill the burst; past it, GOAWAY ENHANCE_YOUR_CALM",
        "CVE-2023-44487",
    ),
    "closed_streams_remembered": (
        "ids of streams we reset whose late frames are dropped rather than answered",
        "RFC 9113 §5.1",
    ),
    "collect_budget": (
        "request bytes one CO connection may have gathered for the stages (whole messages "
        "held or judged) and not yet sent on; past it, only the stream holding bytes "
        "longest is credited, and the connection window is withheld",
        "plugproxy",
    ),
}

DEFAULT_LIMITS = Limits()
