"""procrastinate side of the peer benchmark (`tests/bench/peers/run.py` drives it).

Runs with the interpreter of the throw-away venv the runner creates (procrastinate is no
dependency of dispatcher); imports only procrastinate and the standard library.

    python procrastinate_peer.py <command> '<json arguments>'

setup                      apply the schema
bulk    {n, run_at}        batch_defer_async in chunks of 10,000 (run_at: epoch seconds, optional)
single  {n, clients}       one defer_async per job from `clients` concurrent callers
paced   {rate, seconds}    one defer_async per job at a steady rate, argument t = enqueue time
work    {out, ...settings} the async worker until SIGTERM; then write every job's handler start
                           time and its argument `t` to `out` (JSON)
The enqueue commands print one JSON line: {n, elapsed_s}.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from datetime import UTC, datetime
from typing import Any

import procrastinate

STARTS: list[float] = []
REFS: list[float | None] = []


def make_app(dsn: str, pool_size: int) -> procrastinate.App:
    connector = procrastinate.PsycopgConnector(
        conninfo=dsn, min_size=min(pool_size, 4), max_size=pool_size
    )
    app = procrastinate.App(connector=connector)

    @app.task(name="noop")
    async def noop(t: float | None = None) -> None:
        STARTS.append(time.time())
        REFS.append(t)

    return app


async def setup(a: dict[str, Any]) -> dict[str, Any]:
    app = make_app(a["dsn"], 2)
    async with app.open_async():
        await app.schema_manager.apply_schema_async()
    return {}


async def bulk(a: dict[str, Any]) -> dict[str, Any]:
    app = make_app(a["dsn"], 2)
    task = app.tasks["noop"]
    run_at = a.get("run_at")
    deferrer = (
        task.configure(schedule_at=datetime.fromtimestamp(run_at, UTC))
        if run_at
        else task.configure()
    )
    async with app.open_async():
        t0 = time.time()
        for start in range(0, a["n"], 10_000):
            count = min(10_000, a["n"] - start)
            await deferrer.batch_defer_async(*({"t": run_at} for _ in range(count)))
        return {"n": a["n"], "elapsed_s": time.time() - t0, "finished_at": time.time()}


async def single(a: dict[str, Any]) -> dict[str, Any]:
    clients, n = a["clients"], a["n"]
    app = make_app(a["dsn"], clients)
    task = app.tasks["noop"]
    sent = 0

    async def caller() -> None:
        nonlocal sent
        while sent < n:
            sent += 1
            await task.defer_async(t=None)

    async with app.open_async():
        await task.defer_async(t=None)
        t0 = time.time()
        await asyncio.gather(*(caller() for _ in range(clients)))
        return {"n": sent, "elapsed_s": time.time() - t0}


async def paced(a: dict[str, Any]) -> dict[str, Any]:
    app = make_app(a["dsn"], 8)
    task = app.tasks["noop"]
    n = round(a["rate"] * a["seconds"])
    async with app.open_async():
        pending = []
        t0 = time.time()
        for i in range(n):
            wait = t0 + i / a["rate"] - time.time()
            if wait > 0.001:
                await asyncio.sleep(wait)
            pending.append(asyncio.create_task(task.defer_async(t=time.time())))
        await asyncio.gather(*pending)
        elapsed = time.time() - t0
        return {"n": n, "elapsed_s": elapsed, "rate": n / elapsed}


async def work(a: dict[str, Any]) -> None:
    app = make_app(a["dsn"], a["max_pool_size"])

    def dump_and_exit() -> None:
        with open(a["out"], "w") as f:
            json.dump({"starts": STARTS, "refs": REFS}, f)
        os._exit(0)

    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, dump_and_exit)
    async with app.open_async():
        print("READY", flush=True)
        await app.run_worker_async(
            concurrency=a["concurrency"],
            fetch_job_polling_interval=a["fetch_job_polling_interval_s"],
            install_signal_handlers=False,
        )


def main() -> None:
    import logging

    logging.basicConfig(level=logging.WARNING)  # no log line per job
    command, raw = sys.argv[1], (sys.argv[2] if len(sys.argv) > 2 else "{}")
    commands = {"setup": setup, "bulk": bulk, "single": single, "paced": paced, "work": work}
    result = asyncio.run(commands[command](json.loads(raw)))
    if result is not None:
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
