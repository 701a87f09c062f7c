"""``plugproxy fake-registrar``: a CO sidecar that starts the way node-driver-registrar does.

node-driver-registrar (v2.x) dials the CSI socket and retries about once a second until it
connects, then asks GetPluginInfo with a one-second deadline and exits when that fails; its
pod restarts it. Started before its driver, it works directly because the socket does not
exist until the driver listens. This fake does the same, so start order can be checked
through the proxy, in a process or in a pod: exit status 1 and the gRPC status on failure,
else one line naming the driver; with ``--stay`` it then waits for SIGTERM, as a sidecar
would.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import time

import grpc

from plugproxy.core.options import duration
from plugproxy.spec.registry import load_spec

PLUGIN_INFO = "/csi.v1.Identity/GetPluginInfo"
RECONNECT_MS = 1000  # csi-lib-utils' connection.Connect redials about once a second


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--csi-address",
        required=True,
        metavar="PATH",
        help="the CSI socket: a path or unix:///path",
    )
    parser.add_argument(
        "--timeout",
        type=duration,
        default=1.0,
        metavar="DURATION",
        help="deadline of the GetPluginInfo call (node-driver-registrar's is 1s)",
    )
    parser.add_argument(
        "--stay", action="store_true", help="after registering, wait for SIGTERM (exit 0)"
    )


def _target(address: str) -> str:
    path = address.removeprefix("unix://") if address.startswith("unix://") else address
    return "unix:" + path


async def run(ns: argparse.Namespace) -> int:
    started = time.monotonic()
    options = [
        ("grpc.initial_reconnect_backoff_ms", RECONNECT_MS),
        ("grpc.min_reconnect_backoff_ms", RECONNECT_MS),
        ("grpc.max_reconnect_backoff_ms", RECONNECT_MS),
        ("grpc.use_local_subchannel_pool", 1),
    ]
    async with grpc.aio.insecure_channel(_target(ns.csi_address), options=options) as channel:
        await channel.channel_ready()  # retries until the socket accepts, as Connect does
        connected = time.monotonic() - started
        try:
            answer = await channel.unary_unary(PLUGIN_INFO)(b"", timeout=ns.timeout)
        except grpc.aio.AioRpcError as err:
            print(
                json.dumps(
                    {
                        "event": "GetPluginInfo failed; exiting",
                        "code": err.code().name,
                        "details": err.details(),
                        "connected_after_s": round(connected, 3),
                    }
                ),
                flush=True,
            )
            return 1
    response = load_spec("csi.v1").message_class("csi.v1.GetPluginInfoResponse").FromString(answer)
    print(
        json.dumps(
            {
                "event": "registered",
                "driver": getattr(response, "name", ""),
                "connected_after_s": round(connected, 3),
            }
        ),
        flush=True,
    )
    if ns.stay:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
    sys.stdout.flush()
    return 0
