"""What an operator action raises when it refuses: one class per kind of refusal, so each door
(HTTP, console, CLI) maps them once: to a status, an error page, an exit code.

The message (`detail`) is the same at every door and says why and what to do instead; the
doors add only their own spelling (an HTTP problem's status, a CLI option's name for `field`)."""

from __future__ import annotations

from typing import Any

from dispatcher.errors import DispatcherError


class OperatorError(DispatcherError):
    """An operator action refused; nothing was changed. `context` holds machine-readable
    details a door may pass on (the job's `state`, the known `queues`)."""

    def __init__(self, detail: str, **context: Any):
        super().__init__(detail)
        self.detail = detail
        self.context = context


class NotFound(OperatorError):
    """No such job, queue or schedule (the message lists the known names where it can)."""


class Conflict(OperatorError):
    """The action does not apply in the subject's current state (`context["state"]`)."""


class Invalid(OperatorError):
    """The input is wrong. `field` names it in the API's spelling (e.g. `due_at`), or is None
    when the refusal concerns the request as a whole; `reason` is the message without it."""

    def __init__(self, reason: str, field: str | None = None, **context: Any):
        super().__init__(f"{field}: {reason}" if field else reason, **context)
        self.field = field
        self.reason = reason


class Unavailable(OperatorError):
    """The action could not be completed for now (the database); retrying it is safe."""
