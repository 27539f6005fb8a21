"""Load, merge and inspect NeMo Gym style YAML configs.

A NeMo Gym config maps *instance names* to server blocks::

    my_resources_server:
      resources_servers:
        my_impl:            # the implementation folder
          entrypoint: app.py
          domain: math
          base_url: ${policy_base_url}

Top-level scalars (``policy_base_url``, ``policy_api_key``, ...) are globals that
instance blocks may interpolate. Sources are merged with NeMo Gym's precedence:
programmatic ``base`` < config paths (in order, including nested ``config_paths``)
< ``env.yaml`` < command-line overrides (Hydra syntax).
"""

from __future__ import annotations

import copy
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from nemo_gym_env.errors import ConfigError
from nemo_gym_env.protocol.keys import SERVER_TYPES
from nemo_gym_env.system.redaction import (
    MISSING,
    REDACTED,
    SECRET_KEY_PATTERN,
    as_plain,
    redact,
    redact_text,
)

__all__ = [
    "agent_routes",
    "config_value",
    "other_instances",
    "CONFIG_PATHS_KEY",
    "DEFAULT_ENV_YAML",
    "REDACTED",
    "SECRET_KEY_PATTERN",
    "SERVER_TYPES",
    "ConfigError",
    "ServerSpec",
    "load_config",
    "parse_overrides",
    "redact",
    "server_specs",
    "to_yaml",
]


CONFIG_PATHS_KEY = "config_paths"
"""Top-level key (in YAML files, env.yaml or on the command line) listing config files to merge."""

DEFAULT_ENV_YAML = "env.yaml"
"""Default ``env_yaml`` argument of :func:`load_config`; a missing default file is not an error."""

# Which YAML file defined each instance, keyed by id() of the DictConfig returned by load_config.
_SOURCES: dict[int, dict[str, Path]] = {}


@dataclass(frozen=True)
class ServerSpec:
    """One server instance found in a merged config.

    Attributes:
        instance_name: The top-level key naming the instance.
        server_type: One of :data:`SERVER_TYPES`, e.g. ``"resources_servers"``.
        impl_name: The implementation (folder) name under the server type.
        config: The resolved plain dict under ``impl_name`` (entrypoint, host, port, ...).
        config_dir: Directory of the YAML file that defined the instance (for resolving the
            entrypoint), or ``None`` if it came only from ``base`` or overrides.
    """

    instance_name: str
    server_type: str
    impl_name: str
    config: dict[str, Any] = field(hash=False)
    config_dir: Path | None = None


# --------------------------------------------------------------------------- overrides


@lru_cache(maxsize=1)
def _overrides_parser() -> Any:
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return OverridesParser.create()


def _safe_text(text: str) -> str:
    """Return ``text`` with credentials masked, for use in error messages."""
    key, sep, _ = text.partition("=")
    if sep and SECRET_KEY_PATTERN.search(key.lstrip("+~").rsplit(".", 1)[-1]):
        return f"{key}={REDACTED}"
    return redact_text(text)


def _parse_one(text: str) -> Any:
    from hydra.errors import HydraException

    try:
        override = _overrides_parser().parse_override(text)
    except HydraException as exc:
        msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ConfigError(
            f"Malformed override {_safe_text(text)!r}: {msg}; use key=value, +key=value, ++key=value "
            "or ~key (quote values containing '=', spaces or commas)."
        ) from None
    if not override.key_or_group:
        raise ConfigError(f"Malformed override {_safe_text(text)!r}: the key is empty; use key=value.")
    if override.package is not None:
        raise ConfigError(f"Override {_safe_text(text)!r} uses '@package' syntax, which is not supported.")
    if override.is_sweep_override():
        raise ConfigError(
            f"Override {_safe_text(text)!r} is a Hydra sweep; use a list in brackets (key=[a,b]) "
            "or quote the value (key='a,b')."
        )
    return override


def _config_paths_value(text: str, value: Any) -> list[str]:
    if value is None:
        return []
    items = value if isinstance(value, list) else [value]
    if any(isinstance(v, (dict, list)) for v in items):
        raise ConfigError(
            f"Override {text!r}: {CONFIG_PATHS_KEY} must be a list of file paths, "
            "e.g. +config_paths=[a.yaml,b.yaml]."
        )
    paths = [str(v).strip() for v in items]
    if not all(paths):
        raise ConfigError(f"Override {text!r}: {CONFIG_PATHS_KEY} contains an empty path; remove it.")
    return paths


