"""Open an HTML file in headless Chromium (Debian's) and collect console errors and elements."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from loadscale import deadline

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]


def require_browser() -> None:
    """Skip where no browser is installed, except in CI, where .ci/run installs one."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        if os.environ.get("CI"):
            raise
        pytest.skip("playwright is not installed (make test installs it)")
    if not Path(CHROMIUM).exists():
        if os.environ.get("CI"):
            raise AssertionError(f"{CHROMIUM} missing: .ci/run must install Debian's chromium")
        pytest.skip("Debian's chromium is not installed (apt-get install chromium)")


def inspect(path: Path, script: str) -> tuple[list[str], Any]:
    """Load ``path``; return (console errors and page errors, result of ``script``)."""
    from playwright.sync_api import sync_playwright

    errors: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
        try:
            page = browser.new_page()
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(path.resolve().as_uri())
            page.wait_for_selector("body[data-ready='1']",
                                   timeout=deadline(15) * 1000)  # ms, stretched by load
            result = page.evaluate(script)
        finally:
            browser.close()
    return errors, result
