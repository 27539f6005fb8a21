"""The answer format and its parser: what each space reads, and that no text makes it raise anything else."""

from __future__ import annotations

import doctest
import importlib

import numpy as np
import pytest
from gymnasium import spaces
from hypothesis import given, settings
from hypothesis import strategies as st

from nemo_gym_env.bridge.actions import ActionFormat
from nemo_gym_env.errors import ActionError, ConfigError

NAMES = ["left", "down", "right", "up"]


def test_discrete_by_name_number_last_tag_and_bare_word():
    fmt = ActionFormat.for_space(spaces.Discrete(4), names=NAMES)
    assert fmt.parse("<action>left</action> no, <action> RIGHT </action>") == 2
    assert fmt.parse("<action>3</action>") == 3 and fmt.parse("down") == 1 and fmt.parse("'up'.") == 3
    for bad, why in (("<action>4</action>", "from 0 to 3"), ("I go left", "no <action>"), ("", "empty"),
                     ("<action>fly</action>", "is not an action")):
        with pytest.raises(ActionError, match=why):
            fmt.parse(bad)
    assert "Actions: left (0), down (1), right (2), up (3)." in fmt.describe()


def test_discrete_with_a_start_and_no_names():
    fmt = ActionFormat.for_space(spaces.Discrete(3, start=-1))
    assert fmt.parse("<action>-1</action>") == -1 and "from -1 to 1" in fmt.describe()


def test_text_and_array_spaces():
    text = ActionFormat.for_space(spaces.Text(max_length=5, charset="abc"))
    assert text.parse("<action>abca</action>") == "abca"
    with pytest.raises(ActionError, match="not a valid text action"):
        text.parse("<action>abcabc</action>")
    box = ActionFormat.for_space(spaces.Box(-1.0, 1.0, (2,), np.float32))
    assert box.parse("<action>[0.5, -1]</action>").tolist() == [0.5, -1.0]
    with pytest.raises(ActionError, match="outside the action space"):
        box.parse("<action>[2, 0]</action>")
    with pytest.raises(ActionError, match="not JSON of shape"):
        box.parse("<action>[1, 2, 3]</action>")
    multi = ActionFormat.for_space(spaces.MultiDiscrete([2, 3]))
    assert multi.parse("<action>[1, 2]</action>").tolist() == [1, 2] and "e.g. <action>[0, 0]</action>" in multi.describe()


def test_a_space_without_a_text_form_needs_a_parser():
    space = spaces.Tuple((spaces.Discrete(2), spaces.Discrete(2)))
    with pytest.raises(ConfigError, match="action_parser"):
        ActionFormat.for_space(space)
    fmt = ActionFormat.for_space(space, parser=lambda text: tuple(int(c) for c in text.split(",")), hint="a,b")
    assert fmt.parse("<action>1,0</action>") == (1, 0) and "a,b" in fmt.describe()
    with pytest.raises(ActionError, match="is not an action"):
        fmt.parse("<action>x</action>")
    with pytest.raises(ActionError, match="not in the action space"):
        fmt.parse("<action>5,5</action>")


@pytest.mark.parametrize("names", [["a", "b"], ["a", "A", "b", "c"], ["1", "b", "c", "d"], ["", "b", "c", "d"]])
def test_action_names_must_fit_the_space(names):
    with pytest.raises(ConfigError):
        ActionFormat.for_space(spaces.Discrete(4), names=names)


FORMATS = [ActionFormat.for_space(spaces.Discrete(4), names=NAMES),
           ActionFormat.for_space(spaces.Text(max_length=8)),
           ActionFormat.for_space(spaces.Box(0, 1, (2, 2)))]


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300), st.sampled_from(range(len(FORMATS))))
def test_any_text_is_an_action_of_the_space_or_an_action_error(text, which):
    fmt = FORMATS[which]
    for turn in (text, f"<action>{text}</action>", f"{text}<action>"):
        try:
            action = fmt.parse(turn)
        except ActionError as exc:
            assert str(exc)
        else:
            assert fmt.space.contains(action)


MODULES = ["nemo_gym_env.bridge.actions", "nemo_gym_env.bridge.datasets", "nemo_gym_env.bridge.hosted",
           "nemo_gym_env.bridge.loading", "nemo_gym_env.bridge.opponents", "nemo_gym_env.bridge.targets",
           "nemo_gym_env.bridge.toy_text", "nemo_gym_env.checker.probes", "nemo_gym_env.checker.report",
           "nemo_gym_env.checker.schemas", *(f"nemo_gym_env.servers.{s}.scripted" for s in (
               "frozen_lake", "taxi", "blackjack", "cliff_walking", "textarena_tower_of_hanoi", "textarena_sudoku",
               "textarena_guess_the_number", "textarena_tic_tac_toe"))]


@pytest.mark.parametrize("module", MODULES)
def test_docstring_examples(module):
    if "textarena" in module:
        pytest.importorskip("textarena")
    result = doctest.testmod(importlib.import_module(module))
    assert result.failed == 0 and result.attempted > 0


@pytest.mark.parametrize("adversarial", ["<action>" * 125_000, "<ACTION>x" * 110_000, "<action></action" * 60_000])
def test_reading_the_tags_is_linear_on_a_megabyte_of_tag_prefixes(adversarial):
    """The regular expression took 10 s on 100,000 characters of '<action>' (and held the server's event loop);
    the tag reader reads a megabyte of them in about the time it reads plain text."""
    from nemo_gym_env.bridge.actions import ACTION_TAG, action_tags
    from nemo_gym_env.server.testing import times_slower_than_plain

    assert len(adversarial) >= 960_000
    assert times_slower_than_plain(action_tags, adversarial) < 50
    fmt = ActionFormat.for_space(spaces.Discrete(4), names=NAMES)
    assert times_slower_than_plain(lambda text: _parse_or_error(fmt, text), adversarial) < 50
    sample = adversarial[:3000] + "<action>up</action>" + adversarial[:3000]
    assert action_tags(sample) == ACTION_TAG.findall(sample)  # the same tags as the expression reads


def _parse_or_error(fmt: ActionFormat, text: str) -> object:
    try:
        return fmt.parse(text)
    except ActionError as exc:
        return exc


@given(st.lists(st.sampled_from(["<action>", "</action>", "<ACTION>", "</Action>", "a", "1", "<", "/", ">", " ",
                                  "\n"]), max_size=40).map("".join))
@settings(max_examples=300, deadline=None)
def test_the_tag_reader_reads_what_the_expression_reads(text):
    from nemo_gym_env.bridge.actions import ACTION_TAG, action_tags

    assert action_tags(text) == ACTION_TAG.findall(text)
