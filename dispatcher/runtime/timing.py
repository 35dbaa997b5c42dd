"""The daemon's one timing engine: every periodic job and every cron fire runs on it.

APScheduler (the design card's choice) is wrapped here once, as a service with the common
contract: `start()` returns once it runs, `stop()` is idempotent and returns once no job of it
runs any more. Everything else in the daemon says *what* runs *when* through three calls:

- `every(name, interval_s, work)`: a periodic job (the due-scan's safety tick, pruning,
  sampling, disk checks, the history flush, cron housekeeping). The first round comes one
  interval after start; rounds never overlap and never catch up in a burst (a late round runs
  once); a failed round is logged and the next one tries again.
- `at(name, when, work)`: a one-shot job at an instant (a cron fire; the cron service arms
  the next period when one fires). Arming a name again replaces its earlier time.

At `stop()` a call in flight of a job added with `finish_on_stop` (cron fires and sweeps, so a
run is not cut in two) may finish, bounded by `stop_timeout_s`; the others (sampling, pruning:
rounds that any later round redoes) are cancelled at once, so they never hold up a drain.
- `run_now(name)`: a wake-up, bringing a job's next round forward to now; woken while it
  runs, the job runs once more right after (a wake-up is never lost in a round that had
  already read the database). `run_by(name, when)`: its next round no later than `when`.

Jobs are coroutine functions run on the event loop, never in APScheduler's thread pool: a job
touches asyncio objects (events, pools) that are not thread-safe. Each call goes through one
wrapper (`_call`), which keeps rounds apart, logs failures and lets `cancel`/`stop` wait for the
calls in flight (bounded by `stop_timeout_s`, then cancelled: a cancelled cron trigger rolls
back and converges when fired again).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

from apscheduler.jobstores.base import JobLookupError
from apscheduler.schedulers.asyncio import AsyncIOScheduler

from dispatcher.runtime.lifecycle import Service

log = logging.getLogger("dispatcher")

Work = Callable[[], Awaitable[object]]


class TimingEngine(Service):
    """APScheduler (UTC) behind `every`/`at`/`run_now`. Invariants: at most one call per job
    name runs at a time; after `stop()` (or `cancel(name)`) returns, no call of the job(s)
    runs and none starts."""

    name = "timing"

    def __init__(self, *, stop_timeout_s: float = 10.0) -> None:
        self.stop_timeout_s = stop_timeout_s + 1.0  # the group's bound outlasts our own wait
        self._wait_s = stop_timeout_s
        self._scheduler = AsyncIOScheduler(timezone=UTC)
        self._running: dict[str, asyncio.Task[Any]] = {}
        self._cancelled: set[str] = set()
        self._calls: Counter[str] = Counter()
        self._finish_on_stop: set[str] = set()
        self._cut: set[asyncio.Task[Any]] = set()  # calls we cancel ourselves
        self._again: set[str] = set()  # woken while running: run once more
        self._stopped = False

    # what runs when --------------------------------------------------------------------------
    def every(
        self, name: str, interval_s: float, work: Work, *, finish_on_stop: bool = False
    ) -> None:
        """Run `work` every `interval_s` seconds, the first time one interval from now."""
        if not interval_s > 0:
            raise ValueError(f"{name}: interval_s must be > 0, not {interval_s!r}")
        self._add(name, work, finish_on_stop, trigger="interval", seconds=interval_s)

    def at(self, name: str, when: datetime, work: Work, *, finish_on_stop: bool = True) -> None:
        """Run `work` once at `when` (now if it has passed); replaces `name`'s earlier time."""
        self._add(name, work, finish_on_stop, trigger="date", run_date=when)

    def run_now(self, name: str) -> None:
        """Bring job `name`'s next round forward to now, or, while a round runs, have it run
        once more after it. Unknown names are ignored: the job may have just run out."""
        if name in self._running:
            self._again.add(name)
            return
        self.run_by(name, datetime.now(UTC))

    def run_by(self, name: str, when: datetime) -> None:
        """Job `name`'s next round no later than `when` (an earlier one stays)."""
        job = self._scheduler.get_job(name)
        due = getattr(job, "next_run_time", None)  # a job added before start has none yet
        if job is None or (due is not None and due <= when):
            return
        with contextlib.suppress(JobLookupError):
            self._scheduler.modify_job(name, next_run_time=when)

    def next_run(self, name: str) -> datetime | None:
        """When job `name` runs next (None: no such job)."""
        job = self._scheduler.get_job(name)
        when: datetime | None = getattr(job, "next_run_time", None)
        return when

    def calls(self, name: str) -> int:
        """How many calls of job `name` have ended (for tests and benchmarks)."""
        return self._calls[name]

    async def cancel(self, *names: str) -> None:
        """Remove these jobs and wait for their calls in flight (bounded; then cancelled)."""
        for name in names:
            self._cancelled.add(name)
            with contextlib.suppress(JobLookupError):
                self._scheduler.remove_job(name)
        await self._wait_for({n: t for n, t in self._running.items() if n in names})

    # the service contract --------------------------------------------------------------------
    async def start(self) -> None:
        self._stopping = self._stopped = False
        self._scheduler.start()

    async def stop(self) -> None:
        self._stopping = True
        if self._stopped:
            return
        self._stopped = True
        if not self._scheduler.running:
            return
        self._scheduler.remove_all_jobs()  # nothing new starts
        for name, task in self._running.items():
            if name not in self._finish_on_stop:
                self._cut_short(task)
        # wait first: APScheduler's shutdown cancels the calls it still runs at once
        await self._wait_for(dict(self._running))
        self._scheduler.shutdown(wait=False)
        await asyncio.sleep(0)  # AsyncIOScheduler shuts down in a loop callback; let it run

    # internals -------------------------------------------------------------------------------
    def _add(self, name: str, work: Work, finish_on_stop: bool, **trigger: Any) -> None:
        if self._stopped:
            return  # a job arming its successor while the engine stops: nothing more runs
        self._cancelled.discard(name)
        if finish_on_stop:
            self._finish_on_stop.add(name)
        else:
            self._finish_on_stop.discard(name)
        self._scheduler.add_job(
            self._call,
            args=[name, work],
            id=name,
            name=name,
            replace_existing=True,
            coalesce=True,  # rounds missed while the loop was busy run once, not in a burst
            max_instances=2,  # `_call` keeps rounds apart itself, without APScheduler's warning
            misfire_grace_time=None,  # a late round still runs (the job judges lateness)
            **trigger,
        )

    async def _call(self, name: str, work: Work) -> None:
        if name in self._running or name in self._cancelled:
            return  # the previous round still runs: this one would only repeat it
        task = asyncio.current_task()
        assert task is not None
        self._running[name] = task
        try:
            await work()
            while name in self._again and not self._stopping:
                self._again.discard(name)
                await work()
        except Exception as exc:  # periodic work is never urgent enough to stop the daemon
            log.warning("%s failed (it runs again at its next time): %s", name, exc)
        except asyncio.CancelledError:
            if task not in self._cut:
                raise
            # cut short by our own stop or cancel: the call ends here, quietly (raised on, it
            # would only reach APScheduler's wrapper, which logs it as a job error)
        finally:
            del self._running[name]
            self._again.discard(name)
            self._cut.discard(task)
            self._calls[name] += 1

    async def _wait_for(self, calls: dict[str, asyncio.Task[Any]]) -> None:
        if not calls:
            return
        _, pending = await asyncio.wait(calls.values(), timeout=self._wait_s)
        for name, task in calls.items():
            if task in pending:
                log.warning("%s still ran after %.0f s; cancelled", name, self._wait_s)
                self._cut_short(task)
        await asyncio.gather(*pending, return_exceptions=True)

    def _cut_short(self, task: asyncio.Task[Any]) -> None:
        self._cut.add(task)
        task.cancel()
