"""Plain data shared across layers: the intake item, the enqueue result or refusal, a claimed
job."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

STATES = ("scheduled", "ready", "running", "succeeded", "dead", "cancelled", "discarded")
# `discarded`: a dead letter an operator decided not to run (dead -> discarded only).
TERMINAL_STATES = ("succeeded", "dead", "cancelled", "discarded")

# One attempt of one job: what everything in memory about a running job is keyed by.
AttemptKey = tuple[int, int]  # (job id, attempt number)


@dataclass(slots=True, frozen=True)
class Rejected:
    """An intake item that changed nothing: HTTP status and what to fix (the outcome intake
    returns beside `EnqueueResult`, and tracing records)."""

    status: int
    detail: str


@dataclass(slots=True, frozen=True)
class NewJob:
    """One validated intake request (HTTP, batch item, cron unit)."""

    key: str
    handler: str
    payload: dict[str, Any]
    due_at: datetime | None = None
    queue: str | None = None
    tenant: str | None = None
    target: dict[str, Any] | None = None
    max_attempts: int | None = None
    max_retry_age_s: int | None = None
    run_key: str | None = None
    # W3C trace context the job was accepted in (stored only while tracing is on)
    traceparent: str | None = None
    priority: int = 0  # -100..100, lower runs first
    # the key per-key limits count by: None = the default (the tenant), "" = no key
    concurrency_key: str | None = None
    # the key's mode when it names a job with another request: "reject" (a conflict),
    # "replace" (debounce) or "keep_due" (throttle) while that job is still scheduled
    on_key: str = "reject"
    debounce_max_s: int | None = None
    # per-job contracts (migration 030): its own deadline, its time to live, its callbacks
    timeout_s: float | None = None
    expires_at: datetime | None = None
    on_success: dict[str, Any] | None = None
    on_failure: dict[str, Any] | None = None

    @property
    def has_contract(self) -> bool:
        return not (
            self.timeout_s is None
            and self.expires_at is None
            and self.on_success is None
            and self.on_failure is None
        )


@dataclass(slots=True, frozen=True)
class EnqueueResult:
    """What intake made of one item: `created`, `existing` (same request), `pruned` (same
    request; the job finished and was pruned, its key kept in the key ledger: `id` and `state`
    are the original job's, the times None), `conflict` (another request), and for the key
    modes `replaced` (the scheduled job now carries this request) or `not_replaced` (the job
    was already ready, running or finished: unchanged)."""

    id: int
    key: str
    state: str
    due_at: datetime | None
    created_at: datetime | None
    outcome: str


@dataclass(slots=True)
class Job:
    """A job claimed by this process for one attempt. `attempt` is 1-based and fences writes."""

    id: int
    key: str
    queue: str
    tenant: str
    handler: str
    handler_version: int
    target: dict[str, Any] | None
    payload: dict[str, Any]
    attempt: int
    max_attempts: int
    due_at: datetime
    progress: dict[str, Any] | None
    run_key: str | None
    due_to_start_s: float
    # the claim builds a Job from its row's first 17 columns, in this order (claim_ready)
    traceparent: str | None = None
    # its payload and target bytes, as the memory budget counts them (migration 020)
    size_bytes: int = 0
    # its own deadline (migration 030): at most its handler's, which applies when None
    timeout_s: float | None = None

    @property
    def log_fields(self) -> dict[str, Any]:
        """The fields every log line about this job carries. Built when a line is logged, not
        per claimed job: most jobs log nothing."""
        fields: dict[str, Any] = {
            "job_id": self.id,
            "job_key": self.key,
            "queue": self.queue,
            "attempt": self.attempt,
        }
        if self.run_key:
            fields["run_key"] = self.run_key
        return fields


@dataclass(slots=True, frozen=True)
class ByteGrant:
    """What one claim may take of the daemon's memory budget: jobs whose payload and target
    bytes add up to at most `bytes`; with `alone` (the daemon holds no other job), the first
    job whatever its size, so a job larger than the whole budget still runs, by itself."""

    bytes: int
    alone: bool = False


# A claim without a budget (tests of the claim statements, tools): everything fits.
UNBOUNDED = ByteGrant(2**62, True)


@dataclass(slots=True, frozen=True)
class JobFilter:
    """Which jobs an operator lists (every filter given must match; None matches every job).

    `due_after` is inclusive and `due_before` exclusive, so adjacent windows neither overlap nor
    leave a gap. `tenant` never matches jobs accepted without one. `key_prefix` and `error` are
    plain text: a % or _ in them matches itself."""

    state: str | None = None
    queue: str | None = None
    key: str | None = None
    tenant: str | None = None
    run_key: str | None = None
    handler: str | None = None
    due_before: datetime | None = None
    due_after: datetime | None = None
    priority: int | None = None
    dead_reason: str | None = None  # also matches discarded jobs, which keep their reason
    key_prefix: str | None = None  # keys that start with it (as typed: no wildcards)
    error: str | None = None  # text anywhere in the last error, any case (no wildcards)
    concurrency_key: str | None = None

    @property
    def by_due(self) -> bool:
        """A due window is listed earliest due first; any other filter newest first (by id)."""
        return self.due_before is not None or self.due_after is not None


@dataclass(slots=True, frozen=True)
class ListCursor:
    """Where the next page of a listing starts: after job `id` (newest first), or after
    (`due_at`, `id`) in a due window (earliest due first)."""

    id: int
    due_at: datetime | None = None


@dataclass(slots=True, frozen=True)
class SearchedIds:
    """The ids a bounded search looked at, `oldest` to `newest` (both included): its page
    holds every match among them, and older jobs are left to search."""

    oldest: int
    newest: int


@dataclass(slots=True, frozen=True)
class JobPage:
    """A page of a job listing: its rows (summaries) and, when the search stopped at its
    bound before filling the page, the ids it looked at (`searched`; None: the rows are the
    whole answer up to the page's limit)."""

    rows: list[dict[str, Any]]
    searched: SearchedIds | None = None


@dataclass(slots=True, frozen=True)
class DeadLetterFilter:
    """Which dead jobs a bulk redrive or discard takes (every filter given must match).

    `dead_since` is inclusive and `dead_before` exclusive (both compare the time the job died,
    its finished_at); `tenant` never matches jobs accepted without one."""

    queue: str | None = None
    dead_reason: str | None = None
    tenant: str | None = None
    dead_since: datetime | None = None
    dead_before: datetime | None = None
