"""Scale-out: drain N no-op jobs with 1, 2 and 3 daemons on one database, with the in-process
transport and with RabbitMQ (127.0.0.1:5672), in one run; the queue's limits lifted. Each rate
is measured on the database clock (first start to last finish); the machine's load average is
printed with every row, because the machine is shared.

    .venv/bin/python -m tests.bench.bench_scaleout [--jobs 20000] [--daemons 1,2,3]

Not yet here (issue 13 item 6): due-to-start p99 at 500/s and the 2,000 burst per daemon count.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import uuid

import asyncpg

from tests.bench.bench_engine import ENGINE_ENV, TERMINAL, enqueue_bulk
from tests.bench.common import Server, daemon, register_handler, run, wait_for

BROKER = "amqp://guest:guest@127.0.0.1:5672/"
TIMEOUT_S = 180.0  # one drain; a slower one is a failure, not a figure


async def drain(server: Server, jobs: int, daemons: int, transport: str) -> dict[str, float]:
    prefix = f"bench{uuid.uuid4().hex[:8]}."
    env = dict(ENGINE_ENV)
    if transport == "rabbitmq":
        env |= {
            "DISPATCHER_TRANSPORT": "rabbitmq",
            "DISPATCHER_RABBITMQ__URL": BROKER,
            "DISPATCHER_RABBITMQ__QUEUE_PREFIX": prefix,
        }
    async with server.database() as dsn:
        await register_handler(dsn, "noop")
        conn = await asyncpg.connect(dsn)

        async def all_finished() -> bool:  # the outbox empties early over RabbitMQ: count
            return int(await conn.fetchval(TERMINAL)) >= jobs

        try:
            async with contextlib.AsyncExitStack() as stack:
                for _ in range(daemons):  # up and idle before the jobs arrive
                    await stack.enter_async_context(daemon(dsn, env))
                await enqueue_bulk(conn, "drain", jobs)
                await conn.execute("NOTIFY dispatcher_wake")
                await wait_for(all_finished, TIMEOUT_S, interval_s=0.05, what=f"{jobs} jobs")
            span = await conn.fetchval(
                "SELECT extract(epoch FROM max(finished_at) - min(started_at))::float8"
                "  FROM dispatcher.jobs"
            )
            owners = await conn.fetchval(
                "SELECT count(DISTINCT owner) FROM dispatcher.attempts WHERE outcome = 'succeeded'"
            )
        finally:
            await conn.close()
    if transport == "rabbitmq":
        await delete_queue(prefix + "default")
    return {"rate": jobs / span, "span_s": span, "owners": owners}


async def delete_queue(name: str) -> None:
    import aio_pika

    connection = await aio_pika.connect(BROKER)
    async with connection:
        channel = await connection.channel()
        await channel.queue_delete(name)


async def main(args: argparse.Namespace) -> None:
    server = await Server().open()
    counts = [int(n) for n in args.daemons.split(",")]
    print(f"drain of {args.jobs:,} no-op jobs, limits lifted; {os.cpu_count()} cores (shared)")
    print(f"{'transport':<11} {'daemons':>7} {'jobs/s':>9} {'span s':>7} {'ran on':>6}  load")
    rates: dict[tuple[str, int], float] = {}
    try:
        for transport in ("in-process", "rabbitmq"):
            for n in counts:
                r = await drain(server, args.jobs, n, transport)
                rates[(transport, n)] = r["rate"]
                load = " ".join(f"{x:.1f}" for x in os.getloadavg())
                print(
                    f"{transport:<11} {n:>7} {r['rate']:>9,.0f} {r['span_s']:>7.2f} "
                    f"{int(r['owners']):>6}  {load}",
                    flush=True,
                )
    finally:
        server.close()
    top = max(counts)
    for transport in ("in-process", "rabbitmq"):
        if (transport, 1) in rates and (transport, top) in rates:
            ratio = rates[(transport, top)] / rates[(transport, 1)]
            print(f"{transport}: {top} daemons / 1 daemon = {ratio:.2f}x (goal >= 0.9x)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--daemons", default="1,2,3", help="daemon counts, comma-separated")
    run(lambda: main(parser.parse_args()))
