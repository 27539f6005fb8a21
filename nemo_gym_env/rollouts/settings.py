"""The settings of a rollouts run: one dataclass, the only place a default lives.

``nemo-gym-env rollouts`` turns its arguments into :class:`RolloutSettings`; a script builds
one directly and hands it to :func:`~nemo_gym_env.rollouts.plan.plan_rollouts`::

    settings = RolloutSettings(servers=["example_multi_step"], policy="scripted", num_repeats=4)
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from nemo_gym_env.errors import UsageError
from nemo_gym_env.protocol.defaults import CONCURRENCY, MAX_STEPS, ROLLOUT_REQUEST_TIMEOUT_S

__all__ = ["DEFAULT_CONCURRENCY", "DEFAULT_OUTPUT", "ENDPOINT_DEFAULTS", "LOCAL_DEFAULTS", "RolloutOptions", "RolloutSettings"]

DEFAULT_OUTPUT = "results/rollouts.jsonl"
"""Where rollout rows go unless ``output`` says otherwise."""

DEFAULT_CONCURRENCY = CONCURRENCY
"""Rollouts in flight unless ``concurrency`` or the policy says otherwise."""

LOCAL_DEFAULTS = {"temperature": 0.0, "max_output_tokens": 128, "concurrency": 16, "max_episode_tokens": 512,
                  "dtype": "auto"}
"""What a run with the local policy uses where the settings leave a value unset: greedy decoding,
a turn of at most 128 tokens (both override the dataset's, as ``--temperature`` and
``--max-output-tokens`` do), 16 rollouts in flight to fill the policy's batches, and at most 512
generated tokens an episode: a model that keeps calling tools or playing a game costs at most
four full turns, so no episode is left decoding alone long after the rest; and weights in
bfloat16 where the hardware computes it natively (``dtype="auto"``: the main job 1.6x faster in
half the memory, ``benchmarks/README.md``)."""

ENDPOINT_DEFAULTS = {"concurrency": DEFAULT_CONCURRENCY, "attempt_timeout": 20.0, "turn_timeout": 30.0}
"""What a run with the openai policy uses where the settings leave a value unset: 8 requests in
flight; each HTTP attempt gets 20 s and a whole turn (its retries and their waits included)
30 s, so an endpoint that accepts a request and never answers fails a rollout in 30 s, with a
message naming ``--attempt-timeout`` and ``--turn-timeout`` for models that answer slower."""


@dataclass
class RolloutSettings:
    """Everything a rollouts run needs to know; checked when built (:class:`UsageError` names the field)."""

    # ---- servers and data
    servers: list[str] = field(default_factory=list)
    """Bundled server names to launch; with no servers, overrides or URLs: every bundled server that
    judges its episodes (the hosted envs run when named)."""
    overrides: list[str] = field(default_factory=list)
    """Hydra overrides, e.g. ``+config_paths=[my_env/configs/my_env.yaml]``."""
    head_url: str | None = None
    """Use the servers of a running head server (``GET /servers``) instead of launching."""
    server_url: str | None = None
    """Use one running resources server instead of launching."""
    input: str | None = None
    """Tasks JSONL (NeMo Gym rows); None: each server's example data."""
    output: str = DEFAULT_OUTPUT
    """Output JSONL; the failures sidecar and the metrics file go beside it."""
    limit: int | None = None
    """Only the first N valid tasks of each dataset."""
    strict: bool = False
    """Stop on an invalid row instead of skipping it."""
    log_dir: str | None = None
    """Keep launched servers' logs here (default: a temporary folder, removed at the end)."""
    env_yaml: str | None = "env.yaml"
    """Secrets and globals file (a missing default ``env.yaml`` is fine); None ignores it."""
    stream_logs: bool = False
    """Echo launched servers' logs to stderr."""

    # ---- policy
    policy: str | None = None
    """``scripted``, ``openai`` or ``local``; None: ``local`` when torch and transformers are installed."""
    model: str | None = None
    """Model name (openai) or path/id (local); env.yaml: ``policy_model_name``."""
    base_url: str | None = None
    """OpenAI-compatible endpoint; env.yaml: ``policy_base_url``."""
    api_key: str | None = None
    """API key; env.yaml: ``policy_api_key``."""
    api: str = "responses"
    """openai: ``responses`` or ``chat`` (Chat Completions)."""
    device: str | None = None
    """local: ``cpu`` (default), ``cuda`` or ``cuda:N``."""
    dtype: str | None = None
    """local: the weights' dtype (:data:`LOCAL_DEFAULTS`: ``auto``; ``int8``, see :mod:`nemo_gym_env.policies.int8`)."""
    seed: int | None = None
    """local: makes sampling reproducible."""
    temperature: float | None = None
    """Overrides ``responses_create_params.temperature``."""
    top_p: float | None = None
    """Overrides ``responses_create_params.top_p``."""
    max_output_tokens: int | None = None
    """Overrides ``responses_create_params.max_output_tokens``."""

    # ---- run
    num_repeats: int = 1
    """Rollouts per task."""
    concurrency: int | None = None
    """Rollouts in flight; None: :data:`DEFAULT_CONCURRENCY`, or the local policy's (:data:`LOCAL_DEFAULTS`)."""
    max_steps: int = MAX_STEPS
    """Model turns per episode."""
    max_episode_tokens: int | None = None
    """Generated tokens an episode may use over all its turns; then it is scored as it stands
    (None: no bound; the local policy's default: :data:`LOCAL_DEFAULTS`)."""
    timeout: float = ROLLOUT_REQUEST_TIMEOUT_S
    """Server request timeout, seconds."""
    attempt_timeout: float | None = None
    """openai: each HTTP attempt's timeout, seconds (None: :data:`ENDPOINT_DEFAULTS`)."""
    turn_timeout: float | None = None
    """The deadline of one model turn, seconds: every attempt, retry and wait included (None: the
    policy kind's default: :data:`ENDPOINT_DEFAULTS` for openai, none for local and scripted)."""
    first_reply_timeout: float = 300.0
    """openai: how long the run waits, before its first rollout, for the endpoint's first answer to a
    one-token request (a server that loads its model at its first request is cold, not hung); the
    per-turn limits apply from then on. 0: no such wait."""
    episode_reward: str = "verify"
    """A row's ``reward``: the ``/verify`` reward, or ``sum``: plus the step rewards the tools gave."""
    resume: bool = False
    """Continue the output file: run only the rollouts not already in it."""
    allow_changes: bool = False
    """With ``resume``: add rows even when the file was written with other settings (repeats,
    policy, sampling, a changed dataset); without it such a resume is refused."""

    def __post_init__(self) -> None:
        for name, low in (("num_repeats", 1), ("concurrency", 1), ("limit", 1), ("max_steps", 1),
                          ("max_output_tokens", 1), ("max_episode_tokens", 1)):
            value = getattr(self, name)
            if value is not None and value < low:
                raise UsageError(f"{_flag(name)} must be >= {low}, got {value}")
        for name in ("timeout", "attempt_timeout", "turn_timeout"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise UsageError(f"{_flag(name)} must be > 0, got {value}")
        if not 0 <= self.first_reply_timeout < float("inf"):  # also NaN
            raise UsageError(f"{_flag('first_reply_timeout')} must be >= 0 (0: no wait), got {self.first_reply_timeout}")
        if self.server_url and self.head_url:
            raise UsageError("give --head-url or --server-url, not both")
        for name in ("server_url", "head_url", "base_url"):
            url = getattr(self, name)
            if url is not None and not url.startswith(("http://", "https://")):
                raise UsageError(f"{_flag(name)} must be an http:// or https:// URL, got {url!r}")
        if self.episode_reward not in ("verify", "sum"):
            raise UsageError(f"--episode-reward must be 'verify' or 'sum', got {self.episode_reward!r}")
        if self.api not in ("responses", "chat"):
            raise UsageError(f"--api must be 'responses' or 'chat', got {self.api!r}")

    def for_policy(self, kind: str) -> RolloutSettings:
        """These settings with the unset values that depend on the policy kind filled in.

        Example:
            >>> RolloutSettings().for_policy("local").sampling
            {'temperature': 0.0, 'max_output_tokens': 128}
            >>> RolloutSettings(temperature=0.7).for_policy("local").temperature
            0.7
            >>> RolloutSettings().for_policy("openai").concurrency, RolloutSettings().for_policy("openai").turn_timeout
            (8, 30.0)
        """
        defaults = {"local": LOCAL_DEFAULTS, "openai": ENDPOINT_DEFAULTS}.get(kind, {"concurrency": DEFAULT_CONCURRENCY})
        return replace(self, **{k: v for k, v in defaults.items() if getattr(self, k) is None})

    @property
    def options(self) -> RolloutOptions:
        """How each rollout of the run is played, as every worker gets it."""
        return RolloutOptions(max_steps=self.max_steps, turn_timeout_s=self.turn_timeout,
                              episode_reward=self.episode_reward, max_episode_tokens=self.max_episode_tokens)

    @property
    def sampling(self) -> dict[str, float | int]:
        """The sampling overrides that are set."""
        values = {"temperature": self.temperature, "top_p": self.top_p, "max_output_tokens": self.max_output_tokens}
        return {k: v for k, v in values.items() if v is not None}


@dataclass(frozen=True)
class RolloutOptions:
    """How every rollout of a run is played: worked out once per run and handed to each worker whole.

    Attributes:
        max_steps: Model turns before an episode is verified anyway.
        turn_timeout_s: The deadline of one policy turn (None: the policy's own), retries included.
        episode_reward: A row's ``reward``: ``"verify"`` (the server's) or ``"sum"`` (plus the step rewards).
        max_episode_tokens: What one episode may generate in all; then it is verified as it stands.
    """

    max_steps: int = MAX_STEPS
    turn_timeout_s: float | None = None
    episode_reward: str = "verify"
    max_episode_tokens: int | None = None


def _flag(name: str) -> str:
    """The command-line flag of a field (messages speak the user's language: ``--num-repeats``)."""
    return "--" + name.replace("_", "-")
