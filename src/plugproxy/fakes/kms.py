"""Fake KMS v2 plugin: real AES-256-GCM envelope encryption with a key made at startup.

Encrypt returns ``nonce || AES-GCM(plaintext)`` and the key's id; Decrypt reverses it, so
kube-apiserver's round trip works for as long as the plugin runs (the key is never
stored). Status answers healthz "ok", version "v2" and the key id. ``cryptography`` is
imported when the plugin starts, so nothing else in plugproxy pays for it.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any

from plugproxy.fakes.base import FakePlugin
from plugproxy.fakes.common import DynMessage, ServicerContext, invalid
from plugproxy.fakes.knobs import FakeKnobs

NONCE_BYTES = 12
TAG_BYTES = 16
CIPHERTEXT_MAX = 1024  # the API's bound on EncryptResponse.ciphertext
PLAINTEXT_MAX = CIPHERTEXT_MAX - NONCE_BYTES - TAG_BYTES
ANNOTATION_KEY = "version.encryption.fake.plugproxy.io"


class FakeKmsV2(FakePlugin):
    spec_name = "kms.v2"
    default_plugin_name = "kms.fake.plugproxy.io"

    def __init__(self, knobs: FakeKnobs | None = None) -> None:
        super().__init__(knobs)
        # Imported here: only this fake needs cryptography, and only once it starts.
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM  # noqa: PLC0415

        key = AESGCM.generate_key(bit_length=256)
        self._aead: Any = AESGCM(key)
        # Names the key without revealing it: a digest of the key, not the key.
        self.key_id = f"{self.plugin_name}/kek-{hashlib.sha256(key).hexdigest()[:16]}"

    async def Status(self, request: DynMessage, context: ServicerContext) -> DynMessage:
        return self.new("StatusResponse", version="v2", healthz="ok", key_id=self.key_id)

    async def Encrypt(self, request: DynMessage, context: ServicerContext) -> DynMessage:
        plaintext = request.plaintext
        if not plaintext:
            raise invalid("plaintext is empty: nothing to encrypt")
        if len(plaintext) > PLAINTEXT_MAX:
            raise invalid(
                f"plaintext is {len(plaintext)} bytes; at most {PLAINTEXT_MAX} fit the API's"
                f" {CIPHERTEXT_MAX}-byte ciphertext"
            )
        nonce = os.urandom(NONCE_BYTES)
        ciphertext = nonce + self._aead.encrypt(nonce, plaintext, None)
        response = self.new("EncryptResponse", ciphertext=ciphertext, key_id=self.key_id)
        response.annotations[ANNOTATION_KEY] = b"aes-256-gcm"
        return response

    async def Decrypt(self, request: DynMessage, context: ServicerContext) -> DynMessage:
        if request.key_id != self.key_id:
            raise invalid("key_id names a key this plugin does not hold")
        data = request.ciphertext
        if len(data) < NONCE_BYTES + TAG_BYTES:
            raise invalid(f"ciphertext is {len(data)} bytes: too short to be this plugin's")
        try:
            plaintext = self._aead.decrypt(data[:NONCE_BYTES], data[NONCE_BYTES:], None)
        except Exception:  # cryptography's InvalidTag: tampered or another key's data
            raise invalid("ciphertext does not authenticate") from None
        return self.new("DecryptResponse", plaintext=plaintext)
