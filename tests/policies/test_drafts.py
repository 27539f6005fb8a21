"""Draft tokens: the n-gram lookup, and a running batch that feeds greedy rows their drafts.

A drafted step must change nothing a caller sees: every row gets the tokens and log-probabilities it
gets one token a step, and the states it hands back (to the prefix cache) are those of its tokens,
with the columns of rejected drafts left out.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import torch  # noqa: E402

from nemo_gym_env.policies.attention import use_decode_attention  # noqa: E402
from nemo_gym_env.policies.decoding import Row, RunningBatch  # noqa: E402
from nemo_gym_env.policies.drafts import Lookup, accepted  # noqa: E402
from nemo_gym_env.policies.kv_cache import cache_keyword, prefill  # noqa: E402
from nemo_gym_env.policies.sampling import row_generator  # noqa: E402

from .test_batching import tiny_llama as batching_tiny_llama  # noqa: E402

END = 2


# ---- the lookup ----------------------------------------------------------------------------------


def test_the_lookup_proposes_what_followed_the_latest_earlier_occurrence_of_the_last_ngram():
    lookup = Lookup([5, 6, 7, 8, 9, 5, 6, 7, 1, 5, 6])
    assert lookup.drafts(3) == [7, 1, 5]  # "5 6" last continued with 7 1 (at 8), not 7 8
    assert lookup.drafts(1) == [7]
    assert lookup.drafts(0) == []
    lookup.extend([7])
    assert lookup.drafts(2) == [1, 5]  # "5 6 7": the latest occurrence
    lookup.extend([4])
    assert lookup.drafts(4) == []  # "4" was never seen before
    lookup.extend([4])
    assert lookup.drafts(4) == [4]  # "4" was followed by 4, and nothing after that yet


def test_the_longest_ngram_wins_and_drafts_stop_at_the_end_of_the_sequence():
    lookup = Lookup([1, 2, 3, 9, 2, 3, 8, 7, 1, 2, 3])
    assert lookup.drafts(5) == [9, 2, 3, 8, 7]  # "1 2 3" (3 tokens) beats the later "2 3" (2 tokens)
    assert Lookup([3, 4, 3]).drafts(5) == [4, 3]  # the continuation runs into the newest token
    assert Lookup([]).drafts(3) == [] and Lookup([7]).drafts(3) == []


def test_accepted_counts_the_leading_drafts_the_model_chose_itself():
    assert accepted([4, 5, 6], [4, 5, 6, 7]) == 3
    assert accepted([4, 5, 6], [4, 9, 6, 7]) == 1
    assert accepted([4], [3, 4]) == 0
    assert accepted([], [3]) == 0


# ---- the running batch with drafts ---------------------------------------------------------------


def tiny_llama() -> Any:
    """``test_batching``'s tiny random Llama, on the package's grouped attention."""
    model = batching_tiny_llama()
    use_decode_attention(model)
    return model


def _prompt(seed: int, length: int) -> list[int]:
    """A prompt that repeats itself (so it has n-grams to draft from) with a little noise."""
    generator = torch.Generator().manual_seed(seed)
    motif = torch.randint(3, 96, (7,), generator=generator).tolist()
    prompt = (motif * (length // 7 + 1))[:length]
    for index in torch.randint(0, length, (length // 10,), generator=generator).tolist():
        prompt[index] = int(torch.randint(3, 96, (1,), generator=generator))
    return prompt


def _arrivals(model: Any, prompts: list[list[int]], budgets: list[int], temperatures: list[float] | None = None,
              first: int = 0) -> list[tuple[Row, Any]]:
    keyword = cache_keyword(model)
    temperatures = temperatures or [0.0] * len(prompts)
    return [(Row(key=first + n, prompt=prompt, temperature=temperatures[n], top_p=1.0, budget=budgets[n],
                 generator=row_generator(first + n)), prefill(model, prompt[:-1], None, keyword))
            for n, prompt in enumerate(prompts)]


def _decode(batch: RunningBatch, on_step: Any = lambda step: None) -> dict[Any, tuple[list[int], list[float], Any]]:
    """Each row's tokens, log-probabilities and the states it hands back when it ends."""
    done: dict[Any, tuple[list[int], list[float], Any]] = {}
    step = 0
    while batch.rows:
        batch.step()
        step += 1
        on_step(step)
        states = {row.key: batch.states(row) for row in batch.rows if batch.ended(row)}
        for row in batch.pop_finished():
            done[row.key] = (row.tokens, row.log_probs, states[row.key])
    return done


