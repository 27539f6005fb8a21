"""Hostile input (docs/architecture.md, "Reliability and security"): bad input never crashes a server or the env.

- Property-based fuzzing of the action path: :func:`nemo_gym_env.envs.actions.normalize_action`
  raises nothing but :class:`ActionError` and otherwise returns valid items that travel as
  JSON; the action and observation spaces never raise on anything.
- Schema-driven fuzzing (schemathesis) of every route of every bundled server, launched for
  real and reached over HTTP on loopback, from its own OpenAPI document: valid and invalid
  bodies, a bounded number per route; no 500, no hang.
- Bodies over the limit get 413 before they are read (a declared 10 GB gets it at once,
  without a byte of body sent; a chunked body is cut off soon after the limit), and JSON
  nested deep, lone surrogates, NaN and friends get a 4xx, never a 500.
"""

from __future__ import annotations

import json
import select
import socket
import time
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from nemo_gym_env.envs.actions import normalize_action
from nemo_gym_env.envs.spaces import JsonItems, ResponsesAction
from nemo_gym_env.errors import ActionError
from nemo_gym_env.launch.catalog import bundled_dataset, bundled_servers, bundled_spec
from nemo_gym_env.launch.launcher import Launcher
from nemo_gym_env.protocol.types import make_response

from .conftest import soak, with_config

# ---- the action path ------------------------------------------------------------------------------

NASTY_TEXT = ["", "\x00", "\ud800", "a\udfffb", "\u202e", "🙂", "<tool_call>", "</think>", "{", "\\u0000", "x" * 300]
KEYS = ["type", "role", "content", "arguments", "name", "call_id", "id", "status", "summary", "output", "text",
        "annotations", "object"]
KINDS = ["message", "function_call", "reasoning", "function_call_output", "assistant", "user", "output_text",
         "summary_text", "response"]

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.integers(min_value=10**300), st.floats(),
    st.text(max_size=20), st.sampled_from(NASTY_TEXT + KINDS), st.binary(max_size=8),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.tuples(inner, inner),
        st.dictionaries(st.one_of(st.sampled_from(KEYS), st.text(max_size=6), st.integers()), inner, max_size=4),
        st.frozensets(st.integers(), max_size=3),
    ),
    max_leaves=12,
)
items = st.dictionaries(st.sampled_from(KEYS), values, max_size=7)
plausible_items = st.fixed_dictionaries(
    {"type": st.sampled_from(KINDS)},
    optional={"role": st.sampled_from(["assistant", "user", 3]), "content": values, "arguments": values,
              "name": st.one_of(st.sampled_from(["get_weather", "", "a/b"]), values), "call_id": values,
              "summary": values, "status": values, "id": values},
)
responses = st.builds(lambda output, extra: {"object": "response", "output": output, **extra},
                      st.lists(st.one_of(items, plausible_items), max_size=3),
                      st.dictionaries(st.text(max_size=5), values, max_size=2))
actions = st.one_of(values, st.lists(st.one_of(items, plausible_items), max_size=4), responses,
                    st.text(), st.sampled_from(NASTY_TEXT))

FUZZ = settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))


@FUZZ
@given(action=actions, turn=st.integers(0, 10**6))
def test_normalize_action_raises_action_error_or_returns_wire_ready_items(action: Any, turn: int) -> None:
    try:
        result = normalize_action(action, turn=turn)
    except ActionError:
        return
    assert isinstance(result, list)
    for item in result:
        assert isinstance(item, dict) and item["type"] in ("message", "function_call", "reasoning")
        assert isinstance(item.get("id"), str)
        if item["type"] == "function_call":
            assert isinstance(item["arguments"], str) and isinstance(item["call_id"], str)
    make_response(result)  # valid wire types
    json.dumps(result, ensure_ascii=False, allow_nan=False).encode("utf-8")  # and JSON text
    assert result in ResponsesAction()


