"""A raw-bytes mock plugin in Python, for machines without the Go toolchain.

Same table format and behaviour as bench/go/mockplugin: answers each listed method with
bytes prepared by bench/payloads.py. Usage: python bench/pyplugin.py SOCKET TABLE.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parent))
from payloads import read_stream


class Replay(grpc.GenericRpcHandler):  # type: ignore[misc]
    def __init__(self, table: Path) -> None:
        self.unary: dict[str, bytes] = {}
        self.streams: dict[str, list[bytes]] = {}
        for method, entry in json.loads(table.read_text()).items():
            path = table.parent / entry["file"]
            if entry["stream"]:
                self.streams[method] = read_stream(path)
            else:
                self.unary[method] = path.read_bytes()

    def service(self, details: Any) -> grpc.RpcMethodHandler | None:
        method = details.method
        if method in self.unary:
            answer = self.unary[method]

            async def unary(request: bytes, context: Any) -> bytes:
                return answer

            return grpc.unary_unary_rpc_method_handler(unary)
        if method in self.streams:
            messages = self.streams[method]

            async def stream(request: bytes, context: Any) -> AsyncIterator[bytes]:
                for message in messages:
                    yield message

            return grpc.unary_stream_rpc_method_handler(stream)
        return None


async def main(socket: str, table: str) -> None:
    size = 256 * 1024 * 1024
    server = grpc.aio.server(
        options=[("grpc.max_receive_message_length", size), ("grpc.max_send_message_length", size)]
    )
    server.add_generic_rpc_handlers([Replay(Path(table))])
    server.add_insecure_port(f"unix:{socket}")
    await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await server.stop(0)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
