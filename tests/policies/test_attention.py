"""decode_attention: the one-token CPU path against transformers' SDPA, its hand-backs, and the switch."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import torch  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402
from transformers.integrations.sdpa_attention import sdpa_attention_forward  # noqa: E402

from transformers.models.llama.modeling_llama import eager_attention_forward  # noqa: E402

from nemo_gym_env.policies.attention import (  # noqa: E402
    NAME,
    GroupedStates,
    decode_attention,
    group_mask,
    use_decode_attention,
)


class Module:
    num_key_value_groups = 3
    is_causal = True
    training = False


def _inputs(batch: int, length: int, cached: int, dtype: torch.dtype = torch.bfloat16):
    torch.manual_seed(0)
    query = torch.randn(batch, 9, length, 64).to(dtype)
    buffer_k = (2 * torch.randn(batch, 3, cached + 40, 64)).to(dtype)
    buffer_v = torch.randn(batch, 3, cached + 40, 64).to(dtype)
    return query, buffer_k[:, :, :cached], buffer_v[:, :, :cached]  # views of larger buffers, as the cache keeps them


def _reference(query, key, value, mask):
    """float32 attention with every query head given its key/value head explicitly."""
    out = torch.nn.functional.scaled_dot_product_attention(
        query.float(), key.float().repeat_interleave(3, 1), value.float().repeat_interleave(3, 1), attn_mask=mask)
    return out.transpose(1, 2)


@pytest.mark.parametrize("masked", ["none", "bool", "additive"])
def test_one_token_matches_float32_attention_as_closely_as_sdpa(masked):
    query, key, value = _inputs(4, 1, 300)
    padding = torch.ones(4, 1, 1, 300, dtype=torch.bool)
    padding[0, ..., :120] = False  # a shorter row, left-padded
    mask = {"none": None, "bool": padding,
            "additive": torch.zeros(4, 1, 1, 300).masked_fill(~padding, float("-inf")).to(torch.bfloat16)}[masked]
    ours, weights = decode_attention(Module(), query, key, value, mask)
    theirs, _ = sdpa_attention_forward(Module(), query, key, value, mask)
    want = _reference(query, key, value, None if mask is None else padding)
    assert weights is None and ours.shape == theirs.shape == (4, 1, 9, 64) and ours.dtype == torch.bfloat16
    ours_error = (ours.float() - want).abs().max().item()
    sdpa_error = (theirs.float() - want).abs().max().item()
    assert ours_error <= max(2 * sdpa_error, 1e-2), (ours_error, sdpa_error)
    if masked != "none":  # the same kernel on the same packed shapes: the same numbers
        assert torch.equal(ours, theirs)


def test_groups_of_rows_match_float32_attention_as_closely_as_transformers_eager_attention():
    """A step in two groups: 3 short rows (the fused kernel on views of their buffers) and 5 long ones (the whole
    buffers, room included, through the matrix products); each row's output is as close to float32 attention
    as transformers' eager attention in bfloat16, which computes the same products."""
    query, key, value = _inputs(8, 1, 300)
    rows = torch.ones(8, 300, dtype=torch.long)
    rows[:3, :260] = 0  # the short rows: 40 positions, left-padded
    rows[3, :100] = 0
    room = 40
    full_key = torch.cat([key, key.new_zeros(8, 3, room, 64)], dim=2)
    full_value = torch.cat([value, value.new_zeros(8, 3, room, 64)], dim=2)
    short_whole, short_mask = group_mask(rows[:3, 260:], 40 + room, torch.bfloat16)
    long_whole, long_mask = group_mask(rows[3:], 300 + room, torch.bfloat16)
    assert not short_whole and short_mask is None  # 3 x 80 positions: the fused kernel, no padding in the group
    assert long_whole and long_mask.dtype == torch.bfloat16 and long_mask.shape == (5, 1, 1, 340)
    parts = [(0, 3, key[:3, :, 260:], value[:3, :, 260:], short_mask),
             (3, 8, full_key[3:], full_value[3:], long_mask)]
    ours, weights = decode_attention(Module(), query, GroupedStates(parts), None, None)
    padding = rows.bool()[:, None, None, :]
    additive = torch.zeros(8, 1, 1, 300).masked_fill(~padding, float("-inf")).to(torch.bfloat16)
    eager, _ = eager_attention_forward(Module(), query, key, value, additive, scaling=64 ** -0.5)
    want = _reference(query, key, value, padding)
    assert weights is None and ours.shape == eager.shape == (8, 1, 9, 64) and ours.dtype == torch.bfloat16
    for row in range(8):
        ours_error = (ours[row].float() - want[row]).abs().max().item()
        eager_error = (eager[row].float() - want[row]).abs().max().item()
        assert ours_error <= 1.5 * eager_error + 1e-3, (row, ours_error, eager_error)


