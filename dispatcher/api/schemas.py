"""Request schemas of the HTTP API. Unknown fields are rejected; every error names its field.

The request types the domain shares with other doors (a job, the dead-letter filter) live in
`dispatcher.intake.requests`; these are the API's own (batches, reschedule) and its helpers."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
)

from dispatcher.intake.requests import (
    DUE_AT_RANGE,
    JobRequest,
    due_in_range,
    optional_time,
    storable_text,
)

MAX_BATCH = 1000


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
        return optional_time(value)

    @field_validator("due_at")
    @classmethod
    def _in_range(cls, value: datetime | None) -> datetime | None:
        return due_in_range(value)


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
                if has_escapes and (reason := storable_text(key)) is not None:
                    return reason
                if has_escapes or isinstance(child, dict | list):
                    stack.append((child, depth + 1))
        elif isinstance(node, list):
            stack.extend(
                (child, depth + 1)
                for child in node
                if has_escapes or isinstance(child, dict | list)
            )
        elif isinstance(node, str) and (reason := storable_text(node)) is not None:
            return reason
    return None


def is_ascii_number(text: str, *, max_digits: int) -> bool:
    """Plain ASCII digits only: str.isdigit() also accepts characters such as '²'."""
    return 0 < len(text) <= max_digits and text.isascii() and text.isdigit()
