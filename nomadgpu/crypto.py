"""Sealing team secrets at rest: AES-256-GCM with a key from the environment.

A sealed value reads ``v1:<key id>:<base64 nonce|ciphertext>``. The key id (first 8 hex chars of
SHA-256 of the key) lets several keys coexist during a rotation: the first key in
``FIELD_ENCRYPTION_KEY`` seals, every listed key can open. The associated data binds a value to
its column, so a ciphertext copied into another column does not open.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
from functools import lru_cache

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from django.conf import settings

PREFIX = "v1"
HOW_TO_SET = (
    "Set FIELD_ENCRYPTION_KEY to a base64-encoded 32-byte key, e.g. "
    'python -c "import base64,os; print(base64.urlsafe_b64encode(os.urandom(32)).decode())". '
    "Keep it: team secrets sealed with it cannot be read without it."
)


class KeyConfigError(Exception):
    """The encryption key is missing, malformed, or not the one the data was sealed with."""


class SecretUnreadable(Exception):
    """A sealed value could not be opened with any configured key."""


def generate_key() -> str:
    return base64.urlsafe_b64encode(os.urandom(32)).decode()


def new_data_key() -> str:
    """A random AES-256 key for one job's checkpoints, in standard base64 (what the agent
    decodes); stored sealed under the key above (``Job.data_key``)."""
    return base64.b64encode(os.urandom(32)).decode()


def _decode_key(text: str) -> bytes:
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError) as exc:
        raise KeyConfigError(f"FIELD_ENCRYPTION_KEY is not valid base64. {HOW_TO_SET}") from exc
    if len(raw) != 32:
        raise KeyConfigError(
            f"FIELD_ENCRYPTION_KEY decodes to {len(raw)} bytes, not 32. {HOW_TO_SET}"
        )
    return raw


def _key_id(raw: bytes) -> str:
    return hashlib.sha256(raw).hexdigest()[:8]


@lru_cache(maxsize=4)
def _keys(configured: tuple[str, ...]) -> list[tuple[str, AESGCM]]:
    if not configured:
        raise KeyConfigError(f"FIELD_ENCRYPTION_KEY is not set. {HOW_TO_SET}")
    keys = []
    for text in configured:
        raw = _decode_key(text)
        keys.append((_key_id(raw), AESGCM(raw)))
    return keys


def configured_keys() -> list[tuple[str, AESGCM]]:
    """The usable keys, primary first; raises KeyConfigError saying what to set."""
    return _keys(tuple(settings.FIELD_ENCRYPTION_KEYS))


def seal(plaintext: str, *, context: str) -> str:
    key_id, aead = configured_keys()[0]
    nonce = os.urandom(12)
    sealed = aead.encrypt(nonce, plaintext.encode(), context.encode())
    return f"{PREFIX}:{key_id}:{base64.urlsafe_b64encode(nonce + sealed).decode()}"


def open_sealed(value: str, *, context: str) -> str:
    try:
        prefix, key_id, body = value.split(":", 2)
        blob = base64.urlsafe_b64decode(body)
    except (ValueError, binascii.Error) as exc:
        raise SecretUnreadable("stored value is not a sealed secret") from exc
    if prefix != PREFIX:
        raise SecretUnreadable(f"unknown sealed format {prefix!r}")
    for kid, aead in configured_keys():
        if kid != key_id:
            continue
        try:
            return aead.decrypt(blob[:12], blob[12:], context.encode()).decode()
        except InvalidTag as exc:
            raise SecretUnreadable("sealed value failed authentication") from exc
    raise SecretUnreadable(
        f"sealed with key {key_id}, which is not in FIELD_ENCRYPTION_KEY. {HOW_TO_SET}"
    )


def mask(plaintext: str) -> str:
    """What admin and logs may show of a secret: its length class and last 4 characters."""
    if not plaintext:
        return ""
    tail = plaintext[-4:] if len(plaintext) >= 12 else ""
    return f"••••••••{tail}"
