"""Tests for nemo_gym_env.launch.config: NeMo Gym config loading, server specs and redaction."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from omegaconf import DictConfig, OmegaConf

from nemo_gym_env.errors import ConfigError
from nemo_gym_env.launch.config import (
    SERVER_TYPES,
    ServerSpec,
    load_config,
    parse_overrides,
    server_specs,
    to_yaml,
)
from nemo_gym_env.system.redaction import REDACTED, SECRET_KEY_PATTERN, redact

REAL_NG_CONFIG = Path(os.environ.get("NEMO_GYM_WHEEL_DIR", "/nonexistent")) / "resources_servers/example_multi_step/configs/example_multi_step.yaml"

EXAMPLE_YAML = """\
policy_base_url: ???
policy_api_key: ???
policy_model_name: gpt-test
example_multi_step_resources_server:
  resources_servers:
    example_multi_step:
      entrypoint: app.py
      domain: instruction_following
      verified: false
      description: Multi-step tool calling
      judge:
        base_url: ${policy_base_url}
        api_key: ${policy_api_key}
example_multi_step_simple_agent:
  responses_api_agents:
    simple_agent:
      entrypoint: app.py
      resources_server:
        type: resources_servers
        name: example_multi_step_resources_server
      model_server:
        type: responses_api_models
        name: policy_model
      datasets:
      - name: train
        type: train
        jsonl_fpath: resources_servers/example_multi_step/data/train.jsonl
        license: Apache 2.0
