"""Runs one attempt of one job and records its outcome. Completion is written before the ack."""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
import types
from collections.abc import Awaitable, Callable, Coroutine, Generator
from dataclasses import dataclass
from typing import Any, Protocol, cast

from dispatcher.config.settings import MAX_DURATION_S, QueueSettings
from dispatcher.core.faults import fault_point
from dispatcher.db.jobs import JobRepository
from dispatcher.db.outcomes import storable_text
from dispatcher.effects.base import Effect, LeaseLost
from dispatcher.effects.python import PythonEffect
from dispatcher.engine.completer import Completer
from dispatcher.engine.retry import backoff_s
from dispatcher.errors import Reject, RetryLater, Snooze
from dispatcher.model import Job
from dispatcher.observability import metrics
from dispatcher.observability.tracing import Tracing

log = logging.getLogger("dispatcher.job")

ERROR_TEXT_LIMIT = 2000


class Attempt(Protocol):
    timed_out: bool

    def effect_ended(self) -> None: ...


# an effect `start_inline` began that must go on in a task: what to await, when it started, and
# the context it runs in
StartedEffect = tuple[Awaitable[Any], float, contextvars.Context]


class InlineBatch:
    """Attempts of one claim whose effects finished without ever waiting (parallel lists): their
    successes are written together, as one group of the completer, awaited by one task."""

    __slots__ = ("jobs", "latencies", "results")

    def __init__(self) -> None:
        self.jobs: list[Job] = []
        self.results: list[Any] = []
        self.latencies: list[float] = []


