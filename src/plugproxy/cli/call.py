"""``plugproxy call``: send one call to a plugin or a proxy and print the answer as JSON.

A small command-line client, like gocsi's ``csc`` or grpcurl, for every method of the bundled
specs and of ``--descriptor-set`` files. The request is written in protobuf's JSON mapping
(field names as the spec spells them, or their lowerCamel JSON names) and encoded with the
method's own message class from the spec's descriptor pool; the answer is printed on standard
output as JSON with the spec's field names, one document per message of a stream, as the
messages arrive. The request goes out as given, secret fields included: it is the caller's
own call.

METHOD is a full name (``/csi.v1.Identity/GetPluginInfo``, ``csi.v1.Identity.GetPluginInfo``)
or its tail (``Identity/GetPluginInfo``, ``GetPluginInfo``). A tail that names methods of
several specs is refused with the candidates listed; ``--spec`` narrows the search.

Exit status: 0 the call ended OK; 1 it ended with another gRPC status, printed on standard
error as ``CODE: message`` (request secrets in the message masked); 2 a usage or
configuration error (unknown or ambiguous method, a request that does not fit the method's
message, unusable TLS files), printed as one line; 130 interrupted.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import difflib
import json
import os
import re
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from plugproxy.api import CallKind, MethodInfo, SpecInfo
from plugproxy.core.endpoints import ConfigError, Endpoint, Scheme, parse_endpoint
from plugproxy.core.options import byte_size, duration
from plugproxy.spec.registry import SPEC_ALIASES, SPEC_NAMES, Registry, declared_paths

if TYPE_CHECKING:
    from google.protobuf.message import Message

EXIT_OK, EXIT_STATUS, EXIT_USAGE = 0, 1, 2

# Where a CO or a driver of each spec family reads the plugin's address (csc does the same
# with CSI_ENDPOINT); the default of --endpoint for that family's methods.
ENDPOINT_VARIABLES = {"csi": "CSI_ENDPOINT", "cosi": "COSI_ENDPOINT", "cmi": "CMI_ENDPOINT"}

DESCRIPTION = """\
Send one call to a plugin or proxy socket and print the answer as JSON (one document per
message of a stream). METHOD is a full name (/csi.v1.Identity/GetPluginInfo) or its tail
(Identity/GetPluginInfo, GetPluginInfo). REQUEST is JSON in protobuf's JSON mapping; -
reads it from standard input (client- and bidi-streaming methods read JSON lines or a JSON
array there, and do so by default).
"""

EPILOG = """\
examples:
  plugproxy call --endpoint unix:///tmp/csi.sock --spec csi.v1 GetPluginInfo
  plugproxy call -e unix:///tmp/csi.sock csi.v1.Controller/CreateVolume \\
      '{"name": "pvc-1", "volume_capabilities": [{"mount": {},
        "access_mode": {"mode": "SINGLE_NODE_WRITER"}}], "secrets": {"token": "t0k3n"}}'
  echo '{}' | plugproxy call -e unix:///tmp/csi.sock --spec csi.v1 Probe -
  plugproxy call -e unix:///var/lib/kubelet/device-plugins/fake.sock ListAndWatch \\
      --max-messages 1
  plugproxy call -e tls://appliance:7443 --tls-ca ca.crt --tls-cert client.crt \\
      --tls-key client.key --spec csi.v1 Probe
  plugproxy call --list --spec csi.v1

exit status: 0 OK; 1 the call ended with a gRPC status other than OK (printed on stderr as
CODE: message); 2 usage or configuration error; 130 interrupted.

bash completion of method names:
  complete -W "$(plugproxy call --list)" plugproxy