def _one_token_a_step(model: Any, arrivals: list[tuple[Row, Any]]) -> dict[Any, tuple[list[int], list[float], Any]]:
    out = {}
    for row, states in arrivals:
        batch = RunningBatch(model, {END}, drafts=0)
        batch.add([(row, states)])
        out.update(_decode(batch))
    return out


def test_drafted_rows_get_the_tokens_log_probs_and_states_they_get_one_token_a_step():
    """Rows of several groups, greedy and sampled, with budgets that end some inside a step's accepted drafts;
    rows join mid-decode. Drafts are fed, some kept and some rejected, and nothing a caller sees changes."""
    model = tiny_llama()
    lengths = [12, 40, 300, 310, 150, 9]
    budgets = [5, 60, 61, 17, 60, 3]
    temperatures = [0.0, 0.0, 0.0, 0.0, 0.8, 0.0]
    prompts = [_prompt(n, length) for n, length in enumerate(lengths)]
    later = [_prompt(10 + n, length) for n, length in enumerate([305, 30])]
    with torch.inference_mode():
        reference = _one_token_a_step(model, _arrivals(model, prompts, budgets, temperatures)
                                      + _arrivals(model, later, [40, 40], first=len(prompts)))
        batch = RunningBatch(model, {END}, drafts=4, draft_positions=32)
        batch.add(_arrivals(model, prompts, budgets, temperatures))
        joining = _arrivals(model, later, [40, 40], first=len(prompts))
        groups, queries = len(batch.groups), []
        calls = model.forward
        model.forward = lambda *args, **kwargs: queries.append(kwargs["input_ids"].shape[1]) or calls(*args, **kwargs)
        try:
            drafted = _decode(batch, lambda step: step == 4 and batch.add(joining))
        finally:
            del model.forward
    assert groups == 3
    assert 0 < batch.accepted < batch.drafted  # drafts were kept and drafts were rejected
    assert max(queries) > 2 and len(queries) < max(budgets)  # steps fed drafts; fewer steps than tokens
    assert drafted.keys() == reference.keys()
    for key, (tokens, log_probs, states) in drafted.items():
        ref_tokens, ref_log_probs, ref_states = reference[key]
        assert tokens == ref_tokens, key
        assert log_probs == pytest.approx(ref_log_probs, abs=1e-4)
        budget = (budgets + [40, 40])[key]
        assert len(tokens) == budget or (tokens[-1] == END and len(tokens) < budget)
        assert len(states) == len(ref_states)
        for (keys, values), (ref_keys, ref_values) in zip(states, ref_states):
            assert keys.shape == ref_keys.shape  # its prompt and tokens but the last one: no rejected columns
            assert torch.allclose(keys, ref_keys, atol=1e-4) and torch.allclose(values, ref_values, atol=1e-4)


def _widths(model: Any, rows: int, chances: list[float], steps: int = 6) -> list[int]:
    """Positions a row of each step fed, for ``rows`` rows whose drafts have so far been kept at ``chances``."""
    prompts = [_prompt(n, 60) for n in range(8)]
    batch = RunningBatch(model, {END}, drafts=4, draft_positions=16)
    batch.add(_arrivals(model, (prompts * 3)[:rows], [30] * rows))
    widths: list[int] = []
    calls = model.forward
    model.forward = lambda *args, **kwargs: widths.append(kwargs["input_ids"].shape[1]) or calls(*args, **kwargs)
    try:
        for _ in range(steps):
            for row, chance in zip(batch.rows, chances * rows):
                row.drafted, row.kept = 1000, round(1000 * chance)
            batch.step()
    finally:
        del model.forward
    return widths


