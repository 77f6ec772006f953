"""ngck1: fixed vectors, an independent rebuild from the spec, and every way to damage a stream."""

from __future__ import annotations

import hashlib
import io
import struct

import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from agent import ckptcrypto
from agent.ckptcrypto import (
    HEADER_SIZE,
    TAG_SIZE,
    CheckpointDecryptError,
    DecryptingReader,
    decrypt_stream,
    encrypt_stream,
    encrypted_size,
)

KEY = bytes(range(32))
SALT = bytes(range(100, 132))
PREFIX = b"\x07" * 7
CHUNK = 64


def plaintext(size: int) -> bytes:
    out = b""
    counter = 0
    while len(out) < size:
        out += hashlib.sha256(counter.to_bytes(4, "big")).digest()
        counter += 1
    return out[:size]


def encrypt(data: bytes, chunk_size: int = CHUNK, key: bytes = KEY) -> bytes:
    out = io.BytesIO()
    encrypt_stream(
        io.BytesIO(data), out, key, chunk_size=chunk_size, salt=SALT, nonce_prefix=PREFIX
    )
    return out.getvalue()


def decrypt(data: bytes, key: bytes = KEY) -> bytes:
    out = io.BytesIO()
    decrypt_stream(io.BytesIO(data), out, key)
    return out.getvalue()


def chunks_of(sealed: bytes, chunk_size: int = CHUNK) -> tuple[bytes, list[bytes]]:
    size = chunk_size + TAG_SIZE
    body = sealed[HEADER_SIZE:]
    return sealed[:HEADER_SIZE], [body[i : i + size] for i in range(0, len(body), size)]


def test_known_vectors_stay_fixed():
    # Changing any of these breaks every stored checkpoint: bump the format version instead.
    assert hashlib.sha256(encrypt(plaintext(1000))).hexdigest() == (
        "55e33036bb04e2195f457eaf20d2b1d4e45e396c746356c633a95f877049a0bf"
    )
    assert hashlib.sha256(encrypt(plaintext(1000), chunk_size=4 * 1024 * 1024)).hexdigest() == (
        "1dc7f268d58954fa7e71faac0f382a8f8040895570c78422b3003b4b1d6501c6"
    )
    assert (
        hashlib.sha256(encrypt(b"")).hexdigest()
        == "ba7704860ffbca78c716566991afa5a98f9bf37706da933ce6f7a905e2a05a62"
    )


def test_it_matches_an_independent_rebuild_of_the_spec():
    data = plaintext(150)  # chunks of 64, 64, 22
    header = b"NGCK" + bytes([1]) + struct.pack(">I", CHUNK) + SALT + PREFIX
    file_key = HKDF(hashes.SHA256(), 32, salt=SALT, info=b"nomadgpu/ckpt/v1").derive(KEY)
    aead = AESGCM(file_key)
    pieces = [data[0:64], data[64:128], data[128:]]
    expected = header + b"".join(
        aead.encrypt(PREFIX + struct.pack(">I", i) + bytes([i == 2]), piece, header)
        for i, piece in enumerate(pieces)
    )
    assert encrypt(data) == expected


@pytest.mark.parametrize("size", [0, 1, CHUNK - 1, CHUNK, CHUNK + 1, 3 * CHUNK, 1000])
def test_it_round_trips_and_predicts_its_size(size):
    data = plaintext(size)
    sealed = encrypt(data)
    assert len(sealed) == encrypted_size(size, CHUNK)
    assert decrypt(sealed) == data


def test_the_reader_serves_any_read_size():
    data = plaintext(1000)
    reader = DecryptingReader(io.BytesIO(encrypt(data)), KEY)
    got = b""
    for size in [1, 7, 64, 200, 3, 0, 5000]:
        got += reader.read(size)
    assert got == data
    assert reader.read() == b""


def test_it_survives_short_reads_from_pipes():
    class Trickle(io.RawIOBase):
        def __init__(self, data: bytes) -> None:
            self.data = io.BytesIO(data)

        def read(self, size: int = -1) -> bytes:
            return self.data.read(min(size, 5) if size >= 0 else 5)

    data = plaintext(500)
    out = io.BytesIO()
    decrypt_stream(Trickle(encrypt(data)), out, KEY)
    assert out.getvalue() == data


def test_writing_in_odd_pieces_gives_the_same_bytes():
    data = plaintext(500)
    out = io.BytesIO()
    writer = ckptcrypto.EncryptingWriter(out, KEY, chunk_size=CHUNK, salt=SALT, nonce_prefix=PREFIX)
    for start in range(0, 500, 37):
        writer.write(data[start : start + 37])
    writer.close()
    assert out.getvalue() == encrypt(data)


def test_it_rejects_the_wrong_key():
    with pytest.raises(CheckpointDecryptError):
        decrypt(encrypt(plaintext(100)), key=bytes(32))


@pytest.mark.parametrize("position", [0, 4, 6, 12, 45, HEADER_SIZE, HEADER_SIZE + 70, -1])
def test_it_rejects_a_flipped_bit_anywhere(position):
    sealed = bytearray(encrypt(plaintext(200)))
    sealed[position] ^= 0x01
    with pytest.raises(CheckpointDecryptError):
        decrypt(bytes(sealed))


def test_it_rejects_truncation_at_and_between_chunk_boundaries():
    sealed = encrypt(plaintext(200))  # chunks of 64, 64, 64, 8
    boundaries = [HEADER_SIZE + n * (CHUNK + TAG_SIZE) for n in range(4)]
    for cut in [0, 10, HEADER_SIZE, *boundaries, boundaries[1] + 30, len(sealed) - 1]:
        with pytest.raises(CheckpointDecryptError):
            decrypt(sealed[:cut])


def test_it_rejects_reordered_dropped_and_appended_chunks():
    header, chunks = chunks_of(encrypt(plaintext(200)))
    swapped = header + chunks[1] + chunks[0] + b"".join(chunks[2:])
    dropped = header + chunks[0] + b"".join(chunks[2:])
    appended = header + b"".join(chunks) + chunks[0]
    for sealed in (swapped, dropped, appended):
        with pytest.raises(CheckpointDecryptError):
            decrypt(sealed)


def test_it_refuses_a_header_asking_for_huge_chunks():
    sealed = bytearray(encrypt(plaintext(10)))
    sealed[5:9] = struct.pack(">I", 2**31)
    with pytest.raises(CheckpointDecryptError, match="chunk size"):
        decrypt(bytes(sealed))


def test_it_refuses_more_chunks_than_the_counter_can_number(monkeypatch):
    monkeypatch.setattr(ckptcrypto, "MAX_CHUNKS", 3)
    with pytest.raises(ValueError, match="too many chunks"):
        encrypt(plaintext(4 * CHUNK))
    sealed_ok = encrypt(plaintext(3 * CHUNK))
    assert decrypt(sealed_ok) == plaintext(3 * CHUNK)
