"""LangChain's shared standard tests (``langchain-tests``) for ChatLogTokU.

What the embedded SmolLM2-135M-Instruct cannot do is switched off through the suites' own
properties, never by skipping tests by hand:

- ``has_tool_calling``, ``has_tool_choice``, ``has_structured_output`` are True: ``bind_tools``
  works through SmolLM2's tool-call prompt and format (:mod:`langchain_logtoku.tools`), decoded
  under a grammar (a forced ``tool_choice`` always gives a well-formed call); the integration
  tests the 135M model still cannot pass are marked as expected failures at the end of this
  file (``_BEYOND_THE_MODEL``, each with the reason), never skipped.
- ``supports_json_mode = True``: ``with_structured_output(method="json_mode" | "json_schema")``
  decodes the answer under a JSON grammar (``function_calling``, the default, a forced tool call).
- image, audio, video, PDF and Anthropic-format inputs: a text-only model.
- ``supports_model_override = False``: one ChatLogTokU serves one loaded model; a per-call
  ``model=`` naming another is refused (traces still honour it in ``_get_ls_params``).
- ``returns_usage_metadata`` stays True (prompt and answer token counts are reported).

The unit suite never loads the model (the default backend is built lazily). The integration
suite runs on the embedded model, shared with the other slow tests, with ``max_tokens=96`` and
``max_string_length=48`` (room for a whole call of two capped strings).
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, ClassVar

import pytest

pytest.importorskip("langchain_tests")

from langchain_tests.integration_tests import ChatModelIntegrationTests
from langchain_tests.unit_tests import ChatModelUnitTests

from langchain_logtoku import ChatLogTokU

# The suites hold sync and async tests; pytest-asyncio runs the async ones (strict mode).
_ASYNC = [
    pytest.mark.asyncio,
    pytest.mark.filterwarnings("ignore:The test <Function .*> is marked with '@pytest.mark.asyncio' but it is not an async"),
]


class _Capabilities:
    """The suites' switches for what the model cannot do."""

    @property
    def chat_model_class(self) -> type[ChatLogTokU]:
        return ChatLogTokU

    @property
    def has_tool_calling(self) -> bool:
        return True

    @property
    def has_tool_choice(self) -> bool:
        return True

    @property
    def has_structured_output(self) -> bool:
        return True

    @property
    def supports_json_mode(self) -> bool:
        return True

    @property
    def supports_image_inputs(self) -> bool:
        return False

    @property
    def supports_image_urls(self) -> bool:
        return False

    @property
    def supports_pdf_inputs(self) -> bool:
        return False

    @property
    def supports_audio_inputs(self) -> bool:
        return False

    @property
    def supports_video_inputs(self) -> bool:
        return False

    @property
    def supports_image_tool_message(self) -> bool:
        return False

    @property
    def supports_pdf_tool_message(self) -> bool:
        return False

    @property
    def supports_anthropic_inputs(self) -> bool:
        return False

    @property
    def supports_model_override(self) -> bool:
        return False

    @property
    def returns_usage_metadata(self) -> bool:
        return True


class TestChatLogTokUUnit(_Capabilities, ChatModelUnitTests):
    pytestmark = _ASYNC

    @property
    def chat_model_params(self) -> dict[str, Any]:
        return {"model": "smollm2-135m-instruct", "device": "cpu"}


class TestChatLogTokUIntegration(_Capabilities, ChatModelIntegrationTests):
    pytestmark: ClassVar[list[Any]] = [pytest.mark.slow, *_ASYNC]
    _backend: Any = None

    @pytest.fixture(autouse=True)
    def _shared_backend(self, embedded_backend: Any) -> None:
        type(self)._backend = embedded_backend

    @property
    def chat_model_params(self) -> dict[str, Any]:
        return {"backend": self._backend, "max_tokens": 96, "max_string_length": 48}


class TestChatLogTokUIntegrationDefaults(TestChatLogTokUIntegration):
    """The same suite with ChatLogTokU's defaults (max_tokens=256, max_string_length=128): what a user
    calling ``with_structured_output`` or ``bind_tools`` without settings gets must parse too."""

    @property
    def chat_model_params(self) -> dict[str, Any]:
        return {"backend": self._backend}


# -- what the 135M model itself cannot do -----------------------------------------------------
# Tool calls and structured output are decoded under a grammar (langchain_logtoku._structured),
# in SmolLM2's trained tool-call format, with every string the schema leaves unbounded capped at
# max_string_length=48 characters: so with a forced tool_choice, and for every structured-output
# and JSON-mode test, the model emits well-formed JSON that ends (measured: the 135M model, greedy,
# loops inside a string, '"setup": "I'm a cat, I'm a cat, I'm a cat, I'm a cat, I'm-"', and the
# cap closes it; without it the answer ran to max_tokens). What no prompt or grammar gives is the
# decision to call a tool: with tool_choice="auto" the model answers in prose
# (benchmarks/tool_calls/RESULTS.md: 0/10 calls started on prompts that need a tool; its
# probability of opening a call is about 1%). That test is an expected failure, not a skip: an
# XPASS is reported if a model ever passes it.
_BEYOND_THE_MODEL: dict[str, str] = {
    "test_agent_loop": (
        "with tool_choice='auto' the 135M model answers in prose ('The weather in San Francisco, CA, is typically "
        "described as ...'): p(opening a call) 0.012, rank 16, under SmolLM2's own tool prompt"
    ),
}


def _expected_failure(name: str, why: str) -> Any:
    base = getattr(ChatModelIntegrationTests, name)
    if inspect.iscoroutinefunction(base):

        @functools.wraps(base)
        async def run_async(self: Any, *args: Any, **kwargs: Any) -> Any:
            return await base(self, *args, **kwargs)

        wrapper: Any = run_async
    else:

        @functools.wraps(base)
        def run(self: Any, *args: Any, **kwargs: Any) -> Any:
            return base(self, *args, **kwargs)

        wrapper = run
    return pytest.mark.xfail(reason=why, strict=False)(wrapper)


for _name, _why in _BEYOND_THE_MODEL.items():
    setattr(TestChatLogTokUIntegration, _name, _expected_failure(_name, _why))
