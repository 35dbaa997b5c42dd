"""One queue's worker: its claim loop, bounded by a token bucket and an in-flight cap, and the
attempts it runs.

The loop reserves start tokens and in-flight slots first, then claims at most that many jobs in
one statement (relay and claim fused for the in-process transport), so it never holds more work
than it can start at once and never leases a job it cannot run now.

Everything this process remembers about a running job is keyed by (job id, attempt): when an
attempt loses its lease and this same process claims the job again, the stale attempt's end,
timeout or release touches nothing of the new one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from dispatcher.config.settings import QueueSettings
from dispatcher.core.faults import fault_point
from dispatcher.engine.budget import PayloadBudget
from dispatcher.engine.deadlines import Member, SharedDeadline
from dispatcher.engine.executor import Executor, InlineBatch
from dispatcher.engine.limiter import InflightLimit, TokenBucket
from dispatcher.engine.tally import observe_many
from dispatcher.engine.wake_gates import QueueGate
from dispatcher.engine.windows import RETUNE_S, RunWindows
from dispatcher.errors import ClaimsStarved
from dispatcher.model import AttemptKey, Job
from dispatcher.observability import metrics
from dispatcher.relay.transport import Transport
from dispatcher.runtime.lifecycle import Service

log = logging.getLogger(__name__)

CLAIM_ERROR_BACKOFF_S = 1.0
# After a claim the in-flight cap refused while this daemon's successes were being written: the
# longest wait for that write before claiming again (a slot another daemon frees tells nobody)
UNTIL_WRITTEN_S = 0.25
STOP_RECEIVING_TIMEOUT_S = 5.0  # a broker that does not answer the cancel: its channel closes
# Attempts whose outcome could not be written (database down) are remembered so the drain can
# hand their leases back; past this many, the rest simply wait for their leases to expire.
MAX_UNSETTLED = 100_000


class QueueWorker(Service):
    """Claims and runs the jobs of one queue. `stop_claiming` stops new starts at once."""

    def __init__(
        self,
        queue: str,
        settings: QueueSettings,
        transport: Transport,
        executor: Executor,
        *,
        idle_poll_s: float,
        bucket: TokenBucket | None = None,
        budget: PayloadBudget | None = None,
        gate: QueueGate | None = None,
    ):
        self.name = f"claim:{queue}"
        self.queue = queue
        self.settings = settings
        self.bucket = bucket or TokenBucket(settings.rate_per_s, settings.burst)
        self.inflight = InflightLimit(settings.max_inflight)
        self.windows = RunWindows(settings.windows)
        # the daemon's memory budget, shared by all its queues (a worker alone: its own)
        self.budget = budget or PayloadBudget(2**62)
        self.running: dict[AttemptKey, asyncio.Task[bool]] = {}
        self.effects_running = 0  # attempts whose effect has not ended (dispatcher_inflight)
        self.unsettled: set[AttemptKey] = set()
        self._transport = transport
        self._executor = executor
        self._idle_poll_s = idle_poll_s
        # held while the loop waits for work, so intake notifies only then (engine/wake_gates.py)
        self._gate = gate
        self._wake = asyncio.Event()
        self._halt = asyncio.Event()
        self._loop_task: asyncio.Task[None] | None = None
        self._m_due_to_start = metrics.DUE_TO_START.labels(queue)
        # read when scraped: the gauge costs the hot path nothing
        metrics.INFLIGHT.labels(queue).set_function(lambda: self.effects_running)
        self._m_duplicates = metrics.DUPLICATE_DELIVERIES.labels(queue)
        self._m_limiter_wait = metrics.LIMITER_WAIT.labels(queue)
        self._m_key_throttled = metrics.KEY_THROTTLED.labels(queue)

    async def start(self) -> None:
        self._loop_task = self.spawn(self._claim_loop())

    def wake(self) -> None:
        self._wake.set()

    async def stop_claiming(self) -> None:
        """Stop starting new jobs; running ones go on. Idempotent."""
        self._stopping = True
        self._halt.set()
        self._wake.set()
        self.inflight.release(0)  # unblock a loop waiting for a free slot
        # the transport hands back what it holds and wakes a receive waiting for deliveries
        try:
            async with asyncio.timeout(STOP_RECEIVING_TIMEOUT_S):
                await self._transport.stop_receiving(self.queue)
        except Exception as exc:  # the broker redelivers them once the connection closes
            log.error("could not hand back the deliveries of %s: %s", self.queue, exc)
        if self._loop_task is not None:
            task, self._loop_task = self._loop_task, None
            with contextlib.suppress(Exception):  # a loop that died was reported already
                await task

    async def settle(self) -> None:
        """The drain is over: let the acknowledgements of the last attempts reach the broker."""
        await self._transport.settle()

    stop = stop_claiming

    async def _claim_loop(self) -> None:
        while not self._halt.is_set():
            closed_s = self.windows.closed_for_s()
            if closed_s is not None:  # outside every run window: claim nothing
                await self._pause(min(closed_s, RETUNE_S), wake_on_signal=False)
                continue
            await self.inflight.wait_for_free_slot_or(self._halt)
            await self._executor.completion_backpressure(self.inflight.limit)
            if self._halt.is_set():
                return
            wanted = min(self.settings.claim_batch, self.inflight.limit - self.inflight.used)
            tokens = self.bucket.take_up_to(wanted)
            if tokens == 0:
                local_wait_s = self.bucket.seconds_until_available()
                self._m_limiter_wait.inc(local_wait_s)
                await self._pause(min(local_wait_s, RETUNE_S), wake_on_signal=False)
                continue
            slots = self.inflight.reserve_up_to(tokens)
            await self._transport.wait_for_work(self.queue, slots)
            if self.windows.closed_for_s() is not None:  # a window closed while we waited
                self._return_unused(slots, tokens, 0)
                continue
            grant = self.budget.grant()
            if grant is None:  # the payloads of jobs in flight fill the memory budget
                self._return_unused(slots, tokens, 0)
                grant = await self.budget.wait_for_grant(self._halt)
                if grant is not None:
                    self.budget.settle(grant, 0)  # claim with a fresh look at the limits
                continue
            self._wake.clear()
            unwritten = self._executor.unwritten(self.queue)
            try:
                delivery = await self._transport.receive(self.queue, slots, grant)
            except Exception as exc:  # the database may be restarting: try again shortly
                if not isinstance(exc, ClaimsStarved):  # said once for every loop (db/claims.py)
                    log.error("claim failed on queue %s: %s", self.queue, exc)
                self.budget.settle(grant, 0)
                self._return_unused(slots, tokens, 0)
                await self._pause(CLAIM_ERROR_BACKOFF_S, wake_on_signal=False)
                continue
            jobs, taken, wait_s = delivery.jobs, delivery.consumed, delivery.wait_s
            if delivery.key_throttled:
                self._m_key_throttled.inc()
            self.budget.settle(grant, sum(job.size_bytes for job in jobs))
            if delivery.held_back:  # the budget left jobs ready: claim again once bytes are freed
                self.budget.wake_when_freed(self.wake)
            self._return_unused(slots, tokens, len(jobs))
            if taken > len(jobs):
                self._m_duplicates.inc(taken - len(jobs))
            if jobs:
                self._start_all(jobs)
                fault_point(self.name)  # tests: a bug in a claim loop that has work in flight
                if len(jobs) < slots and not await self._more_ready(delivery.drained):
                    await self._wait_for_work()
                elif self._gate is not None:  # claims again at once: intake need not notify
                    self._gate.busy(self.queue)
            elif wait_s is not None:  # the global limits (all daemons together) are spent
                self._m_limiter_wait.inc(wait_s)
                if unwritten:  # perhaps by this daemon's own successes, not yet written
                    await self._until_written(unwritten)
                else:
                    await self._pause(min(wait_s, self._idle_poll_s), wake_on_signal=False)
            elif taken == 0:
                await self._wait_for_work()

    async def _until_written(self, unwritten: int) -> None:
        """Until fewer than `unwritten` successes of this queue wait to be written (bounded).

        A slot frees when its effect ends, but the job stays `running` in the database until
        its success is written, and the claim's grant holds the running jobs of every daemon to
        `max_inflight`: a claim sent for that slot before the write is refused. Its fixed wait
        (20 ms: a slot another daemon frees tells nobody) cost a queue of 4 in flight and 50 ms
        jobs a third of its starts (53 a second, not 80); claiming again after this daemon's
        write gives 71-73. At most one claim more per refusal, and only with successes in
        writing; a slow write is waited for `UNTIL_WRITTEN_S` at most.
        """
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(UNTIL_WRITTEN_S):
                while self._executor.unwritten(self.queue) >= unwritten:
                    await self._executor.wait_for_a_write()

    async def _wait_for_work(self) -> None:
        """Until a wake-up (bounded). With a gate, hold it first, and when it was not held
        since the last look, look once more after the queue's intake settled: an enqueue that
        probed the gate before it was taken sent no notice (engine/wake_gates.py)."""
        if self._gate is not None and await self._gate.before_waiting(self.queue):
            return  # work came in while the loop took the gate: claim it at once
        await self._pause(self._idle_poll_s, wake_on_signal=True)

    async def _more_ready(self, drained: bool) -> bool:
        """After a claim that took fewer jobs than it asked: claim again at once, or wait for a
        wake-up? A wake-up during the claim (a job committed after it began) means at once; a
        claim that says nothing else is ready (`drained`) means wait, without asking again."""
        if self._wake.is_set():
            return True
        if drained:
            return False
        try:
            return await self._transport.more_ready(self.queue)
        except Exception:  # the next claim says what is wrong
            return True

    def _return_unused(self, slots: int, tokens: int, used: int) -> None:
        if slots > used:
            self.inflight.release(slots - used)
        if tokens > used:
            self.bucket.give_back(tokens - used)

    def _start_all(self, jobs: list[Job]) -> None:
        """Everything once per batch: the due-to-start histogram, the in-flight count, one
        deadline per handler. Effects that may finish at once start inline, and those that did
        share one task that writes their successes and then ends them all; every other attempt
        gets a task of its own, so effects that wait run concurrently. A task per attempt was
        the largest cost of a no-op job left in the daemon (py-spy, 2026-12-01: task creation
        and its garbage collection, about a third of the daemon's CPU on a drain)."""
        observe_many(self._m_due_to_start, [max(0.0, job.due_to_start_s) for job in jobs])
        self.effects_running += len(jobs)
        # one per handler, and per (handler, own timeout) for jobs that carry one
        deadlines: dict[tuple[str, float | None], SharedDeadline | None] = {}
        executor, running, create_task = self._executor, self.running, asyncio.create_task
        done = InlineBatch()
        for job in jobs:
            handler = job.handler
            started = None
            if executor.runs_inline(handler):
                started = executor.start_inline(job, done)
                if started is None:
                    continue
            own = (handler, job.timeout_s)
            if own in deadlines:
                deadline = deadlines[own]
            else:
                timeout_s = executor.shared_timeout_s(handler, job.timeout_s)
                deadline = deadlines[own] = (
                    SharedDeadline(timeout_s, self._timed_out) if timeout_s else None
                )
            attempt = _Attempt(self, (job.id, job.attempt), deadline, job.size_bytes)
            context = None if started is None else started[2]
            task = create_task(executor.execute(job, attempt, started), context=context)
            running[attempt.key] = task
            task.add_done_callback(attempt.task_done)
        if done.jobs:
            self._start_recording(done)

    def _start_recording(self, done: InlineBatch) -> None:
        """The attempts of `done` ended their effects: free their slots now, and keep them
        running (heartbeat, drain) until one task has written their successes."""
        ended = len(done.jobs)
        self.effects_running -= ended
        self.inflight.release(ended)
        self.budget.release(sum(job.size_bytes for job in done.jobs))
        keys = [(job.id, job.attempt) for job in done.jobs]
        task = asyncio.create_task(self._executor.record_inline(done))
        for key in keys:
            self.running[key] = task
        task.add_done_callback(lambda t: self._all_finished(keys, t))

    def _all_finished(self, keys: list[AttemptKey], task: asyncio.Task[bool]) -> None:
        """`_finished` for the attempts one recording task wrote."""
        running, finished = self.running, self._transport.finished
        for key in keys:
            if running.get(key) is task:
                del running[key]
            finished(key)
        if task.cancelled():
            return  # the drain cancelled it and hands their leases back
        error = task.exception()
        if error is not None:
            log.error("recording %d attempts ended with an error", len(keys), exc_info=error)
        if error is not None or not task.result():
            room = MAX_UNSETTLED - len(self.unsettled)
            self.unsettled.update(keys[: max(0, room)])

    def _effect_ended(self, size_bytes: int) -> None:
        self.effects_running -= 1
        self.inflight.release()
        self.budget.release(size_bytes)

    def _finished(self, attempt: _Attempt, task: asyncio.Task[bool]) -> None:
        if self.running.get(attempt.key) is task:
            del self.running[attempt.key]
        self._transport.finished(attempt.key)
        attempt.effect_ended()  # no-op unless the task ended before its effect did (cancelled)
        if task.cancelled():
            return  # the drain cancelled it and hands its lease back
        error = task.exception()
        if error is not None:
            log.error("attempt %s ended with an error", attempt.key, exc_info=error)
        if (error is not None or not task.result()) and len(self.unsettled) < MAX_UNSETTLED:
            self.unsettled.add(attempt.key)

    def _timed_out(self, attempt: Member) -> None:
        task = self.running.get(attempt.key)  # type: ignore[attr-defined]
        if task is not None:
            task.cancel()

    async def _pause(self, seconds: float, *, wake_on_signal: bool) -> None:
        """Wait up to `seconds`, cut short by the halt and, with `wake_on_signal`, by a wake-up.
        One event, no task: `stop_claiming` sets the wake event too. (Two waiter tasks under
        `asyncio.wait` put three more event-loop turns between a NOTIFY and its claim.)"""
        event = self._wake if wake_on_signal else self._halt
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await event.wait()

    async def wait_idle(self, abort: asyncio.Event) -> None:
        """Wait until nothing runs, or until `abort` is set (the caller bounds the time)."""
        aborted = asyncio.ensure_future(abort.wait())
        try:
            while self.running and not abort.is_set():
                await asyncio.wait(
                    [*self.running.values(), aborted], return_when=asyncio.FIRST_COMPLETED
                )
        finally:
            aborted.cancel()

    async def cancel_running(self) -> list[AttemptKey]:
        """Cancel attempts still running and wait for them; return their keys (their leases
        must be released). The caller bounds the wait: a handler may ignore cancellation."""
        keys = list(self.running)
        tasks = list(self.running.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return keys


class _Attempt:
    """One job's attempt as the pool sees it. Its in-flight slot and its bytes of the memory
    budget are released exactly once, when the effect ends (the completion write that follows
    runs outside the cap; the completer applies its own backpressure), and it leaves its shared
    deadline at the same moment."""

    __slots__ = ("_deadline", "_released", "_size_bytes", "_worker", "key", "timed_out")

    def __init__(
        self,
        worker: QueueWorker,
        key: AttemptKey,
        deadline: SharedDeadline | None,
        size_bytes: int,
    ):
        self.key = key
        self._size_bytes = size_bytes
        self.timed_out = False
        self._worker = worker
        self._deadline = deadline
        self._released = False
        if deadline is not None:
            deadline.join(self)

    def effect_ended(self) -> None:
        if not self._released:
            self._released = True
            self._worker._effect_ended(self._size_bytes)
            if self._deadline is not None:
                self._deadline.leave(self)

    def task_done(self, task: asyncio.Task[bool]) -> None:
        self._worker._finished(self, task)
