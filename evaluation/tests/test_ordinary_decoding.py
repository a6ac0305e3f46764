"""``eval ordinary --temperature/--max-new-tokens/--sample-seed``: answers decoded as ``serve`` decodes them.

On the tiny random model (nothing downloaded): the options reach every generation, greedy and sampled
answers are cached in files of their own, a seeded sampled run draws the same answers again whatever
the batch size, and bad values are refused before any model loads.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from support.tiny import make_model

from logtoku_eval.cache import CachedGeneration, JsonlCache
from logtoku_eval.generate import SERVING, SERVING_TEMPLATE, GreedySpec, SampledSpec, greedy_cache, run_answers
from logtoku_guard.errors import ConfigurationError
from logtoku_guard.types import DecodingOptions

MODEL = "smollm2-135m-instruct"  # the name whose shipped profile decides; the weights are the tiny model's


class SpyBackend:
    """A backend that records the options of every generation and hands it to the tiny model."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.calls: list[tuple[Any, DecodingOptions]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def generate(self, prompt: Any, options: DecodingOptions | None = None, **kwargs: Any) -> Any:
        self.calls.append((prompt, options or DecodingOptions()))
        return self.inner.generate(prompt, options, **kwargs)

    def batch(self, prompts: Any, options: DecodingOptions | None = None, **kwargs: Any) -> Any:
        self.calls.extend((p, options or DecodingOptions()) for p in prompts)
        return self.inner.batch(prompts, options, **kwargs)


def _run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tokenizer: Any, gen: str, *args: str) -> tuple[Any, list[SpyBackend]]:
    """``eval ordinary --limit 1 --no-traffic`` on the tiny model (one load per run, recorded)."""
    from typer.testing import CliRunner

    from logtoku_eval.cli import eval_app
    from logtoku_guard.backends.transformers import TransformersBackend
    from logtoku_guard.cli import toolkit

    loaded: list[SpyBackend] = []

    def load(model: str, k: int, *_args: Any, **_kwargs: Any) -> SpyBackend:
        spy = SpyBackend(TransformersBackend(model, k=k, model_obj=make_model(tokenizer), tokenizer=tokenizer))
        loaded.append(spy)
        return spy

    monkeypatch.setattr(toolkit, "load_backend", load)
    dirs = ["--gen-cache-dir", str(tmp_path / gen), "--out-dir", str(tmp_path / "out")]
    res = CliRunner().invoke(
        eval_app, ["ordinary", "--model", MODEL, "--limit", "1", "--no-traffic", "--n-boot", "10", *dirs, *args]
    )
    return res, loaded


def _answers(tmp_path: Path, gen: str, spec: GreedySpec | SampledSpec) -> dict[str, str]:
    from logtoku_eval.ordinary import dataset_name

    return {r.id: r.answer for r in greedy_cache(tmp_path / gen, MODEL, dataset_name(), spec, template=SERVING_TEMPLATE)}


@pytest.mark.slow
def test_sampled_options_reach_every_generation_and_a_seeded_run_draws_the_same_answers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tiny_tokenizer: Any
) -> None:
    sampled = SampledSpec(temperature=1.0, max_new_tokens=12, seed=5)
    args = ["--temperature", "1", "--max-new-tokens", "12", "--sample-seed", "5"]
    res, loaded = _run(tmp_path, monkeypatch, tiny_tokenizer, "gen", *args, "--batch-size", "4")
    assert res.exit_code == 0, res.output
    assert "Answers: sampled at temperature 1 (top-p 1, seed 5), at most 12 tokens." in " ".join(res.output.split())
    (spy,) = loaded
    assert len(spy.calls) == 45  # --limit 1: 15 questions in three wordings, one generation each
    answers = _answers(tmp_path, "gen", sampled)
    assert len(answers) == 45
    asked = {prompt: options for prompt, options in spy.calls}
    items = {it.question: it.id for it in _ordinary_items(answers)}
    for question, options in asked.items():
        assert options == sampled.options(items[question])
        assert (options.temperature, options.max_new_tokens, options.stop, options.top_p) == (1.0, 12, (), 1.0)
    assert len({options.seed for options in asked.values()}) == 45  # each question its own stream
    table = json.loads((tmp_path / "out" / "ordinary.json").read_text(encoding="utf-8"))
    assert table["decoding"] == "sampled at temperature 1 (top-p 1, seed 5), at most 12 tokens"

    # again from nothing, one question at a time: the same answers (a row's draws are its own)
    again, _ = _run(tmp_path, monkeypatch, tiny_tokenizer, "gen-again", *args, "--batch-size", "1")
    assert again.exit_code == 0, again.output
    assert _answers(tmp_path, "gen-again", sampled) == answers
    # another seed draws other answers
    other, _ = _run(
        tmp_path, monkeypatch, tiny_tokenizer, "gen", "--temperature", "1", "--max-new-tokens", "12", "--sample-seed", "6"
    )
    assert other.exit_code == 0, other.output
    reseeded = _answers(tmp_path, "gen", SampledSpec(temperature=1.0, max_new_tokens=12, seed=6))
    assert reseeded.keys() == answers.keys() and reseeded != answers
    # a run of the same decoding answers nothing again: all from its cache
    cached, loaded_again = _run(tmp_path, monkeypatch, tiny_tokenizer, "gen", *args)
    assert cached.exit_code == 0 and loaded_again == []


