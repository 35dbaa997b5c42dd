"""Request schemas of the intake API. Unknown fields are rejected; every error names its field."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from dispatcher.scheduling.cron import EARLIEST_INSTANT, LATEST_INSTANT, rfc3339

# `\Z`, not `$` (which also matches before a final newline); [0-9], not `\d` (any script's digits)
RFC3339 = re.compile(
    r"^[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt ][0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,9})?"
    r"([Zz]|[+-][0-9]{2}:[0-9]{2})\Z"
)
MAX_BATCH = 1000
# the due times every door accepts (migration 006 holds the same range in SQL)
DUE_AT_RANGE = f"from {rfc3339(EARLIEST_INSTANT)} through {rfc3339(LATEST_INSTANT)}"


class JobRequest(BaseModel):
    """One job to accept. `handler` is "http" or a handler name from the configuration."""

    model_config = ConfigDict(extra="forbid")

    handler: str = Field(min_length=1, max_length=63)
    target: dict[str, Any] | None = None
    payload: dict[str, Any] = Field(default_factory=dict)
    queue: str | None = Field(None, min_length=1, max_length=63)
    tenant: str | None = Field(None, max_length=255)
    due_at: datetime | None = Field(
        None, description=f"RFC 3339 with offset, {DUE_AT_RANGE}; omitted = now"
    )
    # strict: a JSON integer only, not "5", 5.0 or true
    max_attempts: Annotated[int, Field(ge=1, le=1000, strict=True)] | None = None
    max_retry_age_s: Annotated[int, Field(ge=0, le=10 * 365 * 86400, strict=True)] | None = None

    @field_validator("due_at", mode="before")
    @classmethod
    def _rfc3339(cls, value: Any) -> Any:
        if value is not None and (not isinstance(value, str) or not RFC3339.match(value)):
            raise ValueError("must be an RFC 3339 timestamp with offset, e.g. 2026-05-31T00:00:00Z")
        return value

    @field_validator("due_at")
    @classmethod
    def _in_range(cls, value: datetime | None) -> datetime | None:
        # the driver would send datetime.max as 'infinity'; a year past 9999 in UTC does not
        # convert at all
        if value is not None:
            try:
                in_range = EARLIEST_INSTANT <= value.astimezone(UTC) <= LATEST_INSTANT
            except OverflowError:
                in_range = False
            if not in_range:
                raise ValueError(f"is out of range; due times run {DUE_AT_RANGE}")
        return value


class BatchItem(JobRequest):
    idempotency_key: str = Field(min_length=1, max_length=255)


class BatchRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # items are checked one by one (a bad item, even a non-object, never rejects the others)
    jobs: list[Any] = Field(min_length=1, max_length=MAX_BATCH)


def valid_key(key: str | None) -> bool:
    """1 to 255 printable ASCII characters (space to tilde), like the database's own check."""
    return key is not None and 0 < len(key) <= 255 and key.isascii() and key.isprintable()


def idempotency_key(raw: str) -> str | None:
    """The key of a unit of work as both doors store it, or None when `raw` is not a key.

    HTTP drops the spaces and tabs around a header value, so a batch item's key loses them
    too: " k " and "k" name the same job whether sent as `Idempotency-Key` or in a batch. What
    remains must be 1 to 255 printable ASCII characters (space to tilde)."""
    key = raw.strip(" \t")
    return key if valid_key(key) else None


def describe(exc: ValidationError) -> list[dict[str, str]]:
    """Field-level errors, e.g. [{"field": "due_at", "message": "..."}]."""
    return [
        {
            "field": ".".join(str(p) for p in e["loc"]) or "(body)",
            "message": e["msg"].removeprefix("Value error, "),
        }
        for e in exc.errors()
    ]


def summary(errors: list[dict[str, str]]) -> str:
    return "; ".join(f"{e['field']}: {e['message']}" for e in errors)


MAX_JSON_DEPTH = 64


def storable_json(value: Any, *, has_escapes: bool = True) -> str | None:
    """Why PostgreSQL's jsonb could not store `value` (NUL, lone surrogates, too deep), or None.

    NUL and surrogates can only come from `\\u` escapes (raw ones are invalid JSON text), so
    with `has_escapes=False` only the nesting depth is checked: the common case stays cheap.
    """
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            return f"JSON nests deeper than {MAX_JSON_DEPTH} levels"
        if isinstance(node, dict):
            for key, child in node.items():
                if has_escapes and (reason := _storable_text(key)) is not None:
                    return reason
                if has_escapes or isinstance(child, dict | list):
                    stack.append((child, depth + 1))
        elif isinstance(node, list):
            stack.extend(
                (child, depth + 1)
                for child in node
                if has_escapes or isinstance(child, dict | list)
            )
        elif isinstance(node, str) and (reason := _storable_text(node)) is not None:
            return reason
    return None


def _storable_text(text: str) -> str | None:
    if "\x00" in text:
        return "strings may not contain U+0000 (NUL)"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "strings may not contain unpaired UTF-16 surrogates"
    return None


def is_ascii_number(text: str, *, max_digits: int) -> bool:
    """Plain ASCII digits only: str.isdigit() also accepts characters such as '²'."""
    return 0 < len(text) <= max_digits and text.isascii() and text.isdigit()
