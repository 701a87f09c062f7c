"""Fake CSI v0.3 plugin: Identity, Controller and Node on the shared CSI storage model.

v0.3 has no cloning, expansion, stats, modify or group snapshots; volumes may only come
from snapshots; snapshots report ``created_at`` in nanoseconds and a READY status.
Everything but NodeGetId is :class:`~plugproxy.fakes.csi_plugin.FakeCsi` in v0.3's names.
"""

from __future__ import annotations

from plugproxy.fakes.common import DynMessage, ServicerContext
from plugproxy.fakes.csi_model import NODE_ID
from plugproxy.fakes.csi_plugin import V0_CONTROLLER_CAPABILITIES, FakeCsi
from plugproxy.spec.csi_names import CSI_V0_NAMES


class FakeCsiV0(FakeCsi):
    spec_name = "csi.v0"
    default_plugin_name = "csi-v0.fake.plugproxy.io"
    key_fields = ("volume_id", "snapshot_id", "name", "source_volume_id")
    names = CSI_V0_NAMES
    content_sources = ("snapshot",)
    source_id_missing = "volume_content_source.{kind}.id"
    multi_writer_modes = False
    plugin_services = ("CONTROLLER_SERVICE", "ACCESSIBILITY_CONSTRAINTS")
    volume_expansion = ()
    controller_capabilities = V0_CONTROLLER_CAPABILITIES
    node_capabilities = ("STAGE_UNSTAGE_VOLUME",)

    async def NodeGetId(self, request: DynMessage, context: ServicerContext) -> DynMessage:
        return self.new("NodeGetIdResponse", node_id=NODE_ID)
