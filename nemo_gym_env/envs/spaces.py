"""Gymnasium spaces for lists of JSON Responses items.

Gymnasium's ``Text``, ``Dict`` and ``Sequence`` do not fit Responses-API items: text spaces
limit the charset, ``Sequence`` yields tuples, and shared-memory vector envs need fixed-size
arrays. These spaces hold plain Python data instead; Gymnasium's vector utilities batch them as
tuples of elements (use ``AsyncVectorEnv(..., shared_memory=False)``).

Example:
    >>> space = JsonItems(seed=0)
    >>> space.sample() in space
    True
    >>> [{"role": "user", "content": "hi"}] in space
    True
    >>> ({"role": "user", "content": "hi"},) in space
    False
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Iterable
from typing import Any

import gymnasium
import numpy as np

from nemo_gym_env.envs.actions import normalize_action
from nemo_gym_env.errors import ActionError
from nemo_gym_env.protocol.items import ACTION_ITEM_TYPES, ITEM_TYPES, item_kind, plain
from nemo_gym_env.protocol.parser import parse_model_text, render_tool_call

__all__ = [
    "ACTION_ITEM_TYPES",
    "ALL_ITEM_TYPES",
    "JsonItems",
    "ResponsesAction",
    "action_space_for",
    "is_json_value",
]

ALL_ITEM_TYPES = ITEM_TYPES
"""Item types an observation may hold (:data:`~nemo_gym_env.protocol.items.ITEM_TYPES`)."""

_ALPHABET = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 .,!?"
_WORDS = ("the", "answer", "is", "let", "me", "check", "tool", "result", "done", "42", "ok")
_DEFAULT_TOOL_NAMES = ("search", "calculator", "get_weather")
_HEX = "0123456789abcdef"


def is_json_value(x: Any, max_depth: int = 64) -> bool:
    """Whether ``x`` is plain JSON data: what ``json.dumps`` writes as standard JSON.

    Allowed are ``str``, ``int``, finite ``float``, ``bool``, ``None``, ``list`` and ``dict``
    with ``str`` keys, nested at most ``max_depth`` containers deep. Tuples, sets, bytes, NaN
    and infinities are rejected. The walk is iterative, so cyclic or very deep data is rejected
    without recursion errors.

    Args:
        x: The value to check.
        max_depth: The most containers allowed on any path from ``x`` down.

    Returns:
        True when ``x`` is JSON-able within the depth bound.

    Example:
        >>> is_json_value({"a": [1, 2.5, None, True, "x"]})
        True
        >>> is_json_value({"a": float("nan")})
        False
    """
    stack: list[tuple[Any, int]] = [(x, 0)]
    while stack:
        value, depth = stack.pop()
        if value is None or isinstance(value, (str, bool, int)):
            continue
        if isinstance(value, float):
            if not math.isfinite(value):
                return False
            continue
        if isinstance(value, list):
            if depth >= max_depth:
                return False
            stack.extend((child, depth + 1) for child in value)
            continue
        if isinstance(value, dict):
            if depth >= max_depth:
                return False
            for key, child in value.items():
                if not isinstance(key, str):
                    return False
                stack.append((child, depth + 1))
            continue
        return False
    return True


def _valid_items(x: Any, item_types: tuple[str, ...], max_items: int | None) -> bool:
    if not isinstance(x, list):
        return False
    if max_items is not None and len(x) > max_items:
        return False
    for item in x:
        if not isinstance(item, dict) or not is_json_value(item):
            return False
        if item_kind(item) not in item_types:
            return False
    return True


def _no_mask(mask: Any, probability: Any, space: gymnasium.spaces.Space) -> None:
    if mask is not None or probability is not None:
        raise NotImplementedError(f"{type(space).__name__}.sample() supports neither mask nor probability")


class _Sampler:
    """Random plain-Python values drawn from a space's ``np_random`` (never numpy scalars)."""

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng

    def int(self, low: int, high: int) -> int:
        """An ``int`` in ``[low, high)``."""
        return int(self.rng.integers(low, high))

    def choice(self, options: tuple[str, ...]) -> str:
        """One of ``options``."""
        return options[self.int(0, len(options))]

    def hex(self, n: int = 8) -> str:
        """``n`` random hex digits."""
        return "".join(_HEX[self.int(0, 16)] for _ in range(n))

    def text(self, max_len: int = 16) -> str:
        """Short text from a fixed ASCII alphabet."""
        return "".join(_ALPHABET[self.int(0, len(_ALPHABET))] for _ in range(self.int(0, max_len + 1)))

    def words(self, low: int = 1, high: int = 6) -> str:
        """A few words joined by spaces."""
        return " ".join(self.choice(_WORDS) for _ in range(self.int(low, high + 1)))

    def arguments(self) -> dict:
        """``{}`` or a small arguments object."""
        if self.int(0, 2) == 0:
            return {}
        return {"x": self.int(0, 100), "query": self.words(1, 3)}


