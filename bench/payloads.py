"""Benchmark payloads: spec-valid CSI v1 messages, encoded once and written to files.

The mock plugins replay these bytes, so what crosses the proxy is what a real plugin
would send: a GetPluginInfo answer, a 10,000-entry ListVolumes page (each volume with a
volume_context, which redaction must handle) and a GetMetadataAllocated stream of
100,000 block entries (CSI v1.12 §SnapshotMetadata).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

from plugproxy.spec.registry import load_spec

PLUGIN_INFO = "/csi.v1.Identity/GetPluginInfo"
LIST_VOLUMES = "/csi.v1.Controller/ListVolumes"
METADATA_ALLOCATED = "/csi.v1.SnapshotMetadata/GetMetadataAllocated"

BLOCK_SIZE = 65536
BLOCKS_PER_MESSAGE = 1000


def _cls(name: str) -> Any:
    return load_spec("csi.v1").message_class(f"csi.v1.{name}")


def plugin_info_response() -> bytes:
    msg = _cls("GetPluginInfoResponse")(name="bench.plugproxy.example", vendor_version="1.0.0")
    return bytes(msg.SerializeToString())


def list_volumes_response(entries: int) -> bytes:
    msg = _cls("ListVolumesResponse")()
    for i in range(entries):
        entry = msg.entries.add()
        entry.volume.volume_id = f"pvc-{i:08d}"
        entry.volume.capacity_bytes = 1 << 30
        entry.volume.volume_context["storage.example/pool"] = "fast"
        entry.volume.volume_context["storage.example/token"] = f"tok-{i:08d}"
        entry.status.published_node_ids.append(f"node-{i % 50}")
    return bytes(msg.SerializeToString())


def capability_responses() -> dict[str, bytes]:
    """What the plugin serving the ListVolumes page answers when asked for its capabilities:
    a proxy learns them before it judges a listing (rules gated on them run then)."""
    plugin = _cls("GetPluginCapabilitiesResponse")(
        capabilities=[{"service": {"type": "CONTROLLER_SERVICE"}}]
    )
    controller = _cls("ControllerGetCapabilitiesResponse")(
        capabilities=[
            {"rpc": {"type": name}}
            for name in (
                "CREATE_DELETE_VOLUME",
                "PUBLISH_UNPUBLISH_VOLUME",
                "LIST_VOLUMES",
                "LIST_VOLUMES_PUBLISHED_NODES",  # the page's entries carry published nodes
            )
        ]
    )
    return {
        "/csi.v1.Identity/GetPluginCapabilities": bytes(plugin.SerializeToString()),
        "/csi.v1.Controller/ControllerGetCapabilities": bytes(controller.SerializeToString()),
    }


def metadata_allocated_request() -> bytes:
    msg = _cls("GetMetadataAllocatedRequest")(snapshot_id="snap-bench", max_results=0)
    msg.secrets["token"] = "not-a-real-secret"
    return bytes(msg.SerializeToString())


def metadata_allocated_stream(blocks: int) -> list[bytes]:
    cls = _cls("GetMetadataAllocatedResponse")
    out: list[bytes] = []
    for first in range(0, blocks, BLOCKS_PER_MESSAGE):
        msg = cls(block_metadata_type=1, volume_capacity_bytes=blocks * BLOCK_SIZE)
        for i in range(first, min(blocks, first + BLOCKS_PER_MESSAGE)):
            block = msg.block_metadata.add()
            block.byte_offset = i * BLOCK_SIZE
            block.size_bytes = BLOCK_SIZE
        out.append(bytes(msg.SerializeToString()))
    return out


def write_all(directory: Path, list_entries: int = 10_000, blocks: int = 100_000) -> Path:
    """Write requests, responses and the mock plugin's table; returns the table's path."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "empty.bin").write_bytes(b"")
    (directory / "plugin_info.bin").write_bytes(plugin_info_response())
    (directory / "list_volumes.bin").write_bytes(list_volumes_response(list_entries))
    (directory / "metadata_request.bin").write_bytes(metadata_allocated_request())
    stream = metadata_allocated_stream(blocks)
    (directory / "metadata_stream.bin").write_bytes(
        b"".join(struct.pack(">I", len(m)) + m for m in stream)
    )
    table = {
        PLUGIN_INFO: {"file": "plugin_info.bin", "stream": False},
        LIST_VOLUMES: {"file": "list_volumes.bin", "stream": False},
        METADATA_ALLOCATED: {"file": "metadata_stream.bin", "stream": True},
    }
    path = directory / "table.json"
    path.write_text(json.dumps(table, indent=1))
    return path


def read_stream(path: Path) -> list[bytes]:
    data = path.read_bytes()
    out: list[bytes] = []
    while len(data) >= 4:
        (size,) = struct.unpack(">I", data[:4])
        out.append(data[4 : 4 + size])
        data = data[4 + size :]
    return out