def parse_overrides(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """Split Hydra-style command-line arguments into config paths and other overrides.

    Accepts ``+config_paths=[a.yaml,b.yaml]`` (also ``++config_paths=...``, ``config_paths=...``,
    quoted elements and spaces after commas). Several ``config_paths`` arguments are concatenated.

    Args:
        argv: The arguments, e.g. ``sys.argv[1:]``.

    Returns:
        ``(config_paths, other_overrides)``; the overrides keep their original text.

    Raises:
        ConfigError: If an argument is not a valid override (the message shows the text).
    """
    config_paths: list[str] = []
    others: list[str] = []
    for text in argv:
        override = _parse_one(text)
        if override.key_or_group == CONFIG_PATHS_KEY:
            if override.is_delete():
                raise ConfigError(f"Override {text!r}: {CONFIG_PATHS_KEY} cannot be deleted; just omit it.")
            config_paths.extend(_config_paths_value(text, override.value()))
        else:
            others.append(text)
    return config_paths, others


def _plain_lookup(root: Any, dotted: str) -> tuple[bool, Any]:
    """Return ``(exists, raw_value)`` for a dotted key in an unresolved plain container."""
    node = root
    for part in dotted.split("."):
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.lstrip("-").isdigit() and -len(node) <= int(part) < len(node):
            node = node[int(part)]
        else:
            return False, None
    return True, node


def _apply_override(cfg: DictConfig, text: str) -> None:
    override = _parse_one(text)
    key, value = override.key_or_group, override.value()
    plain = OmegaConf.to_container(cfg, resolve=False, throw_on_missing=False)
    exists, current = _plain_lookup(plain, key)
    try:
        if override.is_delete():
            if not exists:
                raise ConfigError(f"Cannot delete {key!r} (override {text!r}): it is not in the config.")
            if value is not None and value != current:
                raise ConfigError(
                    f"Not deleting {key!r} (override {text!r}): its value is {current!r}, not {value!r}."
                )
            parent_key, _, leaf = key.rpartition(".")
            parent = OmegaConf.select(cfg, parent_key) if parent_key else cfg
            del parent[int(leaf) if isinstance(parent, ListConfig) else leaf]
        elif override.is_add() or override.is_force_add():
            # NeMo Gym applies CLI overrides to an empty config and merges them last, so `+key`
            # never conflicts with a value from a file; we therefore treat `+` like `++`.
            OmegaConf.update(cfg, key, value, merge=True, force_add=True)
        else:
            if not exists:
                raise ConfigError(f"Cannot override {key!r}: it is not in the config; use +{text} to add it.")
            OmegaConf.update(cfg, key, value, merge=True)
    except OmegaConfBaseException as exc:
        raise ConfigError(f"Cannot apply override {_safe_text(text)!r}: {str(exc).splitlines()[0]}") from None


# --------------------------------------------------------------------------- loading


def _load_yaml(path: Path) -> DictConfig:
    try:
        loaded = OmegaConf.load(path)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"Invalid YAML in {str(path)!r}{where}: {problem}; fix the file syntax.") from None
    except OmegaConfBaseException as exc:
        raise ConfigError(f"Invalid config in {str(path)!r}: {str(exc).splitlines()[0]}") from None
    except OSError as exc:
        raise ConfigError(f"Cannot read config file {str(path)!r}: {exc.strerror or exc}.") from None
    if not isinstance(loaded, DictConfig):
        raise ConfigError(f"Config file {str(path)!r} must contain a mapping at the top level, not a list.")
    return loaded


