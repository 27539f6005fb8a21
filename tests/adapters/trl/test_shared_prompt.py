"""``shared_prompt_logps`` against TRL's own scoring, on the real SmolLM2-135M: the same log-probabilities,
entropies and gradients for a batch of two groups (left-padded prompts of different lengths, right-padded
completions of different lengths), and TRL's path where the layout is not TRL's usual one."""

from __future__ import annotations

import pytest

pytest.importorskip("trl")
import torch

from nemo_gym_env.adapters.trl.shared_prompt import can_pack, packable, shared_prompt_logps

pytestmark = pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")

COMPLETION_LENGTHS = [7, 12, 3, 9, 1]
"""Rows 0-1 continue prompt A, rows 2-4 prompt B (row 4: a one-token completion)."""


@pytest.fixture(scope="module")
def model(model_dir):
    from transformers import AutoModelForCausalLM
    from trl.trainer.utils import add_fused_lm_head

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    add_fused_lm_head(model, temperature=0.7, outputs=("log_probs", "entropy"))  # as GRPOTrainer does
    return model


def _batch(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Two prompts (50 and 42 tokens) left-padded to 50, completions right-padded to 14."""
    generator = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(10, 49000, (50,), generator=generator), torch.randint(10, 49000, (42,), generator=generator)]
    width, completion_width = 50, 14
    ids, masks = [], []
    for row, length in enumerate(COMPLETION_LENGTHS):
        prompt = prompts[0 if row < 2 else 1]
        completion = torch.randint(10, 49000, (length,), generator=generator)
        pad_left, pad_right = width - len(prompt), completion_width - length
        ids.append(torch.cat([torch.zeros(pad_left, dtype=torch.long), prompt, completion,
                              torch.zeros(pad_right, dtype=torch.long)]))
        masks.append(torch.cat([torch.zeros(pad_left, dtype=torch.long), torch.ones(len(prompt) + length, dtype=torch.long),
                                torch.zeros(pad_right, dtype=torch.long)]))
    return torch.stack(ids), torch.stack(masks), completion_width


def _trl_scores(model, ids, mask, keep):
    """TRL 1.16's own scoring: the fused LM head over prompt + completion (``_get_per_token_logps_and_entropies``)."""
    labels = ids.masked_fill(mask == 0, -100)
    labels[:, :-keep] = -100
    out = model(input_ids=ids, attention_mask=mask, labels=labels, fused_lm_head=True)
    return out.log_probs[:, -keep:], out.entropy[:, -keep:]


def _gradients(model, loss):
    model.zero_grad(set_to_none=True)
    loss.backward()
    grads = {name: p.grad.detach().clone() for name, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return grads


def test_the_packed_pass_gives_trls_log_probs_entropies_and_gradients(model):
    ids, mask, keep = _batch()
    assert can_pack(model, ids, mask, keep)
    weights = torch.linspace(0.5, 1.5, keep)[None, :]  # a loss that weighs every position differently

    expected_logps, expected_entropy = _trl_scores(model, ids, mask, keep)
    expected_grads = _gradients(model, (expected_logps * weights).sum() + 0.1 * expected_entropy.sum())
    logps, entropy = shared_prompt_logps(model, ids, mask, keep, temperature=0.7, compute_entropy=True)
    grads = _gradients(model, (logps * weights).sum() + 0.1 * entropy.sum())

    valid = mask[:, -keep:].bool()
    assert valid.sum() == sum(COMPLETION_LENGTHS)
    assert torch.allclose(logps[valid], expected_logps[valid], atol=1e-4, rtol=0)
    assert torch.allclose(entropy[valid], expected_entropy[valid], atol=1e-4, rtol=0)
    assert not logps[~valid].any() and not entropy[~valid].any()  # padding scores 0, as TRL's does
    assert grads.keys() == expected_grads.keys() and len(grads) > 100
    for name, grad in grads.items():
        scale = expected_grads[name].abs().max().clamp(min=1e-6)
        assert (grad - expected_grads[name]).abs().max() / scale < 1e-3, name


def test_rows_per_pass_splits_a_group_without_changing_the_numbers(model):
    ids, mask, keep = _batch(seed=1)
    with torch.no_grad():
        whole, _ = shared_prompt_logps(model, ids, mask, keep, temperature=0.7)
        split, _ = shared_prompt_logps(model, ids, mask, keep, temperature=0.7, rows_per_pass=1)
    assert torch.allclose(whole, split, atol=1e-4, rtol=0)


def test_eager_attention_gives_the_same_numbers(model):
    ids, mask, keep = _batch(seed=2)
    with torch.no_grad():
        sdpa, _ = shared_prompt_logps(model, ids, mask, keep, temperature=0.7)
        model.config._attn_implementation = "eager"
        try:
            eager, _ = shared_prompt_logps(model, ids, mask, keep, temperature=0.7)
        finally:
            model.config._attn_implementation = "sdpa"
    assert torch.allclose(sdpa, eager, atol=1e-4, rtol=0)


def test_layouts_and_models_it_does_not_cover_go_to_trls_path(model):
    ids, mask, keep = _batch()
    holed = mask.clone()
    holed[0, 45] = 0  # a hole inside a prompt: not left padding
    assert not can_pack(model, ids, holed, keep)
    gapped = mask.clone()
    gapped[1, -keep + 2] = 0  # a hole inside a completion: not right padding
    assert not can_pack(model, ids, gapped, keep)
    assert not can_pack(model, ids, mask, 0) and not can_pack(model, ids[:, :keep], mask[:, :keep], keep)
    model.config._attn_implementation = "flex_attention"
    try:
        assert not packable(model)
    finally:
        model.config._attn_implementation = "sdpa"
    model.config.final_logit_softcapping = 30.0
    try:
        assert not packable(model)
    finally:
        model.config.final_logit_softcapping = None
    assert packable(model)
