"""The contract every effect implements."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from dispatcher.errors import DispatcherError
from dispatcher.model import Job

# Records `succeeded` inside the caller's transaction; False when the lease was lost.
CompleteInTransaction = Callable[[Any, Job, Any], Awaitable[bool]]


class LeaseLost(DispatcherError):
    """This process no longer holds the job's lease; its transaction must not commit."""


class Effect(Protocol):
    """Runs one attempt of a job.

    `run` returns a small JSON-able result summary on success, raises `RetryLater` for a
    transient or rate-limited failure and `Reject` for a permanent one. Any other exception is
    treated as transient. Effects with `completes_in_transaction = True` record the completion
    themselves, in the transaction that carries their database effect, by calling `complete`
    (which is fenced by the lease and the attempt number).
    """

    completes_in_transaction: bool

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def run(self, job: Job, complete: CompleteInTransaction) -> Any: ...
