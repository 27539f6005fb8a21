"""``checkpointing``: GRPOConfig's checkpointing switch under the installed transformers' name, no FutureWarning."""

from __future__ import annotations

import warnings

import pytest

pytest.importorskip("trl")

from nemo_gym_env.adapters.trl.generation import checkpointing


def _config(tmp_path, **kwargs):
    from trl import GRPOConfig

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        config = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none", **kwargs)
    return config, [str(w.message) for w in caught if issubclass(w.category, FutureWarning)]


@pytest.mark.parametrize("enabled", [False, True])
def test_the_switch_takes_effect_without_a_deprecation_warning(tmp_path, enabled):
    config, future = _config(tmp_path, **checkpointing(enabled))
    assert not [m for m in future if "checkpointing" in m], future
    assert config.gradient_checkpointing is enabled  # transformers mirrors the new name onto the old
    if hasattr(config, "activation_checkpointing"):
        assert config.activation_checkpointing is enabled


def test_grpo_configs_own_default_warns_where_the_new_name_exists(tmp_path):
    """What the helper avoids: GRPOConfig sets gradient_checkpointing=True by default, and transformers
    with the new name warns about it."""
    from transformers import TrainingArguments

    if "activation_checkpointing" not in TrainingArguments.__dataclass_fields__:
        pytest.skip("this transformers has only gradient_checkpointing")
    config, future = _config(tmp_path)
    assert any("activation_checkpointing" in m for m in future) and config.activation_checkpointing is True
