"""Checkpoint encryption, format "ngck1": AES-256-GCM in fixed-size chunks (STREAM).

Layout of an encrypted object::

    header  = b"NGCK" ‖ version (1 byte, 1) ‖ chunk size (u32 BE) ‖ salt (32) ‖ nonce prefix (7)
    chunk i = AES-256-GCM(file key, nonce_i, plaintext chunk i, aad=header)  # ciphertext ‖ tag

    file key = HKDF-SHA256(data key, salt, info=b"nomadgpu/ckpt/v1")
    nonce_i  = nonce prefix ‖ i (u32 BE) ‖ 1 if chunk i is the final chunk else 0

Every chunk but the final one holds exactly ``chunk size`` plaintext bytes; the final one holds
1..chunk size bytes (0 only when the whole plaintext is empty). The counter stops reordering and
dropping, the last-flag stops truncation at a chunk boundary (a reader that hits EOF before a
chunk that decrypts as final fails), and the header as AAD stops header edits. A random salt per
object gives every object its own key, so nonces never repeat across objects under one data key.

Both directions stream through file objects with a constant amount of memory (one chunk and its
reusable buffers), so the server can decrypt a download without holding the object. Only
``cryptography`` and the standard library are used.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from typing import BinaryIO

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

MAGIC = b"NGCK"
VERSION = 1
FORMAT_NAME = "ngck1"
HKDF_INFO = b"nomadgpu/ckpt/v1"
SALT_SIZE = 32
PREFIX_SIZE = 7
TAG_SIZE = 16
HEADER_SIZE = len(MAGIC) + 1 + 4 + SALT_SIZE + PREFIX_SIZE  # 48
DEFAULT_CHUNK_SIZE = 4 * 1024 * 1024
# A reader trusts the header's chunk size only this far: a forged header must not make it
# allocate gigabytes.
MAX_CHUNK_SIZE = 64 * 1024 * 1024
MAX_CHUNKS = 2**32  # the counter is a u32


class CheckpointDecryptError(Exception):
    """The encrypted stream is not intact: wrong key, tampered, reordered or truncated."""


def encrypted_size(plaintext_size: int, chunk_size: int = DEFAULT_CHUNK_SIZE) -> int:
    """Bytes an encrypted object of PLAINTEXT_SIZE takes (known before encrypting, for uploads)."""
    chunks = max(1, -(-plaintext_size // chunk_size))
    return HEADER_SIZE + plaintext_size + chunks * TAG_SIZE


def _file_key(data_key: bytes, salt: bytes) -> AESGCM:
    if len(data_key) != 32:
        raise ValueError("the data key must be 32 bytes (AES-256)")
    hkdf = HKDF(algorithm=hashes.SHA256(), length=32, salt=salt, info=HKDF_INFO)
    return AESGCM(hkdf.derive(data_key))


def _nonce(prefix: bytes, index: int, last: bool) -> bytes:
    return prefix + struct.pack(">IB", index, 1 if last else 0)


def _header(chunk_size: int, salt: bytes, prefix: bytes) -> bytes:
    return MAGIC + struct.pack(">BI", VERSION, chunk_size) + salt + prefix


def _parse_header(header: bytes) -> tuple[int, bytes, bytes]:
    if len(header) != HEADER_SIZE or header[:4] != MAGIC:
        raise CheckpointDecryptError("not an ngck1 checkpoint (bad magic or short header)")
    version, chunk_size = struct.unpack(">BI", header[4:9])
    if version != VERSION:
        raise CheckpointDecryptError(f"unsupported ngck version {version}")
    if not 0 < chunk_size <= MAX_CHUNK_SIZE:
        raise CheckpointDecryptError(f"implausible chunk size {chunk_size}")
    return chunk_size, header[9 : 9 + SALT_SIZE], header[9 + SALT_SIZE :]


class EncryptingWriter:
    """A write-only file object: plaintext in, ngck1 ciphertext out to DST. Call close()."""

    def __init__(
        self,
        dst: BinaryIO,
        data_key: bytes,
        *,
        chunk_size: int = DEFAULT_CHUNK_SIZE,
        salt: bytes | None = None,
        nonce_prefix: bytes | None = None,
    ) -> None:
        if not 0 < chunk_size <= MAX_CHUNK_SIZE:
            raise ValueError(f"chunk size must be 1..{MAX_CHUNK_SIZE}")
        salt = os.urandom(SALT_SIZE) if salt is None else salt
        prefix = os.urandom(PREFIX_SIZE) if nonce_prefix is None else nonce_prefix
        if len(salt) != SALT_SIZE or len(prefix) != PREFIX_SIZE:
            raise ValueError("salt must be 32 bytes and the nonce prefix 7 bytes")
        self._dst = dst
        self._aead = _file_key(data_key, salt)
        self._header = _header(chunk_size, salt, prefix)
        self._prefix = prefix
        self._chunk_size = chunk_size
        # One plaintext buffer and one ciphertext buffer, reused for every chunk.
        self._plain = bytearray(chunk_size)
        self._filled = 0
        self._out = bytearray(chunk_size + TAG_SIZE)
        self._index = 0
        self._closed = False
        dst.write(self._header)

    def write(self, data: bytes | bytearray | memoryview) -> int:
        view = memoryview(data).cast("B")
        total = len(view)
        while view:
            if self._filled == self._chunk_size:
                # Only seal a full chunk once more data proves it is not the final one.
                self._seal(last=False)
            take = min(len(view), self._chunk_size - self._filled)
            self._plain[self._filled : self._filled + take] = view[:take]
            self._filled += take
            view = view[take:]
        return total

    def close(self) -> None:
        if not self._closed:
            self._seal(last=True)
            self._closed = True

    def _seal(self, *, last: bool) -> None:
        if self._index >= MAX_CHUNKS:
            raise ValueError("too many chunks for one ngck1 object (limit 2**32)")
        nonce = _nonce(self._prefix, self._index, last)
        plain = memoryview(self._plain)[: self._filled]
        out = memoryview(self._out)[: self._filled + TAG_SIZE]
        if hasattr(self._aead, "encrypt_into"):
            self._aead.encrypt_into(nonce, plain, self._header, out)
            self._dst.write(out)
        else:  # cryptography < 44 has only the allocating call
            self._dst.write(self._aead.encrypt(nonce, bytes(plain), self._header))
        self._index += 1
        self._filled = 0

    def __enter__(self) -> EncryptingWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is None:
            self.close()


class DecryptingReader:
    """A read-only file object over an ngck1 stream; raises CheckpointDecryptError on damage."""

    def __init__(self, src: BinaryIO, data_key: bytes) -> None:
        self._src = src
        self._header = _read_exactly(src, HEADER_SIZE)
        chunk_size, salt, prefix = _parse_header(self._header)
        self._aead = _file_key(data_key, salt)
        self._prefix = prefix
        self._sealed_size = chunk_size + TAG_SIZE
        self._plain = bytearray(chunk_size)  # reused for every chunk
        self._chunks = self.chunks()
        self._view = memoryview(b"")

    def chunks(self) -> Iterator[memoryview]:
        """Each chunk's plaintext in order; a view into a buffer that the next chunk reuses."""
        sealed = _read_exactly(self._src, self._sealed_size)
        index = 0
        while True:
            if len(sealed) < TAG_SIZE:
                raise CheckpointDecryptError("truncated: the stream ends before its final chunk")
            # A short chunk must be the final one; a full one is final only if nothing follows.
            full = len(sealed) == self._sealed_size
            following = _read_exactly(self._src, self._sealed_size) if full else b""
            last = not following
            if index >= MAX_CHUNKS:
                raise CheckpointDecryptError("too many chunks (limit 2**32)")
            yield self._open(sealed, index, last)
            if last:
                return
            sealed, index = following, index + 1

    def _open(self, sealed: bytes, index: int, last: bool) -> memoryview:
        nonce = _nonce(self._prefix, index, last)
        plain = memoryview(self._plain)[: len(sealed) - TAG_SIZE]
        try:
            if hasattr(self._aead, "decrypt_into"):
                self._aead.decrypt_into(nonce, sealed, self._header, plain)
            else:  # cryptography < 44 has only the allocating call
                plain[:] = self._aead.decrypt(nonce, sealed, self._header)
        except InvalidTag:
            raise CheckpointDecryptError(
                f"chunk {index} failed authentication (wrong key, or the object was tampered "
                "with, reordered or truncated)"
            ) from None
        return plain

    def read(self, size: int = -1) -> bytes:
        parts: list[bytes] = []
        want = size if size >= 0 else None
        while want is None or want > 0:
            if not self._view:
                self._view = next(self._chunks, None)
                if self._view is None:
                    self._view = memoryview(b"")
                    break
                continue
            take = len(self._view) if want is None else min(want, len(self._view))
            parts.append(bytes(self._view[:take]))
            self._view = self._view[take:]
            if want is not None:
                want -= take
        return b"".join(parts)

    def readable(self) -> bool:
        return True