"""


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


@pytest.fixture(autouse=True)
def _isolated_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run every test in an empty cwd so a stray env.yaml cannot leak in."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)


# --------------------------------------------------------------------------- precedence


def test_precedence_files_env_yaml_cli(tmp_path: Path) -> None:
    a = write(tmp_path / "a.yaml", "x: a\ny: a\nz: a\nw: a\nnested: {keep: 1, over: a}\n")
    b = write(tmp_path / "b.yaml", "y: b\nz: b\nw: b\nnested: {over: b}\n")
    write(Path.cwd() / "env.yaml", "z: env\nw: env\n")
    cfg = load_config([a, str(b)], ["w=cli"], base={"x": "base", "only_base": 1})
    assert (cfg.x, cfg.y, cfg.z, cfg.w) == ("a", "b", "env", "cli")
    assert cfg.only_base == 1
    assert OmegaConf.to_container(cfg.nested) == {"keep": 1, "over": "b"}
    assert cfg.config_paths == [str(a), str(b)]


def test_env_yaml_explicit_path_and_disable(tmp_path: Path) -> None:
    a = write(tmp_path / "a.yaml", "x: a\n")
    env = write(tmp_path / "secrets" / "my_env.yaml", "x: env\n")
    write(Path.cwd() / "env.yaml", "x: cwd_env\n")
    assert load_config([a]).x == "cwd_env"
    assert load_config([a], env_yaml=env).x == "env"
    assert load_config([a], env_yaml=None).x == "a"
    with pytest.raises(ConfigError, match="nope.yaml"):
        load_config([a], env_yaml=tmp_path / "nope.yaml")


def test_missing_default_env_yaml_is_fine(tmp_path: Path) -> None:
    a = write(tmp_path / "a.yaml", "x: 1\n")
    assert load_config([a]).x == 1


def test_env_yaml_config_paths_used_when_none_given(tmp_path: Path) -> None:
    write(Path.cwd() / "confs" / "a.yaml", "x: from_a\n")
    write(Path.cwd() / "env.yaml", "config_paths: [confs/a.yaml]\npolicy_api_key: k\n")
    cfg = load_config()
    assert cfg.x == "from_a"
    assert cfg.config_paths == ["confs/a.yaml"]


def test_relative_config_path_from_cwd(tmp_path: Path) -> None:
    write(Path.cwd() / "sub" / "c.yaml", "x: rel\n")
    assert load_config(["sub/c.yaml"]).x == "rel"


def test_nested_config_paths_are_merged_after(tmp_path: Path) -> None:
    write(tmp_path / "root" / "servers" / "inner.yaml", "inner: 1\nshared: inner\n")
    outer = write(
        tmp_path / "root" / "bench" / "outer.yaml", "config_paths: [servers/inner.yaml]\nshared: outer\n"
    )
    cfg = load_config([outer])
    assert cfg.inner == 1
    assert cfg.shared == "inner"  # NeMo Gym appends nested paths after the including file
    assert cfg.config_paths == [str(outer), "servers/inner.yaml"]


# --------------------------------------------------------------------------- overrides


@pytest.mark.parametrize(
    "arg",
    [
        "+config_paths=[a.yaml,b.yaml]",
        "+config_paths=[a.yaml, b.yaml]",
        "++config_paths=['a.yaml', \"b.yaml\"]",
        "config_paths=[a.yaml,b.yaml]",
    ],
)
def test_parse_overrides_config_paths_variants(arg: str) -> None:
    paths, others = parse_overrides([arg, "+port=9000", "~foo"])
    assert paths == ["a.yaml", "b.yaml"]
    assert others == ["+port=9000", "~foo"]


def test_parse_overrides_single_path_and_concatenation() -> None:
    paths, others = parse_overrides(["+config_paths=a.yaml", "+config_paths=[/abs/b.yaml]"])
    assert paths == ["a.yaml", "/abs/b.yaml"]
    assert others == []


@pytest.mark.parametrize(
    "bad", ["x=a=b", "+config_paths=a.yaml,b.yaml", "x@pkg=1", "=3", "+config_paths=[{a: 1}]"]
)
def test_parse_overrides_malformed(bad: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_overrides([bad])
    assert bad in str(info.value) or "config_paths" in str(info.value)


def test_malformed_override_error_hides_secret() -> None:
    with pytest.raises(ConfigError) as info:
        parse_overrides(["+policy_api_key=sk-CANARY1234567890abcdef=oops"])
    assert "CANARY" not in str(info.value)


def test_typed_override_values(tmp_path: Path) -> None:
    a = write(
        tmp_path / "a.yaml",
        "srv:\n  resources_servers:\n    impl:\n      entrypoint: app.py\n      port: 1\n",
    )
    cfg = load_config(
        [a],
        [
            "srv.resources_servers.impl.port=9000",
            "+x=[1,2]",
            "+flag=true",
            "+quoted='9000'",
            "++ratio=0.5",
            "+nothing=null",
            "+d={a: 1, b: [x]}",
        ],
    )
    assert cfg.srv.resources_servers.impl.port == 9000
    assert isinstance(cfg.srv.resources_servers.impl.port, int)
    assert list(cfg.x) == [1, 2]
    assert cfg.flag is True
    assert cfg.quoted == "9000"
    assert cfg.ratio == 0.5
    assert cfg.nothing is None
    assert OmegaConf.to_container(cfg.d) == {"a": 1, "b": ["x"]}


def test_plus_overrides_existing_and_plain_requires_existing(tmp_path: Path) -> None:
    a = write(tmp_path / "a.yaml", "x: 1\nd: {a: 1}\n")
    cfg = load_config([a], ["+x=2", "++d.b=3"])
    assert cfg.x == 2
    assert OmegaConf.to_container(cfg.d) == {"a": 1, "b": 3}
    with pytest.raises(ConfigError, match=r"\+nope=1"):
        load_config([a], ["nope=1"])


def test_delete_override(tmp_path: Path) -> None:
    a = write(tmp_path / "a.yaml", "x: 1\nd: {a: 1, b: 2}\n")
    cfg = load_config([a], ["~x", "~d.a"])
    assert "x" not in cfg
    assert OmegaConf.to_container(cfg.d) == {"b": 2}
    assert "x" not in load_config([a], ["~x=1"])
    with pytest.raises(ConfigError, match="'x'"):
        load_config([a], ["~x=5"])
    with pytest.raises(ConfigError, match="missing_key"):
        load_config([a], ["~missing_key"])


def test_config_paths_inside_overrides(tmp_path: Path) -> None:
    a = write(tmp_path / "a.yaml", "x: a\n")
    b = write(tmp_path / "b.yaml", "x: b\n")
    cfg = load_config(overrides=[f"+config_paths=[{a}, {b}]", "+y=1"])
    assert cfg.x == "b"
    assert cfg.y == 1


def test_override_beats_env_yaml(tmp_path: Path) -> None:
    write(Path.cwd() / "env.yaml", "policy_base_url: http://env\n")
    cfg = load_config(overrides=["+policy_base_url=http://cli"])
    assert cfg.policy_base_url == "http://cli"


# --------------------------------------------------------------------------- errors


def test_missing_config_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does_not_exist.yaml"):
        load_config([tmp_path / "does_not_exist.yaml"])
    with pytest.raises(ConfigError, match="gone.yaml"):
        load_config(overrides=["+config_paths=[gone.yaml]"])


def test_malformed_yaml_names_file_and_line(tmp_path: Path) -> None:
    bad = write(tmp_path / "bad.yaml", "a: 1\nb: [1, 2\nc: 3\n")
    with pytest.raises(ConfigError) as info:
        load_config([bad])
    message = str(info.value)
    assert "bad.yaml" in message and "line" in message
    assert "\n" not in message


def test_top_level_list_rejected(tmp_path: Path) -> None:
    bad = write(tmp_path / "list.yaml", "- 1\n- 2\n")
    with pytest.raises(ConfigError, match="list.yaml"):
        load_config([bad])


# --------------------------------------------------------------------------- server specs


def test_server_specs_realistic(tmp_path: Path) -> None:
    conf = write(
        tmp_path / "resources_servers" / "example_multi_step" / "configs" / "example_multi_step.yaml",
        EXAMPLE_YAML,
    )
    write(Path.cwd() / "env.yaml", "policy_base_url: http://localhost:8000/v1\npolicy_api_key: sk-envkey\n")
    cfg = load_config([conf])

    (spec,) = server_specs(cfg)
    assert isinstance(spec, ServerSpec)
    assert spec.instance_name == "example_multi_step_resources_server"
    assert spec.server_type == "resources_servers"
    assert spec.impl_name == "example_multi_step"
    assert spec.config["entrypoint"] == "app.py"
    assert spec.config["judge"] == {"base_url": "http://localhost:8000/v1", "api_key": "sk-envkey"}
    assert spec.config_dir == conf.parent.resolve()

    all_specs = server_specs(cfg, None)
    assert [s.instance_name for s in all_specs] == [
        "example_multi_step_resources_server",
        "example_multi_step_simple_agent",
    ]
    (agent,) = server_specs(cfg, "responses_api_agents")
    assert agent.impl_name == "simple_agent"
    assert agent.config["resources_server"] == {
        "type": "resources_servers",
        "name": "example_multi_step_resources_server",
    }
    assert server_specs(cfg, "responses_api_models") == []
    assert set(SERVER_TYPES) == {"resources_servers", "responses_api_agents", "responses_api_models"}


def test_server_specs_missing_value_names_dotted_key(tmp_path: Path) -> None:
    conf = write(
        tmp_path / "c.yaml",
        "srv:\n  resources_servers:\n    impl:\n      entrypoint: app.py\n      judge:\n        model: ???\n",
    )
    with pytest.raises(ConfigError, match=r"srv\.resources_servers\.impl\.judge\.model"):
        server_specs(load_config([conf]))
    (spec,) = server_specs(load_config([conf], ["srv.resources_servers.impl.judge.model=gpt"]))
    assert spec.config["judge"]["model"] == "gpt"


def test_server_specs_missing_global_through_interpolation(tmp_path: Path) -> None:
    conf = write(tmp_path / "c.yaml", EXAMPLE_YAML)
    with pytest.raises(
        ConfigError,
        match=r"example_multi_step_resources_server\.resources_servers\.example_multi_step\.judge",
    ):
        server_specs(load_config([conf]))


def test_interpolation_of_global_into_instance(tmp_path: Path) -> None:
    conf = write(
        tmp_path / "c.yaml",
        "srv:\n  resources_servers:\n    impl:\n      entrypoint: app.py\n      url: ${policy_base_url}/x\n",
    )
    cfg = load_config([conf], ["+policy_base_url=http://h:1"])
    assert server_specs(cfg)[0].config["url"] == "http://h:1/x"


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        (
            "srv:\n  resources_servers:\n    a: {entrypoint: app.py}\n    b: {entrypoint: app.py}\n",
            "exactly one",
        ),
        ("srv:\n  resources_servers:\n    a: {domain: math}\n", "entrypoint"),
        ("srv:\n  resources_servers: {}\n", "exactly one"),
        ("srv:\n  resources_servers:\n    a: 3\n", "srv.resources_servers.a"),
        (
            (
                "srv:\n  resources_servers:\n    a: {entrypoint: app.py}\n"
                "  responses_api_agents:\n    b: {entrypoint: app.py}\n"
            ),
            "several",
        ),
    ],
)
def test_server_specs_malformed(tmp_path: Path, body: str, needle: str) -> None:
    conf = write(tmp_path / "c.yaml", body)
    with pytest.raises(ConfigError, match=needle):
        server_specs(load_config([conf]), None)


def test_config_dir_per_instance_and_overrides_only(tmp_path: Path) -> None:
    one = write(tmp_path / "one" / "c.yaml", "s1:\n  resources_servers:\n    i1: {entrypoint: app.py}\n")
    two = write(
        tmp_path / "two" / "c.yaml",
        "s2:\n  resources_servers:\n    i2: {entrypoint: app.py}\n"
        "s1:\n  resources_servers:\n    i1: {port: 5}\n",
    )
    cfg = load_config([one, two], ["+s3={resources_servers: {i3: {entrypoint: run.py}}}"])
    dirs = {s.instance_name: s.config_dir for s in server_specs(cfg)}
    assert dirs == {"s1": one.parent.resolve(), "s2": two.parent.resolve(), "s3": None}
    assert server_specs(cfg)[0].config == {"entrypoint": "app.py", "port": 5}


def test_unknown_server_type() -> None:
    with pytest.raises(ConfigError, match="server_type"):
        server_specs(DictConfig({}), "models")


@pytest.mark.skipif(not REAL_NG_CONFIG.exists(), reason="set NEMO_GYM_WHEEL_DIR to an unpacked NeMo Gym wheel")
def test_real_nemo_gym_config() -> None:
    cfg = load_config([REAL_NG_CONFIG])
    (spec,) = server_specs(cfg)
    assert spec.impl_name == "example_multi_step"
    assert spec.instance_name == "example_multi_step_resources_server"
    assert spec.config_dir == REAL_NG_CONFIG.parent.resolve()
    (agent,) = server_specs(cfg, "responses_api_agents")
    assert agent.config["resources_server"]["name"] == "example_multi_step_resources_server"


# --------------------------------------------------------------------------- redaction


@pytest.mark.parametrize(
    ("key", "secret"),
    [
        ("api_key", True),
        ("policy_api_key", True),
        ("x-api-key", True),
        ("hf_token", True),
        ("AccessToken", True),
        ("client_secret", True),
        ("password", True),
        ("Authorization", True),
        ("max_tokens", False),
        ("max_output_tokens", False),
        ("tokenizer", False),
        ("key", False),
        ("base_url", False),
    ],
)
def test_secret_key_pattern(key: str, secret: bool) -> None:
    assert bool(SECRET_KEY_PATTERN.search(key)) is secret


def test_redact_nested_secrets_and_to_yaml(tmp_path: Path) -> None:
    canary = "CANARY-s3cr3t-value-42"
    sk = "sk-" + "A1b2C3d4E5f6G7h8I9j0K"
    conf = write(
        tmp_path / "c.yaml",
        f"""\
