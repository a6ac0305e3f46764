"""Take docs/review_item.png: the item page of a real guarded answer, in the system's Chromium.

The embedded model (SmolLM2-135M-Instruct) answers a question about an invented institute;
a small profile (calibrated on 24 questions, for the quadrant colours) and a policy that sends
unreliable answers to a person put it in the review queue; the page is then photographed.

Run once from the repository root: .venv/bin/python docs/make_review_screenshot.py
(needs the review extra, playwright, and ``apt-get install chromium``).
"""

from __future__ import annotations

import secrets
import shutil
import socket
import tempfile
import threading
import time
from pathlib import Path

from playwright.sync_api import sync_playwright

from logtoku_guard import AuditStore, DecodingOptions, Guard, Policy, TransformersBackend, calibrate
from logtoku_guard.calibration import default_calibration_prompts

OUT = Path(__file__).resolve().parent / "review_item.png"
QUESTION = "Who founded the Zarnovian Institute of Quantum Botany?"
POLICY = {
    "name": "review-unreliable",
    "version": "1",
    "rules": [
        {
            "name": "unreliable-answer",
            "when": {"stat": "reliability", "op": "<", "value": {"quantile": 0.5}},
            "action": "human_review",
            "reason": "the answer is less reliable than half of this model's calibration answers",
        }
    ],
    "default_action": "pass",
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> None:
    import uvicorn

    from logtoku_guard.review_web import create_app

    chromium = shutil.which("chromium")
    if chromium is None:
        raise SystemExit("no chromium on PATH: apt-get install chromium")
    backend = TransformersBackend()
    options = DecodingOptions(max_new_tokens=48, stop=("\n",))
    profile = calibrate(backend, default_calibration_prompts(24), options, source="24 calibration questions")
    with tempfile.TemporaryDirectory() as tmp, AuditStore(Path(tmp) / "audit.db") as store:
        guard = Guard(backend, Policy.from_dict(POLICY), store=store, profile=profile, options=options)
        result = guard.run(QUESTION)
        if result.review_id is None:
            raise SystemExit(f"the policy did not queue the answer ({result.action}: {result.decision.reason}); try again")
        token = secrets.token_urlsafe(24)
        port = _free_port()
        server = uvicorn.Server(uvicorn.Config(create_app(store, token), host="127.0.0.1", port=port, log_level="warning"))
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        while not server.started:
            time.sleep(0.02)
        url = f"http://127.0.0.1:{port}"
        try:
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
                page = browser.new_page(viewport={"width": 1100, "height": 1000}, device_scale_factor=1)
                page.goto(f"{url}/?token={token}")
                page.goto(f"{url}/items/{result.review_id}")
                page.screenshot(path=str(OUT), full_page=True)
                browser.close()
        finally:
            server.should_exit = True
            thread.join(10)
    print(OUT)


if __name__ == "__main__":
    main()
