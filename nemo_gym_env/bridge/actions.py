"""Actions read from a model's turn: the format a prompt states, and the parser that holds to it.

A model answers in text; a Gymnasium env wants an element of its ``action_space``. The format
is one tag, ``<action>...</action>`` (the last one of the turn counts), whose content is read
by the space:

==========================================  ================================================
space                                       the tag holds
==========================================  ================================================
``Discrete``                                an action's name (case-insensitive) or its number
``Text``                                    the text itself (the space's charset and length)
``Box``, ``MultiDiscrete``, ``MultiBinary``  a JSON number or list of the space's shape
anything else                               whatever the user's ``parser(text)`` reads
==========================================  ================================================

A turn with no tag that is one word is read as the answer (a bare ``left`` or ``2``), so a
model that forgets the tag on a one-word answer is not punished for it. A turn
that does not parse raises :class:`~nemo_gym_env.errors.ActionError` whose message says why
and restates the format: the server shows it to the model as the next observation.

Example:
    >>> from gymnasium import spaces
    >>> fmt = ActionFormat.for_space(spaces.Discrete(4), names=["left", "down", "right", "up"])
    >>> fmt.parse("I should go <action>Right</action>")
    2
    >>> fmt.parse("3")
    3
    >>> fmt.parse("jump")
    Traceback (most recent call last):
    ...
    nemo_gym_env.errors.ActionError: 'jump' is not an action: use a name or a number (left, down, right, up; 0-3)
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from gymnasium import spaces

from nemo_gym_env.errors import ActionError, ConfigError

__all__ = ["ACTION_TAG", "ActionFormat", "action_tags"]

ACTION_TAG = re.compile(r"<action>(.*?)</action>", re.IGNORECASE | re.DOTALL)
"""The tag an answer goes in; the last one of a turn counts (:func:`action_tags` reads them)."""

_OPEN = re.compile(r"<action>", re.IGNORECASE)
_CLOSE = re.compile(r"</action>", re.IGNORECASE)


def action_tags(text: str) -> list[str]:
    """The contents of the ``<action>...</action>`` tags of ``text``, as ``ACTION_TAG.findall`` reads them, in
    linear time: the regular expression backtracks over every opening tag that has no closing one (a turn of
    100,000 characters of ``<action>`` took it 10 s), this reads each character once.

    Example:
        >>> action_tags("<action>1</action> then <ACTION> 2 </action><action>never closed")
        ['1', ' 2 ']
    """
    found, position = [], 0
    while True:
        opened = _OPEN.search(text, position)
        if opened is None:
            return found
        closed = _CLOSE.search(text, opened.end())
        if closed is None:  # no closing tag after this one: none after any later opening tag either
            return found
        found.append(text[opened.end(): closed.start()])
        position = closed.end()

_MAX_READ = 100_000  # a turn longer than this is read from its end: the answer is the last tag
_SHOWN = 60  # how much of a wrong answer is quoted back


def _quote(text: str) -> str:
    text = " ".join(text.split())
    return repr(text if len(text) <= _SHOWN else text[:_SHOWN] + "...")


@dataclass(frozen=True)
class ActionFormat:
    """How a turn becomes an action of ``space``; :meth:`describe` is the text a prompt states.

    Build one with :meth:`for_space`.
    """

    space: spaces.Space
    kind: str
    """``"discrete"``, ``"text"``, ``"array"`` or ``"custom"``."""
    names: tuple[str, ...] = ()
    """Discrete: one name per action, in order (empty: numbers only)."""
    parser: Callable[[str], Any] | None = None
    """Custom: the user's ``parser(text) -> action``."""
    hint: str = ""
    """Custom: what the answer looks like, for the prompt."""

    @classmethod
    def for_space(cls, space: spaces.Space, *, names: Sequence[str] | None = None,
                  parser: Callable[[str], Any] | None = None, hint: str = "") -> ActionFormat:
        """The format of ``space``; ``parser`` (with its ``hint``) overrides the built-in reading.

        Raises:
            ConfigError: the space has no text form and no parser is given, or ``names`` do not fit.
        """
        if parser is not None:
            return cls(space, "custom", parser=parser, hint=hint)
        if isinstance(space, spaces.Discrete):
            names = tuple(str(n).strip() for n in (names or ()))
            if names and len(names) != int(space.n):
                raise ConfigError(f"action_names has {len(names)} names; the action space {space} has {space.n} actions")
            if len({n.lower() for n in names}) != len(names) or any(not n or n.lstrip("-").isdigit() for n in names):
                raise ConfigError(f"action_names must be distinct, non-empty and not numbers: {list(names)}")
            return cls(space, "discrete", names=names)
        if isinstance(space, spaces.Text):
            return cls(space, "text")
        if isinstance(space, (spaces.Box, spaces.MultiDiscrete, spaces.MultiBinary)):
            return cls(space, "array")
        raise ConfigError(f"the action space {space} has no text form here; pass action_parser: module:function "
                          "(text -> action)")

    # ---- the prompt ---------------------------------------------------------------------------

    def describe(self) -> str:
        """The format, as the prompt states it (and as a turn that does not parse gets it back)."""
        if self.kind == "discrete":
            start = int(self.space.start)
            if self.names:
                listing = ", ".join(f"{name} ({start + i})" for i, name in enumerate(self.names))
                return (f"Answer with exactly one action in an <action></action> tag, by name or number, e.g. "
                        f"<action>{self.names[0]}</action>. Actions: {listing}.")
            return (f"Answer with exactly one action number from {start} to {start + int(self.space.n) - 1} in an "
                    f"<action></action> tag, e.g. <action>{start}</action>.")
        if self.kind == "text":
            return (f"Answer with your action as text in an <action></action> tag, e.g. <action>...</action> "
                    f"({self.space.min_length} to {self.space.max_length} characters).")
        if self.kind == "array":
            example = json.dumps(_example(self.space).tolist())
            return (f"Answer with your action as JSON of shape {list(self.space.shape)} in an <action></action> "
                    f"tag, e.g. <action>{example}</action>. The action space is {self.space}.")
        return "Answer with your action in an <action></action> tag" + (f": {self.hint}" if self.hint else ".")

    # ---- reading a turn -----------------------------------------------------------------------

    def parse(self, text: str) -> Any:
        """The action in ``text`` (a model's turn).

        Raises:
            ActionError: no action could be read; the message says why and restates the format.
        """
        text = text[-_MAX_READ:]
        tags = action_tags(text)
        if tags:
            return self._read(tags[-1].strip(), tagged=True)
        bare = text.strip()
        if bare and len(bare) <= _SHOWN and self.kind in ("discrete", "array") and len(bare.split()) == 1:
            return self._read(bare, tagged=False)  # one bare word: read it, or say what is wrong with it
        raise ActionError("no <action>...</action> tag in your answer" if bare else "your answer was empty")

    def _read(self, content: str, *, tagged: bool) -> Any:
        if self.kind == "discrete":
            return self._discrete(content)
        if self.kind == "text":
            if not self.space.contains(content):
                raise ActionError(f"{_quote(content)} is not a valid text action ({self.space.min_length} to "
                                  f"{self.space.max_length} characters of the allowed set)")
            return content
        if self.kind == "array":
            return self._array(content)
        try:
            action = self.parser(content if tagged else content.strip())  # type: ignore[misc]
        except Exception as exc:  # noqa: BLE001 - the user's parser says why in its own words
            raise ActionError(f"{_quote(content)} is not an action: {exc}") from None
        if not _contains(self.space, action):
            raise ActionError(f"{_quote(content)} reads as {action!r}, which is not in the action space")
        return action

    def _discrete(self, content: str) -> int:
        start, n = int(self.space.start), int(self.space.n)
        word = content.strip().strip("'\"`.").strip()
        lowered = word.lower()
        for i, name in enumerate(self.names):
            if name.lower() == lowered:
                return start + i
        if re.fullmatch(r"[+-]?\d{1,12}", word):
            number = int(word)
            if start <= number < start + n:
                return number
            raise ActionError(f"{number} is not an action: the numbers go from {start} to {start + n - 1}")
        choices = f"{', '.join(self.names)}; " if self.names else ""
        raise ActionError(f"{_quote(content)} is not an action: use a name or a number ({choices}{start}-{start + n - 1})"
                          if self.names else f"{_quote(content)} is not an action number ({start}-{start + n - 1})")

    def _array(self, content: str) -> np.ndarray:
        try:
            value = json.loads(content)
            action = np.asarray(value, dtype=self.space.dtype).reshape(self.space.shape)
        except (ValueError, TypeError, RecursionError) as exc:
            raise ActionError(f"{_quote(content)} is not JSON of shape {list(self.space.shape)}: {exc}") from None
        if not self.space.contains(action):
            raise ActionError(f"{_quote(content)} is outside the action space {self.space}")
        return action


def _example(space: spaces.Space) -> np.ndarray:
    """A fixed, valid example action of an array space (not a random one: prompts stay the same)."""
    if isinstance(space, spaces.Box):
        low = np.where(np.isfinite(space.low), space.low, 0)
        high = np.where(np.isfinite(space.high), space.high, 0)
        return np.clip(np.zeros(space.shape), low, high).astype(space.dtype)
    if isinstance(space, spaces.MultiDiscrete):
        return np.asarray(space.start, dtype=space.dtype)
    return np.zeros(space.shape, dtype=space.dtype)


def _contains(space: spaces.Space, action: Any) -> bool:
    try:
        return bool(space.contains(action))
    except Exception:  # noqa: BLE001 - a space that cannot even compare the value does not hold it
        return False