def _read_exactly(src: BinaryIO, size: int) -> bytes:
    """Read SIZE bytes, fewer only at EOF (sockets and pipes may return short reads)."""
    data = src.read(size)
    if len(data) in (0, size):
        return data
    parts = [data]
    got = len(data)
    while got < size:
        more = src.read(size - got)
        if not more:
            break
        parts.append(more)
        got += len(more)
    return b"".join(parts)


def encrypt_stream(
    src: BinaryIO,
    dst: BinaryIO,
    key: bytes,
    *,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    salt: bytes | None = None,
    nonce_prefix: bytes | None = None,
) -> int:
    """Encrypt everything readable from SRC into DST; returns plaintext bytes read."""
    writer = EncryptingWriter(dst, key, chunk_size=chunk_size, salt=salt, nonce_prefix=nonce_prefix)
    buf = bytearray(chunk_size)
    total = 0
    while n := src.readinto(buf):
        writer.write(memoryview(buf)[:n])
        total += n
    writer.close()
    return total


def decrypt_stream(src: BinaryIO, dst: BinaryIO, key: bytes) -> int:
    """Decrypt the ngck1 stream in SRC into DST; returns plaintext bytes written.

    Raises CheckpointDecryptError on any damage. DST may already hold a prefix of the plaintext
    when that happens, so write to a temporary place and discard it on error.
    """
    total = 0
    for chunk in DecryptingReader(src, key).chunks():
        dst.write(chunk)
        total += len(chunk)
    return total
