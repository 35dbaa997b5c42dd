"""Runs one attempt of one job and records its outcome. Completion is written before the ack."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any, Protocol

from dispatcher import metrics
from dispatcher.config import QueueSettings
from dispatcher.db.jobs import JobRepository
from dispatcher.effects.base import Effect, LeaseLost
from dispatcher.errors import Reject, RetryLater
from dispatcher.faults import fault_point
from dispatcher.model import Job
from dispatcher.work.completer import Completer
from dispatcher.work.retry import backoff_s

log = logging.getLogger("dispatcher.job")

ERROR_TEXT_LIMIT = 2000


class Attempt(Protocol):
    timed_out: bool

    def effect_ended(self) -> None: ...


class Executor:
    """Executes attempts for one queue. Holds the per-queue metric children (hoisted lookups)."""

    def __init__(
        self,
        queue: str,
        settings: QueueSettings,
        effects: dict[str, Effect],
        repo: JobRepository,
        completer: Completer,
        owner: str,
        effect_timeout_s: dict[str, float],
        on_rescheduled: Callable[[], None] = lambda: None,
    ):
        self.queue = queue
        self._settings = settings
        self._effects = effects
        self._repo = repo
        self._completer = completer
        self._owner = owner
        self._timeouts = effect_timeout_s
        self._on_rescheduled = on_rescheduled
        self._m_succeeded = metrics.JOBS_COMPLETED.labels(queue, "succeeded")
        self._m_duration = metrics.EFFECT_DURATION.labels(queue)
        self._m_lease_lost = metrics.LEASES_LOST.labels(queue)

    def timeout_s(self, handler: str) -> float | None:
        """How long one attempt of `handler` may run (None: unknown handler, no limit)."""
        return self._timeouts.get(handler)

    async def execute(self, job: Job, attempt: Attempt) -> None:
        """Run one attempt. `attempt.effect_ended()` is called once the effect has ended (its
        in-flight slot is free), before the outcome is recorded; the job stays leased until
        then. The pool cancels the task with `attempt.timed_out` set when the handler's
        timeout passes."""
        fault_point("after_claim")
        effect = self._effects.get(job.handler)
        started = time.perf_counter()
        try:
            try:
                if effect is None:
                    raise Reject(
                        f"no handler {job.handler!r} is configured", code="unknown_handler"
                    )
                result = await effect.run(job, self._complete_in)
            except asyncio.CancelledError:
                # a timeout, unless a drain cancelled the attempt as well
                task = asyncio.current_task()
                if attempt.timed_out and task is not None and task.uncancel() == 0:
                    raise TimeoutError from None
                raise
            finally:
                attempt.effect_ended()
            fault_point("after_effect")
            recorded = True
            if not effect.completes_in_transaction:
                recorded = await self._completer.record(job, result)
        except RetryLater as exc:
            delay_s = exc.delay_s
            if exc.rate_limited:  # honour Retry-After, but `Retry-After: 0` must not tight-loop
                delay_s = max(delay_s or 0.0, self._backoff(job))
            await self._retry(
                job, exc.reason, delay_s, "rate_limited" if exc.rate_limited else "transient"
            )
        except Reject as exc:
            await self._fail(job, permanent=True, delay_s=0, error=exc.reason, reason=exc.code)
        except LeaseLost:
            self._m_lease_lost.inc()
            log.warning("lease lost; the new holder finishes the job", extra=job.log_fields)
        except TimeoutError:
            await self._retry(job, "attempt timed out", None, "timeout")
        except asyncio.CancelledError:
            raise  # drain: the pool releases the lease
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
            if _is_permanent_sql_error(exc):
                await self._fail(job, permanent=True, delay_s=0, error=error, reason="sql_error")
            else:
                await self._retry(job, error, None, "error")
        else:
            self._m_duration.observe(time.perf_counter() - started)
            if recorded:
                fault_point("after_complete")
                self._m_succeeded.inc()
            else:
                self._m_lease_lost.inc()

    async def completion_backpressure(self, limit: int) -> None:
        """Hold new claims while more than `limit` completions wait to be written."""
        await self._completer.wait_backlog_at_most(limit)

    async def _complete_in(self, conn: Any, job: Job, result: Any) -> bool:
        fault_point("after_effect_in_transaction")
        return await self._repo.complete_in(conn, job, result, self._owner)

    def _backoff(self, job: Job) -> float:
        return backoff_s(job.attempt, self._settings.backoff_base_s, self._settings.backoff_cap_s)

    async def _retry(self, job: Job, error: str, delay_s: float | None, reason: str) -> None:
        if delay_s is None:
            delay_s = self._backoff(job)
        await self._fail(job, permanent=False, delay_s=delay_s, error=error, reason=reason)

    async def _fail(
        self, job: Job, *, permanent: bool, delay_s: float, error: str, reason: str
    ) -> None:
        error = error[:ERROR_TEXT_LIMIT]
        outcome = await self._repo.record_failure(
            job, self._owner, permanent=permanent, delay_s=delay_s, error=error, reason=reason
        )
        if outcome is None:
            self._m_lease_lost.inc()
            return
        state, dead_reason = outcome
        fields = {**job.log_fields, "state": state}
        if state == "dead":
            metrics.DEAD_LETTERS.labels(self.queue, dead_reason or reason).inc()
            metrics.JOBS_COMPLETED.labels(self.queue, "dead").inc()
            log.warning("dead letter (%s): %s", dead_reason, error, extra=fields)
        elif state == "cancelled":
            metrics.JOBS_COMPLETED.labels(self.queue, "cancelled").inc()
            log.info("cancelled after its attempt failed", extra=fields)
        else:
            metrics.RETRIES.labels(self.queue, reason).inc()
            self._on_rescheduled()
            log.info("retry in %.3f s (%s): %s", delay_s, reason, error, extra=fields)


# SQLSTATE classes that no retry can fix: 42 (syntax, undefined table or column, privileges)
# and 22 (data exceptions such as an invalid value for a parameter).
_PERMANENT_SQLSTATE_CLASSES = ("42", "22")


def _is_permanent_sql_error(exc: Exception) -> bool:
    sqlstate = getattr(exc, "sqlstate", None)
    return isinstance(sqlstate, str) and sqlstate[:2] in _PERMANENT_SQLSTATE_CLASSES
