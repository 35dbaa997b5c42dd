"""The `[queues.NAME]` sections: a queue's limits, retry policy and dead-letter notice."""

from __future__ import annotations

from pydantic import Field

from dispatcher.config.base import MAX_DURATION_S, PositiveFloat, Strict


class DeadLetterNoticeSettings(Strict):
    """`on_dead` of a queue: each of its jobs that goes dead is reported by a signed http POST
    to `url`, itself a job (in `queue`, default the dead job's own) with its own retries."""

    url: str = Field(min_length=1, max_length=4096)
    queue: str | None = None


class QueueSettings(Strict):
    """Limits and retry policy of one queue. Starts obey the token bucket, running jobs the cap."""

    rate_per_s: PositiveFloat = 1000.0
    burst: int = Field(1000, ge=1)
    max_inflight: int = Field(200, ge=1, le=100_000)
    max_attempts: int = Field(10, ge=1)
    max_retry_age_s: int = Field(86_400, ge=0, le=MAX_DURATION_S)
    backoff_base_s: float = Field(1.0, gt=0, le=MAX_DURATION_S)
    backoff_cap_s: float = Field(3600.0, gt=0, le=MAX_DURATION_S)
    claim_batch: int = Field(500, ge=1, le=10_000)
    # Snoozes (a handler's "run me again later", which spends no attempt) one job may take
    # since its attempt budget started; one more makes it dead as `max_snoozes`. With the
    # retry age, it keeps a handler that snoozes without end from running forever.
    max_snoozes: int = Field(1000, ge=0, le=1_000_000)
    on_dead: DeadLetterNoticeSettings | None = None
