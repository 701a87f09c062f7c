"""``plugproxy inject``: add plugproxy to the workloads of Kubernetes manifests.

A plugin socket is found from what the pod spec says, never from container or image
names: the addresses the containers are given (``--csi-address``, ``--endpoint``,
``CSI_ENDPOINT``/``COSI_ENDPOINT``/``CMI_ENDPOINT``, with ``$(VAR)`` expanded as kubelet
does) resolved through each container's volume mounts to (volume, path in volume), or to a
TCP port on the pod's network. A container that only dials (``--csi-address``) is a CO
side; the one that serves the socket is the driver. A container given no address at all
but mounting a volume at the directory of a well-known default socket (the CSI sidecars'
``/run/csi/socket``, COSI's ``/var/lib/cosi/cosi.sock``) uses that default: a default
belongs to a binary, and the mount is what the pod spec says of it.

The edit is the smallest one that puts plugproxy in the path: the driver's mount of the
socket directory is pointed at a private emptyDir, so the driver keeps its own flags and
listens where it always did, but into a directory only plugproxy also mounts; plugproxy
mounts the original directory at the same path and listens where the driver used to. Over
TCP the driver's port moves instead. Everything done is recorded in one annotation, which
makes injection idempotent and ``--remove`` exact.

The driver's container is never started differently: its command, arguments, user and
image stay as they are. plugproxy reaches the driver's socket by identity instead, running
as the driver's user (see :func:`proxy_identity`).

Documents are edited with ruamel.yaml in round-trip mode; a document without a workload
to change is written back as it was read, byte for byte.

stdout carries only the manifests (or the diff); what was done goes to stderr: one line per
workload changed, already injected or opted out, one per warning, and a count. Input that
is not YAML is an error naming the file and line (exit 2); input in which no workload runs
a plugin is "nothing to inject" (exit 1), and "nothing to remove" for --remove alike.
"""

from __future__ import annotations

import argparse
import difflib
import io
import itertools
import json
import pathlib
import posixpath
import re
import sys
from collections.abc import Iterator, MutableMapping, MutableSequence, Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.error import YAMLError

from plugproxy import __version__
from plugproxy.cli import serve
from plugproxy.cli.flags import add_options
from plugproxy.core.endpoints import ConfigError
from plugproxy.core.options import duration
from plugproxy.spec.registry import SPEC_NAMES
from plugproxy.stages.validate import MODES, OFF

PREFIX = "plugproxy.io/"
RECORD = PREFIX + "injected"  # what injection changed, so it can be undone exactly
DRIVER_HINT = PREFIX + "driver-container"
OPT_IN = PREFIX + "inject"
PROXY = "plugproxy"
PREPARE = "plugproxy-prepare-socket-dir"
INNER_VOLUME = "plugproxy-upstream"
TMP_VOLUME = "plugproxy-tmp"
TMP_SIZE = "16Mi"  # the sizeLimit of TMP_VOLUME, which the proxy mounts at /tmp
# The violation record (serve --violations-file) of an injected proxy: in TMP_VOLUME, which
# outlives a restart of the container (not the pod). Directly in /tmp, since serve does not
# create a missing directory. Its bound is given, not left to serve's default (10MiB): the
# file and PATH.1 stay under it (a line at most over), and a pod whose emptyDir passes its
# sizeLimit is evicted, so half the volume stays free for whatever else lands in /tmp.
VIOLATIONS_FILE = "/tmp/violations.jsonl"
VIOLATIONS_MAX_BYTES = "8MiB"
ADMIN_PORT_NAME = "plugproxy-admin"
UID = 65532  # plugproxy's image user, and the pod group it adds
MAX_UID = 2**31 - 1
# What `make image` tags locally; no public registry serves it, so a cluster needs it pushed
# somewhere and named with --image (docs/injecting.md, "The image").
DEFAULT_IMAGE = f"plugproxy:{__version__}"
# What earlier versions put before a driver's command (record "wrapped": true); only
# --remove still needs it, to restore such a driver's command.
UMASK_WRAPPER = ["/bin/sh", "-c", 'umask 0007 && exec "$0" "$@"']
PROMETHEUS = ("prometheus.io/scrape", "prometheus.io/port", "prometheus.io/path")
KUBELET_PLUGINS = "/var/lib/kubelet/plugins/"  # where kubelet finds CSI node sockets

# Flags naming a plugin address, and what they say about the container giving them.
CLIENT_FLAGS = {"--csi-address": "csi"}
SERVER_FLAGS = {"--endpoint": "", "--csi-endpoint": "csi"}
# Variables naming a plugin address: a CSI driver reads CSI_ENDPOINT; COSI and CMI give the
# same variable to both sides, so those alone do not say which side a container is.
ENDPOINT_ENV = {
    "CSI_ENDPOINT": ("server", "csi"),
    "COSI_ENDPOINT": ("either", "cosi"),
    "CMI_ENDPOINT": ("either", "cmi"),
}
# COSI_ENDPOINT and COSI's default socket name the socket of v1alpha1 (COSI v0.1) and
# v1alpha2 (v0.2) binaries alike: a COSI proxy decodes with --spec=auto, which tells the two
# apart by their packages.
SPEC_OF_FAMILY = {"csi": "csi.v1", "cmi": "cmi.v1"}
SPEC_OF_DEFAULT = {"csi": "csi.v1"}
# The container kubectl logs and exec pick: a chart names its main one, the driver.
DEFAULT_CONTAINER = "kubectl.kubernetes.io/default-container"
POD_TEMPLATE_KINDS = ("Deployment", "DaemonSet", "StatefulSet", "ReplicaSet", "Job")
ARG_VAR = re.compile(r"\$\((\w+)\)")
PORT_IN_ARG = re.compile(r"^--?[\w-]*(?:port|address|endpoint|listen)[\w-]*=\S*?:?(\d{2,5})$")
PORT_FLAG = re.compile(r"^--?[\w-]*(?:port|address|endpoint|listen)[\w-]*$")  # value: next word
PORT_VALUE = re.compile(r"^\S*?:?(\d{2,5})$")
# Where binaries listen or dial when the manifest does not say: (family, role, address).
# CSI sidecars dial /run/csi/socket unless given --csi-address (a CSI driver has no
# default); COSI's sidecar and drivers both default to /var/lib/cosi/cosi.sock.
DEFAULT_SOCKETS = (
    ("csi", "client", "unix:///run/csi/socket"),
    ("cosi", "either", "unix:///var/lib/cosi/cosi.sock"),
)
# The CSI livenessprobe sidecar serves /healthz on 9808 unless given --health-port or
# --http-endpoint; plugproxy's own default admin port is 9808 too.
LIVENESSPROBE_PORT = 9808
ADMIN_PORT = 9808
LOOPBACK = ("127.0.0.1", "localhost", "::1", "[::1]")
DOC_START = re.compile(r"---(?:\s|$)")
KEY_LINE = re.compile(r"( *)[^\s#-][^:#]*:\s*(?:#.*)?$")
ITEM_LINE = re.compile(r"( *)- ")


class InjectError(Exception):
    """A workload that cannot be wired unambiguously; the message names it."""


@dataclass(frozen=True)
class InjectOptions:
    image: str = DEFAULT_IMAGE
    validation: str = "audit"
    serve_args: tuple[str, ...] = ()
    driver_container: str | None = None
    spec: str | None = None  # None: told by the endpoint's spec family, else auto
    proxy_user: int | None = None  # None: chosen from the driver's user
    node_admin: bool = False  # on hostNetwork: admin on the node's addresses, for Prometheus


# What became of a workload (Seen.status), for the summary on stderr.
INJECTED = "injected"
REMOVED = "removed"
ALREADY = "already injected"  # has plugproxy: the record, or a hand-written proxy
OPTED_OUT = "opted out"
UNCHANGED = "unchanged"  # no plugin (detail says why where it looked like one)
NOT_INJECTED = "not injected"  # --remove: a plugin without plugproxy
HAND_WRITTEN = "hand-written"  # --remove: plugproxy there, but not added by inject


@dataclass(frozen=True)
class Seen:
    """One workload of the input and what became of it."""

    who: str
    status: str
    detail: str = ""
    # Why a workload with plugin-like addresses was left as it was: (text, is a warning).
    notes: tuple[tuple[str, bool], ...] = ()


