"""The relay's tests run on both event loops `plugproxy serve --event-loop` offers."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any

import pytest

try:
    import uvloop
except ImportError:  # pragma: no cover - the loop is optional where it does not install
    uvloop = None

# Modules whose tests run once per loop: the frame relay's conformance and limits, and the
# proxy's own connection to the plugin, which must not depend on either loop's transports.
BOTH_LOOPS = (
    "tests/test_relay_conformance.py",
    "tests/test_relay_framerelay.py",
    "tests/test_relay_limits.py",
    "tests/test_relay_upstream.py",
    "tests/integration/test_relay_limits.py",
)


def pytest_asyncio_loop_factories(
    config: pytest.Config, item: pytest.Item
) -> Mapping[str, Callable[[], asyncio.AbstractEventLoop]]:
    factories: dict[str, Any] = {"asyncio": asyncio.new_event_loop}
    path = item.nodeid.split("::", 1)[0]
    if uvloop is not None and path.startswith(BOTH_LOOPS):
        factories["uvloop"] = uvloop.new_event_loop
    return factories
