"""``GET /health`` (always open) and ``GET /metrics`` (Prometheus; behind the API key unless
``serve --metrics open``, not served with ``--metrics off``)."""

# No `from __future__ import annotations`: FastAPI reads the routes' annotations (Request) at run time.

from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import Response

from logtoku_guard.server.state import serving_of

__all__ = ["health", "metrics_router", "prometheus", "router"]

router = APIRouter()
"""``GET /health``."""
metrics_router = APIRouter()
"""``GET /metrics``, added only when the app has metrics."""


@router.get("/health")
async def health() -> dict[str, str]:
    return {"status": "ok"}


@metrics_router.get("/metrics", include_in_schema=False)
async def prometheus(request: Request) -> Any:
    metrics = serving_of(request).metrics
    if metrics is None:  # not added to such an app; a 404 all the same
        return Response(status_code=404)
    body, content_type = metrics.exposition()
    return Response(body, media_type=content_type)