@dataclass
class Outcome:
    changed: bool = False
    warnings: list[str] = field(default_factory=list)
    seen: list[Seen] = field(default_factory=list)


# ------------------------------------------------------------------------ reading a pod spec


@dataclass(frozen=True)
class Ref:
    """One plugin address a container is configured with."""

    container: int
    role: str  # client, server or either
    family: str  # csi, cosi, cmi or "" when the flag does not say
    address: str
    literal: tuple[Any, ...]  # where the address text lives: ("env", i) or ("args", i, prefix)
    implied: bool = False  # a binary's default (DEFAULT_SOCKETS), not named in the manifest


def _env_values(container: MutableMapping[str, Any]) -> dict[str, str]:
    return {
        str(e["name"]): str(e["value"])
        for e in container.get("env") or []
        if isinstance(e, MutableMapping) and "name" in e and "value" in e
    }


def _expand(word: str, env: dict[str, str]) -> str:
    return ARG_VAR.sub(lambda m: env.get(m[1], m[0]), word)


def _literal_for(
    raw: str, where: tuple[Any, ...], container: MutableMapping[str, Any]
) -> tuple[Any, ...]:
    """Where to edit the address: the arg itself, or the variable it is made of."""
    var = ARG_VAR.fullmatch(raw)
    if var:
        for i, e in enumerate(container.get("env") or []):
            if e.get("name") == var[1] and "value" in e:
                return ("env", i)
    return where if not ARG_VAR.search(raw) else ()


def container_refs(index: int, container: MutableMapping[str, Any]) -> list[Ref]:
    env = _env_values(container)
    refs = []
    for i, e in enumerate(container.get("env") or []):
        name = e.get("name") if isinstance(e, MutableMapping) else None
        if name in ENDPOINT_ENV and "value" in e:
            role, family = ENDPOINT_ENV[name]
            refs.append(Ref(index, role, family, str(e["value"]), ("env", i)))
    for key in ("command", "args"):
        words = [str(w) for w in container.get(key) or []]
        for i, word in enumerate(words):
            flag, sep, raw = word.partition("=")
            literal: tuple[Any, ...] = (key, i, flag + "=")
            if not sep and i + 1 < len(words) and not words[i + 1].startswith("-"):
                raw, literal = words[i + 1], (key, i + 1, "")
            elif not sep:
                continue
            flag = "--" + flag.lstrip("-")  # -csi-address and --csi-address alike
            if flag in CLIENT_FLAGS:
                role, family = "client", CLIENT_FLAGS[flag]
            elif flag in SERVER_FLAGS:
                role, family = "server", SERVER_FLAGS[flag]
            else:
                continue
            refs.append(
                Ref(index, role, family, _expand(raw, env), _literal_for(raw, literal, container))
            )
    return refs


def implied_refs(index: int, container: MutableMapping[str, Any]) -> list[Ref]:
    """The default sockets of a container given no address: those whose directory it
    mounts a volume at, exactly (a mount is the one thing the pod spec says of them)."""
    mounted = {
        posixpath.normpath(str(m.get("mountPath", "/")))
        for m in container.get("volumeMounts") or []
        if isinstance(m, MutableMapping)
    }
    return [
        Ref(index, role, family, address, (), implied=True)
        for family, role, address in DEFAULT_SOCKETS
        if posixpath.dirname(_unix_path(address) or "") in mounted
    ]


def all_refs(index: int, container: MutableMapping[str, Any]) -> list[Ref]:
    return container_refs(index, container) or implied_refs(index, container)


def _unix_path(address: str) -> str | None:
    if address.startswith("unix:"):
        return "/" + address[len("unix:") :].lstrip("/")
    if address.startswith("/"):
        return address
    return None


def _tcp_port(address: str) -> int | None:
    text = address.removeprefix("tcp://")
    _, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or "/" in text or "://" in text:
        return None
    return int(port)


def socket_mount(container: MutableMapping[str, Any], path: str) -> int | None:
    """Index of the mount the path lies in (the deepest one), or None."""
    best, best_len = None, -1
    for i, mount in enumerate(container.get("volumeMounts") or []):
        base = str(mount.get("mountPath", "")).rstrip("/") or "/"
        inside = path == base or path.startswith(base.rstrip("/") + "/")
        if inside and len(base) > best_len:
            best, best_len = i, len(base)
    return best


def location(container: MutableMapping[str, Any], address: str) -> tuple[str, ...] | None:
    """("unix", volume, path in volume) or ("tcp", port): where the address really is."""
    path = _unix_path(address)
    if path is not None:
        index = socket_mount(container, path)
        if index is None:
            return None  # the container's own filesystem: no other container reaches it
        mount = container["volumeMounts"][index]
        rel = posixpath.relpath(path, str(mount["mountPath"]).rstrip("/") or "/")
        return (
            "unix",
            str(mount["name"]),
            posixpath.normpath(posixpath.join(str(mount.get("subPath") or ""), rel)),
        )
    port = _tcp_port(address)
    return ("tcp", str(port)) if port is not None else None


def declared_ports(container: MutableMapping[str, Any]) -> set[int]:
    return {int(p["containerPort"]) for p in container.get("ports") or [] if "containerPort" in p}


def host_ports(container: MutableMapping[str, Any]) -> set[int]:
    return {int(p["hostPort"]) for p in container.get("ports") or [] if p.get("hostPort")}


def container_ports(index: int, container: MutableMapping[str, Any]) -> set[int]:
    """Ports the container listens on: declared, in its flags, or by its binary's default."""
    used = declared_ports(container) | host_ports(container)
    env = _env_values(container)
    words = [
        _expand(str(w), env)  # --listen-address=$(METRICS_ADDRESS), as kubelet expands it
        for w in [*(container.get("command") or []), *(container.get("args") or [])]
    ]
    flagged: set[int] = set()
    for i, word in enumerate(words):
        match = PORT_IN_ARG.match(word)
        if match is None and PORT_FLAG.match(word) and i + 1 < len(words):
            match = PORT_VALUE.match(words[i + 1])
        if match:
            flagged.add(int(match[1]))
    # A CSI client with no port flag may be the livenessprobe on its default port; the
    # other sidecars listen only when given a flag, so avoiding 9808 costs nothing there.
    csi_client = any(r.role == "client" and r.family == "csi" for r in all_refs(index, container))
    if csi_client and not flagged:
        flagged.add(LIVENESSPROBE_PORT)
    return used | flagged


def pod_ports(pod: MutableMapping[str, Any]) -> set[int]:
    """Every port a container of the pod (init and sidecar containers too) may listen on."""
    used: set[int] = set()
    for key in ("initContainers", "containers"):
        for i, c in enumerate(pod.get(key) or []):
            if isinstance(c, MutableMapping):
                used |= container_ports(i, c)
    return used


@dataclass
class PortSpace:
    """Ports taken on a node by the workloads of one manifest set: every port of a
    hostNetwork pod (its network is the node's) and every hostPort. Admin ports chosen for
    hostNetwork pods are added as they are chosen, so no two of them collide."""

    node: set[int] = field(default_factory=set)

    def scan(self, pod: MutableMapping[str, Any]) -> None:
        if pod.get("hostNetwork"):
            self.node |= pod_ports(pod)
        else:
            for c in [*(pod.get("initContainers") or []), *(pod.get("containers") or [])]:
                if isinstance(c, MutableMapping):
                    self.node |= host_ports(c)


# ------------------------------------------------------------------------ the plan


@dataclass
class Plan:
    driver: int
    loc: tuple[str, ...]
    family: str
    mount: int | None  # the driver's mount of the socket directory (unix)
    ref: Ref
    chosen_by: str = ""  # what told the driver apart, when the addresses did not


def _workload_name(kind: str, meta: MutableMapping[str, Any] | None) -> str:
    meta = meta or {}
    name = meta.get("name") or meta.get("generateName") or "<unnamed>"
    namespace = meta.get("namespace")
    return f"{kind}/{namespace}/{name}" if namespace else f"{kind}/{name}"


