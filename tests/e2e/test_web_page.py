"""The chat page at / in Debian's headless Chromium (selenium + chromium-driver): it loads
the model list, streams an answer and fills the TTFT and tok/s figures."""

from __future__ import annotations

import shutil

import pytest
import requests


def chromium_paths() -> tuple[str, str]:
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver") or "/usr/lib/chromium/chromedriver"
    if not browser or not shutil.which(driver):
        pytest.fail("chromium and chromium-driver are required (scripts/bootstrap.sh installs them)")
    return browser, driver


@pytest.fixture(scope="module")
def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    binary, driver = chromium_paths()
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1280,900"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    b = webdriver.Chrome(service=Service(executable_path=driver), options=options)
    yield b
    b.quit()


def test_page_is_served_as_html(server):
    r = requests.get(server.url("/"), timeout=10)
    assert r.status_code == 200
    assert r.headers["Content-Type"].startswith("text/html")
    assert r.text.startswith("<!DOCTYPE html>")
    assert "http://" not in r.text and "https://" not in r.text


def open_chat_page(server, model_id, browser):
    """Loads / and waits for the model list (from /v1/models); returns a 60 s waiter."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(server.url("/"))
    wait = WebDriverWait(browser, 60)
    wait.until(lambda b: b.find_element(By.ID, "model").get_attribute("value") == model_id)
    return wait


def test_chat_streams_an_answer_with_figures(server, model_id, browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as EC

    wait = open_chat_page(server, model_id, browser)

    max_tokens = browser.find_element(By.ID, "max_tokens")
    max_tokens.clear()
    max_tokens.send_keys("16")
    temperature = browser.find_element(By.ID, "temperature")
    temperature.clear()
    temperature.send_keys("0")

    prompt = browser.find_element(By.ID, "prompt")
    prompt.send_keys("What are the three primary colors?")
    browser.find_element(By.ID, "send").click()

    # The user's message shows at once, then the streamed answer.
    wait.until(EC.text_to_be_present_in_element((By.CSS_SELECTOR, ".msg.user .content"), "primary colors"))
    wait.until(lambda b: b.find_element(By.CSS_SELECTOR, ".msg.assistant .content").text.strip() != "")
    # Done when Send is enabled again and the finish reason is filled.
    wait.until(lambda b: b.find_element(By.ID, "send").is_enabled()
               and b.find_element(By.CSS_SELECTOR, '[data-stat="finish"]').text in ("stop", "length"))

    def stat(name):
        return browser.find_element(By.CSS_SELECTOR, f'[data-stat="{name}"]').text

    ttft = stat("ttft")
    assert ttft.endswith(" s") and 0 < float(ttft[:-2]) < 60, ttft
    assert float(stat("tps")) > 0, stat("tps")
    assert 1 <= int(stat("tokens")) <= 16, stat("tokens")
    assert not browser.find_elements(By.CSS_SELECTOR, ".msg.assistant .error")
    severe = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert not severe, severe


def test_errors_from_the_server_are_shown(server, model_id, browser):
    from selenium.webdriver.common.by import By

    wait = open_chat_page(server, model_id, browser)
    # A temperature the API refuses: the OpenAI error body is shown, naming the parameter.
    temperature = browser.find_element(By.ID, "temperature")
    temperature.clear()
    temperature.send_keys("5")
    browser.find_element(By.ID, "prompt").send_keys("Hi")
    browser.find_element(By.ID, "send").click()
    error = wait.until(lambda b: b.find_elements(By.CSS_SELECTOR, ".msg.assistant .error"))[0]
    assert "400" in error.text and "temperature" in error.text, error.text
    assert browser.find_element(By.ID, "send").is_enabled()
