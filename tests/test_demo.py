"""`plugproxy demo` as a new user runs it: the lifecycle, violations, metrics, redacted log."""

from __future__ import annotations

import subprocess
import sys

from plugproxy.demo import LIFECYCLE, SECRET


def test_demo_runs_the_lifecycle_and_shows_each_capability():
    result = subprocess.run(
        [sys.executable, "-m", "plugproxy", "demo"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert f"{len(LIFECYCLE)}/{len(LIFECYCLE)} calls succeeded" in out
    for path, _ in LIFECYCLE:
        assert path in out
    # a CO-side and a plugin-side breach, each under its rule
    assert "csi.name-banned-characters" in out
    assert "csi.capacity-out-of-range" in out
    # whose answer each outcome is: audit mode lets the bad request reach the plugin
    assert "the proxy lets it through, the fake plugin answers INVALID_ARGUMENT" in out
    assert 'driver_name="unknown-driver"' not in out  # the first call already has the name
    assert "plugproxy_rpc_duration_seconds_count" in out
    assert '"password":"***"' in out
    assert "appears in the proxy's log: no" in out
    assert SECRET not in out + result.stderr