def has_proxy(pod: MutableMapping[str, Any]) -> bool:
    for c in pod.get("containers") or []:
        words = [str(w) for w in [*(c.get("command") or []), *(c.get("args") or [])]]
        if c.get("name") == PROXY or "PLUGPROXY_LISTEN" in _env_values(c):
            return True
        if words[:1] == ["serve"] and any(w.startswith("--listen") for w in words):
            return True
    return False


def plan(
    pod: MutableMapping[str, Any],
    annotations: MutableMapping[str, Any],
    who: str,
    opts: InjectOptions,
    notes: list[tuple[str, bool]] | None = None,
) -> Plan | None:
    """The one plugin socket of the pod and its driver, or None. `notes` receives (text,
    is a warning) for addresses that look like a plugin's but are not wired."""
    notes = [] if notes is None else notes
    containers = list(pod.get("containers") or [])
    names = [str(c.get("name")) for c in containers]
    hint = annotations.get(DRIVER_HINT)
    if hint is not None and hint not in names:
        raise InjectError(
            f"{who}: annotation {DRIVER_HINT}={hint!r} names no container "
            f"(have: {', '.join(names)})"
        )
    if hint is None and opts.driver_container in names:
        hint = opts.driver_container
    by_loc: dict[tuple[str, ...], list[Ref]] = {}
    for i, c in enumerate(containers):
        for ref in all_refs(i, c):
            loc = location(c, ref.address)
            if loc is not None:
                by_loc.setdefault(loc, []).append(ref)
            elif ref.family and not ref.implied and not ARG_VAR.search(ref.address):
                notes.append(
                    (
                        f"{names[i]} is given the {ref.family.upper()} address {ref.address}, "
                        "which is on none of its volumes: no other container can reach it",
                        True,
                    )
                )
    plans: list[Plan] = []
    for loc, refs in by_loc.items():
        clients = {r.container for r in refs if r.role == "client"}
        serving = [r for r in refs if r.role != "client" and r.container not in clients]
        if not serving:
            unnamed = _unnamed_server(pod, loc, refs, names, hint, who)
            if unnamed is None:
                if not all(r.implied for r in refs):
                    dialing = ", ".join(sorted({names[r.container] for r in refs}))
                    notes.append(
                        (
                            f"only the CO side of {_describe(loc)} ({dialing}); the proxy "
                            "goes into the pod of the driver that serves it",
                            False,
                        )
                    )
                continue  # only CO sides here: the plugin is in another pod
            serving = [unnamed]
        alone = len({r.container for r in [*refs, *serving]}) == 1
        if alone and (refs[0].implied or not _served_to_the_node(pod, loc, refs)):
            # Nobody else names it: a flag that only looks like a plugin endpoint, unless
            # it is one of the specs' own addresses.
            if refs[0].family and not refs[0].implied:
                notes.append(
                    (
                        f"{names[refs[0].container]} is given the {refs[0].family.upper()} "
                        f"address {refs[0].address}, but no other container dials it and it "
                        "is in no hostPath that kubelet reaches",
                        True,
                    )
                )
            continue
        strong = [r for r in serving if r.role == "server"]
        if not strong and loc[0] == "tcp":
            strong = [r for r in serving if int(loc[1]) in declared_ports(containers[r.container])]
        candidates = strong or serving
        drivers = sorted({r.container for r in candidates})
        chosen_by = ""
        if hint is not None and hint in [names[r.container] for r in serving]:
            drivers = [names.index(hint)]
        elif hint is not None:
            continue  # the hinted driver serves another socket
        elif len(drivers) > 1 and all(r.role == "either" for r in candidates):
            # Both sides of a COSI or CMI socket (the same variable, or the same default):
            # the pod's main container, as its author marked it for kubectl, is the driver.
            main = annotations.get(DEFAULT_CONTAINER)
            if main in [names[d] for d in drivers]:
                drivers = [names.index(str(main))]
                chosen_by = f"the {DEFAULT_CONTAINER} annotation"
        if len(drivers) > 1:
            listed = ", ".join(names[d] for d in drivers)
            how = "use it by their binaries' default" if serving[0].implied else "name it"
            raise InjectError(
                f"{who}: cannot tell which container serves {_describe(loc)}: {listed} all {how}; "
                f"say which with --driver-container NAME or the {DRIVER_HINT} annotation"
            )
        ref = next(r for r in [*candidates, *serving] if r.container == drivers[0])
        family = next((r.family for r in refs if r.family), "")
        mount = None
        if loc[0] == "unix":
            mount = socket_mount(containers[drivers[0]], _unix_path(ref.address) or "")
        plans.append(Plan(drivers[0], loc, family, mount, ref, chosen_by))
    if len(plans) > 1:
        listed = "; ".join(f"{_describe(p.loc)} served by {names[p.driver]}" for p in plans)
        raise InjectError(
            f"{who}: more than one plugin socket ({listed}); say which driver with "
            "--driver-container NAME"
        )
    if not plans and not by_loc:
        _no_address_in_a_plugin_directory(pod, who, names)
    return plans[0] if plans else None


def _no_address_in_a_plugin_directory(
    pod: MutableMapping[str, Any], who: str, names: Sequence[str]
) -> None:
    """A pod naming no plugin address at all, where a container mounts a plugin's own
    directory under kubelet's plugins (a node driver configured by a file, say): a plugin
    that cannot be wired, not an ordinary workload to pass by in silence."""
    host_dirs = {
        str(v["name"]): posixpath.join(str(v["hostPath"].get("path", "")), "")
        for v in pod.get("volumes") or []
        if isinstance(v, MutableMapping) and isinstance(v.get("hostPath"), MutableMapping)
    }
    for name, container in zip(names, pod["containers"], strict=True):
        for mount in container.get("volumeMounts") or []:
            path = host_dirs.get(str(mount.get("name")), "")
            below = path.startswith(KUBELET_PLUGINS) and path != KUBELET_PLUGINS
            if below and not path.startswith(KUBELET_PLUGINS + "kubernetes.io/"):
                raise InjectError(
                    f"{who}: {name} mounts the kubelet plugin directory {path} but no "
                    "container is given a plugin address (--endpoint, CSI_ENDPOINT, "
                    "--csi-address, ...); name it in the manifest, or opt out with the "
                    f'{OPT_IN}: "false" annotation'
                )


def _unnamed_server(
    pod: MutableMapping[str, Any],
    loc: tuple[str, ...],
    refs: Sequence[Ref],
    names: Sequence[str],
    hint: str | None,
    who: str,
) -> Ref | None:
    """CO sidecars dial a socket on a volume another container of the pod also mounts, but
    no container is given its address (a driver configured by a file or a ConfigMap, say):
    a plugin, but which container serves it only the user can say. None where the CO side
    is alone with the volume (the plugin is in another pod) or the hint is elsewhere."""
    if loc[0] != "unix" or all(r.implied for r in refs):
        return None
    containers = pod["containers"]
    named = {r.container for r in refs}
    others = [
        i
        for i, c in enumerate(containers)
        if i not in named and any(m.get("name") == loc[1] for m in c.get("volumeMounts") or [])
    ]
    if not others:
        return None
    if hint is None:
        dialing = ", ".join(sorted({names[r.container] for r in refs}))
        raise InjectError(
            f"{who}: {dialing} dial {_describe(loc)}, but no container is given its address "
            f"(the volume is also mounted by {', '.join(names[i] for i in others)}); say "
            f"which serves it with --driver-container NAME or the {DRIVER_HINT} annotation"
        )
    if names.index(hint) not in others:
        return None
    index = names.index(hint)
    address = _path_in(containers[index], loc)
    if address is None:
        raise InjectError(
            f"{who}: {hint} does not mount the part of volume {loc[1]} holding {loc[2]}"
        )
    family = next((r.family for r in refs if r.family), "")
    return Ref(index, "server", family, "unix://" + address, (), implied=True)


def _path_in(container: MutableMapping[str, Any], loc: tuple[str, ...]) -> str | None:
    """Where the container sees (volume, path in volume), if it mounts that part."""
    for mount in container.get("volumeMounts") or []:
        if mount.get("name") != loc[1]:
            continue
        sub = posixpath.normpath(str(mount.get("subPath") or "."))
        rel = posixpath.relpath(loc[2], sub) if sub != "." else loc[2]
        if not rel.startswith(".."):
            return posixpath.join(str(mount["mountPath"]), rel)
    return None