class Executor:
    """Executes attempts for one queue. Holds the per-queue metric children (hoisted lookups).

    A transactional effect (python with `transactional`, sql) holds a database connection for
    its whole run. Those connections come from a pool of their own (`handler_repo`), so slow
    handlers can never take intake's, the heartbeat's or the completer's; an attempt first waits
    for one, and only then does its timeout start, so waiting never eats its own deadline.
    """

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
        handler_repo: JobRepository | None = None,
        tracing: Tracing | None = None,
    ):
        self.queue = queue
        self._settings = settings
        self._effects = effects
        self._repo = repo
        self._handler_repo = handler_repo or repo
        self._completer = completer
        self._owner = owner
        self._timeouts = effect_timeout_s
        self._on_rescheduled = on_rescheduled
        self._tracing = tracing  # None (off): one test per attempt, nothing else
        self._m_succeeded = metrics.JOBS_COMPLETED.labels(queue, "succeeded")
        self._m_duration = metrics.EFFECT_DURATION.labels(queue)
        self._m_lease_lost = metrics.LEASES_LOST.labels(queue)
        self._m_unrecorded = metrics.OUTCOMES_UNRECORDED.labels(queue)
        self._complete_in_bound = self._complete_in  # one bound method, not one per attempt
        self._inline: dict[str, bool] = {}  # handler -> may its attempts start inline

    def shared_timeout_s(self, handler: str, own_s: float | None = None) -> float | None:
        """The timeout the pool enforces from the claim for attempts of `handler` (of a job
        whose own deadline is `own_s`): None for an unknown handler, and for transactional
        effects (timed here, once they have a connection)."""
        effect = self._effects.get(handler)
        if effect is None or effect.completes_in_transaction:
            return None
        return self._timeout_s(handler, own_s)

    def _timeout_s(self, handler: str, own_s: float | None) -> float | None:
        """A job's deadline: its own, never past its handler's (intake refuses more; a
        handler's maximum lowered since the job was accepted still bounds it)."""
        handler_s = self._timeouts.get(handler)
        if own_s is None or (handler_s is not None and handler_s < own_s):
            return handler_s
        return own_s

    def runs_inline(self, handler: str) -> bool:
        """Whether attempts of `handler` start inline (`start_inline`): non-transactional python
        handlers, while tracing is off. Most of them (a no-op, a handler that only computes)
        finish without waiting, and then need no task of their own."""
        inline = self._inline.get(handler)
        if inline is None:
            effect = self._effects.get(handler)
            inline = self._inline[handler] = (
                type(effect) is PythonEffect
                and not effect.completes_in_transaction
                and self._tracing is None
            )
        return inline

    def start_inline(self, job: Job, done: InlineBatch) -> StartedEffect | None:
        """Run the effect of `job`'s attempt (a `runs_inline` handler) in the caller's frame, in
        a context of its own, as a task's first step would. Finished without waiting: its
        success joins `done` (written by `record_inline`) and None is returned. Otherwise returns
        what a task must await to go on from there (the suspended effect, or the exception it
        raised), the effect's start time and its context: `execute(..., started_effect=...)`
        in a task created in that context."""
        fault_point("after_claim")
        started = time.perf_counter()
        effect = cast(PythonEffect, self._effects[job.handler])
        coro = effect.run(job, self._complete_in_bound)
        context = contextvars.copy_context()
        try:
            waiting = context.run(coro.send, None)
        except StopIteration as finished:
            if isinstance(finished.value, Snooze):  # returned, not raised: the same request
                return _raise(finished.value), started, context
            fault_point("after_effect")
            done.jobs.append(job)
            done.results.append(finished.value)
            done.latencies.append(time.perf_counter() - started)
            return None
        except (Exception, asyncio.CancelledError) as exc:
            return _raise(exc), started, context
        return _resume(coro, waiting), started, context

    async def record_inline(self, done: InlineBatch) -> bool:
        """Write the successes of `done` in one group; False if they could not be written (the
        jobs stay leased until the drain hands them back or their leases expire)."""
        try:
            held = await self._completer.record_many(done.jobs, done.results, done.latencies)
        except Exception as exc:
            for job in done.jobs:
                self._unrecorded(job, exc)
            return False
        lost = len(held) - sum(held)
        if lost:
            self._m_lease_lost.inc(lost)
        fault_point("after_complete")
        return True

    async def execute(
        self,
        job: Job,
        attempt: Attempt,
        started_effect: StartedEffect | None = None,
    ) -> bool:
        """Run one attempt and record its outcome; return False if the outcome could not be
        written (the database failed): the job then stays leased until the drain hands it back
        or its lease expires and any instance retries it. `attempt.effect_ended()` is called
        once the effect has ended (its in-flight slot is free), before the outcome is recorded.
        The pool cancels the task with `attempt.timed_out` set when the handler's timeout
        passes."""
        if self._tracing is not None:
            return await self._execute_traced(self._tracing, job, attempt)
        if started_effect is None:
            fault_point("after_claim")
        try:
            await self._attempt(job, attempt, started_effect)
            return True
        except Exception as exc:  # only writes of the outcome get here
            self._unrecorded(job, exc)
            return False

    async def _execute_traced(self, tracing: Tracing, job: Job, attempt: Attempt) -> bool:
        """`execute` inside the attempt's span, which is current meanwhile (the http effect
        sends it as `traceparent`). Kept apart so an untraced attempt pays for none of it."""
        span, token = tracing.start_attempt(job)
        outcome, error = "interrupted", None  # a drain's cancellation: the lease is handed back
        try:
            fault_point("after_claim")
            outcome = await self._attempt(job, attempt)
            return True
        except Exception as exc:
            outcome, error = "unrecorded", f"{type(exc).__name__}: {exc}"
            self._unrecorded(job, exc)
            return False
        finally:
            tracing.end_attempt(span, token, outcome, error)

    def _unrecorded(self, job: Job, exc: Exception) -> None:
        self._m_unrecorded.inc()
        log.error(
            "could not record the outcome of attempt %d (%s: %s); the job is retried once "
            "its lease expires",
            job.attempt,
            type(exc).__name__,
            exc,
            extra=job.log_fields,
        )

    async def _attempt(
        self,
        job: Job,
        attempt: Attempt,
        started_effect: StartedEffect | None = None,
    ) -> str:
        """Run the effect (or go on with one `start_inline` began) and record its outcome;
        return the outcome (succeeded, retry, dead, cancelled, lease_lost). Raises only when
        the outcome could not be written."""
        effect = self._effects.get(job.handler)
        started = time.perf_counter() if started_effect is None else started_effect[1]
        try:
            try:
                if started_effect is not None:
                    result = await started_effect[0]
                elif effect is None:
                    raise Reject(
                        f"no handler {job.handler!r} is configured", code="unknown_handler"
                    )
                elif effect.completes_in_transaction:
                    result = await self._run_in_transaction(effect, job, started)
                else:  # no frame of its own: this is every no-op and http job
                    result = await effect.run(job, self._complete_in_bound)
                if isinstance(result, Snooze):  # a handler may return its snooze, not raise it
                    raise result
            except asyncio.CancelledError:
                # a timeout, unless a drain cancelled the attempt as well
                task = asyncio.current_task()
                if attempt.timed_out and task is not None and task.uncancel() == 0:
                    raise TimeoutError from None
                raise
            finally:
                attempt.effect_ended()
                # its bytes left the memory budget: the completion write needs ids, not them
                job.payload = {}
        except RetryLater as exc:
            return await self._retry_later(job, exc, time.perf_counter() - started)
        except Snooze as exc:
            return await self._snooze(job, exc, time.perf_counter() - started)
        except Reject as exc:
            return await self._fail(
                job,
                _Failure(exc.reason, exc.code, time.perf_counter() - started, exc.http_status),
                permanent=True,
                delay_s=0,
            )
        except LeaseLost:  # the rescuer wrote this attempt's history row (lease_expired)
            self._m_lease_lost.inc()
            log.warning("lease lost; the new holder finishes the job", extra=job.log_fields)
            return "lease_lost"
        except TimeoutError:
            failure = _Failure("attempt timed out", "timeout", time.perf_counter() - started)
            return await self._retry(job, failure, None)
        except Exception as exc:
            failure = _Failure(describe(exc), "error", time.perf_counter() - started)
            if _is_permanent_sql_error(exc):
                failure.reason = "sql_error"
                return await self._fail(job, failure, permanent=True, delay_s=0)
            return await self._retry(job, failure, None)
        fault_point("after_effect")
        latency_s = time.perf_counter() - started
        assert effect is not None  # an unknown handler was rejected above
        if effect.completes_in_transaction:
            self._m_duration.observe(latency_s)
            self._m_succeeded.inc()
        # the completer counts the batch it writes (duration and succeeded, once per batch)
        elif not (await self._completer.record(job, result, latency_s))[0]:
            self._m_lease_lost.inc()
            return "lease_lost"
        fault_point("after_complete")
        return "succeeded"

    async def _run_in_transaction(self, effect: Effect, job: Job, started: float) -> Any:
        async def complete(conn: Any, job: Job, result: Any) -> bool:
            return await self._complete_in(conn, job, result, time.perf_counter() - started)

        async with self._handler_repo.connection() as conn:
            async with asyncio.timeout(self._timeout_s(job.handler, job.timeout_s)):
                return await effect.run(job, complete, conn)

    def unwritten(self, queue: str) -> int:
        """Successes of `queue` not yet written (Completer.unwritten)."""
        return self._completer.unwritten(queue)

    async def wait_for_a_write(self) -> None:
        await self._completer.wait_for_a_write()

    async def completion_backpressure(self, limit: int) -> None:
        """Hold new claims while more than `limit` completions wait to be written."""
        await self._completer.wait_backlog_at_most(limit)

    async def _complete_in(
        self, conn: Any, job: Job, result: Any, latency_s: float | None = None
    ) -> bool:
        fault_point("after_effect_in_transaction")
        return await self._repo.complete_in(conn, job, result, self._owner, latency_s)

    def _backoff(self, job: Job) -> float:
        return backoff_s(job.attempt, self._settings.backoff_base_s, self._settings.backoff_cap_s)

    async def _retry_later(self, job: Job, exc: RetryLater, latency_s: float) -> str:
        kind = "rate_limited" if exc.rate_limited else "transient"
        failure = _Failure(exc.reason, kind, latency_s, exc.http_status)
        delay_s = exc.delay_s
        if exc.retry_after and delay_s is not None and delay_s == delay_s:  # not NaN
            failure.retry_after_s = _clamped(delay_s)
        if exc.rate_limited or exc.retry_after:
            # honour Retry-After, but never sooner than the backoff: `Retry-After: 0` must not
            # tight-loop
            delay_s = max(delay_s or 0.0, self._backoff(job))
        return await self._retry(job, failure, delay_s)

    async def _retry(self, job: Job, failure: _Failure, delay_s: float | None) -> str:
        if delay_s is None or delay_s != delay_s:  # none asked for, or NaN
            delay_s = self._backoff(job)
        return await self._fail(job, failure, permanent=False, delay_s=_clamped(delay_s))

    async def _fail(self, job: Job, failure: _Failure, *, permanent: bool, delay_s: float) -> str:
        """Record a failed attempt; return the outcome: dead, cancelled, retry or lease_lost."""
        # stored whole, in its safe form (cut with a marker past ERROR_CHARS: db/outcomes.py)
        error, reason = failure.error, failure.reason
        outcome = await self._repo.record_failure(
            job,
            self._owner,
            permanent=permanent,
            delay_s=delay_s,
            error=error,
            reason=reason,
            retry_after_s=failure.retry_after_s,
            http_status=failure.http_status,
            latency_s=failure.latency_s,
        )
        return self._ended(job, outcome, reason, error, delay_s)

    async def _snooze(self, job: Job, request: Snooze, latency_s: float) -> str:
        """Put the job back to wait without spending its attempt (the handler snoozed it);
        return the outcome: snoozed, or dead, cancelled, lease_lost as for a failure."""
        delay_s = _clamped(request.delay_s or 0.0)
        outcome = await self._repo.snooze(
            job,
            self._owner,
            delay_s=delay_s,
            until=request.until,
            reason=request.reason,
            max_snoozes=self._settings.max_snoozes,
            latency_s=latency_s,
        )
        if outcome is not None and outcome[0] == "scheduled":
            metrics.SNOOZES.labels(self.queue).inc()
            self._on_rescheduled()
            log.info("snoozed: %s", request.reason, extra=job.log_fields)
            return "snoozed"
        return self._ended(job, outcome, "snoozed", request.reason, delay_s)

    def _ended(
        self,
        job: Job,
        outcome: tuple[str, str | None] | None,
        reason: str,
        error: str,
        delay_s: float,
    ) -> str:
        """Count and log what a failed (or snoozed) attempt's write made of the job."""
        if outcome is None:
            self._m_lease_lost.inc()
            return "lease_lost"
        state, dead_reason = outcome
        fields = {**job.log_fields, "state": state}
        shown = storable_text(error, ERROR_TEXT_LIMIT)  # a handler's reason may not be text
        if state == "dead":
            metrics.DEAD_LETTERS.labels(self.queue, dead_reason or reason).inc()
            metrics.JOBS_COMPLETED.labels(self.queue, "dead").inc()
            log.warning("dead letter (%s): %s", dead_reason, shown, extra=fields)
            return "dead"
        if state == "cancelled":
            metrics.JOBS_COMPLETED.labels(self.queue, "cancelled").inc()
            log.info("cancelled after its attempt failed", extra=fields)
            return "cancelled"
        metrics.RETRIES.labels(self.queue, reason).inc()
        self._on_rescheduled()
        log.info("retry in %.3f s (%s): %s", delay_s, reason, shown, extra=fields)
        return "retry"


