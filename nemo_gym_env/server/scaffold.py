"""``nemo-gym-env init NAME``: a new resources server folder that runs, serves and tests as it is.

The folder has NeMo Gym's layout, so it also works as ``resources_servers/NAME`` in a NeMo
Gym checkout once its imports are switched back::

    NAME/
      app.py               the server: one tool (``add``) and a verifier
      configs/NAME.yaml    its config (NeMo Gym's format)
      data/example.jsonl   five example tasks
      tests/test_app.py    in-process tests (pytest)
      README.md

Example:
    >>> path = init_server("my_env", "/tmp/somewhere")        # doctest: +SKIP
    >>> sorted(p.name for p in path.iterdir())                 # doctest: +SKIP
    ['README.md', '__init__.py', 'app.py', 'configs', 'data', 'tests']
"""

from __future__ import annotations

import json
import keyword
from pathlib import Path

from nemo_gym_env.errors import ScaffoldError

__all__ = ["ScaffoldError", "check_name", "class_name", "init_server"]


def check_name(name: str) -> None:
    """Raise :class:`ScaffoldError` unless ``name`` is a Python identifier (the folder, instance and module name)."""
    if not name.isidentifier() or keyword.iskeyword(name) or not name.isascii():
        raise ScaffoldError(
            f"invalid server name {name!r}: use a Python identifier (ASCII letters, digits and underscores, "
            "not starting with a digit, not a keyword), e.g. my_env"
        )


def class_name(name: str) -> str:
    """``my_env`` -> ``MyEnvResourcesServer``."""
    return "".join(part[:1].upper() + part[1:] for part in name.split("_") if part) + "ResourcesServer"


def init_server(name: str, directory: str | Path = ".") -> Path:
    """Create ``directory/name/`` with a working server, config, example data, tests and README.

    Returns:
        The new folder.

    Raises:
        ScaffoldError: If the name is not an identifier or the folder already exists.
    """
    check_name(name)
    root = Path(directory).expanduser() / name
    if root.exists():
        raise ScaffoldError(f"{root} already exists; pick another name or another --dir")
    cls = class_name(name)
    files = {
        "__init__.py": "",
        "app.py": _APP,
        f"configs/{name}.yaml": _CONFIG,
        "data/example.jsonl": "".join(json.dumps(row) + "\n" for row in _example_rows()),
        "tests/__init__.py": "",
        "tests/test_app.py": _TEST,
        "README.md": _README,
    }
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        text = text.replace("__NAME__", name).replace("__CLASS__", cls)
        path.write_text(text.replace("__PREFIX__", cls.removesuffix("ResourcesServer")), encoding="utf-8")
    return root


_TOOLS = [
    {
        "type": "function",
        "name": "add",
        "description": "Add two integers. Returns {\"sum\": <integer>}.",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
            "additionalProperties": False,
        },
        "strict": True,
    }
]


def _example_rows() -> list[dict]:
    system = "You are a careful calculator. Use the add tool for every sum, then reply with the number only."
    pairs = [(17, 25), (123, 456), (-8, 30), (1000, 2024), (7, 7)]
    return [
        {
            "responses_create_params": {
                "input": [
                    {"role": "developer", "content": system},
                    {"role": "user", "content": f"What is {a} + {b}?"},
                ],
                "tools": _TOOLS,
            },
            "expected_answer": str(a + b),
        }
        for a, b in pairs
    ]


_CONFIG = """\
# Resources server made by `nemo-gym-env init` (NeMo Gym's config format).
# Serve it:  nemo-gym-env serve ./__NAME__   (from the folder holding __NAME__/)
__NAME__:
  resources_servers:
    __NAME__:
      entrypoint: app.py
      domain: other
      verified: false
      description: Adds two integers with a tool; rewards the right sum
"""

