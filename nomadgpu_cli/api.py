"""Talking to the server: the member API with the personal token, its refusals as
``CliError`` with the exit code they mean, and the token kept to the portal's own origin."""

from __future__ import annotations

import urllib.parse
from typing import Any

import httpx

from nomadgpu_cli.errors import EXIT_AUTH, EXIT_REFUSED, EXIT_UNREACHABLE, CliError


class Api:
    def __init__(self, url: str, token: str, timeout: float = 30.0) -> None:
        self.url = url.rstrip("/")
        self.http = httpx.Client(
            base_url=self.url + "/api",
            headers={"Authorization": f"Bearer {token}", "User-Agent": "nomadgpu-cli"},
            timeout=timeout,
        )

    def call(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            response = self.http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise CliError(f"cannot reach {self.url}: {exc}", EXIT_UNREACHABLE) from exc
        if response.is_success:
            return response.json() if response.content else None
        status = response.status_code
        raise CliError(describe_error(response), exit_code_for(status), status)

    def get(self, path: str, **params: Any) -> Any:
        return self.call("GET", path, params={k: v for k, v in params.items() if v is not None})

    def post(self, path: str, body: dict | None = None) -> Any:
        return self.call("POST", path, json=body or {})

    def put(self, path: str, body: dict) -> Any:
        return self.call("PUT", path, json=body)

    def delete(self, path: str) -> Any:
        return self.call("DELETE", path)

    def own_url(self, url: str) -> str:
        """URL (absolute, or a path on the portal) if it is on the portal itself: only there may
        the token go."""
        full = urllib.parse.urljoin(self.url + "/", url)
        if origin(full) != origin(self.url):
            raise CliError(
                f"the server asked for the token to be sent to {full}, not to itself: refused",
                EXIT_REFUSED,
            )
        return full


def origin(url: str) -> tuple[str, str]:
    """Scheme and host[:port] of URL: what must match for the token to be sent there."""
    parts = urllib.parse.urlsplit(url)
    return parts.scheme.lower(), parts.netloc.lower()


def exit_code_for(status: int) -> int:
    if status == 401:
        return EXIT_AUTH
    return EXIT_UNREACHABLE if status >= 500 else EXIT_REFUSED


def describe_error(response: httpx.Response) -> str:
    """The server's ``detail`` as text; validation errors one field per line."""
    try:
        detail = response.json().get("detail")
    except ValueError:
        detail = response.text[:500]
    if response.status_code == 401:
        return "the server did not accept the token (revoked? set NOMADGPU_TOKEN)"
    if isinstance(detail, list):
        lines = [f"  {field_name(e.get('loc', []))}: {e.get('msg', e)}" for e in detail]
        return "the server refused the request:\n" + "\n".join(lines)
    return f"{response.status_code}: {detail}"


def field_name(loc: list) -> str:
    """``["body", "payload", "requirements", "num_gpus"]`` → ``requirements.num_gpus``."""
    parts = [str(p) for p in loc]
    while parts and parts[0] in ("body", "payload", "query", "path"):
        parts.pop(0)
    return ".".join(parts) or "(request)"
