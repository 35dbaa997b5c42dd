"""The exception tree. Handlers raise `RetryLater` or `Reject` on purpose; the rest are ours."""

from __future__ import annotations


class DispatcherError(Exception):
    """Root of every error the dispatcher raises on purpose."""


class ConfigError(DispatcherError):
    """The configuration is invalid; the message names the setting and what is allowed."""


class DatabaseUnavailable(DispatcherError):
    """The database could not be reached or is not ready."""


class SchemaMismatch(DispatcherError):
    """The database schema is older or newer than this release expects."""


class JobControl(DispatcherError):
    """Raised by an effect to decide the outcome of the current attempt."""


class RetryLater(JobControl):
    """Try again after `delay_s` seconds (or the queue's backoff when None)."""

    def __init__(self, reason: str, delay_s: float | None = None, *, rate_limited: bool = False):
        super().__init__(reason)
        self.reason = reason
        self.delay_s = delay_s
        self.rate_limited = rate_limited


class Reject(JobControl):
    """Permanent failure: the job goes to `dead` now, with this reason."""

    def __init__(self, reason: str, *, code: str = "rejected"):
        super().__init__(reason)
        self.reason = reason
        self.code = code