def _find(entry: str | Path, including_file: Path | None) -> Path:
    if str(entry).strip() == "":
        raise ConfigError("Empty entry in config_paths; remove it.")
    path = Path(entry).expanduser()
    candidates = [path] if path.is_absolute() else [Path.cwd() / path]
    if not path.is_absolute() and including_file is not None:
        # Nested config_paths in NeMo Gym are relative to the Gym root: try each ancestor directory.
        candidates += [parent / path for parent in including_file.parents]
    for candidate in candidates:
        if candidate.is_file():
            return candidate.resolve()
    origin = f" (listed in {str(including_file)!r})" if including_file else ""
    raise ConfigError(
        f"Config file {str(entry)!r}{origin} not found (looked in {str(candidates[0])!r}); "
        "check the path, which is relative to the current directory."
    )


def _raw_paths(loaded: DictConfig, where: str) -> list[str]:
    raw = OmegaConf.to_container(loaded, resolve=False, throw_on_missing=False).get(CONFIG_PATHS_KEY)
    if raw is None:
        return []
    if isinstance(raw, str):
        raw = [raw]
    if not isinstance(raw, list) or not all(isinstance(p, (str, Path)) and str(p).strip() for p in raw):
        raise ConfigError(f"{CONFIG_PATHS_KEY} in {where} must be a list of file paths, got {raw!r}.")
    return [str(p) for p in raw]


def _record_sources(sources: dict[str, Path], loaded: DictConfig, path: Path) -> None:
    raw = OmegaConf.to_container(loaded, resolve=False, throw_on_missing=False)
    for name, block in raw.items():
        if not isinstance(block, dict):
            continue
        impls = [block[t] for t in SERVER_TYPES if isinstance(block.get(t), dict)]
        if not impls and not any(t in block for t in SERVER_TYPES):
            continue
        # The file that sets the entrypoint wins; otherwise the first file that mentions the instance.
        sets_entrypoint = any(
            isinstance(i, dict) and "entrypoint" in i for impl in impls for i in impl.values()
        )
        if sets_entrypoint or str(name) not in sources:
            sources[str(name)] = path.parent


def load_config(
    config_paths: Sequence[str | Path] = (),
    overrides: Sequence[str] = (),
    *,
    env_yaml: str | Path | None = DEFAULT_ENV_YAML,
    base: Mapping | None = None,
) -> DictConfig:
    """Merge NeMo Gym config sources into one (unresolved) ``DictConfig``.

    Precedence, lowest first: ``base`` < each config path in order (files named in a file's own
    ``config_paths`` are appended after it) < ``env.yaml`` < ``overrides``. Config paths given
    here and via ``+config_paths=[...]`` in ``overrides`` are concatenated; if there are none,
    ``config_paths`` from ``env.yaml`` (then ``base``) is used, as in NeMo Gym. The final list is
    stored under ``config_paths``. Overrides use Hydra syntax: ``key=value`` (key must exist),
    ``+key=value`` / ``++key=value`` (add or replace), ``~key`` (delete); values are typed as Hydra
    types them.

    Args:
        config_paths: YAML files, absolute or relative to the current directory.
        overrides: Hydra-style overrides, e.g. ``["+config_paths=[a.yaml]", "++port=9000"]``.
        env_yaml: Path of the env file. The default ``"env.yaml"`` (in the current directory) is
            optional; any other path must exist. ``None`` disables it.
        base: Programmatic defaults with the lowest precedence.

    Returns:
        The merged config; interpolations are left unresolved (see :func:`server_specs`).

    Raises:
        ConfigError: On a missing file, invalid YAML, malformed ``config_paths`` or a bad override.
    """
    cli_paths, other_overrides = parse_overrides(overrides)
    base_cfg = OmegaConf.create(dict(base) if base is not None else {})
    if not isinstance(base_cfg, DictConfig):
        raise ConfigError("load_config(base=...) must be a mapping.")

    env_cfg: DictConfig | None = None
    env_path: Path | None = None
    if env_yaml is not None:
        env_path = Path(env_yaml).expanduser()
        env_path = env_path if env_path.is_absolute() else Path.cwd() / env_path
        if env_path.is_file():
            env_cfg = _load_yaml(env_path)
        elif not (isinstance(env_yaml, str) and env_yaml == DEFAULT_ENV_YAML):
            raise ConfigError(
                f"env file {str(env_yaml)!r} not found (looked in {str(env_path)!r}); "
                "fix the path or pass env_yaml=None."
            )

    entries: list[tuple[str, Path | None]] = [(str(p), None) for p in [*config_paths, *cli_paths]]
    if not entries and env_cfg is not None:
        entries = [(p, None) for p in _raw_paths(env_cfg, f"{str(env_path)!r}")]
    if not entries:
        entries = [(p, None) for p in _raw_paths(base_cfg, "base")]

    sources: dict[str, Path] = {}
    layers: list[tuple[str, DictConfig]] = []
    seen: set[Path] = set()
    final_paths: list[str] = []
    index = 0
    while index < len(entries):  # breadth-first, like NeMo Gym: nested paths are appended
        entry, including = entries[index]
        index += 1
        path = _find(entry, including)
        if path in seen:
            continue
        seen.add(path)
        final_paths.append(entry)
        loaded = _load_yaml(path)
        entries.extend((p, path) for p in _raw_paths(loaded, f"{str(path)!r}"))
        _record_sources(sources, loaded, path)
        layers.append((str(path), loaded))
    if env_cfg is not None and env_path is not None:
        _record_sources(sources, env_cfg, env_path)
        layers.append((str(env_path), env_cfg))

    cfg = base_cfg
    for name, layer in layers:
        try:
            cfg = OmegaConf.merge(cfg, layer)
        except OmegaConfBaseException as exc:
            raise ConfigError(f"Cannot merge {name!r}: {str(exc).splitlines()[0]}") from None
    if final_paths:
        cfg[CONFIG_PATHS_KEY] = final_paths
    for text in other_overrides:
        _apply_override(cfg, text)

    _SOURCES[id(cfg)] = sources
    weakref.finalize(cfg, _SOURCES.pop, id(cfg), None)
    return cfg