def test_drafts_shrink_as_rows_grow_and_stop_at_the_positions_limit():
    """Rows whose drafts are always kept draft all they may: 4 a row alone, 3 at 4 rows, 1 at 8 or 16 rows
    (16 positions a step, then 2 a row), none past 16 rows."""
    model = tiny_llama()
    with torch.inference_mode():
        for rows, most in ((1, 5), (4, 4), (8, 2), (16, 2), (17, 1)):
            assert max(_widths(model, rows, [1.0])) == most, rows


def test_rows_whose_drafts_fail_stop_drafting_unless_the_step_costs_them_little():
    model = tiny_llama()
    with torch.inference_mode():
        assert set(_widths(model, 8, [0.0])) == {1}
        assert set(_widths(model, 1, [0.0])) == {1}
        # One row in 8 whose drafts hold does not pay for the 7 others' extra positions; one in 2 does.
        assert set(_widths(model, 8, [1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0])) == {1}
        assert max(_widths(model, 2, [1.0, 0.0])) > 1


def _positions_fed(steps: int, budget: int, slow: Any) -> list[int]:
    """Positions a row of each of ``steps`` steps fed, for 2 rows whose drafts have been kept 70% of the time, on a
    model whose forward pass sleeps 50 ms where ``slow(positions, call)`` says so."""
    model = tiny_llama()
    prompts = [_prompt(n, 60) for n in range(2)]
    calls, widths = model.forward, []

    def timed(*args: Any, **kwargs: Any) -> Any:
        widths.append(kwargs["input_ids"].shape[1])
        if slow(widths[-1], len(widths)):
            time.sleep(0.05)
        return calls(*args, **kwargs)

    with torch.inference_mode():
        batch = RunningBatch(model, {END}, drafts=4, draft_positions=16)
        batch.add(_arrivals(model, prompts, [budget, budget]))
        model.forward = timed
        try:
            for _ in range(steps):
                for row in batch.rows:
                    row.drafted, row.kept = 1000, 700
                batch.step()
        finally:
            del model.forward
    return widths


def test_drafts_stop_where_the_batch_times_them_costlier_than_they_save():
    """The batch times its own steps: a model whose steps of several positions are slow (as float32's are on
    this CPU) is fed each number of drafts once, and no more once that and a plain step of as many rows have
    been timed."""
    widths = _positions_fed(16, 60, lambda positions, call: positions > 1)
    drafted = [width for width in widths if width > 1]
    assert widths[0] > 1 and widths[1] == 1  # drafted (estimated cheap), then one plain step to compare with
    assert len(drafted) == len(set(drafted)) <= 4  # each number of drafts tried once, found costly, not again
    assert widths[-6:] == [1] * 6


def test_drafted_steps_are_timed_again_so_one_slow_spell_does_not_end_drafting():
    """Drafted steps slow at first (another thread took the cores, say), then not: the batch stops drafting, tries
    one drafted step after ``_PROBE_EVERY`` plain ones, finds it cheap, and drafts again."""
    from nemo_gym_env.policies.decoding import _PROBE_EVERY

    widths = _positions_fed(12 + _PROBE_EVERY + 12, 400, lambda positions, call: positions > 1 and call < 12)
    assert any(width > 1 for width in widths[:8])
    # slow: drafting stopped for _PROBE_EVERY steps, then the probe
    spell = next(n for n in range(len(widths)) if widths[n: n + _PROBE_EVERY] == [1] * _PROBE_EVERY)
    assert spell < 12 and widths[spell + _PROBE_EVERY] > 1
    assert sum(width > 1 for width in widths[-8:]) >= 4  # found cheap: drafting again


def test_bad_draft_settings_are_refused():
    model = tiny_llama()
    with pytest.raises(ValueError, match="drafts must be >= 0"):
        RunningBatch(model, {END}, drafts=-1)
    with pytest.raises(ValueError, match="draft_positions >= 1"):
        RunningBatch(model, {END}, drafts=2, draft_positions=0)
