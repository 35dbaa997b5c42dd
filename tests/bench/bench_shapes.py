"""Table shapes: the WAL a job's life writes (intake, claim, completion) in four shapes of table,
so a redesign of the job tables can be priced before it is built.

  split      today's: an intent row (primary key, the key's unique index, the handler's index)
             and a state row (primary key, the claim, running, terminal and at-rest indexes)
  one_row    the same columns and indexes in one table
  graphile   graphile-worker's shape: one row, its claim index on available jobs, no key; the
             completion deletes the row (it keeps no outcome)
  kept       graphile-worker's shape keeping what the dispatcher must: every job has a key (its
             unique index) and the completion writes the outcome on the row instead of deleting
             it (no other index: the least a design that keeps key and outcome could write)

Each shape gets 20,000 finished jobs first (a table with history), then, round by round,
batches of 1,000: an intake, a claim (walk, lock, update, the job's payload returned) and a
completion, each under `EXPLAIN (ANALYZE, WAL)`. WAL records and bytes are exact counts, the
same whatever else the machine does; the execution times are only an order. The statements are
the shapes' essentials, not the dispatcher's functions: `bench_instructions` prices those.

    .venv/bin/python -m tests.bench.bench_shapes [--rounds 7]
"""

from __future__ import annotations

import argparse
import json
import statistics

import asyncpg

from tests.bench.common import Bench, Figure, run

BATCH = 1_000
HISTORY = 20_000

# what an intent holds and how it is found (its key, its handler), and what the state row
# holds and how it is found (the claim, the running jobs, the ended ones, those at rest)
INTENT_COLUMNS = """
    key text NOT NULL, queue text NOT NULL, tenant text NOT NULL DEFAULT '',
    handler text NOT NULL, payload jsonb, target jsonb, max_attempts int, size_bytes bigint"""
STATE_COLUMNS = """
    capability text NOT NULL, state text NOT NULL, due_at timestamptz NOT NULL,
    attempt int NOT NULL DEFAULT 0, priority smallint NOT NULL DEFAULT 0, lease_owner text,
    lease_expires_at timestamptz, started_at timestamptz, finished_at timestamptz, result jsonb"""
INTENT_INDEXES = """
CREATE UNIQUE INDEX ON {table} (key text_pattern_ops) INCLUDE (id);
CREATE INDEX ON {table} (handler COLLATE "C", id);"""
STATE_INDEXES = """
CREATE INDEX ON {table} (queue, priority, tenant, due_at, id) WHERE state = 'ready';
CREATE INDEX ON {table} (queue, lease_expires_at) WHERE state = 'running';
CREATE INDEX ON {table} (state, queue, finished_at)
    WHERE state IN ('succeeded', 'dead', 'cancelled');
CREATE INDEX ON {table} (due_at, id) WHERE state NOT IN ('ready', 'running');"""

SCHEMA = f"""
CREATE SCHEMA split;
CREATE TABLE split.intents (id bigint PRIMARY KEY, {INTENT_COLUMNS});
{INTENT_INDEXES.format(table="split.intents")}
CREATE TABLE split.jobs (
    id bigint PRIMARY KEY, queue text NOT NULL, tenant text NOT NULL DEFAULT '', {STATE_COLUMNS});
{STATE_INDEXES.format(table="split.jobs")}

CREATE SCHEMA one_row;
CREATE TABLE one_row.jobs (id bigint PRIMARY KEY, {INTENT_COLUMNS}, {STATE_COLUMNS});
{INTENT_INDEXES.format(table="one_row.jobs")}
{STATE_INDEXES.format(table="one_row.jobs")}

CREATE SCHEMA graphile;
CREATE TABLE graphile.jobs (
    id bigint PRIMARY KEY, key text, queue text NOT NULL, handler text NOT NULL, payload jsonb,
    priority smallint NOT NULL DEFAULT 0, run_at timestamptz NOT NULL,
    attempts int NOT NULL DEFAULT 0, max_attempts int, locked_at timestamptz, locked_by text,
    is_available boolean GENERATED ALWAYS AS (locked_at IS NULL) STORED);
CREATE UNIQUE INDEX ON graphile.jobs (key) WHERE key IS NOT NULL;
CREATE INDEX ON graphile.jobs (priority, run_at, id) WHERE is_available;

CREATE SCHEMA kept;
CREATE TABLE kept.jobs (
    id bigint PRIMARY KEY, key text NOT NULL, queue text NOT NULL, handler text NOT NULL,
    payload jsonb, priority smallint NOT NULL DEFAULT 0, run_at timestamptz NOT NULL,
    attempts int NOT NULL DEFAULT 0, max_attempts int, locked_at timestamptz, locked_by text,
    finished_at timestamptz, result jsonb,
    is_available boolean GENERATED ALWAYS AS (locked_at IS NULL AND finished_at IS NULL) STORED);
CREATE UNIQUE INDEX ON kept.jobs (key);
CREATE INDEX ON kept.jobs (priority, run_at, id) WHERE is_available;
"""

