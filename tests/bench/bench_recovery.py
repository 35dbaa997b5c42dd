"""Crash recovery in seconds (invariant 11, docs/recovery.md): seed 000's shape, 4,000 jobs
running in one daemon under a 60 s lease when it is SIGKILLed. Measured: seconds from the kill
until none is left `running` under the dead owner, and until all 4,000 succeeded elsewhere;
once with another daemon already running, once with a successor started after the kill.

    .venv/bin/python -m tests.bench.bench_recovery [--jobs 4000]

The victim runs the handler `hold` as `tests.bench.handlers:hold` (sleeps 600 s); the rescuer
runs the same handler name as `noop`, so a rescued job completes at once.
"""

from __future__ import annotations

import argparse
import signal
import time

import asyncpg

from tests.bench.common import Bench, Figure, daemon, register_handler, run, wait_for

LEASE_S = 60


def env(function: str, jobs: int) -> dict[str, str]:
    return {
        "DISPATCHER_LEASE_S": str(LEASE_S),
        "DISPATCHER_QUEUES__DEFAULT__MAX_INFLIGHT": str(jobs),
        "DISPATCHER_HANDLERS__HOLD__KIND": "python",
        "DISPATCHER_HANDLERS__HOLD__FUNCTION": f"tests.bench.handlers:{function}",
        "DISPATCHER_HANDLERS__HOLD__TRANSACTIONAL": "false",
        "DISPATCHER_HANDLERS__HOLD__TIMEOUT_S": "900",
        "DISPATCHER_SCAN_INTERVAL_S": "1",
        "DISPATCHER_LOG_LEVEL": "warning",
    }


async def running_under(conn: asyncpg.Connection, pid: int) -> int:
    return int(
        await conn.fetchval(
            "SELECT count(*) FROM dispatcher.job_state WHERE state = 'running'"
            " AND lease_owner LIKE '%:' || $1 || ':%'",
            str(pid),
        )
    )


async def one_case(bench: Bench, jobs: int, successor: bool) -> None:
    case = "successor started after the kill" if successor else "another daemon running"
    async with bench.server.database() as dsn:
        await register_handler(dsn, "hold")
        conn = await asyncpg.connect(dsn)
        try:
            await conn.execute(
                """SELECT count(*) FROM dispatcher.enqueue_many(
                       (SELECT array_agg('seed-' || g) FROM generate_series(1, $1) g),
                       array_fill('hold'::text, ARRAY[$1]),
                       array_fill('{}'::jsonb, ARRAY[$1]))""",
                jobs,
            )
            async with daemon(dsn, env("hold", jobs)) as victim:
                assert victim.proc is not None
                pid = victim.proc.pid

                async def all_running() -> bool:
                    return await running_under(conn, pid) == jobs

                await wait_for(all_running, 120, what=f"{jobs} running in the victim")
                if not successor:
                    rescuer_cm = daemon(dsn, env("noop", jobs))
                    await rescuer_cm.__aenter__()
                victim.signal(signal.SIGKILL)
                killed = time.monotonic()
                await victim.wait()
                if successor:
                    rescuer_cm = daemon(dsn, env("noop", jobs))
                    await rescuer_cm.__aenter__()
                    ready = time.monotonic() - killed

                async def rescued() -> bool:
                    return await running_under(conn, pid) == 0

                async def done() -> bool:
                    n = await conn.fetchval(
                        "SELECT count(*) FROM dispatcher.jobs WHERE state = 'succeeded'"
                    )
                    return bool(n == jobs)

                rescued_s = await wait_for(rescued, 120, what="the rescue") - killed
                done_s = await wait_for(done, 120, what="all succeeded") - killed
                await rescuer_cm.__aexit__(None, None, None)
        finally:
            await conn.close()
    note = f"lease {LEASE_S} s"
    if successor:
        note += f"; successor ready {ready:.2f} s after the kill"
    bench.add(Figure(f"{case}: kill -> none running", rescued_s, "s", at_most=5, note=note))
    bench.add(Figure(f"{case}: kill -> all {jobs} succeeded", done_s, "s", note=note))


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=4000)
    args = parser.parse_args()
    bench = await Bench("bench_recovery").open()
    for successor in (False, True):
        await one_case(bench, args.jobs, successor)
    bench.finish("Crash recovery: a SIGKILLed daemon's running jobs")


if __name__ == "__main__":
    run(main)
