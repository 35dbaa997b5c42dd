"""What the key ledger and the per-job payload limit cost (issue 23, points 1 and 3), measured
in one process that alternates the two variants round by round on one database, so a machine's
drift hits both alike. "After" is the release: a ledger already holding `--ledger-rows` keys
that every created job's key is probed against, and the payload check. "Before" swaps in an
empty ledger (the same statements, nothing to find: the probe of one empty index page is what
is left) and a payload check that reads nothing.

- the SQL door in bulk (`enqueue_many`, 10,000 jobs per statement, W1's bulk shape);
- the SQL door one per call (`dispatcher.enqueue`, one job per statement and transaction, from
  16 connections at once: W1's one-per-call shape);
- the pruner (`prune_terminal`, 1,000 jobs per statement) writing the ledger (after) or not
  (before: the statement as it was);
- the bytes a ledger row takes (table and indexes, per row);
- the HTTP door's payload measure per item (`oversize`, in the daemon's process).

The drain (claim, effect, completion) is not measured: none of its statements changed, the
ledger being written by the pruner.

    .venv/bin/python -m tests.bench.bench_key_ledger [--rounds 6] [--without ledger|check|both]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

import asyncpg

from dispatcher.core.payload_size import oversize
from dispatcher.db.queries import query
from tests.bench.common import Bench, Figure, run

BULK = 10_000
SQL_BULK = """
SELECT count(*) FILTER (WHERE outcome = 'created')
  FROM dispatcher.enqueue_many(
       (SELECT array_agg($1 || g) FROM generate_series(1, $2) g),
       array_fill('http'::text, ARRAY[$2]),
       (SELECT array_agg(jsonb_build_object('n', g)) FROM generate_series(1, $2) g),
       array_fill(now() + interval '1 day', ARRAY[$2]), NULL, NULL,
       array_fill('{"url": "https://hooks.example.com/a"}'::jsonb, ARRAY[$2]))
"""
ONE = """
SELECT dispatcher.enqueue(key => $1, handler => 'http', payload => '{"n": 1}'::jsonb,
       due_at => now() + interval '1 day', target => '{"url": "https://hooks.example.com/a"}')
"""
CLIENTS, ONE_PER_CLIENT = 16, 250
# the variant "before": a payload check that answers without reading anything
NO_PAYLOAD_CHECK = """
CREATE OR REPLACE FUNCTION dispatcher.payload_oversize(payload jsonb, target jsonb,
                                                        max_bytes bigint)
