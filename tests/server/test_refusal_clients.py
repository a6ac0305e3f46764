"""Each real client reports a guarded abstention the way it reports a model's own refusal.

A guard over the tiny transformers model (real tokenizer, constrained decoding for structured
output) is served on 127.0.0.1 with a policy that abstains on every answer; the clients are the
``openai`` SDK, langchain-openai's ``ChatOpenAI`` and LlamaIndex's ``OpenAILike`` (test
dependencies), and UQLM's logprob extraction (``uqlm/utils/response_generator.py`` of UQLM 0.6.7,
whose install needs transformers < 5, which this project cannot share a venv with: its exact
code is reproduced on the ``AIMessage`` ChatOpenAI returns). Where each keeps the guard's decision:

- openai SDK: ``message.refusal``; ``.parse()`` gives ``parsed=None`` and the refusal; the choice's
  ``model_extra["logtoku_guard"]``; ``with_raw_response`` headers ``x-logtoku-*``;
- ChatOpenAI: ``additional_kwargs["refusal"]``; ``with_structured_output`` raises
  ``OpenAIRefusalError`` (or returns it as ``parsing_error`` with ``include_raw=True``);
  ``response_metadata["headers"]`` with ``include_response_headers=True``;
- OpenAILike: ``raw`` (the whole body, ``logtoku_guard`` included).
"""

from __future__ import annotations

import asyncio
import json
import math
import warnings
from typing import Any

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("llguidance")
openai = pytest.importorskip("openai")

from pydantic import BaseModel, Field  # noqa: E402

from logtoku_guard.decision.policy import Policy  # noqa: E402
from logtoku_guard.server import BackgroundServer, ServerSettings, build_app  # noqa: E402

KEY = "refusal-key"
QUESTION = "Which year did the Zorblax Institute of Quantum Pastry open its third campus?"  # invented


class Campus(BaseModel):
    year: int = Field(ge=1000, le=2100)
    city: str = Field(max_length=12)


SCHEMA = {
    "type": "json_schema",
    "json_schema": {"name": "campus", "schema": {**Campus.model_json_schema(), "additionalProperties": False}, "strict": True},
}


@pytest.fixture(scope="module")
def guarded(tiny_tokenizer: Any) -> Any:
    from support.served import tiny_served

    rule = {"name": "always", "when": {"stat": "reliability", "op": "<", "value": 1e9}, "action": "abstain"}
    policy = Policy.from_dict({"name": "abstain-all", "rules": [rule]})
    backend = tiny_served(tiny_tokenizer)
    with BackgroundServer(build_app(backend, policy=policy, settings=ServerSettings(api_key=KEY))) as srv:
        yield srv, backend, policy


def sdk(srv: Any) -> Any:
    return openai.OpenAI(base_url=srv.base_url, api_key=KEY, max_retries=0)


# -- the openai SDK ------------------------------------------------------------------------------
def test_sdk_parse_returns_parsed_none_and_the_refusal(guarded: Any) -> None:
    srv, backend, policy = guarded
    done = sdk(srv).chat.completions.parse(
        model=backend.model_name, messages=[{"role": "user", "content": QUESTION}], response_format=Campus, max_tokens=40
    )
    message = done.choices[0].message
    assert message.parsed is None and message.refusal == policy.abstain.message and message.content is None
    assert done.choices[0].finish_reason == "stop"
    assert (done.choices[0].model_extra or {})["logtoku_guard"]["action"] == "abstain"


def test_sdk_plain_call_reads_the_decision_from_the_refusal_and_the_headers(guarded: Any) -> None:
    srv, backend, policy = guarded
    raw = sdk(srv).chat.completions.with_raw_response.create(
        model=backend.model_name, messages=[{"role": "user", "content": QUESTION}], max_tokens=8, logprobs=True
    )
    assert raw.headers["x-logtoku-action"] == "abstain" and raw.headers["x-logtoku-rule"] == "always"
    r = raw.parse()
    assert r.choices[0].message.refusal == policy.abstain.message
    assert r.choices[0].logprobs is not None and r.choices[0].logprobs.content == []