_APP = '''\
"""``__NAME__``: a resources server made by ``nemo-gym-env init``; make the tool and the verifier yours.

Tools:
    ``POST /add`` ``{"a": int, "b": int}`` -> ``{"sum": int}``

Reward: 1.0 when the last assistant message contains the row's ``expected_answer``, else 0.0.
Metric: ``num_tool_calls``.

Serve it: ``nemo-gym-env serve ./__NAME__`` (from the folder holding ``__NAME__/``).
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel, Field

from nemo_gym_env.server import (
    BaseResourcesServerConfig,
    BaseVerifyRequest,
    BaseVerifyResponse,
    SimpleResourcesServer,
)


class AddRequest(BaseModel):
    """Arguments of ``add``."""

    a: int
    b: int


class AddResponse(BaseModel):
    """Reply of ``add``."""

    sum: int


class __PREFIX__VerifyRequest(BaseVerifyRequest):
    """The task row (with its ground truth) plus the finished episode."""

    expected_answer: str


class __PREFIX__VerifyResponse(__PREFIX__VerifyRequest, BaseVerifyResponse):
    """The request echoed back with the reward and a metric."""

    num_tool_calls: int


def final_answer(output: list[Any]) -> str:
    """The text of the last assistant message of an episode ("" if there is none)."""
    for item in reversed(output):
        if getattr(item, "type", None) == "message" and getattr(item, "role", None) == "assistant":
            return "".join(getattr(part, "text", "") or "" for part in item.content)
    return ""


class __CLASS__(SimpleResourcesServer):
    """The ``__NAME__`` resources server."""

    config: BaseResourcesServerConfig = Field(default_factory=BaseResourcesServerConfig)

    def setup_webserver(self) -> FastAPI:
        """Standard routes plus one route per tool."""
        app = super().setup_webserver()
        app.post("/add")(self.add)
        return app

    async def add(self, body: AddRequest) -> AddResponse:
        """The ``add`` tool."""
        return AddResponse(sum=body.a + body.b)

    async def verify(self, body: __PREFIX__VerifyRequest) -> __PREFIX__VerifyResponse:
        """1.0 if the final answer contains the expected one."""
        output = body.response.output
        reward = 1.0 if body.expected_answer in final_answer(output) else 0.0
        calls = sum(1 for item in output if getattr(item, "type", None) == "function_call")
        return __PREFIX__VerifyResponse(**{**body.model_dump(), "reward": reward, "num_tool_calls": calls})


if __name__ == "__main__":
    __CLASS__.run_webserver()
'''

_TEST = '''\
"""In-process tests of ``__NAME__``: run ``python -m pytest __NAME__/tests``."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

from fastapi.testclient import TestClient

from nemo_gym_env.protocol.dataset import check_row
from nemo_gym_env.protocol.types import make_response

HERE = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("___NAME___app", HERE / "app.py")
app_module = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = app_module  # pydantic resolves annotations through sys.modules
_spec.loader.exec_module(app_module)

ROWS = [json.loads(line) for line in (HERE / "data" / "example.jsonl").read_text().splitlines() if line.strip()]


def client() -> TestClient:
    return TestClient(app_module.__CLASS__.from_config({}, "__NAME__").build_app())


def answer(text: str, *calls: dict) -> dict:
    items = [
        {"type": "function_call", "id": f"fc_{i}", "call_id": f"call_{i}", "name": "add", "arguments": json.dumps(c)}
        for i, c in enumerate(calls)
    ]
    items.append({"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
                  "content": [{"type": "output_text", "text": text, "annotations": []}]})
    return make_response(items).model_dump(mode="json", exclude_none=True)


def test_example_rows_are_valid() -> None:
    assert len(ROWS) == 5
    for row in ROWS:
        assert check_row(row) is None


def test_add_tool() -> None:
    with client() as http:
        assert http.post("/seed_session", json=ROWS[0]).status_code == 200
        reply = http.post("/add", json={"a": 17, "b": 25})
        assert reply.status_code == 200
        assert reply.json() == {"sum": 42}
        assert http.post("/add", json={"a": "x"}).status_code == 422


def test_verify_rewards_the_right_sum() -> None:
    row = ROWS[0]
    with client() as http:
        right = http.post("/verify", json={**row, "response": answer(row["expected_answer"], {"a": 17, "b": 25})})
        wrong = http.post("/verify", json={**row, "response": answer("I do not know")})
    assert right.status_code == 200 and wrong.status_code == 200
    assert right.json()["reward"] == 1.0
    assert right.json()["num_tool_calls"] == 1
    assert wrong.json()["reward"] == 0.0
'''

_README = """\
# __NAME__

A resources server made by `nemo-gym-env init`: one tool, `add(a, b)`, and a verifier that
gives reward 1.0 when the model's final answer contains the row's `expected_answer`.
Replace both with your environment's tools and checks.

| file | what |
|---|---|
| `app.py` | the server (`__CLASS__`): tools are `POST /<tool>` routes, `verify` scores an episode |
| `configs/__NAME__.yaml` | its config, NeMo Gym's format |
| `data/example.jsonl` | five example tasks: `responses_create_params` plus ground truth (`expected_answer`) |
| `tests/test_app.py` | in-process tests |

```bash
python -m pip install pytest                                           # once: the tests run on pytest
python -m pytest __NAME__/tests -q                                     # test it
nemo-gym-env validate __NAME__/data/example.jsonl                      # check the tasks
nemo-gym-env serve ./__NAME__                                          # serve it (and a head server)
nemo-gym-env rollouts ./__NAME__ --policy local                        # rollouts offline: the embedded model
nemo-gym-env rollouts ./__NAME__ --policy openai                       # rollouts with the model of env.yaml
```

A server folder is a name wherever a bundled server's name goes (`serve`, `rollouts`, `check`, `gym.make`);
its tasks are `data/example.jsonl` unless `--input` names others. In Python:
`gym.make("NemoGym/Generic-v0", server="./__NAME__")`.
"""
