"""Headless Chromium for the web page tests: the system's chromium driven by selenium through the
system's chromedriver (``SE_OFFLINE``: selenium-manager never downloads). Where either is missing
the tests skip, saying so -- except under CI (``CI=true``), where that is a failure: `make test`
installs them. Each browser saves a screenshot of the page it ends on under
``build/test-artifacts/web_ui/`` (in the repository)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
ARTIFACTS = Path(__file__).resolve().parents[2] / "build" / "test-artifacts" / "web_ui"
WAIT_S = 60
ARGUMENTS = ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,860", "--disable-gpu",
             "--no-first-run", "--disable-extensions", "--disable-background-networking", "--disable-component-update",
             "--disable-sync", "--disable-default-apps")


def _missing() -> str | None:
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (the test extra)"
    for path in (CHROMIUM, CHROMEDRIVER):
        if not os.access(path, os.X_OK):
            return f"{path} is missing: install the system's chromium and chromium-driver (make test does, as root)"
    return None


def require_browser() -> None:
    """Skip the test (fail it under CI) when Chromium, its driver or selenium is missing."""
    missing = _missing()
    if missing is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"the browser tests cannot run under CI: {missing}")
        pytest.skip(f"browser tests skipped: {missing}")


@contextlib.contextmanager
def chromium(screenshot: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """A headless Chromium whose console and network logs are kept; its last page is saved as
    ``screenshot``.png among the artifacts."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    monkeypatch.setenv("SE_OFFLINE", "true")  # selenium-manager must not look for a driver online
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in ARGUMENTS:
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    browser = webdriver.Chrome(options=options, service=Service(executable_path=CHROMEDRIVER))
    try:
        yield browser
        shoot(browser, screenshot)
    finally:
        browser.quit()


def shoot(driver: Any, name: str) -> None:
    """A screenshot of the page as it is now, among the artifacts."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    driver.save_screenshot(str(ARTIFACTS / f"{name}.png"))


def wait(driver: Any, condition: Any, timeout: float = WAIT_S) -> Any:
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout, poll_frequency=0.05).until(condition)


def assert_clean(driver: Any, origin: str) -> None:
    """No console error, and every request the page made went to ``origin``: the resource timing
    entries and Chromium's own network log (CDP events) agree."""
    errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    assert not errors, f"console errors: {errors}"
    entries = driver.execute_script(
        "return performance.getEntries().filter(e => e.name.includes('://')).map(e => e.name)")
    network = [json.loads(e["message"])["message"] for e in driver.get_log("performance")]
    sent = [m["params"]["request"]["url"] for m in network if m["method"] == "Network.requestWillBeSent"]
    assert sent, "the network log recorded no request"
    outside = [u for u in entries + sent if not u.startswith(origin + "/") and not u.startswith("data:")]
    assert not outside, f"requests that left {origin}: {outside}"
