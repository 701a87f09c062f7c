"""Public, typed interfaces of plugproxy: what a pipeline stage sees and implements.

A call flows through the ordered stage list of :mod:`plugproxy.pipeline`. Each stage may
implement any of these hooks; a hook a stage does not define costs nothing:

- ``on_start(call)``: the call arrived. For methods with a unary request, ``call.request``
  is already set. A plain function that returns None, or an awaitable when it has to wait
  (serialization queueing, a first capability query); ``async def`` works too but always
  costs a task. Raising :class:`Reject` answers the call with that status; it never
  reaches the plugin.
- ``on_request(call, message)``: each request message of a client-streaming call.
- ``on_response(call, message)``: each response message, unary or streamed. It observes:
  the frame relay may already have passed the message on to the CO.
- ``on_finish(call)``: the call ended; ``call.code``/``call.details`` hold the status the
  CO receives. Runs in reverse list order, and only for stages whose ``on_start`` ran.

May import: :mod:`plugproxy.core`.
"""

from __future__ import annotations

import enum
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, NamedTuple, Protocol

# Imported at run time, not only for the type checker: a compiled build evaluates the
# NamedTuple's annotations when the module loads.
from google.protobuf import descriptor_pb2
from google.protobuf.descriptor import Descriptor, FieldDescriptor, MethodDescriptor
from google.protobuf.descriptor_pool import DescriptorPool
from google.protobuf.message import Message
from mypy_extensions import mypyc_attr

from plugproxy.core.sampling import SAMPLE_MIN_BYTES, Sample, skeleton_of

MetadataValue = str | bytes
Metadata = tuple[tuple[str, MetadataValue], ...]


class StatusCode(enum.Enum):
    """The 17 canonical gRPC status codes, named and valued as ``grpc.StatusCode``.

    Our own, so a proxy that relays frames never imports grpc (its C core is about 15 MiB
    of resident memory). ``StatusCode(code.value)`` and ``grpc.StatusCode(code.value)``
    convert between the two where the gRPC relay meets grpc.
    """

    OK = (0, "ok")
    CANCELLED = (1, "cancelled")
    UNKNOWN = (2, "unknown")
    INVALID_ARGUMENT = (3, "invalid argument")
    DEADLINE_EXCEEDED = (4, "deadline exceeded")
    NOT_FOUND = (5, "not found")
    ALREADY_EXISTS = (6, "already exists")
    PERMISSION_DENIED = (7, "permission denied")
    RESOURCE_EXHAUSTED = (8, "resource exhausted")
    FAILED_PRECONDITION = (9, "failed precondition")
    ABORTED = (10, "aborted")
    OUT_OF_RANGE = (11, "out of range")
    UNIMPLEMENTED = (12, "unimplemented")
    INTERNAL = (13, "internal")
    UNAVAILABLE = (14, "unavailable")
    DATA_LOSS = (15, "data loss")
    UNAUTHENTICATED = (16, "unauthenticated")

    @property
    def number(self) -> int:
        number: int = self.value[0]
        return number

    @classmethod
    def of(cls, code: Any) -> StatusCode:
        """This enum's member for ``code``: ours, or grpc's member of the same value."""
        return code if isinstance(code, StatusCode) else cls(code.value)


class CallKind(enum.Enum):
    """gRPC call type, as the method descriptor states it."""

    UNARY_UNARY = "unary"
    UNARY_STREAM = "server_streaming"
    STREAM_UNARY = "client_streaming"
    STREAM_STREAM = "bidi_streaming"

    # Plain attributes, not properties: the relay and the stages read them on every call.
    # Set below rather than in an __init__, which a compiled build cannot give an enum.
    unary_request: bool
    unary_response: bool


for _kind in CallKind:
    _kind.unary_request = _kind.value in ("unary", "server_streaming")
    _kind.unary_response = _kind.value in ("unary", "client_streaming")


class Party(enum.Enum):
    """Who a spec rule judges: the orchestrator (requests, call order) or the plugin."""

    CO = "co"
    PLUGIN = "plugin"


_LOADING = threading.RLock()  # held while a spec's descriptors are read and hooks run


class SpecDescriptors(NamedTuple):
    """What a spec's descriptor set yields: read once, when first needed."""

    pool: DescriptorPool
    secret_option: FieldDescriptor | None
    field_options_class: type[Message] | None
    message_classes: dict[str, type[Message]]


