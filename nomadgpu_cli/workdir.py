"""The job's code on submit: a ``workdir`` folder packed (``pack``), stored on the server
unless it holds it already, and named by its sha256; a git table passed on."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import BinaryIO

import httpx

from nomadgpu_cli import pack
from nomadgpu_cli.api import Api
from nomadgpu_cli.errors import EXIT_REFUSED, EXIT_UNREACHABLE, CliError

DEFAULT_WORKDIR_MAX_MB = 200  # the server's WORKDIR_MAX_MB default
UPLOAD_TIMEOUT_S = 600.0


def resolve_workdir(api: Api, spec: dict, *, base: Path) -> None:
    """The job file's ``workdir`` as the API takes it: a folder (relative to the job file) is
    packed, stored on the server and named by its sha256; a git table gets its ``kind``."""
    workdir = spec.get("workdir")
    if workdir == "":
        raise CliError('workdir is empty: name a folder ("." is the job file\'s)', EXIT_REFUSED)
    if isinstance(workdir, str):
        encrypted = bool(spec.get("encrypt_checkpoints"))
        spec["workdir"] = upload_folder(
            api, base / workdir, team=spec.get("team"), encrypted=encrypted
        )
    elif isinstance(workdir, dict) and "git" in workdir:
        rest = {k: v for k, v in workdir.items() if k != "git"}
        spec["workdir"] = {"kind": "git", "url": workdir["git"], **rest}


def upload_folder(api: Api, folder: Path, *, team: str | None, encrypted: bool) -> dict:
    """Pack FOLDER and see that the server holds the pack; the ``workdir`` that names it."""
    folder = Path(os.path.normpath(folder))
    try:
        packed = pack.pack_folder(folder, max_bytes=workdir_max_bytes())
    except pack.PackTooBig as exc:
        limit = "NOMADGPU_WORKDIR_MAX_MB here, WORKDIR_MAX_MB on the server"
        raise CliError(
            f"{exc} ({limit}); {pack.biggest_lines(exc.entries)}", EXIT_REFUSED
        ) from None
    except pack.PackError as exc:
        raise CliError(str(exc), EXIT_REFUSED) from None
    with packed:
        print(f"packed {folder}: {packed.files} files, {pack.human_size(packed.size)}")
        store_pack(api, packed, team=team, encrypted=encrypted)
    return {"kind": "archive", "sha256": packed.sha256}


def workdir_max_bytes() -> int:
    """The biggest pack this CLI uploads, from ``NOMADGPU_WORKDIR_MAX_MB``."""
    raw = os.environ.get("NOMADGPU_WORKDIR_MAX_MB", str(DEFAULT_WORKDIR_MAX_MB))
    try:
        return int(float(raw) * pack.MB)
    except ValueError:
        raise CliError(f"NOMADGPU_WORKDIR_MAX_MB is not a number: {raw!r}", EXIT_REFUSED) from None


def store_pack(api: Api, packed: pack.Pack, *, team: str | None, encrypted: bool) -> None:
    """Ask the server where the pack goes and upload it if it has not got it. A stored object
    the server finds different from the pack (409 on complete) is uploaded once more."""
    body = {"team": team, "sha256": packed.sha256, "size": packed.size, "encrypted": encrypted}
    for attempt in (1, 2):
        offer = ask_to_store(api, body, packed)
        if offer["state"] == "ready":
            print("code unchanged: nothing to upload" if attempt == 1 else "code stored")
            return
        put_pack(api, packed, offer["upload"])
        if offer["upload"]["via"] == "api" or complete_pack(api, body, last=attempt == 2):
            print(f"code uploaded ({pack.human_size(packed.size)})")
            return


def ask_to_store(api: Api, body: dict, packed: pack.Pack) -> dict:
    """The server's answer to ``POST /api/workdirs``: ready, or where to upload."""
    try:
        return api.post("/workdirs", body)
    except CliError as exc:
        if exc.status == 413:  # the server's cap is lower than this CLI's
            raise CliError(f"{exc}; {pack.biggest_lines(packed.entries)}", exc.code, 413) from None
        raise


def put_pack(api: Api, packed: pack.Pack, upload: dict) -> None:
    """PUT the pack where the server said: its own API (encrypted packs: the server encrypts
    what it receives) with the token, or a presigned storage URL without it."""
    if upload.get("method", "PUT") != "PUT":
        raise CliError(f"the server asked for an upload by {upload['method']}", EXIT_REFUSED)
    packed.file.seek(0)
    # An explicit length keeps httpx from chunked encoding, which S3 PUTs refuse.
    headers = {"Content-Length": str(packed.size)}
    if upload["via"] == "api":
        url = api.own_url(upload["url"])
        api.call("PUT", url, content=packed.file, headers=headers, timeout=UPLOAD_TIMEOUT_S)
    else:
        put_to_storage(upload["url"], packed.file, headers)


def put_to_storage(url: str, body: BinaryIO, headers: dict[str, str]) -> None:
    # A plain httpx call, not the API's client: the URL's signature is the permission, and the
    # token must never reach a storage provider.
    try:
        response = httpx.put(url, content=body, headers=headers, timeout=UPLOAD_TIMEOUT_S)
    except httpx.HTTPError as exc:
        raise CliError(f"cannot upload the code pack to storage: {exc}", EXIT_UNREACHABLE) from exc
    if not response.is_success:
        why = f"{response.status_code} {response.text[:300]}".strip()
        raise CliError(f"storage refused the code pack: {why}", EXIT_UNREACHABLE)


def complete_pack(api: Api, body: dict, *, last: bool) -> bool:
    """Tell the server a plain pack is in storage; False when it found it different (and this
    was not the last try), so that it is uploaded again."""
    try:
        api.post(
            f"/workdirs/{body['sha256']}/complete", {k: body[k] for k in ("team", "encrypted")}
        )
    except CliError as exc:
        if exc.status != 409 or last:
            raise
        print(f"nomadgpu: {exc}; uploading again", file=sys.stderr)
        return False
    return True
