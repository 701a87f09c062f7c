"""The call log: one structured line per call, request ids, and redacted payloads.

Every call ends in one ``call`` line on stdout (through the shared
:class:`plugproxy.core.log.Logger`, so ``--log-format`` and ``--log-level`` apply): request
id, spec, method, resource keys, duration, the gRPC code and message the CO received, the
serialization wait when the call queued, the rule ids of violations seen, and, for
streaming calls, how many messages went each way. Calls a stage answered itself say ``rejected``.

Request ids follow the gocsi convention: a ``csi.requestid`` sent by the CO is adopted,
otherwise one is made (a per-process prefix and a counter). It is stored as
``call.stage_state["request_id"]`` for the other stages and sent to the plugin in the same
metadata key.

``--log-payloads`` adds the request and response, rendered by :mod:`plugproxy.spec.redact`: every
sensitive field masked, each payload capped by ``--log-payload-max-bytes`` with a visible
mark where rendering stopped. A streamed response is not logged message by message: the
line gives the count and the first message. A large message with long lists is rendered
from the sample :mod:`plugproxy.core.sampling` takes (its first entries, then a spread); the line
then says ``<payload>_sampled`` with each cut list's real length. Any secret value of the
request that shows up elsewhere (the plugin's error message, a non-secret field, a resource
key) is masked in the line too; the CO still receives everything unchanged.

Ordering: after tracing and metrics, before validation and serialization, so the request id
exists when those refer to the call. Its ``on_finish`` runs after theirs, when violations and
waits are recorded. Fails open: a logging problem never blocks a call.
"""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass
from typing import Any

from google.protobuf.message import Message

from plugproxy.api import Call, CallKind, LazyMessage, Runtime, Stage, StatusCode
from plugproxy.core.log import Logger
from plugproxy.core.options import SIZE_HELP, Option, byte_size, group, options_of, setting
from plugproxy.spec import redact
from plugproxy.spec.keys import keys_of

REQUEST_ID_KEY = "csi.requestid"
MAX_ADOPTED_ID = 128
# Container runtimes split log lines over 16 KiB (containerd's max_container_log_line_size),
# which breaks a JSON line in two; two payloads of 4 KiB keep a call line well under that.
PAYLOAD_MAX_BYTES = 4 * 1024
# Renders of messages up to this size are remembered, this many of them at most.
RENDER_MEMO_MAX_BYTES = 512
RENDER_MEMO_ENTRIES = 128


@dataclass(frozen=True)
class CallLogSettings:
    call_log: str = setting(
        "--call-log",
        "one log line per call: all calls, only errors (non-OK or with violations), or off",
        default="all",
        choices=("all", "errors", "off"),
    )
    log_payloads: bool = setting(
        "--log-payloads",
        "add each call's request and response, redacted, to its log line",
        default=False,
        is_switch=True,
    )
    log_payload_max_bytes: int = setting(
        "--log-payload-max-bytes",
        f"rendering of each logged payload stops at about this size ({SIZE_HELP})",
        default=PAYLOAD_MAX_BYTES,
        type=byte_size,
        metavar="SIZE",
    )
    redaction: redact.RedactSettings = group(redact.RedactSettings)


# The redaction options are the call log's to declare: it is where payloads are shown first.
OPTIONS: list[Option] = [*options_of(CallLogSettings), *redact.OPTIONS]

_FIRST_REQUEST = "calllog.first_request"
_FIRST_RESPONSE = "calllog.first_response"


def _adoptable(value: object) -> str | None:
    if not isinstance(value, str):
        return None
    value = value.strip()
    if not value or len(value) > MAX_ADOPTED_ID or not value.isprintable():
        return None
    return value


