"""What went wrong staging an entry, in words, and whether and when to try again.

Every failure names its entry ("stage[0] hf Qwen/NoSuch") and its cause, and says who can do
what about it (``StageTrouble.sentence``). Two kinds:

- **Permanent**: the source answered and said no (a repo, revision or file that does not
  exist, a gated or private repo without a token: ``resolve.hub_refusal``; any other 4xx), or
  the worker does not trust its TLS certificate. Trying again changes nothing: the job fails
  at once.
- **Transient**: the source could not be reached or had a fault of its own: DNS, a refused or
  broken connection, a timeout (``httpx.TransportError``), a 5xx, a 429; and any other error
  (the team's storage, say). The job's staging is tried again after ``RETRY_DELAYS_S`` (2, 4,
  8, 16 s: five tries over 30 s, each retry on the job's timeline: "stage[0] hf Qwen/NoSuch:
  the Hub is unreachable from the worker (DNS: Name or service not known), retrying in 8 s
  (attempt 3 of 5)"), then fails with the last cause. A 429's ``Retry-After`` (RFC 9110
  §10.2.3, seconds or an HTTP date) is waited for when it asks more, up to
  ``RETRY_AFTER_MAX_S``; a Hub that asks for longer is out of this job's reach, and the job
  fails saying when to submit again.
"""

from __future__ import annotations

import socket
import ssl
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlsplit

import httpx

from jobs.staging.resolve import SourceUnavailable, StageRefused

RETRY_DELAYS_S: tuple[float, ...] = (2, 4, 8, 16)
RETRY_AFTER_MAX_S = 60.0
NETWORK_ADVICE = "check the worker's network"


class StageTrouble(Exception):
    """Staging failed on an entry (LABEL, "" when on none): CAUSE, what to do (ADVICE), and
    whether another try may succeed (TRANSIENT, after at least RETRY_AFTER seconds)."""

    def __init__(
        self,
        label: str,
        cause: str,
        *,
        advice: str = "",
        transient: bool,
        retry_after: float | None = None,
    ) -> None:
        self.label, self.cause, self.advice = label, cause, advice
        self.transient, self.retry_after = transient, retry_after
        super().__init__(self.sentence)

    def __reduce__(self):
        # Rebuilt with its keywords (an exception pickles its args alone: Celery's result
        # backend and a retry's log may pickle it).
        kwargs = {"advice": self.advice, "transient": self.transient}
        return (_rebuild, (self.label, self.cause, kwargs, self.retry_after))

    @property
    def sentence(self) -> str:
        """ "stage[0] hf Qwen/NoSuch: not found on ... (401), ...: check the repo id"."""
        parts = [p for p in (self.label, self.cause, self.advice) if p]
        return ": ".join(parts)

    def retrying(self, delay: float, attempt: int) -> str:
        """The timeline's line for a retry after ATTEMPT (1-based) failed."""
        head = ": ".join(p for p in (self.label, self.cause) if p)
        return f"{head}, retrying in {_seconds(delay)} s (attempt {attempt} of {attempts()})"


def _rebuild(label: str, cause: str, kwargs: dict, retry_after: float | None) -> StageTrouble:
    return StageTrouble(label, cause, retry_after=retry_after, **kwargs)


def attempts() -> int:
    """How many times a staging is tried before the job fails."""
    return len(RETRY_DELAYS_S) + 1


def retry_delay(trouble: StageTrouble, *, failures: int) -> float | None:
    """Seconds to wait before trying again after the FAILURES-th failure (1-based), or None:
    fail now (a permanent cause, the tries spent, or a Retry-After past RETRY_AFTER_MAX_S)."""
    if not trouble.transient or failures > len(RETRY_DELAYS_S):
        return None
    delay = RETRY_DELAYS_S[failures - 1]
    if trouble.retry_after is not None:
        if trouble.retry_after > RETRY_AFTER_MAX_S:
            return None
        delay = max(delay, trouble.retry_after)
    return delay


def entry_label(index: int, entry: dict) -> str:
    """ "stage[0] hf Qwen/NoSuch" or "stage[1] url https://example.org/f.bin"."""
    if "hf" in entry:
        return f"stage[{index}] hf {entry['hf']}"
    return f"stage[{index}] url {entry.get('url', '')}"


@contextmanager
def about(label: str, source: str) -> Iterator[None]:
    """Raise what goes wrong inside as a StageTrouble naming LABEL; SOURCE is where the entry
    comes from ("the Hub", or a URL's host)."""
    try:
        yield
    except StageTrouble:
        raise
    except StageRefused as exc:
        raise StageTrouble(label, str(exc), transient=False) from exc
    except SourceUnavailable as exc:
        raise StageTrouble(
            label, exc.cause, advice=exc.advice, transient=True, retry_after=exc.retry_after
        ) from exc
    except httpx.TransportError as exc:
        raise transport_trouble(label, source, exc) from exc
    except Exception as exc:  # the team's storage, or a bug: worth the same tries
        raise StageTrouble(label, f"{type(exc).__name__}: {exc}", transient=True) from exc


def unexpected(exc: Exception) -> StageTrouble:
    """EXC raised outside any entry (the database, a team secret): tried again like a fault."""
    return StageTrouble("", f"{type(exc).__name__}: {exc}", transient=True)


def transport_trouble(label: str, source: str, exc: httpx.TransportError) -> StageTrouble:
    """EXC (the request never got an answer) in words: DNS, refused, timeout, TLS, broken."""
    root = _root_cause(exc)
    if isinstance(root, socket.gaierror):
        why = root.strerror or str(root)
        cause = f"{source} is unreachable from the worker (DNS: {why})"
        return StageTrouble(label, cause, advice=NETWORK_ADVICE, transient=True)
    if isinstance(root, ConnectionRefusedError):
        cause = f"{source} is unreachable from the worker (connection refused)"
        return StageTrouble(label, cause, advice=NETWORK_ADVICE, transient=True)
    if isinstance(exc, httpx.TimeoutException):
        kind = type(exc).__name__.removesuffix("Timeout").lower() or "request"
        cause = f"{source} did not answer the worker in time ({kind} timeout)"
        return StageTrouble(label, cause, advice=NETWORK_ADVICE, transient=True)
    if isinstance(root, ssl.SSLCertVerificationError):
        cause = f"the worker does not trust {source}'s TLS certificate ({root.verify_message})"
        advice = "check the worker's CA certificates (SSL_CERT_FILE) and any proxy in between"
        return StageTrouble(label, cause, advice=advice, transient=False)
    if isinstance(root, ssl.SSLError):
        cause = f"the TLS handshake with {source} failed ({root.reason or root})"
        return StageTrouble(label, cause, advice=NETWORK_ADVICE, transient=True)
    cause = f"the connection to {source} broke ({type(exc).__name__}: {exc})"
    return StageTrouble(label, cause, advice=NETWORK_ADVICE, transient=True)


def source_of(entry: dict) -> str:
    """Where ENTRY's bytes come from, as a sentence names it."""
    if "hf" in entry:
        return "the Hub"
    return urlsplit(entry.get("url", "")).hostname or "its server"


def _root_cause(exc: BaseException) -> BaseException:
    # httpx raises its ConnectError from httpcore's, raised from the socket's OSError.
    seen = exc
    while seen.__cause__ is not None or seen.__context__ is not None:
        seen = seen.__cause__ or seen.__context__
    return seen


def _seconds(value: float) -> str:
    return f"{value:g}"
