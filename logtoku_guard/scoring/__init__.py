"""Scoring: from the top-K logits to an answer's numbers.

LogTokU's AU/EU (:mod:`~logtoku_guard.scoring.uncertainty`, written once), the paper's
quadrants, an answer's statistics and its question's, claim spans, the fitted guard score and
the per-argument scores of tool calls. Knows nothing of policies, guards or frameworks.
"""
