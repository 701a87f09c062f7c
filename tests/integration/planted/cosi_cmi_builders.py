"""Messages the COSI and CMI tables share (no cases here)."""

from __future__ import annotations

from typing import Any

from tests.integration.planted.csi_v0_fields import STATUS_DETAILS

__all__ = ["STATUS_DETAILS", "grant_answer_bytes", "length_delimited", "without"]


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
