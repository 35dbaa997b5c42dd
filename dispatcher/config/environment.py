"""How `DISPATCHER_*` environment variables overlay the file's settings, and how a validation
error becomes one line per bad setting naming where its value came from."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, get_args, get_origin

from pydantic import BaseModel, ValidationError

from dispatcher.config.tokens import split_environment
from dispatcher.errors import ConfigError

ENV_PREFIX = "DISPATCHER_"
_NOT_SETTINGS = {ENV_PREFIX + "CONFIG", ENV_PREFIX + "FAULT"}
_LIST_SETTINGS = {
    "api_tokens",
    "target_allow_cidrs",
    "trusted_proxies",
    "params",
    "accepts_versions",
}
_SECRET_SETTINGS = {"api_tokens", "database_url", "signing_secret"}


def apply_env(raw: dict[str, Any], environ: Mapping[str, str]) -> set[tuple[str, ...]]:
    """Overlay DISPATCHER_* variables on the file's settings; return the setting paths they set."""
    from_env: set[tuple[str, ...]] = set()
    for name, value in environ.items():
        if not name.startswith(ENV_PREFIX) or name in _NOT_SETTINGS:
            continue
        path = name[len(ENV_PREFIX) :].lower().split("__")
        if not all(path):
            raise ConfigError(f"{name}: empty section name (use single words joined by __)")
        node = raw
        for part in path[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"{name}: {part} is not a section")
        leaf = path[-1]
        node[leaf] = (
            [v.strip() for v in value.split(",") if v.strip()] if leaf in _LIST_SETTINGS else value
        )
        if leaf == "windows":  # commas list days inside a window: windows split at ';'
            node[leaf] = [v.strip() for v in value.split(";") if v.strip()]
        if path == ["api_tokens"]:  # commas may separate scopes: see split_environment
            node[leaf] = split_environment(value)
        from_env.add(tuple(path))
    return from_env


def describe(
    exc: ValidationError,
    raw: dict[str, Any],
    model: type[BaseModel],
    from_env: set[tuple[str, ...]] = frozenset(),  # type: ignore[assignment]
    path: str | Path | None = None,
) -> str:
    """One line per bad setting: its name, its value (never a secret's), what is allowed, and
    where the value came from: the environment variable that set it, or the file."""
    problems: dict[tuple[Any, ...], list[str]] = {}
    for error in exc.errors():
        # drop the tags pydantic adds for the members of a union, e.g. 'lax-or-strict[...]'
        loc = tuple(p for p in error["loc"] if not (isinstance(p, str) and "[" in p))
        message = error["msg"].removeprefix("Value error, ")
        if error["type"] == "extra_forbidden":
            message = "unknown setting" + _known_names(model, loc)
        messages = problems.setdefault(loc, [])
        if message not in messages:
            messages.append(message)
    lines = []
    for loc, messages in problems.items():
        message = "; ".join(messages)
        if not loc:  # a check across settings: its message names them (and no secret)
            lines.append(message)
            continue
        value = _lookup(raw, loc)
        if any(str(part) in _SECRET_SETTINGS for part in loc) and value is not _MISSING:
            value = "*****"
        # an unknown name may be a misspelt secret; a section's value is too long for one line
        hidden = value is _MISSING or isinstance(value, dict) or message.startswith("unknown")
        shown = "" if hidden else f" = {value!r}"
        location = ".".join(str(part) for part in loc)
        names = tuple(str(p).lower() for p in loc if not isinstance(p, int))
        env = ENV_PREFIX + "__".join(names).upper()
        if any(names[: len(p)] == p for p in from_env):
            origin = f"from env {env}"
        elif value is not _MISSING and path is not None:
            origin = f"in {path}; env {env} overrides it"
        else:
            origin = f"env {env}"
        lines.append(f"setting {location}{shown}: {message} ({origin})")
    return "\n".join(lines)


def _known_names(model: type[BaseModel], loc: tuple[Any, ...]) -> str:
    """`; known: a, b, c` for the section of `model` holding `loc`, or "" if it cannot be told."""
    node: Any = model
    for part in loc[:-1]:
        if isinstance(node, type) and issubclass(node, BaseModel):
            field = node.model_fields.get(str(part))
            node = field.annotation if field is not None else None
        elif get_origin(node) is dict:
            node = get_args(node)[1]
        else:
            return ""
    if isinstance(node, type) and issubclass(node, BaseModel):
        return "; known: " + ", ".join(node.model_fields)
    return ""


_MISSING = object()


def _lookup(raw: Any, loc: tuple[Any, ...]) -> Any:
    node = raw
    for part in loc:
        in_dict = isinstance(node, dict) and part in node
        in_list = isinstance(node, list) and isinstance(part, int) and part < len(node)
        if in_dict or in_list:
            node = node[part]
        else:
            return _MISSING
    return node
