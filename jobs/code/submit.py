"""What a job's ``workdir`` column holds, decided at submit: a ready code pack of the team, or a
git repository with its ref resolved to the commit every host checks out (``git_refs``).
"""

from __future__ import annotations

from jobs.code import git_refs
from jobs.code.packs import READY, WorkdirRefused, short
from jobs.models import WorkdirPack
from nomadgpu.models import TeamSecret


def stored_workdir(spec, *, team, encrypted: bool) -> dict:
    """What a job's ``workdir`` column holds for SPEC (a ``jobs.spec`` workdir or None):
    ``{}``, the archive (a READY pack of TEAM, encrypted iff ENCRYPTED) or the git repository
    with its ref resolved to a commit. Raises WorkdirRefused naming what is wrong. Calls git
    for a git workdir: never inside a transaction."""
    if spec is None:
        return {}
    if spec.kind == "archive":
        check_ready_pack(team=team, sha256=spec.sha256, encrypted=encrypted)
        return {"kind": "archive", "sha256": spec.sha256}
    ssh_key = deploy_key(team, spec.deploy_key_secret)
    try:
        commit = git_refs.resolve_ref(spec.url, spec.ref, ssh_key=ssh_key)
    except git_refs.GitRefError as exc:
        raise WorkdirRefused(str(exc), about=exc.about) from None
    return {
        "kind": "git",
        "url": spec.url,
        "ref": spec.ref,
        "commit": commit,
        "deploy_key_secret": spec.deploy_key_secret,
    }


def check_ready_pack(*, team, sha256: str, encrypted: bool) -> None:
    """Refuse (WorkdirRefused) unless TEAM has the READY pack SHA256 stored as ENCRYPTED says."""
    packs = {p.encrypted: p for p in WorkdirPack.objects.filter(team=team, sha256=sha256)}
    pack, other = packs.get(encrypted), packs.get(not encrypted)
    if pack is not None and pack.state == READY:
        return
    if pack is not None:
        why = f"code pack {short(sha256)} has not finished uploading"
    elif other is not None:
        stored, wanted = ("plain", "encrypted") if encrypted else ("encrypted", "plain")
        why = (
            f"code pack {short(sha256)} is stored {stored}, and this job needs it {wanted} "
            f"(encrypt_checkpoints is {'on' if encrypted else 'off'})"
        )
    else:
        why = f"team {team.slug} has no code pack {short(sha256)}"
    raise WorkdirRefused(f"{why}: upload the code first", about="sha256")


def deploy_key(team, name: str) -> str | None:
    """The value of TEAM's secret NAME (a deploy key), None when no name is given; refuses a
    name the team does not have."""
    if not name:
        return None
    secret = TeamSecret.objects.filter(team=team, name=name).first()
    if secret is None:
        raise WorkdirRefused(
            f"the team has no secret named {name!r}: add it on the Team page or in the admin",
            about="deploy_key_secret",
        )
    return secret.value
