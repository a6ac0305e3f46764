"""The review page through HTTP (Starlette's TestClient): login, CSRF, escaping, races, queue."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

pytest.importorskip("starlette")
pytest.importorskip("jinja2")
from starlette.testclient import TestClient

from logtoku_guard.audit import AuditStore
from logtoku_guard.audit.reviewers import ReviewerRegistry
from logtoku_guard.review_web import create_app
from logtoku_guard.review_web.auth import SESSION_COOKIE

from .support import ADMIN_TOKEN, ANSWER, csrf_of, queue

OPENED_BY_THE_PERSON = {"Sec-Fetch-Site": "none"}  # what a browser sends for a typed or pasted address


def client_for(store: AuditStore, token: str | None = ADMIN_TOKEN) -> TestClient:
    client = TestClient(create_app(store, ADMIN_TOKEN), base_url="http://127.0.0.1")
    if token is not None:
        r = client.get(f"/?token={token}", headers=OPENED_BY_THE_PERSON, follow_redirects=False)
        assert r.status_code == 303, r.text
    return client


@pytest.fixture
def admin(store: AuditStore) -> Iterator[TestClient]:
    with client_for(store) as c:
        yield c


def test_login_by_token_sets_a_strict_httponly_cookie_and_drops_the_token(store: AuditStore) -> None:
    client = client_for(store, token=None)
    assert client.get("/").status_code == 401
    r = client.get(f"/?token={ADMIN_TOKEN}&view=decided", headers=OPENED_BY_THE_PERSON, follow_redirects=False)
    assert r.status_code == 303
    assert r.headers["location"] == "/?view=decided"
    cookie = r.headers["set-cookie"]
    assert cookie.startswith(f"{SESSION_COOKIE}=")
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie.replace("Strict", "strict")
    assert ADMIN_TOKEN not in cookie
    page = client.get("/")
    assert page.status_code == 200 and "signed in as <strong>admin</strong>" in page.text
    assert "script-src" not in page.headers["content-security-policy"]  # default-src 'none': no script at all
    assert page.headers["referrer-policy"] == "no-referrer"


def test_a_wrong_token_is_refused(store: AuditStore) -> None:
    client = client_for(store, token=None)
    assert client.get("/?token=not-a-token", headers=OPENED_BY_THE_PERSON, follow_redirects=False).status_code == 403
    assert client.get("/?token=not-a-token", follow_redirects=False).status_code == 403  # the confirmation path too
    assert client.get("/").status_code == 401


def test_reviewers_act_under_their_own_name_only(store: AuditStore) -> None:
    item = queue(store)
    _, alice_token = ReviewerRegistry(store).add("alice")
    _, bob_token = ReviewerRegistry(store).add("bob")
    alice, bob = client_for(store, alice_token), client_for(store, bob_token)
    page = alice.get(f"/items/{item.id}")
    r = alice.post(f"/items/{item.id}/claim", data={"csrf_token": csrf_of(page.text), "reviewer": "bob"}, follow_redirects=False)
    assert r.status_code == 303
    assert store.review_item(item.id).claimed_by == "alice"  # a "reviewer" field is ignored: the session decides
    page = bob.get(f"/items/{item.id}")
    assert "only they may decide it" in page.text
    r = bob.post(f"/items/{item.id}/approve", data={"csrf_token": csrf_of(page.text)})
    assert r.status_code == 409 and "claimed" in r.text
    assert not store.review_item(item.id).decided
    assert bob.get("/reviewers").status_code == 403  # only the admin manages accounts


def test_post_without_or_with_a_wrong_csrf_token_is_refused(admin: TestClient, store: AuditStore) -> None:
    item = queue(store)
    assert admin.post(f"/items/{item.id}/approve", data={}).status_code == 403
    assert admin.post(f"/items/{item.id}/approve", data={"csrf_token": "forged"}).status_code == 403
    token = csrf_of(admin.get(f"/items/{item.id}").text)
    r = admin.post(f"/items/{item.id}/approve", data={"csrf_token": token}, headers={"Origin": "http://evil.example"})
    assert r.status_code == 403
    assert store.review_item(item.id).status == "pending"
    other = client_for(store)  # another session's token is not this session's
    assert other.post(f"/items/{item.id}/approve", data={"csrf_token": token}).status_code == 403


def test_stored_text_is_escaped(admin: TestClient, store: AuditStore) -> None:
    evil = "<script>alert(1)</script>"
    item = queue(store, prompt=f"Why {evil}?", rule=f"rule{evil}", tokens=[], answer=f"answer {evil}", reason=evil)
    page = admin.get(f"/items/{item.id}").text
    assert "<script>" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    listing = admin.get("/").text
    assert "<script>" not in listing and "&lt;script&gt;" in listing


def test_item_page_shows_the_heat_map_decision_and_history(admin: TestClient, store: AuditStore) -> None:
    item = queue(store)
    page = admin.get(f"/items/{item.id}").text
    assert '<span class="tok q-IV" title="quadrant IV · AU 1.2 · EU 0.1 · log p -0.7 · top logits 7, 6.5"> capital</span>' in page
    assert 'class="tok q-none"' in page  # undefined AU/EU
    assert "high AU, high EU" in page  # the legend
    assert "low_reliability" in page and "guard_score" in page and "reliability_percentile" in page
    assert "queued for review" in page


def test_no_heat_map_when_the_tokens_do_not_join_to_the_answer(admin: TestClient, store: AuditStore) -> None:
    item = queue(store, answer="Something else entirely.")
    page = admin.get(f"/items/{item.id}").text
    assert 'class="tok q-' not in page.split("<h2>Decision</h2>")[0].split('id="released-answer"')[1]
    assert "do not join" in page


def test_edit_and_approve_releases_the_edited_answer(admin: TestClient, store: AuditStore) -> None:
    item = queue(store)
    token = csrf_of(admin.get(f"/items/{item.id}").text)
    form = {"csrf_token": token, "edited_answer": "The capital is Paris.", "note": "fixed"}
    r = admin.post(f"/items/{item.id}/approve", data=form)
    assert r.status_code == 200  # followed the redirect to the item
    decided = store.review_item(item.id)
    assert decided.status == "approved" and decided.reviewer == "admin"
    assert decided.final_answer == "The capital is Paris." and decided.note == "fixed"
    assert "The capital is Paris." in r.text and "edited by the reviewer" in r.text
    assert 'id="original-answer"' in r.text  # the model's answer keeps its heat-map
    # a second verdict is refused as in the CLI
    assert admin.post(f"/items/{item.id}/reject", data={"csrf_token": token, "note": "late"}).status_code == 409


def test_approve_unchanged_text_is_not_an_edit_and_reject_needs_a_note(admin: TestClient, store: AuditStore) -> None:
    a, b = queue(store), queue(store)
    token = csrf_of(admin.get("/").text)
    admin.post(f"/items/{a.id}/approve", data={"csrf_token": token, "edited_answer": ANSWER.replace("\n", "\r\n")})
    assert store.review_item(a.id).edited_answer is None
    assert admin.post(f"/items/{b.id}/reject", data={"csrf_token": token, "note": "  "}).status_code == 400
    admin.post(f"/items/{b.id}/reject", data={"csrf_token": token, "note": "wrong city"})
    assert store.review_item(b.id).status == "rejected"


def test_unknown_item_is_404(admin: TestClient) -> None:
    assert admin.get("/items/999").status_code == 404


def test_queue_tabs_counts_filters_and_pages(admin: TestClient, store: AuditStore) -> None:
    items = [queue(store, model="m-a" if i % 2 else "m-b", rule="r1" if i < 5 else "r2") for i in range(12)]
    store.claim(items[0].id, "admin")
    store.reject(items[1].id, "admin", "no")
    page = admin.get("/?view=pending&per_page=5").text
    assert 'id="tab-pending"' in page and '<span class="count">10</span>' in page
    assert "page 1 of 2" in page and 'rel="next"' in page
    page2 = admin.get("/?view=pending&per_page=5&page=2").text
    assert f'href="/items/{items[-1].id}"' in page2 and 'rel="prev"' in page2
    assert "r2" in admin.get("/?view=pending&rule=r2").text
    only_r1 = admin.get("/?view=pending&rule=r1").text
    assert "3 item(s)" in only_r1  # items 2, 3, 4
    assert "6 item(s)" in admin.get("/?view=all&model=m-a").text
    assert "0 item(s)" in admin.get("/?view=pending&min_age_h=1").text
    assert "10 item(s)" in admin.get("/?view=pending&max_age_h=1").text
    assert "1 item(s)" in admin.get("/?view=decided").text
    assert admin.get("/?view=bogus").status_code == 400
    assert admin.get("/?min_age_h=soon").status_code == 400


def test_admin_adds_and_disables_reviewers_on_the_page(admin: TestClient, store: AuditStore) -> None:
    token = csrf_of(admin.get("/reviewers").text)
    page = admin.post("/reviewers", data={"csrf_token": token, "name": "carol"}).text
    new_token = page.split('id="new-token">')[1].split("<")[0]
    carol = client_for(store, new_token)
    assert "signed in as <strong>carol</strong>" in carol.get("/").text
    admin.post("/reviewers", data={"csrf_token": token, "disable": "carol"})
    assert carol.get("/").status_code == 401  # a disabled account's session ends
    assert admin.post("/reviewers", data={"csrf_token": token, "name": "admin"}).status_code == 400


def test_logout_ends_the_session(admin: TestClient) -> None:
    token = csrf_of(admin.get("/").text)
    admin.post("/logout", data={"csrf_token": token})
    assert admin.get("/").status_code == 401