@pytest.mark.parametrize("action, why", [
    ([{"type": ["message"]}], "has type"),  # an unhashable type used to raise TypeError
    ([{"type": "function_call", "name": "f", "arguments": {"a": b"x"}}], "arguments are not JSON"),
    ([{"type": "function_call", "name": "f", "arguments": {(1, 2): 1}}], "arguments are not JSON"),
    ([{"type": "message", "content": b"bytes for text"}], "not JSON text"),
    ([{"type": "message", "content": "lone \ud800 surrogate"}], "not JSON text"),
    ("raw text with a lone \udc00 surrogate", "not JSON text"),
])
def test_normalize_action_found_defects_stay_fixed(action: Any, why: str) -> None:
    with pytest.raises(ActionError, match=why):
        normalize_action(action, turn=0)


@FUZZ
@given(value=values)
def test_spaces_never_raise(value: Any) -> None:
    assert JsonItems().contains(value) in (True, False)
    assert ResponsesAction().contains(value) in (True, False)
    assert ResponsesAction().contains([value]) in (True, False)


@pytest.mark.parametrize("seed", range(50))
def test_every_sampled_action_is_accepted(seed: int) -> None:
    space = ResponsesAction(tool_names=("get_weather",), seed=seed)
    for _ in range(10):
        action = space.sample()
        assert action in space
        normalize_action(action, turn=0)


# ---- every bundled server, over HTTP ----------------------------------------------------------------


@pytest.fixture(scope="module")
def bundled() -> Any:
    """Every bundled server, launched once for this module: name -> (``url``, ``openapi`` document)."""
    from concurrent.futures import ThreadPoolExecutor

    def document(url: str) -> dict[str, Any]:
        # FastAPI builds it on the first request: seconds each, for the Responses API types.
        return httpx.get(f"{url}/openapi.json", timeout=120, trust_env=False).json()

    with Launcher(ready_timeout_s=120) as launcher:
        procs = {p.name: p for p in launcher.start_all([bundled_spec(n) for n in sorted(bundled_servers())])}
        with ThreadPoolExecutor(len(procs)) as pool:
            documents = list(pool.map(document, [p.url for p in procs.values()]))
        yield {name: SimpleNamespace(url=p.url, openapi=doc) for (name, p), doc in zip(procs.items(), documents)}


# Examples per route and generation mode; the soak run (NEMO_GYM_ENV_SOAK=1) takes ten times more.
SCALE = 10 if soak() else 1
EXAMPLES = {"positive": 4 * SCALE, "negative": 5 * SCALE}
VERIFY_EXAMPLES = {"positive": 2 * SCALE, "negative": 2 * SCALE}  # the Response schema is slow to generate from