def test_sdk_stream_helper_gathers_the_refusal_deltas(guarded: Any) -> None:
    srv, backend, policy = guarded
    with sdk(srv).chat.completions.stream(
        model=backend.model_name, messages=[{"role": "user", "content": QUESTION}], response_format=Campus, max_tokens=40
    ) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_completion()
    assert "refusal.delta" in kinds and "refusal.done" in kinds and "content.delta" not in kinds
    assert final.choices[0].message.refusal == policy.abstain.message and final.choices[0].message.parsed is None


# -- langchain-openai's ChatOpenAI ---------------------------------------------------------------
@pytest.fixture(scope="module")
def chat_openai(guarded: Any) -> Any:
    pytest.importorskip("langchain_openai")
    from langchain_openai import ChatOpenAI

    srv, backend, _ = guarded
    return ChatOpenAI(base_url=srv.base_url, api_key=KEY, model=backend.model_name, max_tokens=40, max_retries=0)


@pytest.mark.parametrize("method", ["json_schema", "function_calling", "json_mode"])
def test_chat_openai_structured_output_raises_its_refusal_error(chat_openai: Any, guarded: Any, method: str) -> None:
    from langchain_openai.chat_models.base import OpenAIRefusalError

    _, _, policy = guarded
    with pytest.raises(OpenAIRefusalError) as info:
        chat_openai.with_structured_output(Campus, method=method).invoke(QUESTION)
    assert policy.abstain.message in str(info.value)
    result = chat_openai.with_structured_output(Campus, method=method, include_raw=True).invoke(QUESTION)
    assert result["parsed"] is None and isinstance(result["parsing_error"], OpenAIRefusalError)
    assert result["raw"].additional_kwargs["refusal"] == policy.abstain.message


def test_chat_openai_message_carries_the_decision(chat_openai: Any, guarded: Any) -> None:
    _, _, policy = guarded
    withheld = chat_openai.invoke(QUESTION)
    assert withheld.additional_kwargs["refusal"] == policy.abstain.message and withheld.content == ""
    assert withheld.response_metadata["finish_reason"] == "stop"
    with_headers = chat_openai.model_copy(update={"include_response_headers": True}).invoke(QUESTION)
    headers = with_headers.response_metadata["headers"]
    assert headers["x-logtoku-action"] == "abstain" and headers["x-logtoku-withheld"] == "true"


def test_uqlm_extraction_reads_the_withheld_answers_logprobs(chat_openai: Any) -> None:
    """UQLM 0.6.7's ``ResponseGenerator._extract_logprobs`` and its single-generation scorers, as written
    there, on the message ChatOpenAI returns for a withheld answer: no TypeError; the scores are NaN
    (no token), as UQLM scores an answer without logprobs."""
    result = asyncio.run(chat_openai.ainvoke(QUESTION, logprobs=True, top_logprobs=5))
    # -- uqlm/utils/response_generator.py:262-279 (0.6.7) ---------------------------------------
    logprobs: list[Any] = [None]
    for i in range(1):
        if "logprobs_result" in result.response_metadata:
            logprobs[i] = result.response_metadata["logprobs_result"]
        elif "logprobs" in result.response_metadata:
            raw = result.response_metadata["logprobs"]
            if "token_logprobs" in raw:  # the line that raised TypeError on a null
                top_lp_list = raw.get("top_logprobs", [])
                if len(top_lp_list) != len(raw["token_logprobs"]):
                    top_lp_list = [None] * len(raw["token_logprobs"])
                logprobs[i] = [
                    {
                        "token": t,
                        "logprob": lp,
                        "top_logprobs": [] if tlp is None else [{"token": a, "logprob": b} for a, b in tlp.items()],
                    }
                    for t, lp, tlp in zip(raw["tokens"], raw["token_logprobs"], top_lp_list)
                ]
            elif "content" in raw:
                logprobs[i] = raw["content"]
        else:
            warnings.warn("no logprobs", stacklevel=1)
            logprobs[i] = [{"token": "UNABLE TO GET LOGPROBS", "logprob": math.nan, "top_logprobs": []}]
    # -- uqlm/white_box/baseclass/logprobs_scorer.py: _compute_single_generation_scores ----------
    scores = [math.nan if not r else min(math.exp(d["logprob"]) for d in r) for r in logprobs]
    assert logprobs == [[]] and math.isnan(scores[0])


