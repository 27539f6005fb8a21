"""Whether a server's tools are valid OpenAI function definitions, read from its ``/openapi.json``.

A tool is a ``POST /<name>`` route that is not one of the standard routes; the model calls it with
the JSON of its request body. As an OpenAI function (``{"type": "function", "name", "description",
"parameters"}``) its name must match ``^[a-zA-Z0-9_-]{1,64}$`` and its ``parameters`` must be a JSON
Schema of ``type: object`` (``$ref``\\ s into the document's ``components`` resolved), with
``properties`` a mapping and ``required`` a list of its names; the schema itself must be valid
(checked with ``jsonschema``'s metaschema when that package is installed).

Example:
    >>> doc = {"paths": {"/add": {"post": {"requestBody": {"content": {"application/json": {
    ...     "schema": {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}}}}}}}}
    >>> [(d["name"], problems) for d, problems in function_definitions(doc)]
    [('add', [])]
"""

from __future__ import annotations

import copy
import re
from typing import Any

from nemo_gym_env.protocol.types import RESERVED_ROUTES

__all__ = ["OPENAI_NAME", "function_definitions", "schema_problems"]

OPENAI_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
"""What OpenAI accepts as a function name."""

_NOT_TOOLS = RESERVED_ROUTES | {"reset", "step"}


def _resolve(node: Any, doc: dict[str, Any], depth: int = 0) -> Any:
    """``node`` with every local ``$ref`` replaced by its target (cycles stop after 20 levels)."""
    if depth > 20:
        return node
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/"):
            target: Any = doc
            for part in ref[2:].split("/"):
                target = target.get(part) if isinstance(target, dict) else None
            if target is not None:
                merged = {**copy.deepcopy(target), **{k: v for k, v in node.items() if k != "$ref"}}
                return _resolve(merged, doc, depth + 1)
        return {key: _resolve(value, doc, depth + 1) for key, value in node.items()}
    if isinstance(node, list):
        return [_resolve(value, doc, depth + 1) for value in node]
    return node


def schema_problems(name: str, parameters: Any) -> list[str]:
    """Why ``{name, parameters}`` is not a valid OpenAI function definition (empty when it is)."""
    problems = []
    if not OPENAI_NAME.match(name):
        problems.append(f"name {name!r} does not match ^[a-zA-Z0-9_-]{{1,64}}$")
    if not isinstance(parameters, dict):
        return problems + ["parameters is not a JSON object"]
    if parameters.get("type") != "object":
        problems.append(f"parameters has type {parameters.get('type')!r}, not 'object'")
    properties = parameters.get("properties", {})
    if not isinstance(properties, dict):
        problems.append("parameters.properties is not a mapping")
        properties = {}
    required = parameters.get("required", [])
    if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
        problems.append("parameters.required is not a list of names")
    else:
        unknown = [r for r in required if r not in properties]
        if unknown:
            problems.append(f"parameters.required names {unknown}, which are not in properties")
    try:
        import jsonschema
    except ImportError:
        return problems
    try:
        jsonschema.Draft202012Validator.check_schema(parameters)
    except jsonschema.SchemaError as exc:
        problems.append(f"parameters is not a valid JSON Schema: {exc.message[:200]}")
    return problems


def function_definitions(doc: dict[str, Any]) -> list[tuple[dict[str, Any], list[str]]]:
    """Every tool route of an OpenAPI document as an OpenAI function definition, with its problems."""
    found = []
    for path, operations in (doc.get("paths") or {}).items():
        name = str(path).lstrip("/")
        post = operations.get("post") if isinstance(operations, dict) else None
        if post is None or not name or "/" in name or name in _NOT_TOOLS:
            continue
        content = ((post.get("requestBody") or {}).get("content") or {}).get("application/json") or {}
        schema = _resolve(content.get("schema", {"type": "object", "properties": {}}), doc)
        if isinstance(schema, dict):
            schema.pop("title", None)
            branches = schema.get("anyOf")
            if isinstance(branches, list):  # an optional body (FastAPI: model | None): the model is the tool's
                kept = [b for b in branches if not (isinstance(b, dict) and b.get("type") == "null")]
                if len(kept) == 1 and len(kept) < len(branches) and isinstance(kept[0], dict):
                    schema = {k: v for k, v in kept[0].items() if k != "title"}
        definition = {"type": "function", "name": name, "description": post.get("description") or
                      post.get("summary") or "", "parameters": schema}
        found.append((definition, schema_problems(name, schema)))
    return found