@mypyc_attr(allow_interpreted_subclasses=True)
class SpecInfo:
    """One spec version with its own descriptor pool (csi_secret and cmi_secret collide).

    Built with ``load`` instead of the descriptors, it reads them the first time anything
    asks for them (:func:`plugproxy.spec.registry.load_spec`): a proxy builds the pools of the
    specs its calls use, not of every bundled one.
    """

    __slots__ = (
        "_field_options_class",
        "_load",
        "_message_classes",
        "_pool",
        "_secret_option",
        "_waiting",
        "family",
        "files",
        "name",
        "source",
    )

    def __init__(
        self,
        name: str,
        family: str,
        pool: DescriptorPool | None = None,
        secret_option: FieldDescriptor | None = None,
        field_options_class: type[Message] | None = None,
        message_classes: dict[str, type[Message]] | None = None,
        source: str | None = None,
        files: tuple[str, ...] = (),
        *,
        load: Callable[[], SpecDescriptors] | None = None,
    ) -> None:
        if (pool is None) == (load is None):
            raise TypeError("SpecInfo takes its pool or a load function, one of the two")
        # "csi.v1", "kms.v2", "deviceplugin.v1beta1", ...; a descriptor set: its package or
        # file stem
        self.name = name
        # "csi", "kms", "deviceplugin", ... (the rule id prefix); a descriptor set: its name
        self.family = family
        # The --descriptor-set file this spec was read from (None for a bundled spec), and
        # the names of its files, imports first.
        self.source = source
        self.files = files
        self._pool = pool
        self._secret_option = secret_option
        self._field_options_class = field_options_class
        self._message_classes = message_classes if message_classes is not None else {}
        self._load = load
        self._waiting: list[Callable[[SpecInfo], None]] = []

    def __repr__(self) -> str:
        return f"SpecInfo({self.name!r}{'' if self.loaded else ', not loaded'})"

    @property
    def loaded(self) -> bool:
        """Whether the descriptors are read (always, unless built with ``load``)."""
        return self._load is None

    def load(self) -> None:
        """Read the descriptors now, if not done yet."""
        if self._load is not None:
            # The admin thread may ask too (a readiness Probe's answer): one pool per spec,
            # and no thread uses it before the hooks have run.
            with _LOADING:
                self._read()

    def _read(self) -> None:
        load = self._load
        if load is None:  # read by another thread meanwhile
            return
        descriptors = load()
        self._pool = descriptors.pool
        self._secret_option = descriptors.secret_option
        self._field_options_class = descriptors.field_options_class
        self._message_classes = descriptors.message_classes
        self._load = None
        waiting, self._waiting = self._waiting, []
        for fn in waiting:
            fn(self)

    def when_loaded(self, fn: Callable[[SpecInfo], None]) -> None:
        """Call ``fn(self)`` once the descriptors are read: at once if they are. No message
        of the spec exists before, so whatever ``fn`` prepares is there for its first one."""
        with _LOADING:
            if self._load is not None:
                self._waiting.append(fn)
                return
        fn(self)

    @property
    def pool(self) -> DescriptorPool:
        self.load()
        assert self._pool is not None
        return self._pool

    @property
    def secret_option(self) -> FieldDescriptor | None:
        self.load()
        return self._secret_option

    @property
    def field_options_class(self) -> type[Message] | None:
        self.load()
        return self._field_options_class

    @property
    def message_classes(self) -> dict[str, type[Message]]:
        self.load()
        return self._message_classes

    @property
    def bundled(self) -> bool:
        return self.source is None

    def message_class(self, full_name: str) -> type[Message]:
        return self.message_classes[full_name]

    def descriptor(self, full_name: str) -> Descriptor:
        return self.pool.FindMessageTypeByName(full_name)

    def is_secret_field(self, fd: FieldDescriptor) -> bool:
        """True when the field carries this spec's secret option (resolved by full name) or
        protobuf's own ``debug_redact``."""
        raw = fd.GetOptions().SerializeToString()
        if not raw:
            return False
        # Re-read the option bytes with classes that know the fields: a pool of its own may
        # hand out options whose extensions (and, with an older descriptor.proto in the set,
        # debug_redact) are only unknown fields.
        if descriptor_pb2.FieldOptions.FromString(raw).debug_redact:
            return True
        if self.secret_option is None or self.field_options_class is None:
            return False
        opts = self.field_options_class.FromString(raw)
        return bool(opts.Extensions[self.secret_option])  # type: ignore[index]


