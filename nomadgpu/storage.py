"""Object storage for checkpoints: S3-compatible (R2, AWS, MinIO, B2) or local files.

Agents never get the server's storage key. They get presigned URLs that reach one object each,
for a limited time (the grant works on every S3-compatible service; on R2 the server must create
and complete multipart uploads itself, because those are POSTs R2 cannot presign). The local
backend imitates the same contract: the web process serves ``/storage/<key>`` and accepts only
URLs it signed itself (HMAC over method, key, expiry and part), so the embedded setup exercises
the very code path production uses.
"""

from __future__ import annotations

import hashlib
import hmac
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Protocol
from urllib.parse import quote, urlencode

from django.conf import settings

PRESIGN_TTL_S = 3600
READ_CHUNK = 1024 * 1024


@dataclass(frozen=True)
class ObjectInfo:
    key: str
    size: int
    etag: str


class StorageError(Exception):
    """Storage refused or failed; the message says which object and why."""


class WriteRefused(StorageError):
    """A correctly signed write that may no longer land (its uploader was fenced)."""


# Whether a signed write to a key may still land: None, or why not. The signature only says
# the server handed out the URL; the jobs app knows whether the attempt it was handed to is
# still live (``jobs.checkpoints.records.late_write_refusal``, installed by ``jobs.apps``). Only the
# local backend can ask: an S3 service takes any validly signed PUT until the URL expires, so
# there the jobs app deletes what lands late instead
# (``jobs.checkpoints.records.discard_unfinished``).
WriteGuard = Callable[[str], str | None]


def _no_guard(key: str) -> str | None:
    return None


_write_guard: WriteGuard = _no_guard


def install_write_guard(guard: WriteGuard) -> None:
    """Make GUARD the judge of whether a signed local write may still land."""
    global _write_guard
    _write_guard = guard


def write_refusal(key: str) -> str | None:
    """Why a signed write to KEY must not land now, or None (the installed guard's answer)."""
    return _write_guard(key)


class ObjectStore(Protocol):
    def presign_put(self, key: str, *, ttl_s: int = PRESIGN_TTL_S) -> str: ...
    def presign_get(self, key: str, *, ttl_s: int = PRESIGN_TTL_S) -> str: ...
    def create_multipart(self, key: str) -> str: ...
    def presign_part(
        self, key: str, upload_id: str, part_number: int, *, ttl_s: int = PRESIGN_TTL_S
    ) -> str: ...
    def complete_multipart(
        self, key: str, upload_id: str, parts: list[tuple[int, str]]
    ) -> None: ...
    def abort_multipart(self, key: str, upload_id: str) -> None: ...
    def head(self, key: str) -> ObjectInfo | None: ...
    def put_bytes(self, key: str, data: bytes, *, only_if_absent: bool = False) -> None: ...
    def put_file(self, key: str, source: BinaryIO) -> None: ...
    def open_read(self, key: str) -> BinaryIO: ...
    def list_keys(self, prefix: str) -> list[str]: ...
    def delete_keys(self, keys: list[str]) -> None: ...


# --- S3-compatible ---------------------------------------------------------------------------


