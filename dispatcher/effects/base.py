"""The contract every effect implements."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, Protocol

from dispatcher.errors import DispatcherError
from dispatcher.model import Job

if TYPE_CHECKING:
    from dispatcher.db.jobs import JobRepository

# Records `succeeded` inside the caller's transaction; False when the lease was lost.
CompleteInTransaction = Callable[[Any, Job, Any], Awaitable[bool]]


class LeaseLost(DispatcherError):
    """This process no longer holds the job's lease; its transaction must not commit."""


# How much of an error or response body an attempt history row keeps.
HISTORY_EXCERPT_CHARS = 500


class Delivered(dict[str, Any]):
    """A result summary (stored as the job's result, like any dict) that also carries what the
    attempt history records beside it: the HTTP status and the start of the response body.
    A dict subclass, so the executor learns them with one type check and no extra call."""

    __slots__ = ("excerpt", "http_status")

    def __init__(self, summary: dict[str, Any], *, http_status: int, excerpt: str | None):
        super().__init__(summary)
        self.http_status = http_status
        self.excerpt = excerpt[:HISTORY_EXCERPT_CHARS] if excerpt else None


class Effect(Protocol):
    """Runs one attempt of a job.

    `run` returns a small JSON-able result summary on success, raises `RetryLater` for a
    transient or rate-limited failure and `Reject` for a permanent one. Any other exception is
    treated as transient. Effects with `completes_in_transaction = True` record the completion
    themselves, in the transaction that carries their database effect, by calling `complete`
    (which is fenced by the lease and the attempt number), on the connection `conn` the
    executor passes them (waited for before the attempt's timeout starts).
    """

    completes_in_transaction: bool

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def run(self, job: Job, complete: CompleteInTransaction, conn: Any = None) -> Any: ...


@asynccontextmanager
async def leased_transaction(
    conn: Any, repo: JobRepository, job: Job, owner: str
) -> AsyncIterator[Any]:
    """A transaction on `conn` holding the job's row lock, or LeaseLost if the lease is no
    longer ours. The row lock keeps the lease rescuer (SKIP LOCKED) away while the effect runs;
    the heartbeat skips the locked row rather than wait for it."""
    async with conn.transaction():
        if not await repo.lock_running(conn, job, owner):
            raise LeaseLost(f"job {job.id} attempt {job.attempt} is no longer ours")
        yield conn


async def complete_or_abort(
    complete: CompleteInTransaction, conn: Any, job: Job, result: Any
) -> None:
    """Record success inside `conn`'s transaction; raising LeaseLost rolls the effect back."""
    if not await complete(conn, job, result):
        raise LeaseLost(f"job {job.id} attempt {job.attempt} is no longer ours")
