"""The `[queues.NAME]` sections: a queue's limits, run windows, retry policy and dead-letter
notice."""

from __future__ import annotations

import math

from pydantic import Field, field_validator, model_validator

from dispatcher.config.base import MAX_BURST, MAX_DURATION_S, MAX_RATE_PER_S, PositiveFloat, Strict
from dispatcher.cron.windows import MAX_WINDOWS, WindowError, parse_windows


class DeadLetterNoticeSettings(Strict):
    """`on_dead` of a queue: each of its jobs that goes dead is reported by a signed http POST
    to `url`, itself a job (in `queue`, default the dead job's own) with its own retries."""

    url: str = Field(min_length=1, max_length=4096)
    queue: str | None = None


class QueueSettings(Strict):
    """Limits and retry policy of one queue. Starts obey the token bucket, running jobs the cap."""

    rate_per_s: PositiveFloat = Field(1000.0, le=MAX_RATE_PER_S)
    burst: int = Field(1000, ge=1, le=MAX_BURST)
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
    # run windows (dispatcher.cron.windows): claims only while one is open; none: always open
    windows: list[str] = Field(default_factory=list, max_length=MAX_WINDOWS)

    @field_validator("windows")
    @classmethod
    def _windows(cls, value: list[str]) -> list[str]:
        try:
            parse_windows(value)
        except WindowError as exc:
            raise ValueError(str(exc)) from None
        return value

    # a budget shared with other queues ([limit_groups.NAME], config/limits.py); both bind
    limit_group: str | None = None
    group_priority: int = Field(0, ge=-100, le=100)  # within the group: lower goes first
    # every concurrency key of the queue gets these (unset: no limit), all daemons together
    key_max_inflight: int | None = Field(None, ge=1, le=100_000)
    key_rate_per_s: float | None = Field(None, gt=0, le=MAX_RATE_PER_S)
    key_burst: int | None = Field(None, ge=1, le=MAX_BURST)

    @model_validator(mode="after")
    def _key_burst_needs_a_rate(self) -> QueueSettings:
        if self.key_burst is not None and self.key_rate_per_s is None:
            raise ValueError("key_burst is the burst of key_rate_per_s: set key_rate_per_s too")
        return self

    def key_limits(self) -> tuple[float | None, int | None, int | None]:
        """(key_rate_per_s, key_burst, key_max_inflight) as the registry stores them; a rate
        without a burst gets one second's worth."""
        burst = self.key_burst
        if self.key_rate_per_s is not None and burst is None:
            burst = max(1, math.ceil(self.key_rate_per_s))
        return self.key_rate_per_s, burst, self.key_max_inflight
