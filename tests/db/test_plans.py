"""The engine's batch statements reach jobs by index at any table size.

With tens of thousands of rows the planner would rather hash a sequential scan of the whole jobs
table than probe the primary key 1,000 times; every claim and scan then costs time in proportion
to the table, not to the batch. These plans are checked on a table big enough to tempt it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import UTC, datetime

import asyncpg
import pytest

from dispatcher.db import job_reads
from dispatcher.db.queries import query
from dispatcher.model import JobFilter, ListCursor
from tests.harness import enqueue_noop_jobs

ROWS = 30_000
FENCE = datetime(2030, 1, 1, tzinfo=UTC)
# Every test here only plans (EXPLAIN) or reads: each data set is built once per module, in a
# database of its own, and shared by the tests that plan against it.
NewPool = Callable[[], Awaitable[asyncpg.Pool]]


async def fill_big_table(pool: asyncpg.Pool) -> asyncpg.Pool:
    await pool.execute("INSERT INTO dispatcher.handlers (name, kind) VALUES ('noop', 'python')")
    for state, due in (("ready", "now()"), ("scheduled", "now() - interval '1 second'")):
        await enqueue_noop_jobs(pool, state, ROWS // 2, due=due)
    await pool.execute("""
        UPDATE dispatcher.jobs SET state = 'scheduled'
         WHERE key LIKE 'scheduled-%';
        DELETE FROM dispatcher.outbox o USING dispatcher.jobs j
         WHERE o.job_id = j.id AND j.state = 'scheduled'""")
    await pool.execute("ANALYZE dispatcher.intents, dispatcher.job_state, dispatcher.outbox")
    return pool


@pytest.fixture(scope="module")
async def big_table(module_pools: NewPool) -> asyncpg.Pool:
    return await fill_big_table(await module_pools())


def assert_no_job_scan(text: str) -> None:
    """No sequential scan of a job's tables (migration 015: intents and state rows)."""
    for table in ("intents", "job_state"):
        assert f"Seq Scan on {table}" not in text, text


async def plan(pool: asyncpg.Pool, statement: str, *args: object) -> str:
    """The plan of `statement`; for one that calls a function doing the work (CALLS_A_FUNCTION),
    the plans of that function's own statements, as they ran (rolled back)."""
    if statement in CALLS_A_FUNCTION:
        return await nested_plans(pool, statement, *args)
    async with pool.acquire() as conn, conn.transaction():
        rows = await conn.fetch("EXPLAIN " + statement, *args)
        return "\n".join(r[0] for r in rows)


# An EXPLAIN of these shows only a call (a function scan): what reads the jobs is inside
CALLS_A_FUNCTION = {query("claim_ready")}


async def nested_plans(pool: asyncpg.Pool, statement: str, *args: object) -> str:
    """Run `statement` in a transaction that is rolled back (the module's data set is shared)
    and return the plans auto_explain logged for every statement it ran, nested ones included."""
    notices: list[str] = []

    def collect(_conn: object, message: asyncpg.PostgresLogMessage) -> None:
        notices.append(message.message)

    async with pool.acquire() as conn:
        conn.add_log_listener(collect)
        transaction = conn.transaction()
        await transaction.start()
        try:
            await conn.execute("LOAD 'auto_explain'")
            await conn.execute(
                "SET LOCAL auto_explain.log_min_duration = 0;"
                " SET LOCAL auto_explain.log_nested_statements = on;"
                " SET LOCAL auto_explain.log_level = notice"
            )
            await conn.fetch(statement, *args)
        finally:
            await transaction.rollback()
            conn.remove_log_listener(collect)
    plans = [n for n in notices if "plan:" in n]
    assert plans, notices
    return "\n".join(plans)