def test_a_drafted_step_sees_each_rows_padding_and_only_the_positions_before_each_query():
    """A step feeding 3 positions a row (a newest token and 2 drafts) in two groups, the fused kernel and the
    matrix products: each query attends to its row's own positions up to itself, as close to float32 as
    transformers' eager attention given the same mask."""
    queries = 3
    query, key, value = _inputs(8, queries, 300)
    rows = torch.ones(8, 300, dtype=torch.long)
    rows[:3, :260] = 0
    rows[3, :100] = 0
    rows[5, 290] = 0  # a rejected draft of an earlier step: a hole among the row's positions
    room = 40
    full_key = torch.cat([key, key.new_zeros(8, 3, room, 64)], dim=2)
    full_value = torch.cat([value, value.new_zeros(8, 3, room, 64)], dim=2)
    short_whole, short_mask = group_mask(rows[:3, 260:], 40 + room, torch.bfloat16, queries)
    long_whole, long_mask = group_mask(rows[3:], 300 + room, torch.bfloat16, queries)
    assert not short_whole and short_mask.dtype == torch.bool and short_mask.shape == (3, 1, queries, 40)
    assert long_whole and long_mask.shape == (5, 1, queries, 340)
    parts = [(0, 3, key[:3, :, 260:], value[:3, :, 260:], short_mask),
             (3, 8, full_key[3:], full_value[3:], long_mask)]
    ours, _ = decode_attention(Module(), query, GroupedStates(parts), None, None)
    column = torch.arange(300)
    causal = column[None, :] <= (300 - queries + torch.arange(queries))[:, None]
    allowed = rows.bool()[:, None, None, :] & causal
    additive = torch.zeros(8, 1, queries, 300).masked_fill(~allowed, float("-inf")).to(torch.bfloat16)
    eager, _ = eager_attention_forward(Module(), query, key, value, additive, scaling=64 ** -0.5)
    want = _reference(query, key, value, allowed)
    assert ours.shape == eager.shape == (8, queries, 9, 64)
    for row in range(8):
        ours_error = (ours[row].float() - want[row]).abs().max().item()
        eager_error = (eager[row].float() - want[row]).abs().max().item()
        assert ours_error <= 1.5 * eager_error + 1e-3, (row, ours_error, eager_error)


def test_longer_queries_and_dropout_are_sdpas_own():
    query, key, value = _inputs(2, 5, 40)
    causal = torch.ones(5, 40, dtype=torch.bool).tril(35).view(1, 1, 5, 40)
    for args in [(causal,), (None,)]:
        ours, _ = decode_attention(Module(), query, key, value, *args, scaling=0.1)
        theirs, _ = sdpa_attention_forward(Module(), query, key, value, *args, scaling=0.1)
        assert torch.equal(ours, theirs)


def _tiny() -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=96, hidden_size=48, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=256)
    return LlamaForCausalLM(config).eval()


def test_the_switch_keeps_a_models_logits_and_is_refused_off_sdpa():
    model = _tiny()
    ids = torch.randint(3, 96, (1, 30))
    with torch.inference_mode():
        before = model(input_ids=ids).logits
        step_before = model.generate(ids, max_new_tokens=12, do_sample=False)
        assert use_decode_attention(model) is True
        assert model.config._attn_implementation == NAME
        after = model(input_ids=ids).logits  # a prefill: SDPA's own path, the same numbers
        step_after = model.generate(ids, max_new_tokens=12, do_sample=False)  # one token at a time: ours
    assert torch.equal(before, after)
    assert torch.equal(step_before, step_after)
    assert use_decode_attention(model) is True  # again: harmless

    eager = _tiny()
    eager.set_attn_implementation("eager")
    assert use_decode_attention(eager) is False
    assert eager.config._attn_implementation == "eager"
    assert use_decode_attention(object()) is False
