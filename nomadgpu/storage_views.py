"""The local object store's HTTP face: presigned-style GET/PUT on ``/storage/<key>``.

Only used with ``STORAGE_BACKEND=local`` (the embedded default). Requests must carry a URL the
server signed (``nomadgpu.storage.LocalObjectStore``); bodies stream to and from disk, never
whole in memory. A PUT the installed write guard refuses (its attempt has ended, its checkpoint
is already complete) gets 410 Gone, before the body and again after it, and nothing lands.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial

from django.conf import settings
from django.http import FileResponse, HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from nomadgpu.storage import (
    READ_CHUNK,
    LocalObjectStore,
    StorageError,
    WriteRefused,
    verify_local_signature,
    write_refusal,
)


def _store() -> LocalObjectStore:
    return LocalObjectStore(settings.STORAGE_LOCAL_DIR, settings.SITE_URL)


def _body_chunks(request: HttpRequest) -> Iterator[bytes]:
    while chunk := request.read(READ_CHUNK):
        yield chunk


def _refuse(status: int, detail: str) -> JsonResponse:
    return JsonResponse({"detail": detail}, status=status)


@csrf_exempt
def local_object(request: HttpRequest, key: str) -> HttpResponse:
    if settings.STORAGE_BACKEND != "local":
        return _refuse(404, "local object storage is not enabled on this server")
    method = "GET" if request.method == "HEAD" else request.method
    if method not in {"GET", "PUT"}:
        return _refuse(405, "only GET, HEAD and PUT are allowed on storage URLs")
    upload_id = request.GET.get("uploadId", "")
    part_number = request.GET.get("partNumber", "")
    part = f"partNumber={part_number}:uploadId={upload_id}" if upload_id else ""
    problem = verify_local_signature(
        method, key, request.GET.get("expires", ""), part, request.GET.get("signature", "")
    )
    if problem:
        return _refuse(403, problem)
    store = _store()
    if method == "PUT" and (late := write_refusal(key)):
        return _refuse(410, late)
    try:
        if method == "GET":
            return FileResponse(store.open_read(key), content_type="application/octet-stream")
        body, accept = _body_chunks(request), partial(write_refusal, key)
        if upload_id:
            etag = store.write_part(key, upload_id, int(part_number), body, accept=accept)
        else:
            etag = store.write_object(key, body, accept=accept)
    except WriteRefused as exc:
        return _refuse(410, str(exc))
    except StorageError as exc:
        return _refuse(404 if method == "GET" else 400, str(exc))
    response = HttpResponse(status=200)
    response["ETag"] = f'"{etag}"'
    return response
