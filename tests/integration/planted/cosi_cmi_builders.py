"""Messages and case builders the COSI and CMI tables share (no cases here)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tests.integration.planted.csi_v0_fields import STATUS_DETAILS
from tests.integration.planted.harness import Answer, Case, Step

__all__ = ["STATUS_DETAILS", "Builders", "grant_answer_bytes", "length_delimited", "without"]

Exchange = tuple[dict[str, Any] | bytes, Any]  # (request, answer); an answer (code, message) fails


@dataclass(frozen=True)
class Builders:
    """The case builders of one spec's table; ``background`` answers the calls the proxy
    makes itself (a case may give its own to :meth:`one`)."""

    spec: str
    background: Mapping[str, Answer] = field(default_factory=dict)

    def one(
        self,
        statements: tuple[str, ...],
        rule: str,
        rpc: str,
        breach: Exchange,
        twin: Exchange,
        party: str = "",
        why: str = "",
        variant: str = "",
        background: Mapping[str, Answer] | None = None,
    ) -> Case:
        """One call: (request, answer) of the breach and of the twin; an answer of
        (code, message) is an error."""

        def step(pair: Exchange) -> Step:
            request, answer = pair
            if isinstance(answer, tuple):
                return Step(rpc, request, error=answer)
            return Step(rpc, request, answer=answer)

        return Case(
            self.spec,
            statements,
            rule,
            breach=(step(breach),),
            twin=(step(twin),),
            background=self.background if background is None else background,
            party=party,
            why=why,
            variant=variant,
        )

    def steps(
        self,
        statements: tuple[str, ...],
        rule: str,
        breach: tuple[Step, ...],
        twin: tuple[Step, ...],
        party: str = "",
        why: str = "",
        variant: str = "",
    ) -> Case:
        return Case(self.spec, statements, rule, breach, twin, self.background, party, why, variant)

    def retry(
        self,
        statements: tuple[str, ...],
        rpc: str,
        request: dict[str, Any],
        code: str,
        fixed: dict[str, Any],
        answer: Any,
        first: dict[str, Any] | None = None,
        why: str = "",
        variant: str = "",
    ) -> Case:
        """``request`` refused with ``code`` and sent again unchanged; the twin sends
        ``fixed``."""
        family = self.spec.partition(".")[0]
        return self.steps(
            statements,
            f"{family}.retry-without-change",
            breach=(Step(rpc, request, error=(code, "refused")), Step(rpc, request, answer=answer)),
            twin=(
                Step(rpc, first or request, error=(code, "refused")),
                Step(rpc, fixed, answer=answer),
            ),
            party="co",
            why=why,
            variant=variant,
        )


def without(message: dict[str, Any], *fields: str) -> dict[str, Any]:
    return {k: v for k, v in message.items() if k not in fields}


def length_delimited(number: int, payload: bytes) -> bytes:
    """One length-delimited protobuf field (payloads under 128 bytes)."""
    assert len(payload) < 128
    return bytes([number << 3 | 2, len(payload)]) + payload


def grant_answer_bytes(secret: bytes) -> bytes:
    """A DriverGrantBucketAccessResponse (account_id 1, credentials 2: map of
    CredentialDetails, whose secrets 1 is a map<string, string>) with one secret value
    given as raw bytes, which may be no UTF-8."""
    secret_entry = length_delimited(1, b"accessKeyID") + length_delimited(2, secret)
    details = length_delimited(1, secret_entry)
    credentials_entry = length_delimited(1, b"s3") + length_delimited(2, details)
    return length_delimited(1, b"account-1") + length_delimited(2, credentials_entry)
