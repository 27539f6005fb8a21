"""Write ``badge_lookup`` rows from a seed, with train and held-out rows disjoint by construction.

Example:
    >>> train = make_dataset(50, seed=0, split="train")
    >>> heldout = make_dataset(50, seed=0, split="heldout")
    >>> {n for r in train for n in r["names"]} & {n for r in heldout for n in r["names"]}
    set()
    >>> make_dataset(3, seed=7) == make_dataset(3, seed=7)
    True

From a shell::

    python -m nemo_gym_env.servers.badge_lookup.make_dataset --size 1000 --seed 0 --split train --out train.jsonl
    python -m nemo_gym_env.servers.badge_lookup.make_dataset --size 200 --seed 1 --split heldout --out heldout.jsonl

Names are a first name and a family name from fixed lists (1,600 people). Every person
belongs to one split, by a hash of the name, so no held-out row names anyone a train row
names: a model cannot score on held-out rows by remembering train rows' numbers. Rows take
turns between the kinds asked for (``single``, ``larger``); ``seed`` picks the people. Each
row's input is :data:`SYSTEM_PROMPT`, ``shots`` worked examples (:data:`SHOTS`) and the question.

With ``answer_tool=True`` the rows also offer ``submit_answer`` and ask for the final answer
through it (:data:`ANSWER_SYSTEM_PROMPT`, :data:`ANSWER_SHOTS`): for trainers whose verifier
sees the tool calls only (TRL's ``environment_factory``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import sys
from collections.abc import Sequence
from typing import Any

from nemo_gym_env.protocol.dataset import write_rows
from nemo_gym_env.protocol.parser import render_tool_call
from nemo_gym_env.servers.badge_lookup.app import ANSWER_TOOL_NAME, TOOL_NAME, badge_number

__all__ = ["ANSWER_SHOTS", "ANSWER_SYSTEM_PROMPT", "ANSWER_TOOL", "KINDS", "SHOTS", "SPLITS", "SYSTEM_PROMPT", "TOOL",
           "main", "make_dataset", "people", "split_of"]

FIRST = ("Ada Ben Chloe Dev Elena Farid Grace Hugo Ines Jonas Kira Luis Maya Nadia Omar Petra Quinn Rosa "
         "Sami Tara Umar Vera Wen Xavier Yara Zane Aiko Bruno Carmen Dario Esme Felix Gita Hana Ivan Jada "
         "Kofi Lena Milo Noor").split()
FAMILY = ("Moreau Okafor Silva Tanaka Novak Haddad Lindqvist Mensah Rossi Kowalski Nguyen Petrov Ibarra "
          "Schmidt Dubois Costa Yilmaz Fischer Adeyemi Larsen Moreno Sato Varga Khan Olsen Ricci Bauer "
          "Santos Ivanova Mbeki Quist Reyes Holm Ortiz Kaur Weber Abe Lund Navarro Popescu").split()
KINDS = ("single", "larger")
SPLITS = ("train", "heldout")

SYSTEM_PROMPT = (
    "You can look up a person's badge number with the lookup_badge tool. Look up every person the "
    "question names before you answer, then end your reply with the final answer as \\boxed{answer}."
)
"""The system message of every row: the prompt a user of this task would write (the tool, the rule, the format)."""

TOOL = {
    "type": "function",
    "name": TOOL_NAME,
    "description": "Look up a person's badge number. Returns a JSON object with the name and the badge number.",
    "parameters": {
        "type": "object",
        "properties": {"name": {"type": "string", "description": "The person's full name, e.g. 'Ada Moreau'."}},
        "required": ["name"],
        "additionalProperties": False,
    },
    "strict": True,
}


ANSWER_SYSTEM_PROMPT = (
    "You can look up a person's badge number with the lookup_badge tool. Look up every person the "
    "question names before you answer, then give the final answer by calling the submit_answer tool."
)
"""The system message of rows made with ``answer_tool=True``."""

ANSWER_TOOL = {
    "type": "function",
    "name": ANSWER_TOOL_NAME,
    "description": "Submit the final answer: a badge number, or a person's full name.",
    "parameters": {
        "type": "object",
        "properties": {"answer": {"type": "string", "description": "The final answer, e.g. '417' or 'Ada Moreau'."}},
        "required": ["answer"],
        "additionalProperties": False,
    },
    "strict": True,
}


def _exchange(tool: str, arguments: dict[str, str], output: dict[str, Any]) -> list[dict[str, str]]:
    return [{"role": "assistant", "content": render_tool_call(tool, arguments)},
            {"role": "user", "content": f"<tool_response>\n{json.dumps(output)}\n</tool_response>"}]


def _shot(question: str, badges: dict[str, int], answer: str, submitted: str | None = None) -> list[dict[str, str]]:
    """A worked example: the question, one lookup per turn, then the answer (with ``submitted``: the answer's
    sentence and the ``submit_answer`` call in one turn, its reply, and a short closing turn)."""
    turns = [{"role": "user", "content": question}]
    for name, badge in badges.items():
        turns += _exchange(TOOL_NAME, {"name": name}, {"name": name, "badge": badge})
    if submitted is None:
        return [*turns, {"role": "assistant", "content": answer}]
    call, reply = _exchange(ANSWER_TOOL_NAME, {"answer": submitted}, {"answer": submitted, "recorded": True})
    return [*turns, {"role": "assistant", "content": f"{answer}\n{call['content']}"}, reply,
            {"role": "assistant", "content": "Submitted."}]


SHOTS = [
    *_shot("Who has the larger badge number, Sam Berg or Tom Ruiz?", {"Sam Berg": 415, "Tom Ruiz": 388},
           "Sam Berg has 415 and Tom Ruiz has 388, so the answer is \\boxed{Sam Berg}."),
    *_shot("What is the badge number of Lee Park?", {"Lee Park": 123}, "The badge number of Lee Park is \\boxed{123}."),
]
"""Worked examples put before the question (``shots=2``): one of each kind, with people outside both splits.
They are written as the turns the local policy renders (tool calls in ``<tool_call>`` blocks,
tool replies as ``<tool_response>`` user turns), so a small model sees the exchange it must make."""

ANSWER_SHOTS = [
    *_shot("Who has the larger badge number, Sam Berg or Tom Ruiz?", {"Sam Berg": 415, "Tom Ruiz": 388},
           "Sam Berg has 415 and Tom Ruiz has 388, so the answer is Sam Berg.", submitted="Sam Berg"),
    *_shot("What is the badge number of Lee Park?", {"Lee Park": 123}, "The badge number of Lee Park is 123.",
           submitted="123"),
]
"""The worked examples of ``answer_tool=True`` rows: the same exchanges, the answer's sentence followed by its
``submit_answer`` call in the same turn (a small model that writes the sentence goes on to the call; with the call
in a turn of its own, SmolLM2 wrote "I submitted 123." in words and made no call: 2 of 192 samples submitted)."""

_SHOT_ENDS = (0, 6, len(SHOTS))  # SHOTS[:end] holds the first 0, 1 or 2 examples
_ANSWER_SHOT_ENDS = (0, 8, len(ANSWER_SHOTS))


def split_of(name: str) -> str:
    """The split a person belongs to (about half each), fixed by the name."""
    return SPLITS[hashlib.sha256(name.encode("utf-8")).digest()[0] % 2]


def people(split: str) -> list[str]:
    """Everyone in ``split``, in a fixed order."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, not {split!r}")
    return [name for name in (f"{first} {family}" for first in FIRST for family in FAMILY) if split_of(name) == split]


