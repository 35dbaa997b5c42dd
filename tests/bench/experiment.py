"""`dispatcher` with candidate performance fixes applied by monkeypatching, so a benchmark can
quantify a fix before anyone changes the product. Not product code; never used by tests.

    BENCH_PATCHES=noreset,customplans python -m tests.bench.experiment run

Patches (comma-separated in BENCH_PATCHES):
  count        count calls and wall time of every JobRepository method; printed to stderr as
               one JSON line `bench-counts {...}` at exit
  noreset      asyncpg pool without the per-release reset round trip
               (`SELECT pg_advisory_unlock_all(); CLOSE ALL; UNLISTEN *; RESET ALL`)
  customplans  `plan_cache_mode = force_custom_plan` on every pool connection
  nextdue      `seconds_to_next_due` answers NULL (not 0) when nothing is scheduled, so the
               due-scan waits its interval instead of spinning
  quietwake    intake wakes the workers and the due-scan only when an accepted job is due
               within a second (the due-scan's interval tick finds later ones anyway)
  batchintake  single-job accepts (POST /v1/jobs) share one enqueue_many call: a writer task
               takes every accept queued so far (like the Completer), so concurrent requests
               cost one statement and one commit per batch
  nonotify     (SQL, applied to the benchmark database by tests.bench.common) dispatcher.wake
               sends nothing, even while a daemon listens: the ceiling of coalescing wake-ups
  fastkey      (SQL, likewise) the key check without the `{1,255}` regex
  enqcustom    (SQL, likewise) enqueue_many with plan_cache_mode = force_custom_plan
  stages       where a due-now job's start latency goes: per job, the wake-up heard (NOTIFY or
               intake), the claim sent and answered, the handler entered (the peer benchmark's
               `record` handler); medians and p95 of each stage printed to stderr at exit as
               `bench-stages {...}` (ms, from the job's due time)
  twoloops     two claim loops per queue (claims overlap the daemon's work on the last batch)
  tworelays    a second relay loop in each daemon (two leases in flight at once)
  timeline     every claim, due-scan round and completion write with its wall-clock start, end
               and rows, and every handler entry, written at exit as JSON to the file named by
               `BENCH_TIMELINE_FILE` (where a burst's time goes, call by call)
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import sys
import time
from collections import defaultdict
from typing import Any


def patch_count() -> None:
    from dispatcher.db.jobs import JobRepository

    counts: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for name, fn in list(vars(JobRepository).items()):
        if name.startswith("_") or not callable(fn) or name == "transaction":
            continue

        def wrap(fn: Any = fn, name: str = name) -> Any:
            @functools.wraps(fn)
            async def counted(*args: Any, **kwargs: Any) -> Any:
                t0 = time.perf_counter()
                try:
                    return await fn(*args, **kwargs)
                finally:
                    entry = counts[name]
                    entry[0] += 1
                    entry[1] += time.perf_counter() - t0

            return counted

        setattr(JobRepository, name, wrap())
    atexit.register(lambda: print("bench-counts " + json.dumps(counts), file=sys.stderr))


def patch_pool(*, no_reset: bool, custom_plans: bool) -> None:
    import asyncpg

    from dispatcher.db import pool as pool_module

    original = asyncpg.create_pool

    async def no_reset_fn(conn: Any) -> None:
        return None

    def create_pool(*args: Any, **kwargs: Any) -> Any:
        if no_reset:
            kwargs["reset"] = no_reset_fn
        if custom_plans:
            kwargs["server_settings"] = {
                **kwargs.get("server_settings", {}),
                "plan_cache_mode": "force_custom_plan",
            }
        return original(*args, **kwargs)

    pool_module.asyncpg.create_pool = create_pool  # type: ignore[attr-defined]


def patch_next_due() -> None:
    from dispatcher.db.jobs import JobRepository

    sql = (
        "SELECT extract(epoch FROM min(due_at) - now())::float8 "
        "FROM dispatcher.jobs WHERE state = 'scheduled'"
    )

    async def seconds_to_next_due(self: JobRepository) -> float | None:
        value = await self.pool.fetchval(sql)
        return None if value is None else max(0.0, value)

    JobRepository.seconds_to_next_due = seconds_to_next_due  # type: ignore[method-assign]


def patch_quiet_wake() -> None:
    from datetime import UTC, datetime, timedelta

    from dispatcher.intake.accept import Intake

    original_init, original_accept = Intake.__init__, Intake.accept

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        self._bench_wake = self._on_accepted
        self._on_accepted = lambda: None

    async def accept(self: Any, items: Any) -> Any:
        results = await original_accept(self, items)
        soon = datetime.now(UTC) + timedelta(seconds=1)
        if any(
            getattr(r, "outcome", None) == "created" and (r.state == "ready" or r.due_at < soon)
            for r in results
        ):
            self._bench_wake()
        return results

    Intake.__init__ = init  # type: ignore[method-assign]
    Intake.accept = accept  # type: ignore[method-assign]
    Intake.notify_accepted = lambda self: self._bench_wake()  # type: ignore[method-assign]


def patch_batch_intake() -> None:
    import asyncio

    from dispatcher.intake.accept import Intake

    original_accept = Intake.accept
    max_batch = 1000

    async def writer(self: Any) -> None:
        while True:
            await self._bench_wake.wait()
            self._bench_wake.clear()
            while self._bench_pending:
                batch = self._bench_pending[:max_batch]
                del self._bench_pending[:max_batch]
                try:
                    results = await original_accept(self, [item for item, _ in batch])
                except Exception as exc:  # every request of the batch answers 500 (retriable)
                    for _, future in batch:
                        if not future.done():
                            future.set_exception(exc)
                    continue
                for (_, future), result in zip(batch, results, strict=True):
                    if not future.done():
                        future.set_result(result)

    async def accept(self: Any, items: Any) -> Any:
        if len(items) != 1:
            return await original_accept(self, items)
        if not hasattr(self, "_bench_pending"):
            self._bench_pending = []
            self._bench_wake = asyncio.Event()
            self._bench_writer = asyncio.create_task(writer(self))
        future = asyncio.get_running_loop().create_future()
        self._bench_pending.append((items[0], future))
        self._bench_wake.set()
        return [await future]

    Intake.accept = accept  # type: ignore[method-assign]


def patch_stages() -> None:
    from dispatcher.db.claims import ClaimConnections
    from dispatcher.engine.work_poll import Wakeups
    from tests.bench.peers import handlers

    wakes: list[float] = []
    claims: dict[int, tuple[float, float]] = {}
    rows: list[tuple[float, float, float, float, float]] = []
    woken, claim = Wakeups.__call__, ClaimConnections.claim

    def heard(self: Any, reason: str = "") -> None:
        wakes.append(time.time())
        woken(self, reason)

    async def timed(self: Any, *args: Any, **kwargs: Any) -> Any:
        sent = time.time()
        done = await claim(self, *args, **kwargs)
        back = time.time()
        for job in done.jobs:
            claims[job.id] = (sent, back)
        return done

    record = handlers.record

    async def recorded(job: Any, ctx: Any) -> None:
        await record(job, ctx)
        due, entered = job.due_at.timestamp(), handlers.STARTS[-1]
        sent, back = claims.pop(job.id, (float("nan"), float("nan")))
        wake = next((w for w in reversed(wakes[-50:]) if due <= w <= sent), float("nan"))
        rows.append((due, wake, sent, back, entered))

    def report() -> None:
        import statistics

        stages = {"wake": 1, "claim_sent": 2, "claim_back": 3, "handler": 4}
        out = {}
        for name, i in stages.items():
            ms = sorted((r[i] - r[0]) * 1000 for r in rows[20:] if r[i] == r[i])
            if ms:
                out[name] = [round(statistics.median(ms), 2), round(ms[int(len(ms) * 0.95)], 2)]
        out["jobs"] = [len(rows)]
        print("bench-stages " + json.dumps(out), file=sys.stderr)

    Wakeups.__call__ = heard  # type: ignore[method-assign]
    ClaimConnections.claim = timed  # type: ignore[method-assign]
    handlers.record = recorded
    atexit.register(report)


def patch_two_loops() -> None:
    from dispatcher.engine.queue_worker import QueueWorker

    started = QueueWorker.start

    async def start(self: Any) -> None:
        await started(self)
        self.spawn(self._claim_loop())

    QueueWorker.start = start  # type: ignore[method-assign]


def patch_timeline() -> None:
    from dispatcher.db.claims import ClaimConnections
    from dispatcher.db.jobs import JobRepository
    from dispatcher.db.relay import RelayRepository
    from dispatcher.engine.completer import Completer
    from dispatcher.relay.rabbitmq.link import RabbitLink
    from dispatcher.relay.rabbitmq.outbox import OutboxRelay
    from tests.bench.peers import handlers

    calls: list[tuple[str, float, float, int]] = []

    def timed(cls: Any, name: str, rows: Any) -> None:
        fn = getattr(cls, name)

        @functools.wraps(fn)
        async def wrapper(*args: Any, **kwargs: Any) -> Any:
            began = time.time()
            result = await fn(*args, **kwargs)
            calls.append((name, began, time.time(), rows(args, result)))
            return result

        setattr(cls, name, wrapper)

    timed(ClaimConnections, "claim", lambda _a, r: len(r.jobs))
    timed(JobRepository, "scan_due", lambda _a, r: r.moved)
    timed(Completer, "_write", lambda a, _r: len(a[1].jobs))
    # over RabbitMQ: the relay's rounds (lease, confirms awaited), the claims of
    # deliveries, and each message's arrival (its jobs)
    timed(RelayRepository, "lease_outbox", lambda _a, r: len(r))
    timed(OutboxRelay, "_confirmed", lambda a, _r: sum(len(b) for b in a[1]))
    timed(ClaimConnections, "claim_delivered", lambda _a, r: len(r.jobs))
    receiver = RabbitLink._receiver

    def arrivals(self: Any, queue: str, acks: Any) -> Any:
        on_message = receiver(self, queue, acks)

        async def timed_message(message: Any) -> None:
            began = time.time()
            await on_message(message)
            calls.append(("delivery", began, time.time(), len(message.body) // 12 or 1))

        return timed_message

    RabbitLink._receiver = arrivals  # type: ignore[method-assign]

    def report() -> None:
        path = os.environ.get("BENCH_TIMELINE_FILE")
        if path:
            with open(path, "w") as f:
                json.dump({"calls": calls, "starts": handlers.STARTS}, f)

    atexit.register(report)


def patch_two_relays() -> None:
    """A second relay loop beside the first in each daemon: two leases in flight at once."""
    from dispatcher.relay.rabbitmq.broker import Broker
    from dispatcher.relay.rabbitmq.outbox import OutboxRelay

    original = Broker.__init__

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        first = self.relay
        second = OutboxRelay(
            first._repo,
            self.link,
            owner=first._owner,
            batch=first._batch,
            confirm_timeout_s=first._confirm_timeout_s,
            publish_ahead=first._publish_ahead,
            republish_after_s=first._republish_after_s,
        )
        second.name = "outbox-relay-2"
        wake = first.wake

        def both() -> None:
            wake()
            second.wake()

        first.wake = both  # type: ignore[method-assign]
        self._second_relay = second

    Broker.__init__ = init  # type: ignore[method-assign]
    Broker.services = property(  # type: ignore[method-assign,assignment]
        lambda self: [self.link, self.relay, self._second_relay]
    )


def main() -> int:
    patches = {p for p in os.environ.get("BENCH_PATCHES", "").split(",") if p}
    # nonotify and fastkey patch the SQL door in the benchmark database (tests.bench.common)
    known = {
        "count",
        "noreset",
        "customplans",
        "nextdue",
        "quietwake",
        "batchintake",
        "nonotify",
        "fastkey",
        "enqcustom",
        "stages",
        "timeline",
        "twoloops",
        "tworelays",
    }
    unknown = patches - known
    if unknown:
        raise SystemExit(f"unknown BENCH_PATCHES: {sorted(unknown)}")
    if "nextdue" in patches:
        patch_next_due()
    if "quietwake" in patches:
        patch_quiet_wake()
    if "batchintake" in patches:  # after quietwake: the batch goes through its accept
        patch_batch_intake()
    if "count" in patches:
        patch_count()
    if "stages" in patches:
        patch_stages()
    if "timeline" in patches:
        patch_timeline()
    if "twoloops" in patches:
        patch_two_loops()
    if "tworelays" in patches:
        patch_two_relays()
    if patches & {"noreset", "customplans"}:
        patch_pool(no_reset="noreset" in patches, custom_plans="customplans" in patches)
    from dispatcher.cli import main as cli_main

    return cli_main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
