"""``browser_page``: a headless Chromium page (Debian's chromium) that leaves a screenshot under
``$NOMADGPU_VAR_DIR/screenshots`` when its test fails.

Request it after the fixtures that write test data: inside Playwright's sync context Django's
connections belong to another async context, and a connection opened there is never closed
(PostgreSQL then refuses to drop the test database)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from django.conf import settings

# Playwright's sync API runs an event loop in this thread; Django would refuse DB access.
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")


@pytest.fixture
def browser_page(request, live_server):
    # Depends on live_server so the browser (and its keep-alive connections, each holding a
    # server thread with a database connection) closes before the live server stops.
    from playwright.sync_api import sync_playwright

    failed_before = request.session.testsfailed
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path="/usr/bin/chromium",
            args=["--no-sandbox", "--disable-background-networking"],
        )
        page = browser.new_page()
        yield page
        if request.session.testsfailed > failed_before:  # the call phase has been reported
            shots = Path(settings.VAR_DIR) / "screenshots"
            shots.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(shots / f"{request.node.name}.png"), full_page=True)
        browser.close()
