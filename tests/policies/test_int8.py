"""int8 weights for decoding and the native dtype: the layer against bfloat16's, LocalPolicy with ``dtype="int8"`` and ``"auto"``."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from nemo_gym_env.client.loop import background_loop
from nemo_gym_env.policies import PolicyRequest
from nemo_gym_env.policies.int8 import Int8Linear, supports_int8, to_int8
from nemo_gym_env.policies.local import LocalPolicy
from nemo_gym_env.policies.packed import PackedLinear, supports_packed

pytestmark = pytest.mark.skipif(not supports_int8(), reason="this torch lacks torch._weight_int8pack_mm")


def _linear(rows: int = 96, columns: int = 64) -> torch.nn.Linear:
    layer = torch.nn.Linear(columns, rows, bias=False)
    with torch.no_grad():
        layer.weight.copy_(torch.randn(rows, columns, generator=torch.Generator().manual_seed(0)))
    return layer.to(torch.bfloat16)


def test_a_few_tokens_use_the_int8_copy_and_stay_close_to_bfloat16():
    plain = _linear()
    layer = Int8Linear(plain, small_batch=4)
    x = torch.randn(2, 64, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    exact = torch.nn.functional.linear(x.float(), plain.weight.float())
    got = layer(x)
    assert got.dtype == torch.bfloat16 and got.shape == (2, 96)
    error = (got.float() - exact).abs().max() / exact.abs().max()
    assert 0 < error < 0.03  # not bfloat16's own result (the int8 copy was used), and within int8's rounding
    # each weight row is 127 steps of its largest magnitude: the copy is exact up to half a step
    step = plain.weight.float().abs().amax(dim=1, keepdim=True) / 127
    assert ((layer.qweight.float() * step - plain.weight.float()).abs() <= step / 2 + 1e-6).all()


@pytest.mark.parametrize("packed", [True, False])
def test_many_tokens_use_the_bfloat16_weight_unchanged(packed):
    plain = _linear()
    layer = Int8Linear(plain, small_batch=4, packed=packed)
    x = torch.randn(3, 5, 64, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)  # 15 tokens
    assert torch.equal(layer(x), torch.nn.functional.linear(x, plain.weight))  # packed: the same numbers
    if packed and supports_packed(torch.bfloat16):
        assert type(layer.large) is PackedLinear
    else:
        assert layer.large is plain  # its weight shared, not copied


def test_to_int8_replaces_only_bias_free_bfloat16_linears_and_unpacked_keeps_a_tied_head_tied():
    model = torch.nn.Sequential(torch.nn.Embedding(10, 64), _linear(), torch.nn.Linear(96, 8).to(torch.bfloat16),
                                torch.nn.Linear(8, 4, bias=False))  # float32: left alone
    head = torch.nn.Linear(64, 10, bias=False).to(torch.bfloat16)
    model[0] = model[0].to(torch.bfloat16)
    head.weight = model[0].weight
    model.append(head)
    assert to_int8(model, packed=False) == 2
    assert [type(m).__name__ for m in model] == ["Embedding", "Int8Linear", "Linear", "Linear", "Int8Linear"]
    assert model[4].large.weight is model[0].weight


def test_a_non_bfloat16_or_biased_layer_is_refused_with_a_reason():
    with pytest.raises(ValueError, match="bias-free nn.Linear with bfloat16 weights"):
        Int8Linear(torch.nn.Linear(4, 4, bias=False))
    with pytest.raises(ValueError, match="bias-free"):
        Int8Linear(torch.nn.Linear(4, 4).to(torch.bfloat16))


@pytest.mark.slow
def test_local_policy_int8_generates_with_token_data_close_to_bfloat16():
    request = PolicyRequest(input=[{"role": "user", "content": "Name three colours."}], history=[], tools=[])
    turns = {}
    for dtype in ("bfloat16", "int8"):
        policy = LocalPolicy(dtype=dtype, temperature=0, max_new_tokens=12, prefix_cache_mb=0)
        try:
            turns[dtype] = background_loop().run(policy.generate(request), timeout=120)
        finally:
            policy.close()
    int8, bf16 = turns["int8"], turns["bfloat16"]
    assert int8.prompt_token_ids == bf16.prompt_token_ids
    assert len(int8.generation_token_ids) == len(int8.generation_log_probs) > 0
    assert all(math.isfinite(p) and p <= 0 for p in int8.generation_log_probs)
    # the first token is greedy from the same prompt: int8's rounding moves its log-probability a little
    assert int8.generation_token_ids[0] == bf16.generation_token_ids[0]
    assert abs(int8.generation_log_probs[0] - bf16.generation_log_probs[0]) < 0.5
    assert int8.text.strip()


def test_local_policy_int8_is_for_the_cpu():
    with pytest.raises(ValueError, match="runs on the CPU only"):
        LocalPolicy(dtype="int8", device="cuda")


def test_auto_takes_bfloat16_where_the_cpu_computes_it_natively():
    from nemo_gym_env.policies.local import native_dtype
    from nemo_gym_env.system.cpu import cpu_flags

    native = {"avx512_bf16", "amx_bf16"} & set(cpu_flags())
    assert native_dtype("cpu") == ("bfloat16" if native else "float32")
    policy = LocalPolicy(dtype="auto", max_new_tokens=1)
    try:
        assert policy.dtype == native_dtype("cpu")
        assert next(policy.model.parameters()).dtype == getattr(torch, policy.dtype)
    finally:
        policy.close()
