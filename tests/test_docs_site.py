"""The docs site, built strictly and opened in a real browser (Debian's headless Chromium through
chromedriver): pages render without console errors, their images load, and the site's search
finds a spec field on the generated CRD reference. Screenshots are kept as test artefacts in
$DBQ_CACHE/artifacts/docs-site (not committed)."""

from __future__ import annotations

import functools
import http.server
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from tests.operator_harness import ROOT

ARTIFACTS = Path(os.environ.get("DBQ_CACHE", Path.home() / ".cache" / "dbq")) / "artifacts" / "docs-site"
PAGES = {
    "home": "",
    "queue-spec": "reference/queue-spec/",
    "performance": "performance/",
    "getting-started": "getting-started/",
}


class Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


def build(site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )  # fmt: skip


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Iterator[str]:
    """The site built with `mkdocs build --strict`, served on a loopback port (search needs HTTP)."""
    root = tmp_path_factory.mktemp("site")
    done = build(root)
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stdout}\n{done.stderr}"
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(root)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()


@pytest.fixture(scope="module")
def browser(tmp_path_factory) -> Iterator[Any]:
    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--window-size=1280,1000", f"--user-data-dir={tmp_path_factory.mktemp('chromium')}"):  # fmt: skip
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def test_the_docs_build_strictly_and_fail_on_a_broken_link(tmp_path):
    """A link to a page that does not exist fails the strict build (what `make test` relies on)."""
    broken = ROOT / "docs" / "broken-link-check.md"
    broken.write_text("# Broken\n\nSee [a page that is not there](no-such-page.md).\n")
    try:
        done = build(tmp_path / "site")
    finally:
        broken.unlink()
    assert done.returncode != 0
    assert "no-such-page.md" in done.stdout + done.stderr


@pytest.mark.parametrize("name", list(PAGES))
def test_a_page_renders_without_console_errors_and_its_images_load(site, browser, name):
    browser.get_log("browser")  # drop what earlier pages logged
    browser.get(site + PAGES[name])
    WebDriverWait(browser, 30).until(lambda d: d.execute_script("return document.readyState") == "complete")
    WebDriverWait(browser, 30).until(
        lambda d: d.execute_script("return Array.from(document.images).every(i => i.complete)")
    )
    images = browser.execute_script(
        "return Array.from(document.images).map(i => [i.getAttribute('src'), i.naturalWidth])"
    )
    assert all(width > 0 for _, width in images), f"images that did not load: {images}"
    if name == "performance":
        assert len(images) >= 5, images  # the charts rendered from bench/results
    errors = [entry for entry in browser.get_log("browser") if entry["level"] == "SEVERE"]
    assert not errors, errors
    title = browser.find_element(By.CSS_SELECTOR, "article h1").text
    assert title, f"{name}: no heading rendered"
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shot = ARTIFACTS / f"{name}.png"
    browser.save_screenshot(str(shot))
    print(f"screenshot: {shot}")


def test_the_search_finds_a_spec_field_on_the_crd_reference(site, browser):
    browser.get(site)
    box = WebDriverWait(browser, 30).until(
        lambda d: d.find_element(By.CSS_SELECTOR, "input[data-md-component=search-query]")
    )
    box.click()
    box.send_keys("deadLetter")

    def links(d: Any) -> list[str] | None:
        """The results' links once the CRD reference is among them; None while they are still
        being rendered (a result replaced under the reading is read again)."""
        try:
            hrefs = [
                a.get_attribute("href") for a in d.find_elements(By.CSS_SELECTOR, ".md-search-result__item a")
            ]
        except StaleElementReferenceException:
            return None
        return hrefs if any("reference/queue-spec/" in href for href in hrefs) else None

    hrefs = WebDriverWait(browser, 30).until(links)
    assert any("reference/queue-spec/" in href for href in hrefs), hrefs
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    browser.save_screenshot(str(ARTIFACTS / "search-deadLetter.png"))