class S3ObjectStore:
    """boto3 against any S3-compatible endpoint. Presigning is local: no network round trip."""

    def __init__(
        self,
        *,
        bucket: str,
        endpoint_url: str | None,
        access_key_id: str,
        secret_access_key: str,
        region: str = "auto",
    ) -> None:
        import boto3
        from botocore.config import Config

        self.bucket = bucket
        # boto3 >= 1.36 adds CRC checksums by default, which R2, B2 and some MinIO versions
        # reject; only send them when an operation requires it.
        config = Config(
            signature_version="s3v4",
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
            retries={"max_attempts": 5, "mode": "standard"},
        )
        self.client = boto3.client(
            "s3",
            endpoint_url=endpoint_url or None,
            aws_access_key_id=access_key_id or None,
            aws_secret_access_key=secret_access_key or None,
            region_name=None if region == "auto" and not endpoint_url else region,
            config=config,
        )

    def _presign(self, method: str, ttl_s: int, **params) -> str:
        return self.client.generate_presigned_url(
            method, Params={"Bucket": self.bucket, **params}, ExpiresIn=ttl_s
        )

    def presign_put(self, key: str, *, ttl_s: int = PRESIGN_TTL_S) -> str:
        return self._presign("put_object", ttl_s, Key=key)

    def presign_get(self, key: str, *, ttl_s: int = PRESIGN_TTL_S) -> str:
        return self._presign("get_object", ttl_s, Key=key)

    def create_multipart(self, key: str) -> str:
        return self.client.create_multipart_upload(Bucket=self.bucket, Key=key)["UploadId"]

    def presign_part(
        self, key: str, upload_id: str, part_number: int, *, ttl_s: int = PRESIGN_TTL_S
    ) -> str:
        return self._presign(
            "upload_part", ttl_s, Key=key, UploadId=upload_id, PartNumber=part_number
        )

    def complete_multipart(self, key: str, upload_id: str, parts: list[tuple[int, str]]) -> None:
        self.client.complete_multipart_upload(
            Bucket=self.bucket,
            Key=key,
            UploadId=upload_id,
            MultipartUpload={"Parts": [{"PartNumber": n, "ETag": e} for n, e in sorted(parts)]},
        )

    def abort_multipart(self, key: str, upload_id: str) -> None:
        self.client.abort_multipart_upload(Bucket=self.bucket, Key=key, UploadId=upload_id)

    def head(self, key: str) -> ObjectInfo | None:
        from botocore.exceptions import ClientError

        try:
            meta = self.client.head_object(Bucket=self.bucket, Key=key)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in {"404", "NoSuchKey", "NotFound"}:
                return None
            raise StorageError(f"HEAD {key}: {exc}") from exc
        return ObjectInfo(key=key, size=meta["ContentLength"], etag=meta["ETag"].strip('"'))

    def put_bytes(self, key: str, data: bytes, *, only_if_absent: bool = False) -> None:
        extra = {"IfNoneMatch": "*"} if only_if_absent else {}
        self.client.put_object(Bucket=self.bucket, Key=key, Body=data, **extra)

    def put_file(self, key: str, source: BinaryIO) -> None:
        """Store what SOURCE holds from its current position (multipart when large)."""
        self.client.upload_fileobj(source, self.bucket, key)

    def open_read(self, key: str) -> BinaryIO:
        return self.client.get_object(Bucket=self.bucket, Key=key)["Body"]

    def list_keys(self, prefix: str) -> list[str]:
        paginator = self.client.get_paginator("list_objects_v2")
        keys: list[str] = []
        for page in paginator.paginate(Bucket=self.bucket, Prefix=prefix):
            keys.extend(item["Key"] for item in page.get("Contents", []))
        return keys

    def delete_keys(self, keys: list[str]) -> None:
        for start in range(0, len(keys), 1000):  # DeleteObjects takes at most 1000 keys
            batch = [{"Key": key} for key in keys[start : start + 1000]]
            self.client.delete_objects(Bucket=self.bucket, Delete={"Objects": batch})


# --- Local files, served by the web process --------------------------------------------------


def sign_local_url(method: str, key: str, expires: int, part: str = "") -> str:
    """The HMAC that makes a local storage URL valid for exactly this method, object and part."""
    message = f"{method}\n{key}\n{expires}\n{part}".encode()
    secret = hashlib.sha256(f"nomadgpu-local-storage:{settings.SECRET_KEY}".encode()).digest()
    return hmac.new(secret, message, hashlib.sha256).hexdigest()


def verify_local_signature(
    method: str, key: str, expires: str, part: str, signature: str, *, now: float | None = None
) -> str | None:
    """Why a local storage request is refused, or None when its signature and expiry hold."""
    try:
        expires_at = int(expires)
    except ValueError:
        return "the URL has no valid expiry"
    if expires_at < (now if now is not None else time.time()):
        return "the URL has expired; ask the supervisor for a new one"
    expected = sign_local_url(method, key, expires_at, part)
    if not hmac.compare_digest(expected, signature or ""):
        return "the URL's signature does not match this object and method"
    return None