def _served_to_the_node(
    pod: MutableMapping[str, Any], loc: tuple[str, ...], refs: Sequence[Ref]
) -> bool:
    """A socket with no CO side in the pod is a plugin's only if kubelet is its CO: a CSI
    endpoint in a host directory (the driver of a split DaemonSet, registrar elsewhere)."""
    if loc[0] != "unix":
        return False
    volume = next((v for v in pod.get("volumes") or [] if v.get("name") == loc[1]), None)
    host = (volume or {}).get("hostPath")
    if not isinstance(host, MutableMapping):
        return False
    path = posixpath.join(str(host.get("path", "")), "")
    return any(r.family == "csi" for r in refs) or path.startswith(KUBELET_PLUGINS)


def _describe(loc: tuple[str, ...]) -> str:
    if loc[0] == "tcp":
        return f"TCP port {loc[1]}"
    return f"the socket {loc[2]} in volume {loc[1]}"


# ------------------------------------------------------------------------ editing


def _new_map(like: Any, items: dict[str, Any] | None = None) -> Any:
    """A mapping of the same kind as the document's (round-trip or plain)."""
    out: Any = CommentedMap() if isinstance(like, CommentedMap) else {}
    for k, v in (items or {}).items():
        out[k] = v
    return out


def _new_seq(like: Any, items: Sequence[Any] = ()) -> Any:
    return CommentedSeq(items) if isinstance(like, CommentedMap) else list(items)


def _convert(like: Any, value: Any) -> Any:
    """Plain dicts and lists as round-trip nodes when the document is round-trip."""
    if not isinstance(like, CommentedMap):
        return value
    if isinstance(value, dict):
        out = CommentedMap()
        for k, v in value.items():
            out[k] = _convert(like, v)
        return out
    if isinstance(value, list):
        seq = CommentedSeq(_convert(like, v) for v in value)
        if value and all(isinstance(v, str) for v in value) and len(" ".join(value)) < 60:
            seq.fa.set_flow_style()  # short word lists on one line; long args one per line
        return seq
    return value


def _put(
    mapping: MutableMapping[str, Any], key: str, value: Any, before: Sequence[str] = ()
) -> None:
    """Add a key, ahead of the first of `before` that exists (the rest go at the end)."""
    if isinstance(mapping, CommentedMap):
        keys = list(mapping)
        for anchor in before:
            if anchor in keys:
                mapping.insert(keys.index(anchor), key, value)
                return
    mapping[key] = value


def _grace(seconds: float) -> str:
    return f"{seconds:g}s"


def admin_address(
    pod: MutableMapping[str, Any],
    who: str,
    opts: InjectOptions,
    ports: PortSpace,
    reserved: set[int],
) -> tuple[str, int, bool]:
    """(host, port, given) of plugproxy's admin server; `given` when --serve-arg set it.

    The port is free in the pod and, on hostNetwork, among every port the manifest set
    uses on a node. On hostNetwork the admin binds 127.0.0.1 unless asked for the node's
    addresses: kubelet probes from the node's network namespace, which the pod shares.
    """
    host_network = bool(pod.get("hostNetwork"))
    used = pod_ports(pod) | reserved | (ports.node if host_network else set())
    given = _serve_flag(opts.serve_args, "--admin-listen")
    if given is not None:
        host, _, raw = given.rpartition(":")
        port = int(raw)
        if port in used:
            where = "on the node (hostNetwork)" if host_network else "in the pod"
            raise InjectError(f"{who}: --admin-listen {given}: port {port} is already used {where}")
        if host in LOOPBACK and not host_network:
            raise InjectError(
                f"{who}: --admin-listen {given}: kubelet cannot probe the pod's loopback; "
                "bind the pod's address (0.0.0.0)"
            )
    else:
        host = "127.0.0.1" if host_network and not opts.node_admin else "0.0.0.0"
        port = ADMIN_PORT
        while port in used:
            port += 1
    if host_network:
        ports.node.add(port)
    return host, port, given is not None


def run_as_user(pod: MutableMapping[str, Any], container: MutableMapping[str, Any]) -> int | None:
    """The container's effective runAsUser, or None where the image decides."""
    for sc in (container.get("securityContext") or {}, pod.get("securityContext") or {}):
        value = sc.get("runAsUser")
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def proxy_identity(driver_uid: int | None, chosen: int | None) -> tuple[int, list[str]]:
    """(UID plugproxy runs as, capabilities it keeps) to reach the driver's socket.

    Connecting to a UNIX socket needs write permission on it, and a driver creates its
    socket with its own umask, usually 0755 owned by its user: only that user (or root
    with DAC_OVERRIDE) can connect. So plugproxy runs as the driver's user. A driver whose
    user the manifest does not state runs as whatever its image says, nearly always root
    for CSI node drivers: plugproxy runs as root and keeps DAC_OVERRIDE, the one
    capability that reaches a socket of any owner. Node drivers are privileged containers
    already; the proxy gets nothing beyond what reaching the socket takes.
    """
    uid = chosen if chosen is not None else (driver_uid if driver_uid is not None else 0)
    return uid, ["DAC_OVERRIDE"] if uid == 0 and driver_uid != 0 else []


def _serve_flag(args: Sequence[str], flag: str) -> str | None:
    for i, word in enumerate(args):
        if word.startswith(flag + "="):
            return word.split("=", 1)[1]
        if word == flag and i + 1 < len(args):
            return args[i + 1]
    return None


