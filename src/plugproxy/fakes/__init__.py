"""Bundled fake plugins: in-memory, spec-correct CSI v1/v0, COSI, CMI, KMS v2, device
plugins and DRA kubelet plugins (with device health) for tests and demos.

``await start_fake_plugin("csi.v1", "unix:///tmp/p.sock")`` serves one in-process; the
``plugproxy fake-plugin`` command serves one as a process (see :mod:`plugproxy.fakes.cli`).
:class:`FakeKnobs` adds delays, injected status codes and the deliberate spec breaches of
:data:`MISBEHAVIOURS`.

May import: :mod:`plugproxy.core`, :mod:`plugproxy.api`, :mod:`plugproxy.spec`,
:mod:`plugproxy.stages` (the tracing stage's exporter settings, for a traced fake).
"""

from plugproxy.fakes.base import CallRecord, FakePlugin
from plugproxy.fakes.client import SpecClient
from plugproxy.fakes.common import FakeError
from plugproxy.fakes.knobs import FailureRule, FakeKnobs, knobs_from_flags
from plugproxy.fakes.misbehave import MISBEHAVIOURS, Misbehaviour, catalogue
from plugproxy.fakes.server import FAKE_SPECS, FakePluginHandle, start_fake_plugin

__all__ = [
    "FAKE_SPECS",
    "MISBEHAVIOURS",
    "CallRecord",
    "FailureRule",
    "FakeError",
    "FakeKnobs",
    "FakePlugin",
    "FakePluginHandle",
    "Misbehaviour",
    "SpecClient",
    "catalogue",
    "knobs_from_flags",
    "start_fake_plugin",
]