class LocalObjectStore:
    """Objects as files under ROOT; URLs point at the web process (``/storage/<key>``)."""

    def __init__(self, root: Path, base_url: str) -> None:
        self.root = root
        self.base_url = base_url.rstrip("/")
        self.root.mkdir(parents=True, exist_ok=True)

    def path_for(self, key: str) -> Path:
        path = (self.root / key).resolve()
        if not path.is_relative_to(self.root.resolve()) or key.startswith("/"):
            raise StorageError(f"object key {key!r} leaves the storage folder")
        return path

    def _url(self, method: str, key: str, ttl_s: int, **part: str) -> str:
        expires = int(time.time()) + ttl_s
        part_text = ":".join(f"{k}={v}" for k, v in sorted(part.items()))
        query = {
            **part,
            "expires": expires,
            "signature": sign_local_url(method, key, expires, part_text),
        }
        return f"{self.base_url}/storage/{quote(key)}?{urlencode(query)}"

    def presign_put(self, key: str, *, ttl_s: int = PRESIGN_TTL_S) -> str:
        return self._url("PUT", key, ttl_s)

    def presign_get(self, key: str, *, ttl_s: int = PRESIGN_TTL_S) -> str:
        return self._url("GET", key, ttl_s)

    def _parts_dir(self, key: str, upload_id: str) -> Path:
        return self.path_for(f".multipart/{upload_id}")

    def create_multipart(self, key: str) -> str:
        upload_id = hashlib.sha256(f"{key}{time.time_ns()}".encode()).hexdigest()[:32]
        self._parts_dir(key, upload_id).mkdir(parents=True)
        return upload_id

    def presign_part(
        self, key: str, upload_id: str, part_number: int, *, ttl_s: int = PRESIGN_TTL_S
    ) -> str:
        return self._url("PUT", key, ttl_s, uploadId=upload_id, partNumber=str(part_number))

    def write_part(
        self,
        key: str,
        upload_id: str,
        part_number: int,
        chunks: Iterator[bytes],
        *,
        accept: Callable[[], str | None] | None = None,
    ) -> str:
        parts_dir = self._parts_dir(key, upload_id)
        if not parts_dir.is_dir():
            raise StorageError(f"no multipart upload {upload_id} for {key}")
        return self._write(parts_dir / f"{part_number:05d}", chunks, accept)

    def complete_multipart(self, key: str, upload_id: str, parts: list[tuple[int, str]]) -> None:
        parts_dir = self._parts_dir(key, upload_id)
        target = self.path_for(key)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(target.name + ".assembling")
        with tmp.open("wb") as out:
            for number, etag in sorted(parts):
                part = parts_dir / f"{number:05d}"
                if not part.exists() or _md5_of(part) != etag.strip('"'):
                    raise StorageError(f"part {number} of {key} is missing or its ETag differs")
                with part.open("rb") as src:
                    shutil.copyfileobj(src, out, READ_CHUNK)
        tmp.replace(target)
        shutil.rmtree(parts_dir)

    def abort_multipart(self, key: str, upload_id: str) -> None:
        shutil.rmtree(self._parts_dir(key, upload_id), ignore_errors=True)

    def write_object(
        self,
        key: str,
        chunks: Iterator[bytes],
        *,
        accept: Callable[[], str | None] | None = None,
    ) -> str:
        """Store CHUNKS at KEY. ACCEPT, when given, is asked once the body is in, just before
        the object appears: a reason from it discards the body (``WriteRefused``)."""
        target = self.path_for(key)
        target.parent.mkdir(parents=True, exist_ok=True)
        return self._write(target, chunks, accept)

    def _write(
        self, target: Path, chunks: Iterator[bytes], accept: Callable[[], str | None] | None
    ) -> str:
        # Write aside and rename, so a reader never sees half an object.
        tmp = target.with_name(target.name + ".partial")
        digest = hashlib.md5(usedforsecurity=False)
        with tmp.open("wb") as out:
            for chunk in chunks:
                digest.update(chunk)
                out.write(chunk)
        # Asked again after the body: an upload begun while its attempt was live can end long
        # after (a host frozen mid-PUT), and must not land once the attempt is over.
        problem = accept() if accept is not None else None
        if problem:
            tmp.unlink(missing_ok=True)
            raise WriteRefused(problem)
        tmp.replace(target)
        return digest.hexdigest()

    def head(self, key: str) -> ObjectInfo | None:
        path = self.path_for(key)
        if not path.is_file():
            return None
        return ObjectInfo(key=key, size=path.stat().st_size, etag=_md5_of(path))

    def put_bytes(self, key: str, data: bytes, *, only_if_absent: bool = False) -> None:
        path = self.path_for(key)
        if only_if_absent and path.exists():
            raise StorageError(f"{key} already exists")
        self.write_object(key, iter([data]))

    def put_file(self, key: str, source: BinaryIO) -> None:
        """Store what SOURCE holds from its current position, streamed."""
        self.write_object(key, iter(lambda: source.read(READ_CHUNK), b""))

    def open_read(self, key: str) -> BinaryIO:
        path = self.path_for(key)
        if not path.is_file():
            raise StorageError(f"no object {key}")
        return path.open("rb")

    def list_keys(self, prefix: str) -> list[str]:
        base = self.root.resolve()
        return sorted(
            str(p.relative_to(base))
            for p in base.rglob("*")
            if p.is_file()
            and not p.name.endswith((".partial", ".assembling"))
            and not str(p.relative_to(base)).startswith(".multipart")
            and str(p.relative_to(base)).startswith(prefix)
        )

    def delete_keys(self, keys: list[str]) -> None:
        for key in keys:
            self.path_for(key).unlink(missing_ok=True)


def _md5_of(path: Path) -> str:
    digest = hashlib.md5(usedforsecurity=False)
    with path.open("rb") as src:
        while chunk := src.read(READ_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def object_store(team=None) -> ObjectStore:
    """The store for TEAM: its own S3 settings when an admin set them, else the server's."""
    if team is not None and team.storage_bucket:
        return S3ObjectStore(
            bucket=team.storage_bucket,
            endpoint_url=team.storage_endpoint_url or None,
            access_key_id=team.storage_access_key_id,
            secret_access_key=team.storage_secret_access_key,
        )
    if settings.STORAGE_BACKEND == "s3":
        return S3ObjectStore(
            bucket=settings.S3_BUCKET,
            endpoint_url=settings.S3_ENDPOINT_URL or None,
            access_key_id=settings.S3_ACCESS_KEY_ID,
            secret_access_key=settings.S3_SECRET_ACCESS_KEY,
            region=settings.S3_REGION,
        )
    if settings.STORAGE_BACKEND != "local":
        raise StorageError(f"STORAGE_BACKEND={settings.STORAGE_BACKEND!r}: use 'local' or 's3'")
    return LocalObjectStore(settings.STORAGE_LOCAL_DIR, settings.SITE_URL)