def inject_pod(
    pod: MutableMapping[str, Any],
    meta: MutableMapping[str, Any],
    who: str,
    opts: InjectOptions,
    outcome: Outcome,
    ports: PortSpace | None = None,
) -> None:
    """Inject into one pod spec in place (its metadata carries the annotations); `ports`
    holds the node ports of the manifest set it belongs to."""
    annotations = meta.get("annotations") or {}
    if RECORD in annotations or has_proxy(pod):
        how = "" if RECORD in annotations else "plugproxy is there, not added by inject"
        outcome.seen.append(Seen(who, ALREADY, how))
        return
    if annotations.get(OPT_IN) == "false":
        outcome.seen.append(Seen(who, OPTED_OUT))
        return
    skipped: list[tuple[str, bool]] = []
    p = plan(pod, annotations, who, opts, skipped)
    if p is None:
        outcome.seen.append(Seen(who, UNCHANGED, notes=tuple(skipped)))
        return
    containers = pod["containers"]
    driver = containers[p.driver]
    co_side = sorted(
        {
            str(c.get("name"))
            for i, c in enumerate(containers)
            if i != p.driver and any(location(c, r.address) == p.loc for r in all_refs(i, c))
        }
    )
    record: dict[str, Any] = {"driver": str(driver["name"]), "added": []}
    added: list[str] = record["added"]

    space = ports or PortSpace()
    reserved: set[int] = set()  # ports taken by this edit, not yet in the pod spec
    # Where plugproxy listens and where the driver goes.
    if p.loc[0] == "unix":
        assert p.mount is not None
        mount = driver["volumeMounts"][p.mount]
        if mount.get("mountPropagation"):
            raise InjectError(
                f"{who}: the socket of {driver['name']} is in volume {mount['name']}, which it "
                "mounts with mountPropagation for more than the socket; give the socket a "
                "directory of its own"
            )
        socket_path = _unix_path(p.ref.address) or ""
        base = str(mount["mountPath"]).rstrip("/") or "/"
        rel = posixpath.relpath(socket_path, base)
        inner = "/plugin" if not (base + "/").startswith("/plugin/") else "/plugproxy-plugin"
        listen, upstream = "unix://" + socket_path, "unix://" + posixpath.join(inner, rel)
        record["mount"] = [p.mount, str(mount["name"])]
        mount["name"] = INNER_VOLUME
        proxy_mounts = [{"name": str(record["mount"][1]), "mountPath": base}]
        inner_mount = {"name": INNER_VOLUME, "mountPath": inner}
        if mount.get("subPath"):
            proxy_mounts[0]["subPath"] = inner_mount["subPath"] = str(mount["subPath"])
        proxy_mounts += [inner_mount, {"name": TMP_VOLUME, "mountPath": "/tmp"}]
    else:
        port = int(p.loc[1])
        # The driver's new port: free in the pod (flags too) and, on hostNetwork, on the node.
        used = {port} | pod_ports(pod) | (space.node if pod.get("hostNetwork") else set())
        new_port = port + 1
        while new_port in used:
            new_port += 1
        if not p.ref.literal:
            raise InjectError(
                f"{who}: the address of {driver['name']} ({p.ref.address}) is built from "
                "several variables; cannot move it to another port"
            )
        kind, index, *prefix = p.ref.literal
        holder = driver["env"][index] if kind == "env" else driver[kind]
        key = "value" if kind == "env" else index
        original = str(holder[key])
        value = original[len(prefix[0]) :] if prefix else original
        moved = re.sub(rf":{port}$", f":{new_port}", value)
        holder[key] = (prefix[0] if prefix else "") + moved
        record["endpoint"] = [kind, index, original]
        listen, upstream = f"tcp://127.0.0.1:{port}", f"tcp://127.0.0.1:{new_port}"
        proxy_mounts = [{"name": TMP_VOLUME, "mountPath": "/tmp"}]
        reserved.add(new_port)
        if pod.get("hostNetwork"):
            space.node.add(new_port)

    # Who plugproxy runs as: over a socket, the driver's user; over TCP nothing on disk is
    # shared, and the image's own user will do.
    driver_uid = run_as_user(pod, driver)
    if p.loc[0] == "unix":
        proxy_uid, keep = proxy_identity(driver_uid, opts.proxy_user)
    else:
        proxy_uid, keep = (UID if opts.proxy_user is None else opts.proxy_user), []

    # The pod: group, grace period, annotations.
    security = pod.get("securityContext")
    group = (security or {}).get("fsGroup")
    if p.loc[0] == "unix" and group is None:
        # fsGroup gives every container the proxy's group: the CO side can open the 0660
        # socket, and the emptyDirs are group-writable.
        if security is None:
            security = _new_map(pod)
            _put(pod, "securityContext", security, before=("initContainers", "containers"))
            added.append("securityContext")
        security["fsGroup"] = group = UID
        added.append("fsGroup")
    term = pod.get("terminationGracePeriodSeconds", 30)
    grace = term - 5 if term >= 10 else term / 2
    chosen_grace = _serve_flag(opts.serve_args, "--shutdown-grace")
    if chosen_grace is not None and duration(chosen_grace) >= term:
        raise InjectError(
            f"{who}: --shutdown-grace {chosen_grace} is not below the pod's "
            f"terminationGracePeriodSeconds ({term})"
        )
    admin_host, admin_port, admin_given = admin_address(pod, who, opts, space, reserved)
    # A loopback admin (hostNetwork) is probed at the node's 127.0.0.1, and is no target
    # for Prometheus, which scrapes from elsewhere.
    probe_host = {"host": "127.0.0.1"} if admin_host in LOOPBACK else {}

    of_family = SPEC_OF_DEFAULT if p.ref.implied else SPEC_OF_FAMILY
    spec = opts.spec or of_family.get(p.family, "auto")
    args = ["serve", f"--listen={listen}", f"--upstream={upstream}", f"--spec={spec}"]
    if not admin_given:
        args.append(f"--admin-listen={admin_host}:{admin_port}")
    args.append(f"--validation={opts.validation}")
    if chosen_grace is None:
        args.append(f"--shutdown-grace={_grace(grace)}")
    on_the_node = p.loc[0] == "unix" and any(
        v.get("name") == record["mount"][1] and "hostPath" in v for v in pod.get("volumes") or []
    )
    if on_the_node and _serve_flag(opts.serve_args, "--listen-wait") is None:
        # A socket in a host directory outlives the pod: an updated pod's proxy can start
        # while the old one drains, and waits for the path as long as that may take.
        args.append(f"--listen-wait={_grace(term)}")
    if p.loc[0] == "tcp":
        args.append("--insecure-tcp")  # both hops on the pod's loopback
    validation = _serve_flag(opts.serve_args, "--validation") or opts.validation
    if validation != OFF and _serve_flag(opts.serve_args, "--violations-file") is None:
        # The auditor's record survives the proxy container's restarts.
        args.append(f"--violations-file={VIOLATIONS_FILE}")
        if _serve_flag(opts.serve_args, "--violations-file-max-bytes") is None:
            args.append(f"--violations-file-max-bytes={VIOLATIONS_MAX_BYTES}")
    args += opts.serve_args
    run_group = group if isinstance(group, int) else UID
    proxy = {
        "name": PROXY,
        "image": opts.image,
        "args": args,
        "ports": [{"name": ADMIN_PORT_NAME, "containerPort": admin_port, "protocol": "TCP"}],
        "livenessProbe": {
            "httpGet": {**probe_host, "path": "/healthz", "port": ADMIN_PORT_NAME},
            "periodSeconds": 10,
            "timeoutSeconds": 3,
        },
        "readinessProbe": {
            "httpGet": {**probe_host, "path": "/readyz", "port": ADMIN_PORT_NAME},
            "periodSeconds": 10,
            "timeoutSeconds": 3,
        },
        "resources": {
            "requests": {"cpu": "50m", "memory": "64Mi"},
            "limits": {"cpu": "1", "memory": "256Mi"},
        },
        "securityContext": {
            "runAsNonRoot": proxy_uid != 0,
            "runAsUser": proxy_uid,
            # Its socket (--socket-mode 0660) belongs to the pod's group, which fsGroup
            # gives every CO-side container, whatever user it runs as.
            "runAsGroup": run_group,
            "readOnlyRootFilesystem": True,
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"], **({"add": keep} if keep else {})},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "volumeMounts": proxy_mounts,
    }
    containers.insert(0, _convert(pod, proxy))

    prepared = ""  # the host directory an init container gives to the proxy's group
    volumes = pod.get("volumes")
    if volumes is None:
        volumes = _new_seq(pod)
        pod["volumes"] = volumes
        added.append("volumes")
    if p.loc[0] == "unix":
        volumes.append(
            _convert(
                pod, {"name": INNER_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}}
            )
        )
        socket_volume = next((v for v in volumes if v.get("name") == record["mount"][1]), None)
        if socket_volume is not None and "hostPath" in socket_volume and proxy_uid != 0:
            # kubelet creates the host directory root-owned 0755: a non-root proxy could not
            # create its socket there, so give the directory to the proxy's group.
            target = posixpath.dirname(_unix_path(listen) or "")
            prepare = {
                "name": PREPARE,
                "image": opts.image,
                # The image has no shell: its own subcommand does mkdir, chown and chmod.
                "args": ["prepare-dir", target, f"--owner=0:{run_group}", "--mode=0770"],
                "securityContext": {
                    "runAsUser": 0,
                    "runAsNonRoot": False,
                    "readOnlyRootFilesystem": True,
                    "allowPrivilegeEscalation": False,
                    "capabilities": {"drop": ["ALL"], "add": ["CHOWN"]},
                    "seccompProfile": {"type": "RuntimeDefault"},
                },
                "resources": {
                    "requests": {"cpu": "10m", "memory": "16Mi"},
                    "limits": {"cpu": "100m", "memory": "32Mi"},
                },
                "volumeMounts": [proxy_mounts[0]],
            }
            inits = pod.get("initContainers")
            if inits is None:
                inits = _new_seq(pod)
                _put(pod, "initContainers", inits, before=("containers",))
                added.append("initContainers")
            inits.append(_convert(pod, prepare))
            prepared = f"; {PREPARE} gives {target} to group {run_group} first"
    volumes.append(_convert(pod, {"name": TMP_VOLUME, "emptyDir": {"sizeLimit": TMP_SIZE}}))

    if meta.get("annotations") is None:
        meta["annotations"] = _new_map(meta)
        added.append("annotations")
    notes = meta["annotations"]
    if not probe_host and not any(k in notes for k in PROMETHEUS):
        for key, value in zip(PROMETHEUS, ("true", str(admin_port), "/metrics"), strict=True):
            notes[key] = value
        record["prometheus"] = True
    notes[RECORD] = json.dumps(record, separators=(",", ":"), sort_keys=True)
    outcome.changed = True

    # The summary line: what a reviewer of the change wants to know first.
    if opts.proxy_user is not None:
        why = "--proxy-user"
    elif p.loc[0] == "tcp":
        why = "TCP: no socket file to share with the driver"
    elif driver_uid is None:
        why = "the driver's user is not stated, so its image's, nearly always root"
    else:
        why = "the driver's user"
    user = "root" if proxy_uid == 0 else f"UID {proxy_uid}"
    if keep:
        user += " with " + ", ".join(keep)
    moved = (
        f"listens in the private volume {INNER_VOLUME} ({upstream} for plugproxy)"
        if p.loc[0] == "unix"
        else f"moved to {upstream}"
    )
    admin = f"{admin_host}:{admin_port}"
    if probe_host:
        admin += " (hostNetwork: the node's loopback, not scraped)"
    outcome.seen.append(
        Seen(
            who,
            INJECTED,
            f"driver {driver['name']}{f' (by {p.chosen_by})' if p.chosen_by else ''}; the CO"
            f" side ({', '.join(co_side) or 'kubelet'}) now "
            f"dials {listen} through plugproxy; the driver {moved}; spec {spec}; admin {admin}; "
            f"plugproxy runs as {user} ({why}){prepared}",
        )
    )