@pytest.mark.parametrize(
    ("name", "args"),
    [
        ("claim_ready", ("default", 1000, ["noop:1"], "owner", 60.0, 2**62, True, None, None)),
        ("ready_left", ("default", ["noop:1"])),  # in jobs_ready_claim's order: no sort
        ("scan_due", (2000, 1.0)),
        ("rescue_expired_leases", (1000, [])),
        ("rescue_expired_leases", (1000, ["host:1:gone"])),  # a daemon judged gone (022)
        ("prune_terminal", ("succeeded", 86400.0, 1000)),
        ("prune_terminal", ("discarded", 86400.0, 1000)),
        # bulk redrive / discard of dead letters, with no filter and with each one
        ("move_dead", (1000, None, None, None, None, None, FENCE, "ready")),
        ("move_dead", (1000, "default", "http_4xx", "t-1", FENCE, FENCE, FENCE, "discarded")),
        ("count_dead", (None, None, None, None, None, None, FENCE)),
        ("count_dead", (1000, "default", None, None, FENCE, None, FENCE)),
        # the work poll, every second of every daemon (engine/work_poll.py), over 50 queues
        ("poll_work", ([f"q{i:02d}" for i in range(49)] + ["default"], ["noop:1", "http:1"])),
        # tracing: the trace context of a created batch
        ("set_traceparents", (list(range(1, 1001)), [f"00-{'1' * 32}-{'2' * 16}-01"] * 1000)),
    ],
)
async def test_batch_statements_never_scan_the_whole_jobs_table(
    big_table: asyncpg.Pool, name: str, args: tuple[object, ...]
) -> None:
    text = await plan(big_table, query(name), *args)
    assert_no_job_scan(text)
    assert "Seq Scan on outbox" not in text, text
    if name == "ready_left":  # one entry of the claim index, not a sort of every ready job
        assert "Sort" not in text and "jobs_ready_claim" in text, text


# statistics older than the jobs ---------------------------------------------------------------
# Autovacuum analyzes after a burst lands, not before: until then the planner believes the tables
# as it last saw them, here empty. A batch statement that reaches jobs by id must still probe the
# primary key, not scan the table nor walk a whole partial index testing each entry.
@pytest.fixture(scope="module")
async def stale_statistics(module_pools: NewPool) -> asyncpg.Pool:
    pool = await module_pools()
    await pool.execute("INSERT INTO dispatcher.handlers (name, kind) VALUES ('noop', 'python')")
    # the statistics stay those of the empty tables while the module's tests plan: no
    # autovacuum analyze of its own in between
    for table in ("intents", "job_state", "outbox"):
        await pool.execute(f"ALTER TABLE dispatcher.{table} SET (autovacuum_enabled = false)")
    await pool.execute("ANALYZE dispatcher.intents, dispatcher.job_state, dispatcher.outbox")
    await enqueue_noop_jobs(pool, "stale", ROWS)
    await pool.execute("""
        UPDATE dispatcher.job_state SET state = 'running', attempt = 1, lease_owner = 'owner',
               lease_expires_at = now() + interval '1 minute', started_at = now()
         WHERE id % 2 = 0""")
    return pool


def assert_ids_reached_by_primary_key(text: str) -> None:
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if "id = ANY" in line and "Index Cond" in line:
            scan = lines[i - 1]
            assert "_pkey" in scan, f"{scan.strip()} walks it for the ids:\n{text}"


RUNNING = list(range(2, 2002, 2))


@pytest.mark.parametrize(
    ("name", "args"),
    [
        ("claim_ready", ("default", 1000, ["noop:1"], "owner", 60.0, 2**62, True, None, None)),
        (
            "complete_succeeded",
            (
                RUNNING,
                [1] * 1000,
                [None] * 1000,
                "owner",
                [None] * 1000,
                [0.0] * 1000,
                [None] * 1000,
            ),
        ),
        ("extend_leases", (RUNNING, [1] * 1000, "owner", 60.0)),
        ("release_leases", (RUNNING, [1] * 1000, "owner")),
    ],
)
async def test_batches_probe_the_primary_key_even_with_statistics_of_an_empty_table(
    stale_statistics: asyncpg.Pool, name: str, args: tuple[object, ...]
) -> None:
    text = await plan(stale_statistics, query(name), *args)
    assert_no_job_scan(text)
    assert_ids_reached_by_primary_key(text)


# the attempt history ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
async def with_history(module_pools: NewPool) -> asyncpg.Pool:
    """Three attempts for every job of big_table's data set, half of them finished long ago."""
    big_table = await fill_big_table(await module_pools())
    await big_table.execute("""
        UPDATE dispatcher.jobs SET state = 'succeeded', finished_at = now() - interval '30 days'
         WHERE id % 2 = 0 AND state = 'scheduled';
        INSERT INTO dispatcher.attempts (job_id, attempt, owner, started_at, finished_at, outcome)
        SELECT j.id, n, 'w:1', now(), now(), 'retried'
          FROM dispatcher.jobs j, generate_series(1, 3) n""")
    await big_table.execute("ANALYZE dispatcher.intents, dispatcher.job_state, dispatcher.attempts")
    return big_table


@pytest.mark.parametrize(
    ("name", "args"),
    [
        ("list_attempts", (4242, None, 100)),
        ("list_attempts", (4242, 9000, 100)),
        ("prune_terminal", ("succeeded", 86400.0, 1000)),
    ],
)
async def test_the_attempt_history_is_read_and_pruned_by_index(
    with_history: asyncpg.Pool, name: str, args: tuple[object, ...]
) -> None:
    text = await plan(with_history, query(name), *args)
    assert "Seq Scan on attempts" not in text, text
    assert_no_job_scan(text)
    assert "attempts_pkey" in text, text