@dataclass(slots=True)
class _Failure:
    """How an attempt failed, as its outcome and history row record it. `reason` is the
    failure's class (timeout, transient, rate_limited, error) or a permanent failure's code."""

    error: str
    reason: str
    latency_s: float
    http_status: int | None = None
    retry_after_s: float | None = None  # the delay the target asked for, if any


async def _raise(exc: BaseException) -> Any:
    """An effect that raised before it ever waited: the attempt's task meets the exception."""
    raise exc


@types.coroutine
def _resume(coro: Coroutine[Any, Any, Any], waiting: Any) -> Generator[Any, Any, Any]:
    """Go on with `coro`, started outside any task and now waiting on `waiting`: the task that
    awaits this is handed `waiting` first, then every send and throw passes through (a
    cancellation reaches the effect where it waits, as in a task of its own)."""
    while True:
        try:
            value = yield waiting
        except GeneratorExit:
            coro.close()
            raise
        except BaseException as exc:  # thrown in by the task: a cancellation
            try:
                waiting = coro.throw(exc)
            except StopIteration as finished:
                return finished.value
            continue
        try:
            waiting = coro.send(value)
        except StopIteration as finished:
            return finished.value


def describe(exc: BaseException) -> str:
    """An exception as its error text: its type and message, or only its type when the message
    cannot be made (a handler's exception may raise from `__str__`: still an ordinary failure)."""
    try:
        return f"{type(exc).__name__}: {exc}"
    except Exception:
        return f"{type(exc).__name__} (its message could not be read)"


def _clamped(delay_s: float) -> float:
    """A requested delay is input: an infinite or huge one is past any retry age (dead), and the
    database must always be able to add it to now()."""
    return min(max(delay_s, 0.0), MAX_DURATION_S)


# SQLSTATE classes that no retry can fix: 42 (syntax, undefined table or column, privileges)
# and 22 (data exceptions such as an invalid value for a parameter).
_PERMANENT_SQLSTATE_CLASSES = ("42", "22")


def _is_permanent_sql_error(exc: Exception) -> bool:
    sqlstate = getattr(exc, "sqlstate", None)
    return isinstance(sqlstate, str) and sqlstate[:2] in _PERMANENT_SQLSTATE_CLASSES
