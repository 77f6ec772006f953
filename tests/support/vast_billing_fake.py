"""A local HTTP server speaking Vast's billing endpoints (``docs/vast-api.md`` §6) from a
fixed ledger, for tests that need volume (hundreds of charges) or a failure halfway.

``GET /api/v0/charges/`` answers as Vast does (``sandbox/README.md``, "Charges"): the
ledger holds one row per contract and day, keyed at 00:00 UTC; a query selects the rows whose
key lies in the ``select_filters.day`` window (both ends inclusive) and answers one result per
contract summing them (amounts only: a summed item keeps its first day's text), ``limit`` per
page with an opaque ``after_token``. ``GET /api/v1/invoices/`` answers the payments in the
``when`` window. ``fail_days`` makes the charges call for those days answer 400 (not retried
by the client), the way a broken upstream would stop an import.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from datetime import UTC, date, datetime, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

import pytest


def epoch(day: date, hour: int = 0, minute: int = 0) -> int:
    return int(datetime.combine(day, time(hour, minute), tzinfo=UTC).timestamp())


def charge(
    instance_id: int,
    day: date,
    *,
    gpu_h: float,
    rate: float = 0.4,
    down_gb: float = 0.0,
    down_rate: float = 0.0,
) -> dict:
    """One contract's day row in Vast's shape (start and end at that day's midnight), items with
    the sandbox's wording."""
    key = epoch(day)
    items = [
        {
            "start": key,
            "end": key,
            "type": "gpu",
            "source": None,
            "description": f"{gpu_h:.3f} hours at ${rate:.3f}/hour",
            "amount": round(gpu_h * rate, 3),
            "metadata": {},
            "items": [],
        }
    ]
    if down_gb:
        items.append(
            {
                "start": key,
                "end": key,
                "type": "bwd",
                "source": None,
                "description": f"{down_gb:.3f} GB downloaded at ${down_rate:.6f}/GB",
                "amount": round(down_gb * down_rate, 3),
                "metadata": {},
                "items": [],
            }
        )
    return {
        "start": key,
        "end": key,
        "type": "instance",
        "source": f"instance-{instance_id}",
        "description": f"Instance {instance_id} Charges - 1 day",
        "amount": round(sum(i["amount"] for i in items), 3),
        "metadata": {"label": f"ngpu:test:{instance_id}"},
        "items": items,
    }


def summed_per_contract(rows: list[dict]) -> list[dict]:
    """Day rows of one contract folded into one result, as Vast answers a range of days."""
    merged: dict[str, dict] = {}
    for row in rows:
        into = merged.get(row["source"])
        if into is None:
            merged[row["source"]] = json.loads(json.dumps(row))
            continue
        into["start"], into["end"] = min(into["start"], row["start"]), max(into["end"], row["end"])
        into["amount"] = round(into["amount"] + row["amount"], 3)
        by_type = {i["type"]: i for i in into["items"]}
        for item in row["items"]:
            if item["type"] in by_type:
                by_type[item["type"]]["amount"] = round(
                    by_type[item["type"]]["amount"] + item["amount"], 3
                )
            else:
                into["items"].append(dict(item))
        days = (into["end"] - into["start"]) // 86_400 + 1
        into["description"] = f"{row['source'].title()} Charges - {days} days"
    return list(merged.values())


class FakeVastBilling:
    def __init__(self) -> None:
        self.charges: list[dict] = []
        self.payments: list[dict] = []
        self.fail_days: set[date] = set()
        self.calls: list[dict] = []
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def _handler(self):
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:
                url = urlparse(self.path)
                params = {k: v[0] for k, v in parse_qs(url.query).items()}
                fake.calls.append({"path": url.path, **params})
                if url.path.rstrip("/") == "/api/v0/charges":
                    status, body = fake.answer_charges(params)
                elif url.path.rstrip("/") == "/api/v1/invoices":
                    status, body = fake.answer_invoices(params)
                else:
                    status, body = 404, {"success": False, "error": "not_found", "msg": "no"}
                raw = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

        return Handler

    def answer_charges(self, params: dict) -> tuple[int, dict]:
        day = json.loads(params["select_filters"])["day"]
        lo, hi = int(day["gte"]), int(day["lte"])
        for failing in self.fail_days:
            if lo <= epoch(failing, 12) <= hi:
                return 400, {"success": False, "error": "invalid_args", "msg": "upstream broke"}
        rows = summed_per_contract([c for c in self.charges if lo <= c["start"] <= hi])
        limit = int(params.get("limit", 100))
        offset = int(params.get("after_token") or 0)
        page = rows[offset : offset + limit]
        more = offset + limit < len(rows)
        return 200, {
            "success": True,
            "count": len(page),
            "total": len(rows),
            "next_token": str(offset + limit) if more else None,
            "results": page,
        }

    def answer_invoices(self, params: dict) -> tuple[int, dict]:
        when = json.loads(params["select_filters"])["when"]
        rows = [p for p in self.payments if when["gte"] <= p["start"] <= when["lte"]]
        return 200, {
            "success": True,
            "count": len(rows),
            "total": len(rows),
            "next_token": None,
            "results": rows,
        }

    def charge_calls(self) -> list[dict]:
        return [c for c in self.calls if c["path"].rstrip("/") == "/api/v0/charges"]


@pytest.fixture
def vast_billing() -> Iterator[FakeVastBilling]:
    fake = FakeVastBilling()
    fake.thread.start()
    yield fake
    fake.server.shutdown()
    fake.server.server_close()
