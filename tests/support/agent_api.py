"""The agent API called as an agent calls it: a JSON POST with its bearer token."""

from __future__ import annotations

import json


def call(client, token: str, name: str, body: dict | None = None):
    return client.post(
        f"/api/agent/{name}",
        data=json.dumps(body or {}),
        content_type="application/json",
        headers={"Authorization": f"Bearer {token}"},
    )