# the operator's filters (GET /v1/jobs, `dispatcher jobs list`) --------------------------------
# Handlers, tenants and runs the way a busy installation has them: one handler does nearly all
# the work, each tenant and run is a sliver of the table. A filter for a sliver walked by id
# (the primary key, newest first) reads the whole table before it fills a page; its own index
# reads only the sliver. Times are spread over a year so a narrow due window is rare too.
LIST_ROWS = 40_000
WINDOW = ("2025-03-01T00:00:00Z", "2025-03-01T06:00:00Z")


@pytest.fixture(scope="module")
async def listed_table(module_pools: NewPool) -> asyncpg.Pool:
    pool = await module_pools()
    await pool.execute(f"""
        INSERT INTO dispatcher.jobs (key, request_hash, queue, tenant, handler, payload, state,
               due_at, max_attempts, max_retry_age_s, budget_started_at, run_key, finished_at,
               priority, dead_reason)
        SELECT 'k-' || g, md5(g::text),
               -- a third of the other dead jobs sit in 'emails': the (state, queue) index
               -- reads them all for a reason with no job there, 042's index reads nothing
               CASE WHEN g % 150 = 0 AND g % 1000 <> 0 THEN 'emails' ELSE 'default' END,
               CASE WHEN g % 2 = 0 THEN 't-' || (g % 1000) ELSE '' END,
               CASE WHEN g % 1000 = 0 THEN 'rare' ELSE 'noop' END,
               '{{}}'::jsonb, CASE WHEN g % 50 = 0 THEN 'dead' ELSE 'succeeded' END,
               due, 10, 86400, due,
               CASE WHEN g % 5 = 0 THEN 'nightly:' || (g / 500) END, due,
               CASE WHEN g % 400 = 0 THEN -5 ELSE 0 END,
               CASE WHEN g % 50 <> 0 THEN NULL WHEN g % 1000 = 0 THEN 'HTTP 410 Gone'
                    ELSE 'max_attempts' END
          FROM generate_series(1, {LIST_ROWS}) g,
               LATERAL (SELECT timestamptz '2025-01-01' + g * interval '13 minutes' AS due) d""")
    # a backlog and some in flight, which the due index leaves out (migration 050); each ready
    # job due with the job before it, so that the merged parts of a due list tie
    await pool.execute("""
        UPDATE dispatcher.job_state
           SET state = 'ready', finished_at = NULL, dead_reason = NULL,
               due_at = due_at - interval '13 minutes'
         WHERE id % 97 = 0;
        UPDATE dispatcher.job_state
           SET state = 'running', finished_at = NULL, dead_reason = NULL, lease_owner = 'd1',
               lease_expires_at = now() + interval '1 hour'
         WHERE id % 1009 = 0""")
    await pool.execute("ANALYZE dispatcher.intents, dispatcher.job_state")
    return pool


def list_args(statement: str, cursor: object = None, **filters: object) -> tuple[object, ...]:
    """The parameters of list_jobs or list_jobs_by_due, built by the repository's own
    `list_args` (filters by their API names; a due cursor as (due time, id))."""
    f = {k: datetime.fromisoformat(str(v)) if "due" in k else v for k, v in filters.items()}
    if "reason" in f:
        f["dead_reason"] = f.pop("reason")
    position = None
    if isinstance(cursor, tuple):
        position = ListCursor(cursor[1], datetime.fromisoformat(cursor[0]))
    elif isinstance(cursor, int):
        position = ListCursor(cursor)
    return job_reads.list_args(statement, JobFilter(**f), position, 100)  # type: ignore[arg-type]


BY_DUE = {"due_after": WINDOW[0], "due_before": WINDOW[1]}


