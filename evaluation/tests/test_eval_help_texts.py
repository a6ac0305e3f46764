"""The ``eval`` plugin's help texts show what they say (no Rich markup eats ``[llamacpp]``)."""

from __future__ import annotations

from support.help_texts import check_help_texts

from logtoku_eval.cli import eval_app


def test_no_eval_help_text_has_an_unescaped_bracket() -> None:
    check_help_texts(eval_app)
