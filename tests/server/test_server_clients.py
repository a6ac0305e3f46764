"""Real third-party clients against the real server on 127.0.0.1: the official ``openai`` SDK,
``langchain-openai``'s ``ChatOpenAI`` and LlamaIndex's ``OpenAILike`` (test dependencies only).

Each is driven as a team would: plain, streaming, log-probabilities (checked against OpenAI's
meaning: every value <= 0, the alternatives' probabilities sum to at most 1), tools, structured
output, errors, the ``developer`` role; and each sees a guarded abstention with nothing of the
withheld draft anywhere in what it returns.
"""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("llguidance")
openai = pytest.importorskip("openai")

from logtoku_guard.backends.fake import ScriptedAnswer, ScriptedBackend  # noqa: E402
from logtoku_guard.decision.policy import Policy  # noqa: E402
from logtoku_guard.server import BackgroundServer, ServerSettings, build_app  # noqa: E402

KEY = "client-key"
WEATHER = {
    "type": "function",
    "function": {
        "name": "weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}}, "required": ["city"]},
    },
}
CITY_SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 12}, "rank": {"type": "integer", "minimum": 0, "maximum": 9}},
    "required": ["city", "rank"],
    "additionalProperties": False,
}
DRAFT = ["The", " Zorblaxian", " Institute", " was", " founded", " by", " Quintessa", " Velmoraq", "."]
SECRETS = ("Zorblaxian", "Quintessa", "Velmoraq")


@pytest.fixture(scope="module")
def served(tiny_tokenizer: Any) -> Any:
    from support.tiny import make_model

    from logtoku_guard.backends.transformers import TransformersBackend

    backend = TransformersBackend("tiny", model_obj=make_model(tiny_tokenizer, max_positions=1024), tokenizer=tiny_tokenizer)
    with BackgroundServer(build_app(backend, settings=ServerSettings(api_key=KEY))) as srv:
        yield srv, backend


@pytest.fixture(scope="module")
def abstaining() -> Any:
    backend = ScriptedBackend(lambda m: ScriptedAnswer(DRAFT, [[9.0, 8.5, 1.0]] * len(DRAFT)), model_name="scripted")
    rule = {"name": "always", "when": {"stat": "reliability", "op": "<", "value": 1e9}, "action": "abstain"}
    policy = Policy.from_dict({"name": "abstain", "rules": [rule]})
    with BackgroundServer(build_app(backend, policy=policy, settings=ServerSettings(api_key=KEY))) as srv:
        yield srv, policy


def check_logprobs(entries: list[Any]) -> None:
    assert entries
    for entry in entries:
        assert entry.logprob <= 0
        tops = [t.logprob for t in entry.top_logprobs]
        assert tops and all(v <= 0 for v in tops) and sum(math.exp(v) for v in tops) <= 1 + 1e-6


def no_secret(text: str) -> None:
    for word in SECRETS:
        assert word not in text, word


