"""Fixtures shared by the adapter tests (``trl/`` and ``nemo_rl/``): the secret-words test server, its rows,
the real tokenizer."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # no hub at run time: the model comes from models.py's cache
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

SECRET_WORDS_YAML = Path(__file__).parent / "secret_words" / "configs" / "secret_words.yaml"

GET_WORD = {
    "type": "function",
    "name": "get_word",
    "description": "Get a secret word by its number.",
    "parameters": {"type": "object", "properties": {"n": {"type": "integer", "description": "The number."}},
                   "required": ["n"], "additionalProperties": False},
    "strict": True,
}


def tool_call_text(n: int) -> str:
    """The Hermes tool call a model writes for ``get_word(n)`` (what the renderer shows it too)."""
    return f'<tool_call>\n{{"name": "get_word", "arguments": {{"n": {n}}}}}\n</tool_call>'


TARGET = 4
"""The word number every task asks for."""


def secret_rows() -> list[dict]:
    """Two tasks: three worked examples of looking a word up, then "Get secret word 4."

    The examples make SmolLM2-135M call the tool most of the time (6 samples in 8 at
    temperature 1, with one or two examples far fewer), so a short training run has tool
    outputs (environment tokens) in its completions.
    """
    rows = []
    for words in (["apple", "pear", "plum", "fig"], ["lime", "kiwi", "date", "yam"]):
        conversation = []
        for n in range(1, TARGET):
            conversation += [
                {"role": "user", "content": f"Get secret word {n}."},
                {"role": "assistant", "content": tool_call_text(n)},
                {"role": "user", "content": f'<tool_response>\n{{"word": "{words[n - 1]}"}}\n</tool_response>'},
                {"role": "assistant", "content": words[n - 1]},
            ]
        conversation.append({"role": "user", "content": f"Get secret word {TARGET}."})
        rows.append({"responses_create_params": {"input": conversation, "tools": [GET_WORD]},
                     "words": words, "target": TARGET})
    return rows


def secret_spec():
    from nemo_gym_env.launch.config import load_config, server_specs

    return server_specs(load_config([SECRET_WORDS_YAML], env_yaml=None))[0]


def verify_log(url: str) -> list[float]:
    """Every reward the secret-words server at ``url`` has given, in order."""
    import httpx

    return httpx.get(f"{url}/verify_log", timeout=10).json()["rewards"]


@pytest.fixture(scope="session")
def secret_server() -> Iterator[str]:
    """A secret-words server for the whole session: its URL."""
    from nemo_gym_env.launch.launcher import Launcher

    with Launcher() as launcher:
        yield launcher.start(secret_spec()).url


@pytest.fixture(scope="session")
def model_dir() -> Path:
    """The embedded SmolLM2-135M-Instruct as a transformers folder (provisioned once by models.py)."""
    from nemo_gym_env.policies.models import default_model_dir

    return default_model_dir()


@pytest.fixture(scope="session")
def tokenizer(model_dir: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


@pytest.fixture
def rows_file(tmp_path: Path) -> Path:
    path = tmp_path / "secret_words.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in secret_rows()))
    return path
