"""The guard: one question's steps, driven once.

The sans-IO loop (:mod:`~logtoku_guard.guard.guard.guard_steps`), its one driver
(:mod:`~logtoku_guard.guard.guard.driver`), the backend and retriever as its I/O, the
:class:`~logtoku_guard.guard.guard.guard.Guard` that users call, retrievers, the side channel that
hands framework generations to guards, telemetry and the JSON payloads of a decision.
"""
