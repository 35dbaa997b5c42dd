"""What the key ledger and the per-job payload limit cost (issue 23, points 1 and 3), measured
in one process that alternates the two variants round by round on one database, so a machine's
drift hits both alike:

- the SQL door in bulk (`enqueue_many`, 10,000 jobs per statement, W1's bulk shape), with the
  ledger probe and the payload check (after) and with both replaced by no-ops (before), against
  a ledger already holding `--ledger-rows` keys;
- the pruner (`prune_terminal`, 1,000 jobs per statement) writing the ledger (after) or not
  (before: the statement as it was);
- the bytes a ledger row takes (table and indexes, per row);
- the HTTP door's payload measure per item (`oversize`, in the daemon's process).

The drain (claim, effect, completion) is not measured: none of its statements changed, the
ledger being written by the pruner.

    .venv/bin/python -m tests.bench.bench_key_ledger [--rounds 6]
"""

from __future__ import annotations

import argparse
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
# the variant "before": the ledger probe and the payload check answer without reading anything
NO_LEDGER = """
CREATE OR REPLACE FUNCTION dispatcher.take_back_pruned(ids bigint[], keys text[])
RETURNS TABLE (ord integer, id bigint, job_id bigint, state text, same boolean)
LANGUAGE sql AS $$ SELECT NULL::integer, NULL::bigint, NULL::bigint, NULL::text, NULL::boolean
                   WHERE false $$;
CREATE OR REPLACE FUNCTION dispatcher.payload_oversize(payload jsonb, target jsonb,
                                                        max_bytes bigint)
RETURNS bigint LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT NULL::bigint $$;
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


async def variant(conn: asyncpg.Connection, after: bool, originals: str) -> None:
    await conn.execute(originals if after else NO_LEDGER)


async def intake_round(conn: asyncpg.Connection, prefix: str) -> float:
    t0 = time.perf_counter()
    created = await conn.fetchval(SQL_BULK, prefix, BULK)
    assert created == BULK
    return BULK / (time.perf_counter() - t0)


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
        originals = "\n".join(
            [
                await conn.fetchval("SELECT pg_get_functiondef($1::regproc)", name) + ";"
                for name in ("dispatcher.take_back_pruned", "dispatcher.payload_oversize")
            ]
        )
        rates: dict[str, dict[bool, list[float]]] = {"intake": {}, "prune": {}}
        for r in range(args.rounds):
            for after in (r % 2 == 0, r % 2 != 0):  # alternate which goes first
                await variant(conn, after, originals)
                rates["intake"].setdefault(after, []).append(
                    await intake_round(conn, f"r{r}{int(after)}-")
                )
                await variant(conn, True, originals)
                rates["prune"].setdefault(after, []).append(await prune_round(conn, after))
        ledger = await conn.fetchrow(
            "SELECT count(*) AS n, pg_total_relation_size('dispatcher.key_ledger') AS bytes"
            " FROM dispatcher.key_ledger"
        )
        await conn.close()
    for what, label in (("intake", "SQL enqueue_many x10,000"), ("prune", "prune_terminal")):
        before = statistics.median(rates[what][False])
        after_ = statistics.median(rates[what][True])
        bench.add(
            Figure(
                f"{label}: ledger and limit (after) / without (before)",
                after_ / before,
                "ratio",
                note=f"median jobs/s after {after_:,.0f}, before {before:,.0f}; "
                f"{args.rounds} alternating rounds; ledger {args.ledger_rows:,} rows",
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
    run(lambda: main(parser.parse_args()))
