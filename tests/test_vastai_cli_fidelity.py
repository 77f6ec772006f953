"""The official ``vastai`` CLI (PyPI vastai==1.9.1) works against the sandbox unchanged.

The CLI lives in its own virtualenv under ``var/vastai-venv`` (created on first run from the
package registry; if that fails the test fails — fidelity is not optional). It reads the
server from ``--url`` or the ``VAST_URL`` environment variable (``vastai/api/client.py``:
``server_url_default = os.getenv("VAST_URL") or "https://console.vast.ai"``); both are used.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.bids import bid_asks, rent_bid, shown
from tests.support.sandbox import (
    DEFAULT_KEY,
    ROOT,
    Sandbox,
)

VERSION = "1.9.1"
VENV = ROOT / "var" / "vastai-venv"


def installed_version(venv: Path) -> str | None:
    python = venv / "bin" / "python"
    if not python.exists():
        return None
    probe = [str(python), "-c", "import importlib.metadata as m; print(m.version('vastai'))"]
    found = subprocess.run(probe, capture_output=True, text=True)
    return found.stdout.strip() if found.returncode == 0 else None


@pytest.fixture(scope="module")
def vastai() -> Path:
    """The ``vastai`` executable, installed once into ``var/vastai-venv``."""
    if installed_version(VENV) != VERSION:
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(VENV)], check=True)
        pip = [
            str(VENV / "bin" / "python"),
            "-m",
            "pip",
            "install",
            "--quiet",
            f"vastai=={VERSION}",
        ]
        result = subprocess.run(pip, capture_output=True, text=True, timeout=900)
        if result.returncode != 0 or installed_version(VENV) != VERSION:
            pytest.fail(
                f"could not install vastai=={VERSION}:\n"
                f"{result.stdout[-2000:]}\n{result.stderr[-3000:]}"
            )
    return VENV / "bin" / "vastai"


def run_cli(
    vastai: Path, box: Sandbox, home: Path, *args: str, via_env: bool = False
) -> subprocess.CompletedProcess:
    """One CLI command against the sandbox, with a private HOME and no update check."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "LANG": "C.UTF-8",
        "VASTAI_NO_UPDATE_CHECK": "1",
        "NO_COLOR": "1",
        "VAST_API_KEY": DEFAULT_KEY,
    }
    url = []
    if via_env:
        env["VAST_URL"] = box.url
    else:
        url = ["--url", box.url]
    result = subprocess.run(
        [str(vastai), *url, *args], env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, (
        f"vastai {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}"
    )
    return result


def test_official_cli_searches_creates_shows_and_destroys(
    vastai: Path, sandbox: Sandbox, tmp_path: Path
):
    def cli(*args: str, via_env: bool = False) -> subprocess.CompletedProcess:
        return run_cli(vastai, sandbox, tmp_path, *args, via_env=via_env)

    query = "gpu_name=RTX_4090 num_gpus=1 reliability>0.98 inet_down>=500"
    offers = json.loads(
        cli("search", "offers", query, "-o", "dph+", "--limit", "5", "--raw", via_env=True).stdout
    )
    assert len(offers) == 5
    assert all(
        o["gpu_name"] == "RTX 4090" and o["reliability"] > 0.98 and o["inet_down"] >= 500
        for o in offers
    )
    assert [o["dph_total"] for o in offers] == sorted(o["dph_total"] for o in offers)
    newer = json.loads(
        cli("search", "offers", "--new", query, "-o", "dph+", "--limit", "5", "--raw").stdout
    )
    assert [o["id"] for o in newer] == [o["id"] for o in offers]
    table = cli("search", "offers", query, "--limit", "3")
    assert "invalid return Content-Type" not in table.stdout
    assert str(offers[0]["id"]) in table.stdout

    ask = offers[0]["id"]
    created = json.loads(
        cli(
            "create",
            "instance",
            str(ask),
            "--image",
            "ubuntu:22.04",
            "--disk",
            "20",
            "--label",
            "cli",
            "--env",
            "-e TZ=UTC -p 8000:8000",
            "--onstart-cmd",
            "echo hi > cli.txt; exec sleep 120",
            "--raw",
        ).stdout
    )
    iid = created["new_contract"]
    assert created["success"] is True
    assert created["instance_api_key"]
    sandbox.wait_status(iid, "running")

    shown = json.loads(cli("show", "instance", str(iid), "--raw").stdout)
    assert (shown["id"], shown["actual_status"], shown["label"]) == (iid, "running", "cli")
    assert shown["extra_env"] == {
        "TZ": "UTC",
        "-p 8000:8000": "1",
    }  # the SDK turned the pairs into a dict
    listed = json.loads(cli("show", "instances", "--raw").stdout)
    assert [i["id"] for i in listed] == [iid]
    user = json.loads(cli("show", "user", "--raw").stdout)
    assert user["credit"] < 100.0
    charges = json.loads(cli("show", "invoices-v1", "--charges", "--raw").stdout)
    assert [r["source"] for r in charges["results"]] == [f"instance-{iid}"]

    destroyed = cli("destroy", "instance", str(iid), "-y")
    assert f"destroying instance {iid}" in destroyed.stdout
    assert json.loads(cli("show", "instance", str(iid), "--raw").stdout) == {"instances": None}
    assert sandbox.status(iid) is None


def test_the_official_cli_changes_a_bid(vastai: Path, sandbox: Sandbox, tmp_path: Path):
    offer = bid_asks(sandbox, 1)[0]
    iid = rent_bid(sandbox, offer, offer["min_bid"])
    price = round(offer["min_bid"] + 0.03, 4)

    done = run_cli(vastai, sandbox, tmp_path, "change", "bid", str(iid), "--price", str(price))

    assert "Per gpu bid price changed" in done.stdout
    assert shown(sandbox, iid)["dph_base"] == price
