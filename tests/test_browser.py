"""Open report.html in headless Chromium: it renders, loads nothing, and runs nothing."""

from __future__ import annotations

from pathlib import Path

import pytest
from fixtures.findings.builder import SECTIONS, XSS, build

from forensics.report import write_report

CHROMIUM = Path("/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(
        not CHROMIUM.exists(),
        reason="Debian chromium is not installed (/usr/bin/chromium): apt-get install chromium",
    ),
]


@pytest.fixture(scope="module")
def page_and_log(tmp_path_factory):
    sync_api = pytest.importorskip("playwright.sync_api", reason="the playwright package")
    folder = tmp_path_factory.mktemp("browser")
    case, con = build(folder)
    out = folder / "report"
    write_report(con, case, out)
    con.close()
    url = (out / "report.html").resolve().as_uri()
    log = {"requests": [], "dialogs": [], "console_errors": [], "url": url, "out": out}
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.on("request", lambda r: log["requests"].append(r.url))
        page.on("dialog", lambda d: (log["dialogs"].append(d.message), d.dismiss()))
        page.on(
            "console", lambda m: log["console_errors"].append(m.text) if m.type == "error" else 0
        )
        page.goto(url, wait_until="load")
        page.wait_for_timeout(300)  # give any stray onerror handler time to fire
        yield page, log
        browser.close()


def test_screenshot_and_no_request_leaves_the_page(page_and_log, tmp_path):
    page, log = page_and_log
    shot = tmp_path / "report.png"
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 10_000
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert log["requests"] == [log["url"]]


def test_hostile_tenant_name_renders_as_visible_text(page_and_log):
    page, log = page_and_log
    assert log["dialogs"] == []
    assert page.locator("img").count() == 0
    cell = page.locator("#table-recipients td", has_text=XSS).first
    assert cell.is_visible()
    assert cell.inner_text() == XSS


def test_every_section_and_chart_is_rendered(page_and_log):
    page, log = page_and_log
    for section in SECTIONS:
        assert page.locator(f"section#{section}").is_visible(), section
    for chart in ("chart-over-time", "chart-ttft", "chart-nodes"):
        box = page.locator(f"#{chart} svg").bounding_box()
        assert box and box["width"] > 300 and box["height"] > 50, chart
    assert page.locator("#fact-affected .value").inner_text() == "3"
    assert log["console_errors"] == []
