"""The sandbox marketplace as a real subprocess, for tests that talk to it over HTTP.

``sandbox`` starts one (``--fast --relaxed-rate-limits``, a temporary state directory, a
free port) and stops it after the test; ``sandbox_factory`` starts any number with other
flags. Stopping sends SIGTERM (the sandbox kills its instances' process groups itself) and
then kills any process still carrying this sandbox's URL in its environment, so no onstart
script outlives its test. Waiting is always polling with a deadline.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.processes import wait_until

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_KEY = "sandbox-key"
FAST_FLAGS = ("--fast", "--relaxed-rate-limits")
MARKET = ROOT / "sandbox" / "market" / "offers.json"


class Sandbox:
    """One sandbox process: start, stop, restart, and small helpers to drive it."""

    def __init__(
        self,
        state_dir: Path,
        flags: tuple[str, ...],
        api_keys: tuple[str, ...],
        python: str = sys.executable,
    ) -> None:
        self.state_dir, self.flags, self.api_keys = state_dir, flags, api_keys
        self.python = python  # the interpreter the sandbox runs in (its "image")
        self.port = 0
        self.url = ""
        self.proc: subprocess.Popen | None = None
        self.clients: dict[str | None, httpx.Client] = {}
        self.log_path = state_dir.parent / f"{state_dir.name}.log"

    # ---- process ---------------------------------------------------------------------------

    def start(self, timeout: float = 20.0) -> Sandbox:
        server_file = self.state_dir / "server.json"
        server_file.unlink(missing_ok=True)
        keys = [arg for key in self.api_keys for arg in ("--api-key", key)]
        args = [self.python, "-m", "sandbox", "serve", "--port", str(self.port)]
        args += ["--state-dir", str(self.state_dir), *keys, *self.flags]
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(args, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        info = wait_until(
            lambda: self._server_info(server_file), timeout=timeout, what="the sandbox to bind"
        )
        self.url = info["url"]
        self.port = int(self.url.rsplit(":", 1)[1])
        wait_until(self._healthy, timeout=timeout, what="the sandbox to answer /sandbox/health")
        return self

    def _server_info(self, server_file: Path) -> dict | None:
        if self.proc is not None and self.proc.poll() is not None:
            pytest.fail(f"the sandbox exited with {self.proc.returncode}:\n{self.log()}")
        try:
            info = json.loads(server_file.read_text())
        except (OSError, ValueError):
            return None
        return info if info.get("pid") == self.proc.pid else None

    def _healthy(self) -> bool:
        try:
            return self.anon().get("/sandbox/health").status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """Stop the server; with SIGKILL its instances survive (a crash), else they die too."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def restart(self, *, crash: bool = False) -> Sandbox:
        """Stop and start again on the same port and state directory."""
        self.stop(signal.SIGKILL if crash else signal.SIGTERM)
        return self.start()

    def close(self) -> None:
        self.stop()
        kill_instance_processes(self.url)
        for client in self.clients.values():
            client.close()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    # ---- HTTP helpers ------------------------------------------------------------------------

    def client(self, key: str | None = DEFAULT_KEY) -> httpx.Client:
        """A client sending ``Authorization: Bearer KEY`` (none for None); never via a proxy.
        Clients are kept per key: building one costs more than a request."""
        if key not in self.clients:
            headers = {"Authorization": f"Bearer {key}"} if key is not None else {}
            self.clients[key] = httpx.Client(
                base_url=self.url, headers=headers, timeout=15, trust_env=False
            )
        return self.clients[key]

    def anon(self) -> httpx.Client:
        return self.client(None)

    def debug(self, instance_id: int) -> dict:
        return self.anon().get(f"/sandbox/instances/{instance_id}").raise_for_status().json()

    def inject(self, instance_id: int, action: str, arg: Any = None) -> dict:
        reply = self.anon().post(
            f"/sandbox/inject/{instance_id}", json={"action": action, "arg": arg}
        )
        assert reply.status_code == 200, reply.text
        return reply.json()

    def refuse_ask(self, ask_id: int) -> None:
        """Every create of ASK_ID is refused from now on (Vast's 403 about one offer)."""
        reply = self.anon().post("/sandbox/inject", json={"action": "refuse-ask", "arg": ask_id})
        assert reply.status_code == 200, reply.text

    def arm(self, hazard: str, ask_id: int) -> None:
        """The next create of ASK_ID meets HAZARD: ``double-sell`` (accepted though the ask is
        taken) or ``create-timeout`` (made, then answered 504): ``engine/buyer_hazards.py``."""
        reply = self.anon().post("/sandbox/inject", json={"action": hazard, "arg": ask_id})
        assert reply.status_code == 200, reply.text

    def create(self, ask_id: int, key: str = DEFAULT_KEY, **body: Any) -> int:
        body.setdefault("image", "ubuntu:22.04")
        reply = self.client(key).put(f"/api/v0/asks/{ask_id}/", json=body)
        assert reply.status_code == 200, reply.text
        return reply.json()["new_contract"]

    def status(self, instance_id: int, key: str = DEFAULT_KEY) -> str | None:
        found = self.client(key).get(f"/api/v0/instances/{instance_id}/").json()["instances"]
        return found["actual_status"] if found else None

    def wait_status(self, instance_id: int, status: str, timeout: float = 10.0) -> None:
        wait_until(
            lambda: self.status(instance_id) == status,
            timeout=timeout,
            what=f"instance {instance_id} to be {status}",
            every=0.02,
        )

    def search(self, query: dict) -> list[dict]:
        return self.anon().post("/api/v0/bundles/", json=query).raise_for_status().json()["offers"]


def kill_instance_processes(url: str) -> None:
    """SIGKILL every process whose environment names this sandbox (its instances)."""
    if not url or not os.path.isdir("/proc"):
        return
    marker = f"SANDBOX_URL={url}\0".encode()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if marker in Path(f"/proc/{name}/environ").read_bytes():
                os.kill(int(name), signal.SIGKILL)


def market_offers() -> dict[int, dict]:
    """The bundled market file, keyed by ask id (to check search results against)."""
    return {o["id"]: o for o in json.loads(MARKET.read_text())}


@pytest.fixture
def sandbox_factory(tmp_path: Path) -> Iterator[Callable[..., Sandbox]]:
    """Start sandboxes with any flags: ``sandbox_factory("--seed", "3", fast=True, keys=(...))``,
    and ``python=`` another interpreter to run in."""
    started: list[Sandbox] = []

    def start(
        *flags: str,
        fast: bool = True,
        relaxed: bool = True,
        keys: tuple[str, ...] = (DEFAULT_KEY,),
        python: str = sys.executable,
    ) -> Sandbox:
        extra = (("--fast",) if fast else ()) + (("--relaxed-rate-limits",) if relaxed else ())
        box = Sandbox(tmp_path / f"sandbox{len(started)}", (*extra, *flags), keys, python)
        started.append(box)
        return box.start()

    yield start
    for box in started:
        box.close()


@pytest.fixture
def sandbox(sandbox_factory: Callable[..., Sandbox]) -> Sandbox:
    """A fast sandbox with relaxed rate limits and one account, ``sandbox-key``."""
    return sandbox_factory()
