"""``plugproxy prepare-dir``: create a directory and give it an owner and a mode.

What an init container does to a host socket directory before a non-root plugproxy
creates its socket there (kubelet creates ``hostPath`` directories root-owned, 0755). It
runs in the plugproxy image itself, which has no shell: no ``mkdir``, ``chown`` or ``chmod``
binaries to call.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import re

from plugproxy.core.endpoints import ConfigError

OWNER = re.compile(r"(\d+):(\d+)")
MODE = re.compile(r"0?[0-7]{3,4}")
MAX_ID = 2**32 - 2  # 2**32 - 1 is (uid_t)-1, "leave unchanged" to chown(2)


def parse_owner(raw: str) -> tuple[int, int]:
    match = OWNER.fullmatch(raw)
    if not match or max(int(match[1]), int(match[2])) > MAX_ID:
        raise ConfigError(f"--owner {raw!r}: expected numeric UID:GID, e.g. 0:65532")
    return int(match[1]), int(match[2])


def parse_mode(raw: str) -> int:
    if not MODE.fullmatch(raw):
        raise ConfigError(f"--mode {raw!r}: expected an octal mode, e.g. 0770")
    return int(raw, 8)


def prepare(path: pathlib.Path, owner: tuple[int, int] | None, mode: int | None) -> None:
    """mkdir -p, then chown and chmod the last directory only (never its parents)."""
    if not path.is_absolute():
        raise ConfigError(f"{path}: expected an absolute path")
    try:
        path.mkdir(parents=True, exist_ok=True)
        if owner is not None:
            os.chown(path, *owner)
        if mode is not None:
            path.chmod(mode)
    except FileExistsError:
        raise ConfigError(f"{path}: exists and is not a directory") from None
    except OSError as exc:
        raise ConfigError(f"{path}: {exc.strerror or exc}") from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "paths", nargs="+", metavar="PATH", help="absolute paths of the directories to prepare"
    )
    parser.add_argument("--owner", metavar="UID:GID", help="numeric owner and group to give them")
    parser.add_argument("--mode", metavar="MODE", help="octal permissions to give them, e.g. 0770")


async def run(ns: argparse.Namespace) -> int:
    owner = parse_owner(ns.owner) if ns.owner is not None else None
    mode = parse_mode(ns.mode) if ns.mode is not None else None
    for raw in ns.paths:
        prepare(pathlib.Path(raw), owner, mode)
    return 0
