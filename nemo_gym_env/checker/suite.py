"""The checks of ``nemo-gym-env check``: Gymnasium's ``check_env``, for a running resources server.

:func:`check_server` finds the protocol (``/seed_session`` + ``/verify``, or ``/reset`` + ``/step``)
and checks, each as pass / warn / fail (or skip where it does not apply) with its evidence:

==================  ===============================================================================
check               passes when
==================  ===============================================================================
reachable           ``GET /`` answers (a 404 is a warning: no liveness route)
protocol            the routes of one protocol are there
session_cookie      starting an episode answers a JSON object and sets a session cookie
isolation           two sessions played interleaved on the example rows answer as each alone, with
                    distinct cookies
tools               every tool is a valid OpenAI function definition (``/openapi.json``; the rows' tools
                    of a Gymnasium-protocol server)
end_empty           ``/verify`` (``/step``) of an empty trajectory: 200 and a finite reward that judges the
                    episode (no verifier failure: a ``failure_kind`` of the verifier's own, a
                    ``failure_reason`` that is an exception, ``mask_sample``; a trainer masks those)
end_wrong           the same for a wrong trajectory (an unknown tool, arguments that are not JSON)
malformed_body      a body that is not JSON gets a 4xx
oversized_body      a body over ``oversized_mb`` gets a 4xx (413)
unknown_session     a forged (lost) session cookie gets a 4xx (NeMo Gym names 404; ours answer 410
                    Gone); an unknown route a 404
session_contract    NeMo Gym 0.7's typed seed, where the server claims it (echoes the id): repeat seed
                    200, a conflicting seed 409, close and repeated close 200, close of an id never
                    seeded 200, a seed after close 409
concurrency         ``concurrency`` episodes at once all answer; latency percentiles
==================  ===============================================================================

A 5xx, no answer within ``timeout_s``, or a broken connection fails a check. The whole run stops
at ``time_limit_s``: what has not run by then fails with that evidence. A server that does not
answer ``GET /`` at all fails every check at once, each with that evidence. Traffic is bounded:
about 30 requests plus ``2 x concurrency``, and one body of ``oversized_mb``.
"""

from __future__ import annotations

import asyncio
import copy
import re
import uuid
from dataclasses import dataclass
from typing import Any

from nemo_gym_env.checker.probes import Answer, Prober, percentiles
from nemo_gym_env.checker.report import Report
from nemo_gym_env.checker.schemas import function_definitions, schema_problems
from nemo_gym_env.protocol.failures import verdict_failure
from nemo_gym_env.protocol.types import make_response

__all__ = ["CHECKS", "CheckSettings", "check_server"]

CHECKS = ("reachable", "protocol", "session_cookie", "isolation", "tools", "end_empty", "end_wrong",
          "malformed_body", "oversized_body", "unknown_session", "session_contract", "concurrency")

_DEFAULT_ROW = {"responses_create_params": {"input": [{"role": "user", "content": "Hello."}]}}


@dataclass
class CheckSettings:
    """How hard to check."""

    timeout_s: float = 10.0
    """Every probe's limit."""
    time_limit_s: float = 120.0
    """The whole run's limit."""
    concurrency: int = 16
    """Episodes at once in the concurrency check."""
    oversized_mb: float = 40.0
    """The size of the oversized body (above the 32 MiB a server of ours accepts)."""


def _message(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "assistant", "id": f"msg_{uuid.uuid4().hex[:8]}", "status": "completed",
            "content": [{"type": "output_text", "text": text, "annotations": []}]}


