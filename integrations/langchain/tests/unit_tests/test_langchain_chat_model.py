"""ChatLogTokU: metadata, streaming merge, logprobs, usage, stop, call arguments, messages.

Fast tests run on the scripted backend or the tiny random model of the root ``conftest.py``;
``slow`` ones on the embedded model.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest

pytest.importorskip("langchain_core")

from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    ChatMessage,
    FunctionMessage,
    HumanMessage,
    SystemMessage,
)
from pydantic import ValidationError

from langchain_logtoku import ChatLogTokU
from logtoku_guard import ConfigurationError, InvalidPromptError, ScriptedAnswer, ScriptedBackend
from logtoku_guard.calibration import build_profile
from logtoku_guard.scoring.uncertainty import rescore
from logtoku_guard.types import DecodingOptions

ANSWER = ScriptedAnswer(
    ["The", " answer", " is", " 42", "."],
    [[6.0, 1.0, 0.5], [3.0, 2.9, 0.1], [4.0, 0.2, 0.1], [1.0, 0.8, 0.7], [5.0, 0.1, 0.0]],
)


class RecordingBackend(ScriptedBackend):
    """A scripted backend that also records the decoding options of each call."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.options: list[DecodingOptions] = []

    def generate(self, prompt: Any, options: DecodingOptions | None = None) -> Any:
        self.options.append(options or DecodingOptions())
        return super().generate(prompt, options)

    def stream(self, prompt: Any, options: DecodingOptions | None = None) -> Any:
        self.options.append(options or DecodingOptions())
        return super().stream(prompt, options)


def scripted(answer: ScriptedAnswer = ANSWER, k: int = 2, **kwargs: Any) -> RecordingBackend:
    return RecordingBackend(lambda _messages: answer, k=k, **kwargs)


def aggregate(chunks: list[AIMessageChunk]) -> AIMessageChunk:
    full = chunks[0]
    for c in chunks[1:]:
        full = full + c
    return full


# -- metadata ------------------------------------------------------------------------------
def test_invoke_metadata_has_per_token_items_and_summary() -> None:
    llm = ChatLogTokU(backend=scripted(), logtoku_profile=None)
    msg = llm.invoke("What is the answer?")
    assert isinstance(msg, AIMessage)
    assert msg.content == "The answer is 42."
    meta = msg.response_metadata
    assert meta["model_name"] == "scripted"
    assert meta["finish_reason"] == "stop"
    tokens = meta["logtoku"]["tokens"]
    assert [t["token"] for t in tokens] == ["The", " answer", " is", " 42", "."]
    assert set(tokens[0]) == {"index", "token", "id", "au", "eu", "quadrant", "logprob", "entropy", "top_logits"}
    expected = rescore([r[:2] for r in ANSWER.top_logits])
    assert [t["au"] for t in tokens] == pytest.approx(list(expected.au))
    assert [t["eu"] for t in tokens] == pytest.approx(list(expected.eu))
    assert all(t["quadrant"] is None for t in tokens)  # no profile: no quadrant thresholds
    summary = meta["logtoku"]
    assert summary["k"] == 2 and summary["n_tokens"] == 5 and summary["evidence"] == "clamped"
    assert summary["reliability"] == pytest.approx(-float((expected.au * expected.eu).mean()))
    assert summary["quadrant_shares"] is None and summary["thresholds"] is None
    assert msg.usage_metadata == {"input_tokens": 0, "output_tokens": 5, "total_tokens": 5}
    assert "logprobs" not in meta


@pytest.mark.parametrize("kwargs", [{}, {"logprobs": True}, {"top_logprobs": 2}, {"stop": ["42"]}, {"max_tokens": 3}])
def test_aggregated_stream_ends_with_the_invoke_metadata(kwargs: dict[str, Any]) -> None:
    llm = ChatLogTokU(backend=scripted(), logtoku_profile=None)
    stop = kwargs.pop("stop", None)
    msg = llm.invoke("q", stop=stop, **kwargs)
    chunks = list(llm.stream("q", stop=stop, **kwargs))
    full = aggregate(chunks)
    assert full.content == msg.content
    assert full.response_metadata == msg.response_metadata
    assert full.usage_metadata == msg.usage_metadata


def test_each_chunk_carries_only_its_token_and_the_last_one_the_scalars() -> None:
    llm = ChatLogTokU(backend=scripted(), logprobs=True, logtoku_profile=None)
    chunks = list(llm.stream("q"))
    *token_chunks, last = chunks
    assert len(token_chunks) == 5
    for c in token_chunks:
        assert set(c.response_metadata) == {"logtoku", "logprobs"}
        assert list(c.response_metadata["logtoku"]) == ["tokens"] and len(c.response_metadata["logtoku"]["tokens"]) == 1
        assert len(c.response_metadata["logprobs"]["content"]) == 1
        assert c.usage_metadata is None and c.chunk_position is None
    assert last.content == "" and last.chunk_position == "last"
    assert "tokens" not in last.response_metadata["logtoku"] and "logprobs" not in last.response_metadata
    assert last.usage_metadata == {"input_tokens": 0, "output_tokens": 5, "total_tokens": 5}


