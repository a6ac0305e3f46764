"""The guard: one question's steps, driven once.

The sans-IO loop (:mod:`~logtoku_guard.guard.guard_steps`), its one driver
(:mod:`~logtoku_guard.guard.driver`), the backend and retriever as its I/O
(:mod:`~logtoku_guard.guard.guard_io`), the :class:`~logtoku_guard.guard.guard.Guard` that users call
(built and checked once; :meth:`~logtoku_guard.guard.guard.Guard.call` binds one call's backend,
retriever and options), retrievers, the capture that hands framework generations to guards, and
telemetry.
"""
