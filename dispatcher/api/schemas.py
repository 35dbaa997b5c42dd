"""Request schemas of the intake API. Unknown fields are rejected; every error names its field."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

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
        return rfc3339_text(value)

    @field_validator("due_at")
    @classmethod
    def _in_range(cls, value: datetime | None) -> datetime | None:
        return due_in_range(value)


def rfc3339_text(value: Any) -> Any:
    """A validator's first step for a time field: None, or RFC 3339 text with an offset."""
    if value is not None and (not isinstance(value, str) or not RFC3339.match(value)):
        raise ValueError("must be an RFC 3339 timestamp with offset, e.g. 2026-05-31T00:00:00Z")
    return value


def due_in_range(value: datetime | None) -> datetime | None:
    """A due time inside the range every door accepts (migration 006 holds it in SQL)."""
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


class RescheduleRequest(BaseModel):
    """POST /v1/jobs/{id}/reschedule. `due_at` is None after validation when "now" was sent."""

    model_config = ConfigDict(extra="forbid")

    due_at: datetime | None = Field(
        description=f'"now", or RFC 3339 with offset, {DUE_AT_RANGE}',
        json_schema_extra={"anyOf": [{"const": "now"}, {"type": "string", "format": "date-time"}]},
    )

    @field_validator("due_at", mode="before")
    @classmethod
    def _now_or_rfc3339(cls, value: Any) -> Any:
        if value == "now":
            return None
        if value is None:
            raise ValueError('send "now" or an RFC 3339 timestamp, e.g. 2026-05-31T00:00:00Z')
        return rfc3339_text(value)

    @field_validator("due_at")
    @classmethod
    def _in_range(cls, value: datetime | None) -> datetime | None:
        return due_in_range(value)


# One bulk call moves at most this many dead jobs (each batch of 1,000 commits on its own).
MAX_BULK_LIMIT = 10_000_000
DEAD_LETTER_FILTERS = ("queue", "dead_reason", "tenant", "dead_since", "dead_before")


class DeadLetterRequest(BaseModel):
    """POST /v1/jobs/redrive and /v1/jobs/discard (and their CLI verbs): which dead jobs, how
    many at most, and whether only to count them. At least one filter, or `all`, is required,
    so an empty body never takes every dead letter by accident."""

    model_config = ConfigDict(extra="forbid")

    queue: str | None = Field(None, min_length=1, max_length=63, pattern=r"^[a-z][a-z0-9_.-]*$")
    dead_reason: str | None = Field(None, min_length=1, max_length=200)
    tenant: str | None = Field(None, min_length=1, max_length=255)
    dead_since: datetime | None = Field(None, description="died at or after (RFC 3339)")
    dead_before: datetime | None = Field(None, description="died before (RFC 3339)")
    limit: Annotated[int, Field(ge=1, le=MAX_BULK_LIMIT, strict=True)] | None = None
    dry_run: bool = Field(False, strict=True)
    all: bool = Field(False, strict=True, description="take every dead job (no filter needed)")

    @field_validator("dead_reason", "tenant")
    @classmethod
    def _storable(cls, value: str | None) -> str | None:
        if value is not None and (reason := _storable_text(value)) is not None:
            raise ValueError(reason)
        return value

    @field_validator("dead_since", "dead_before", mode="before")
    @classmethod
    def _rfc3339(cls, value: Any) -> Any:
        return rfc3339_text(value)

    @field_validator("dead_since", "dead_before")
    @classmethod
    def _utc(cls, value: datetime | None) -> datetime | None:
        try:
            return None if value is None else value.astimezone(UTC)
        except OverflowError:
            raise ValueError("is out of range; use a time from 0001 to 9999 in UTC") from None

    @model_validator(mode="after")
    def _bounded(self) -> DeadLetterRequest:
        if not self.all and all(getattr(self, name) is None for name in DEAD_LETTER_FILTERS):
            raise ValueError(
                f"name at least one filter ({', '.join(DEAD_LETTER_FILTERS)}), or send "
                '"all": true to take every dead job'
            )
        if self.dead_since and self.dead_before and self.dead_since >= self.dead_before:
            raise ValueError("dead_since must be earlier than dead_before")
        return self


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