@pytest.mark.slow
@pytest.mark.parametrize("server", sorted(bundled_servers()))
def test_schema_fuzzing_finds_no_500_and_no_hang(bundled, server, figures):
    import schemathesis
    from schemathesis import GenerationMode

    url = bundled[server].url
    schema = schemathesis.openapi.from_dict(bundled[server].openapi)
    statuses: Counter = Counter()
    slowest = 0.0
    failures: list[str] = []
    operations = [result.ok() for result in schema.get_all_operations()]
    paths = {op.path for op in operations}
    gymnasium_protocol = "/reset" in paths  # a Gymnasium-protocol server (guess_number): no /seed_session, /verify
    assert paths >= ({"/reset", "/step", "/aggregate_metrics"} if gymnasium_protocol
                     else {"/seed_session", "/verify", "/aggregate_metrics"})
    for operation in operations:
        budget = VERIFY_EXAMPLES if operation.path == "/verify" else EXAMPLES
        takes_input = bool(operation.definition.raw.get("requestBody") or operation.definition.raw.get("parameters"))
        # A route that takes no input (GET /reverify_mode) has no invalid input to send.
        modes = (GenerationMode.POSITIVE, GenerationMode.NEGATIVE) if takes_input else (GenerationMode.POSITIVE,)
        for mode in modes:

            @settings(max_examples=budget[mode.value], deadline=None, database=None, derandomize=True,
                      phases=[Phase.generate], suppress_health_check=list(HealthCheck))
            @given(case=operation.as_strategy(generation_mode=mode))
            def fuzz(case: Any) -> None:
                nonlocal slowest
                started = time.monotonic()
                try:
                    response = case.call(base_url=url, timeout=30)
                except Exception as exc:  # noqa: BLE001 - a hang or a dropped connection is a finding
                    failures.append(f"{operation.path} ({mode.value}): {type(exc).__name__}: {exc}"[:300])
                    return
                slowest = max(slowest, time.monotonic() - started)
                statuses[response.status_code] += 1
                if response.status_code >= 500:
                    failures.append(f"{operation.path} ({mode.value}) -> {response.status_code}: {response.text[:300]}")

            fuzz()
    assert httpx.get(f"{url}/", timeout=10, trust_env=False).json() == {"status": "ok"}
    assert not failures, failures
    assert slowest < 30
    figures.record(f"{server}: routes", len(operations))
    figures.record(f"{server}: requests by status", dict(sorted(statuses.items())))
    figures.record(f"{server}: slowest reply", round(slowest, 2), "s")


def _raw_request(url: str, head: str, timeout_s: float = 10.0) -> tuple[int, bytes, float]:
    """Send ``head`` (no body) on a raw socket; return (status, reply bytes, seconds to the reply)."""
    parts = urlsplit(url)
    with socket.create_connection((parts.hostname, parts.port), timeout=timeout_s) as sock:
        started = time.monotonic()
        sock.sendall(head.encode("latin-1"))
        reply = b""
        while b"\r\n\r\n" not in reply:
            chunk = sock.recv(65536)
            if not chunk:
                break
            reply += chunk
        return int(reply.split(b" ", 2)[1]), reply, time.monotonic() - started


def _head(url: str, route: str, length: int) -> str:
    host = urlsplit(url).netloc
    return (f"POST {route} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {length}\r\n\r\n")


@pytest.mark.slow
def test_a_declared_10_gb_body_gets_413_at_once_without_being_sent(bundled, figures):
    ten_gb = 10 * 1000**3
    seconds = []
    for server in ("example_single_tool_call", "math", "code_gen"):
        url = bundled[server].url
        for route in ("/seed_session", "/verify", "/aggregate_metrics"):
            status, reply, elapsed = _raw_request(url, _head(url, route, ten_gb))
            assert status == 413, reply[:300]
            assert b"exceeds the" in reply or b"413" in reply
            seconds.append(elapsed)
    assert max(seconds) < 5
    figures.record("declared Content-Length", "10 GB (no body sent)")
    figures.record("413 replies / requests", f"{len(seconds)} / {len(seconds)}")
    figures.record("slowest 413", round(max(seconds) * 1000, 1), "ms")


@pytest.mark.slow
def test_a_chunked_body_past_the_limit_is_cut_off_early(figures):
    limit = 64 * 1024
    with Launcher(ready_timeout_s=60) as launcher:
        proc = launcher.start(with_config(bundled_spec("example_single_tool_call"), max_body_bytes=limit))
        parts = urlsplit(proc.url)
        head = (f"POST /get_weather HTTP/1.1\r\nHost: {parts.netloc}\r\nContent-Type: application/json\r\n"
                "Transfer-Encoding: chunked\r\n\r\n")
        chunk = b" " * 16384
        sent, reply = 0, b""
        with socket.create_connection((parts.hostname, parts.port), timeout=10) as sock:
            sock.sendall(head.encode())
            started = time.monotonic()
            while sent < 64 * 1024 * 1024 and time.monotonic() - started < 30:  # offers up to 64 MiB
                if select.select([sock], [], [], 0)[0]:
                    reply = sock.recv(65536)
                    break
                try:
                    sock.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                except OSError:  # the server stopped reading and closed
                    reply = sock.recv(65536)
                    break
                sent += len(chunk)
                time.sleep(0.002)
            if not reply:
                reply = sock.recv(65536)
    assert reply.startswith(b"HTTP/1.1 413"), reply[:200]
    assert sent < 16 * limit, f"the server read {sent} bytes before refusing"
    figures.record("max_body_bytes", limit)
    figures.record("chunked body sent before the 413", sent, "bytes")