# -- the official openai SDK ---------------------------------------------------------------------
def test_openai_sdk(served: Any) -> None:
    srv, backend = served
    client = openai.OpenAI(base_url=srv.base_url, api_key=KEY, max_retries=0)
    base: dict[str, Any] = {"model": backend.model_name, "max_tokens": 8, "temperature": 0}
    hi = [{"role": "developer", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    plain = client.chat.completions.create(messages=hi, logprobs=True, top_logprobs=20, **base)
    assert plain.choices[0].message.content and plain.usage is not None and plain.usage.completion_tokens == 8
    check_logprobs(plain.choices[0].logprobs.content)  # type: ignore[union-attr]
    assert len(plain.choices[0].logprobs.content[0].top_logprobs) == 20  # type: ignore[union-attr]
    chunks = list(client.chat.completions.create(messages=hi, stream=True, stream_options={"include_usage": True}, **base))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == plain.choices[0].message.content
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 8
    called = client.chat.completions.create(
        messages=[{"role": "user", "content": "Weather in Paris?"}],
        tools=[WEATHER],
        tool_choice="required",
        **{**base, "max_tokens": 120},
    )
    (call,) = called.choices[0].message.tool_calls or []
    assert called.choices[0].finish_reason == "tool_calls" and call.function.name == "weather"  # type: ignore[union-attr]
    assert isinstance(json.loads(call.function.arguments)["city"], str)  # type: ignore[union-attr]
    shaped = client.chat.completions.create(
        messages=[{"role": "user", "content": "A city?"}],
        response_format={"type": "json_schema", "json_schema": {"name": "city", "schema": CITY_SCHEMA, "strict": True}},
        **{**base, "max_tokens": 120},
    )
    data = json.loads(shaped.choices[0].message.content or "")
    assert set(data) == {"city", "rank"} and 0 <= data["rank"] <= 9
    with pytest.raises(openai.BadRequestError, match="top_logprobs=21"):
        client.chat.completions.create(messages=hi, logprobs=True, top_logprobs=21, **base)
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=srv.base_url, api_key="wrong", max_retries=0).chat.completions.create(messages=hi, **base)


def test_openai_sdk_sees_an_abstention_without_the_draft(abstaining: Any) -> None:
    srv, policy = abstaining
    client = openai.OpenAI(base_url=srv.base_url, api_key=KEY, max_retries=0)
    ask: dict[str, Any] = {"model": "scripted", "messages": [{"role": "user", "content": "Who founded it?"}], "max_tokens": 16}
    r = client.chat.completions.create(logprobs=True, top_logprobs=2, **ask)
    message = r.choices[0].message
    assert message.refusal == policy.abstain.message and message.content is None and r.choices[0].finish_reason == "stop"
    assert r.choices[0].logprobs is not None and r.choices[0].logprobs.content == []  # asked for: never null
    extra = r.choices[0].model_extra or {}
    assert extra["logtoku_guard"]["action"] == "abstain" and extra["logtoku_guard"]["withheld"] is True  # the README's read
    no_secret(r.model_dump_json())
    streamed = list(client.chat.completions.create(stream=True, logprobs=True, **ask))
    assert "".join(c.choices[0].delta.refusal or "" for c in streamed if c.choices) == policy.abstain.message
    no_secret(json.dumps([c.model_dump() for c in streamed]))


# -- LangChain's ChatOpenAI ----------------------------------------------------------------------
def test_langchain_chat_openai(served: Any, abstaining: Any) -> None:
    pytest.importorskip("langchain_openai")
    from langchain_openai import ChatOpenAI
    from pydantic import BaseModel, Field

    srv, backend = served
    llm = ChatOpenAI(base_url=srv.base_url, api_key=KEY, model=backend.model_name, max_tokens=8, temperature=0, max_retries=0)
    plain = llm.bind(logprobs=True, top_logprobs=5).invoke([("system", "Be brief."), ("human", "hi")])
    assert isinstance(plain.content, str) and plain.content
    lps = plain.response_metadata["logprobs"]["content"]
    assert all(e["logprob"] <= 0 for e in lps) and all(
        sum(math.exp(t["logprob"]) for t in e["top_logprobs"]) <= 1 + 1e-6 for e in lps
    )
    assert "".join(c.content for c in llm.stream("hi")) == llm.invoke("hi").content  # type: ignore[operator]
    tooled = ChatOpenAI(
        base_url=srv.base_url, api_key=KEY, model=backend.model_name, max_tokens=120, temperature=0, max_retries=0
    )
    called = tooled.bind_tools([WEATHER], tool_choice="required").invoke("Weather in Paris?")
    assert (
        called.tool_calls and called.tool_calls[0]["name"] == "weather" and isinstance(called.tool_calls[0]["args"]["city"], str)
    )  # type: ignore[attr-defined]

    class City(BaseModel):
        city: str = Field(max_length=12)
        rank: int = Field(ge=0, le=9)

    city = tooled.with_structured_output(City, method="json_schema").invoke("A city?")
    assert isinstance(city, City)
    asrv, policy = abstaining
    guarded = ChatOpenAI(base_url=asrv.base_url, api_key=KEY, model="scripted", max_tokens=16, max_retries=0)
    withheld = guarded.bind(logprobs=True).invoke("Who founded it?")
    assert (
        withheld.additional_kwargs["refusal"] == policy.abstain.message and withheld.response_metadata["finish_reason"] == "stop"
    )
    assert "logtoku_guard" not in withheld.response_metadata  # ChatOpenAI drops the extension (the README says so)
    no_secret(withheld.model_dump_json())
    no_secret(json.dumps([c.model_dump() for c in guarded.stream("Who founded it?")], default=str))


# -- LlamaIndex's OpenAILike ---------------------------------------------------------------------
def test_llamaindex_openai_like(served: Any, abstaining: Any) -> None:
    pytest.importorskip("llama_index.llms.openai_like")
    from llama_index.core.llms import ChatMessage
    from llama_index.llms.openai_like import OpenAILike

    srv, backend = served
    llm = OpenAILike(
        api_base=srv.base_url,
        api_key=KEY,
        model=backend.model_name,
        is_chat_model=True,
        max_tokens=8,
        temperature=0,
        max_retries=0,
    )
    chat = llm.chat(
        [ChatMessage(role="system", content="Be brief."), ChatMessage(role="user", content="hi")], logprobs=True, top_logprobs=3
    )
    assert chat.message.content
    assert chat.logprobs and all(lp.logprob <= 0 for entry in chat.logprobs for lp in entry)
    streamed = "".join(r.delta or "" for r in llm.stream_chat([ChatMessage(role="user", content="hi")]))
    assert streamed == llm.chat([ChatMessage(role="user", content="hi")]).message.content
    asrv, policy = abstaining
    guarded = OpenAILike(api_base=asrv.base_url, api_key=KEY, model="scripted", is_chat_model=True, max_tokens=16, max_retries=0)
    withheld = guarded.chat([ChatMessage(role="user", content="Who founded it?")])
    raw = withheld.raw if isinstance(withheld.raw, dict) else withheld.raw.model_dump()  # type: ignore[union-attr]
    assert raw["choices"][0]["message"]["refusal"] == policy.abstain.message  # the refusal, in .raw
    assert raw["choices"][0]["logtoku_guard"]["action"] == "abstain"  # OpenAILike keeps the extension in .raw
    no_secret(json.dumps(withheld.raw if isinstance(withheld.raw, dict) else withheld.raw.model_dump(), default=str))  # type: ignore[union-attr]
    no_secret(str(withheld))
