"""The server's layout (issue 39 item 5): routes are module-level functions, one module per endpoint
group, reading serving objects built once and kept on ``app.state``; one settings model checks
every setting once, for ``serve`` and the app alike."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")
from typer.testing import CliRunner  # noqa: E402

from logtoku_guard import ScriptedAnswer, ScriptedBackend  # noqa: E402
from logtoku_guard.decision.policy import Policy  # noqa: E402
from logtoku_guard.errors import ConfigurationError  # noqa: E402
from logtoku_guard.server import BackgroundServer, ServerSettings, build_app, create_app  # noqa: E402
from logtoku_guard.server.state import Serving  # noqa: E402

GROUPS = {
    "/v1/chat/completions": "completions",
    "/v1/completions": "completions",
    "/v1/models": "models",
    "/v1/logtoku/reviews/{review_id}": "reviews",
    "/health": "monitoring",
    "/metrics": "monitoring",
}


def backend() -> ScriptedBackend:
    return ScriptedBackend(lambda _messages: ScriptedAnswer(["Paris", "."], [[9.0, 0.1], [8.0, 0.2]]), model_name="m")


def tool_review_policy() -> Policy:
    return Policy.from_dict(
        {
            "name": "tools-to-review",
            "rules": [{"name": "never", "when": {"stat": "max_eu", "op": ">", "value": 2.0}, "action": "abstain"}],
            "tool_calls": {"default_action": "human_review"},
        }
    )


def test_every_route_is_a_module_level_function_of_its_endpoint_groups_module() -> None:
    import importlib

    from fastapi.routing import APIRoute

    found: dict[str, Any] = {}
    for group in sorted(set(GROUPS.values())):
        module = importlib.import_module(f"logtoku_guard.server.routes.{group}")
        routers = [module.router, *([module.metrics_router] if group == "monitoring" else [])]
        found |= {r.path: r.endpoint for router in routers for r in router.routes if isinstance(r, APIRoute)}
    assert set(found) == set(GROUPS), sorted(found)
    for path, group in GROUPS.items():
        endpoint = found[path]
        assert "<locals>" not in endpoint.__qualname__, (path, endpoint.__qualname__)
        assert endpoint.__module__ == f"logtoku_guard.server.routes.{group}", (path, endpoint.__module__)
    app = create_app(ServerSettings(), backend())
    documented = set(app.openapi()["paths"])
    assert {p for p in GROUPS if p != "/metrics"} <= documented, documented  # the app serves them
    assert isinstance(app.state.serving, Serving) and app.state.serving.settings.metrics == "auth"
    off = create_app(ServerSettings(metrics="off"), backend())
    assert off.state.serving.metrics is None
    with BackgroundServer(app) as on_srv, BackgroundServer(off) as off_srv:
        assert httpx.get(on_srv.base_url.removesuffix("/v1") + "/metrics", timeout=30).status_code == 200  # no key set
        assert httpx.get(off_srv.base_url.removesuffix("/v1") + "/metrics", timeout=30).status_code == 404


def test_the_routes_read_the_serving_objects_built_once() -> None:
    app = create_app(ServerSettings(model_names=("served-a", "served-b")), backend())
    serving = app.state.serving
    with BackgroundServer(app) as srv:
        listed = httpx.get(f"{srv.base_url}/models", timeout=30).json()
        chat = {"messages": [{"role": "user", "content": "?"}]}
        answered = httpx.post(f"{srv.base_url}/chat/completions", json=chat, timeout=30)
    assert [m["id"] for m in listed["data"]] == ["served-a", "served-b"]
    assert answered.status_code == 200 and answered.json()["model"] == "served-a", answered.text
    assert app.state.serving is serving  # nothing rebuilt per request


def test_a_policy_that_sends_tool_calls_to_review_needs_a_store_checked_by_the_settings(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="can send tool calls to human review, which needs a review queue: pass --store"):
        ServerSettings(policy=tool_review_policy())
    with pytest.raises(ConfigurationError, match="needs a review queue"):
        build_app(backend(), policy=tool_review_policy())
    with pytest.raises(ConfigurationError, match="--store records the guard's decisions: give a --policy too"):
        ServerSettings(store=tmp_path / "audit.db")
    from logtoku_guard.audit import AuditStore

    with AuditStore(tmp_path / "audit.db") as store:
        app = build_app(backend(), policy=tool_review_policy(), store=store)
        assert app.state.serving.settings.store is store and app.state.serving.engine.store is store
    where = tmp_path / "opened.db"  # a location: the app opens the store once
    opened = create_app(ServerSettings(policy=tool_review_policy(), store=str(where)), backend()).state.serving
    assert isinstance(opened.engine.store, AuditStore) and opened.settings.store is opened.engine.store and where.is_file()
    opened.engine.store.close()


def test_a_store_the_app_opened_is_closed_when_building_fails_and_when_the_server_stops(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from logtoku_guard.audit import AuditStore
    from logtoku_guard.decision.policy import default_policy
    from logtoku_guard.server import Engine

    closed: list[AuditStore] = []
    real_close = AuditStore.close

    def spy(self: AuditStore) -> None:
        closed.append(self)
        real_close(self)

    monkeypatch.setattr(AuditStore, "close", spy)
    # the default policy needs a profile this scripted model does not have: building fails after the store opened
    with pytest.raises(ConfigurationError, match="quantile thresholds"):
        create_app(ServerSettings(policy=default_policy(), store=str(tmp_path / "a.db"), cache_dir=tmp_path), backend())
    assert len(closed) == 1
    app = create_app(ServerSettings(policy=tool_review_policy(), store=str(tmp_path / "b.db")), backend())
    with BackgroundServer(app) as srv:
        assert httpx.get(f"{srv.base_url}/models", timeout=30).status_code == 200
        assert len(closed) == 1  # open while serving
    assert closed[1:] == [app.state.serving.engine.store]  # closed by the server's stop
    with pytest.raises(TypeError, match="give the store to the Engine"):  # a store path beside a ready engine: whose?
        create_app(ServerSettings(policy=tool_review_policy(), store=str(tmp_path / "c.db")), engine=Engine(_runner()))


def test_an_engine_built_by_hand_refuses_a_tool_review_policy_without_a_store() -> None:
    from logtoku_guard.server import Engine

    with pytest.raises(ConfigurationError, match="can send tool calls to human review, which needs a review queue"):
        Engine(_runner(), policy=tool_review_policy())


def _runner() -> Any:
    from logtoku_guard.server.engine import ThreadRunner

    return ThreadRunner(backend())


def test_serve_refuses_a_tool_review_policy_without_a_store_before_the_model_loads(tmp_path: Path) -> None:
    import typer

    from logtoku_guard.cli.serve import serve

    cli = typer.Typer()
    cli.command()(serve)
    path = tmp_path / "p.json"
    path.write_text(
        json.dumps({"name": "t", "rules": [], "default_action": "pass", "tool_calls": {"default_action": "human_review"}})
    )
    result = CliRunner().invoke(cli, ["--policy", str(path), "--model", "/nonexistent/model"])
    flat = " ".join(result.output.split())
    assert result.exit_code == 2 and "needs a review queue: pass --store" in flat and "/nonexistent/model" not in flat, flat


@pytest.mark.parametrize(
    ("fields", "needle"),
    [
        ({"max_body_bytes": 0}, "--max-body-bytes must be a whole number of bytes >= 1, got 0"),
        ({"port": "eighty"}, "--port: Input should be a valid integer"),
        ({"metrics": "public"}, "--metrics must be one of auth, open, off, got 'public'"),
        ({"bogus": 1}, "bogus"),
    ],
)
def test_bad_settings_are_configuration_errors_naming_the_option(fields: dict[str, Any], needle: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        ServerSettings(**fields)
    assert needle in str(info.value)
