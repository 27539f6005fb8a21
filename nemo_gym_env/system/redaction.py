"""Secrets out of everything that is printed, logged, served or written: one set of rules.

Two ways a secret is found:

- by its key: a value under a key matching :data:`SECRET_KEY_PATTERN` (``api_key``,
  ``*_api_key``, ``*token*``, ``*secret*``, ``password``, ``authorization``) is replaced whole;
- by its shape, inside any string: ``sk-...`` keys, ``Bearer ...`` credentials and URL
  userinfo (``https://user:pass@host``).

:func:`redact` applies both to a config or any plain data; :func:`redact_text` the second to a
string (a log line, an error message). Standard library only: the launcher masks log tails
with it before it has imported anything heavy.

Example:
    >>> redact({"policy_api_key": "sk-abc", "url": "https://u:p@host/v1"})
    {'policy_api_key': '***REDACTED***', 'url': 'https://***REDACTED***@host/v1'}
"""

from __future__ import annotations

import copy
import re
import sys
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["MISSING", "REDACTED", "SECRET_KEY_PATTERN", "as_plain", "redact", "redact_text", "scrub", "secret_values"]

REDACTED = "***REDACTED***"
"""Replacement text for secret values."""

MISSING = "???"
"""NeMo Gym's marker of a required config value that is not set (not a secret to hide)."""

SECRET_KEY_PATTERN = re.compile(
    # Token counts (max_tokens, max_output_tokens, ...) and tokenizer names are not secrets.
    r"^(?!(?:.*_)?(?:max|min|num|total)_\w*tokens?$|(?:.*_)?tokenizer(?:_name|_path)?$)"
    r".*(?:(?:^|[_\-])api[_\-]?key$|token|secret|passw(?:or)?d|authorization)",
    re.IGNORECASE,
)
"""Matches keys whose values are secrets: ``api_key``, ``*_api_key``, ``*token*``, ``*secret*``,
``password``, ``authorization`` (case-insensitive; use ``SECRET_KEY_PATTERN.search(key)``)."""

_SK_RE = re.compile(r"(?<![A-Za-z0-9])sk-[A-Za-z0-9_\-]{17,}")
_BEARER_RE = re.compile(r"\b(bearer)\s+[^\s\"',;]+", re.IGNORECASE)
_USERINFO_RE = re.compile(r"\b([a-z][a-z0-9+.\-]*://)[^/?#@\s]+@", re.IGNORECASE)
_MIN_SECRET_LEN = 4  # shorter values would scrub ordinary words out of a document


def redact_text(text: str) -> str:
    """``text`` with ``Bearer ...`` credentials, ``sk-...`` keys and URL userinfo masked."""
    text = _BEARER_RE.sub(lambda m: f"{m.group(1)} {REDACTED}", text)
    text = _SK_RE.sub(REDACTED, text)
    return _USERINFO_RE.sub(lambda m: f"{m.group(1)}{REDACTED}@", text)


def as_plain(obj: Any) -> Any:
    """An OmegaConf config as plain containers, interpolations unresolved; anything else unchanged.

    Reading without resolving means a secret cannot leak through ``${...}``. When omegaconf was
    never imported, nothing can be one of its configs, so it is not imported here.
    """
    omegaconf = sys.modules.get("omegaconf")
    if omegaconf is not None and omegaconf.OmegaConf.is_config(obj):
        return omegaconf.OmegaConf.to_container(obj, resolve=False, throw_on_missing=False, enum_to_str=True)
    return obj


def redact(obj: Any) -> Any:
    """A plain deep copy of ``obj`` with secrets replaced by :data:`REDACTED`.

    Values under keys matching :data:`SECRET_KEY_PATTERN` are replaced wholesale (unset values
    ``None``, ``""`` and ``???`` are kept); anywhere else strings go through :func:`redact_text`.
    An OmegaConf config is read without resolving interpolations.
    """
    obj = as_plain(obj)
    if isinstance(obj, Mapping):
        out: dict[Any, Any] = {}
        for key, value in obj.items():
            secret = SECRET_KEY_PATTERN.search(str(key)) and value not in (None, "", MISSING)
            out[key] = REDACTED if secret else redact(value)
        return out
    if isinstance(obj, (list, tuple)):
        return [redact(v) for v in obj]
    if isinstance(obj, str):
        return redact_text(obj)
    return copy.deepcopy(obj)


def secret_values(node: Any, under_secret: bool = False) -> set[str]:
    """Every string stored under a secret-looking key, at any depth (so copies elsewhere can be found)."""
    found: set[str] = set()
    if isinstance(node, Mapping):
        for key, value in node.items():
            found |= secret_values(value, under_secret or bool(SECRET_KEY_PATTERN.search(str(key))))
    elif isinstance(node, (list, tuple)):
        for value in node:
            found |= secret_values(value, under_secret)
    elif under_secret and isinstance(node, str) and len(node) >= _MIN_SECRET_LEN and node != MISSING:
        found.add(node)
    return found


def scrub(node: Any, secrets: Iterable[str]) -> Any:
    """Replace every occurrence of the given secret values inside any string of ``node``."""
    secrets = sorted({s for s in secrets if len(s) >= _MIN_SECRET_LEN}, key=len, reverse=True)
    if isinstance(node, dict):
        return {key: scrub(value, secrets) for key, value in node.items()}
    if isinstance(node, list):
        return [scrub(value, secrets) for value in node]
    if isinstance(node, str):
        for secret in secrets:
            node = node.replace(secret, REDACTED)
    return node
