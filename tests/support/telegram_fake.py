"""A local HTTP server that speaks the Telegram Bot API's ``sendMessage``: its request checks,
its replies and its error bodies (``{"ok": false, "error_code", "description", "parameters"}``).

It records every accepted message and can be told how to fail: a blocked bot, a chat that does
not exist, flood control (429 with ``retry_after``), a group that moved to a supergroup
(400 with ``migrate_to_chat_id``, for every later send to the old id, as Telegram does), or a
plain server error. Errors queued with ``fail_next`` are answered once each, in order.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from html.parser import HTMLParser
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ALLOWED_TAGS = {"b", "strong", "i", "em", "u", "ins", "s", "strike", "del", "a", "code", "pre"}
ALLOWED_TAGS |= {"span", "tg-spoiler", "blockquote", "tg-emoji"}
MAX_TEXT = 4096


def error(code: int, description: str, **parameters) -> tuple[int, dict]:
    body = {"ok": False, "error_code": code, "description": description}
    if parameters:
        body["parameters"] = parameters
    return code, body


def blocked() -> tuple[int, dict]:
    return error(403, "Forbidden: bot was blocked by the user")


def chat_not_found() -> tuple[int, dict]:
    return error(400, "Bad Request: chat not found")


def flood(retry_after: int) -> tuple[int, dict]:
    return error(429, f"Too Many Requests: retry after {retry_after}", retry_after=retry_after)


def server_error() -> tuple[int, dict]:
    return error(502, "Bad Gateway")


@dataclass
class Sent:
    token: str
    chat_id: str
    text: str
    payload: dict


@dataclass
class FakeTelegram:
    url: str = ""
    messages: list[Sent] = field(default_factory=list)
    requests: int = 0
    blocked_chats: set[str] = field(default_factory=set)
    unknown_chats: set[str] = field(default_factory=set)
    migrated: dict[str, str] = field(default_factory=dict)  # old chat id -> new one
    queued: list[tuple[int, dict]] = field(default_factory=list)
    delay_s: float = 0.0  # how long each reply takes (to make concurrent senders overlap)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def fail_next(self, *replies: tuple[int, dict]) -> None:
        with self.lock:
            self.queued.extend(replies)

    def texts(self, chat_id: str | None = None) -> list[str]:
        with self.lock:
            return [m.text for m in self.messages if chat_id is None or m.chat_id == chat_id]

    def answer(self, path: str, payload: dict) -> tuple[int, dict]:
        match = re.fullmatch(r"/bot(?P<token>\d+:[\w-]+)/(?P<method>\w+)", path)
        if match is None:
            return error(404, "Not Found")
        if match["method"] != "sendMessage":
            return error(404, "Not Found: method not found")
        with self.lock:
            self.requests += 1
            if self.queued:
                return self.queued.pop(0)
            return self._send(match["token"], payload)

    def _send(self, token: str, payload: dict) -> tuple[int, dict]:
        chat_id = str(payload.get("chat_id", ""))
        text = payload.get("text") or ""
        problem = check_request(chat_id, text, payload.get("parse_mode"))
        if problem:
            return error(400, f"Bad Request: {problem}")
        if chat_id in self.migrated:
            return error(
                400,
                "Bad Request: group chat was upgraded to a supergroup chat",
                migrate_to_chat_id=int(self.migrated[chat_id]),
            )
        if chat_id in self.blocked_chats:
            return blocked()
        if chat_id in self.unknown_chats:
            return chat_not_found()
        self.messages.append(Sent(token, chat_id, text, payload))
        result = {
            "message_id": len(self.messages),
            "from": {"id": int(token.split(":")[0]), "is_bot": True, "first_name": "NomadGPU"},
            "chat": {"id": chat_id, "type": "private"},
            "date": int(time.time()),
            "text": text,
        }
        return 200, {"ok": True, "result": result}


def check_request(chat_id: str, text: str, parse_mode: str | None) -> str | None:
    """What Telegram would refuse with 400, as its description says it."""
    if not chat_id:
        return "chat_id is empty"
    if not text.strip():
        return "message text is empty"
    if len(text) > MAX_TEXT:
        return "message is too long"
    if parse_mode not in (None, "HTML", "MarkdownV2", "Markdown"):
        return "unsupported parse_mode"
    if parse_mode == "HTML":
        return html_problem(text)
    return None


class _EntityChecker(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=False)
        self.stack: list[str] = []
        self.problem: str | None = None

    def handle_starttag(self, tag, attrs):
        if tag not in ALLOWED_TAGS:
            self.problem = self.problem or f'Unsupported start tag "{tag}"'
        self.stack.append(tag)

    def handle_endtag(self, tag):
        if not self.stack or self.stack.pop() != tag:
            self.problem = self.problem or f'Unmatched end tag "{tag}"'


def html_problem(text: str) -> str | None:
    if re.search(r"&(?!(lt|gt|amp|quot|#\d+|#x[0-9a-fA-F]+);)", text):
        return "can't parse entities: Unsupported entity or stray &"
    checker = _EntityChecker()
    checker.feed(text)
    checker.close()
    if checker.problem is None and checker.stack:
        checker.problem = f'Can\'t find end tag corresponding to start tag "{checker.stack[-1]}"'
    return f"can't parse entities: {checker.problem}" if checker.problem else None


def handler_for(fake: FakeTelegram) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length)
            if fake.delay_s:
                time.sleep(fake.delay_s)
            if not self.headers.get("Content-Type", "").startswith("application/json"):
                status, body = error(400, "Bad Request: expected a JSON body")
            else:
                try:
                    status, body = fake.answer(self.path, json.loads(raw or b"{}"))
                except ValueError:
                    status, body = error(400, "Bad Request: can't parse JSON")
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args) -> None:
            pass

    return Handler


@contextmanager
def running() -> Iterator[FakeTelegram]:
    """A fake Bot API on a free local port, for as long as the block runs."""
    fake = FakeTelegram()
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler_for(fake))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    fake.url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield fake
    finally:
        server.shutdown()
        server.server_close()