# $1, $2: the first and last id of the batch
INTAKE = {
    "split": """
        WITH i AS (
            INSERT INTO split.intents (id, key, queue, handler, payload, max_attempts, size_bytes)
            SELECT g, 'k-' || g, 'default', 'noop', '{}', 25, 2
              FROM generate_series($1::bigint, $2::bigint) g
            RETURNING id)
        INSERT INTO split.jobs (id, queue, capability, state, due_at)
        SELECT id, 'default', 'noop:1', 'ready', now() FROM i""",
    "one_row": """
        INSERT INTO one_row.jobs (id, key, queue, handler, payload, max_attempts, size_bytes,
                                  capability, state, due_at)
        SELECT g, 'k-' || g, 'default', 'noop', '{}', 25, 2, 'noop:1', 'ready', now()
          FROM generate_series($1::bigint, $2::bigint) g""",
    "graphile": """
        INSERT INTO graphile.jobs (id, key, queue, handler, payload, run_at, max_attempts)
        SELECT g, NULL, 'default', 'noop', '{}', now(), 25
          FROM generate_series($1::bigint, $2::bigint) g""",
    "kept": """
        INSERT INTO kept.jobs (id, key, queue, handler, payload, run_at, max_attempts)
        SELECT g, 'k-' || g, 'default', 'noop', '{}', now(), 25
          FROM generate_series($1::bigint, $2::bigint) g""",
}
# the walk of the claim index, the row locks, the update, and what a worker needs back
CLAIM = {
    "split": """
        WITH p AS MATERIALIZED (
            SELECT id FROM split.jobs
             WHERE queue = 'default' AND state = 'ready' AND priority = 0 AND tenant = ''
             ORDER BY due_at, id LIMIT 1000 FOR UPDATE SKIP LOCKED),
        b AS MATERIALIZED (
            SELECT z.* FROM p CROSS JOIN LATERAL (
                SELECT i.id, i.key, i.payload FROM split.intents i WHERE i.id = p.id OFFSET 0) z)
        UPDATE split.jobs s
           SET state = 'running', attempt = attempt + 1, lease_owner = 'o',
               lease_expires_at = now() + interval '60 s', started_at = now()
          FROM b WHERE s.id = ANY (ARRAY[b.id])
        RETURNING s.id, b.key, b.payload""",
    "one_row": """
        WITH p AS MATERIALIZED (
            SELECT id FROM one_row.jobs
             WHERE queue = 'default' AND state = 'ready' AND priority = 0 AND tenant = ''
             ORDER BY due_at, id LIMIT 1000 FOR UPDATE SKIP LOCKED)
        UPDATE one_row.jobs s
           SET state = 'running', attempt = attempt + 1, lease_owner = 'o',
               lease_expires_at = now() + interval '60 s', started_at = now()
          FROM p WHERE s.id = ANY (ARRAY[p.id])
        RETURNING s.id, s.key, s.payload""",
    **{
        shape: f"""
        WITH p AS MATERIALIZED (
            SELECT id FROM {shape}.jobs WHERE is_available AND run_at <= now()
             ORDER BY priority, run_at, id LIMIT 1000 FOR UPDATE SKIP LOCKED)
        UPDATE {shape}.jobs s SET locked_at = now(), locked_by = 'o', attempts = attempts + 1
          FROM p WHERE s.id = ANY (ARRAY[p.id])
        RETURNING s.id, s.key, s.payload"""
        for shape in ("graphile", "kept")
    },
}
# the jobs claimed and not completed yet: the batch just claimed
CLAIMED = {
    "split": "SELECT id FROM split.jobs WHERE state = 'running'",
    "one_row": "SELECT id FROM one_row.jobs WHERE state = 'running'",
    "graphile": "SELECT id FROM graphile.jobs WHERE locked_by = 'o'",  # the completion deletes
    "kept": "SELECT id FROM kept.jobs WHERE locked_by = 'o'",  # the completion clears it
}
# $1: the ids claimed
COMPLETE = {
    shape: f"""
        UPDATE {shape}.jobs SET state = 'succeeded', finished_at = now(), lease_owner = NULL,
               lease_expires_at = NULL
         WHERE id = ANY ($1::bigint[]) AND state = 'running'"""
    for shape in ("split", "one_row")
} | {
    "graphile": "DELETE FROM graphile.jobs WHERE id = ANY ($1::bigint[])",
    "kept": """
        UPDATE kept.jobs SET finished_at = now(), result = 'null', locked_by = NULL
         WHERE id = ANY ($1::bigint[]) AND locked_by = 'o'""",
}
STEPS = ("intake", "claim", "completion")


