"""oneDNN-packed linear layers: the layer against nn.functional.linear, a whole model's logits, LocalPolicy's greedy turns."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from nemo_gym_env.client.loop import background_loop  # noqa: E402
from nemo_gym_env.policies import PolicyRequest  # noqa: E402
from nemo_gym_env.policies.local import LocalPolicy  # noqa: E402
from nemo_gym_env.policies.packed import PackedLinear, supports_packed, to_packed  # noqa: E402

pytestmark = pytest.mark.skipif(not supports_packed(torch.float32), reason="this torch has no oneDNN linear packing")

bf16 = pytest.mark.skipif(not supports_packed(torch.bfloat16), reason="oneDNN computes no bfloat16 on this CPU")


def _linear(dtype: torch.dtype, rows: int = 96, columns: int = 64) -> torch.nn.Linear:
    layer = torch.nn.Linear(columns, rows, bias=False)
    with torch.no_grad():
        layer.weight.copy_(torch.randn(rows, columns, generator=torch.Generator().manual_seed(0)))
    return layer.to(dtype)


@pytest.mark.parametrize("tokens", [1, 8, 33, 300])
def test_float32_products_match_nn_linear_to_its_rounding(tokens):
    plain = _linear(torch.float32)
    packed = PackedLinear(plain)
    x = torch.randn(tokens, 64, generator=torch.Generator().manual_seed(1))
    expected, got = torch.nn.functional.linear(x, plain.weight), packed(x)
    assert got.shape == (tokens, 96) and got.dtype == torch.float32
    assert torch.allclose(got, expected, rtol=1e-5, atol=1e-5)


@bf16
@pytest.mark.parametrize("shape", [(1, 64), (8, 64), (3, 5, 64), (300, 64)])
def test_bfloat16_products_are_nn_linears_exactly(shape):
    plain = _linear(torch.bfloat16)
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    got = PackedLinear(plain)(x)
    assert got.shape == (*shape[:-1], 96)
    assert torch.equal(got, torch.nn.functional.linear(x, plain.weight))


def test_wrong_inputs_and_layers_are_refused_with_a_reason():
    packed = PackedLinear(_linear(torch.float32))
    with pytest.raises(ValueError, match=r"takes \(\.\.\., 64\) torch.float32 inputs, got \(2, 63\)"):
        packed(torch.zeros(2, 63))
    with pytest.raises(ValueError, match="inputs, got"):
        packed(torch.zeros(2, 64, dtype=torch.float64))
    with pytest.raises(ValueError, match="bias-free nn.Linear on the CPU"):
        PackedLinear(torch.nn.Linear(4, 4))
    with pytest.raises(ValueError, match="float64"):
        PackedLinear(torch.nn.Linear(4, 4, bias=False).double())


def _tiny_llama(dtype: torch.dtype) -> transformers.LlamaForCausalLM:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    return transformers.LlamaForCausalLM(config).to(dtype).eval()


@pytest.mark.parametrize("dtype", [torch.float32, pytest.param(torch.bfloat16, marks=bf16)])
def test_a_packed_model_with_a_tied_head_gives_the_same_logits(dtype):
    model = _tiny_llama(dtype)
    ids = torch.randint(0, 96, (2, 17), generator=torch.Generator().manual_seed(3))
    with torch.inference_mode():
        expected = model(input_ids=ids).logits
        assert to_packed(model) == 2 * 7  # q, k, v, o, gate, up, down per layer; the tied head keeps its weight
        assert model.lm_head.weight is model.model.embed_tokens.weight
        got = model(input_ids=ids).logits
        assert to_packed(model, tied=True) == 1  # the head too, with a packed copy of its own
        assert type(model.lm_head) is PackedLinear and type(model.model.embed_tokens) is torch.nn.Embedding
        assert torch.equal(model(input_ids=ids).logits, got)
    if dtype == torch.bfloat16:
        assert torch.equal(got, expected)
    else:
        assert torch.allclose(got, expected, rtol=1e-4, atol=1e-4)
    assert to_packed(model, tied=True) == 0  # nothing left to pack


@pytest.mark.slow
def test_local_policy_packs_its_cpu_model_and_decodes_the_same_turn():
    request = PolicyRequest(input=[{"role": "user", "content": "Name three colours."}], history=[], tools=[])
    turns, layers, dtypes = {}, {}, set()
    for packed in (True, False):
        policy = LocalPolicy(dtype="auto", temperature=0, max_new_tokens=16, prefix_cache_mb=0, packed_weights=packed,
                             draft_tokens=0)  # drafted steps, chosen by timing, round differently
        try:
            layers[packed] = type(policy.model.model.layers[0].mlp.up_proj).__name__
            dtypes.add(policy.dtype)
            turns[packed] = background_loop().run(policy.generate(request), timeout=120)
        finally:
            policy.close()
    assert layers == {True: "PackedLinear", False: "Linear"}
    assert turns[True].generation_token_ids == turns[False].generation_token_ids
    exact = dtypes == {"bfloat16"}  # float32's products differ in their last bits
    assert turns[True].generation_log_probs == pytest.approx(turns[False].generation_log_probs, abs=0 if exact else 1e-3)
