"""``GET /v1/models``: the served model, under each name clients may send (``serve --served-name``)."""

# No `from __future__ import annotations`: FastAPI reads the route's annotations (Request) at run time.

from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import Response

from logtoku_guard.server import wire
from logtoku_guard.server.sse import json_body
from logtoku_guard.server.state import serving_of
from logtoku_guard.wire import openai_protocol as proto

__all__ = ["models", "router"]

router = APIRouter()


@router.get("/v1/models", response_model=proto.ModelList, responses=wire.ERROR_RESPONSES)
async def models(request: Request) -> Any:
    """The served model (one name)."""
    return Response(json_body(wire.models_response(serving_of(request).names)), media_type="application/json")
