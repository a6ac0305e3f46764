"""Clients people already use: UQLM's logprobs access, FlareChain's token reading, LlamaIndex logprobs.

UQLM (white-box scorers) and LangChain's FlareChain (``langchain-classic``) are not installed
here: these tests make the very calls and reads they make on a ``ChatLogTokU``.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

pytest.importorskip("langchain_core")

from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate

from langchain_logtoku import ChatLogTokU
from logtoku_guard import ConfigurationError, ScriptedAnswer, ScriptedBackend


@pytest.fixture
def tiny_model(tiny_backend: Any) -> ChatLogTokU:
    return ChatLogTokU(backend=tiny_backend, max_tokens=5, logtoku_profile=None)


def test_top_logprobs_15_keeps_k_and_scores(tiny_model: ChatLogTokU) -> None:
    plain = tiny_model.invoke("What is the capital of France?")
    wide = tiny_model.invoke("What is the capital of France?", logprobs=True, top_logprobs=15)
    content = wide.response_metadata["logprobs"]["content"]
    assert content and all(len(item["top_logprobs"]) == 15 for item in content)
    assert wide.response_metadata["logtoku"]["k"] == 2
    same = [(t["au"], t["eu"], t["top_logits"]) for t in plain.response_metadata["logtoku"]["tokens"]]
    assert same == [(t["au"], t["eu"], t["top_logits"]) for t in wide.response_metadata["logtoku"]["tokens"]]
    for item in content:  # the alternatives are log-probabilities, largest first, the chosen token's among them
        values = [alt["logprob"] for alt in item["top_logprobs"]]
        assert values == sorted(values, reverse=True) and all(v <= 1e-6 for v in values)
        assert sum(math.exp(v) for v in values) <= 1 + 1e-6 and item["logprob"] in values


def test_more_than_the_capacity_names_both_knobs(tiny_model: ChatLogTokU) -> None:
    with pytest.raises(ConfigurationError, match=r"max_logprobs=20.*K=2, top_k"):
        tiny_model.invoke("hi", top_logprobs=21)


@pytest.mark.asyncio
async def test_uqlm_style_access(tiny_model: ChatLogTokU) -> None:
    """UQLM sets ``llm.logprobs = True`` and calls ``ainvoke(..., logprobs=True, top_logprobs=15)``."""
    tiny_model.logprobs = True
    result = await tiny_model.ainvoke([("user", "Count from one to ten.")], logprobs=True, top_logprobs=15)
    logprobs = result.response_metadata["logprobs"]["content"]  # what UQLM reads
    assert logprobs and all(len(t["top_logprobs"]) == 15 and isinstance(t["logprob"], float) for t in logprobs)
    assert all(not math.isnan(alt["logprob"]) for t in logprobs for alt in t["top_logprobs"])


def _flare_extract(response: Any) -> tuple[list[str], list[float]]:
    """langchain_classic.chains.flare.base._extract_tokens_and_log_probs, verbatim in behaviour."""
    tokens, log_probs = [], []
    for token in response.response_metadata["logprobs"]["content"]:
        tokens.append(token["token"])
        log_probs.append(token["logprob"])
    return tokens, log_probs


def test_flare_chain_response_shape_without_from_llm() -> None:
    """FlareChain(question_generator_chain=prompt | llm | StrOutputParser(),
    response_chain=prompt | llm.bind(logprobs=True), retriever=...)."""
    llm = ChatLogTokU(backend=ScriptedBackend([ScriptedAnswer(["Elena", " Marwick"], [[9.0, 0.1], [1.0, 0.9]])] * 2))
    prompt = ChatPromptTemplate.from_template("{user_input}\n{context}\n{response}")
    response_chain = prompt | llm.bind(logprobs=True)
    question_chain = prompt | llm | StrOutputParser()
    response = response_chain.invoke({"user_input": "Who founded it?", "context": "", "response": ""})
    tokens, log_probs = _flare_extract(response)
    assert "".join(tokens) == response.content and log_probs[0] > log_probs[1]  # the unsure token is the low one
    assert question_chain.invoke({"user_input": "q", "context": "", "response": ""}) == "Elena Marwick"


def test_llamaindex_logprobs_alternatives(tiny_backend: Any) -> None:
    pytest.importorskip("llama_index.core")
    from llama_index.llms.logtoku import LogTokULLM

    llm = LogTokULLM(backend=tiny_backend, max_new_tokens=4)
    plain = llm.complete("What is the capital of France?")
    wide = llm.complete("What is the capital of France?", top_logprobs=5)
    assert plain.logprobs and all(len(t) == 1 for t in plain.logprobs)
    assert all(len(t) == 5 for t in wide.logprobs)
    assert [t[0].token for t in wide.logprobs] == [t[0].token for t in plain.logprobs]  # the chosen token first
