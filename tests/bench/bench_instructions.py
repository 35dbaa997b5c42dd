"""PostgreSQL's instructions per job for the intake's, the claim's and the completion's statements,
counted by valgrind's callgrind: a figure the machine's load and hour do not move, for
before/after comparisons of what a job's statements cost (the same tree gives the same count, run
after run, whatever else the machine does).

A scratch server (the embedded PostgreSQL's binaries, or `--bin-dir`) gets one database per
variant, migrated as the daemon would; the server is stopped and each statement runs in
PostgreSQL's single-user mode under callgrind: a warm-up statement, then the measured one once
and, in a second run, twice. The difference of the two runs' counts, per job, is one statement's
cost with the backend warm (plans, caches) and the tables holding a batch already, without the
start and end of the process.

Workloads (each job a due-now or future `noop` job, as the peer benchmark's W1 sends them):

  bulk_now      dispatcher.enqueue_many of 10,000 due-now jobs (W1 bulk, the SQL door's batch)
  bulk_later    the same, due in an hour (W5's intake)
  one_call      dispatcher.enqueue, one job per statement (and per transaction), 1,000 of them,
                prepared once as a driver would
  minimal       the reference: one INSERT of 10,000 rows into bench_limit's minimal jobs table
                (primary key, unique key, a partial index on ready rows), the least SQL a job
                needs, in the same database
  claim_batch   dispatcher.claim_ready of 1,000 ready jobs at once (W2's drain: the daemon's
                claim statement, claim_batch 1,000)
  claim_one     dispatcher.claim_ready of one job, 200 times, each after one enqueue (W3's
                steady stream: a claim per job), on a queue without limits
  claim_one_limited  the same as the benchmarks' daemon sends it: the queue's limits raised
                as they set them (so its claims draw on parked permits) and a claim asking
                for up to 1,000 jobs
  complete_batch  dispatcher.complete_succeeded of 1,000 claimed jobs in one statement (the
                daemon's completion write of a drain)

The last three enqueue (and claim) their jobs in each block first: a second pair of runs without
the measured statement is subtracted, so what is counted is that statement alone.

Variants price a change without editing the tree: `--without INDEX` drops one index (what its
entries cost), `--variant NAME='SQL'` runs any statements after the migration.

    .venv/bin/python -m tests.bench.bench_instructions [--without jobs_ready_claim]
        [--variant 'dedup=ALTER INDEX dispatcher.jobs_ready_claim RESET (deduplicate_items)']
        [--bin-dir /usr/lib/postgresql/15/bin] [--workloads bulk_now,minimal]

Needs valgrind (Debian: apt-get install valgrind); about 2 minutes per variant.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg

from dispatcher.db.embedded import EmbeddedPostgres, ServerUser, server_user
from tests.bench.bench_engine import ENQUEUE_BULK
from tests.bench.common import Figure, machine_info, print_table, register_handler, run_migrate
from tests.bench.common import save_results as save

BATCH = 10_000
CALLS = 1_000  # one_call: statements per measured block
CLAIM_BATCH = 1_000  # claim_batch, complete_batch: the daemon's claim_batch of a drain
CLAIM_ONES = 200  # claim_one: enqueue-and-claim pairs per measured block
# the daemon's claim (queries.sql claim_ready) as the drain sends it: no byte budget to speak of,
# no tenant cursor; the no-op handler's capability at its registered version
CLAIM = (
    "SELECT count(*) - 1 FROM dispatcher.claim_ready('default', {n}, ARRAY['noop:1'], 'bench', "
    "60, 9223372036854775807, false, NULL, NULL)"  # less the marker row
)
MINIMAL_SCHEMA = """
CREATE TABLE public.minimal_jobs (
    id      bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    key     text NOT NULL UNIQUE,
    state   text NOT NULL,
    payload jsonb NOT NULL,
    due_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX minimal_jobs_ready ON public.minimal_jobs (id) WHERE state = 'ready';
"""
# claim_one_limited: the queue's limits as the benchmarks' daemon sets them (common.py,
# UNLIMITED_QUEUE_ENV), the bucket and the parked permits emptied, so each run's first claim
# parks a slot and the claims measured draw on it, as a steady stream's claims do
LIMITED = (
    "UPDATE dispatcher.queues SET rate_per_s = 1000000, burst = 100000, max_inflight = 2000,"
    " tokens = 0, permits_parked = 0 WHERE name = 'default'",
    "DELETE FROM dispatcher.claim_permits",
)
UNLIMITED = (  # every run starts as migrated, whatever a workload before it set
    "UPDATE dispatcher.queues SET rate_per_s = NULL, burst = NULL, max_inflight = NULL,"
    " tokens = 0, permits_parked = 0 WHERE name = 'default'",
    "DELETE FROM dispatcher.claim_permits",
)
ONE_AT_A_TIME = ("one_call", "claim_one", "claim_one_limited")
RESET = (
    "TRUNCATE dispatcher.intents, dispatcher.job_state, dispatcher.outbox, dispatcher.attempts,"
    " public.minimal_jobs",
    "VACUUM ANALYZE dispatcher.intents",
    "VACUUM ANALYZE dispatcher.job_state",
    "VACUUM ANALYZE public.minimal_jobs",
    *UNLIMITED,
)


def bulk(prefix: str, n: int, due: str) -> str:
    """W1's own statement (bench_engine.ENQUEUE_BULK) with its values written in."""
    values = {"$1": f"'{prefix}-'", "$2": str(n), "$3": due, "$4": "'noop'", "$5": "NULL"}
    text = " ".join(ENQUEUE_BULK.split())
    return re.sub(r"\$[1-5]", lambda m: values[m.group(0)], text)


def minimal(prefix: str, n: int) -> str:
    return (
        "INSERT INTO public.minimal_jobs (key, state, payload) "
        f"SELECT '{prefix}-' || g, 'ready', jsonb_build_object('n', g) "
        f"FROM generate_series(1, {n}) g"
    )


# the block's jobs' ids, the completion's first argument: read by key from the intents, which
# the completion does not write, so the baseline reads the same rows from the same table
IDS = "(SELECT array_agg(id ORDER BY id) FROM dispatcher.intents WHERE key LIKE '{prefix}-%')"


def checked(n: int, statement: str) -> str:
    """`statement` (a count) as one that fails the benchmark unless it counted `n`."""
    # the divisor is not a constant: the planner would fold `1 / 0` whatever the CASE around it
    return f"SELECT 1 / (CASE WHEN ({statement}) = {n} THEN 1 ELSE 0 END)"


def complete(prefix: str, n: int, *, write: bool) -> str:
    """The completion of the block's `n` claimed jobs (their first attempt), or (`write` false)
    only the read of the ids it is given."""
    ids = IDS.format(prefix=prefix)
    if not write:
        return checked(n, f"SELECT cardinality({ids})")
    args = (
        f"{ids}, array_fill(1, ARRAY[{n}]), array_fill(NULL::text, ARRAY[{n}]), 'bench', "
        f"array_fill(NULL::integer, ARRAY[{n}]), array_fill(0.001::float8, ARRAY[{n}]), "
        f"array_fill(NULL::text, ARRAY[{n}])"
    )
    return checked(n, f"SELECT count(*) FROM dispatcher.complete_succeeded({args})")


def one_calls(prefix: str, n: int) -> list[str]:
    """Prepared once per process, as a driver does (parse and plan are not the job's cost)."""
    prepare = "PREPARE one_call(text) AS SELECT dispatcher.enqueue($1, 'noop')"
    calls = [f"EXECUTE one_call('{prefix}-{i}')" for i in range(n)]
    return [prepare, *calls] if prefix == "warm" else calls


@dataclass(frozen=True)
class Workload:
    """Statements of a warm-up and of one measured block (`prefix` keeps keys apart). With
    `prepared`, the measured blocks first make their jobs ready for the measured statement
    (enqueue them, claim them), and a second pair of runs without that statement is
    subtracted: the statement's own cost, after the same warm-up, on the same tables."""

    jobs: int
    prepared: bool = False

    def warm_up(self, name: str) -> list[str]:
        return block(name, "warm", 200 if name in ONE_AT_A_TIME else 1_000)

    def measured(self, name: str, prefix: str, *, without: bool = False) -> list[str]:
        return block(name, prefix, self.jobs, without=without)


def block(name: str, prefix: str, n: int, *, without: bool = False) -> list[str]:
    """The statements of one block; `without`: all but the measured statement (a read of the
    completion's arguments stays: the baseline reads them too)."""
    if name == "bulk_now":
        return [bulk(prefix, n, "NULL")]
    if name == "bulk_later":
        return [bulk(prefix, n, "(now() + interval '1 hour')")]
    if name == "one_call":
        return one_calls(prefix, n)
    if name == "claim_batch":
        return [bulk(prefix, n, "NULL"), *([] if without else [checked(n, CLAIM.format(n=n))])]
    if name == "complete_batch":
        claimed = [bulk(prefix, n, "NULL"), checked(n, CLAIM.format(n=n))]
        return [*claimed, complete(prefix, n, write=not without)]
    if name in ("claim_one", "claim_one_limited"):
        limited = name == "claim_one_limited"
        prepare = [
            *(LIMITED if limited else ()),
            "PREPARE one_enqueue(text) AS SELECT dispatcher.enqueue($1, 'noop')",
            f"PREPARE claim_one AS {checked(1, CLAIM.format(n=1_000 if limited else 1))}",
        ]
        pairs = []
        for i in range(n):
            pairs.append(f"EXECUTE one_enqueue('{prefix}-{i}')")
            if not without:
                pairs.append("EXECUTE claim_one")
        return [*prepare, *pairs] if prefix == "warm" else pairs
    return [minimal(prefix, n)]


WORKLOADS = {
    "bulk_now": Workload(BATCH),
    "bulk_later": Workload(BATCH),
    "one_call": Workload(CALLS),
    "minimal": Workload(BATCH),
    "claim_batch": Workload(CLAIM_BATCH, prepared=True),
    "claim_one": Workload(CLAIM_ONES, prepared=True),
    "claim_one_limited": Workload(CLAIM_ONES, prepared=True),
    "complete_batch": Workload(CLAIM_BATCH, prepared=True),
}


def database_url(dsn: str, name: str) -> str:
    return urlunsplit(urlsplit(dsn)._replace(path=f"/{name}"))


async def prepare(dsn: str, variants: dict[str, list[str]]) -> None:
    """One migrated database per variant, the no-op handler registered, its SQL applied."""
    admin = await asyncpg.connect(dsn)
    try:
        for name, statements in variants.items():
            await admin.execute(f'CREATE DATABASE "{name}"')
            url = database_url(dsn, name)
            await asyncio.to_thread(run_migrate, url)
            await register_handler(url, "noop")
            conn = await asyncpg.connect(url)
            try:
                await conn.execute(MINIMAL_SCHEMA)
                for statement in statements:
                    await conn.execute(statement)
            finally:
                await conn.close()
    finally:
        await admin.close()


class SingleUser:
    """Statements through `postgres --single` on a stopped data directory, as the server user."""

    def __init__(
        self, bin_dir: Path, data_dir: Path, user: ServerUser | None, profiles: Path | None
    ):
        self.postgres = str(bin_dir / "postgres")
        self.data_dir = data_dir
        self.user = user
        self.profiles = profiles  # where callgrind's files go (None: nowhere)

    def run(self, database: str, statements: list[str], *, count: str = "") -> int:
        """Run the statements (one per line); with `count`, under callgrind, and return the
        instructions counted (`count` names the profile kept). Any ERROR fails the benchmark
        with PostgreSQL's message."""
        command = [self.postgres, "--single", "-D", str(self.data_dir), database]
        if count:
            out = self.profiles / f"{count}.callgrind" if self.profiles else Path(os.devnull)
            command = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", *command]
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        done = subprocess.run(
            command,
            input="\n".join(statements) + "\n",
            capture_output=True,
            text=True,
            cwd=self.data_dir,
            env=env,
            user=None if self.user is None else self.user.uid,
            group=None if self.user is None else self.user.gid,
            extra_groups=None if self.user is None else [],
            timeout=1800,
        )
        output = done.stdout + done.stderr
        errors = [line for line in output.splitlines() if "ERROR:" in line]
        if done.returncode != 0 or errors:
            raise RuntimeError(f"postgres --single in {database}: {errors or output[-2000:]}")
        if not count:
            return 0
        found = re.search(r"Collected : (\d+)", output)
        if found is None:
            raise RuntimeError(f"callgrind printed no count: {output[-2000:]}")
        return int(found.group(1))

    def per_job(self, database: str, name: str, workload: Workload) -> float:
        """One measured block's instructions per job: a run with two blocks less a run with one,
        each from the same empty tables (a prepared workload: less the same without the
        measured statement)."""
        own = self._per_job(database, name, workload, without=False)
        if not workload.prepared:
            return own
        return own - self._per_job(database, name, workload, without=True)

    def _per_job(self, database: str, name: str, workload: Workload, *, without: bool) -> float:
        counts = []
        for blocks in (1, 2):
            self.run(database, list(RESET))
            statements = workload.warm_up(name)
            for n in range(blocks):
                statements += workload.measured(name, f"m{n}", without=without)
            tag = f"{database}-{name}{'-without' if without else ''}-{blocks}"
            counts.append(self.run(database, statements, count=tag))
        return (counts[1] - counts[0]) / workload.jobs


def add_variant_arguments(parser: argparse.ArgumentParser) -> None:
    """`--without INDEX` and `--variant NAME=SQL`, read by `parse_variants`."""
    parser.add_argument(
        "--without",
        action="append",
        default=[],
        metavar="INDEX",
        help="a variant without this index of the dispatcher schema (repeatable)",
    )
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME=SQL",
        help="a variant with these statements run after the migration (repeatable)",
    )