def test_empty_answer_streams_the_same_metadata_as_invoke() -> None:
    llm = ChatLogTokU(backend=scripted(ScriptedAnswer([], [])), logprobs=True, logtoku_profile=None)
    msg = llm.invoke("q")
    full = aggregate(list(llm.stream("q")))
    assert msg.content == "" and msg.response_metadata["logtoku"]["tokens"] == []
    assert msg.response_metadata["logtoku"]["reliability"] is None  # undefined: JSON null, not NaN
    assert full.response_metadata == msg.response_metadata


def test_quadrants_and_shares_come_from_the_profile() -> None:
    backend = scripted()
    profile = build_profile([backend.generate("q"), backend.generate("q")], source="test")
    llm = ChatLogTokU(backend=backend, logtoku_profile=profile)
    meta = llm.invoke("q").response_metadata["logtoku"]
    thresholds = profile.quadrant_thresholds()
    assert meta["thresholds"] == {"au": thresholds.au, "eu": thresholds.eu, "source": thresholds.source}
    labels = [t["quadrant"] for t in meta["tokens"]]
    assert labels == [thresholds.classify(t["au"], t["eu"]).value for t in meta["tokens"]]
    assert sum(meta["quadrant_shares"].values()) == pytest.approx(1.0)
    assert meta["quadrant_shares"]["II"] == pytest.approx(labels.count("II") / 5)


def test_a_profile_of_another_model_gives_no_quadrants() -> None:
    other = scripted(model_name="other")
    profile = build_profile([other.generate("q")], source="test")
    llm = ChatLogTokU(backend=scripted(), logtoku_profile=profile)
    assert llm.invoke("q").response_metadata["logtoku"]["thresholds"] is None


# -- logprobs (a real tokenizer and real ids: the tiny model) ---------------------------------
def test_openai_logprobs_follow_the_full_softmax(tiny_backend: Any, tiny_tokenizer: Any) -> None:
    import torch

    from logtoku_guard.backends.transformers import TransformersBackend

    model = tiny_backend.model
    backend = TransformersBackend("tiny", k=4, model_obj=model, tokenizer=tiny_tokenizer)
    llm = ChatLogTokU(backend=backend, top_logprobs=3, max_tokens=6, logtoku_profile=None)
    msg = llm.invoke("What is the capital of France?")
    content = msg.response_metadata["logprobs"]["content"]
    assert len(content) == len(msg.response_metadata["logtoku"]["tokens"]) > 0
    # independent check: one forward pass over prompt + answer, full log-softmax per step
    prompt_ids = tiny_tokenizer(backend.render("What is the capital of France?"), add_special_tokens=False)["input_ids"]
    answer_ids = [t["id"] for t in msg.response_metadata["logtoku"]["tokens"]]
    with torch.no_grad():
        logits = model(torch.tensor([prompt_ids + answer_ids])).logits[0].float()
    log_probs = logits.log_softmax(-1)[len(prompt_ids) - 1 : len(prompt_ids) - 1 + len(answer_ids)]
    for step, (item, tid) in enumerate(zip(content, answer_ids)):
        assert set(item) == {"token", "logprob", "bytes", "top_logprobs"}
        assert item["bytes"] == list(item["token"].encode("utf-8"))
        assert item["logprob"] == pytest.approx(float(log_probs[step, tid]), abs=1e-4)
        tops = item["top_logprobs"]
        assert len(tops) == 3
        values, ids = log_probs[step].topk(3)
        assert [t["logprob"] for t in tops] == pytest.approx(values.tolist(), abs=1e-4)
        # the chosen token keeps its streamed text (empty for an incomplete UTF-8 piece)
        assert [t["token"] for t in tops] == [item["token"] if i == tid else tiny_tokenizer.decode([i]) for i in ids.tolist()]
        assert tops[0]["logprob"] == pytest.approx(item["logprob"], abs=1e-6)  # greedy: the chosen token is top-1


def test_top_logprobs_beyond_the_stored_logits_is_refused() -> None:
    with pytest.raises(ValidationError, match=r"top_logprobs=3 but only max_logprobs=2 .*K=2.*max_logprobs=3"):
        ChatLogTokU(backend=scripted(), top_logprobs=3)
    llm = ChatLogTokU(backend=scripted())
    with pytest.raises(ConfigurationError, match="top_logprobs=5"):
        llm.invoke("q", top_logprobs=5)