def remove_pod(
    pod: MutableMapping[str, Any],
    meta: MutableMapping[str, Any],
    who: str,
    outcome: Outcome,
    opts: InjectOptions | None = None,
) -> None:
    """Undo :func:`inject_pod` from its record."""
    annotations = meta.get("annotations") or {}
    if RECORD not in annotations:
        if has_proxy(pod):
            note = ("plugproxy was not added by `plugproxy inject`, so --remove leaves it", True)
            outcome.seen.append(Seen(who, HAND_WRITTEN, notes=(note,)))
        elif annotations.get(OPT_IN) == "false":
            outcome.seen.append(Seen(who, OPTED_OUT))
        elif _is_plugin(pod, annotations, who, opts or InjectOptions()):
            outcome.seen.append(Seen(who, NOT_INJECTED))  # removed already, as it were
        else:
            outcome.seen.append(Seen(who, UNCHANGED))
        return
    try:
        record = json.loads(annotations[RECORD])
        added = set(record["added"])
    except (ValueError, KeyError, TypeError):
        raise InjectError(
            f"{who}: annotation {RECORD} is not one `plugproxy inject` wrote"
        ) from None
    containers = pod["containers"]
    _drop(containers, PROXY)
    driver = next((c for c in containers if c.get("name") == record["driver"]), None)
    if driver is None:
        raise InjectError(f"{who}: container {record['driver']!r} named in {RECORD} is gone")
    if "mount" in record:
        index, name = record["mount"]
        driver["volumeMounts"][index]["name"] = name
    if "endpoint" in record:
        kind, index, original = record["endpoint"]
        if kind == "env":
            driver["env"][index]["value"] = original
        else:
            driver[kind][index] = original
    if record.get("wrapped"):  # injected by an earlier version
        del driver["command"][: len(UMASK_WRAPPER)]
    for key, names in (("initContainers", (PREPARE,)), ("volumes", (INNER_VOLUME, TMP_VOLUME))):
        for name in names:
            _drop(pod.get(key) or [], name)
        if key in added and not pod.get(key):
            del pod[key]
    if "fsGroup" in added:
        del pod["securityContext"]["fsGroup"]
    if "securityContext" in added and not pod.get("securityContext"):
        del pod["securityContext"]
    if record.get("prometheus"):
        for key in PROMETHEUS:
            annotations.pop(key, None)
    del annotations[RECORD]
    if "annotations" in added and not annotations:
        del meta["annotations"]
    outcome.changed = True
    outcome.seen.append(Seen(who, REMOVED, f"driver {record['driver']} wired as before"))


def _is_plugin(
    pod: MutableMapping[str, Any],
    annotations: MutableMapping[str, Any],
    who: str,
    opts: InjectOptions,
) -> bool:
    """Whether inject would take the pod for a plugin's (wire it, or refuse it as one)."""
    try:
        return plan(pod, annotations, who, opts) is not None
    except InjectError:
        return True


def _drop(items: MutableSequence[Any], name: str) -> None:
    for i, item in enumerate(items):
        if isinstance(item, MutableMapping) and item.get("name") == name:
            del items[i]
            return


# ------------------------------------------------------------------------ documents


def pods_of(doc: Any) -> Iterator[tuple[MutableMapping[str, Any], MutableMapping[str, Any], str]]:
    """(pod spec, the mapping holding its `metadata`, kind/namespace/name) of each workload."""
    if not isinstance(doc, MutableMapping):
        return
    kind = str(doc.get("kind", ""))
    if kind.endswith("List") and isinstance(doc.get("items"), MutableSequence):
        for item in doc["items"]:
            yield from pods_of(item)
        return
    who = _workload_name(kind, doc.get("metadata"))
    spec = doc.get("spec")
    if not isinstance(spec, MutableMapping):
        return
    if kind == "Pod":
        yield spec, doc, who
        return
    if kind == "CronJob":
        spec = (spec.get("jobTemplate") or {}).get("spec") or {}
    elif kind not in POD_TEMPLATE_KINDS:
        return
    template = spec.get("template")
    if isinstance(template, MutableMapping) and isinstance(template.get("spec"), MutableMapping):
        yield template["spec"], template, who


def transform(
    doc: Any, opts: InjectOptions, remove: bool = False, ports: PortSpace | None = None
) -> Outcome:
    """Inject into (or remove from) every workload of one parsed document, in place;
    `ports` is shared by the documents of one manifest set (see :class:`PortSpace`)."""
    outcome = Outcome()
    ports = ports or PortSpace()
    for pod, holder, who in list(pods_of(doc)):
        if not isinstance(pod.get("containers"), MutableSequence):
            continue
        meta = holder.get("metadata")
        detached = not isinstance(meta, MutableMapping)
        if detached:
            meta = _new_map(holder)  # attached only if something goes in it
        assert isinstance(meta, MutableMapping)
        if remove:
            remove_pod(pod, meta, who, outcome, opts)
            if not meta and not detached and isinstance(holder, CommentedMap):
                del holder["metadata"]  # it held only what injection had put there
        else:
            inject_pod(pod, meta, who, opts, outcome, ports)
            if detached and meta:
                _put(holder, "metadata", meta, before=("spec",))
    return outcome


def split_documents(text: str) -> list[str]:
    """The text of each document, its `---` line included; joined, they are the input."""
    chunks: list[str] = []
    current: list[str] = []
    for line in text.splitlines(keepends=True):
        if DOC_START.match(line) and current:
            chunks.append("".join(current))
            current = []
        current.append(line)
    if current:
        chunks.append("".join(current))
    return chunks


def _yaml() -> YAML:
    yaml = YAML(typ="rt")
    yaml.preserve_quotes = True
    yaml.width = 4096  # never fold a long line the input did not fold
    return yaml


def _sequence_style(body: str) -> tuple[int, int]:
    """(sequence indent, dash offset) of the first block sequence under a key: `key:` then
    `  - item` is the usual Kubernetes style (4, 2), `- item` flush with the key is (2, 0)."""
    lines = body.splitlines()
    for key_line, item_line in itertools.pairwise(lines):
        key, item = KEY_LINE.match(key_line), ITEM_LINE.match(item_line)
        if key and item and len(item[1]) >= len(key[1]):
            offset = len(item[1]) - len(key[1])
            return offset + 2, offset
    return 2, 0


def _dump(doc: Any, body: str) -> str:
    """The document in the indentation style its own text uses."""
    indent, offset = _sequence_style(body)
    yaml = _yaml()
    yaml.indent(mapping=2, sequence=indent, offset=offset)
    buf = io.StringIO()
    yaml.dump(doc, buf)
    return buf.getvalue()


@dataclass
class _Chunk:
    text: str  # as read
    head: str = ""  # its `---` line
    body: str = ""
    doc: Any = None  # parsed, where it may hold a pod spec


def _label(source: str) -> str:
    return "stdin" if source == "-" else source