RETURNS bigint LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT NULL::bigint $$;
"""
# ... and an empty ledger in the full one's place (the functions find the table by name; the
# renames invalidate their cached plans)
SWAP_LEDGERS = """
ALTER TABLE dispatcher.key_ledger RENAME TO key_ledger_swap;
ALTER TABLE dispatcher.key_ledger_other RENAME TO key_ledger;
ALTER TABLE dispatcher.key_ledger_swap RENAME TO key_ledger_other;
"""
PRUNE_BEFORE = """
WITH doomed AS (
    SELECT id FROM dispatcher.job_state
     WHERE state = $1 AND finished_at < now() - make_interval(secs => $2)
     ORDER BY finished_at LIMIT $3 FOR UPDATE SKIP LOCKED
), pruned AS (
    DELETE FROM dispatcher.job_state s WHERE s.id = ANY (ARRAY(SELECT id FROM doomed))
    RETURNING s.id
), intents AS (
    DELETE FROM dispatcher.intents i WHERE i.id = ANY (ARRAY(SELECT id FROM pruned))
), history AS (
    DELETE FROM dispatcher.attempts a WHERE a.job_id = ANY (ARRAY(SELECT id FROM pruned))
)
SELECT count(*)::int FROM pruned
"""


class Variants:
    """Switches the database between the release (after) and the variant without the ledger and
    the payload check (before)."""

    def __init__(self, conn: asyncpg.Connection, original_check: str, without: str):
        self.conn = conn
        self.original_check = original_check
        self.without = without  # what "before" leaves out: ledger, check or both
        self.after = True

    async def use(self, after: bool) -> None:
        if after == self.after:
            return
        if self.without in ("check", "both"):
            await self.conn.execute(self.original_check if after else NO_PAYLOAD_CHECK)
        if self.without in ("ledger", "both"):
            await self.conn.execute(SWAP_LEDGERS)
        self.after = after


async def intake_round(conn: asyncpg.Connection, prefix: str) -> float:
    t0 = time.perf_counter()
    created = await conn.fetchval(SQL_BULK, prefix, BULK)
    assert created == BULK
    return BULK / (time.perf_counter() - t0)


async def one_per_call_round(pool: asyncpg.Pool, prefix: str) -> float:
    async def client(c: int) -> None:
        async with pool.acquire() as conn:
            for n in range(ONE_PER_CLIENT):
                await conn.fetchval(ONE, f"{prefix}{c}-{n}")

    t0 = time.perf_counter()
    await asyncio.gather(*(client(c) for c in range(CLIENTS)))
    return CLIENTS * ONE_PER_CLIENT / (time.perf_counter() - t0)


async def prune_round(conn: asyncpg.Connection, after: bool) -> float:
    await conn.execute(
        "UPDATE dispatcher.job_state SET state = 'succeeded', finished_at = now() - interval"
        " '8 days' WHERE id IN (SELECT id FROM dispatcher.job_state WHERE state = 'scheduled'"
        " LIMIT $1)",
        BULK,
    )
    sql = query("prune_terminal") if after else PRUNE_BEFORE
    t0 = time.perf_counter()
    pruned = 0
    while pruned < BULK:
        pruned += await conn.fetchval(sql, "succeeded", 7 * 86400, 1000)
    return BULK / (time.perf_counter() - t0)


async def main(args: argparse.Namespace) -> None:
    bench = await Bench("bench_key_ledger").open()
    async with bench.server.database() as dsn:
        conn = await asyncpg.connect(dsn)
        await conn.execute(
            "INSERT INTO dispatcher.handlers (name, kind, current_version) VALUES"
            " ('http', 'http', 1) ON CONFLICT DO NOTHING"
        )
        await conn.execute(
            """INSERT INTO dispatcher.key_ledger (key, request_hash, job_id, state, finished_at)
               SELECT 'ledger-' || md5(g::text), 'v2:' || md5(g::text) || md5(g::text), g,
                      'succeeded', now() - interval '10 days'
                 FROM generate_series(1, $1) g""",
            args.ledger_rows,
        )
        await conn.execute("ANALYZE dispatcher.key_ledger")
        await conn.execute(
            "CREATE TABLE dispatcher.key_ledger_other (LIKE dispatcher.key_ledger INCLUDING ALL)"
        )
        check = await conn.fetchval(
            "SELECT pg_get_functiondef('dispatcher.payload_oversize'::regproc)"
        )
        variants = Variants(conn, check + ";", args.without)
        pool = await asyncpg.create_pool(dsn, min_size=CLIENTS, max_size=CLIENTS)
        shapes = ("intake", "one", "prune")
        rates: dict[str, dict[bool, list[float]]] = {shape: {} for shape in shapes}
        for r in range(args.rounds):
            for after in (r % 2 == 0, r % 2 != 0):  # alternate which goes first
                await variants.use(after)
                await pool.expire_connections()  # plans made for the other variant go
                rates["intake"].setdefault(after, []).append(
                    await intake_round(conn, f"r{r}{int(after)}-")
                )
                rates["one"].setdefault(after, []).append(
                    await one_per_call_round(pool, f"o{r}{int(after)}-")
                )
                await variants.use(True)
                rates["prune"].setdefault(after, []).append(await prune_round(conn, after))
        await pool.close()
        ledger = await conn.fetchrow(
            "SELECT count(*) AS n, pg_total_relation_size('dispatcher.key_ledger') AS bytes"
            " FROM dispatcher.key_ledger"
        )
        await conn.close()
    labels = {
        "intake": "SQL enqueue_many x10,000",
        "one": f"SQL enqueue one per call, {CLIENTS} clients",
        "prune": "prune_terminal",
    }
    for what, label in labels.items():
        before = statistics.median(rates[what][False])
        after_ = statistics.median(rates[what][True])
        bench.add(
            Figure(
                f"{label}: ledger and limit (after) / without (before)",
                after_ / before,
                "ratio",
                note=f"median jobs/s after {after_:,.0f}, before {before:,.0f}; "
                f"{args.rounds} alternating rounds; ledger {args.ledger_rows:,} rows; before "
                f"without {args.without}; rounds "
                f"after {[round(x) for x in rates[what][True]]}, "
                f"before {[round(x) for x in rates[what][False]]}",
            )
        )
    bench.add(
        Figure(
            "key ledger bytes per key (table + indexes)",
            ledger["bytes"] / ledger["n"],
            "bytes",
            note=f"{ledger['n']:,} rows (keys of ~40 characters)",
        )
    )
    bench.add(Figure("HTTP door: payload measure per item", http_measure_us(), "us"))
    bench.finish("key ledger and payload limit (issue 23)")


def http_measure_us() -> float:
    """`oversize` of a W1-like item (small payload, normalized http target), µs per item."""
    payload: dict[str, Any] = {"n": 12345, "user": "u-42", "event": "signup"}
    target = {"url": "https://hooks.example.com/a", "method": "POST", "headers": {}}
    n = 100_000
    t0 = time.perf_counter()
    for _ in range(n):
        oversize(payload, target, 256 * 1024)
    return (time.perf_counter() - t0) / n * 1e6


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--ledger-rows", type=int, default=1_000_000)
    parser.add_argument(
        "--without",
        choices=("both", "ledger", "check"),
        default="both",
        help='what "before" leaves out: the ledger (an empty one), the payload check, or both',
    )
    run(lambda: main(parser.parse_args()))
