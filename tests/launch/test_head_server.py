"""The head server's document: where every server is, never a secret."""

from __future__ import annotations

import json

from omegaconf import OmegaConf

from nemo_gym_env.launch.head_server import public_config


def test_public_config_scrubs_interpolated_secrets():
    cfg = OmegaConf.create({
        "policy_api_key": "CANARY-123456",
        "server": {"resources_servers": {"impl": {"url": "http://h/?k=${policy_api_key}", "max_tokens": 5}}},
        "missing": "???",
        "dangling": "${nope}",
    })
    doc = public_config(cfg)
    assert "CANARY" not in json.dumps(doc)
    assert doc["server"]["resources_servers"]["impl"] == {"url": "http://h/?k=***REDACTED***", "max_tokens": 5}
    assert doc["missing"] == "???"
