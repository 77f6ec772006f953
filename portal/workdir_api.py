"""The member API's code packs (``/api/workdirs``): how the CLI uploads a job's code folder.

Same auth and team rules as ``/api/jobs`` (``portal.member_api``). A plain pack is PUT straight
to storage by presigned URL and then completed here; an encrypted one is PUT here and encrypted
by the server on the way in (``jobs.code.packs``). Errors are JSON with ``detail``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Literal

from django.http import HttpRequest
from django.urls import reverse
from ninja import Field, Path, Query, Router, Schema
from ninja.errors import HttpError
from ninja.security import django_auth

from jobs.code import packs
from nomadgpu.storage import READ_CHUNK
from portal.member_api import PersonalToken, choose_submit_team

router = Router(auth=[PersonalToken(), django_auth], tags=["workdirs"])

SHA256 = r"^[0-9a-fA-F]{64}$"
TEAM = Field(None, max_length=50, description="team slug; needed when you belong to several")


class WorkdirIn(Schema):
    team: str | None = TEAM
    sha256: str = Field(pattern=SHA256, description="sha256 of the plaintext .tar.gz")
    size: int = Field(ge=1, le=2**53, description="bytes of the plaintext .tar.gz")
    encrypted: bool = Field(False, description="the job encrypts its checkpoints")


class CompleteIn(Schema):
    team: str | None = TEAM
    encrypted: bool = False


class UploadOut(Schema):
    method: Literal["PUT"]
    url: str = Field(description="presigned storage URL, or this API's path (send your token)")
    via: Literal["storage", "api"]


class WorkdirOut(Schema):
    sha256: str
    state: Literal["uploading", "ready"]
    upload: UploadOut | None = Field(None, description="where to PUT the pack; absent if ready")


def _refused(exc: packs.WorkdirRefused) -> HttpError:
    return HttpError(exc.status, str(exc))


def _upload(plan: packs.UploadPlan, team) -> dict | None:
    if plan.state == packs.READY:
        return None
    if plan.via == "storage":
        return {"method": "PUT", "url": plan.url, "via": "storage"}
    path = reverse("api:workdir-content", kwargs={"sha256": plan.sha256})
    return {"method": "PUT", "url": f"{path}?team={team.slug}", "via": "api"}


@router.post("", response=WorkdirOut, exclude_none=True)
def request_upload(request: HttpRequest, payload: WorkdirIn):
    """Ask to upload a code pack: "ready" when the team already has it (send nothing), else
    where to PUT it. 413 over ``WORKDIR_MAX_MB``."""
    team = choose_submit_team(request.auth, payload.team)
    sha256 = payload.sha256.lower()
    try:
        plan = packs.request_upload(
            team=team, sha256=sha256, size=payload.size, encrypted=payload.encrypted
        )
    except packs.WorkdirRefused as exc:
        raise _refused(exc) from exc
    return {"sha256": sha256, "state": plan.state, "upload": _upload(plan, team)}


@router.post("/{sha256}/complete", response=WorkdirOut, exclude_none=True)
def complete(request: HttpRequest, payload: CompleteIn, sha256: str = Path(pattern=SHA256)):
    """A plain pack was PUT to storage: the server reads it back, checks its size and sha256
    and marks it ready. 409 when they differ (upload it again)."""
    team = choose_submit_team(request.auth, payload.team)
    try:
        pack = packs.complete_upload(team=team, sha256=sha256.lower(), encrypted=payload.encrypted)
    except packs.WorkdirRefused as exc:
        raise _refused(exc) from exc
    return {"sha256": pack.sha256, "state": pack.state}


def _body(request: HttpRequest) -> Iterator[bytes]:
    # Read from the stream, never ``request.body``: a pack is far over the JSON body cap.
    while chunk := request.read(READ_CHUNK):
        yield chunk


@router.put("/{sha256}/content", response=WorkdirOut, exclude_none=True, url_name="workdir-content")
def put_content(
    request: HttpRequest,
    sha256: str = Path(pattern=SHA256),
    team: str | None = Query(None, max_length=50),
):
    """The plaintext of an encrypted pack (the body, as bytes): the server encrypts it with
    the pack's own key, stores only the ciphertext and marks the pack ready. 409 when the body
    is not the pack announced."""
    chosen = choose_submit_team(request.auth, team)
    announced = request.headers.get("Content-Length", "")
    if announced.isdigit() and (why := packs.size_refusal(int(announced))):
        raise HttpError(413, why)
    try:
        pack = packs.receive_pack(team=chosen, sha256=sha256.lower(), chunks=_body(request))
    except packs.WorkdirRefused as exc:
        raise _refused(exc) from exc
    return {"sha256": pack.sha256, "state": pack.state}
