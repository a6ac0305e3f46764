"""The wire forms: what crosses a process boundary, written once and imported by everything above.

The JSON forms of a guard's results (:mod:`~logtoku_guard.wire.payloads`), the OpenAI chat-completions
schema the server speaks and the remote backend reads (:mod:`~logtoku_guard.wire.openai_protocol`, its
error bodies :mod:`~logtoku_guard.wire.openai_errors`, the standard request fields
:mod:`~logtoku_guard.wire.openai_params`) and tool calls on the wire (:mod:`~logtoku_guard.wire.openai_tools`).
"""
