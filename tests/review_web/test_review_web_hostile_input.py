"""The review page against hostile or impossible input: huge numbers, spoofing characters, login
CSRF, a database server that went away. Every answer is a page with a 4xx/503 status, never a 500."""

from __future__ import annotations

from collections.abc import Iterator
from urllib.parse import quote

import pytest

pytest.importorskip("starlette")
pytest.importorskip("jinja2")
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.testclient import TestClient

from logtoku_guard.audit import AuditStore
from logtoku_guard.audit.reviewers import ReviewerRegistry
from logtoku_guard.review_web import create_app
from logtoku_guard.review_web.auth import SESSION_COOKIE
from logtoku_guard.review_web.site import LOGIN_COOKIE

from .support import ADMIN_TOKEN, csrf_of, queue

OPENED_BY_THE_PERSON = {"Sec-Fetch-Site": "none"}
FROM_ANOTHER_SITE = {"Sec-Fetch-Site": "cross-site"}


def signed_in(store: AuditStore, token: str = ADMIN_TOKEN) -> TestClient:
    client = TestClient(create_app(store, ADMIN_TOKEN), base_url="http://127.0.0.1")
    r = client.get(f"/?token={quote(token)}", headers=OPENED_BY_THE_PERSON, follow_redirects=False)
    assert r.status_code == 303, r.text
    return client


@pytest.fixture
def admin(store: AuditStore) -> Iterator[TestClient]:
    with signed_in(store) as c:
        yield c


# -- numbers no database column holds -------------------------------------------------------------


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("page=9223372036854775807", "page must be an integer from 1 to"),
        ("page=99999999999999999999999", "page must be an integer from 1 to"),
        ("page=0", "page must be an integer from 1 to"),
        ("per_page=100000", "per_page must be an integer from 1 to 500"),
        ("min_age_h=1e308", "min_age_h must be a number of hours from 0 to 1000000"),
        ("max_age_h=1e9", "max_age_h must be a number of hours from 0 to 1000000"),
        ("max_age_h=nan", "max_age_h must be a number of hours"),
        ("min_age_h=abc", "min_age_h must be a number of hours, got &#39;abc&#39;"),
        ("rule=a%00b", "rule must not contain NUL characters"),
        ("view=nope", "view must be one of"),
    ],
)
def test_impossible_queue_parameters_are_a_400_naming_the_value(admin: TestClient, query: str, expected: str) -> None:
    r = admin.get(f"/?{query}")
    assert r.status_code == 400, r.text
    assert expected in r.text


def test_the_largest_page_and_ages_that_are_allowed_still_list(admin: TestClient, store: AuditStore) -> None:
    queue(store)
    assert admin.get("/?page=184467440737095517&per_page=50").status_code == 200  # far past the end: an empty page
    page = admin.get("/?max_age_h=1000000&min_age_h=0")
    assert page.status_code == 200 and "What is the capital of France?" in page.text


@pytest.mark.parametrize("item_id", [str(2**31), str(2**63), str(2**63 + 1), str(10**40), "9" * 5000, "0", "-1", "1e3"])
def test_an_item_id_no_item_can_have_is_a_404(admin: TestClient, store: AuditStore, item_id: str) -> None:
    """Past the id column's 32 bits, past 64 bits, thousands of digits (Python refuses to parse them: F6), not a number."""
    r = admin.get(f"/items/{item_id}")
    shown = item_id if len(item_id) <= 64 else item_id[:61] + "..."
    assert r.status_code == 404 and f"no review item with id {shown}" in r.text
    token = csrf_of(admin.get("/").text)
    for verb in ("claim", "approve", "reject", "release"):
        r = admin.post(f"/items/{item_id}/{verb}", data={"csrf_token": token, "note": "n"})
        assert r.status_code == 404, (verb, r.text)


_QUERY_KEYS = st.sampled_from(["page", "per_page", "min_age_h", "max_age_h", "view", "rule", "model"])
_TEXT = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=40)
_NUMBERS = st.one_of(
    st.integers().map(str),
    st.integers(min_value=2**62, max_value=2**200).map(str),
    st.floats().map(repr),
    st.sampled_from(["1e308", "-1e308", "nan", "inf", "-0", "1e9", "9223372036854775807", "0x10", "1_0", " 7 "]),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(params=st.dictionaries(_QUERY_KEYS, st.one_of(_NUMBERS, _TEXT), max_size=5))
def test_no_queue_query_is_a_server_error(admin: TestClient, params: dict[str, str]) -> None:
    r = admin.get("/", params=params)  # the TestClient raises any exception the app does not turn into a page
    assert r.status_code in (200, 400), (params, r.status_code, r.text[-500:])


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    item_id=st.one_of(st.integers(min_value=0, max_value=5), st.integers(min_value=2**62, max_value=2**300)),
    verb=st.sampled_from([None, "claim", "approve", "reject", "release"]),
)
def test_no_item_id_is_a_server_error(admin: TestClient, store: AuditStore, item_id: int, verb: str | None) -> None:
    if store.pending(include_claimed=True) == []:
        queue(store)
    if verb is None:
        r = admin.get(f"/items/{item_id}")
        assert r.status_code in (200, 404), r.text[-500:]
    else:
        token = csrf_of(admin.get("/").text)
        r = admin.post(f"/items/{item_id}/{verb}", data={"csrf_token": token, "note": "n"}, follow_redirects=False)
        assert r.status_code in (303, 403, 404, 409), r.text[-500:]