def _not_yaml(exc: YAMLError, source: str, first_line: int) -> ConfigError:
    """One line naming the file and the line (counted in the whole file) of the error."""
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    problem = getattr(exc, "problem", None) or str(exc).strip().splitlines()[0]
    where = f"{_label(source)}:{first_line + mark.line}" if mark is not None else _label(source)
    context, opened = getattr(exc, "context", None), getattr(exc, "context_mark", None)
    if context and opened is not None and opened is not mark:
        problem += f" ({context} at line {first_line + opened.line})"
    return ConfigError(f"{where}: not valid YAML: {problem}")


def _parse(text: str, source: str) -> list[_Chunk]:
    loader = _yaml()
    chunks = []
    line = 1  # of the file, where the chunk starts
    for raw in split_documents(text):
        chunk = _Chunk(raw)
        chunks.append(chunk)
        start, line = line, line + raw.count("\n")
        if "containers" not in raw:
            # No pod spec in it (CRDs, RBAC, ConfigMaps): its syntax is checked, no more.
            try:
                for _ in loader.parse(raw):
                    pass
            except YAMLError as exc:
                raise _not_yaml(exc, source, start) from None
            continue
        chunk.body = raw
        if DOC_START.match(raw):
            head, _, body = raw.partition("\n")
            if head.strip() == "---":  # `--- {a: 1}`: content on the marker line; rare
                chunk.head, chunk.body = head + "\n", body
                start += 1
        try:
            chunk.doc = loader.load(chunk.body)
        except YAMLError as exc:
            raise _not_yaml(exc, source, start) from None
    return chunks


def _keep_original_lines(original: str, dumped: str) -> str:
    """The dumped document with the original's own lines wherever they differ only in
    whitespace: ruamel writes every block sequence of a document in one style, and real
    manifests mix styles (a flush `- item` list inside indented ones). Kept only if it
    still reads as the very same YAML."""
    old = original.splitlines(keepends=True)
    new = dumped.splitlines(keepends=True)

    def bare(lines: Sequence[str]) -> str:
        return "".join("".join(line.split()) for line in lines)

    matcher = difflib.SequenceMatcher(
        None, [bare([line]) for line in old], [bare([line]) for line in new], autojunk=False
    )

    def same_head(a: Sequence[str], b: Sequence[str]) -> tuple[int, int]:
        """(k, m): the longest a[:k] and b[:m] equal but for whitespace, over several lines
        (a flow mapping the dump joined into one)."""
        k = m = 0
        best = (0, 0)
        left = right = ""
        while k < len(a) or m < len(b):
            if (len(left) <= len(right) and k < len(a)) or m == len(b):
                left, k = left + bare([a[k]]), k + 1
            else:
                right, m = right + bare([b[m]]), m + 1
            if left == right:
                best = (k, m)
            elif not (left.startswith(right) or right.startswith(left)):
                break
        return best

    def indent(line: str) -> int:
        return len(line) - len(line.lstrip(" "))

    def shifted(lines: Sequence[str], by: int) -> list[str]:
        """New lines moved to the original's indentation where they go (a block sequence
        the original indents and the dump writes flush, or the other way round)."""
        if by >= 0:
            return [" " * by + line if line.strip() else line for line in lines]
        return [line[min(-by, indent(line)) :] for line in lines]

    out: list[str] = []
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            out += old[i1:i2]
            continue
        olds, news = old[i1:i2], new[j1:j2]
        k, m = same_head(olds, news)
        tail_k, tail_m = same_head(olds[k:][::-1], news[m:][::-1])
        # The lines around the change say how far the original's indentation is from the
        # dump's there; the next one first (an item inserted before its siblings).
        by = 0
        if i2 < len(old) and j2 < len(new):
            by = indent(old[i2]) - indent(new[j2])
        elif i1 and j1:
            by = indent(old[i1 - 1]) - indent(new[j1 - 1])
        middle = shifted(news[m : len(news) - tail_m], by)
        out += olds[:k] + middle + olds[len(olds) - tail_k :]
    text = "".join(out)
    if text == dumped:
        return dumped
    check = YAML(typ="safe", pure=True)
    try:
        same = bool(check.load(text) == check.load(dumped))
    except YAMLError:
        same = False
    return text if same else dumped


@dataclass
class Result:
    """What one run made of a manifest set."""

    texts: list[str] = field(default_factory=list)  # one per source, in order
    warnings: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # workloads that cannot be wired
    seen: list[Seen] = field(default_factory=list)  # every workload, in order


def transform_texts(
    sources: Sequence[tuple[str, str]], opts: InjectOptions, remove: bool = False
) -> Result:
    """Inject into (or remove from) (text, source name) pairs that form one manifest set:
    every workload changed; documents left alone keep their bytes. Admin ports are chosen
    across the whole set, so that its hostNetwork workloads never collide on a node."""
    parsed = [_parse(text, source) for text, source in sources]
    ports = PortSpace()
    for chunk in itertools.chain.from_iterable(parsed):
        for pod, _, _ in pods_of(chunk.doc):
            ports.scan(pod)
    result = Result()
    texts, warnings, errors = result.texts, result.warnings, result.errors
    for chunks in parsed:
        out = []
        for chunk in chunks:
            if chunk.doc is None:
                out.append(chunk.text)
                continue
            try:
                outcome = transform(chunk.doc, opts, remove, ports)
            except InjectError as exc:
                errors.append(str(exc))
                continue
            warnings += outcome.warnings
            result.seen += outcome.seen
            changed = outcome.changed
            if changed:
                dumped = _keep_original_lines(chunk.body, _dump(chunk.doc, chunk.body))
                out.append(chunk.head + dumped)
            else:
                out.append(chunk.text)
        texts.append("".join(out))
    return result


def transform_text(
    text: str, source: str, opts: InjectOptions, remove: bool = False
) -> tuple[str, list[str]]:
    """One text as a manifest set of its own; any workload that cannot be wired raises."""
    result = transform_texts([(text, source)], opts, remove)
    if result.errors:
        raise InjectError("; ".join(result.errors))
    (out,) = result.texts
    return out, result.warnings


# ------------------------------------------------------------------------ command line