"""

_TLS_FLAGS = (("--tls-ca", "tls_ca"), ("--tls-cert", "tls_cert"), ("--tls-key", "tls_key"))
_METADATA_KEY = re.compile(r"[0-9a-z_.-]+")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = DESCRIPTION
    parser.epilog = EPILOG
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("method", nargs="?", metavar="METHOD", help="the method to call")
    parser.add_argument(
        "request",
        nargs="?",
        metavar="REQUEST",
        help="the request as JSON, or - to read it from standard input (default: {})",
    )
    parser.add_argument(
        "-e",
        "--endpoint",
        metavar="URL",
        help="where to call: unix:///path/to.sock (or just the path), tls://host:port (mutual"
        " TLS, see --tls-ca), tcp://host:port (with --insecure-tcp); default: CSI_ENDPOINT,"
        " COSI_ENDPOINT or CMI_ENDPOINT for a method of that spec",
    )
    parser.add_argument(
        "--spec",
        metavar="NAME",
        help="look METHOD up in this spec only (csi.v1, csi.v0, cosi.v1alpha1, cosi.v1alpha2,"
        " cmi.v1, kms, device-plugin, dra, dra.v1beta1, dra-health, plugin-registration, or a"
        " --descriptor-set's spec)",
    )
    parser.add_argument(
        "--descriptor-set",
        action="append",
        default=[],
        metavar="FILE",
        help="also know the services of this binary FileDescriptorSet, as serve's"
        " --descriptor-set does (repeatable)",
    )
    parser.add_argument(
        "-H",
        "--metadata",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="request metadata (repeatable); the value of a key ending in -bin is base64",
    )
    parser.add_argument(
        "--timeout",
        type=duration,
        metavar="DURATION",
        help="deadline of the call, e.g. 10s or 500ms (default: none)",
    )
    parser.add_argument(
        "--max-messages",
        type=int,
        metavar="N",
        help="stop a server-streaming call after N messages (exit 0)",
    )
    parser.add_argument(
        "--list",
        action="store_true",
        help="print the full name of every method known (of --spec, or matching METHOD) and exit",
    )
    parser.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="show the method, the response headers and trailers and the status on stderr",
    )
    parser.add_argument(
        "--compact", action="store_true", help="print each message on one line (JSON lines)"
    )
    parser.add_argument(
        "--emit-defaults",
        action="store_true",
        help="print fields that hold their default value too (0, false, empty)",
    )
    parser.add_argument(
        "--max-message-bytes",
        type=byte_size,
        default=16 * 1024 * 1024,
        metavar="SIZE",
        help="largest message sent or accepted (default: 16MiB)",
    )
    tls = parser.add_argument_group("TLS (tls:// endpoints: the same flags as serve's bridge)")
    tls.add_argument("--tls-ca", metavar="FILE", help="PEM CA bundle the server must chain to")
    tls.add_argument("--tls-cert", metavar="FILE", help="PEM client certificate (chain)")
    tls.add_argument("--tls-key", metavar="FILE", help="PEM private key of --tls-cert")
    tls.add_argument(
        "--tls-server-name",
        metavar="NAME",
        help="name the server's certificate must carry (default: the endpoint's host)",
    )
    tls.add_argument(
        "--insecure-tcp",
        action="store_true",
        help="allow tcp:// without TLS (the call and its secrets cross the network in plaintext)",
    )


# -- methods ------------------------------------------------------------------------------


def _dotted(path: str) -> str:
    """'/csi.v1.Identity/GetPluginInfo' -> 'csi.v1.Identity.GetPluginInfo'."""
    return path.strip().lstrip("/").replace("/", ".")


@dataclass
class Catalogue:
    """Every method the call can encode: full path -> the name of its spec."""

    registry: Registry
    paths: dict[str, str]
    spec: str | None = None  # the --spec it is narrowed to

    @classmethod
    def build(cls, descriptor_sets: Sequence[str], spec: str | None) -> Catalogue:
        # Lazy: only the spec of the method called gets its descriptor pool built.
        registry = Registry(SPEC_NAMES, descriptor_sets, lazy=True)
        paths = {path: name for name in SPEC_NAMES for path in declared_paths(name)}
        # A lazy registry lists the descriptor sets' methods only, the bundled ones on demand.
        paths.update((m.path, m.spec_name) for m in registry.methods())
        chosen = None
        if spec is not None:
            chosen = SPEC_ALIASES.get(spec, spec)
            if chosen not in registry.specs:
                known = ", ".join([*registry.specs, *SPEC_ALIASES])
                raise ConfigError(f"--spec {spec!r}: no such spec; known: {known}")
            paths = {path: name for path, name in paths.items() if name == chosen}
        return cls(registry, paths, chosen)

    def matching(self, name: str) -> list[str]:
        """The full paths ``name`` names: all of it, or its tail at a '.' or '/'."""
        wanted = _dotted(name)
        if not wanted:
            return []
        found = sorted(
            path
            for path in self.paths
            if (dotted := _dotted(path)) == wanted or dotted.endswith("." + wanted)
        )
        exact = [path for path in found if _dotted(path) == wanted]
        return exact or found

    def resolve(self, name: str) -> MethodInfo:
        """The one method ``name`` names; ConfigError (one line) when none or several do."""
        found = self.matching(name)
        if len(found) > 1:
            specs = sorted({self.paths[path] for path in found})
            raise ConfigError(
                f"method {name!r} is ambiguous: {', '.join(found)}; give the full name or"
                f" --spec ({', '.join(specs)})"
            )
        if not found:
            close = self.close_matches(name)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            where = f" in spec {self.spec}" if self.spec else ""
            raise ConfigError(
                f"unknown method {name!r}{where}{hint} (plugproxy call --list lists them;"
                " --descriptor-set adds other APIs)"
            )
        return self.registry.lookup(found[0])

    def close_matches(self, name: str, limit: int = 5) -> list[str]:
        """Known methods whose name ends much like ``name`` (compared as many '.'-separated
        parts as ``name`` has, ignoring case)."""
        wanted = _dotted(name).lower()
        depth = wanted.count(".") + 1
        by_tail: dict[str, list[str]] = {}
        for path in self.paths:
            tail = ".".join(_dotted(path).split(".")[-depth:]).lower()
            by_tail.setdefault(tail, []).append(path)
        tails = difflib.get_close_matches(wanted, list(by_tail), n=limit, cutoff=0.6)
        return [path for tail in tails for path in sorted(by_tail[tail])][:limit]


# -- requests -----------------------------------------------------------------------------


class RequestError(ConfigError):
    """A request that is not JSON, or does not fit the method's request message."""


