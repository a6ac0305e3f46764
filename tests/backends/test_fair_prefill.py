"""A long prompt's prefill sized by time (llama.cpp): a step feeds small pieces while its budget lasts.

The scheduling logic runs on a fake clock and a fake cost model (a token's cost grows with its
depth, and with the "load"): the steps take fewer pieces as the pieces cost more, every step
advances the prompt, the prompt completes, and the pieces' boundaries depend on the position alone,
never on the budget or the clock. No time is asserted.
"""

from __future__ import annotations

import itertools
import math

import pytest

from logtoku_guard.backends.chunked_prefill import (
    DEFAULT_PREFILL_BUDGET_S,
    DEPTH_SCALE,
    MIN_PIECE,
    PIECE_TOKENS,
    BudgetedPrefill,
    FairShare,
    PrefillCost,
    check_prefill_budget,
    next_piece,
    piece_at,
)
from logtoku_guard.backends.llamacpp_rows import prefill_steps
from logtoku_guard.errors import ConfigurationError


class FakeClock:
    """A clock that moves only when a fake piece 'runs'."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class FakePrompt:
    """A prompt whose pieces cost ``per_token * load * (1 + depth / DEPTH_SCALE)`` seconds a token on ``clock``."""

    def __init__(self, clock: FakeClock, total: int, per_token: float = 0.01) -> None:
        self.clock, self.total, self.per_token = clock, total, per_token
        self.fed = 0
        self.load = 1.0
        self.pieces: list[tuple[int, int]] = []  # (start, tokens) of each piece, in order

    def feed(self, n: int) -> bool:
        cost = sum(self.per_token * self.load * (1 + (self.fed + i) / DEPTH_SCALE) for i in range(n))
        self.clock.now += cost
        self.pieces.append((self.fed, n))
        self.fed += n
        return self.fed < self.total


def run_turns(prefill: BudgetedPrefill, prompt: FakePrompt, load_at: dict[int, float] | None = None) -> list[list[int]]:
    """Every step's pieces (their sizes) until the prompt is in; ``load_at`` changes the load from a step on."""
    turns: list[list[int]] = []
    while prompt.fed < prompt.total:
        prompt.load = (load_at or {}).get(len(turns), prompt.load)
        before = len(prompt.pieces)
        prefill.turn(prompt.fed, prompt.total, prompt.feed)
        turns.append([n for _, n in prompt.pieces[before:]])
        assert len(turns) < 10_000, "the prompt never completes"
    return turns


def test_pieces_shrink_with_depth_to_the_floor_and_depend_on_the_position_alone() -> None:
    assert piece_at(0) == PIECE_TOKENS
    sizes = [piece_at(fed) for fed in (0, 256, 1024, DEPTH_SCALE, 4096, 8192, 10**6)]
    assert sizes == sorted(sizes, reverse=True) and len(set(sizes)) > 3
    assert piece_at(DEPTH_SCALE) == PIECE_TOKENS // 2 and sizes[-1] == MIN_PIECE
    assert all(MIN_PIECE <= n <= PIECE_TOKENS for n in sizes)
    # each piece below the 32 tokens at which llama.cpp's CPU attention takes another path
    assert PIECE_TOKENS <= 32


def test_the_cost_model_learns_a_tokens_cost_at_its_depth_and_follows_the_load() -> None:
    cost = PrefillCost(weight=0.5)
    assert cost.estimate(0, 32) == 0.0  # nothing timed: the first piece just runs
    cost.observe(0, 32, 32 * 0.01)
    assert cost.per_token == pytest.approx(0.01 / (1 + 16 / DEPTH_SCALE))
    deep, shallow = cost.estimate(6000, 8), cost.estimate(0, 8)
    assert deep > 3 * shallow  # a token 6k deep costs about 4x one at the start
    cost.observe(6000, 8, 4 * deep)  # the machine got busier: the estimate moves half way
    assert cost.estimate(6000, 8) == pytest.approx(2.5 * deep)
    for bad in (math.nan, -1.0, math.inf):
        cost.observe(100, 8, bad)  # a clock that misbehaves teaches nothing
    assert cost.estimate(6000, 8) == pytest.approx(2.5 * deep)


