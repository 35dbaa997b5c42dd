"""The contract every effect implements."""

from __future__ import annotations

from typing import Any, Protocol

from dispatcher.model import Job


class Effect(Protocol):
    """Runs one attempt of a job.

    `run` returns a small JSON-able result summary on success, raises `RetryLater` for a
    transient or rate-limited failure and `Reject` for a permanent one. Any other exception is
    treated as transient. Effects with `completes_in_transaction = True` record the completion
    themselves, inside the transaction that carries their database effect, via `complete`.
    """

    completes_in_transaction: bool

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def run(self, job: Job, complete: Any) -> Any: ...