# --------------------------------------------------------------------------- server specs


def _missing_keys(node: Any, prefix: str) -> list[str]:
    if isinstance(node, dict):
        return [k for key, value in node.items() for k in _missing_keys(value, f"{prefix}.{key}")]
    if isinstance(node, list):
        return [k for i, value in enumerate(node) for k in _missing_keys(value, f"{prefix}.{i}")]
    return [prefix] if node == MISSING else []


def server_specs(cfg: DictConfig, server_type: str | None = "resources_servers") -> list[ServerSpec]:
    """List the server instances of one type (or all types) in config order.

    Args:
        cfg: A config from :func:`load_config` (any ``DictConfig`` works; ``config_dir`` is then
            ``None``).
        server_type: One of :data:`SERVER_TYPES`, or ``None`` for every type.

    Returns:
        One :class:`ServerSpec` per instance, with interpolations resolved. A top-level
        ``ray_head_node_address`` (NeMo Gym's global Ray key) is copied into every resources
        server's config that does not set its own, as NeMo Gym hands it to every server.

    Raises:
        ConfigError: If a required ``???`` value is unset or unresolvable (naming the dotted key),
            or an instance block is malformed.
    """
    if server_type is not None and server_type not in SERVER_TYPES:
        raise ConfigError(
            f"Unknown server_type {server_type!r}; use one of {', '.join(SERVER_TYPES)} or None."
        )
    sources = _SOURCES.get(id(cfg), {})
    raw = OmegaConf.to_container(cfg, resolve=False, throw_on_missing=False)
    ray_address = OmegaConf.select(cfg, "ray_head_node_address", default=None, throw_on_missing=False)
    ray_address = ray_address if isinstance(ray_address, str) and ray_address.strip() else None
    specs: list[ServerSpec] = []
    for name, block in raw.items():
        if not isinstance(block, dict):
            continue
        types = [t for t in SERVER_TYPES if t in block]
        if not types:
            continue
        if len(types) > 1:
            raise ConfigError(
                f"Instance {name!r} has several server types ({', '.join(types)}); keep exactly one."
            )
        stype = types[0]
        if server_type is not None and stype != server_type:
            continue
        impls = block[stype]
        if not isinstance(impls, dict) or len(impls) != 1:
            found = list(impls) if isinstance(impls, dict) else impls
            raise ConfigError(
                f"'{name}.{stype}' must hold exactly one implementation block (impl_name: {{...}}), "
                f"found {found!r}."
            )
        impl_name, impl = next(iter(impls.items()))
        dotted = f"{name}.{stype}.{impl_name}"
        if not isinstance(impl, dict):
            raise ConfigError(f"'{dotted}' must be a mapping with at least 'entrypoint', got {impl!r}.")
        missing = _missing_keys(impl, dotted)
        if missing:
            raise ConfigError(
                f"Required config value(s) not set (???): {', '.join(missing)}; set them in a config file, "
                f"env.yaml or on the command line (e.g. ++{missing[0]}=<value>)."
            )
        try:
            resolved = OmegaConf.to_container(
                cfg[name][stype][impl_name], resolve=True, throw_on_missing=True
            )
        except OmegaConfBaseException as exc:
            key = getattr(exc, "full_key", None) or dotted
            key = key if str(key).startswith(str(name)) else f"{dotted}.{key}"
            raise ConfigError(
                f"Cannot resolve '{key}': {str(exc).splitlines()[0]}; "
                "set the referenced value (e.g. in env.yaml)."
            ) from None
        entrypoint = resolved.get("entrypoint")
        if not isinstance(entrypoint, str) or not entrypoint.strip():
            raise ConfigError(
                f"'{dotted}.entrypoint' is missing or empty; set it to the server script, e.g. app.py."
            )
        if stype == "resources_servers" and ray_address and "ray_head_node_address" not in resolved:
            resolved["ray_head_node_address"] = ray_address  # NeMo Gym's global key reaches every server
        specs.append(ServerSpec(str(name), stype, str(impl_name), resolved, sources.get(str(name))))
    return specs


