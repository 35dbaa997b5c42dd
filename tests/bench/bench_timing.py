"""The timing engine (dispatcher.runtime.timing): what a wake-up through it costs beside the
due-scan's
own event, what it costs idle with 1,000 armed schedules, and what 1,000 fires at one instant
cost (each one arming its next period, as the cron service does).

No database: the engine alone, in this process, on the loop the daemon uses (uvloop).

  (a) wake-up latency, 2,000 each, one at a time: `asyncio.Event.set()` -> the waiting loop
      runs (the due-scan's wake-up today) against `TimingEngine.run_now(job)` -> the job runs
  (b) idle: the daemon's six periodic jobs plus 1,000 schedules armed an hour ahead; process
      CPU over 10 s, against an idle loop with no engine
  (c) 1,000 schedules due at one instant: time from the instant to the last call, and CPU per
      fire (the call plus arming the next period)

    .venv/bin/python -m tests.bench.bench_timing
"""

from __future__ import annotations

import asyncio
import statistics
import time
from datetime import UTC, datetime, timedelta

from dispatcher.runtime.timing import TimingEngine
from tests.bench.common import environment_only, run

WAKES = 2000
SCHEDULES = 1000
IDLE_S = 10.0


def quantiles_us(samples: list[float]) -> str:
    cuts = statistics.quantiles(samples, n=100)
    return (
        f"p50 {cuts[49] * 1e6:.0f} us, p99 {cuts[98] * 1e6:.0f} us, max {max(samples) * 1e6:.0f} us"
    )


async def event_wakes() -> list[float]:
    event, woke = asyncio.Event(), asyncio.Event()
    latencies: list[float] = []
    sent = [0.0]

    async def waiter() -> None:
        while True:
            await event.wait()
            event.clear()
            latencies.append(time.perf_counter() - sent[0])
            woke.set()

    task = asyncio.create_task(waiter())
    for _ in range(WAKES):
        woke.clear()
        sent[0] = time.perf_counter()
        event.set()
        await woke.wait()
    task.cancel()
    return latencies


async def engine_wakes() -> list[float]:
    engine, woke = TimingEngine(), asyncio.Event()
    latencies: list[float] = []
    sent = [0.0]

    async def job() -> None:
        latencies.append(time.perf_counter() - sent[0])
        woke.set()

    engine.every("due-scan", 3600, job)
    await engine.start()
    for _ in range(WAKES):
        woke.clear()
        sent[0] = time.perf_counter()
        engine.run_now("due-scan")
        await woke.wait()
        await asyncio.sleep(0)  # let the call's wrapper end before the next wake-up
    await engine.stop()
    return latencies


async def nothing() -> None:
    return None


async def idle_cpu(with_engine: bool) -> float:
    engine = TimingEngine()
    if with_engine:
        for name, interval_s in (
            ("due-scan", 1.0),
            ("metrics-sampler", 5.0),
            ("pruner", 60.0),
            ("disk-space", 1.0),
            ("history", 5.0),
            ("cron-housekeeping", 30.0),
        ):
            engine.every(name, interval_s, nothing)
        later = datetime.now(UTC) + timedelta(hours=1)
        for i in range(SCHEDULES):
            engine.at(f"cron:s{i}", later + timedelta(seconds=i), nothing)
        await engine.start()
    start = time.process_time()
    await asyncio.sleep(IDLE_S)
    used = time.process_time() - start
    if with_engine:
        await engine.stop()
    return used / IDLE_S * 100


async def one_instant() -> tuple[float, float]:
    engine = TimingEngine()
    at = datetime.now(UTC) + timedelta(seconds=1)
    done: list[float] = []
    all_fired = asyncio.Event()

    def fire(name: str) -> object:
        async def call() -> None:
            done.append(time.perf_counter())
            if len(done) == SCHEDULES:
                all_fired.set()
            engine.at(name, at + timedelta(minutes=1), fire(name))  # the next period

        return call

    for i in range(SCHEDULES):
        engine.at(f"cron:s{i}", at, fire(f"cron:s{i}"))  # type: ignore[arg-type]
    await engine.start()
    cpu = time.process_time()
    instant = time.perf_counter() + (at - datetime.now(UTC)).total_seconds()
    await asyncio.wait_for(all_fired.wait(), 60)
    cpu = time.process_time() - cpu
    await engine.stop()
    return max(done) - instant, cpu / SCHEDULES


async def main() -> None:
    print("(a) wake-up latency, one at a time")
    print(f"  asyncio.Event (the due-scan's own): {quantiles_us(await event_wakes())}")
    print(f"  TimingEngine.run_now:               {quantiles_us(await engine_wakes())}")
    print(f"(b) idle CPU over {IDLE_S:.0f} s, % of one core")
    print(f"  loop alone:                          {await idle_cpu(False):.3f} %")
    print(f"  engine, 6 periodic + {SCHEDULES} armed:      {await idle_cpu(True):.3f} %")
    last, per_fire = await one_instant()
    print(f"(c) {SCHEDULES} schedules due at one instant")
    print(f"  last call {last * 1000:.1f} ms after it; CPU {per_fire * 1e6:.0f} us per fire")


if __name__ == "__main__":
    environment_only(__doc__)
    run(main)
