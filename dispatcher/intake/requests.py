"""What the doors accept, before any configuration is consulted: one job (HTTP, a batch item,
and intake, which checks the rest against the configuration), and the dead-letter filter of bulk
redrive and discard (HTTP, CLI, console). Unknown fields are rejected; every error names its
field. The API's own request types (batches, reschedule) live in `dispatcher.api.schemas`."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from dispatcher.core import rfc3339
from dispatcher.cron.expression import EARLIEST_INSTANT, LATEST_INSTANT

# the due times every door accepts (migration 006 holds the same range in SQL)
DUE_AT_RANGE = f"from {rfc3339.format(EARLIEST_INSTANT)} through {rfc3339.format(LATEST_INSTANT)}"


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
    # per-job contracts (docs/guides/deadlines.md, docs/guides/callbacks.md; migration 030)
    timeout_s: Annotated[float, Field(gt=0, le=10 * 365 * 86400)] | None = Field(
        None, description="this job's deadline per attempt, at most its handler's timeout_s"
    )
    expires_at: datetime | None = Field(
        None, description=f"RFC 3339 with offset, {DUE_AT_RANGE}: no attempt starts after it"
    )
    on_success: dict[str, Any] | None = Field(None, description="a target pushed when it succeeds")
    on_failure: dict[str, Any] | None = Field(None, description="a target pushed when it dies")
    priority: int = Field(
        0, ge=-100, le=100, strict=True, description="lower runs first, -100 to 100 (default 0)"
    )
    concurrency_key: str | None = Field(
        None,
        min_length=1,
        max_length=200,
        description="the key per-key limits count by; omitted = the tenant, null = no key",
    )

    @field_validator("concurrency_key")
    @classmethod
    def _storable(cls, value: str | None) -> str | None:
        if value is not None and (reason := storable_text(value)) is not None:
            raise ValueError(reason)
        return value

    def stored_concurrency_key(self) -> str | None:
        """The key as the SQL door takes it: None = the default (the tenant), "" = no key."""
        if "concurrency_key" in self.model_fields_set and self.concurrency_key is None:
            return ""
        return self.concurrency_key

    # when the key already names a job with another request: reject it (409), or replace that
    # job while it is still scheduled: its body and due time (debounce), or its body only
    # (keep_due: throttle); debounce_max_s bounds how far replacements push it past acceptance
    on_key: Literal["reject", "replace", "keep_due"] = "reject"
    debounce_max_s: Annotated[int, Field(ge=0, le=10 * 365 * 86400, strict=True)] | None = None

    @field_validator("due_at", "expires_at", mode="before")
    @classmethod
    def _rfc3339(cls, value: Any) -> Any:
        return optional_time(value)

    @field_validator("due_at", "expires_at")
    @classmethod
    def _in_range(cls, value: datetime | None) -> datetime | None:
        return due_in_range(value)

    @model_validator(mode="after")
    def _expires_after_due(self) -> JobRequest:
        due, expires = self.due_at, self.expires_at
        if expires is not None and due is not None and expires <= due:
            raise ValueError("expires_at must be later than due_at: the job could never start")
        return self

    @model_validator(mode="after")
    def _debounce_with_replace(self) -> JobRequest:
        if self.debounce_max_s is not None and self.on_key != "replace":
            raise ValueError(
                'debounce_max_s: only with "on_key": "replace" (keep_due never moves the due '
                "time; reject never replaces)"
            )
        return self


def optional_time(value: Any) -> datetime | None:
    """A validator's first step for a time field: None, or RFC 3339 text with an offset (a
    `datetime` object is refused too: a naive one would pass as UTC)."""
    return None if value is None else rfc3339.parse(value)


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
        if value is not None and (reason := storable_text(value)) is not None:
            raise ValueError(reason)
        return value

    @field_validator("dead_since", "dead_before", mode="before")
    @classmethod
    def _rfc3339(cls, value: Any) -> Any:
        return optional_time(value)

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


def storable_text(text: str) -> str | None:
    """Why PostgreSQL could not store `text` (NUL, lone surrogates), or None."""
    if "\x00" in text:
        return "strings may not contain U+0000 (NUL)"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "strings may not contain unpaired UTF-16 surrogates"
    return None