# -- text that spoofs what is shown ---------------------------------------------------------------


def test_bidi_overrides_and_zero_width_characters_are_shown_as_escapes(admin: TestClient, store: AuditStore) -> None:
    spoof = "Pay invoice \u202egnp.exe\u202c now\u200b, zero\u2060width, bom\ufeff"
    item = queue(store, prompt=spoof, answer=f"Answer {spoof}", tokens=[], reason=f"reason {spoof}", model="m\u202eodel")
    listing = admin.get("/").text
    page = admin.get(f"/items/{item.id}").text
    for html in (listing, page):
        assert "Pay invoice \\u202egnp.exe\\u202c now\\u200b, zero\\u2060width, bom\\ufeff" in html
        assert "m\\u202eodel" in html
    raw = set("\u202e\u202c\u200b\u2060\ufeff")
    shown = page.split('<textarea name="edited_answer"')[0] + page.split("</textarea>")[-1]
    assert not raw & set(shown), "a raw spoofing character is shown outside the edit box"
    assert 'id="hidden-chars"' in page
    # the edit box and the filter choices send the stored text back unchanged
    assert f'rows="5">Answer {spoof}</textarea>' in page
    assert '<option value="m\u202eodel">m\\u202eodel</option>' in listing
    assert admin.get("/", params={"model": "m\u202eodel"}).text.count(f'href="/items/{item.id}"') >= 1
    token = csrf_of(page)
    admin.post(f"/items/{item.id}/approve", data={"csrf_token": token, "edited_answer": f"Answer {spoof}"})
    decided = store.review_item(item.id)
    assert decided.status == "approved" and decided.edited_answer is None  # unchanged text: approved as it is


def test_the_page_uses_the_same_rendering_as_the_cli(admin: TestClient, store: AuditStore) -> None:
    from logtoku_guard.cli._common import safe_text

    text = "a\u202eb\u200fc\x1b[2Jd\u2066e"
    item = queue(store, prompt=text, tokens=[])
    assert f'<div class="text" id="question">{safe_text(text).plain}</div>' in admin.get(f"/items/{item.id}").text


# -- login CSRF -----------------------------------------------------------------------------------