class CallLogStage(Stage):
    """Sets the request id; writes the call's line when it ends."""

    name = "calllog"
    fail_open = True

    def __init__(
        self,
        logger: Logger,
        redactor: redact.Redactor,
        *,
        errors_only: bool = False,
        payload_max_bytes: int = PAYLOAD_MAX_BYTES,
    ) -> None:
        self.logger = logger
        self.redactor = redactor
        self.errors_only = errors_only
        self.payload_max_bytes = payload_max_bytes
        self.log_payloads = False
        # (message class, wire bytes) -> the redacted render of a small message; never
        # mutated once made (scrub_call copies what it masks).
        self._rendered: dict[tuple[type[Message] | None, bytes], dict[str, Any]] = {}
        self._prefix = os.urandom(3).hex()
        self._counter = itertools.count(1)

    def new_request_id(self) -> str:
        return f"{self._prefix}-{next(self._counter)}"

    def on_start(self, call: Call) -> None:
        request_id = _adoptable(call.metadata_value(REQUEST_ID_KEY)) or self.new_request_id()
        call.stage_state["request_id"] = request_id
        upstream = call.upstream_metadata
        if not any(k == REQUEST_ID_KEY for k, _ in upstream):
            upstream.append((REQUEST_ID_KEY, request_id))

    def on_finish(self, call: Call) -> None:
        violations: list[str] = []
        if call.events:
            for event in call.events:
                if event.name == "violation":
                    rule = str(event.attributes.get("rule", ""))
                    if rule not in violations:
                        violations.append(rule)
        code = call.code
        if self.errors_only and code is StatusCode.OK and not violations:
            return
        if not self.logger.enabled("info"):
            return
        method = call.method
        red = self.redactor
        secrets = red.call_secrets(call)
        keys = keys_of(call)
        fields: dict[str, Any] = {
            "request_id": call.stage_state.get("request_id", ""),
            "spec": method.spec_name,
            "method": method.path,
            "keys": [red.mask_text(k, call) for k in keys] if secrets else list(keys),
            "duration_ms": round(call.elapsed * 1000, 3),
            "code": code.name,
        }
        if call.details:
            fields["message"] = red.mask_text(call.details, call) if secrets else call.details
        if call.rejected:
            fields["rejected"] = True
        wait = call.stage_state.get("serialize.wait_seconds")
        if wait:
            fields["serialize_wait_ms"] = round(float(wait) * 1000, 3)
        if violations:
            fields["violations"] = violations
        kind = method.kind
        if kind is not CallKind.UNARY_UNARY:
            fields["request_count"] = call.request_count
            fields["response_count"] = call.response_count
        if self.log_payloads:
            if kind is CallKind.UNARY_UNARY:
                request, response = call.request, call.response
            else:
                state = call.stage_state
                request = call.request if kind.unary_request else state.get(_FIRST_REQUEST)
                response = call.response if kind.unary_response else state.get(_FIRST_RESPONSE)
            self._payload(
                fields, "request" if kind.unary_request else "first_request", request, call
            )
            self._payload(
                fields, "response" if kind.unary_response else "first_response", response, call
            )
        self.logger.record("info", "call", fields)

    def _payload(
        self,
        fields: dict[str, Any],
        label: str,
        lazy: LazyMessage | None,
        call: Call,
    ) -> None:
        if lazy is None:
            return
        raw = lazy.raw
        fields[label + "_bytes"] = len(raw)
        rendered: dict[str, Any] | None = None
        memo_key = None
        if len(raw) <= RENDER_MEMO_MAX_BYTES:
            # Small messages repeat (probes, capability and info queries, the same publish
            # retried): their render depends on their bytes alone, so it is made once.
            memo_key = (lazy.cls, raw)
            rendered = self._rendered.get(memo_key)
        if rendered is None:
            message: Message | None = lazy.sampled
            if message is None:
                fields[label + "_error"] = lazy.decode_error or "message type unknown"
                return
            sample = lazy.sample
            if sample is not None:
                fields[label + "_sampled"] = dict(sample.totals)
            rendered = self.redactor.render(message, self.payload_max_bytes, sample)
            if memo_key is not None:
                if len(self._rendered) >= RENDER_MEMO_ENTRIES:
                    del self._rendered[next(iter(self._rendered))]  # the oldest
                self._rendered[memo_key] = rendered
        fields[label] = self.redactor.scrub_call(rendered, call, raw)


class PayloadCallLogStage(CallLogStage):
    """The call log with ``--log-payloads``: keeps the first message of each stream."""

    def __init__(
        self,
        logger: Logger,
        redactor: redact.Redactor,
        *,
        errors_only: bool = False,
        payload_max_bytes: int = PAYLOAD_MAX_BYTES,
    ) -> None:
        super().__init__(
            logger, redactor, errors_only=errors_only, payload_max_bytes=payload_max_bytes
        )
        self.log_payloads = True

    def on_request(self, call: Call, message: LazyMessage) -> None:
        call.stage_state.setdefault(_FIRST_REQUEST, message)

    def on_response(self, call: Call, message: LazyMessage) -> None:
        if call.method.kind is not CallKind.UNARY_UNARY:
            call.stage_state.setdefault(_FIRST_RESPONSE, message)


def build(settings: CallLogSettings, runtime: Runtime) -> Stage | None:
    if settings.call_log == "off":
        return None
    redactor = redact.from_settings(settings.redaction, tuple(runtime.registry.specs.values()))
    cls = PayloadCallLogStage if settings.log_payloads else CallLogStage
    return cls(
        runtime.logger,
        redactor,
        errors_only=settings.call_log == "errors",
        payload_max_bytes=settings.log_payload_max_bytes,
    )
