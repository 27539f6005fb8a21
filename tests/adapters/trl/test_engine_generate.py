"""The trainer's generation on the package's engine (``engine_generate``), with the real SmolLM2-135M and a
real ``GRPOConfig`` and ``Accelerator``: what it samples is the training model's distribution at the trainer's
temperature, a group's shared prompt is computed once, calls repeat under the same seeds, the cache is dropped
when the rollout is done, and settings the engine does not do go to Hugging Face ``generate``."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

pytest.importorskip("trl")
import torch

from nemo_gym_env.adapters.trl.generation import EngineGenerate, engine_generate, trainer_generate

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def model(model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)


def _trainer(tmp_path, model, tokenizer, **settings):
    """What engine_generate reads of a GRPOTrainer: its args, accelerator, model, tokenizer and state."""
    from accelerate import Accelerator
    from trl import GRPOConfig

    from nemo_gym_env.adapters.trl.generation import checkpointing

    args = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", **checkpointing(False),
                      **{"temperature": 0.9, "seed": 3, **settings})
    return SimpleNamespace(args=args, accelerator=Accelerator(cpu=True), model=model, processing_class=tokenizer,
                           state=SimpleNamespace(global_step=4), use_vllm=False, eos_token_ids=None)


def _prompt(tokenizer) -> list[int]:
    messages = [{"role": "system", "content": "You answer with one word."},
                {"role": "user", "content": "Name a fruit that is yellow, and say why in a sentence."}]
    return list(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False))


def test_a_group_is_sampled_from_the_training_models_distribution_with_its_prompt_computed_once(
        tmp_path, model, tokenizer):
    trainer = _trainer(tmp_path, model, tokenizer)
    generate = trainer_generate(trainer)
    assert isinstance(generate, EngineGenerate)
    engine = generate.engine
    prompt = _prompt(tokenizer)
    before = engine.stats.computed_prompt_tokens
    model.train()
    outputs = generate([prompt, prompt, None, prompt], [12, 12, 12, 5])
    assert model.training  # put back as it was
    assert outputs[2] is None and all(outputs[i] is not None for i in (0, 1, 3))
    assert len(outputs[3][0]) <= 5 and all(len(outputs[i][0]) <= 12 for i in (0, 1))
    # The prompt but its last token is computed once; the other copies start from its cached states.
    assert engine.stats.computed_prompt_tokens - before == len(prompt) + 2
    assert len(engine.prefix_cache) > 0
    # Every sampled token's log-probability is the model's own at the trainer's temperature.
    for ids, log_probs in (outputs[0], outputs[1]):
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([prompt + ids])).logits[0, len(prompt) - 1: -1]
        expected = torch.log_softmax(logits.float() / 0.9, dim=-1).gather(1, torch.tensor(ids)[:, None]).squeeze(1)
        assert torch.allclose(torch.tensor(log_probs), expected, atol=2e-3)
    generate.release()
    assert len(engine.prefix_cache) == 0 and engine.prefix_cache.nbytes == 0


def test_the_same_step_and_call_sample_the_same_tokens(tmp_path, model, tokenizer):
    def one_call(trainer) -> list:
        generate = engine_generate(trainer)  # a new call object, as each rollout makes
        try:
            return [output[0] for output in generate([prompt, prompt], [10, 10])]
        finally:
            generate.release()

    trainer, rerun = _trainer(tmp_path / "a", model, tokenizer), _trainer(tmp_path / "b", model, tokenizer)
    prompt = _prompt(tokenizer)
    first = one_call(trainer)
    assert one_call(rerun) == first  # the same seed, step and call: a run repeats
    assert first[0] != first[1] or len(first[0]) < 3  # two rows of a group draw their own noise
    assert one_call(trainer) != first  # the step's second call (another rollout) draws other noise
    trainer.state.global_step = 5
    assert one_call(trainer) != first  # another step, other draws
    assert trainer._nemo_gym_generate_calls == (5, 1)  # the count starts again each step


@pytest.mark.parametrize("settings", [{"top_k": 5}, {"repetition_penalty": 1.1}, {"min_p": 0.1},
                                      {"generation_kwargs": {"no_repeat_ngram_size": 2}}])
def test_sampling_the_engine_does_not_do_goes_to_hugging_face_generate(tmp_path, model, tokenizer, settings):
    trainer = _trainer(tmp_path, model, tokenizer, **settings)
    assert engine_generate(trainer) is None
    assert not isinstance(trainer_generate(trainer), EngineGenerate)
    assert not isinstance(trainer_generate(_trainer(tmp_path, model, tokenizer), engine=False), EngineGenerate)
