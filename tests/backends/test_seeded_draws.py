"""A seeded sampled request draws the same tokens alone and in a shared batch (issue 43, N2).

Each sampled row draws from its own ``torch.Generator`` (seeded by ``batching.row_seed``) after its
own logits processors (temperature, top-p, logit bias, penalties), with an exponential race
(``processors.draw``): a batched forward pass changes the logits by float noise only (~1e-5 on the
tiny model), and a race flips only when its best two values are that close. Here: several seed
sets, each a batch mixing greedy, seeded and unseeded sampled rows joined mid-generation, every
seeded and greedy answer equal to its alone, token for token and score for score.
"""

from __future__ import annotations

from typing import Any

import pytest
from support.gate import Forwards
from support.joins import gated, join_mid_generation
from support.same import assert_same

from logtoku_guard.types import DecodingOptions

torch = pytest.importorskip("torch")

from logtoku_guard.backends.processors import draw  # noqa: E402

RUNNING = "Count from one to ten, slowly, and then stop counting"
PROMPTS = ["Tell me about Rome", "Hi", "Paris or Rome?", "What is the capital of France?", "Tell me about Rome"]


def mixed(seed: int) -> list[DecodingOptions]:
    """Greedy, seeded and unseeded sampled rows with their own warpers and logit parameters."""
    n = 10
    return [
        DecodingOptions(max_new_tokens=n, temperature=1.0, seed=seed),
        DecodingOptions(max_new_tokens=n),
        DecodingOptions(
            max_new_tokens=n, temperature=0.7, top_p=0.9, seed=seed + 1, logit_bias=((5, 2.0),), frequency_penalty=0.5
        ),
        DecodingOptions(max_new_tokens=n, temperature=1.0),  # unseeded: a fresh stream of its own
        DecodingOptions(max_new_tokens=n, temperature=1.3, seed=seed + 2, presence_penalty=1.0),
    ]


@pytest.mark.parametrize("seed", [7, 1234, 2**40 + 3])
def test_seeded_rows_draw_as_alone_in_a_batch_of_greedy_and_sampled_rows(tiny_tokenizer: Any, seed: int) -> None:
    backend, gate, model = gated(tiny_tokenizer)
    model.generation_config.min_new_tokens = 10  # no early EOS: every joiner decodes its 10 steps beside the others
    forwards = Forwards(model)
    first = (RUNNING, DecodingOptions(max_new_tokens=30, temperature=0.9, seed=seed + 3))
    joiners = list(zip(PROMPTS, mixed(seed), strict=True))
    alone = [backend.generate(p, o) for p, o in [first, *joiners]]
    greedy = backend.generate(PROMPTS[0], DecodingOptions(max_new_tokens=10))
    assert [t.id for t in alone[1].tokens] != [t.id for t in greedy.tokens]  # a draw, not the arg-max
    mark = len(forwards.seen)
    together = join_mid_generation(backend, gate, first, joiners)  # asserts every joiner joined the running batch
    assert max(f.rows for f in forwards.seen[mark:] if f.new == 1) == 6  # all six rows in one decoding step
    for (_, options), a, b in zip([first, *joiners], alone, together, strict=True):
        if options.sampling and options.seed is None:
            assert len(b.tokens) == 10  # its own stream: nothing to compare
            continue
        assert [t.id for t in a.tokens] == [t.id for t in b.tokens], options
        assert_same(a, b)  # and every score within 1e-4: the batched logits differ by float noise only


def test_draw_is_torchs_multinomial_and_advances_the_stream_alike_whatever_the_probabilities() -> None:
    logits = torch.randn(1, 300, generator=torch.Generator().manual_seed(0)) * 3
    probs = torch.softmax(logits, dim=-1)
    for seed in range(50):
        ours, theirs, other = (torch.Generator().manual_seed(seed) for _ in range(3))
        drawn = [draw(logits, ours) for _ in range(3)]
        assert drawn == [int(torch.multinomial(probs, 1, generator=theirs)[0, 0]) for _ in range(3)]
        for _ in range(3):
            draw(torch.zeros(1, 300), other)
        assert torch.equal(ours.get_state(), other.get_state())  # the next draw starts at the same place


@pytest.fixture
def one_thread() -> Any:
    """torch's threads in this (the test's) thread set to 1, as the backend sets them in its worker."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_float_noise_in_the_logits_does_not_flip_draws(one_thread: Any) -> None:
    """A draw's tolerance: logits moved by up to ~4e-4 (noise of 1e-4; a batched pass moves them by
    ~1e-5) on a 49,152-token vocabulary give the same token for every one of 100 seeds, where an
    inverse-CDF draw with the same noise changes several (so the noise is large enough to matter)."""
    gen = torch.Generator().manual_seed(1)
    vocab = 49_152
    flips = cdf_flips = 0
    for seed in range(100):
        logits = torch.randn(1, vocab, generator=gen) * 2.5
        noisy = logits + torch.randn(1, vocab, generator=gen) * 1e-4
        flips += draw(logits, torch.Generator().manual_seed(seed)) != draw(noisy, torch.Generator().manual_seed(seed))
        u = torch.rand(1, generator=torch.Generator().manual_seed(seed))
        by_cdf = [int(torch.searchsorted(torch.softmax(z[0], dim=-1).cumsum(0), u)) for z in (logits, noisy)]
        cdf_flips += by_cdf[0] != by_cdf[1]
    assert flips == 0
    assert cdf_flips >= 3