def _sample_item(s: _Sampler, kind: str, tool_names: tuple[str, ...]) -> dict:
    if kind == "message":
        if s.int(0, 2) == 0:
            return {"type": "message", "role": s.choice(("user", "system")), "content": s.text()}
        return {
            "type": "message",
            "id": f"msg_{s.hex()}",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": s.text(), "annotations": []}],
        }
    if kind == "function_call":
        arguments = s.arguments()
        return {
            "type": "function_call",
            "id": f"fc_{s.hex()}",
            "call_id": f"call_{s.hex()}",
            "name": s.choice(tool_names),
            "arguments": json.dumps(arguments, ensure_ascii=False),
            "status": "completed",
        }
    if kind == "function_call_output":
        return {"type": "function_call_output", "call_id": f"call_{s.hex()}", "output": s.text()}
    if kind == "reasoning":
        return {
            "type": "reasoning",
            "id": f"rs_{s.hex()}",
            "summary": [{"type": "summary_text", "text": s.text()}],
        }
    return {"type": kind, "id": f"item_{s.hex()}"}


class JsonItems(gymnasium.spaces.Space[list]):
    """A list of JSON-able Responses items, e.g. an episode's conversation so far.

    An element is a ``list`` (not a tuple) of ``dict`` items, each plain JSON data (see
    :func:`is_json_value`) whose ``type`` is one of ``item_types``. A dict with ``role`` and
    ``content`` and no ``type`` counts as a ``message`` (the EasyInputMessage shape).

    Args:
        item_types: The allowed item ``type`` values.
        max_items: The most items a list may hold; unbounded when ``None``.
        seed: Seed for :meth:`sample`.

    Example:
        >>> JsonItems(item_types=("message",)).contains([{"type": "reasoning", "summary": []}])
        False
    """

    def __init__(
        self,
        item_types: tuple[str, ...] = ALL_ITEM_TYPES,
        max_items: int | None = None,
        seed: int | np.random.Generator | None = None,
    ) -> None:
        item_types = tuple(item_types)
        if not item_types or not all(isinstance(t, str) for t in item_types):
            raise ValueError(f"item_types must be a non-empty tuple of str, got {item_types!r}")
        if max_items is not None and max_items < 0:
            raise ValueError(f"max_items must be >= 0, got {max_items}")
        self.item_types = item_types
        self.max_items = max_items
        super().__init__(shape=None, dtype=None, seed=seed)

    @property
    def is_np_flattenable(self) -> bool:
        """Always False: item lists have no fixed-size array form."""
        return False

    def contains(self, x: Any) -> bool:
        """Whether ``x`` is a list of JSON-able items of the allowed types, within ``max_items``."""
        return _valid_items(x, self.item_types, self.max_items)

    def sample(self, mask: Any | None = None, probability: Any | None = None) -> list:
        """A random valid list of 0 to 3 items, deterministic for a given seed.

        Args:
            mask: Unsupported; must be ``None``.
            probability: Unsupported; must be ``None``.

        Returns:
            A list of item dicts with short random ASCII text.

        Raises:
            NotImplementedError: ``mask`` or ``probability`` was given.
        """
        _no_mask(mask, probability, self)
        s = _Sampler(self.np_random)
        high = 3 if self.max_items is None else min(3, self.max_items)
        count = s.int(0, high + 1)
        return [_sample_item(s, s.choice(self.item_types), _DEFAULT_TOOL_NAMES) for _ in range(count)]

    def to_jsonable(self, sample_n: Iterable[list]) -> list[list]:
        """Deep copies of the samples (they are JSON already)."""
        return [copy.deepcopy(sample) for sample in sample_n]

    def from_jsonable(self, sample_n: list[Any]) -> list[list]:
        """Deep copies of the JSON samples."""
        return [copy.deepcopy(sample) for sample in sample_n]

    def __eq__(self, other: object) -> bool:
        """Same class, item types and ``max_items``."""
        return (
            type(other) is type(self)
            and other.item_types == self.item_types  # type: ignore[attr-defined]
            and other.max_items == self.max_items  # type: ignore[attr-defined]
        )

    def __hash__(self) -> int:
        """Hash of the parameters compared by ``==``."""
        return hash((type(self), self.item_types, self.max_items))

    def __repr__(self) -> str:
        """``JsonItems(item_types=(...), max_items=...)``."""
        return f"JsonItems(item_types={self.item_types!r}, max_items={self.max_items!r})"


