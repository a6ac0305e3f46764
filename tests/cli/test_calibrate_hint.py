"""The calibrate command a message suggests runs the same model: on llama.cpp the embedded model's
weight types are models of their own names, chosen by $LOGTOKU_GUARD_LLAMACPP_WEIGHTS (issue 42)."""

from __future__ import annotations

import pytest

from logtoku_guard.cli._common import calibrate_hint


@pytest.mark.parametrize(
    ("model", "hint"),
    [
        ("smollm2-135m-instruct-f16@llamacpp", "`logtoku-guard calibrate --model embedded --top-k 2 --backend llamacpp`"),
        (
            "smollm2-135m-instruct@llamacpp",
            "`LOGTOKU_GUARD_LLAMACPP_WEIGHTS=q4_1 logtoku-guard calibrate --model embedded --top-k 2 --backend llamacpp`",
        ),
        (
            "smollm2-135m-instruct-q8_0@llamacpp",
            "`LOGTOKU_GUARD_LLAMACPP_WEIGHTS=q8_0 logtoku-guard calibrate --model embedded --top-k 2 --backend llamacpp`",
        ),
        ("/m/gemma.gguf@llamacpp", "`logtoku-guard calibrate --model /m/gemma.gguf --top-k 2 --backend llamacpp`"),
        (
            "smollm2-135m-instruct-q5_k@llamacpp",
            "`logtoku-guard calibrate --model smollm2-135m-instruct-q5_k --top-k 2 --backend llamacpp`",
        ),
        ("smollm2-135m-instruct", "`logtoku-guard calibrate --model smollm2-135m-instruct --top-k 2`"),
    ],
)
def test_the_hint_names_the_weights_that_made_the_model_name(model: str, hint: str) -> None:
    assert calibrate_hint(model, 2, "clamped") == hint
