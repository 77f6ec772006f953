"""Bearer tokens (agents' per-attempt tokens, members' API tokens): shown once, stored as
prefix + SHA-256.

SHA-256 is enough for 256-bit random tokens (slow hashes are for guessable passwords); the
prefix makes lookup one indexed read and the digest is compared in constant time.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass

TOKEN_MARK = "ngat_"
PREFIX_LEN = 12


@dataclass(frozen=True)
class IssuedToken:
    token: str
    prefix: str
    digest: str


def issue_token() -> IssuedToken:
    token = TOKEN_MARK + secrets.token_urlsafe(32)
    return IssuedToken(token=token, prefix=token_prefix(token), digest=token_digest(token))


def token_prefix(token: str) -> str:
    return token[len(TOKEN_MARK) : len(TOKEN_MARK) + PREFIX_LEN]


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def token_matches(token: str, digest: str) -> bool:
    return hmac.compare_digest(token_digest(token), digest)