_FAILED_FIELD = re.compile(r"Failed to parse (\S+) field: ")
_NO_FIELD = re.compile(r'Message type "([^"]+)" has no field named "([^"]+)"(?: at "([^"]*)")?')


def _leads_to_secret(spec: SpecInfo, message: Any, names: Sequence[str]) -> bool:
    """Whether the field path ``names`` from ``message`` (a descriptor) passes through a
    field plugproxy masks; True as well when the path cannot be followed."""
    from plugproxy.spec import redact  # noqa: PLC0415 (only when a request does not parse)

    redactor = redact.for_specs([spec])
    desc = message
    for name in names:
        if desc is None:
            return True
        fd = desc.fields_by_name.get(name) or next(
            (f for f in desc.fields if f.json_name == name), None
        )
        if fd is None or spec.is_secret_field(fd) or redactor.is_masked(fd):
            return True
        target = fd.message_type
        if target is not None and target.GetOptions().map_entry:
            target = target.fields_by_name["value"].message_type
        desc = target
    return False


def describe_parse_error(text: str, spec: SpecInfo, message: Any) -> str:
    """protobuf's ParseError text as one line naming the field; the value it quotes is left
    out when the field is secret (the request's own secrets stay off the terminal)."""
    first = text.strip().splitlines()[0] if text.strip() else "does not parse"
    names: list[str] = []
    while match := _FAILED_FIELD.match(first):
        names.append(match.group(1))
        first = first[match.end() :]
    unknown = _NO_FIELD.search(first)
    if unknown is not None:
        type_name, field_name, where = unknown.groups()
        try:
            known = [f.name for f in spec.descriptor(type_name).fields]
        except KeyError:
            known = []
        close = difflib.get_close_matches(field_name, known, n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        if type_name == message.full_name:
            return f"unknown field {field_name!r}{hint}"
        return f"unknown field {field_name!r} at {where or '?'} ({type_name}){hint}"
    path = ".".join(names) or message.name
    if _leads_to_secret(spec, message, names):
        return f"field {path}: not a valid value (not shown: the field is secret)"
    return f"field {path}: {first.strip().rstrip('.')}"


@dataclass
class Encoder:
    """JSON values to request bytes for one method; ``sent`` keeps the messages."""

    info: MethodInfo
    sent: list[Message] = field(default_factory=list)

    def encode(self, value: Any, number: int | None = None) -> bytes:
        from google.protobuf import json_format  # noqa: PLC0415

        info = self.info
        assert info.spec is not None and info.request_class is not None
        which = "request" if number is None else f"request {number}"
        request_type = info.request_class.DESCRIPTOR
        if not isinstance(value, dict):
            raise RequestError(
                f"{which}: expected a JSON object ({request_type.full_name}),"
                f" got {_json_kind(value)}"
            )
        message = info.request_class()
        try:
            json_format.ParseDict(value, message, descriptor_pool=info.spec.pool)
        except json_format.ParseError as exc:
            problem = describe_parse_error(str(exc), info.spec, request_type)
            raise RequestError(f"{which} ({request_type.full_name}): {problem}") from None
        except (TypeError, ValueError, AttributeError, KeyError):
            raise RequestError(
                f"{which}: does not fit {request_type.full_name} (check the field types)"
            ) from None
        self.sent.append(message)
        return bytes(message.SerializeToString())


def _json_kind(value: Any) -> str:
    if isinstance(value, list):
        return "an array"
    if isinstance(value, str):
        return "a string"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    return "a number"


class JsonValues:
    """Splits text, fed a line at a time, into JSON values: JSON lines, values one after
    another on any number of lines, or arrays of them (each element one value)."""

    def __init__(self) -> None:
        self._buffer = ""
        self._decoder = json.JSONDecoder()
        self.count = 0

    def feed(self, text: str) -> list[Any]:
        self._buffer += text
        return self._take(final=False)

    def finish(self) -> list[Any]:
        return self._take(final=True)

    def _take(self, final: bool) -> list[Any]:
        out: list[Any] = []
        while True:
            rest = self._buffer.lstrip()
            if not rest:
                self._buffer = ""
                return out
            try:
                value, end = self._decoder.raw_decode(rest)
            except json.JSONDecodeError as exc:
                # Fed whole lines, only a value still open at the end can grow into JSON.
                if not final and exc.pos >= len(rest.rstrip()):
                    self._buffer = rest
                    return out
                raise RequestError(
                    f"request {self.count + 1} is not JSON: {exc.msg} (line {exc.lineno}"
                    f" column {exc.colno})"
                ) from None
            self._buffer = rest[end:]
            for item in value if isinstance(value, list) else [value]:
                self.count += 1
                out.append(item)


def _one_request(text: str, source: str) -> Any:
    """The one JSON value of a unary request (``source`` names where it came from)."""
    if not text.strip():
        return {}
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise RequestError(
            f"{source} is not JSON: {exc.msg} (line {exc.lineno} column {exc.colno})"
        ) from None


def _inline_values(text: str) -> list[Any]:
    values = JsonValues()
    return [*values.feed(text), *values.finish()]


async def _stdin_lines() -> AsyncIterator[str]:
    """Standard input a line at a time, as it comes (a bidi call may answer each line before
    the next is typed). A daemon thread reads, so a call that ends first is not held up."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[str | None] = asyncio.Queue()

    def put(item: str | None) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is gone: the call is over
            loop.call_soon_threadsafe(queue.put_nowait, item)

    def pump() -> None:
        with contextlib.suppress(OSError, ValueError):
            while line := sys.stdin.readline():
                put(line)
        put(None)

    threading.Thread(target=pump, name="plugproxy-call-stdin", daemon=True).start()
    while (line := await queue.get()) is not None:
        yield line


async def _stream_values(
    inline: Sequence[Any] | None,
) -> AsyncIterator[Any]:
    if inline is not None:
        for value in inline:
            yield value
        return
    values = JsonValues()
    async for line in _stdin_lines():
        for value in values.feed(line):
            yield value
    for value in values.finish():
        yield value


# -- metadata and output -------------------------------------------------------------------


def parse_metadata(items: Iterable[str]) -> list[tuple[str, str | bytes]]:
    out: list[tuple[str, str | bytes]] = []
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip().lower()
        if not sep or not _METADATA_KEY.fullmatch(key):
            raise ConfigError(
                f"--metadata {item!r}: expected KEY=VALUE, the key of letters, digits, - _ ."
            )
        if key.startswith("grpc-"):
            raise ConfigError(f"--metadata {key}: grpc- keys are gRPC's own")
        if key.endswith("-bin"):
            try:
                out.append((key, base64.b64decode(value, validate=True)))
            except ValueError:
                raise ConfigError(f"--metadata {key}: the value of a -bin key is base64") from None
            continue
        if not all(" " <= ch <= "~" for ch in value):
            raise ConfigError(f"--metadata {key}: the value must be printable ASCII")
        out.append((key, value))
    return out


def _show_metadata(kind: str, pairs: Any) -> None:
    for key, value in pairs or ():
        shown = base64.b64encode(value).decode() if isinstance(value, bytes) else value
        print(f"{kind} {key}: {shown}", file=sys.stderr)


@dataclass
class Printer:
    info: MethodInfo
    compact: bool
    emit_defaults: bool
    printed: int = 0

    def answer(self, raw: bytes) -> None:
        from google.protobuf import json_format  # noqa: PLC0415
        from google.protobuf.message import DecodeError  # noqa: PLC0415

        info = self.info
        assert info.spec is not None and info.response_class is not None
        try:
            message = info.response_class.FromString(raw)
        except DecodeError:
            raise AnswerError(
                f"the answer ({len(raw)} bytes) is not a valid"
                f" {info.response_class.DESCRIPTOR.full_name}"
            ) from None
        text = json_format.MessageToJson(
            message,
            preserving_proto_field_name=True,
            indent=None if self.compact else 2,
            ensure_ascii=False,
            descriptor_pool=info.spec.pool,
            always_print_fields_with_no_presence=self.emit_defaults,
        )
        print(text, flush=True)
        self.printed += 1


class AnswerError(Exception):
    """An answer that is not the method's response message."""


# -- the call -----------------------------------------------------------------------------


def _endpoint(ns: argparse.Namespace, info: MethodInfo) -> tuple[Endpoint, str]:
    """The endpoint and what to call it in messages (the flag or the variable)."""
    if ns.endpoint:
        return parse_endpoint(ns.endpoint, "--endpoint"), "--endpoint"
    family = info.spec.family if info.spec is not None else ""
    variable = ENDPOINT_VARIABLES.get(family)
    value = os.environ.get(variable, "") if variable else ""
    if variable and value:
        return parse_endpoint(value, variable), variable
    also = f" (or {variable})" if variable else ""
    raise ConfigError(
        f"--endpoint is required{also}: unix:///path/to.sock, tls://host:port or tcp://host:port"
    )


def _credentials(ns: argparse.Namespace, endpoint: Endpoint, source: str) -> Any:
    """grpc channel credentials for a tls:// endpoint (None otherwise); refuses settings that
    cannot work, in the words serve uses for its upstream."""
    given = [flag for flag, dest in _TLS_FLAGS if getattr(ns, dest, None)]
    if ns.tls_server_name:
        given.append("--tls-server-name")
    if endpoint.scheme is not Scheme.TLS:
        if given:
            raise ConfigError(f"{', '.join(given)} given but {source} {endpoint} is not tls://")
        if endpoint.scheme is Scheme.TCP and not ns.insecure_tcp:
            raise ConfigError(
                f"{source} {endpoint}: plain tcp:// sends the call and its secrets unencrypted;"
                " use tls:// with --tls-ca/--tls-cert/--tls-key, or pass --insecure-tcp to"
                " accept that"
            )
        return None
    missing = [flag for flag, dest in _TLS_FLAGS if not getattr(ns, dest, None)]
    if missing:
        raise ConfigError(
            f"{source} {endpoint} needs {', '.join(missing)} (mutual TLS: CA, certificate, key)"
        )
    from plugproxy.net import transport  # noqa: PLC0415
    from plugproxy.net.tlsfiles import TLSPaths  # noqa: PLC0415

    material = transport.load_or_config_error(TLSPaths(ns.tls_ca, ns.tls_cert, ns.tls_key))
    return transport.channel_credentials(material)


def _channel(ns: argparse.Namespace, endpoint: Endpoint, credentials: Any) -> Any:
    import grpc  # noqa: PLC0415

    options: list[tuple[str, Any]] = [
        ("grpc.max_receive_message_length", ns.max_message_bytes),
        ("grpc.max_send_message_length", ns.max_message_bytes),
        # The endpoint is the plugin or the proxy itself, never through an HTTP proxy.
        ("grpc.enable_http_proxy", 0),
    ]
    if credentials is None:
        return grpc.aio.insecure_channel(endpoint.grpc_target, options)
    if ns.tls_server_name:
        options.append(("grpc.ssl_target_name_override", ns.tls_server_name))
    return grpc.aio.secure_channel(endpoint.grpc_target, credentials, options)


_STUBS = {
    CallKind.UNARY_UNARY: "unary_unary",
    CallKind.UNARY_STREAM: "unary_stream",
    CallKind.STREAM_UNARY: "stream_unary",
    CallKind.STREAM_STREAM: "stream_stream",
}


@dataclass
class _Outbound:
    """The request stream of a client- or bidi-streaming call."""

    encoder: Encoder
    inline: Sequence[Any] | None
    error: RequestError | None = None

    async def messages(self) -> AsyncIterator[bytes]:
        number = 0
        try:
            async for value in _stream_values(self.inline):
                number += 1
                yield self.encoder.encode(value, number)
        except RequestError as exc:
            # Raised into grpc, which cancels the call rather than half-close it: a request
            # stream cut short must not pass for a whole one. The error is reported here.
            self.error = exc
            raise


def _masked(text: str, secrets: frozenset[str]) -> str:
    for value in sorted(secrets, key=len, reverse=True):
        text = text.replace(value, "***")
    return text


def _request_secrets(encoder: Encoder) -> frozenset[str]:
    info = encoder.info
    if not encoder.sent or info.spec is None:
        return frozenset()
    from plugproxy.spec import redact  # noqa: PLC0415

    redactor = redact.for_specs([info.spec])
    found: set[str] = set()
    for message in encoder.sent:
        found |= redactor.secret_values(message)
    return frozenset(found)


async def call(ns: argparse.Namespace, info: MethodInfo) -> int:
    import grpc  # noqa: PLC0415

    if ns.max_messages is not None and ns.max_messages < 1:
        raise ConfigError("--max-messages must be at least 1")
    encoder = Encoder(info)
    request = ns.request
    unary_request = info.kind.unary_request
    outbound: _Outbound | None = None
    if unary_request:
        if request == "-":
            payload = encoder.encode(_one_request(sys.stdin.read(), "standard input"))
        else:
            payload = encoder.encode(_one_request(request or "{}", "REQUEST"))
    else:
        inline = None if request in (None, "-") else _inline_values(request)
        if inline is not None:
            for number, value in enumerate(inline, 1):
                encoder.encode(value, number)  # check them all before the call starts
            encoder.sent.clear()
        outbound = _Outbound(encoder, inline)
    metadata = parse_metadata(ns.metadata)
    endpoint, source = _endpoint(ns, info)
    credentials = _credentials(ns, endpoint, source)
    printer = Printer(info, ns.compact, ns.emit_defaults)
    verbose = ns.verbose
    if verbose:
        print(f"call: {info.path} ({info.kind.value}) at {endpoint}", file=sys.stderr)
    started = time.monotonic()
    async with _channel(ns, endpoint, credentials) as channel:
        stub = getattr(channel, _STUBS[info.kind])(info.path)
        kwargs: dict[str, Any] = {"timeout": ns.timeout or None, "metadata": metadata or None}
        rpc = stub(payload if outbound is None else outbound.messages(), **kwargs)
        stopped = ""
        try:
            if verbose:
                _show_metadata("header", await rpc.initial_metadata())
            if info.kind.unary_response:
                printer.answer(await rpc)
            else:
                async for raw in rpc:
                    printer.answer(raw)
                    if ns.max_messages is not None and printer.printed >= ns.max_messages:
                        stopped = f"stopped after {printer.printed} message(s) (--max-messages)"
                        rpc.cancel()
                        break
        except grpc.aio.AioRpcError as err:
            if outbound is not None and outbound.error is not None:
                raise outbound.error from None
            if verbose:
                _show_metadata("trailer", err.trailing_metadata())
            details = _masked(err.details() or "", _request_secrets(encoder))
            print(f"{err.code().name}: {details}" if details else err.code().name, file=sys.stderr)
            return EXIT_STATUS
        except asyncio.CancelledError:
            if outbound is not None and outbound.error is not None:
                raise outbound.error from None
            raise
        except AnswerError as exc:
            rpc.cancel()
            print(f"plugproxy call: {exc}", file=sys.stderr)
            return EXIT_STATUS
        if outbound is not None and outbound.error is not None:
            raise outbound.error
        if verbose:
            ms = (time.monotonic() - started) * 1000
            if stopped:
                print(f"status: {stopped}, {ms:.1f} ms", file=sys.stderr)
            else:
                _show_metadata("trailer", await rpc.trailing_metadata())
                print(f"status: OK, {ms:.1f} ms", file=sys.stderr)
    return EXIT_OK


def list_methods(catalogue: Catalogue, name: str | None) -> int:
    paths = sorted(catalogue.paths) if name is None else catalogue.matching(name)
    if name is not None and not paths:
        catalogue.resolve(name)  # the unknown-method error, with its suggestions
    for path in paths:
        print(path)
    return EXIT_OK


async def run(ns: argparse.Namespace) -> int:
    catalogue = Catalogue.build(ns.descriptor_set, ns.spec)
    if ns.list:
        return list_methods(catalogue, ns.method)
    if not ns.method:
        raise ConfigError("METHOD is required (plugproxy call --list lists them)")
    info = catalogue.resolve(ns.method)
    return await call(ns, info)
