"""Decision: what to do with an answer's numbers.

The one rule engine (:mod:`~logtoku_guard.decision.rules`), the answer rules' conditions and the
policy (loaded within bounds), the decider that applies it to a generation, the guard's results,
and the ``tool_calls`` rules (:mod:`~logtoku_guard.decision.tool_gate`).
"""
