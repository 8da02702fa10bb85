"""The engine page's charts in a real browser (headless Chromium, tests/support/browser.py) on a
real daemon with tenants' keys: the test reads each chart's points (``window.llamactorCharts``)
while real requests run through the daemon, and sees them follow the traffic -- tokens per second,
running sequences, KV use, rows per step by kind, a prefix-cache hit, the tenants' shares -- and
fall back when it ends. A tenant's key gets no engine view, and so no tenants' shares."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.browser import WAIT_S, assert_clean, chromium, require_browser, shoot, wait
from tests.support.daemon import Daemon, start_daemon
from tests.support.keys import write_keys_file

ADMIN, TENANT = "sk-ops-admin-01", "sk-bob-plain-02"
KEY_TABLES = {ADMIN: {"tenant": "ops", "admin": True}, TENANT: {"tenant": "bob"}}
CHARTS = ("tokens", "sequences", "kv", "cache", "rows")
# long enough that the prefix cache keeps it: the same prompt a second time attaches it
PROMPT = "Here is a long shared context about the history of the printing press in Europe. " * 6


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    require_browser()
    keys = write_keys_file(tmp_path_factory.mktemp("keys"), KEY_TABLES)
    d = start_daemon("--keys", str(keys))
    yield d
    d.stop()


@pytest.fixture
def driver(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    with chromium(request.node.name, monkeypatch) as browser:
        yield browser


def open_engine_view(driver: Any, daemon: Daemon, key: str) -> None:
    """The engine page, its key already kept in the browser (put there before the page's scripts run)."""
    driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument",
                           {"source": f"localStorage.setItem('llamactor.apiKey', {key!r})"})
    driver.get(daemon.url + "/ui/engine")


def points(driver: Any, chart: str, test: str) -> int:
    """How many of ``chart``'s points pass ``test`` (a JavaScript expression of the point ``p``)."""
    return int(driver.execute_script(
        f"const c = (window.llamactorCharts || {{}})[arguments[0]]; return c ? c.data.filter(p => {test}).length : 0",
        chart))


def tenants(driver: Any) -> list[dict[str, Any]]:
    return list(driver.execute_script("return window.llamactorCharts.tenants.data"))


class Stream:
    """A streamed raw completion of a tenant's, read on a thread of its own until closed."""

    def __init__(self, daemon: Daemon, key: str) -> None:
        self.stream = daemon.client(key, timeout=120).completions.create(
            model="m", prompt="Once upon a time", max_tokens=2000, stream=True, extra_body={"ignore_eos": True})
        self.started = threading.Event()
        self.reader = threading.Thread(target=self.read, daemon=True)
        self.reader.start()

    def read(self) -> None:
        try:
            for _ in self.stream:
                self.started.set()
        except Exception:  # closed by the test: the connection goes
            pass

    def close(self) -> None:
        self.stream.close()
        self.reader.join(WAIT_S)


def test_the_charts_follow_a_tenants_requests_and_the_admin_sees_its_share(driver: Any, daemon: Daemon) -> None:
    from selenium.webdriver.common.by import By

    open_engine_view(driver, daemon, ADMIN)
    wait(driver, lambda d: all(points(d, name, "true") > 0 for name in CHARTS))
    assert driver.find_element(By.ID, "tenant-shares").is_displayed()
    assert tenants(driver) == []
    stream = Stream(daemon, TENANT)
    try:
        assert stream.started.wait(WAIT_S)
        wait(driver, lambda d: points(d, "tokens", "p.tokens_per_s > 0"))
        wait(driver, lambda d: points(d, "sequences", "p.running >= 1"))
        wait(driver, lambda d: points(d, "kv", "p.kv_use > 0 && p.kv_use <= 1 && p.kv_cached_use <= p.kv_use"))
        wait(driver, lambda d: points(d, "rows", "p.rows_decode > 0"))
        wait(driver, lambda d: points(d, "tokens", "p.prompt_tokens_per_s > 0"))
        bob = wait(driver, lambda d: [t for t in tenants(d) if t["name"] == "bob" and t["running"] >= 1])
        assert [t["name"] for t in tenants(driver)] == ["bob"]  # ops (the admin watching) runs nothing
        # Read in one script: each update replaces the bar's segments, so an element found in one
        # call can be gone (stale) by the next.
        segment = driver.execute_script("""const s = document.querySelector('#chart-tenants [data-tenant=bob]');
            return s && {width: s.getBoundingClientRect().width, title: s.title}""")
        assert segment and segment["width"] > 0 and "1 running" in segment["title"], (segment, bob)
        client = daemon.client(TENANT, timeout=120)
        for _ in range(2):  # the second attaches the first one's prompt from the prefix cache
            client.completions.create(model="m", prompt=PROMPT, max_tokens=1)
        wait(driver, lambda d: points(d, "cache", "p.prefix_hits_per_s > 0"))
        shoot(driver, "web-engine-charts")
    finally:
        stream.close()
    wait(driver, lambda d: driver.execute_script(  # the charts come back down when the traffic ends
        "const s = window.llamactorCharts.sequences.data; return s[s.length - 1].running === 0"))
    wait(driver, lambda d: tenants(d) == [])
    assert_the_newest_points_are_the_figures_shown(driver)
    assert_clean(driver, daemon.url)


def assert_the_newest_points_are_the_figures_shown(driver: Any) -> None:
    """Each chart's newest point holds the snapshot the cards show, and its SVG drew every point."""
    shown = driver.execute_script("""
        const figure = (name) => Number(document.querySelector(`.cards [data-metric=${name}]`).textContent);
        const last = (name) => { const d = window.llamactorCharts[name].data; return d[d.length - 1]; };
        const drawn = [...document.querySelectorAll('[data-chart] svg')].map(s => [
          s.parentNode.dataset.chart, Number(s.dataset.points), window.llamactorCharts[s.parentNode.dataset.chart].data.length,
          s.querySelector('polyline, polygon').getAttribute('points').trim().split(/\\s+/).length]);
        return { tokens: [last('tokens').tokens_per_s, figure('tokens_per_s')],
                 running: [last('sequences').running, figure('running')], drawn };""")
    assert shown["tokens"][0] == shown["tokens"][1] and shown["running"][0] == shown["running"][1], shown
    assert len(shown["drawn"]) == len(CHARTS), shown
    for name, drawn, held, vertices in shown["drawn"]:
        assert drawn == held and vertices in (held, 2 * held), (name, drawn, held, vertices)  # areas close below


def test_a_tenants_key_gets_no_engine_view_and_no_tenants_shares(driver: Any, daemon: Daemon) -> None:
    from selenium.webdriver.common.by import By

    stream = Stream(daemon, ADMIN)  # another caller's traffic the tenant must not see
    try:
        assert stream.started.wait(WAIT_S)
        open_engine_view(driver, daemon, TENANT)
        refusal = wait(driver, lambda d: d.find_element(By.ID, "engine-error").text)
        assert refusal == "the engine view is for admin keys"
        assert not driver.find_element(By.ID, "tenant-shares").is_displayed()
        assert driver.find_elements(By.CSS_SELECTOR, "[data-tenant]") == []
        assert tenants(driver) == [] and all(points(driver, name, "true") == 0 for name in CHARTS)
    finally:
        stream.close()
    errors = [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    assert errors and all("status of 403" in m for m in errors), errors