# -- call arguments ---------------------------------------------------------------------------
def test_fields_and_call_arguments_become_decoding_options() -> None:
    backend = scripted()
    llm = ChatLogTokU(backend=backend, temperature=0.7, top_p=0.9, max_tokens=10, seed=3, stop=["zzz"])
    llm.invoke("q")
    assert backend.options[-1] == DecodingOptions(max_new_tokens=10, temperature=0.7, top_p=0.9, seed=3, stop=("zzz",))
    llm.invoke("q", temperature=0.0, max_tokens=2, seed=5, top_p=0.5, stop=["x"])
    assert backend.options[-1] == DecodingOptions(max_new_tokens=2, temperature=0.0, top_p=0.5, seed=5, stop=("x",))
    list(llm.stream("q", max_tokens=4))
    assert backend.options[-1].max_new_tokens == 4


def test_stop_sequences_cut_the_answer() -> None:
    llm = ChatLogTokU(backend=scripted(), stop=[" is"])
    msg = llm.invoke("q")
    assert msg.content == "The answer"
    assert msg.response_metadata["finish_reason"] == "stop" and msg.response_metadata["stop_sequence"] == " is"
    assert msg.usage_metadata["output_tokens"] == 2
    per_call = llm.invoke("q", stop=["42"])
    assert per_call.content == "The answer is "


def test_max_tokens_gives_finish_reason_length_and_usage() -> None:
    msg = ChatLogTokU(backend=scripted()).invoke("q", max_tokens=3)
    assert msg.content == "The answer is"
    assert msg.response_metadata["finish_reason"] == "length"
    assert msg.usage_metadata == {"input_tokens": 0, "output_tokens": 3, "total_tokens": 3}


def test_per_call_top_k_rescores_the_stored_logits() -> None:
    backend = scripted(k=3)
    llm = ChatLogTokU(backend=backend, logtoku_profile=None)
    k3 = llm.invoke("q").response_metadata["logtoku"]
    k2 = llm.invoke("q", top_k=2).response_metadata["logtoku"]
    expected = rescore(ANSWER.top_logits, k=2)
    assert k3["k"] == 3 and k2["k"] == 2
    assert [t["eu"] for t in k2["tokens"]] == pytest.approx(list(expected.eu))
    assert [t["eu"] for t in k3["tokens"]] != pytest.approx(list(expected.eu))
    assert aggregate(list(llm.stream("q", top_k=2))).response_metadata["logtoku"] == k2
    assert ChatLogTokU(backend=backend, top_k=2).invoke("q").response_metadata["logtoku"]["k"] == 2
    with pytest.raises(ConfigurationError, match="top_k=4 exceeds the backend's K=3"):
        llm.invoke("q", top_k=4)


def test_unknown_and_unsupported_call_arguments_are_errors() -> None:
    llm = ChatLogTokU(backend=scripted())
    with pytest.raises(ConfigurationError, match=r"unknown call argument\(s\) \['temprature'\]"):
        llm.invoke("q", temprature=0.5)
    with pytest.raises(ConfigurationError, match="a tool needs a name"):  # tools: tests/.../test_tool_calling.py
        llm.invoke("q", tools=[{"type": "function"}])
    with pytest.raises(NotImplementedError, match="function calling"):
        llm.invoke("q", functions=[{"name": "f"}])
    with pytest.raises(ConfigurationError, match="per call is not supported"):
        llm.invoke("q", model="gpt-4o")
    assert llm.invoke("q", model="scripted").content  # naming the served model is fine


def test_init_is_validated_and_lazy() -> None:
    llm = ChatLogTokU()  # the embedded model: nothing loaded yet
    assert llm.model_name == "smollm2-135m-instruct" and llm._built is None
    assert llm._identifying_params["model_name"] == "smollm2-135m-instruct" and llm._built is None
    with pytest.raises(ValidationError, match="temperature must be >= 0"):
        ChatLogTokU(temperature=-1)
    with pytest.raises(ValidationError, match="max_new_tokens must be a positive integer"):
        ChatLogTokU(max_tokens=0)
    with pytest.raises(ValidationError, match="not both"):
        ChatLogTokU(backend=scripted(), model="/some/folder")
    with pytest.raises(ValidationError, match="top_k=3 exceeds the backend's K=2"):
        ChatLogTokU(backend=scripted(), top_k=3)
    with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
        ChatLogTokU(temprature=0.5)
    with pytest.raises(ValidationError, match="must be a logtoku_guard backend"):
        ChatLogTokU(backend=object())