def parse_variants(args: argparse.Namespace) -> dict[str, list[str]]:
    variants: dict[str, list[str]] = {"as_migrated": []}
    for index in args.without:
        if not re.fullmatch(r"[a-z_][a-z0-9_]*", index):
            sys.exit(f"--without {index!r}: give an index name of the dispatcher schema")
        variants[f"without_{index}"] = [f"DROP INDEX dispatcher.{index}"]
    for spec in args.variant:
        name, sep, sql = spec.partition("=")
        if not sep or not re.fullmatch(r"[a-z_][a-z0-9_]*", name) or not sql.strip():
            sys.exit(f"--variant {spec!r}: write NAME=SQL, NAME in lower case letters and _")
        variants[name] = [sql]
    return variants


async def main(args: argparse.Namespace) -> None:
    if shutil.which("valgrind") is None:
        sys.exit("bench_instructions needs valgrind: apt-get install valgrind")
    workloads = [w for w in args.workloads.split(",") if w]
    unknown = sorted(set(workloads) - set(WORKLOADS))
    if unknown:
        sys.exit(f"--workloads: unknown {unknown}; choose among {', '.join(WORKLOADS)}")
    variants = parse_variants(args)
    with tempfile.TemporaryDirectory(prefix="bench-instructions-") as state:
        server = EmbeddedPostgres(Path(state), role="command", bin_dir=args.bin_dir)
        dsn = server.start()
        try:
            conn = await asyncpg.connect(dsn)
            version = await conn.fetchval("SELECT version()")
            await conn.close()
            await prepare(dsn, variants)
        finally:
            server.stop()
        user = server_user()
        if args.profiles:
            args.profiles.mkdir(parents=True, exist_ok=True)
            if user is not None:
                os.chown(args.profiles, user.uid, user.gid)
        single = SingleUser(server.bin_dir, server.data_dir, user, args.profiles)
        figures: list[Figure] = []
        counts: dict[str, dict[str, float]] = {}
        for variant in variants:
            for name in workloads:
                per_job = single.per_job(variant, name, WORKLOADS[name])
                counts.setdefault(variant, {})[name] = per_job
                base = counts["as_migrated"].get(name)
                note = (
                    f"{per_job / base:.3f} x as migrated"
                    if base and variant != "as_migrated"
                    else ""
                )
                reference = counts[variant].get("minimal")
                if name != "minimal" and reference:
                    note += f"{'; ' if note else ''}{per_job / reference:.2f} x minimal"
                figures.append(
                    Figure(f"{name} [{variant}]", per_job, "instructions/job", note=note)
                )
                print(f"{variant:>24} {name:<11} {per_job:>12,.0f} instructions/job", flush=True)
    print_table("PostgreSQL instructions per job (callgrind)", figures)
    machine = machine_info(version, {})
    path = save("bench_instructions", machine, figures, {"counts": counts})
    print(f"\nresults appended to {path}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--workloads",
        default="minimal,bulk_now,bulk_later,one_call",
        help="comma-separated subset of " + ",".join(WORKLOADS) + " (minimal first: the ratios)",
    )
    add_variant_arguments(parser)
    parser.add_argument(
        "--profiles",
        type=Path,
        default=None,
        help="keep callgrind's files here, one per run (<variant>-<workload>-<1|2>.callgrind), "
        "for callgrind_annotate",
    )
    parser.add_argument(
        "--bin-dir",
        type=Path,
        default=None,
        help="PostgreSQL's binaries (default: the embedded PostgreSQL's)",
    )
    asyncio.run(main(parser.parse_args()))
