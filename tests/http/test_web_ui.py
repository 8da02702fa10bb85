"""The daemon's web pages in a real browser: headless Chromium from the system's packages, driven
by selenium through the system's chromedriver (``SE_OFFLINE``: selenium-manager never downloads),
against a real daemon on the real Gemma model (tests/support/browser.py: skipped without them,
except under CI). Every test saves a screenshot of the page it ends on, and checks that the
browser logged no console error and that no request left the daemon's origin. (The README's
pictures come from ``examples/web_screenshots.py``, on the instruct model.)
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.browser import WAIT_S, assert_clean, chromium, require_browser, shoot, wait
from tests.support.daemon import API_KEY, Daemon, start_daemon
from tests.support import TEMPLATES


@pytest.fixture(scope="module")
def browser_available() -> None:
    require_browser()


@pytest.fixture(scope="module")
def daemon(browser_available: None) -> Iterator[Daemon]:
    # --ignore-eos and a template without turn markers to stop on: every answer runs to its
    # max_tokens, so a test knows how long a stream lasts
    d = start_daemon("--ignore-eos", "--chat-template", str(TEMPLATES / "plain.jinja"))
    yield d
    d.stop()


@pytest.fixture
def driver(browser_available: None, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    with chromium(request.node.name, monkeypatch) as browser:
        yield browser


def open_chat(driver: Any, daemon: Daemon, max_tokens: int) -> None:
    from selenium.webdriver.common.by import By

    driver.get(daemon.url + "/")  # a browser at / lands on the chat page
    wait(driver, lambda d: d.current_url == daemon.url + "/ui/")
    wait(driver, lambda d: d.find_elements(By.CSS_SELECTOR, "#model option"))
    for name, value in (("max-tokens", max_tokens), ("temperature", 0)):  # greedy: the same answer every run
        field = driver.find_element(By.ID, name)
        field.clear()
        field.send_keys(str(value))
    # Records every distinct length the answer's text had while it grew: a streamed answer has several.
    driver.execute_script("""
        window.seenLengths = new Set();
        new MutationObserver(() => {
          const answer = document.querySelector('.message.assistant:last-child .content');
          if (answer && answer.textContent) window.seenLengths.add(answer.textContent.length);
        }).observe(document.getElementById('messages'), {subtree: true, childList: true, characterData: true});""")


def ask(driver: Any, question: str) -> None:
    from selenium.webdriver.common.by import By

    driver.find_element(By.ID, "prompt").send_keys(question)
    driver.find_element(By.ID, "send").click()


def figure(driver: Any, name: str) -> float:
    """The number the engine view shows as ``name`` (-1 before the first update)."""
    from selenium.webdriver.common.by import By

    text = driver.find_element(By.CSS_SELECTOR, f"[data-metric={name}]").text
    try:
        return float(text)
    except ValueError:
        return -1


def answer_text(driver: Any) -> str:
    return str(driver.execute_script(
        "const a = document.querySelector('.message.assistant:last-child .content'); return a ? a.textContent : ''"))


def test_a_question_typed_into_the_chat_page_streams_its_answer_into_the_page(driver: Any, daemon: Daemon) -> None:
    from selenium.webdriver.common.by import By

    open_chat(driver, daemon, max_tokens=40)
    ask(driver, "Which city is the capital of France?")
    wait(driver, lambda d: d.find_elements(By.CSS_SELECTOR, ".message.assistant[data-done]"))
    assert answer_text(driver).strip(), "the answer is empty"
    assert driver.execute_script("return window.seenLengths.size") > 1, "the answer arrived in one piece"
    assert not driver.find_elements(By.CSS_SELECTOR, ".message .error"), answer_text(driver)
    stored = driver.execute_script("return JSON.parse(localStorage.getItem('llamactor.conversations'))")
    assert [m["role"] for m in stored[0]["messages"]] == ["user", "assistant"], "the conversation was not kept"
    shoot(driver, "web-chat")
    assert_clean(driver, daemon.url)


def test_the_stop_button_ends_the_answer_and_the_daemon_cancels_the_request(driver: Any, daemon: Daemon) -> None:
    from selenium.webdriver.common.by import By

    seen = len(daemon.events("request_finished"))
    open_chat(driver, daemon, max_tokens=3000)
    ask(driver, "Count from one to a thousand.")
    wait(driver, lambda d: answer_text(d).strip())  # streaming has begun
    driver.find_element(By.ID, "stop").click()
    wait(driver, lambda d: d.find_elements(By.CSS_SELECTOR, ".message.assistant[data-done]"))
    assert driver.find_elements(By.CSS_SELECTOR, ".message.assistant:last-child .stopped"), "not marked stopped"
    assert daemon.wait_for_log(lambda line: line.get("event") == "request_finished"
                               and line.get("finish_reason") == "cancelled", timeout=WAIT_S), \
        "the daemon did not cancel the request"
    finished = [e for e in daemon.events("request_finished")[seen:] if e.get("finish_reason") == "cancelled"]
    assert finished[0]["n_gen"] < 3000, "the request ran to its max_tokens"
    assert_clean(driver, daemon.url)


def test_the_engine_view_shows_the_sequences_of_six_streaming_requests_running(driver: Any, daemon: Daemon) -> None:
    from selenium.webdriver.common.by import By

    client = daemon.client(timeout=120)
    streams = [client.chat.completions.create(model="m", messages=[{"role": "user", "content": f"Story {i}"}],
                                              max_tokens=2000, stream=True) for i in range(6)]
    first_chunks = threading.Barrier(7)

    def read(stream: Any) -> None:  # each stream is read until the test closes it
        try:
            first_chunks.wait(WAIT_S)
            for _ in stream:
                pass
        except Exception:  # closed by the test: the connection goes
            pass

    readers = [threading.Thread(target=read, args=(s,), daemon=True) for s in streams]
    for t in readers:
        t.start()
    try:
        first_chunks.wait(WAIT_S)
        driver.get(daemon.url + "/ui/engine")
        wait(driver, lambda d: figure(d, "running") >= 1)
        wait(driver, lambda d: figure(d, "tokens_per_s") > 0)
        for name in ("waiting", "kv_used", "kv_cached", "steps"):
            assert figure(driver, name) >= 0, name
        assert driver.find_elements(By.CSS_SELECTOR, "#models tr[data-model]"), "no model row"
        shoot(driver, "web-engine")
        assert_clean(driver, daemon.url)
    finally:
        for s in streams:
            s.close()
        for t in readers:
            t.join(WAIT_S)


def test_a_refused_request_shows_the_servers_own_words_in_the_page(driver: Any, daemon: Daemon) -> None:
    from selenium.webdriver.common.by import By

    open_chat(driver, daemon, max_tokens=8)
    field = driver.find_element(By.ID, "temperature")
    field.clear()
    field.send_keys("5")
    ask(driver, "Hello?")
    error = wait(driver, lambda d: d.find_elements(By.CSS_SELECTOR, ".message.assistant .error"))[0]
    assert error.text == "temperature: Input should be less than or equal to 2"
    # the console shows the 400 itself (Chromium logs every failed load), and nothing else
    errors = [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    assert all("status of 400" in m for m in errors), errors


def test_the_markdown_renderer_makes_markup_of_markdown_and_text_of_html(driver: Any, daemon: Daemon) -> None:
    driver.get(daemon.url + "/ui/")
    html = driver.execute_async_script("""
        const done = arguments[arguments.length - 1];
        import('/ui/markdown.js').then(({ renderMarkdown }) => {
          const box = document.createElement('div');
          box.append(renderMarkdown(
            '# Title\\n**bold** and *it* and `x<y`\\n\\n- one\\n- two\\n\\n```py\\nprint("<b>")\\n```\\n' +
            '<img src=x onerror="window.pwned=1"> [link](https://example.com) [bad](javascript:alert(1))'));
          done(box.innerHTML);
        });""")
    assert "<h3>Title</h3>" in html and "<strong>bold</strong>" in html and "<em>it</em>" in html
    assert "<code>x&lt;y</code>" in html and "<ul><li>one</li><li>two</li></ul>" in html
    assert '<pre><code data-lang="py">print("&lt;b&gt;")</code></pre>' in html
    assert "&lt;img src=x" in html and "<img" not in html, "HTML from the text became markup"
    assert 'href="https://example.com"' in html and 'href="javascript' not in html
    assert driver.execute_script("return window.pwned") is None
    assert_clean(driver, daemon.url)


def test_the_api_key_is_entered_once_kept_in_the_browser_and_opens_the_engine_view(driver: Any) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    keyed = start_daemon("--api-key", API_KEY)
    try:
        driver.get(keyed.url + "/ui/")
        refusal = wait(driver, lambda d: d.find_element(By.ID, "settings-error").text)
        assert refusal.startswith("missing or wrong API key")
        driver.find_element(By.ID, "api-key").send_keys(API_KEY, Keys.TAB)  # change: kept, models asked again
        wait(driver, lambda d: d.find_elements(By.CSS_SELECTOR, "#model option"))
        assert driver.execute_script("return localStorage.getItem('llamactor.apiKey')") == API_KEY
        driver.get(keyed.url + "/ui/engine")  # the key is sent without being entered again
        wait(driver, lambda d: figure(d, "kv_size") > 0)
        driver.refresh()
        wait(driver, lambda d: figure(d, "kv_size") > 0)
        errors = [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]
        assert all("status of 401" in m for m in errors), errors  # the first /v1/models, before the key
    finally:
        keyed.stop()


def test_a_streamed_answer_shows_its_reasoning_folded_and_its_tool_calls(driver: Any, daemon: Daemon) -> None:
    """The chunks a reasoning model with tools streams (the daemon's own shapes: ``reasoning_content``,
    tool calls in pieces), folded and shown as the chat page does."""
    driver.get(daemon.url + "/ui/")
    shown = driver.execute_async_script("""
        const done = arguments[arguments.length - 1];
        import('/ui/messages.js').then(({ absorb, messageNode }) => {
          const answer = { role: 'assistant', content: '', reasoning: '', tool_calls: [] };
          for (const delta of [{ reasoning_content: 'The user wants ' }, { reasoning_content: 'the weather.' },
                               { content: 'Let me **check**.' },
                               { tool_calls: [{ index: 0, function: { name: 'get_weather', arguments: '{"city":' } }] },
                               { tool_calls: [{ index: 0, function: { arguments: ' "Paris"}' } }] }]) {
            absorb(answer, { choices: [{ index: 0, delta }] });
          }
          const node = messageNode(answer);
          const details = node.querySelector('details.reasoning');
          done({ open: details.open, reasoning: details.textContent, calls: [...node.querySelectorAll('.tool-call')]
                   .map(c => c.textContent), strong: node.querySelector('.content strong').textContent });
        });""")
    assert shown == {"open": False, "reasoning": "ReasoningThe user wants the weather.",
                     "calls": ['get_weather({"city": "Paris"})'], "strong": "check"}
    assert_clean(driver, daemon.url)
