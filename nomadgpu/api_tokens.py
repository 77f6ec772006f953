"""Personal API tokens: created in the portal, shown once, stored as prefix + SHA-256 digest.

The same scheme as the agent's per-attempt tokens (``nomadgpu.tokens``): 256 random bits, so a fast
hash is enough; the prefix makes lookup one indexed read and the digest is compared in constant
time. The ``ngpt_`` mark makes a leaked token recognisable (secret scanners, logs).
"""

from __future__ import annotations

import secrets
from datetime import datetime, timedelta

from django.shortcuts import get_object_or_404

from nomadgpu.models import ApiToken
from nomadgpu.tokens import token_digest, token_matches

TOKEN_MARK = "ngpt_"
PREFIX_LEN = 12
# last_used_at is informative: writing it at most once a minute keeps a busy CLI (logs -f,
# submit --follow poll every second) from turning every read into a row update.
LAST_USED_RESOLUTION = timedelta(seconds=60)


def token_prefix(token: str) -> str:
    return token[len(TOKEN_MARK) : len(TOKEN_MARK) + PREFIX_LEN]


def create_token(*, user, name: str, now: datetime) -> tuple[ApiToken, str]:
    """A new token for USER; returns the row and the plaintext (shown once, never stored)."""
    token = TOKEN_MARK + secrets.token_urlsafe(32)
    row = ApiToken.objects.create(
        user=user, name=name, prefix=token_prefix(token), digest=token_digest(token), created_at=now
    )
    return row, token


def authenticate_token(token: str, *, now: datetime):
    """The active user owning TOKEN, or None (unknown, revoked, malformed, inactive user)."""
    if not token.startswith(TOKEN_MARK):
        return None
    row = (
        ApiToken.objects.select_related("user")
        .filter(prefix=token_prefix(token), revoked_at=None)
        .first()
    )
    if row is None or not token_matches(token, row.digest) or not row.user.is_active:
        return None
    stale = now - LAST_USED_RESOLUTION
    if row.last_used_at is None or row.last_used_at < stale:
        ApiToken.objects.filter(pk=row.pk).update(last_used_at=now)
    return row.user


def revoke_token(*, user, token_id: int, now: datetime) -> ApiToken:
    """Revoke USER's token TOKEN_ID (404 for anyone else's); revoking twice keeps the first time."""
    row = get_object_or_404(ApiToken, pk=token_id, user=user)
    ApiToken.objects.filter(pk=row.pk, revoked_at=None).update(revoked_at=now)
    row.refresh_from_db()
    return row