@pytest.mark.parametrize(
    ("statement", "filters", "index"),
    [
        ("list_jobs", {"key": "k-777"}, "jobs_key_"),  # _key or _prefix (039): either is exact
        ("list_jobs", {"tenant": "t-42"}, "intents_tenant_id"),
        ("list_jobs", {"tenant": "t-42", "cursor": 20_000}, "intents_tenant_id"),
        ("list_jobs", {"tenant": "t-42", "state": "dead", "queue": "default"}, "intents_tenant_id"),
        ("list_jobs", {"run_key": "nightly:7"}, "jobs_run_key_id"),
        ("list_jobs", {"priority": -5}, "intents_priority_id"),  # migrations 023, 048
        ("list_jobs", {"handler": "rare"}, "intents_handler_id"),
        ("list_jobs", {"handler": "rare", "state": "dead", "cursor": 30_000}, "intents_handler_id"),
        ("list_jobs", {"reason": "HTTP 410 Gone"}, "jobs_dead_reason_id"),
        (  # every job of the reason is in the queue: either reason index reads the same
            "list_jobs",
            {"reason": "HTTP 410 Gone", "state": "dead", "queue": "default"},
            "jobs_dead_reason_",
        ),
        (  # a pair with no jobs: an empty range of migration 042's index (the reason's index
            # read all the reason's jobs: 849 ms for 100,000 at 10 million)
            "list_jobs",
            {"reason": "HTTP 410 Gone", "state": "dead", "queue": "emails"},
            "jobs_dead_reason_queue_id",
        ),
        ("list_jobs", {"reason": "HTTP 410 Gone", "cursor": 30_000}, "jobs_dead_reason_id"),
        ("list_jobs_by_due", BY_DUE, "job_state_due_at_rest"),
        ("list_jobs_by_due", {"due_after": WINDOW[0]}, "job_state_due_at_rest"),
        ("list_jobs_by_due", {"due_before": WINDOW[1]}, "job_state_due_at_rest"),
        ("list_jobs_by_due", {**BY_DUE, "cursor": (WINDOW[0], 4500)}, "job_state_due_at_rest"),
        ("list_jobs_by_due", {**BY_DUE, "state": "dead"}, "job_state_due_at_rest"),
        ("list_jobs_by_due", {**BY_DUE, "state": "ready"}, "jobs_ready_claim"),
        ("list_jobs_by_due", {**BY_DUE, "state": "running"}, "jobs_running"),  # migration 061
    ],
    ids=lambda v: "+".join(v) if isinstance(v, dict) else v,
)
async def test_each_list_filter_reaches_its_index(
    listed_table: asyncpg.Pool, statement: str, filters: dict[str, object], index: str
) -> None:
    args = list_args(statement, filters.pop("cursor", None), **filters)
    text = await plan(listed_table, query(statement), *args)
    assert_no_job_scan(text)
    assert index in text, text


@pytest.mark.parametrize(
    "filters",
    [
        {},
        {"state": "ready"},
        {"state": "running"},
        {"state": "succeeded"},
        {"state": "dead"},
        {"tenant": "t-194"},  # one of its jobs is ready: the state row's copy is filtered
        {"queue": "emails"},
    ],
    ids=lambda f: "+".join(f"{k}={v}" for k, v in f.items()) or "no filter",
)
async def test_a_due_window_lists_every_state_earliest_due_first(
    listed_table: asyncpg.Pool, filters: dict[str, str]
) -> None:
    """The due index holds only the jobs at rest; the list merges the ready and running jobs
    into its order, page after page, ties by id across the parts."""
    after, before = datetime(2025, 1, 1, tzinfo=UTC), datetime(2025, 6, 20, tzinfo=UTC)
    expected = [
        r["id"]
        for r in await listed_table.fetch(
            "SELECT id FROM dispatcher.jobs WHERE due_at >= $1 AND due_at < $2"
            " AND ($3::text IS NULL OR state = $3) AND ($4::text IS NULL OR tenant = $4)"
            " AND ($5::text IS NULL OR queue = $5) ORDER BY due_at, id",
            after,
            before,
            filters.get("state"),
            filters.get("tenant"),
            filters.get("queue"),
        )
    ]
    assert len(expected) > 10
    window = JobFilter(due_after=after, due_before=before, **filters)
    listed: list[int] = []
    position: ListCursor | None = None
    while True:
        args = job_reads.list_args("list_jobs_by_due", window, position, 97)
        page = await listed_table.fetch(query("list_jobs_by_due"), *args)
        listed += [r["id"] for r in page]
        if len(page) < 97:
            break
        position = ListCursor(page[-1]["id"], page[-1]["due_at"])
    assert listed == expected


async def test_the_list_statement_is_never_planned_generically(listed_table: asyncpg.Pool) -> None:
    """list_jobs holds `$n IS NULL OR col = $n` for every filter: only a plan made with the
    values folds the unused ones away. The pools plan every execution so; were that setting
    lost, PostgreSQL would switch to a generic plan after five executions."""
    async with listed_table.acquire() as conn:
        assert await conn.fetchval("SHOW plan_cache_mode") == "force_custom_plan"
        statement = await conn.prepare(query("list_jobs"))
        for tenant in range(10):
            await statement.fetch(*list_args("list_jobs", tenant=f"t-{tenant}"))
        generic, custom = await conn.fetchrow(
            "SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE name = $1",
            statement.get_name(),
        )
    assert (generic, custom) == (0, 10)