def add_injection_arguments(parser: argparse.ArgumentParser) -> None:
    """What the injected proxy looks like: shared by `inject` and `webhook`."""
    parser.add_argument(
        "--image",
        help=f"plugproxy image to run (default: {DEFAULT_IMAGE}, the local name `make image` "
        "builds; no public registry serves it, so push it and name it here)",
    )
    parser.add_argument(
        "--validation",
        default="audit",
        choices=[m for m in MODES if m != "off"],
        help="what the proxy does with spec violations (default: audit)",
    )
    parser.add_argument(
        "--serve-arg",
        dest="serve_args",
        action="append",
        default=[],
        metavar="FLAG",
        help="one more `plugproxy serve` flag, e.g. --serve-arg=--serialize=wait; repeatable",
    )
    parser.add_argument(
        "--spec",
        choices=("auto", *SPEC_NAMES),
        help="spec the proxy decodes calls with (default: told by the endpoint)",
    )
    parser.add_argument(
        "--proxy-user",
        metavar="UID",
        help="UID plugproxy runs as (default: the driver's; root if the manifests do not say)",
    )
    parser.add_argument(
        "--node-reachable-admin",
        action="store_true",
        help="on hostNetwork, bind the admin server to the node's addresses (0.0.0.0) and "
        "annotate for Prometheus (default: 127.0.0.1, probed there, not scraped)",
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "paths",
        nargs="*",
        default=["-"],
        metavar="PATH",
        help="YAML files or directories (*.yaml, *.yml); - or nothing: stdin",
    )
    add_injection_arguments(parser)
    parser.add_argument(
        "--driver-container",
        metavar="NAME",
        help="the container serving the plugin socket, where the manifests do not say",
    )
    parser.add_argument("--remove", action="store_true", help="take injected plugproxy out again")
    parser.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        help="no summary on stderr (warnings and errors are still written)",
    )
    parser.description = (
        "Add plugproxy to the workloads of Kubernetes manifests that run a plugin. stdout "
        "carries the manifests (or the diff) only; stderr a line per workload injected, "
        "already injected or opted out, one per warning, and a count."
    )
    parser.epilog = (
        "Exit status: 0 done; 1 nothing to inject (no workload runs a plugin; with --remove, "
        "none has plugproxy added by inject); 2 an error (input that is not YAML, a workload "
        "that cannot be wired, a bad flag), and nothing is written. docs/injecting.md has "
        "the details."
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument(
        "--diff", action="store_true", help="print a unified diff instead of the manifests"
    )
    mode.add_argument(
        "-i", "--in-place", action="store_true", help="rewrite the files (not for stdin)"
    )


class _ServeArgParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise ConfigError(f"--serve-arg: not accepted by `plugproxy serve`: {message}")


def check_serve_args(serve_args: Sequence[str]) -> None:
    """Extra serve flags must be ones `plugproxy serve` accepts: fail here, not in the pod."""
    parser = _ServeArgParser(prog="plugproxy serve", add_help=False)
    add_options(parser, serve.all_options(), environ={})
    parser.parse_args(list(serve_args))
    for flag in ("--listen", "--upstream"):
        if _serve_flag(serve_args, flag) is not None:
            raise ConfigError(f"--serve-arg {flag}: inject sets it from the manifests")


def parse_proxy_user(raw: str | None) -> int | None:
    if raw is None:
        return None
    if not raw.isdigit() or int(raw) > MAX_UID:
        raise ConfigError(f"--proxy-user {raw!r}: expected a numeric UID, 0 to {MAX_UID}")
    return int(raw)


def options_from(ns: argparse.Namespace) -> InjectOptions:
    check_serve_args(ns.serve_args)
    return InjectOptions(
        DEFAULT_IMAGE if ns.image is None else ns.image,
        ns.validation,
        tuple(ns.serve_args),
        getattr(ns, "driver_container", None),  # `webhook` reads it from the pod
        ns.spec,
        parse_proxy_user(ns.proxy_user),
        ns.node_reachable_admin,
    )


def input_files(paths: Sequence[str], in_place: bool = False) -> list[str]:
    """The files ``paths`` name (directories: their YAML files below); "-" is stdin, which
    --in-place cannot rewrite."""
    if in_place and "-" in paths:
        raise ConfigError("--in-place needs files, not stdin")
    files: list[str] = []
    for raw in paths:
        path = pathlib.Path(raw)
        if raw == "-":
            files.append(raw)
        elif path.is_dir():
            found = sorted(
                str(p) for p in path.rglob("*") if p.suffix in (".yaml", ".yml") and p.is_file()
            )
            if not found:
                raise ConfigError(f"{raw}: no *.yaml or *.yml files in the directory")
            files += found
        elif path.is_file():
            files.append(raw)
        else:
            raise ConfigError(f"{raw}: no such file or directory")
    return files


async def run(ns: argparse.Namespace) -> int:
    return run_sync(ns)


def read_source(name: str) -> str:
    try:
        return sys.stdin.read() if name == "-" else pathlib.Path(name).read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{_label(name)}: not UTF-8 text (byte {exc.start})") from None


# How inject recognises a plugin, for the "nothing to inject" error.
HOW_FOUND = (
    "a container given a plugin address (--endpoint, --csi-endpoint, CSI_ENDPOINT, "
    "COSI_ENDPOINT, CMI_ENDPOINT) that another container dials (--csi-address) or kubelet "
    "reaches in a hostPath; where the manifests do not say which container serves the "
    'socket, name it with --driver-container NAME (docs/injecting.md, "How it finds the '
    'plugin")'
)


def nothing_to_do(seen: Sequence[Seen], remove: bool) -> str | None:
    """The one-line error for input that holds nothing inject acts on, or None.

    Inject and --remove answer alike: input with no plugin workload at all (none to wire,
    none wired already, none opted out) is nothing to do, exit 1. A plugin already in the
    state asked for (injected, for inject; not injected, for --remove) is no error: running
    either twice changes nothing and succeeds."""
    relevant = (
        (REMOVED, HAND_WRITTEN, NOT_INJECTED, OPTED_OUT)
        if remove
        else (INJECTED, ALREADY, OPTED_OUT)
    )
    if any(s.status in relevant for s in seen):
        return None
    read = (
        f"none of the {len(seen)} workloads read runs a plugin"
        if seen
        else "no workload (Deployment, DaemonSet, Pod, ...) in the input"
    )
    return f"nothing to {'remove' if remove else 'inject'}: {read}; inject looks for {HOW_FOUND}"


# How the summary names a workload left as it was, by its status.
LEFT = {
    ALREADY: "already injected, left unchanged",
    NOT_INJECTED: "not injected, left unchanged",
    OPTED_OUT: f'opted out ({OPT_IN}: "false"), left unchanged',
    UNCHANGED: "left unchanged",
    HAND_WRITTEN: "left unchanged",
}


def summary(seen: Sequence[Seen], remove: bool, default_image: bool) -> tuple[list[str], list[str]]:
    """(lines, warnings) for stderr: a line per workload changed, already in the state
    asked for or opted out, then the count; warnings for what looked like a plugin but is
    not wired, and for choices made on the user's behalf."""
    lines: list[str] = []
    warnings: list[str] = []
    for s in seen:
        if s.status in (INJECTED, REMOVED):
            lines.append(f"{s.who}: {s.status}: {s.detail}")
        elif s.status != UNCHANGED and not s.notes:
            lines.append(f"{s.who}: {LEFT[s.status]}" + (f": {s.detail}" if s.detail else ""))
        for text, warn in s.notes:
            (warnings if warn else lines).append(f"{s.who}: {LEFT[s.status]}: {text}")
    if default_image and any(s.status == INJECTED for s in seen):
        warnings.append(
            f"no --image given: the proxy runs {DEFAULT_IMAGE}, the local name `make image` "
            "builds, which no public registry serves; push it to your registry and pass "
            "--image REGISTRY/plugproxy:TAG"
        )
    done = sum(s.status in (INJECTED, REMOVED) for s in seen)
    same = sum(s.status == (NOT_INJECTED if remove else ALREADY) for s in seen)
    count = f"{'removed plugproxy from' if remove else 'injected'} {done} of {len(seen)} workloads"
    if len(seen) > done:
        count += f"; {len(seen) - done} left unchanged"
        if same:
            count += f" ({same} {'not injected' if remove else 'already injected'})"
    lines.append(count)
    return lines, warnings


def run_sync(ns: argparse.Namespace) -> int:
    try:
        opts = options_from(ns)
        files = input_files(ns.paths, ns.in_place)
        sources = [(read_source(name), name) for name in files]
        result = transform_texts(sources, opts, ns.remove)
    except ConfigError as exc:
        # The same prefix as every other line inject writes on stderr.
        print(f"plugproxy inject: error: {exc}", file=sys.stderr)
        return 2
    results = [(name, text, new) for (text, name), new in zip(sources, result.texts, strict=True)]
    for line in result.warnings:
        print(f"plugproxy inject: warning: {line}", file=sys.stderr)
    if result.errors:
        # Nothing is written when any workload cannot be wired: never half an injection.
        for line in result.errors:
            print(f"plugproxy inject: error: {line}", file=sys.stderr)
        return 2
    nothing = nothing_to_do(result.seen, ns.remove)
    if nothing is not None:
        print(f"plugproxy inject: error: {nothing}", file=sys.stderr)
        return 1
    code = write_results(ns, results)
    lines, warnings = summary(result.seen, ns.remove, ns.image is None)
    for line in warnings:
        print(f"plugproxy inject: warning: {line}", file=sys.stderr)
    if not ns.quiet:
        for line in lines:
            print(f"plugproxy inject: {line}", file=sys.stderr)
    return code


def write_results(ns: argparse.Namespace, results: Sequence[tuple[str, str, str]]) -> int:
    """The manifests, the diff or the files: (source name, text read, text made) each."""
    if ns.diff:
        for name, old, new in results:
            label = _label(name)
            sys.stdout.writelines(
                difflib.unified_diff(
                    old.splitlines(keepends=True),
                    new.splitlines(keepends=True),
                    f"a/{label}",
                    f"b/{label}",
                )
            )
        return 0
    if ns.in_place:
        for name, old, new in results:
            if new != old:
                pathlib.Path(name).write_text(new, encoding="utf-8")
        return 0
    for i, (_, _, new) in enumerate(results):
        if i and not DOC_START.match(new):
            sys.stdout.write("---\n")
        sys.stdout.write(new if new.endswith("\n") or not new else new + "\n")
    return 0