@dataclass(frozen=True, eq=False, slots=True)
class MethodInfo:
    """A full method path and what the descriptors say of it (spec None when unknown)."""

    path: str  # "/csi.v1.Controller/CreateVolume"
    service: str  # "csi.v1.Controller"
    name: str  # "CreateVolume"
    kind: CallKind
    spec: SpecInfo | None = None
    descriptor: MethodDescriptor | None = None
    request_class: type[Message] | None = None
    response_class: type[Message] | None = None
    # (kind, dotted request field path) from --serialize-key, beside the spec's own keys.
    extra_keys: tuple[tuple[str, str], ...] = ()

    @property
    def known(self) -> bool:
        return self.spec is not None

    @property
    def spec_name(self) -> str:
        return self.spec.name if self.spec is not None else "unknown"


class LazyMessage:
    """Wire bytes of one message, decoded on first use and at most once.

    :attr:`message` is the whole message. :attr:`sampled` is what the observing stages
    (response rules, the call log) use: the same message, except that a large one
    (:data:`plugproxy.core.sampling.SAMPLE_MIN_BYTES`) with lists longer than
    :data:`plugproxy.core.sampling.SAMPLE_SIZE` keeps only a sample of their entries, the others
    never decoded. :meth:`count` gives a list's real length either way.
    """

    __slots__ = ("_decoded", "_done", "_error", "_sample", "cls", "raw")

    def __init__(self, raw: bytes, cls: type[Message] | None) -> None:
        self.raw = raw
        self.cls = cls
        self._done = False
        self._decoded: Message | None = None
        self._error: str | None = None
        self._sample: Sample | bool | None = False  # False: not tried yet

    def _decode(self) -> None:
        self._done = True
        if self.cls is None:
            return
        try:
            self._decoded = self.cls.FromString(self.raw)
        except Exception as exc:  # any decode failure is data, not a crash
            self._error = f"cannot decode {self.cls.DESCRIPTOR.full_name}: {type(exc).__name__}"

    @property
    def message(self) -> Message | None:
        """The decoded message, or None when the type is unknown or the bytes are malformed."""
        if not self._done:
            self._decode()
        return self._decoded

    @property
    def decode_error(self) -> str | None:
        if not self._done:
            self._decode()
        return self._error

    @property
    def sample(self) -> Sample | None:
        """The sample taken of a large message, or None when it is used whole."""
        sample = self._sample
        if sample is False:
            sample = None
            if not self._done and self.cls is not None and len(self.raw) >= SAMPLE_MIN_BYTES:
                skeleton = skeleton_of(self.cls)
                if skeleton is not None:
                    sample = skeleton.sample(self.raw, self.cls)
            self._sample = sample
        return sample if isinstance(sample, Sample) else None

    @property
    def sampled(self) -> Message | None:
        """The message with long lists sampled (see :attr:`sample`), else :attr:`message`."""
        sample = self.sample
        return sample.message if sample is not None else self.message

    def count(self, field_name: str) -> int:
        """How many entries the top-level list ``field_name`` holds on the wire."""
        sample = self.sample
        if sample is not None and field_name in sample.totals:
            return sample.totals[field_name]
        message = self.sampled
        return len(getattr(message, field_name)) if message is not None else 0


# Events one call keeps for its log line and span (OpenTelemetry's default span limit).
MAX_CALL_EVENTS = 128


@dataclass(slots=True)
class CallEvent:
    """Something a stage noticed during a call; the log and trace stages render these."""

    name: str
    attributes: dict[str, str | int | float | bool]
    time_ns: int = field(default_factory=time.time_ns)


class Reject(Exception):
    """Raised by a stage to answer the call itself with this status."""

    # ``code``: ours or grpc's StatusCode (a stage written against grpc's codes); Any, so
    # that a compiled build takes either.
    def __init__(self, code: Any, message: str) -> None:
        super().__init__(message)
        self.code = StatusCode.of(code)
        self.message = message


class UpstreamError(Exception):
    """A call of the proxy's own to the plugin (capability queries, probes) failed with a
    gRPC status, sent by the plugin or meaning the connection (UNAVAILABLE)."""

    def __init__(self, code: StatusCode, details: str) -> None:
        super().__init__(f"{code.name}: {details}")
        self.code = code
        self.details = details


