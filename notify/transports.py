"""Transports: send one rendered message to one channel, or raise ``TransportError``.

``permanent=True`` means the channel cannot work until a person fixes it (bot blocked, chat
gone, webhook answering 4xx): the outbox disables it and shows the reason in admin. Anything
else is retried with backoff; ``retry_after`` (seconds) is the server's own word on when.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from typing import ClassVar

import httpx
from django.conf import settings

from notify.messages import Message
from notify.models import Channel, ChannelKind

TIMEOUT = httpx.Timeout(10.0, connect=5.0)
TELEGRAM_MAX_CHARS = 4096
SIGNATURE_HEADER = "X-NomadGPU-Signature"
TIMESTAMP_HEADER = "X-NomadGPU-Timestamp"


class TransportError(Exception):
    def __init__(self, message: str, *, permanent: bool = False, retry_after: float | None = None):
        super().__init__(message)
        self.message = message
        self.permanent = permanent
        self.retry_after = retry_after


class Transport:
    """Sends to one channel. Subclasses implement ``send``; ``client`` is injectable."""

    kind: ClassVar[str] = ""

    def __init__(self, channel: Channel, client: httpx.Client | None = None) -> None:
        self.channel = channel
        self.client = client

    def send(self, message: Message) -> None:
        raise NotImplementedError

    def post(self, url: str, **kwargs) -> httpx.Response:
        """POST, turning network trouble (timeouts, refused connections) into a retry."""
        try:
            if self.client is not None:
                return self.client.post(url, **kwargs)
            with httpx.Client(timeout=TIMEOUT) as client:
                return client.post(url, **kwargs)
        except httpx.TimeoutException as exc:
            raise TransportError(f"timed out: {type(exc).__name__}") from exc
        except httpx.HTTPError as exc:
            raise TransportError(f"connection failed: {exc}") from exc


class Telegram(Transport):
    """Bot API ``sendMessage``. Follows a group's move to a supergroup (new chat id)."""

    kind = ChannelKind.TELEGRAM

    def send(self, message: Message) -> None:
        token = self.channel.bot_token
        if not token:
            raise TransportError("no bot token: set one on the channel or the team", permanent=True)
        if not self.channel.chat_id:
            raise TransportError("no chat id", permanent=True)
        try:
            self._send_to(token, self.channel.chat_id, message)
        except _ChatMigrated as moved:
            self._follow_migration(moved.new_chat_id)
            self._send_to(token, self.channel.chat_id, message)

    def _send_to(self, token: str, chat_id: str, message: Message) -> None:
        url = f"{settings.TELEGRAM_API_URL.rstrip('/')}/bot{token}/sendMessage"
        response = self.post(url, json=telegram_payload(chat_id, message))
        if response.status_code == 200:
            return
        raise telegram_error(response)

    def _follow_migration(self, new_chat_id: str) -> None:
        Channel.objects.filter(pk=self.channel.pk).update(chat_id=new_chat_id)
        self.channel.chat_id = new_chat_id


def telegram_payload(chat_id: str, message: Message) -> dict:
    payload = {"chat_id": chat_id, "disable_web_page_preview": True}
    if len(message.html) <= TELEGRAM_MAX_CHARS:
        return {**payload, "text": message.html, "parse_mode": "HTML"}
    # Cutting HTML could break a tag; a long message goes as plain text, cut.
    return {**payload, "text": message.text[: TELEGRAM_MAX_CHARS - 1] + "…"}


class _ChatMigrated(Exception):
    def __init__(self, new_chat_id: str) -> None:
        self.new_chat_id = new_chat_id


# Bot API descriptions (lower case) that mean the chat is unreachable until a person acts.
TELEGRAM_PERMANENT = ("chat not found", "bot was blocked", "bot was kicked", "user is deactivated")


def telegram_error(response: httpx.Response) -> Exception:
    """Map a Bot API error reply (``{"ok": false, "error_code", "description", "parameters"}``)."""
    try:
        body = response.json()
    except ValueError:
        body = {}
    body = body if isinstance(body, dict) else {}
    code = body.get("error_code", response.status_code)
    description = str(body.get("description") or response.reason_phrase)[:200]
    parameters = body.get("parameters") or {}
    if parameters.get("migrate_to_chat_id"):
        return _ChatMigrated(str(parameters["migrate_to_chat_id"]))
    if code == 429:
        retry_after = parameters.get("retry_after")
        return TransportError(f"Telegram {code}: {description}", retry_after=retry_after)
    permanent = code in (401, 403, 404) or any(
        phrase in description.lower() for phrase in TELEGRAM_PERMANENT
    )
    return TransportError(f"Telegram {code}: {description}", permanent=permanent)


class Webhook(Transport):
    """A signed JSON POST. The receiver checks ``X-NomadGPU-Signature`` =
    ``sha256=hex(HMAC-SHA256(secret, "<timestamp>.<body>"))`` and that the timestamp is recent."""

    kind = ChannelKind.WEBHOOK

    def send(self, message: Message) -> None:
        if not self.channel.webhook_url or not self.channel.webhook_secret:
            raise TransportError("no URL or no signing secret", permanent=True)
        body = json.dumps(webhook_body(message), separators=(",", ":")).encode()
        timestamp = str(int(time.time()))
        headers = {
            "Content-Type": "application/json",
            "User-Agent": "NomadGPU-Webhook/1",
            TIMESTAMP_HEADER: timestamp,
            SIGNATURE_HEADER: sign(self.channel.webhook_secret, timestamp, body),
            "X-NomadGPU-Event": message.kind,
            "X-NomadGPU-Event-Id": str(message.event_id or ""),
        }
        response = self.post(self.channel.webhook_url, content=body, headers=headers)
        if response.is_success:
            return
        raise webhook_error(response)


def sign(secret: str, timestamp: str, body: bytes) -> str:
    signed = timestamp.encode() + b"." + body
    return "sha256=" + hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()


def webhook_body(message: Message) -> dict:
    return {
        "event": message.kind,
        "event_id": message.event_id,
        "created_at": message.created_at,
        "job": {"id": message.job_id, "name": message.job_name},
        "team": {"slug": message.team_slug, "name": message.team_name},
        "title": message.title,
        "message": message.text,
        "data": message.data,
        "link": message.link,
    }


def webhook_error(response: httpx.Response) -> TransportError:
    """429, 5xx: try again later. Other 4xx (and redirects): the receiver refuses us."""
    status = response.status_code
    detail = f"webhook answered {status} {response.reason_phrase}: {response.text[:150]}".strip()
    if status == 429:
        return TransportError(detail, retry_after=_seconds(response.headers.get("Retry-After")))
    if status >= 500:
        return TransportError(detail)
    if 300 <= status < 400:
        where = response.headers.get("Location", "?")
        return TransportError(f"webhook redirects to {where}; use that URL", permanent=True)
    return TransportError(detail, permanent=True)


def _seconds(value: str | None) -> float | None:
    try:
        return float(value) if value else None
    except ValueError:
        return None  # an HTTP date: fall back to our own backoff


TRANSPORTS: dict[str, type[Transport]] = {
    ChannelKind.TELEGRAM: Telegram,
    ChannelKind.WEBHOOK: Webhook,
}


def transport_for(channel: Channel, client: httpx.Client | None = None) -> Transport:
    return TRANSPORTS[channel.kind](channel, client)
