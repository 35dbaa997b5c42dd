"""The exception tree. Handlers raise `RetryLater`, `Snooze` or `Reject` on purpose; the rest are
ours."""

from __future__ import annotations

import math
from datetime import datetime


class DispatcherError(Exception):
    """Root of every error the dispatcher raises on purpose."""


class ConfigError(DispatcherError):
    """The configuration is invalid; the message names the setting and what is allowed."""


class DatabaseUnavailable(DispatcherError):
    """The database could not be reached or is not ready."""


class ClaimsStarved(DatabaseUnavailable):
    """Claim loops cannot get a database connection (the server refuses more, or every claim
    connection stayed busy); said once per episode, and `/readyz` says it meanwhile."""


class ServerCapacityError(DispatcherError):
    """The server cannot take this daemon's connection budget (`database_max_connections`)."""


class SchemaMismatch(DispatcherError):
    """The database schema is older or newer than this release expects."""


class SchemaBusy(SchemaMismatch):
    """A restore (or another process's migration) holds the schema; try again once it is done."""


class SchemaIncomplete(SchemaMismatch):
    """The schema is there in part (a restore that did not finish); an operator must act."""


class JobControl(DispatcherError):
    """Raised by an effect to decide the outcome of the current attempt."""


class RetryLater(JobControl):
    """Try again after `delay_s` seconds (or the queue's backoff when None).

    `retry_after`: the delay is the target's own request (its Retry-After header), honoured up
    to the job's retry age and never sooner than the backoff. `http_status` is recorded in the
    attempt history."""

    def __init__(
        self,
        reason: str,
        delay_s: float | None = None,
        *,
        rate_limited: bool = False,
        retry_after: bool = False,
        http_status: int | None = None,
    ):
        super().__init__(reason)
        self.reason = reason
        self.delay_s = delay_s
        self.rate_limited = rate_limited
        self.retry_after = retry_after
        self.http_status = http_status


class Reject(JobControl):
    """Permanent failure: the job goes to `dead` now, with this reason."""

    def __init__(self, reason: str, *, code: str = "rejected", http_status: int | None = None):
        super().__init__(reason)
        self.reason = reason
        self.code = code
        self.http_status = http_status


class Snooze(JobControl):
    """Run the job again later without spending an attempt (a poll that found nothing yet, a
    resource not ready): after `delay_s` seconds, or at `until` (a datetime with its offset).
    A handler raises it or returns it; a transactional handler's writes roll back, as nothing
    completed. Bounded like a retry: a snooze ending past the job's retry age
    (`max_retry_age_s`) makes the job dead as `snoozed_past_retry_age`, and so does one more
    than its queue's `max_snoozes` (`max_snoozes`)."""

    def __init__(
        self, delay_s: float | None = None, *, until: datetime | None = None, reason: str = ""
    ):
        if (delay_s is None) == (until is None):
            raise ValueError("Snooze needs delay_s (seconds) or until (a datetime), one of them")
        if delay_s is not None and (
            isinstance(delay_s, bool) or not isinstance(delay_s, int | float) or math.isnan(delay_s)
        ):
            raise ValueError(f"Snooze delay_s must be a number of seconds, not {delay_s!r}")
        if until is not None and (until.tzinfo is None or until.utcoffset() is None):
            raise ValueError("Snooze until must carry its UTC offset (e.g. datetime.now(UTC))")
        super().__init__(reason or "snoozed")
        self.delay_s = delay_s
        self.until = until
        self.reason = reason or "snoozed"