async def explained(conn: asyncpg.Connection, sql: str, *args: object) -> tuple[int, int, float]:
    """The statement run under EXPLAIN ANALYZE: its WAL records, WAL bytes and milliseconds."""
    text = await conn.fetchval("EXPLAIN (ANALYZE, WAL, FORMAT JSON) " + sql, *args)
    plan = json.loads(text)[0]
    return (
        plan["Plan"].get("WAL Records", 0),
        plan["Plan"].get("WAL Bytes", 0),
        plan["Execution Time"],
    )


async def life(conn: asyncpg.Connection, shape: str, first: int) -> dict[str, tuple]:
    """One batch's intake, claim and completion; each step's (records, bytes, ms)."""
    intake = await explained(conn, INTAKE[shape], first, first + BATCH - 1)
    claim = await explained(conn, CLAIM[shape])
    # the jobs the claim took: EXPLAIN returns none of its rows, the table says which
    ids = [r["id"] for r in await conn.fetch(CLAIMED[shape])]
    if len(ids) != BATCH:
        raise AssertionError(f"{shape}: the claim took {len(ids)} of {BATCH} ready jobs")
    completion = await explained(conn, COMPLETE[shape], ids)
    return {"intake": intake, "claim": claim, "completion": completion}


async def with_history(conn: asyncpg.Connection, shape: str) -> None:
    """HISTORY jobs through their whole life, then a vacuum: the tables of a running system."""
    await conn.execute(INTAKE[shape], 1, HISTORY)
    for _ in range(HISTORY // BATCH):
        ids = [r["id"] for r in await conn.fetch(CLAIM[shape])]
        await conn.execute(COMPLETE[shape], ids)
    tables = "split.intents, split.jobs" if shape == "split" else f"{shape}.jobs"
    await conn.execute(f"VACUUM ANALYZE {tables}")


async def main(args: argparse.Namespace) -> None:
    bench = await Bench("bench_shapes").open()
    async with bench.server.database(migrate=False) as dsn:
        conn = await asyncpg.connect(dsn)
        try:
            await conn.execute(SCHEMA)
            # every shape's statements read by index, as the dispatcher's kept plans do
            await conn.execute(
                "SET enable_seqscan = off; SET enable_hashjoin = off; SET enable_mergejoin = off"
            )
            for shape in INTAKE:
                await with_history(conn, shape)
            runs: dict[str, list[dict[str, tuple]]] = {shape: [] for shape in INTAKE}
            for r in range(args.rounds):
                for shape in INTAKE:
                    runs[shape].append(await life(conn, shape, HISTORY + 1 + r * BATCH))
        finally:
            await conn.close()
    for shape, rounds in runs.items():
        medians = {
            step: [statistics.median(run[step][k] for run in rounds) / BATCH for k in range(3)]
            for step in STEPS
        }
        for step in STEPS:
            records, size, ms = medians[step]
            bench.add(
                Figure(
                    f"{shape}: {step}, WAL per job",
                    records,
                    "records",
                    note=f"{size:.0f} bytes; {ms * 1000:.1f} us of execution",
                )
            )
        bench.add(
            Figure(
                f"{shape}: a job's life, WAL per job",
                sum(medians[step][0] for step in STEPS),
                "records",
                note=f"{sum(medians[step][1] for step in STEPS):.0f} bytes; "
                f"{sum(medians[step][2] for step in STEPS) * 1000:.1f} us of execution",
            )
        )
    bench.details.update({"rounds": args.rounds, "batch": BATCH, "history": HISTORY})
    bench.finish("table shapes: WAL per job over a job's life")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7, help="batches of 1,000 per shape")
    run(lambda: main(parser.parse_args()))
