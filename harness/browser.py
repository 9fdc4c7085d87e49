"""A real browser on the Airflow UI: Debian's ``chromium`` driven by Playwright for Python.

Used by the browser tests (and by hand): log in through the simple auth manager's form, open pages,
wait for what a person would wait for, keep screenshots under ``.state/screens`` to look at.
"""

from __future__ import annotations

import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

ROOT = Path(__file__).resolve().parents[1]
SCREENS = ROOT / ".state" / "screens"


def chromium_path() -> str:
    """The system Chromium (Debian's ``chromium``); RuntimeError naming the fix when absent."""
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    raise RuntimeError("no chromium on PATH: install Debian's `chromium` package (make test does: "
                       "scripts/ensure_chromium.sh)")


@contextmanager
def browser() -> Iterator[object]:
    """A headless Chromium (Playwright ``Browser``), closed at the end."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium_path(), args=["--no-sandbox", "--disable-gpu"])
        try:
            yield b
        finally:
            b.close()


def login(browser_: object, base_url: str, username: str, password: str, timeout_ms: float = 60_000):
    """A new page logged in through the UI's login form; returns the page (on the UI's home)."""
    page = browser_.new_page(viewport={"width": 1440, "height": 900})
    page.set_default_timeout(timeout_ms)
    page.goto(base_url.rstrip("/") + "/")
    page.wait_for_url("**/auth/login**")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(password)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(lambda url: "/auth/login" not in url)
    return page


def shot(page: object, name: str) -> Path:
    """Full-page screenshot ``.state/screens/<name>.png`` (kept for a person to look at)."""
    SCREENS.mkdir(parents=True, exist_ok=True)
    path = SCREENS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path
