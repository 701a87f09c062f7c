"""The limits table: every bound documented, every note a bound."""

from __future__ import annotations

from dataclasses import fields

from plugproxy.relay.limits import DEFAULT_LIMITS, MAX_WINDOW, NOTES, Limits


def test_every_limit_has_a_note_and_every_note_a_limit():
    assert {f.name for f in fields(Limits)} == set(NOTES)
    for name, value, what, source in DEFAULT_LIMITS.rows():
        assert value > 0, name
        assert what and source, name


def test_advertised_windows_are_legal_http2_values():
    # RFC 9113 §6.5.2 / §6.9.1: windows at most 2^31-1; frames at least 16,384.
    assert DEFAULT_LIMITS.stream_window <= MAX_WINDOW
    assert DEFAULT_LIMITS.connection_window <= MAX_WINDOW
    assert DEFAULT_LIMITS.max_frame_size >= 16_384
    # One message of the collect budget must fit in what a connection may send.
    assert DEFAULT_LIMITS.stream_window <= DEFAULT_LIMITS.connection_window
