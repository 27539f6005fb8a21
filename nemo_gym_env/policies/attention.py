"""Attention for decoding steps on the CPU: one query token per row against the key/value cache.

SmolLM2 has 9 query heads on 3 key/value heads. For a step whose rows need a padding mask,
transformers' SDPA path stacks the 3 query heads of each key/value head into one query block
and calls PyTorch's fused kernel on that; for a step without one (a row decoding alone, or rows
of one length) it passes the 9 heads with ``enable_gqa=True`` instead, and PyTorch's CPU kernel
is far slower there: 344 us a layer in bfloat16 over 550 cached positions, against 69 us
stacked (``benchmarks/local_dtypes.py``, ``results/local_dtypes.json``: ``attention_step``),
a quarter of a lone conversation's decoding step in int8. :func:`decode_attention` stacks the
heads whether or not there is a mask, for one-token queries on the CPU; anything else (longer
queries, other devices, dropout, biases) goes to transformers' own SDPA path unchanged.

:func:`use_decode_attention` switches a model to it (``attn_implementation`` ``"nge_decode"``,
registered with transformers' ``AttentionInterface``; the masks are SDPA's);
:class:`~nemo_gym_env.policies.batching.BatchGenerator` does for every CPU model it decodes.

Example::

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16)
    use_decode_attention(model)   # True: its decoding steps take the path above
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

__all__ = ["NAME", "decode_attention", "use_decode_attention"]

NAME = "nge_decode"


def decode_attention(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                     **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' attention-function contract: ``query`` (batch, heads, q, dim), ``key``/``value``
    (batch, kv_heads, kv, dim), a boolean or additive mask (batch or 1, 1, q, kv) or None; returns
    (batch, q, heads, dim)."""
    batch, heads, length, dim = query.shape
    kv_heads = key.shape[1]
    if (query.device.type != "cpu" or length != 1 or dropout or heads % kv_heads or heads == kv_heads
            or kwargs.get("position_bias") is not None or kwargs.get("softcap") is not None
            or (attention_mask is not None and (attention_mask.dim() != 4 or attention_mask.shape[1] != 1))):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    # The query heads that share a key/value head become that head's queries: (batch, kv_heads, groups, dim).
    stacked = query.reshape(batch, kv_heads, heads // kv_heads, dim)
    out = torch.nn.functional.scaled_dot_product_attention(stacked, key, value, attn_mask=attention_mask, scale=scaling)
    return out.reshape(batch, heads, 1, dim).transpose(1, 2).contiguous(), None


def use_decode_attention(model: Any) -> bool:
    """Switch ``model`` to :func:`decode_attention` if it runs SDPA on the CPU; whether it did."""
    config = getattr(model, "config", None)
    device = getattr(model, "device", None)
    current = getattr(config, "_attn_implementation", None)
    if current == NAME:
        return True
    if current != "sdpa" or getattr(device, "type", None) != "cpu":
        return False
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    AttentionInterface.register(NAME, decode_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, sdpa_mask)
    try:
        model.set_attn_implementation(NAME)
    except (ValueError, AttributeError, TypeError):  # a model class that cannot switch keeps SDPA
        return False
    return getattr(model.config, "_attn_implementation", None) == NAME
