"""One-per-call intake with a daemon running and draining: W1's single-row half (16 clients,
`dispatcher.enqueue` one job per statement, due now) while the peer benchmark's dispatcher
worker (tests/bench/peers) runs and starts the jobs as they come. W1 itself runs without a
daemon; this is the figure a running system sees, where every notice an enqueue sends makes
its commit wait behind every other notifier's (docs/performance/index.md, "The wake gates").

Reports jobs/s of intake, the notices intake sent per job (a LISTENing connection counts them),
and how long after the last enqueue the daemon had started and finished every job. Each round
runs on a fresh database of the benchmark server (DATABASE_URL, or an embedded one).
`BENCH_PATCHES=nonotify` sends no notice at all (jobs then start by the work poll): the ceiling
of any way of sparing intake its notices.

    .venv/bin/python -m tests.bench.bench_intake_draining [--jobs 20000] [--rounds 1]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

import asyncpg

from tests.bench.common import Server, apply_sql_patches, wait_for_quiet
from tests.bench.peers.run import Dispatcher, wait_done, warm_up

CLIENTS = 16
QUIET_S = 8.0


async def round_once(server: Server, tmp: Path, jobs: int) -> dict[str, float]:
    system = Dispatcher(server, tmp)
    async with system.database() as dsn:
        await apply_sql_patches(dsn)  # BENCH_PATCHES=nonotify: no notice at all, the ceiling
        return await measure(system, dsn, jobs)


async def measure(system: Dispatcher, dsn: str, jobs: int) -> dict[str, float]:
    async with system.worker(dsn):
        await warm_up(system, dsn)
        listener = await asyncpg.connect(dsn)
        notices = 0

        def heard(*_args: object) -> None:
            nonlocal notices
            notices += 1

        await listener.add_listener("dispatcher_wake", heard)
        try:
            await wait_for_quiet(QUIET_S)
            one = await system.single(dsn, jobs, CLIENTS)
            ended = time.time()
            done = await wait_done(dsn, system, 120, jobs)
        finally:
            await listener.close()
    return {
        "jobs_per_s": one["n"] / one["elapsed_s"],
        "notices_per_job": notices / one["n"],
        "drained_after_s": done - ended,
    }


async def main(args: argparse.Namespace) -> None:
    server = await Server().open()
    tmp = Path(tempfile.mkdtemp(prefix="bench-draining-"))
    rounds: list[dict[str, float]] = []
    try:
        for n in range(args.rounds):
            got = await round_once(server, tmp, args.jobs)
            rounds.append(got)
            print(
                f"round {n + 1}: {got['jobs_per_s']:,.0f} jobs/s, "
                f"{got['notices_per_job']:.3f} notices per job, "
                f"drained {got['drained_after_s']:.2f} s after the last enqueue",
                flush=True,
            )
    finally:
        server.close()
    if len(rounds) > 1:
        rates = [r["jobs_per_s"] for r in rounds]
        print(
            f"median {statistics.median(rates):,.0f} jobs/s ({min(rates):,.0f}-{max(rates):,.0f})"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=20_000, help="enqueued one per statement")
    parser.add_argument("--rounds", type=int, default=1)
    asyncio.run(main(parser.parse_args()))