def _row(kind: str, names: list[str], shots: int, answer_tool: bool) -> dict[str, Any]:
    if kind == "single":
        question = f"What is the badge number of {names[0]}?"
        expected = str(badge_number(names[0]))
    else:
        question = f"Who has the larger badge number, {names[0]} or {names[1]}?"
        expected = max(names, key=badge_number)
    return {
        "responses_create_params": {
            "input": [{"role": "system", "content": ANSWER_SYSTEM_PROMPT if answer_tool else SYSTEM_PROMPT},
                      *(ANSWER_SHOTS[: _ANSWER_SHOT_ENDS[shots]] if answer_tool else SHOTS[: _SHOT_ENDS[shots]]),
                      {"role": "user", "content": question}],
            "tools": [TOOL, ANSWER_TOOL] if answer_tool else [TOOL],
        },
        "kind": kind,
        "names": names,
        "expected_answer": expected,
    }


ORDERS = ("mixed", "by_kind")


def make_dataset(size: int, seed: int = 0, split: str = "train", kinds: Sequence[str] = KINDS,
                 shots: int = 2, answer_tool: bool = False, order: str = "mixed") -> list[dict[str, Any]]:
    """``size`` rows of ``split`` (kinds taking turns), the same for the same arguments.

    ``order="by_kind"`` gives the same rows with every row of the first of ``kinds`` first, then
    the next kind's (a curriculum, for a trainer that does not shuffle: the recipe's ``shuffle=false``).

    ``shots`` (0, 1 or 2) worked examples of :data:`SHOTS` come before each question; with
    ``answer_tool`` the rows offer ``submit_answer`` and their examples answer through it.
    The people (and so the questions) do not depend on ``shots`` or ``answer_tool``.
    """
    if shots not in (0, 1, 2):
        raise ValueError(f"shots must be 0, 1 or 2, not {shots}")
    if size < 0:
        raise ValueError(f"size must be >= 0, not {size}")
    unknown = [kind for kind in kinds if kind not in KINDS]
    if unknown or not kinds:
        raise ValueError(f"kinds must be some of {KINDS}, not {list(kinds)}")
    if order not in ORDERS:
        raise ValueError(f"order must be one of {ORDERS}, not {order!r}")
    pool = people(split)
    rng = random.Random(f"badge_lookup/{split}/{seed}")
    rows = []
    for index in range(size):
        kind = kinds[index % len(kinds)]
        while True:
            names = rng.sample(pool, 1 if kind == "single" else 2)
            if kind == "single" or badge_number(names[0]) != badge_number(names[1]):
                break
        rows.append(_row(kind, names, shots, answer_tool))
    if order == "by_kind":
        rank = {kind: place for place, kind in enumerate(kinds)}
        rows.sort(key=lambda row: rank[row["kind"]])  # stable: each kind's rows keep their order
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m nemo_gym_env.servers.badge_lookup.make_dataset",
                                     description="Write badge_lookup rows from a seed.")
    parser.add_argument("--size", type=int, required=True, help="number of rows")
    parser.add_argument("--seed", type=int, default=0, help="picks the people (default 0)")
    parser.add_argument("--split", choices=SPLITS, default="train", help="whose names the rows use (default train)")
    parser.add_argument("--kinds", default=",".join(KINDS), help=f"comma-separated, of {', '.join(KINDS)}")
    parser.add_argument("--shots", type=int, default=2, help="worked examples before each question: 0, 1 or 2")
    parser.add_argument("--answer-tool", action="store_true",
                        help="offer submit_answer and ask for the final answer through it")
    parser.add_argument("--order", choices=ORDERS, default="mixed",
                        help="mixed: kinds take turns; by_kind: each kind's rows together, in --kinds order")
    parser.add_argument("--out", help="JSONL to write (default: standard output)")
    args = parser.parse_args(argv)
    try:
        rows = make_dataset(args.size, args.seed, args.split, [k for k in args.kinds.split(",") if k], args.shots,
                            args.answer_tool, args.order)
    except ValueError as exc:
        parser.error(str(exc))
    write_rows(rows, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