policy_base_url: https://user:{canary}@example.com/v1
policy_api_key: {canary}
srv:
  resources_servers:
    impl:
      entrypoint: app.py
      judge:
        api_key: {canary}
        headers:
          Authorization: Bearer {canary}
      forwarded_key: ${{policy_api_key}}
      note: "use {sk} please"
      curl: "-H 'X: Bearer {canary}'"
      max_tokens: 512
      empty_token: ""
      servers: [{{password: {canary}}}]
""",
    )
    cfg = load_config([conf])
    out = redact(cfg)
    assert isinstance(out, dict)
    assert out["policy_api_key"] == REDACTED
    assert out["policy_base_url"] == f"https://{REDACTED}@example.com/v1"
    impl = out["srv"]["resources_servers"]["impl"]
    assert impl["judge"]["api_key"] == REDACTED
    assert impl["judge"]["headers"]["Authorization"] == REDACTED
    assert impl["forwarded_key"] == "${policy_api_key}"  # not resolved, so nothing leaks
    assert impl["note"] == f"use {REDACTED} please"
    assert impl["max_tokens"] == 512
    assert impl["empty_token"] == ""
    assert impl["servers"] == [{"password": REDACTED}]

    text = to_yaml(cfg)
    assert canary not in text and sk not in text
    assert REDACTED in text
    # A resolved spec config still has its secret-keyed values redacted.
    (spec,) = server_specs(cfg)
    assert spec.config["forwarded_key"] == canary
    assert f"api_key: {canary}" not in to_yaml(spec.config)
    assert canary in to_yaml(cfg, redact_secrets=False)


def test_redact_leaves_input_untouched_and_handles_lists() -> None:
    data = {"a": [{"token": "t0k3n"}, "Bearer abc.def"], "b": ("https://u:p@h/x",)}
    out = redact(data)
    assert data["a"][0]["token"] == "t0k3n"
    assert out == {"a": [{"token": REDACTED}, f"Bearer {REDACTED}"], "b": [f"https://{REDACTED}@h/x"]}
    assert redact("sk-short") == "sk-short"
    assert redact(OmegaConf.create([{"secret": 1}])) == [{"secret": REDACTED}]


def test_to_yaml_round_trips_missing_and_paths() -> None:
    text = to_yaml({"p": Path("/x/y"), "m": "???", "i": "${a.b}"})
    assert "p: /x/y" in text
    assert OmegaConf.to_container(OmegaConf.create(text), resolve=False) == {
        "p": "/x/y",
        "m": "???",
        "i": "${a.b}",
    }
