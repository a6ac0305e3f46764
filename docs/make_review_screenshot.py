"""Take docs/review_item.png: the item page of a queued answer, in the system's Chromium.

Run once from the repository root: .venv/bin/python docs/make_review_screenshot.py
(needs the review extra, playwright, and ``apt-get install chromium``).
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

from playwright.sync_api import sync_playwright

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from logtoku_guard.audit import AuditStore
from tests.review_web.support import ADMIN_TOKEN, live_server, queue

OUT = Path(__file__).resolve().parent / "review_item.png"


def main() -> None:
    chromium = shutil.which("chromium")
    if chromium is None:
        raise SystemExit("no chromium on PATH: apt-get install chromium")
    with tempfile.TemporaryDirectory() as tmp, AuditStore(Path(tmp) / "audit.db") as store:
        item = queue(store)
        with live_server(store) as url, sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1100, "height": 1000}, device_scale_factor=1)
            page.goto(f"{url}/?token={ADMIN_TOKEN}")
            page.goto(f"{url}/items/{item.id}")
            page.screenshot(path=str(OUT), full_page=True)
            browser.close()
    print(OUT)


if __name__ == "__main__":
    main()
