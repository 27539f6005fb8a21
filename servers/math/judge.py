"""An optional LLM judge for answers math-verify calls unequal (an OpenAI-compatible endpoint).

The judge sees the problem, the reference answer (A) and the model's answer (B) and ends its
reply with a verdict, ``[[A=B]]`` or ``[[A!=B]]``::

    judge = MathJudge(base_url="http://127.0.0.1:8000/v1", model="judge", api_key=SecretStr("..."))
    same = await judge.equivalent(question, expected="1/2", answer="one half")   # True / False
    await judge.aclose()

Any failure (connection, HTTP error, no verdict) raises :class:`JudgeError`, whose message
never contains the API key.
"""

from __future__ import annotations

import asyncio

from pydantic import SecretStr

__all__ = ["EQUAL_VERDICT", "UNEQUAL_VERDICT", "JudgeError", "MathJudge", "parse_verdict"]

EQUAL_VERDICT = "[[A=B]]"
UNEQUAL_VERDICT = "[[A!=B]]"

SYSTEM_PROMPT = (
    "You check answers to math problems. You get a problem, a reference answer A and a "
    "candidate answer B. Decide whether B means the same mathematical object as A: the same "
    "number, expression, set, interval or tuple, possibly written differently (fractions vs "
    "decimals, factored vs expanded, different variable order in a set). Ignore wording, "
    "formatting, and units written or left out. Do not solve the problem again and do not "
    "judge whether A is right. Give at most two sentences of reasoning, then end with exactly "
    f"one verdict: {EQUAL_VERDICT} if B is equivalent to A, {UNEQUAL_VERDICT} if it is not."
)

USER_TEMPLATE = "Problem:\n{question}\n\nReference answer A:\n{expected}\n\nCandidate answer B:\n{answer}"


class JudgeError(Exception):
    """The judge could not give a verdict (unreachable, HTTP error, malformed reply)."""


def parse_verdict(text: str) -> bool | None:
    """The last verdict in ``text``: ``True`` for ``[[A=B]]``, ``False`` for ``[[A!=B]]``, else ``None``.

    Example:
        >>> parse_verdict("A is 1/2, B is 0.5: the same value. [[A=B]]")
        True
        >>> parse_verdict("Not [[A=B]]: they differ. Verdict: [[A!=B]]")
        False
        >>> parse_verdict("equivalent") is None
        True
    """
    equal, unequal = text.rfind(EQUAL_VERDICT), text.rfind(UNEQUAL_VERDICT)
    if equal < 0 and unequal < 0:
        return None
    return equal > unequal


class MathJudge:
    """Asks a chat-completions endpoint whether two answers are equivalent.

    Args:
        base_url: The endpoint, e.g. ``http://127.0.0.1:8000/v1`` (vLLM) or OpenAI's.
        model: Model name sent with each request.
        api_key: Bearer key; ``None`` sends a placeholder (local servers ignore it).
        timeout_s: Per-request timeout.
        max_retries: Retries of the ``openai`` client on connection errors and 5xx/429.
        max_concurrency: Judge requests in flight at once.
    """

    def __init__(
        self,
        *,
        base_url: str,
        model: str,
        api_key: SecretStr | None = None,
        timeout_s: float = 60.0,
        max_retries: int = 1,
        max_concurrency: int = 16,
    ):
        from openai import AsyncOpenAI

        self.model = model
        self._key = api_key.get_secret_value() if api_key is not None else ""
        self._client = AsyncOpenAI(
            base_url=base_url, api_key=self._key or "EMPTY", timeout=timeout_s, max_retries=max_retries
        )
        self._slots = asyncio.Semaphore(max_concurrency)

    def __repr__(self) -> str:
        return f"MathJudge(base_url={str(self._client.base_url)!r}, model={self.model!r})"

    async def equivalent(self, question: str, *, expected: str, answer: str) -> bool:
        """The judge's verdict on ``answer`` against ``expected``; raises :class:`JudgeError`."""
        messages = [
            {"role": "system", "content": SYSTEM_PROMPT},
            {
                "role": "user",
                "content": USER_TEMPLATE.format(question=question, expected=expected, answer=answer),
            },
        ]
        try:
            async with self._slots:
                completion = await self._client.chat.completions.create(
                    model=self.model, messages=messages, temperature=0.0
                )
            text = completion.choices[0].message.content or ""
        except Exception as exc:  # noqa: BLE001  (any client, HTTP or reply-shape error is a judge failure)
            raise JudgeError(self._redact(f"judge request failed: {type(exc).__name__}: {exc}")) from None
        verdict = parse_verdict(text)
        if verdict is None:
            raise JudgeError(self._redact(f"judge reply has no verdict: {text[-200:]!r}"))
        return verdict

    def _redact(self, message: str) -> str:
        if self._key:
            message = message.replace(self._key, "***")
        return message[:500]

    async def aclose(self) -> None:
        """Close the HTTP connections."""
        await self._client.close()