# --------------------------------------------------------------------------- reading a config


def config_value(cfg: DictConfig, key: str) -> str | None:
    """A top-level or dotted value as text; None when unset, empty, ``???`` or unresolvable."""
    try:
        value = OmegaConf.select(cfg, key, default=None, throw_on_missing=False)
    except OmegaConfBaseException:
        return None
    return None if value in (None, "", MISSING) else str(value)


def agent_routes(cfg: DictConfig) -> dict[str, str]:
    """NeMo Gym agent instance name -> the resources server it uses (its ``resources_server: {name}``).

    A row from a NeMo Gym dataset names its agent in ``agent_ref``; this says which server plays it.
    """
    raw = OmegaConf.to_container(cfg, resolve=False, throw_on_missing=False)
    routes = {}
    for name, block in raw.items():
        impls = block.get("responses_api_agents") if isinstance(block, dict) else None
        for impl in (impls or {}).values() if isinstance(impls, dict) else ():
            ref = impl.get("resources_server") if isinstance(impl, dict) else None
            if isinstance(ref, dict) and isinstance(ref.get("name"), str):
                routes[str(name)] = ref["name"]
    return routes


def other_instances(cfg: DictConfig) -> list[tuple[str, str]]:
    """``(instance, server type)`` of every agent or model instance: the ones we never launch (we are both)."""
    raw = OmegaConf.to_container(cfg, resolve=False, throw_on_missing=False)
    return [
        (str(name), stype)
        for name, block in raw.items()
        if isinstance(block, dict)
        for stype in ("responses_api_agents", "responses_api_models")
        if stype in block
    ]


# --------------------------------------------------------------------------- redaction


def _plain(obj: Any) -> Any:
    obj = as_plain(obj)
    if isinstance(obj, Mapping):
        return {key: _plain(value) for key, value in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    return copy.deepcopy(obj)


class _Dumper(yaml.SafeDumper):
    pass


_Dumper.add_multi_representer(Path, lambda d, v: d.represent_str(str(v)))
_Dumper.add_multi_representer(Enum, lambda d, v: d.represent_str(str(v.name)))


def to_yaml(obj: Any, *, redact_secrets: bool = True) -> str:
    """Dump a config as YAML, redacted by default and without resolving interpolations.

    Args:
        obj: A dict, list, ``DictConfig``/``ListConfig`` or scalar.
        redact_secrets: Apply :func:`redact` first (default ``True``).

    Returns:
        The YAML text, keys in their original order.
    """
    data = redact(obj) if redact_secrets else _plain(obj)
    return yaml.dump(data, Dumper=_Dumper, sort_keys=False, default_flow_style=False, allow_unicode=True)
