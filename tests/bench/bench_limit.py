"""The database's own limit: durable jobs/s that PostgreSQL itself sustains on this machine for
the minimal SQL one job needs, measured with `pgbench`, so the dispatcher's figures can be
stated as a fraction of it.

A job is three committed statements (as in the dispatcher): insert the job row; claim it
(`FOR UPDATE SKIP LOCKED`, mark it running with a lease owner); complete it. Two shapes:

  minimal       jobs table only (primary key, unique key, a partial index on ready rows)
  with outbox   the dispatcher's shape: the insert also writes an outbox row, the claim
                deletes outbox rows and marks their jobs running in one statement

each single-row (one job per statement) and batched (500 jobs per statement), at a few client
counts; the best is the limit. Durability is the server's (synchronous_commit as reported).

    .venv/bin/python -m tests.bench.bench_limit [--seconds 8]
"""

from __future__ import annotations

import argparse
import asyncio
import re
import shutil
import tempfile
from pathlib import Path

import asyncpg

from tests.bench.common import Bench, CpuMeter, Figure, db_name, run, wait_for_quiet

SCHEMA = """
CREATE TABLE jobs (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    key         text NOT NULL UNIQUE,
    state       text NOT NULL,
    payload     jsonb NOT NULL,
    due_at      timestamptz NOT NULL DEFAULT now(),
    lease_owner text,
    started_at  timestamptz,
    finished_at timestamptz
);
CREATE INDEX jobs_ready ON jobs (id) WHERE state = 'ready';
CREATE TABLE outbox (
    id     bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id bigint NOT NULL
);
"""

COMPLETE = """
UPDATE jobs SET state = 'succeeded', finished_at = now(), lease_owner = NULL
  FROM unnest(:ids::bigint[]) AS r(id) WHERE jobs.id = r.id AND jobs.state = 'running';
"""

# One pgbench transaction = insert N, claim up to N, complete what was claimed (3 commits).
SCRIPTS = {
    "minimal": """
INSERT INTO jobs (key, state, payload)
SELECT gen_random_uuid()::text, 'ready', jsonb_build_object('n', g) FROM generate_series(1, {n}) g;
WITH c AS (SELECT id FROM jobs WHERE state = 'ready' ORDER BY id LIMIT {n} FOR UPDATE SKIP LOCKED),
     u AS (UPDATE jobs j SET state = 'running', lease_owner = 'w' || :client_id, started_at = now()
             FROM c WHERE j.id = c.id RETURNING j.id)
SELECT coalesce(array_agg(id), '{{}}') AS ids FROM u \\gset
"""
    + COMPLETE,
    "with outbox": """
WITH ins AS (INSERT INTO jobs (key, state, payload)
             SELECT gen_random_uuid()::text, 'ready', jsonb_build_object('n', g)
               FROM generate_series(1, {n}) g RETURNING id)
INSERT INTO outbox (job_id) SELECT id FROM ins;
WITH c AS (SELECT id FROM outbox ORDER BY id LIMIT {n} FOR UPDATE SKIP LOCKED),
     d AS (DELETE FROM outbox o USING c WHERE o.id = c.id RETURNING o.job_id),
     u AS (UPDATE jobs j SET state = 'running', lease_owner = 'w' || :client_id, started_at = now()
             FROM d WHERE j.id = d.job_id AND j.state = 'ready' RETURNING j.id)
SELECT coalesce(array_agg(id), '{{}}') AS ids FROM u \\gset
"""
    + COMPLETE,
}
SHAPES = [(1, (4, 8, 16)), (500, (2, 4))]  # (jobs per statement, client counts tried)


def find_pgbench() -> str:
    found = shutil.which("pgbench")
    if found:
        return found
    for candidate in sorted(Path("/usr/lib/postgresql").glob("*/bin/pgbench"), reverse=True):
        return str(candidate)
    raise SystemExit("pgbench not found (install postgresql-client or add it to PATH)")


def pgbench_script(shape: str, batch: int) -> str:
    # pgbench reads one SQL command per line unless it ends in ';' — join the lines of each
    # statement into one line.
    text = SCRIPTS[shape].format(n=batch).strip()
    commands, current = [], []
    for line in text.splitlines():
        current.append(line.strip())
        if line.rstrip().endswith(";") or line.rstrip().endswith("\\gset"):
            commands.append(" ".join(current))
            current = []
    return "\n".join(commands) + "\n"


async def pgbench_run(
    pgbench: str, dsn: str, script: Path, clients: int, seconds: float
) -> tuple[float, str]:
    proc = await asyncio.create_subprocess_exec(
        pgbench,
        "-n",
        "-M",
        "prepared",
        "-f",
        str(script),
        "-c",
        str(clients),
        "-j",
        str(min(clients, 2)),
        "-T",
        str(int(seconds)),
        dsn,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await proc.communicate()
    text = out.decode()
    if proc.returncode != 0 or "aborted" in text:
        raise RuntimeError(f"pgbench failed:\n{text[-2000:]}")
    tps = re.search(r"tps = ([0-9.]+) \(without initial", text)
    return float(tps.group(1)) if tps else float("nan"), text


async def main(args: argparse.Namespace) -> None:
    bench = await Bench("bench_limit").open()
    pgbench = find_pgbench()
    version = (
        await asyncio.create_subprocess_exec(pgbench, "--version", stdout=asyncio.subprocess.PIPE)
    ).stdout
    assert version is not None
    bench.details["pgbench"] = (await version.read()).decode().strip()
    tmp = Path(tempfile.mkdtemp(prefix="bench-limit-"))
    try:
        async with bench.server.database(migrate=False) as dsn:
            conn = await asyncpg.connect(dsn)
            await conn.execute(SCHEMA)
            for shape in SCRIPTS:
                for batch, client_counts in SHAPES:
                    script = tmp / f"{shape.replace(' ', '_')}_{batch}.sql"
                    script.write_text(pgbench_script(shape, batch))
                    tried = {}
                    for clients in client_counts:
                        await conn.execute("TRUNCATE jobs, outbox")
                        await conn.execute("VACUUM ANALYZE jobs, outbox")
                        await wait_for_quiet(30)
                        async with CpuMeter({}, db_name(dsn)) as cpu:
                            tps, _ = await pgbench_run(pgbench, dsn, script, clients, args.seconds)
                        done = await conn.fetchval(
                            "SELECT count(*) FROM jobs WHERE state = 'succeeded'"
                        )
                        tried[clients] = {
                            "jobs_per_s": done / args.seconds,
                            "tps": tps,
                            "cpu": cpu.as_json(),
                            "cpu_summary": cpu.summary(),
                        }
                        print(
                            f"  {shape}, {batch}/statement, {clients} clients: "
                            f"{done / args.seconds:,.0f} jobs/s ({cpu.summary()})",
                            flush=True,
                        )
                    best = max(tried, key=lambda c: tried[c]["jobs_per_s"])
                    bench.details[f"{shape}_{batch}"] = tried
                    bench.add(
                        Figure(
                            f"pgbench {shape}, {batch} job(s)/statement",
                            tried[best]["jobs_per_s"],
                            "jobs/s",
                            note=f"best of clients {list(client_counts)}: {best} clients; "
                            f"{tried[best]['cpu_summary']}",
                        )
                    )
            await conn.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    bench.finish("database limit (pgbench, durable jobs/s: insert + claim + complete)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=8.0, help="per pgbench run")
    run(lambda: main(parser.parse_args()))