class Call:
    """One RPC as it crosses the proxy; shared by every stage of the pipeline."""

    __slots__ = (
        "code",
        "connection",
        "details",
        "events",
        "events_dropped",
        "initial_metadata",
        "invocation_metadata",
        "method",
        "peer",
        "raw_status",
        "rejected",
        "request",
        "request_count",
        "response",
        "response_count",
        "stage_state",
        "start_monotonic",
        "start_time_ns",
        "started_stages",
        "timeout",
        "trailing_metadata",
        "upstream_metadata",
    )

    def __init__(
        self,
        method: MethodInfo,
        invocation_metadata: Metadata,
        upstream_metadata: list[tuple[str, MetadataValue]],
        timeout: float | None,
        peer: str = "",
        connection: int = 0,
    ) -> None:
        self.method = method
        self.invocation_metadata = invocation_metadata
        # What the forwarder sends upstream; stages may append (traceparent, request id).
        self.upstream_metadata = upstream_metadata
        self.timeout = timeout
        self.peer = peer
        # Which CO connection carried the call (a serial of the proxy's); 0 when the relay
        # cannot tell. One caller's calls share a connection: rules use it to tell a retry
        # from another caller's first call when the request itself has no fields.
        self.connection = connection
        self.request: LazyMessage | None = None
        self.response: LazyMessage | None = None
        self.request_count = 0
        self.response_count = 0
        self.code = StatusCode.OK
        self.details = ""
        # The grpc-status the plugin's trailers carried, as sent ("" when they carried none),
        # where the relay could read it; None otherwise (the proxy's own answers, resets).
        # ``code`` maps a value outside 0-16 to UNKNOWN; this keeps what was really sent.
        self.raw_status: str | None = None
        self.initial_metadata: Metadata = ()
        self.trailing_metadata: Metadata = ()
        self.rejected = False
        self.events: list[CallEvent] = []
        self.events_dropped = 0  # events past MAX_CALL_EVENTS, not kept
        self.stage_state: dict[str, Any] = {}
        self.started_stages = 0  # how many stages' on_start ran (their on_finish will run)
        self.start_monotonic = time.monotonic()
        self.start_time_ns = time.time_ns()

    def add_event(self, name: str, **attributes: str | int | float | bool) -> None:
        # Bounded: a stream open for days whose every message breaks a rule must not hold
        # an event per message. What is dropped is still logged and counted where it arose.
        if len(self.events) < MAX_CALL_EVENTS:
            self.events.append(CallEvent(name, attributes))
        else:
            self.events_dropped += 1

    def metadata_value(self, key: str) -> MetadataValue | None:
        for k, v in self.invocation_metadata:
            if k == key:
                return v
        return None

    def remaining_timeout(self) -> float | None:
        if self.timeout is None:
            return None
        return self.timeout - (time.monotonic() - self.start_monotonic)

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.start_monotonic


StartHook = Callable[[Call], Awaitable[None] | None]
MessageHook = Callable[[Call, LazyMessage], None]
FinishHook = Callable[[Call], None]


# Stages of others subclass it; a compiled build lets interpreted subclasses in.
@mypyc_attr(allow_interpreted_subclasses=True)
class Stage:
    """Base of every pipeline stage. Subclasses define only the hooks they need.

    ``fail_open``: when True, an exception inside a hook is logged and the call goes on
    (metrics, tracing). When False, it ends the call with INTERNAL (validation,
    serialization): a broken guard must not wave calls through.
    """

    name: ClassVar[str] = "stage"
    fail_open: ClassVar[bool] = False

    def wants(self, method: MethodInfo) -> bool:
        """Whether this stage takes part in calls of ``method``; asked once per method,
        before its first call (at startup, or when a spec is built on its first call)."""
        return True

    async def startup(self) -> None:
        """Called once after the server starts listening."""

    async def shutdown(self) -> None:
        """Called once after the server stopped; flush exporters here."""


class UpstreamState(enum.Enum):
    UP = "up"
    DOWN = "down"


class UpstreamView(Protocol):
    """What stages may know of the upstream connection."""

    @property
    def address(self) -> str: ...

    @property
    def state(self) -> UpstreamState: ...

    @property
    def reason(self) -> str: ...

    async def unary(
        self, method: str, request: bytes, timeout: float, metadata: Sequence[tuple[str, str]] = ()
    ) -> bytes:
        """Send one unary call of the proxy's own (capability or probe queries)."""
        ...


AdminHandler = Callable[[], tuple[int, str, bytes]]
"""An admin route: returns (HTTP status, content type, body)."""

ReadinessCheck = Callable[[], tuple[bool, str]]
"""Returns (ready, reason). /readyz is ready when every check is."""


@dataclass(eq=False)
class Runtime:
    """What a stage's ``build(settings, runtime)`` may use: shared services of one proxy."""

    registry: Any  # plugproxy.spec.registry.Registry
    upstream: UpstreamView
    logger: Any  # plugproxy.core.log.Logger
    metrics: Any  # prometheus_client.CollectorRegistry, served on /metrics
    admin_routes: dict[str, AdminHandler] = field(default_factory=dict)
    readiness_checks: list[ReadinessCheck] = field(default_factory=list)
