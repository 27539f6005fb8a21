"""Who plays the user: the scripted user's rules, and a model user behind a real OpenAI-compatible endpoint
(``tests/fixtures/openai_server.py`` as a process: its answers, usage, failures and a hung model)."""

from __future__ import annotations

import asyncio
import doctest
from collections.abc import Iterator

import pytest
from pydantic import ValidationError

from nemo_gym_env.conversation import users
from nemo_gym_env.conversation.users import (
    STOP,
    PolicyUser,
    ScriptedUser,
    Talk,
    UserDetail,
    UserSpec,
    make_user,
)
from nemo_gym_env.errors import UserFailure

SPEC = UserSpec(opening="Hi, I want to cancel an order.", goal="Cancel order #W1.",
                details=[UserDetail(asked_by=["email"], say="ana@example.com"),
                         UserDetail(asked_by=["order number"], say="#W1")],
                done_by=["cancelled"], fallback="I want to cancel an order.")


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    from tests.fixtures.openai_server import running_server

    with running_server() as url:
        yield url


def test_doctests():
    assert doctest.testmod(users).failed == 0


def test_the_scripted_user_reveals_when_asked_confirms_and_ends():
    talk, user = Talk(SPEC), ScriptedUser()
    reply = lambda text: asyncio.run(user.reply(talk, text))
    assert reply("Hello!") == ("I want to cancel an order.", False)
    assert reply("Your email and order number, please?") == ("ana@example.com #W1", False)  # both asked, both given
    assert reply("Shall I cancel it?") == ("Yes, please go ahead.", False)
    said, ended = reply("It is cancelled.")
    assert ended and said == "Thank you, that is all I needed." and STOP not in said
    assert talk.user_turns == 4 and [line["role"] for line in talk.said] == ["user", "agent", "user"] * 1 + [
        "agent", "user"] * 3
    assert talk.user_usage == {"input_tokens": 0, "output_tokens": 0}


def test_a_user_spec_is_checked_and_bounded():
    for bad in ({}, {"opening": ""}, {"opening": "x", "mood": "angry"}, {"opening": "x" * 3000},
                {"opening": "x", "details": [{"asked_by": [], "say": "y"}]}):
        with pytest.raises(ValidationError):
            UserSpec.model_validate(bad)
    with pytest.raises(ValueError, match="unknown user 'robot'"):
        make_user("robot")


def test_a_model_user_answers_through_an_openai_endpoint_and_its_tokens_are_counted(endpoint):
    user = PolicyUser({"kind": "openai", "model": "user-model", "base_url": endpoint, "api": "chat"}, timeout_s=30)
    talk = Talk(SPEC)
    said, ended = asyncio.run(user.reply(talk, "Hello, what is your email?"))
    assert said and not ended and talk.said[-1] == {"role": "user", "text": said}
    assert talk.user_usage["input_tokens"] > 0 and talk.user_usage["output_tokens"] > 0
    system = PolicyUser.system_prompt(SPEC)
    assert "ana@example.com" in system and STOP in system and "Cancel order #W1." in system


@pytest.mark.parametrize(("model", "why"), [("hang-user", "did not answer within 1 s"),
                                           ("fail500-user", "the user model failed: PolicyError: .*HTTP 500")])
def test_a_failing_or_hung_user_model_is_a_user_failure(endpoint, model, why):
    user = PolicyUser({"kind": "openai", "model": model, "base_url": endpoint, "api": "chat", "max_retries": 0},
                      timeout_s=1)
    with pytest.raises(UserFailure, match=why):
        asyncio.run(user.reply(Talk(SPEC), "Hello?"))