def test_tracing_params() -> None:
    llm = ChatLogTokU(backend=scripted(), temperature=0.2, max_tokens=12, stop=["\n"])
    assert llm._get_ls_params() == {
        "ls_provider": "logtoku",
        "ls_model_name": "scripted",
        "ls_model_type": "chat",
        "ls_temperature": 0.2,
        "ls_max_tokens": 12,
        "ls_stop": ["\n"],
    }
    assert llm._get_ls_params(model="other", max_tokens=3)["ls_model_name"] == "other"
    assert ChatLogTokU()._get_ls_params()["ls_provider"] == "huggingface"
    assert llm._identifying_params == {
        "model_name": "scripted",
        "top_k": 2,
        "evidence": "clamped",
        "temperature": 0.2,
        "top_p": 1.0,
        "max_tokens": 12,
        "seed": None,
    }


# -- messages ---------------------------------------------------------------------------------
def test_multi_turn_messages_reach_the_backend_as_chat_turns() -> None:
    backend = scripted()
    llm = ChatLogTokU(backend=backend)
    llm.invoke(
        [
            SystemMessage("Be brief."),
            HumanMessage("hello", name="alice"),
            AIMessage("hi"),
            ChatMessage(role="user", content=[{"type": "text", "text": "how "}, "are you"]),
        ]
    )
    turns = [(m.role, m.content) for m in backend.calls[-1]]
    assert turns == [("system", "Be brief."), ("user", "hello"), ("assistant", "hi"), ("user", "how are you")]


def test_messages_the_model_cannot_read_are_refused() -> None:
    llm = ChatLogTokU(backend=scripted())
    with pytest.raises(InvalidPromptError, match="no legacy function messages"):  # tool messages: test_tool_calling.py
        llm.invoke([HumanMessage("q"), FunctionMessage("42", name="f")])
    with pytest.raises(InvalidPromptError, match="reads text only"):
        llm.invoke([HumanMessage(content=[{"type": "image", "url": "https://x/y.png"}])])
    with pytest.raises(InvalidPromptError, match="empty"):
        llm.invoke("   ")


def test_batch_and_token_ids(tiny_backend: Any) -> None:
    llm = ChatLogTokU(backend=tiny_backend, max_tokens=3)
    out = llm.batch(["one", "two"])
    assert len(out) == 2 and all(m.response_metadata["model_name"] == "tiny" for m in out)
    assert (
        llm.get_token_ids("Paris is a city") == tiny_backend.tokenizer("Paris is a city", add_special_tokens=False)["input_ids"]
    )


async def test_async_invoke_stream_and_batch() -> None:
    llm = ChatLogTokU(backend=scripted(), logtoku_profile=None)
    msg = await llm.ainvoke("q")
    chunks = [c async for c in llm.astream("q")]
    assert aggregate(chunks).response_metadata == msg.response_metadata
    assert [m.content for m in await llm.abatch(["a", "b"])] == [msg.content, msg.content]


test_async_invoke_stream_and_batch = pytest.mark.asyncio(test_async_invoke_stream_and_batch)


# -- the embedded model -----------------------------------------------------------------------
def _untimed(metadata: dict[str, Any]) -> dict[str, Any]:
    """The metadata without the wall-clock timings (two real generations never take the same time)."""
    return {**metadata, "logtoku": {k: v for k, v in metadata["logtoku"].items() if k != "timings"}}


@pytest.mark.slow
def test_embedded_invoke_and_stream_agree(embedded_backend: Any) -> None:
    llm = ChatLogTokU(backend=embedded_backend, max_tokens=16, top_logprobs=2)
    msg = llm.invoke([SystemMessage("Answer in one short sentence."), HumanMessage("What is the capital of France?")])
    full = aggregate(
        list(llm.stream([SystemMessage("Answer in one short sentence."), HumanMessage("What is the capital of France?")]))
    )
    assert "Paris" in msg.content
    assert full.content == msg.content and _untimed(full.response_metadata) == _untimed(msg.response_metadata)
    assert full.usage_metadata == msg.usage_metadata and msg.usage_metadata["input_tokens"] > 10
    tokens = msg.response_metadata["logtoku"]["tokens"]
    assert all(math.isfinite(t["au"]) and math.isfinite(t["eu"]) for t in tokens)
    content = msg.response_metadata["logprobs"]["content"]
    assert all(
        len(c["top_logprobs"]) == 2 and c["top_logprobs"][0]["logprob"] >= c["top_logprobs"][1]["logprob"] for c in content
    )
    if msg.response_metadata["logtoku"]["thresholds"] is not None:  # the calibration profile is in the cache
        assert {t["quadrant"] for t in tokens} <= {"I", "II", "III", "IV"}


def test_rescored_tokens_keep_their_other_fields() -> None:
    llm = ChatLogTokU(backend=scripted(k=3))
    g = scripted(k=3).generate("q")
    call = llm._call(None, {"top_k": 2})
    t = llm.rescored(g.tokens[0], call)
    assert dataclasses.replace(t, au=g.tokens[0].au, eu=g.tokens[0].eu) == g.tokens[0]
