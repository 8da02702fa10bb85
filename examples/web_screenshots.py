"""Take the README's pictures of the web page: a daemon serving a folder of both installed models,
SmolLM2-135M-Instruct answering in the chat page, then the engine view (its charts) as six answers
start streaming.

    .venv/bin/python examples/web_screenshots.py [--out docs/images]

Needs the system's Chromium and chromedriver (``make test`` installs them as root) and selenium
(the test extra). The daemon runs on a free local port and is stopped at the end.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
from openai import OpenAI
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from llamactor.base.models import default_model_path, instruct_model_path

QUESTION = "What is the capital of France? Answer in one sentence, then name two sights there."


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_daemon(folder: Path, port: int) -> subprocess.Popen[bytes]:
    """``llamactor serve --models-dir`` on both models, ready once /health answers."""
    os.symlink(default_model_path(), folder / "gemma-3-270m.gguf")
    os.symlink(instruct_model_path(), folder / "smollm2-135m-instruct.gguf")
    proc = subprocess.Popen([sys.executable, "-m", "llamactor.cli", "serve", "--port", str(port),
                             "--models-dir", str(folder), "--n-ctx", "4096"])
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # a one-off script: polling the port is simplest here
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.terminate()
    raise SystemExit("the daemon did not come up")


def browser() -> webdriver.Chrome:
    os.environ["SE_OFFLINE"] = "true"  # selenium-manager must not look for a driver online
    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for arg in ("--headless=new", "--no-sandbox", "--window-size=1280,800"):
        options.add_argument(arg)
    return webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)


def chat_picture(driver: webdriver.Chrome, url: str, out: Path) -> None:
    driver.get(url + "/")
    wait = WebDriverWait(driver, 120)
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#model option[value='smollm2-135m-instruct']"))
    driver.find_element(By.CSS_SELECTOR, "#model option[value='smollm2-135m-instruct']").click()
    driver.find_element(By.ID, "system").send_keys("You are a concise travel guide.")
    for name, value in (("max-tokens", 120), ("temperature", 0)):  # greedy: the same picture every run
        field = driver.find_element(By.ID, name)
        field.clear()
        field.send_keys(str(value))
    driver.find_element(By.ID, "prompt").send_keys(QUESTION)
    driver.find_element(By.ID, "send").click()
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, ".message.assistant[data-done]"))
    driver.save_screenshot(str(out / "web-chat.png"))


def engine_picture(driver: webdriver.Chrome, url: str, out: Path) -> None:
    driver.get(url + "/ui/engine")  # open before the traffic: the charts show it rise
    WebDriverWait(driver, 120).until(lambda d: d.execute_script("return window.llamactorCharts.tokens.data.length"))
    client = OpenAI(base_url=url + "/v1", api_key="none")
    streams = [client.chat.completions.create(model="smollm2-135m-instruct", stream=True, max_tokens=2000,
                                              messages=[{"role": "user", "content": f"Tell story {i}."}])
               for i in range(6)]

    def read(stream: object) -> None:  # until the stream is closed below
        try:
            for _ in stream:  # type: ignore[attr-defined]
                pass
        except httpx.HTTPError:
            pass

    for s in streams:
        threading.Thread(target=read, args=(s,), daemon=True).start()
    WebDriverWait(driver, 120).until(  # six running, and some seconds of their tokens in the charts
        lambda d: d.find_element(By.CSS_SELECTOR, "[data-metric=running]").text == "6"
        and d.execute_script("return window.llamactorCharts.tokens.data.filter(p => p.tokens_per_s > 0).length") > 40)
    driver.save_screenshot(str(out / "web-engine.png"))
    for s in streams:
        s.close()  # the daemon cancels them


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("docs/images"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    port = free_port()
    with tempfile.TemporaryDirectory() as folder:
        daemon = start_daemon(Path(folder), port)
        driver = browser()
        try:
            chat_picture(driver, f"http://127.0.0.1:{port}", args.out)
            engine_picture(driver, f"http://127.0.0.1:{port}", args.out)
        finally:
            driver.quit()
            daemon.terminate()
            daemon.wait(90)  # the drain lets cancelled streams end
    print(f"wrote {args.out / 'web-chat.png'} and {args.out / 'web-engine.png'}")


if __name__ == "__main__":
    main()