def _verify_body(server: str) -> dict[str, Any]:
    row = json.loads(Path(bundled_dataset(server)).read_text().splitlines()[0])
    message = {"type": "message", "role": "assistant", "id": "m", "status": "completed",
               "content": [{"type": "output_text", "text": "42", "annotations": []}]}
    return {**row, "response": make_response([message]).model_dump(mode="json", exclude_none=True)}


def _bodies(server: str, route: str, depth: int) -> list[bytes]:
    nest = "[" * depth + "]" * depth
    if route == "/verify":
        base = json.dumps(_verify_body(server))
    elif route == "/seed_session":
        base = json.dumps(json.loads(Path(bundled_dataset(server)).read_text().splitlines()[0]))
    elif route == "/aggregate_metrics":
        base = '{"verify_responses": [{"reward": 1.0}]}'
    else:
        base = "{}"
    with_extra = (base[:-1] + ", " if base != "{}" else "{") + f'"extra": {nest}}}'
    return [nest.encode(), with_extra.encode()]


DEPTHS = [100, 300, 600, 900, 1000, 5000, 100_000]
LITERALS = ["NaN", "Infinity", "-Infinity", "1e999", "1" + "0" * 400, '"\\ud800"', '"\\udfff\\ud800"', '"\\u0000"',
            "null", "[]", "{}", "true", '"x"']


def _routes(document: dict[str, Any]) -> list[str]:
    return [path for path, operations in document["paths"].items() if "post" in operations]


@pytest.mark.slow
@pytest.mark.parametrize("server", sorted(bundled_servers()))
def test_deep_nesting_and_odd_literals_get_4xx_never_500(bundled, server, figures):
    url = bundled[server].url
    statuses: Counter = Counter()
    failures = []
    with httpx.Client(base_url=url, timeout=30, trust_env=False) as http:

        def post(route: str, body: bytes, what: str) -> None:
            response = http.post(route, content=body, headers={"content-type": "application/json"})
            statuses[response.status_code] += 1
            if response.status_code >= 500:
                failures.append(f"{route} {what}: {response.status_code} {response.text[:200]}")

        for route in _routes(bundled[server].openapi):
            for depth in DEPTHS:
                for body in _bodies(server, route, depth):
                    post(route, body, f"depth {depth}")
            base = (json.dumps(_verify_body(server)) if route == "/verify"
                    else Path(bundled_dataset(server)).read_text().splitlines()[0] if route == "/seed_session" else "{}")
            for literal in LITERALS:
                extra = (base[:-1] + ", " if base.strip() != "{}" else "{") + f'"extra": {literal}}}'
                post(route, extra.encode(), f"extra {literal[:12]}")
                if route == "/aggregate_metrics":
                    body = '{"verify_responses": [{"reward": %s, "_ng_task_index": %s}, {"reward": 1}]}'
                    post(route, (body % (literal, literal)).encode(), f"reward {literal[:12]}")
                if route == "/verify":
                    post(route, (json.dumps(_verify_body(server))[:-1] + f', "reward": {literal}}}').encode(),
                         f"reward {literal[:12]}")
    assert not failures, failures
    assert httpx.get(f"{url}/", timeout=10, trust_env=False).json() == {"status": "ok"}
    figures.record(f"{server}: replies by status", dict(sorted(statuses.items())))
