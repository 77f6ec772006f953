"""The sandbox's durable state: one SQLite file in the state directory.

Everything that must survive a restart lives here: accounts and their top-ups, instances
with their configuration and injected faults, usage intervals (what billing integrates),
traffic counters, asks whose host vanished or that refuse renters, and an event log per
instance. One connection is shared by all request threads behind a re-entrant lock; the data
is small and every statement is short, so a lock is simpler than a pool and rules out write
races (two renters of one ask are decided inside one transaction).
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

# Instance ids start in the range of early-2025 Vast contract ids.
FIRST_INSTANCE_ID = 21_000_001
FIRST_ACCOUNT_ID = 310_001

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS accounts (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    api_key TEXT NOT NULL UNIQUE,
    email TEXT NOT NULL,
    created_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS payments (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    account_id INTEGER NOT NULL,
    created_at REAL NOT NULL,
    amount REAL NOT NULL,
    service TEXT NOT NULL,
    description TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS gone_asks (ask_id INTEGER PRIMARY KEY, at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS refused_asks (ask_id INTEGER PRIMARY KEY, at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS buyer_hazards (
    ask_id INTEGER NOT NULL,
    kind TEXT NOT NULL,
    armed INTEGER NOT NULL,
    PRIMARY KEY (ask_id, kind)
);
CREATE TABLE IF NOT EXISTS instances (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    account_id INTEGER NOT NULL,
    ask_id INTEGER NOT NULL,
    offer TEXT NOT NULL,
    config TEXT NOT NULL,
    api_key TEXT NOT NULL UNIQUE,
    label TEXT,
    created_at REAL NOT NULL,
    status TEXT NOT NULL,
    intended TEXT NOT NULL,
    deadline REAL,
    status_msg TEXT NOT NULL DEFAULT '',
    host_online INTEGER NOT NULL DEFAULT 1,
    frozen INTEGER NOT NULL DEFAULT 0,
    outbid INTEGER NOT NULL DEFAULT 0,
    gpu_fault TEXT NOT NULL DEFAULT '',
    slow REAL NOT NULL DEFAULT 1.0,
    overcharge REAL NOT NULL DEFAULT 0.0,
    is_bid INTEGER NOT NULL,
    gpu_rate REAL NOT NULL,
    disk_rate REAL NOT NULL,
    down_rate REAL NOT NULL,
    up_rate REAL NOT NULL,
    image_bytes INTEGER NOT NULL,
    image_cached INTEGER NOT NULL DEFAULT 0,
    pgid INTEGER,
    runs INTEGER NOT NULL DEFAULT 0,
    destroyed_at REAL,
    destroyed_by TEXT,
    outbid_resume INTEGER NOT NULL DEFAULT 0,
    rival_bid REAL,
    rival_until REAL,
    bid_clock REAL,
    bid_hazard REAL NOT NULL DEFAULT 0,
    bid_draws INTEGER NOT NULL DEFAULT 0,
    bid_run_h REAL NOT NULL DEFAULT 0,
    returns_at REAL,
    host_spells INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS instances_account ON instances (account_id, destroyed_at);
CREATE INDEX IF NOT EXISTS instances_ask ON instances (ask_id) WHERE destroyed_at IS NULL;
CREATE TABLE IF NOT EXISTS usage (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    instance_id INTEGER NOT NULL,
    kind TEXT NOT NULL,
    start REAL NOT NULL,
    stop REAL,
    rate REAL
);
CREATE INDEX IF NOT EXISTS usage_instance ON usage (instance_id, stop);
CREATE TABLE IF NOT EXISTS traffic (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    instance_id INTEGER NOT NULL,
    ts REAL NOT NULL,
    direction TEXT NOT NULL,
    bytes INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS traffic_instance ON traffic (instance_id, ts);
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    instance_id INTEGER NOT NULL,
    ts REAL NOT NULL,
    kind TEXT NOT NULL,
    detail TEXT NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS events_instance ON events (instance_id, id);
CREATE TABLE IF NOT EXISTS outbids (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    instance_id INTEGER NOT NULL,
    ts REAL NOT NULL,
    cause TEXT NOT NULL,
    price REAL NOT NULL,
    min_bid REAL NOT NULL,
    running_h REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS outbids_instance ON outbids (instance_id, id);
CREATE TABLE IF NOT EXISTS machine_images (
    machine_id INTEGER NOT NULL,
    image TEXT NOT NULL,
    pulled_at REAL NOT NULL,
    PRIMARY KEY (machine_id, image)
);
"""
# Columns added after state files were first written: ``Store`` adds them to an older file.
# (The interruptible market's, ``bids.py``: the rival's bid and until when it holds the machine,
# whether the instance restarts when its bid wins again, and the outbid process's hazard; a
# GPU interval's own $/h, since a changed bid prices the hours after it only.)
ADDED_COLUMNS = (
    ("instances", "outbid_resume", "INTEGER NOT NULL DEFAULT 0"),
    ("instances", "rival_bid", "REAL"),
    ("instances", "rival_until", "REAL"),
    ("instances", "bid_clock", "REAL"),
    ("instances", "bid_hazard", "REAL NOT NULL DEFAULT 0"),
    ("instances", "bid_draws", "INTEGER NOT NULL DEFAULT 0"),
    ("instances", "bid_run_h", "REAL NOT NULL DEFAULT 0"),
    ("usage", "rate", "REAL"),
    # Where the instance's image came from: '' (not loaded yet), 'pulled', 'machine' (the
    # machine held it from an earlier rental: ``image_cache``) or 'wiped' (it had, the host
    # wiped it, pulled again).
    ("instances", "image_source", "TEXT NOT NULL DEFAULT ''"),
    # A rebooted host's return (``reboot-host``): when, and how many times it went offline.
    ("instances", "returns_at", "REAL"),
    ("instances", "host_spells", "INTEGER NOT NULL DEFAULT 0"),
    # Market weather (``weather.py``, ``engine/weather_fates.py``): the rental's fate as JSON
    # ('' in weather `none`), the moment a drawn loss befalls it and which, and the real
    # seconds of pulling and downloading it has been through.
    ("instances", "fate", "TEXT NOT NULL DEFAULT ''"),
    ("instances", "fate_at", "REAL"),
    ("instances", "fate_what", "TEXT NOT NULL DEFAULT ''"),
    ("instances", "load_exposure_s", "REAL NOT NULL DEFAULT 0"),
    # The pull under way: when it started and when its last byte is in (the container start
    # follows), for the progress status_msg shows and the bytes a pull cut short bills.
    ("instances", "load_started", "REAL"),
    ("instances", "pull_until", "REAL"),
    # A lost host's offer is back on the market then (NULL: never, an injected `destroy`).
    ("gone_asks", "back_at", "REAL"),
)