def test_greedy_and_sampled_answers_are_cached_apart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tiny_tokenizer: Any
) -> None:
    sampled, _ = _run(tmp_path, monkeypatch, tiny_tokenizer, "gen", "--temperature", "1", "--max-new-tokens", "12")
    assert sampled.exit_code == 0, sampled.output
    greedy, loaded = _run(tmp_path, monkeypatch, tiny_tokenizer, "gen", "--max-new-tokens", "12")
    assert greedy.exit_code == 0, greedy.output
    (spy,) = loaded  # the sampled cache is not read for the greedy run: every greedy answer is made
    assert len(spy.calls) == 45 and all(o == DecodingOptions(max_new_tokens=12) for _, o in spy.calls)
    assert "Answers: greedy, at most 12 tokens." in " ".join(greedy.output.split())
    files = sorted(p.name for p in (tmp_path / "gen").glob("*.jsonl"))
    assert len(files) == 2, files
    assert any("greedy-max12-nostop" in f for f in files) and any("sampled-t1.0-max12-nostop-seed0" in f for f in files)
    greedy_answers = _answers(tmp_path, "gen", GreedySpec(max_new_tokens=12, stop=()))
    sampled_answers = _answers(tmp_path, "gen", SampledSpec(temperature=1.0, max_new_tokens=12, seed=0))
    assert greedy_answers.keys() == sampled_answers.keys() and greedy_answers != sampled_answers


def test_the_default_decoding_is_the_greedy_cache_of_before() -> None:
    """No option: greedy, 64 tokens, no stop string, in the file earlier runs wrote (their answers hold)."""
    from logtoku_eval.cli.ordinary import answer_spec

    assert answer_spec(0.0, 64, None) == SERVING
    assert SERVING.name == "greedy-max64-nostop"
    assert answer_spec(1e-4, 64, None) == SERVING  # below GREEDY_BELOW every backend decodes greedily


def test_every_decoding_names_its_own_cache_file(tmp_path: Path) -> None:
    specs: list[GreedySpec | SampledSpec] = [
        SERVING,
        GreedySpec(max_new_tokens=256, stop=()),
        SampledSpec(),
        SampledSpec(temperature=0.7),
        SampledSpec(max_new_tokens=64),
        SampledSpec(seed=1),
    ]
    caches = [greedy_cache(tmp_path, "m", "ordinary-x", s, template=SERVING_TEMPLATE) for s in specs]
    assert len({c.path for c in caches}) == len(specs)
    assert len({c.meta.decoding for c in caches}) == len(specs)
    # a cache opened for one decoding is refused for another, before anything is generated
    with pytest.raises(
        ConfigurationError, match=re.escape("holds 'greedy-max64-nostop' answers, not 'sampled-t1.0-max256-nostop-seed0'")
    ):
        run_answers(object(), [], caches[0], spec=SampledSpec())  # type: ignore[arg-type]
    # and a file renamed to pass for another decoding is refused by its header
    caches[2].path.rename(tmp_path / caches[0].path.name)
    with pytest.raises(ConfigurationError, match="holds another run"):
        JsonlCache(tmp_path / caches[0].path.name, caches[0].meta, CachedGeneration)


def test_the_served_defaults_decode_as_serve_does() -> None:
    """``--temperature 1 --max-new-tokens 256``: the options ``serve --default-temperature 1
    --default-max-tokens 256`` (OpenAI's defaults) builds for a chat request that sends neither, seeded per question."""
    pytest.importorskip("fastapi")
    from logtoku_eval.cli.ordinary import answer_spec
    from logtoku_guard.server.limits import Limits
    from logtoku_guard.server.wire import decoding_options
    from logtoku_guard.wire.openai_protocol import ChatCompletionRequest

    spec = answer_spec(1.0, 256, 0)
    assert isinstance(spec, SampledSpec)
    mine = spec.options("capital-001-sentence")
    request = ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "q"}], "seed": mine.seed})
    assert decoding_options(request, Limits(default_temperature=1.0, default_max_tokens=256)) == mine
    assert mine.sampling and spec.seed_of("capital-001-sentence") != spec.seed_of("capital-001-lower")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--temperature", "-1"], "--temperature -1.0 is out of range; give a finite number >= 0"),
        (["--temperature", "nan"], "--temperature nan is out of range"),
        (["--temperature", "inf"], "--temperature inf is out of range"),
        (["--max-new-tokens", "0"], "--max-new-tokens 0 is out of range; give a number of tokens from 1 to 8192"),
        (["--max-new-tokens", "9000"], "--max-new-tokens 9000 is out of range"),
        (["--temperature", "1", "--sample-seed", "-3"], "--sample-seed -3 is out of range; give an integer from 0 to"),
        (["--sample-seed", "4"], "--sample-seed 4 seeds sampled answers, but --temperature 0.0 is greedy"),
    ],
)
def test_bad_decoding_options_are_refused_before_any_model_loads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tiny_tokenizer: Any, args: list[str], message: str
) -> None:
    res, loaded = _run(tmp_path, monkeypatch, tiny_tokenizer, "gen", *args)
    assert res.exit_code == 2 and message in " ".join(res.output.split()), res.output
    assert "Traceback" not in res.output and loaded == []
    assert not (tmp_path / "gen").exists() or not list((tmp_path / "gen").glob("*.jsonl"))


def test_sampled_spec_refuses_what_is_not_a_sampled_decoding() -> None:
    with pytest.raises(ConfigurationError, match=re.escape("at least 0.001, got 0")):
        SampledSpec(temperature=0)
    with pytest.raises(ConfigurationError, match="max_new_tokens must be a positive integer, got 0"):
        SampledSpec(max_new_tokens=0)
    with pytest.raises(ConfigurationError, match="seed must be a non-negative integer, got -1"):
        SampledSpec(seed=-1)


def _ordinary_items(answers: dict[str, str]) -> list[Any]:
    from logtoku_eval.ordinary import load_ordinary

    return [it for it in load_ordinary() if it.id in answers]