def test_uqlm_extraction_reads_a_passed_answers_logprobs(tiny_tokenizer: Any) -> None:
    """The same extraction on a guard that passes: every token's log-probability, every score in [0, 1]."""
    pytest.importorskip("langchain_openai")
    from langchain_openai import ChatOpenAI
    from support.served import tiny_served

    rule = {"name": "never", "when": {"stat": "reliability", "op": "<", "value": -1e9}, "action": "abstain"}
    policy = Policy.from_dict({"name": "pass-all", "rules": [rule]})
    with BackgroundServer(build_app(tiny_served(tiny_tokenizer), policy=policy)) as srv:
        llm = ChatOpenAI(base_url=srv.base_url, api_key="x", model="tiny", max_tokens=8, max_retries=0, temperature=0)
        result = llm.invoke(QUESTION, logprobs=True, top_logprobs=5)
    raw = result.response_metadata["logprobs"]
    assert "token_logprobs" not in raw and "content" in raw
    probs = [math.exp(d["logprob"]) for d in raw["content"]]
    assert len(probs) == 8 and all(0 <= p <= 1 for p in probs)


# -- LlamaIndex's OpenAILike ---------------------------------------------------------------------
def test_llamaindex_keeps_the_refusal_and_the_decision_in_raw(guarded: Any) -> None:
    pytest.importorskip("llama_index.llms.openai_like")
    from llama_index.core.llms import ChatMessage
    from llama_index.llms.openai_like import OpenAILike

    srv, backend, policy = guarded
    llm = OpenAILike(
        api_base=srv.base_url, api_key=KEY, model=backend.model_name, is_chat_model=True, max_tokens=8, max_retries=0
    )
    out = llm.chat([ChatMessage(role="user", content=QUESTION)])
    raw = out.raw if isinstance(out.raw, dict) else out.raw.model_dump()
    choice = raw["choices"][0]
    assert choice["message"]["refusal"] == policy.abstain.message and choice["logtoku_guard"]["action"] == "abstain"
    assert not out.message.content  # the refusal is not presented as the model's answer
    json.dumps(raw, default=str)


# -- the default policy on the embedded model ----------------------------------------------------
@pytest.mark.slow
def test_the_default_policy_abstains_on_an_invented_question_as_a_refusal() -> None:
    """The issue's case, as a user meets it: ``serve`` (embedded model on llama.cpp, its shipped profile,
    the default policy), an invented question, structured output: the SDK's ``.parse()`` gives
    ``parsed=None`` and the policy's message as the refusal, and ChatOpenAI raises its refusal error."""
    pytest.importorskip("langchain_openai")
    from langchain_openai import ChatOpenAI
    from langchain_openai.chat_models.base import OpenAIRefusalError
    from support.served import llamacpp_served

    from logtoku_guard.calibration import load_profile_for
    from logtoku_guard.decision.policy import default_policy

    backend = llamacpp_served(n_ctx=2048, max_batch=2)
    policy = default_policy()
    question = "In which year did the Zorblax Institute of Quantum Pastry open its third campus, and in which city?"
    try:
        app = build_app(backend, policy=policy, profile=load_profile_for(backend.model_name))
        with BackgroundServer(app) as srv:
            done = sdk(srv).chat.completions.parse(
                model=backend.model_name,
                messages=[{"role": "user", "content": question}],
                response_format=Campus,
                max_tokens=40,
                temperature=0,
            )
            llm = ChatOpenAI(base_url=srv.base_url, api_key="x", model=backend.model_name, max_tokens=40, temperature=0)
            with pytest.raises(OpenAIRefusalError, match=policy.abstain.message):
                llm.with_structured_output(Campus, method="json_schema").invoke(question)
    finally:
        backend.close()
    choice = done.choices[0]
    decision = (choice.model_extra or {})["logtoku_guard"]
    assert decision["action"] == "abstain" and decision["rule"] is not None
    assert choice.message.parsed is None and choice.message.refusal == policy.abstain.message and choice.finish_reason == "stop"
