"""How the env tells a server's protocol (``envs.traits``), against real server processes on 127.0.0.1.

The protocol is told from the server itself, not from its config class: a server given only by
``base_url`` has no config the env could read. A ``GET`` on each route that differs answers 405
where the route is and 404 where it is not (no side effect, no work on the server); a server
that answers 404 to every ``GET`` is probed (``POST /seed_session``, then ``POST /reset``: a 404
means the route is absent). These tests cover both paths, a server that speaks neither, one that
cannot be reached, and the ``protocol`` argument that skips the detection.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from nemo_gym_env import NemoGymEnv, ServerError
from nemo_gym_env.client.loop import background_loop
from nemo_gym_env.client.resources import ResourcesClient
from nemo_gym_env.envs import traits as envs_traits
from nemo_gym_env.envs.gymnasium_episode import GymnasiumEpisode
from nemo_gym_env.envs.traits import open_episode, server_traits
from nemo_gym_env.launch.launcher import Launcher

from ..fixtures import fixture_specs

pytestmark = pytest.mark.slow

ROW = {"responses_create_params": {"input": [{"role": "user", "content": "hi"}]}}


@pytest.fixture(scope="module")
def urls() -> Iterator[dict[str, str]]:
    with Launcher(ready_timeout_s=60) as launcher:
        yield {p.name: p.url for p in launcher.start_all(fixture_specs("protocols").values())}


def traits(url: str, protocol: str = "auto") -> envs_traits.ServerTraits:
    envs_traits._KNOWN.pop(url, None)  # told afresh, not from an earlier test's cache
    return background_loop().run(server_traits(ResourcesClient(url, timeout_s=10), protocol), timeout=60)


def received(url: str) -> list[dict[str, Any]]:
    return httpx.get(f"{url}/_log", timeout=10).json()


def test_our_gymnasium_server_is_told_by_its_routes(urls):
    found = traits(urls["proto_countdown"])
    assert (found.protocol, found.found_by, found.close_session) == ("gymnasium", "routes", False)


def test_a_gymnasium_server_without_openapi_is_told_by_its_routes_and_gets_no_post(urls):
    url = urls["proto_scripted_steps"]
    assert httpx.get(f"{url}/openapi.json", timeout=10).status_code == 404
    before = len(received(url))
    found = traits(url)
    assert (found.protocol, found.found_by) == ("gymnasium", "routes")
    assert len(received(url)) == before  # GETs only: nothing reached /reset or /step


def test_a_server_that_answers_404_to_every_get_is_told_by_post_probes(urls):
    url = urls["proto_no_get"]
    found = traits(url)
    assert (found.protocol, found.found_by) == ("gymnasium", "probe")
    assert [entry["route"] for entry in received(url)][-1] == "/reset"  # the probe reached /reset


def test_a_bundled_resources_server_needs_no_close_session(launched):
    # Our servers free a session's state at /verify and say so on GET /verify: no extra request.
    url = launched["example_session_state_mgmt"]
    probe = httpx.get(f"{url}/verify", timeout=10)
    assert (probe.status_code, probe.headers["allow"], probe.headers[envs_traits.RELEASES_SESSION]) == (405, "POST",
                                                                                                   "true")
    found = traits(url)
    assert (found.protocol, found.found_by, found.close_session) == ("resources", "routes", False)


def test_a_resources_server_that_keeps_sessions_past_verify_gets_close_session(urls):
    found = traits(urls["proto_close_fails"])
    assert (found.protocol, found.close_session) == ("resources", True)


def test_a_server_speaking_neither_protocol_is_a_clear_error_naming_the_routes_tried(urls):
    with pytest.raises(ServerError) as raised:
        traits(urls["proto_neither"])
    message = str(raised.value)
    assert "speaks neither protocol" in message
    assert "POST /seed_session" in message and "POST /reset" in message
    assert all(route in message for route in ("/step", "/close_session", "/verify"))  # the GETs tried
    assert urls["proto_neither"] in message


def test_the_env_reports_a_server_speaking_neither_protocol_at_reset(urls):
    env = NemoGymEnv(base_url=urls["proto_neither"], dataset=[ROW])
    envs_traits._KNOWN.pop(urls["proto_neither"], None)
    try:
        with pytest.raises(ServerError, match="neither protocol"):
            env.reset()
    finally:
        env.close()


def test_an_unreachable_server_is_taken_for_a_resources_server_and_asked_again():
    with Launcher(ready_timeout_s=60) as launcher:
        url = launcher.start(fixture_specs("protocols")["proto_countdown"]).url
    found = traits(url)  # stopped: nothing listens there now
    assert (found.protocol, found.found_by) == ("resources", "unreachable")
    assert url not in envs_traits._KNOWN


def test_a_server_of_the_other_protocol_at_a_freed_address_is_told_afresh():
    # The protocol is kept per address; a port freed and taken again by a server of the other
    # protocol answers 404 on the kept protocol's first route, and the env tells it again.
    specs = fixture_specs("protocols")
    env = None
    try:
        with Launcher(ready_timeout_s=60) as launcher:
            url = launcher.start(specs["proto_countdown"]).url
            envs_traits._KNOWN.pop(url, None)
            env = NemoGymEnv(base_url=url, dataset=[{**ROW, "expected": 1}])
            env.reset()
            assert envs_traits._KNOWN[url].protocol == "gymnasium"
        port = int(url.rsplit(":", 1)[1])
        with Launcher(ready_timeout_s=60) as launcher:
            assert launcher.start(specs["proto_close_fails"], port=port).url == url
            env.reset()
            assert envs_traits._KNOWN[url].protocol == "resources"
            _, reward, terminated, truncated, _ = env.step("my answer")
            assert (reward, terminated, truncated) == (1.0, True, False)
    finally:
        if env is not None:
            env.close()


def test_the_protocol_argument_skips_detection_and_is_checked(urls):
    url = urls["proto_scripted_steps"]
    before = len(received(url))
    assert traits(url, "gymnasium") == envs_traits.ServerTraits("gymnasium")
    assert len(received(url)) == before  # nothing was probed
    with pytest.raises(ValueError, match="protocol must be"):
        traits(url, "grpc")


def test_detection_is_done_once_per_server(urls):
    url = urls["proto_scripted_steps"]
    traits(url)
    before = len(received(url))
    client = ResourcesClient(url, timeout_s=10)
    for _ in range(3):
        assert background_loop().run(server_traits(client), timeout=60).protocol == "gymnasium"
    assert len(received(url)) == before


def test_open_episode_speaks_the_told_protocol(urls):
    client = ResourcesClient(urls["proto_countdown"])
    assert isinstance(open_episode(envs_traits.ServerTraits("gymnasium"), client, ROW, 0, 4), GymnasiumEpisode)
    episode = open_episode(envs_traits.ServerTraits("resources", close_session=True), client, ROW, 0, 4)
    assert not isinstance(episode, GymnasiumEpisode) and episode.close_session


def test_a_failing_close_session_never_fails_the_episode(urls, caplog):
    url = urls["proto_close_fails"]
    envs_traits._KNOWN.pop(url, None)
    env = NemoGymEnv(base_url=url, dataset=[{**ROW, "expected": 1}])
    try:
        env.reset()
        with caplog.at_level("WARNING"):
            obs, reward, terminated, truncated, info = env.step("my answer")
        assert (reward, terminated, truncated) == (1.0, True, False)
        assert "error" not in info
        routes = [entry["route"] for entry in received(url)]
        assert routes[-2:] == ["/verify", "/close_session"]
        close = received(url)[-1]["body"]
        assert set(close) == {"resources_session_id", "episode_id"}
        assert any("/close_session" in r.getMessage() and "500" in r.getMessage() for r in caplog.records)
    finally:
        env.close()


def test_nemo_gym_07_verdict_fields_reach_info(urls):
    """mask_sample, failure_kind, failure_reason and reward_components of a /verify reply reach info;
    a masked verdict (an infrastructure failure) ends the episode truncated with the reason, no reward."""
    url = urls["proto_close_fails"]
    verdict = {"reward": 0.0, "mask_sample": True, "failure_kind": "judge_failed", "failure_reason": "judge down",
               "reward_components": {"correctness": 0.0, "format": 1.0}}
    scored = {"reward": 0.5, "failure_kind": "wrong_answer", "failure_reason": "off by one",
              "reward_components": {"correctness": 0.0, "format": 0.5}}
    bad = {"reward": 2.0, "mask_sample": "yes"}
    env = NemoGymEnv(base_url=url, dataset=[{**ROW, "verdict": verdict}, {**ROW, "verdict": bad},
                                            {**ROW, "verdict": scored}])
    try:
        env.reset(options={"task_index": 0})
        _, reward, terminated, truncated, info = env.step("answer")
        assert (reward, terminated, truncated) == (0.0, False, True)
        assert (info["mask_sample"], info["failure_kind"], info["failure_reason"]) == (True, "judge_failed",
                                                                                       "judge down")
        assert "judge_failed (infrastructure; no reward): judge down" in info["error"]
        assert info["reward_components"] == {"correctness": 0.0, "format": 1.0}
        assert env.unwrapped.last_verify["mask_sample"] is True  # the reply is kept for whoever looks into it
        env.reset(options={"task_index": 2})  # the model's fault: a reward like any other
        _, reward, terminated, truncated, info = env.step("answer")
        assert (reward, terminated, truncated) == (0.5, True, False) and "error" not in info
        assert info["failure_kind"] == "wrong_answer" and "mask_sample" not in info
        env.reset(options={"task_index": 1})
        _, reward, _, truncated, info = env.step("answer")
        assert "mask_sample" in info.get("error", "") and truncated and reward == 0.0  # not a bool: refused
    finally:
        env.close()
