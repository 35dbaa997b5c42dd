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