def test_a_step_takes_fewer_pieces_as_they_cost_more_and_the_prompt_completes() -> None:
    clock = FakeClock()
    prompt = FakePrompt(clock, total=7500, per_token=0.002)
    prefill = BudgetedPrefill(0.5, clock=clock)
    turns = run_turns(prefill, prompt)
    assert all(turns), "every step feeds at least one piece"
    assert sum(map(sum, turns)) == 7500
    tokens = [sum(t) for t in turns]
    assert tokens[1] > 2 * tokens[-2]  # deep in the prompt a step feeds far fewer tokens
    # within the budget, once the cost is known (the first step had no estimate yet)
    spent = []
    start = 0
    for t in turns:
        end = start + len(t)
        spent.append(sum(0.002 * sum(1 + (a + i) / DEPTH_SCALE for i in range(n)) for a, n in prompt.pieces[start:end]))
        start = end
    assert all(s <= 0.5 + 1e-9 for s, t in zip(spent[1:], turns[1:]) if len(t) > 1)


def test_a_busier_machine_makes_the_steps_smaller_at_once() -> None:
    clock = FakeClock()
    prompt = FakePrompt(clock, total=3000, per_token=0.002)
    turns = run_turns(BudgetedPrefill(0.5, clock=clock), prompt, load_at={5: 4.0})
    assert len(turns[6]) * 2 < len(turns[4])  # four times the cost per token: far fewer pieces a step
    assert sum(map(sum, turns)) == 3000


def test_a_piece_that_costs_more_than_the_budget_still_runs_one_a_step() -> None:
    clock = FakeClock()
    prompt = FakePrompt(clock, total=300, per_token=1.0)  # 32 s a piece, 0.2 s budget
    turns = run_turns(BudgetedPrefill(0.2, clock=clock), prompt)
    assert all(len(t) == 1 for t in turns) and sum(map(sum, turns)) == 300
    assert len(turns) == prefill_steps(300, 0, 256, pieces=True)  # the bound the KV-cache scheduler uses


def test_the_pieces_are_the_same_whatever_the_budget_and_the_load() -> None:
    """The logits of a prompt depend on its llama_decode boundaries: those are the position's alone."""
    layouts = []
    for budget, load in ((0.05, 1.0), (5.0, 1.0), (0.5, 7.0)):
        clock = FakeClock()
        prompt = FakePrompt(clock, total=2500, per_token=0.002)
        run_turns(BudgetedPrefill(budget, clock=clock), prompt, load_at={0: load})
        layouts.append(prompt.pieces)
    assert layouts[0] == layouts[1] == layouts[2]
    fed = 0
    for start, n in layouts[0]:
        assert start == fed and n == min(piece_at(fed), 2500 - fed)
        fed += n


def test_a_failed_or_finished_prompt_ends_the_step() -> None:
    clock = FakeClock()
    calls: list[int] = []

    def failing(n: int) -> bool:
        calls.append(n)
        clock.now += 0.001
        return False  # the prompt failed (or is in): no more pieces this step

    BudgetedPrefill(10.0, clock=clock).turn(0, 5000, failing)
    assert calls == [PIECE_TOKENS]
    assert next_piece(100, 100, 0.0, 1.0, PrefillCost(), first=True) == 0  # nothing left to feed
    assert next_piece(90, 100, 0.0, 1.0, PrefillCost(), first=True) == 10  # the last piece is the rest


def test_decoding_rows_get_their_turn_between_budgeted_steps() -> None:
    """The budgeted step is one chunk for FairShare: rows decoding are owed as long as it took."""
    clock = FakeClock()
    prompt = FakePrompt(clock, total=4000, per_token=0.002)
    prefill = BudgetedPrefill(0.3, clock=clock)
    share = FairShare()
    order: list[str] = []
    while prompt.fed < prompt.total:
        if share.chunk_may_run(decoding=True):
            share.chunk_ran(prefill.turn(prompt.fed, prompt.total, prompt.feed))
            order.append("prefill")
        else:
            clock.now += 0.02  # one decoding step of the short rows
            share.decoded(0.02)
            order.append("decode")
    assert not any(a == b == "prefill" for a, b in itertools.pairwise(order))  # never two prefills in a row
    assert order.count("decode") > order.count("prefill")


@pytest.mark.parametrize("value", [-0.1, math.nan, math.inf, 61, True, "0.2", [0.2]])
def test_a_bad_budget_is_refused_naming_it(value: object) -> None:
    with pytest.raises(ConfigurationError, match=r"prefill_budget_s must be a number of seconds > 0 and <= 60.*got"):
        check_prefill_budget(value)
    assert check_prefill_budget(0) is None and check_prefill_budget(None) is None and check_prefill_budget(0.0) is None
    assert check_prefill_budget(DEFAULT_PREFILL_BUDGET_S) is None  # off by default: fixed chunks
    assert check_prefill_budget(0.2) == 0.2 and check_prefill_budget(2) == 2.0