def test_a_token_link_from_another_site_asks_before_signing_in(store: AuditStore) -> None:
    _, mallory = ReviewerRegistry(store).add("mallory")
    client = TestClient(create_app(store, ADMIN_TOKEN), base_url="http://127.0.0.1")
    for headers in (FROM_ANOTHER_SITE, {"Sec-Fetch-Site": "same-site"}, {}):  # {}: a browser that does not say
        r = client.get(f"/?token={mallory}&view=decided", headers=headers, follow_redirects=False)
        assert r.status_code == 200, r.text
        assert SESSION_COOKIE not in r.headers.get("set-cookie", "")
        assert '<strong id="confirm-actor">mallory</strong>' in r.text and "another site may have sent you" in r.text
        assert client.get("/").status_code == 401  # not signed in
    # a cross-site form post straight to /login carries no nonce cookie (SameSite=Strict): refused
    fresh = TestClient(create_app(store, ADMIN_TOKEN), base_url="http://127.0.0.1")
    forged = {"token": mallory, "nonce": "guess", "target": "/"}
    assert fresh.post("/login", data=forged, headers={"Origin": "http://evil.example"}).status_code == 403
    assert fresh.post("/login", data=forged).status_code == 403
    assert fresh.get("/").status_code == 401
    # the person clicks "Sign in as mallory" on the confirmation page: signed in, sent to the page the link named
    page = fresh.get(f"/?token={mallory}&view=decided", headers=FROM_ANOTHER_SITE)
    nonce = page.text.split('name="nonce" value="')[1].split('"')[0]
    assert fresh.cookies.get(LOGIN_COOKIE) == nonce
    r = fresh.post("/login", data={"token": mallory, "nonce": nonce, "target": "/?view=decided"}, follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/?view=decided"
    assert "signed in as <strong>mallory</strong>" in fresh.get("/").text


def test_the_sign_in_form_posts_the_token_with_a_nonce(store: AuditStore) -> None:
    client = TestClient(create_app(store, ADMIN_TOKEN), base_url="http://127.0.0.1")
    page = client.get("/items/3?x=1")
    assert page.status_code == 401 and 'action="/login"' in page.text and 'method="post"' in page.text
    nonce = page.text.split('name="nonce" value="')[1].split('"')[0]
    form = {"token": ADMIN_TOKEN, "nonce": nonce, "target": "//evil.example/"}
    r = client.post("/login", data=form, headers={"Sec-Fetch-Site": "cross-site"}, follow_redirects=False)
    assert r.status_code == 403
    r = client.post("/login", data={**form, "token": "wrong"}, headers={"Sec-Fetch-Site": "same-origin"}, follow_redirects=False)
    assert r.status_code == 403 and "nobody" in r.text
    r = client.post("/login", data=form, headers={"Sec-Fetch-Site": "same-origin"}, follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/"  # never to another site
    assert client.get("/").status_code == 200


# -- the database server goes away ----------------------------------------------------------------


def test_every_page_says_503_store_unreachable_while_postgresql_is_down() -> None:
    from support.postgres import start_or_skip

    server = start_or_skip()
    try:
        store = AuditStore(server.new_database())
        item = queue(store)
        _, alice = ReviewerRegistry(store).add("alice")
        admin, reviewer = signed_in(store), signed_in(store, alice)
        token = csrf_of(admin.get(f"/items/{item.id}").text)
    finally:
        server.stop()  # pg_ctl stop -m immediate: the server is gone, its port closed
    try:
        answers = {
            "queue": admin.get("/"),
            "item": admin.get(f"/items/{item.id}"),
            "claim": admin.post(f"/items/{item.id}/claim", data={"csrf_token": token}),
            "reviewers": admin.get("/reviewers"),
            "a reviewer's session": reviewer.get("/"),  # checking that the account is still enabled needs the store
            "a token login": TestClient(admin.app).get(f"/?token={alice}", headers=OPENED_BY_THE_PERSON),
        }
        for what, r in answers.items():
            assert r.status_code == 503, (what, r.status_code, r.text[-300:])
            assert "the audit store cannot be reached right now" in r.text, what
            assert r.headers["retry-after"] == "10"
            assert "postgresql" not in r.text.lower()  # no database URL shown to whoever asks
        assert admin.get("/static/review.css").status_code == 200
    finally:
        store.close()


def test_hostile_tool_call_arguments_are_escaped(store: AuditStore, admin: TestClient) -> None:
    from .support import TOOL_CALL, make_record

    call = {**TOOL_CALL, "name": "<script>x()</script>", "args": {**TOOL_CALL["args"], "<b>k</b>": "\u202eevil"}}
    item = store.record_for_review(make_record(tokens=[], tool_calls=[call]))
    html = admin.get(f"/items/{item.id}").text
    assert "<img src=x" not in html and "&lt;img src=x onerror=alert(1)&gt;" in html
    assert "<script>x()" not in html and "&lt;script&gt;x()&lt;/script&gt;" in html
    assert "<b>k</b>" not in html and "&lt;b&gt;k&lt;/b&gt;" in html
    assert "\u202e" not in html.split('id="tool-calls"')[1].split("</section>")[0] and "\\u202e" in html


def test_the_tool_call_section_says_what_a_verdict_does(store: AuditStore, admin: TestClient) -> None:
    """A gated call (its arguments as JSON are the answer) waits for its verdict before the tool
    runs; calls inside a guarded answer are part of that answer, and the page says so instead."""
    from .support import TOOL_CALL, make_record, tool_call_record

    gated = store.record_for_review(tool_call_record())
    section = admin.get(f"/items/{gated.id}").text.split('id="tool-calls"')[1].split("</section>")[0]
    assert "waiting: the tool has not run" in section and "approving\nruns the tool" in section
    call = {k: v for k, v in TOOL_CALL.items() if k != "id"}
    answer = '<tool_call>{"name": "transfer", "arguments": {"to": "bob", "amount": 500}}</tool_call>'
    whole = store.record_for_review(make_record(tokens=[], answer=answer, tool_calls=[call]))
    section = admin.get(f"/items/{whole.id}").text.split('id="tool-calls"')[1].split("</section>")[0]
    assert "(in the answer)" in section and "the verdict is on the whole answer" in section
    assert "waiting" not in section and "runs the tool with them" not in section
    store.approve(gated.id, "admin")
    section = admin.get(f"/items/{gated.id}").text.split('id="tool-calls"')[1].split("</section>")[0]
    assert "waiting: the tool has not run" not in section