def _row_tools(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every distinct function tool the rows offer (by name, the first row's definition)."""
    found: dict[str, dict[str, Any]] = {}
    for row in rows:
        params = row.get("responses_create_params") if isinstance(row, dict) else None
        for spec in (params.get("tools") if isinstance(params, dict) else None) or []:
            if isinstance(spec, dict) and spec.get("type", "function") == "function" and spec.get("name"):
                found.setdefault(str(spec["name"]), spec)
    return list(found.values())


def _wrong_items() -> list[dict[str, Any]]:
    call = {"type": "function_call", "call_id": "call_check_0", "name": "no_such_tool_here", "arguments": "{not json",
            "id": "fc_check_0"}
    output = {"type": "function_call_output", "call_id": "call_check_0",
              "output": '{"error": "Invalid tool call arguments"}'}
    return [call, output, _message("zzz <action>not an action</action> [Z 9]")]


class _Run:
    """One check run against one server."""

    def __init__(self, url: str, rows: list[dict[str, Any]], settings: CheckSettings, report: Report):
        self.probe = Prober(url, settings.timeout_s)
        self.rows = [r for r in rows if isinstance(r, dict)] or [_DEFAULT_ROW]
        self.settings = settings
        self.report = report
        self.gymnasium = False
        self.cookie_name: str | None = None

    # ---- the episode, in either protocol ------------------------------------------------------

    @property
    def start_route(self) -> str:
        return "/reset" if self.gymnasium else "/seed_session"

    @property
    def end_route(self) -> str:
        return "/step" if self.gymnasium else "/verify"

    async def start(self, row: dict[str, Any], jar: dict[str, str]) -> Answer:
        return await self.probe.post(self.start_route, row, jar)

    async def end(self, row: dict[str, Any], jar: dict[str, str], items: list[dict[str, Any]]) -> Answer:
        response = make_response(items).model_dump(mode="json")
        return await self.probe.post(self.end_route, {**copy.deepcopy(row), "response": response}, jar)

    def _rate_end(self, answer: Answer) -> tuple[str, str]:
        """A verify / step answer as pass / warn / fail."""
        if answer.status is None or answer.status >= 500:
            return "fail", answer.evidence()
        if answer.client_error:
            return "warn", f"refused instead of scored: {answer.evidence()}"
        if answer.reward() is None and not (self.gymnasium and isinstance(answer.body, dict)
                                            and "reward" not in answer.body):
            return "fail", f"no finite reward: {answer.evidence()}"
        failure = _judged_nothing(answer.body)
        if failure is not None:
            return "fail", f"the verifier judged nothing ({failure}); a trainer masks such a reply: {answer.evidence()}"
        if self.gymnasium and not all(isinstance((answer.body or {}).get(k), bool) for k in ("terminated", "truncated")):
            return "fail", f"terminated/truncated are not booleans: {answer.evidence()}"
        return "pass", answer.evidence()

    # ---- the checks ---------------------------------------------------------------------------

    async def reachable(self) -> bool:
        answer = await self.probe.get("/")
        if answer.status is None or answer.status >= 500:
            self.report.add("reachable", "fail", answer.evidence())
            return False
        self.report.add("reachable", "pass" if answer.ok else "warn",
                        answer.evidence() if answer.ok else f"no liveness route: {answer.evidence()}")
        return True

    async def protocol(self) -> bool:
        routes = ("/seed_session", "/verify", "/reset", "/step")
        answers = await asyncio.gather(*(self.probe.get(r) for r in routes))
        present = {r for r, a in zip(routes, answers) if a.status is not None and a.status != 404}
        if present & {"/seed_session", "/verify"} == {"/seed_session", "/verify"}:
            self.report.protocol = "resources"
        elif present & {"/reset", "/step"} == {"/reset", "/step"}:
            self.report.protocol, self.gymnasium = "gymnasium", True
        else:
            evidence = "; ".join(a.evidence() for a in answers)
            self.report.add("protocol", "fail", f"neither /seed_session + /verify nor /reset + /step: {evidence}")
            return False
        self.report.add("protocol", "pass", f"{self.report.protocol}: GET on {', '.join(sorted(present))} "
                                            "answers that the routes exist")
        return True

    async def session_cookie(self) -> None:
        jar: dict[str, str] = {}
        answer = await self.start(self.rows[0], jar)
        if not answer.ok:
            self.report.add("session_cookie", "fail", f"cannot start an episode: {answer.evidence()}")
            return
        if not isinstance(answer.body, dict):
            self.report.add("session_cookie", "fail", f"{self.start_route} answered something that is not a JSON "
                                                      f"object: {answer.evidence()}")
            return
        if not jar:
            self.report.add("session_cookie", "warn", f"no session cookie set: {answer.evidence()}")
            return
        self.cookie_name = next(iter(jar))
        self.report.add("session_cookie", "pass", f"{self.start_route} set the cookie {self.cookie_name}")

    async def isolation(self) -> None:
        first, second = self.rows[0], self.rows[1 % len(self.rows)]
        turns = [[_message("<action>0</action> [A C] [1] first")], [_message("<action>1</action> [A B] [2] second")]]
        alone: dict[str, str] = {}
        solo = [await self.start(first, alone)]
        for turn in turns[: self._turns()]:
            if _over(solo[-1]):
                break
            solo.append(await self.end(first, alone, turn))
        jar_a: dict[str, str] = {}
        jar_b: dict[str, str] = {}
        mixed_a, mixed_b = [await self.start(first, jar_a)], [await self.start(second, jar_b)]
        for turn in turns[: len(solo) - 1]:
            mixed_a.append(await self.end(first, jar_a, turn))
            if not _over(mixed_b[-1]):
                mixed_b.append(await self.end(second, jar_b, turn))
        bad = [a for a in solo + mixed_a if not a.ok]
        if bad:
            self.report.add("isolation", "fail", f"an episode failed: {bad[0].evidence()}")
            return
        if jar_a and jar_a == jar_b:
            self.report.add("isolation", "fail", "two sessions got the same cookie")
            return
        if [_essence(a.body) for a in solo] != [_essence(a.body) for a in mixed_a]:
            self.report.add("isolation", "warn", "the episode interleaved with another answered differently from the "
                            f"same episode alone: {_essence(mixed_a[-1].body)} vs {_essence(solo[-1].body)} (state "
                            "shared between sessions, or not determined by the row)")
            return
        self.report.add("isolation", "pass", f"row 0 played alone and interleaved with row {1 % len(self.rows)} in "
                                             f"another session: the same {len(solo)} answers, distinct cookies")

    def _turns(self) -> int:
        return 2 if self.gymnasium else 1

    async def tools(self) -> None:
        if self.gymnasium:  # its tools (a conversational server's) are the rows' own; /step answers them
            found = [(spec, schema_problems(str(spec.get("name")), spec.get("parameters")))
                     for spec in _row_tools(self.rows)]
            if not found:
                self.report.add("tools", "skip", "a Gymnasium-protocol server whose rows offer no tools")
            elif any(problems for _, problems in found):
                self.report.add("tools", "fail", "; ".join(f"{d.get('name')}: {', '.join(p)}" for d, p in found if p))
            else:
                self.report.add("tools", "pass", f"the rows offer {len(found)} valid function definition(s): "
                                                 f"{', '.join(str(d['name']) for d, _ in found)}")
            return
        # FastAPI builds the document on its first request: seconds of CPU for a server with many models.
        answer = await self.probe.get("/openapi.json", timeout_s=max(3 * self.settings.timeout_s, 30.0))
        if not answer.ok or not isinstance(answer.body, dict):
            self.report.add("tools", "warn", f"no OpenAPI document, tools not checked: {answer.evidence()}")
            return
        found = function_definitions(answer.body)
        broken = [(d["name"], p) for d, p in found if p]
        if broken:
            self.report.add("tools", "fail", "; ".join(f"{n}: {', '.join(p)}" for n, p in broken),
                            tools=[d["name"] for d, _ in found])
        elif not found:
            self.report.add("tools", "pass", "no tools (a server that only verifies)")
        else:
            self.report.add("tools", "pass", f"{len(found)} valid function definition(s): "
                                             f"{', '.join(d['name'] for d, _ in found)}",
                            tools=[d for d, _ in found])

    async def end_trajectories(self) -> None:
        for name, items in (("end_empty", []), ("end_wrong", _wrong_items())):
            jar: dict[str, str] = {}
            started = await self.start(self.rows[0], jar)
            if not started.ok:
                self.report.add(name, "fail", f"cannot start an episode: {started.evidence()}")
                continue
            status, evidence = self._rate_end(await self.end(self.rows[0], jar, items))
            self.report.add(name, status, evidence)

    async def bad_bodies(self) -> None:
        answer = await self.probe.post(self.start_route, raw=b'{"responses_create_params": {not json')
        self.report.add("malformed_body", *_rate_refusal(answer))
        size = int(self.settings.oversized_mb * 1024 * 1024)
        answer = await self.probe.post(self.start_route, raw=b'{"pad": "' + b"x" * size + b'"}')
        if answer.status is None and "mid-request" in (answer.error or ""):
            self.report.add("oversized_body", "warn", f"{self.settings.oversized_mb:g} MiB body: the connection was "
                                                      f"closed without a status ({answer.error})")
        else:
            status, evidence = _rate_refusal(answer)
            self.report.add("oversized_body", status, f"{self.settings.oversized_mb:g} MiB body: {evidence}")

    async def unknown_session(self) -> None:
        name = self.cookie_name or "session"
        forged = {name: "forged-" + uuid.uuid4().hex}
        answer = await self.end(self.rows[0], forged, [_message("hello")])
        unknown_route = await self.probe.post(f"/no_such_route_{uuid.uuid4().hex[:6]}", {})
        status, evidence = _rate_refusal(answer, accepted="a forged session cookie was accepted (fine where this "
                                                           "route reads no session state; a stateful one must refuse it)")
        if unknown_route.status != 404 and status == "pass":
            status, evidence = "warn", f"an unknown route did not get 404: {unknown_route.evidence()}"
        self.report.add("unknown_session", status, evidence)

    async def session_contract(self) -> None:
        if self.gymnasium:
            self.report.add("session_contract", "skip", "NeMo Gym's typed session contract is a resources-server one")
            return
        sid = f"check-{uuid.uuid4().hex[:12]}"
        episode = {"rollout_id": f"r-{sid}", "attempt": 0}
        typed = {"resources_session_id": sid, "episode_id": episode,
                 "task_id": {"taskset": "check", "task_id": "0"}, "task_data": self.rows[0]}
        first = await self.probe.post("/seed_session", typed, {})
        claimed = first.ok and isinstance(first.body, dict) and first.body.get("resources_session_id") == sid
        if not claimed:
            self.report.add("session_contract", "skip", f"the typed seed is not claimed: {first.evidence()}")
            return
        steps: list[tuple[str, Answer, bool]] = []
        again = await self.probe.post("/seed_session", typed, {})
        steps.append(("repeated seed -> 200, same id", again,
                      again.ok and (again.body or {}).get("resources_session_id") == sid))
        other = {**typed, "task_id": {"taskset": "check", "task_id": "other"},
                 "episode_id": {"rollout_id": f"r2-{sid}", "attempt": 0}}
        conflict = await self.probe.post("/seed_session", other, {})
        steps.append(("conflicting seed -> 409", conflict, conflict.status == 409))
        close = {"resources_session_id": sid, "episode_id": episode}
        for label in ("close -> 200", "repeated close -> 200"):
            answer = await self.probe.post("/close_session", close, {})
            steps.append((label, answer, answer.ok and (answer.body or {}).get("resources_session_id") == sid))
        never = {"resources_session_id": f"{sid}-never", "episode_id": episode}
        answer = await self.probe.post("/close_session", never, {})
        steps.append(("close of a never-seeded session -> 200", answer, answer.ok))
        late = await self.probe.post("/seed_session", typed, {})
        steps.append(("seed after close -> 409", late, late.status == 409))
        late_never = await self.probe.post("/seed_session", {**typed, "resources_session_id": f"{sid}-never"}, {})
        steps.append(("seed of an id closed unseeded -> 409", late_never, late_never.status == 409))
        broken = [(label, answer) for label, answer, ok in steps if not ok]
        if any(answer.status is None or answer.status >= 500 for _, answer in broken):
            label, answer = next((lb, a) for lb, a in broken if a.status is None or a.status >= 500)
            self.report.add("session_contract", "fail", f"{label}: {answer.evidence()}")
        elif broken:
            self.report.add("session_contract", "warn", "; ".join(f"{label}: got {a.status}" for label, a in broken),
                            kept=[label for label, _, ok in steps if ok])
        else:
            self.report.add("session_contract", "pass", "typed seed claimed; " + "; ".join(lb for lb, _, _ in steps))

    async def concurrency(self) -> None:
        n = self.settings.concurrency
        timings: list[float] = []

        async def one(i: int) -> list[Answer]:
            row, jar = self.rows[i % len(self.rows)], {}
            started = await self.start(row, jar)
            ended = await self.end(row, jar, [_message("<action>0</action> [1] done")]) if started.ok else None
            return [a for a in (started, ended) if a is not None]

        answers = [a for batch in await asyncio.gather(*(one(i) for i in range(n))) for a in batch]
        timings = [a.seconds for a in answers if a.status is not None]
        failed = [a for a in answers if not a.ok]
        stats = percentiles(timings)
        summary = ", ".join(f"{k} {v:g} ms" for k, v in stats.items())
        if failed:
            self.report.add("concurrency", "fail", f"{len(failed)} of {len(answers)} requests of {n} episodes at once "
                                                   f"failed, e.g. {failed[0].evidence()}", latency_ms=stats)
        else:
            self.report.add("concurrency", "pass", f"{n} episodes at once, {len(answers)} requests, all answered: "
                                                   f"{summary}", latency_ms=stats)


def _over(answer: Answer) -> bool:
    """Whether a step answer ended its episode (or failed: nothing more to play)."""
    body = answer.body if isinstance(answer.body, dict) else {}
    return not answer.ok or bool(body.get("terminated") or body.get("truncated"))


def _essence(body: Any) -> Any:
    """What two equal episodes answer alike (ids and timings left out)."""
    if not isinstance(body, dict):
        return body
    keep = ("observation", "reward", "terminated", "truncated")
    if any(k in body for k in keep):
        return {k: body.get(k) for k in keep}
    return {k: v for k, v in body.items() if k in ("reward",)}


def _rate_refusal(answer: Answer, *, accepted: str = "accepted") -> tuple[str, str]:
    """A request that should be refused: 4xx pass, 2xx warn, 5xx or no answer fail."""
    if answer.client_error:
        return "pass", answer.evidence()
    if answer.ok:
        return "warn", f"{accepted}: {answer.evidence()}"
    return "fail", answer.evidence()


async def check_server(url: str, rows: list[dict[str, Any]] | None = None,
                       settings: CheckSettings | None = None) -> Report:
    """Check the server at ``url`` (see the module docstring); the example ``rows`` drive the episodes."""
    settings = settings or CheckSettings()
    report = Report(url)
    run = _Run(url, list(rows or []), settings, report)
    steps = (run.session_cookie, run.isolation, run.tools, run.end_trajectories, run.bad_bodies,
             run.unknown_session, run.session_contract, run.concurrency)
    try:
        async with asyncio.timeout(settings.time_limit_s):
            if not await run.reachable():
                _fail_rest(report, f"the server did not answer GET /: {report.checks[-1].evidence}")
                return report
            if not await run.protocol():
                _fail_rest(report, "not a resources server (no known protocol)")
                return report
            for step in steps:
                await step()
    except TimeoutError:
        _fail_rest(report, f"not run: the check's time limit of {settings.time_limit_s:g} s was reached")
    return report


def _fail_rest(report: Report, why: str) -> None:
    done = {c.name for c in report.checks}
    for name in CHECKS:
        if name not in done:
            report.add(name, "fail", why)


_EXCEPTION = re.compile(r"^(Traceback \(most recent call last\)|[A-Za-z_][\w.]*(Error|Exception)\b)")


def _judged_nothing(body: Any) -> str | None:
    """Why a verify reply judges nothing, as a trainer reads it (``protocol.failures``: a ``failure_kind`` of the
    verifier's own failure, ``mask_sample``), or because its ``failure_reason`` is an exception; else None."""
    if not isinstance(body, dict):
        return None
    failure = verdict_failure(body)
    if failure is not None:
        return failure[1]
    reason = body.get("failure_reason")
    if isinstance(reason, str) and _EXCEPTION.match(reason.strip()):
        return f"failure_reason is an exception: {reason[:200]}"
    return None
