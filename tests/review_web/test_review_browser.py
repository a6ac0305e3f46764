"""The review page in a real browser: Playwright driving the system's Chromium (``/usr/bin/chromium``).

Playwright's own browser download is not used: ``apt-get install chromium`` (``scripts/install.sh``
does it). Skipped only when no chromium executable is found.
"""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from logtoku_guard.audit import AuditStore, ReviewItem
from logtoku_guard.decision.tool_gate.call_review import ToolReviewResponse
from logtoku_guard.review_web.auth import SESSION_COOKIE

from .support import ADMIN_TOKEN, HOSTILE_TO, live_server, queue, tool_call_record

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
if os.environ.get("CI", "").lower() == "true" and CHROMIUM is None:  # CI installs it (scripts/install.sh --dev)
    msg = "CI=true but no chromium executable on PATH: `bash scripts/install.sh --dev` installs Debian's chromium"
    raise RuntimeError(msg)
pytest.importorskip("uvicorn")
sync_api = pytest.importorskip("playwright.sync_api")
pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(CHROMIUM is None, reason="no chromium executable on PATH: apt-get install chromium"),
]


@pytest.fixture
def browser_page() -> Iterator[Any]:
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            yield browser.new_page(viewport={"width": 1200, "height": 900})
        finally:
            browser.close()


def test_log_in_see_the_heat_map_edit_and_approve_and_the_application_gets_it(store: AuditStore, browser_page: Any) -> None:
    item = queue(store, prompt="What is the capital of France? <script>alert(1)</script>")
    received: list[ReviewItem] = []
    waiter = threading.Thread(target=lambda: received.append(store.wait_for_decision(item.id, timeout=60, poll_interval=0.05)))
    waiter.start()
    page = browser_page
    dialogs: list[str] = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    with live_server(store) as url:
        page.goto(f"{url}/?token={ADMIN_TOKEN}")
        assert "token=" not in page.url  # redirected without the token
        sync_api.expect(page.locator("#tab-pending .count")).to_have_text("1")
        page.click(f'a[href="/items/{item.id}"] >> nth=0')
        sync_api.expect(page.locator("#question")).to_contain_text("<script>alert(1)</script>")  # shown as text
        spans = page.locator("#released-answer span.tok")
        assert spans.count() == 5
        assert page.locator("#released-answer span.q-I").inner_text() == " Lyon"
        assert "AU 1.5" in (page.locator("#released-answer span.q-I").get_attribute("title") or "")
        colour = page.locator("#released-answer span.q-I").evaluate("e => getComputedStyle(e).backgroundColor")
        assert colour not in ("rgba(0, 0, 0, 0)", "transparent")  # the stylesheet loaded and colours the quadrant
        page.click("#claim")
        sync_api.expect(page.locator("#status")).to_have_text("claimed")
        page.fill("#edited_answer", "The capital is Paris.")
        page.click("#edit-approve")
        sync_api.expect(page.locator("#status")).to_have_text("approved")
        sync_api.expect(page.locator("#released-answer")).to_have_text("The capital is Paris.")
    waiter.join(30)
    assert dialogs == []  # no script ran
    assert received and received[0].final_answer == "The capital is Paris."
    assert received[0].reviewer == "admin" and received[0].claimed_by == "admin"


def test_a_pending_tool_call_shows_its_coloured_arguments_and_an_edit_changes_them(store: AuditStore, browser_page: Any) -> None:
    item = store.record_for_review(tool_call_record())
    page = browser_page
    dialogs: list[str] = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    with live_server(store) as url:
        page.goto(f"{url}/items/{item.id}?token={ADMIN_TOKEN}")
        sync_api.expect(page.locator("#tool-call-1 .tool-name")).to_have_text("transfer")
        amount = page.locator('#tool-call-1 span.arg[data-argument="amount"]')
        assert amount.inner_text() == "500" and "q-I" in (amount.get_attribute("class") or "")
        assert "flagged" in (amount.get_attribute("class") or "") and "max EU 1.2" in (amount.get_attribute("title") or "")
        colour = amount.evaluate("e => getComputedStyle(e).backgroundColor")
        assert colour not in ("rgba(0, 0, 0, 0)", "transparent")
        to = page.locator('#tool-call-1 span.arg[data-argument="to"]')
        assert to.inner_text() == f'"{HOSTILE_TO}"' and "q-III" in (to.get_attribute("class") or "")  # shown as text
        assert page.locator("#tool-calls img").count() == 0
        page.fill("#edited_answer", '{"amount": 50, "to": "alice"}')
        page.click("#edit-approve")
        sync_api.expect(page.locator("#status")).to_have_text("approved")
    assert dialogs == []  # no script ran
    verdict = ToolReviewResponse.from_item(store.review_item(item.id))
    assert verdict.type == "edit" and verdict.args == {"amount": 50, "to": "alice"}


def test_a_wrong_token_and_a_forged_post_are_refused_in_the_browser(store: AuditStore, browser_page: Any) -> None:
    item = queue(store)
    page = browser_page
    with live_server(store) as url:
        response = page.goto(f"{url}/?token=wrong")
        assert response is not None and response.status == 403
        page.goto(f"{url}/?token={ADMIN_TOKEN}")
        r = page.request.post(f"{url}/items/{item.id}/approve", form={"csrf_token": "forged"})
        assert r.status == 403
    assert store.review_item(item.id).status == "pending"


def test_a_token_link_on_another_site_needs_a_click_on_the_confirmation_page(store: AuditStore, browser_page: Any) -> None:
    page = browser_page
    with live_server(store) as url:
        page.set_content(f'<a id="lure" href="{url}/?token={ADMIN_TOKEN}&view=decided">win a prize</a>')
        page.click("#lure")
        sync_api.expect(page.locator("#confirm-actor")).to_have_text("admin")
        assert all(c["name"] != SESSION_COOKIE for c in page.context.cookies(url))  # not signed in yet
        page.click("#confirm-sign-in")
        sync_api.expect(page.locator("#tab-decided")).to_have_class("tab active")
        assert "token=" not in page.url and page.url.endswith("/?view=decided")