class ResponsesAction(gymnasium.spaces.Space):
    """The action space: what a policy model produced for one turn.

    An element is one of

    * a ``str``: raw model text, parsed with :func:`nemo_gym_env.protocol.parser.parse_model_text`;
    * a ``list`` of output item dicts of types ``message``, ``function_call`` or ``reasoning``;
    * a whole Response ``dict`` (``"object": "response"`` and an ``"output"`` list of such items).

    Pydantic models (a Response, or items in a list) are accepted and dumped to JSON first.

    Args:
        tool_names: Function names :meth:`sample` calls; a few generic names when empty.
        seed: Seed for :meth:`sample`.

    Example:
        >>> space = ResponsesAction(tool_names=("add",), seed=1)
        >>> "The answer is 4." in space and space.sample() in space
        True
    """

    def __init__(
        self,
        tool_names: tuple[str, ...] = (),
        seed: int | np.random.Generator | None = None,
    ) -> None:
        self.tool_names = tuple(tool_names)
        super().__init__(shape=None, dtype=None, seed=seed)

    @property
    def is_np_flattenable(self) -> bool:
        """Always False: actions are text or item lists."""
        return False

    def contains(self, x: Any) -> bool:
        """Whether ``env.step`` accepts ``x``: raw text, a list of action items or a whole Response.

        Structure first (a list, not a tuple; plain JSON values; pydantic models dumped), then the
        env's own check (:func:`~nemo_gym_env.envs.actions.normalize_action`), so membership and
        acceptance cannot disagree.
        """
        x = plain(x)
        if isinstance(x, list):
            x = [plain(item) for item in x]
            structured = all(isinstance(item, dict) for item in x) and is_json_value(x)
        elif isinstance(x, dict):
            structured = x.get("object") == "response" and isinstance(x.get("output"), list) and is_json_value(x)
        else:
            structured = isinstance(x, str)
        if not structured:
            return False
        try:
            normalize_action(x, turn=0)
        except ActionError:
            return False
        return True

    def sample(self, mask: Any | None = None, probability: Any | None = None) -> str | list:
        """Random raw text (sometimes with think and tool-call markup) or a list of items.

        Deterministic for a given seed.

        Args:
            mask: Unsupported; must be ``None``.
            probability: Unsupported; must be ``None``.

        Returns:
            A ``str`` or a list of item dicts, both members of this space.

        Raises:
            NotImplementedError: ``mask`` or ``probability`` was given.
        """
        _no_mask(mask, probability, self)
        s = _Sampler(self.np_random)
        names = self.tool_names or _DEFAULT_TOOL_NAMES
        parts: list[str] = []
        if s.int(0, 3) == 0:
            parts.append(f"<think>\n{s.words()}\n</think>\n")
        parts.append(s.words(0, 8))
        for _ in range(s.int(0, 3)):
            parts.append(render_tool_call(s.choice(names), s.arguments()))
        text = "\n".join(part for part in parts if part)
        if s.int(0, 2) == 0:
            return text
        return parse_model_text(text, id_prefix=s.hex())

    def to_jsonable(self, sample_n: Iterable[Any]) -> list[Any]:
        """Deep copies of the samples, pydantic models dumped."""
        return [copy.deepcopy(plain(sample)) for sample in sample_n]

    def from_jsonable(self, sample_n: list[Any]) -> list[Any]:
        """Deep copies of the JSON samples."""
        return [copy.deepcopy(sample) for sample in sample_n]

    def __eq__(self, other: object) -> bool:
        """Same class and tool names."""
        return type(other) is type(self) and other.tool_names == self.tool_names  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        """Hash of the parameters compared by ``==``."""
        return hash((type(self), self.tool_names))

    def __repr__(self) -> str:
        """``ResponsesAction(tool_names=(...))``."""
        return f"ResponsesAction(tool_names={self.tool_names!r})"


def action_space_for(rows: list[dict[str, Any]]) -> ResponsesAction:
    """The action space of an env over ``rows``: Responses-API output, tools named by the first row."""
    tools = rows[0]["responses_create_params"].get("tools") or []
    return ResponsesAction(tool_names=tuple(t.get("name", "") for t in tools if isinstance(t, dict)))
