"""The server's routes: module-level functions, one module per endpoint group, each with its ``router``.

- :mod:`~logtoku_guard.server.routes.completions`: ``POST /v1/chat/completions``, ``POST /v1/completions``;
- :mod:`~logtoku_guard.server.routes.models`: ``GET /v1/models``;
- :mod:`~logtoku_guard.server.routes.reviews`: ``GET /v1/logtoku/reviews/{id}``;
- :mod:`~logtoku_guard.server.routes.monitoring`: ``GET /health``, ``GET /metrics``.

Each reads the serving objects built once by :func:`~logtoku_guard.server.app.create_app` from
``request.app.state`` (:func:`~logtoku_guard.server.state.serving_of`). They import FastAPI, so
only :func:`create_app` imports them.
"""