class Store:
    """A locked SQLite connection with three verbs: rows, row and run."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.lock = threading.RLock()
        self._depth = 0  # transaction nesting, guarded by the lock
        self.conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self.conn.row_factory = sqlite3.Row
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute("PRAGMA synchronous=NORMAL")
        self.conn.executescript(SCHEMA)
        self._add_columns()
        self._seed_sequences()

    def _add_columns(self) -> None:
        for table, column, decl in ADDED_COLUMNS:
            have = {r["name"] for r in self.rows(f"PRAGMA table_info({table})")}
            if column not in have:
                # Names come from ADDED_COLUMNS above, never from a request.
                self.run(f"ALTER TABLE {table} ADD COLUMN {column} {decl}")

    def _seed_sequences(self) -> None:
        for table, first in (("instances", FIRST_INSTANCE_ID), ("accounts", FIRST_ACCOUNT_ID)):
            if not self.row("SELECT 1 AS x FROM sqlite_sequence WHERE name = ?", (table,)):
                self.run(
                    "INSERT INTO sqlite_sequence (name, seq) VALUES (?, ?)", (table, first - 1)
                )

    @contextmanager
    def tx(self) -> Iterator[Store]:
        """One transaction (nested calls join the outer one)."""
        with self.lock:
            self._depth += 1
            if self._depth == 1:
                self.conn.execute("BEGIN IMMEDIATE")
            try:
                yield self
            except BaseException:
                if self._depth == 1:
                    self.conn.execute("ROLLBACK")
                raise
            else:
                if self._depth == 1:
                    self.conn.execute("COMMIT")
            finally:
                self._depth -= 1

    def rows(self, sql: str, params: tuple | dict = ()) -> list[dict[str, Any]]:
        with self.lock:
            return [dict(r) for r in self.conn.execute(sql, params).fetchall()]

    def row(self, sql: str, params: tuple | dict = ()) -> dict[str, Any] | None:
        with self.lock:
            found = self.conn.execute(sql, params).fetchone()
            return dict(found) if found else None

    def run(self, sql: str, params: tuple | dict = ()) -> int:
        """Execute a write; returns lastrowid (inserts) — rowcount is rarely needed here."""
        with self.lock:
            return self.conn.execute(sql, params).lastrowid or 0

    def meta(self, key: str, default: str | None = None) -> str | None:
        found = self.row("SELECT value FROM meta WHERE key = ?", (key,))
        return found["value"] if found else default

    def set_meta(self, key: str, value: str) -> None:
        self.run("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, value))

    def close(self) -> None:
        with self.lock:
            self.conn.close()


def ensure_accounts(store: Store, api_keys: list[str], credit: float, now: float) -> None:
    """One account per API key, each opened with a top-up of ``credit`` dollars."""
    with store.tx():
        for key in api_keys:
            if store.row("SELECT id FROM accounts WHERE api_key = ?", (key,)):
                continue
            account_id = store.run(
                "INSERT INTO accounts (api_key, email, created_at) VALUES (?, '', ?)", (key, now)
            )
            store.run(
                "UPDATE accounts SET email = ? WHERE id = ?",
                (f"user{account_id}@sandbox.invalid", account_id),
            )
            if credit > 0:
                add_payment(store, account_id, credit, now)


def add_payment(store: Store, account_id: int, amount: float, now: float) -> None:
    """A card top-up, as the invoices endpoint lists it."""
    store.run(
        "INSERT INTO payments (account_id, created_at, amount, service, description)"
        " VALUES (?, ?, ?, 'stripe_payments', ?)",
        (account_id, now, amount, f"Stripe card payment: ${amount:.2f} credit added"),
    )


def log_event(store: Store, instance_id: int, now: float, kind: str, detail: str = "") -> None:
    store.run(
        "INSERT INTO events (instance_id, ts, kind, detail) VALUES (?, ?, ?, ?)",
        (instance_id, now, kind, detail),
    )
