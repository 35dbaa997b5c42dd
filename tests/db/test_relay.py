"""The RabbitMQ transport's statements on real PostgreSQL (db/relay.sql, migration 017): the
relay's window and its tenant-fair order, the sweep that publishes lost messages again, and the
consumer's claim, which deletes the relay's rows of the jobs it starts (and only those). The
broker itself is in tests/e2e/test_rabbitmq.py."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import asyncpg
import pytest

from dispatcher.db import schema
from dispatcher.db.jobs import JobRepository
from dispatcher.db.pool import connect
from dispatcher.db.queries import query
from dispatcher.db.relay import RelayRepository
from dispatcher.model import NewJob

CAPABILITIES = CAPS = ["work:1"]


@pytest.fixture
async def relay(repo: JobRepository) -> RelayRepository:
    await repo.sync_registry({"default": (3, 3600)}, {"work": ("python", 1)})
    return RelayRepository(repo.pool)


async def enqueue(repo: JobRepository, keys: list[str], tenant: str | None = None) -> list[int]:
    results = await repo.enqueue_many(
        [NewJob(key=k, handler="work", payload={}, tenant=tenant) for k in keys]
    )
    # every ready job has an outbox row under a relay transport, whatever intake wrote
    await repo.pool.execute("""
        INSERT INTO dispatcher.outbox (job_id, queue, tenant, capability)
        SELECT j.id, j.queue, j.tenant, j.handler || ':' || j.handler_version
          FROM dispatcher.jobs j
         WHERE j.state = 'ready'
           AND NOT EXISTS (SELECT 1 FROM dispatcher.outbox o WHERE o.job_id = j.id)""")
    return [r.id for r in results]


async def outbox(pool: asyncpg.Pool) -> list[asyncpg.Record]:
    """Each row's job and whether a relay holds it (its message published)."""
    return list(
        await pool.fetch(
            "SELECT job_id, leased_by IS NOT NULL AS published FROM dispatcher.outbox"
            " ORDER BY job_id"
        )
    )


async def test_the_relay_publishes_at_most_a_window_ahead_of_the_claims(
    repo: JobRepository, relay: RelayRepository
) -> None:
    await enqueue(repo, [f"k{i}" for i in range(10)])
    leased = await relay.lease_outbox({"default": 4}, 100, 30, "r1")
    assert len(leased) == 4
    # leased (published, or being published) counts against the window, whoever leased it
    assert await relay.lease_outbox({"default": 4}, 100, 30, "r1") == []
    assert await relay.lease_outbox({"default": 4}, 100, 30, "r2") == []
    # two messages consumed: their jobs started, their rows gone, two more may go out
    claimed = await relay.claim_delivered(
        "default", [(r.job_id, r.attempt) for r in leased[:2]], CAPABILITIES, "d1", 60
    )
    assert len(claimed.jobs) == 2
    assert len(await relay.lease_outbox({"default": 4}, 100, 30, "r1")) == 2
    # a queue not named is not published at all (its broker queue may not exist here)
    assert await relay.lease_outbox({"other": 100}, 100, 30, "r1") == []


async def test_the_relay_publishes_fairly_across_tenants(
    repo: JobRepository, relay: RelayRepository
) -> None:
    await enqueue(repo, [f"big{i}" for i in range(200)], tenant="big")
    [small] = await enqueue(repo, ["small"], tenant="small")
    leased = await relay.lease_outbox({"default": 4}, 100, 30, "r1")
    assert len(leased) <= 4
    assert small in {r.job_id for r in leased}


async def test_the_sweep_publishes_lost_messages_again_and_drops_left_over_rows(
    repo: JobRepository, relay: RelayRepository
) -> None:
    lost, slow, done = await enqueue(repo, ["lost", "slow", "done"])
    await relay.lease_outbox({"default": 10}, 100, 30, "r1")
    await relay.claim_delivered("default", [(done, 0)], CAPABILITIES, "d1", 60)
    # a row left behind for the started job, and the lost job's: their relay's lease ran out
    # unclaimed (the message counts as lost); the slow one's still runs
    await repo.pool.execute(
        "INSERT INTO dispatcher.outbox (job_id, queue, tenant, capability, leased_until,"
        " leased_by) VALUES ($1, 'default', '', 'work:1', now() - interval '1 s', 'r1')",
        done,
    )
    await repo.pool.execute(
        "UPDATE dispatcher.outbox SET leased_until = now() - interval '1 s' WHERE job_id = $1",
        lost,
    )
    assert await relay.sweep_unclaimed(60, 100) == {"default": (1, 1)}
    assert [(r["job_id"], r["published"]) for r in await outbox(repo.pool)] == [
        (lost, False),
        (slow, True),
    ]
    # back to the pick: the relay publishes it again, as the attempt it is still ready after
    again = await relay.lease_outbox({"default": 10}, 100, 30, "r2")
    assert [(r.job_id, r.attempt) for r in again] == [(lost, 0)]
    assert await relay.sweep_unclaimed(60, 100) == {}


async def test_an_earlier_releases_published_row_is_swept_after_republish_after_s(
    repo: JobRepository, relay: RelayRepository
) -> None:
    """A rolling upgrade: a relay before migration 052 leased briefly and marked the row
    published once confirmed; such a row is neither released nor relayed again before the
    sweep's age."""
    (job,) = await enqueue(repo, ["a"])
    await repo.pool.execute(
        "UPDATE dispatcher.outbox SET leased_until = now() - interval '1 s',"
        " published_at = now() - interval '30 s'"
    )
    assert await relay.release_outbox(100) == 0
    assert await relay.lease_outbox({"default": 10}, 100, 30, "r1") == []
    assert await relay.sweep_unclaimed(60, 100) == {}
    assert await relay.sweep_unclaimed(20, 100) == {"default": (1, 0)}
    assert [r.job_id for r in await relay.lease_outbox({"default": 10}, 100, 30, "r1")] == [job]


async def test_a_consumers_lease_that_ran_out_is_released_a_relays_is_not(
    repo: JobRepository, relay: RelayRepository
) -> None:
    (job,) = await enqueue(repo, ["a"])
    # a consumer's lease (a refused delivery's row, held until it is due again): nobody's
    await repo.pool.execute("UPDATE dispatcher.outbox SET leased_until = now() + interval '1 h'")
    assert await relay.release_outbox(100) == 0  # its lease still runs
    assert await relay.lease_outbox({"default": 10}, 100, 30, "r1") == []
    await repo.pool.execute("UPDATE dispatcher.outbox SET leased_until = now() - interval '1 s'")
    # the pick reads only rows no relay holds (migration 041): not taken until released
    assert await relay.lease_outbox({"default": 10}, 100, 30, "r1") == []
    assert await relay.release_outbox(100) == 1
    again = await relay.lease_outbox({"default": 10}, 100, 30, "r1")
    assert [(r.job_id, r.attempt) for r in again] == [(job, 0)]
    # a relay's lease stays whatever it says: its message is in the broker, or lost (the
    # sweep's), never released to be published beside it
    await repo.pool.execute("UPDATE dispatcher.outbox SET leased_until = now() - interval '1 s'")
    assert await relay.release_outbox(100) == 0
    assert await relay.lease_outbox({"default": 10}, 100, 30, "r1") == []


async def test_a_relay_gives_back_only_its_own_unconfirmed_rows(
    repo: JobRepository, relay: RelayRepository
) -> None:
    a, b = await enqueue(repo, ["a", "b"])
    [first] = await relay.lease_outbox({"default": 1}, 1, 30, "r1")
    # another relay's row, and a row a claim deleted meanwhile: left as they are
    await relay.release_leased([first.id], "r2")
    assert [(r["job_id"], r["published"]) for r in await outbox(repo.pool)] == [
        (a, True),
        (b, False),
    ]
    await relay.release_leased([first.id], "r1")
    assert [(r["job_id"], r["published"]) for r in await outbox(repo.pool)] == [
        (a, False),
        (b, False),
    ]
    leased = await relay.lease_outbox({"default": 10}, 100, 30, "r2")
    assert sorted(r.job_id for r in leased) == [a, b]
    await relay.claim_delivered("default", [(a, 0)], CAPABILITIES, "d1", 60)
    await relay.release_leased([r.id for r in leased], "r2")
    assert [(r["job_id"], r["published"]) for r in await outbox(repo.pool)] == [(b, False)]


async def test_the_rows_of_a_gone_daemons_relay_go_back_to_the_pick_at_its_rescue(
    repo: JobRepository, relay: RelayRepository
) -> None:
    """A daemon killed between its relay's lease and the broker's confirm leaves rows leased for
    republish_after_s; once its liveness lock is gone, the due-scan's rescue gives them back
    (a daemon whose lock is held keeps its rows, as it keeps its running jobs)."""
    dead, alive, other = await enqueue(repo, ["dead", "alive", "other"])
    [d] = await relay.lease_outbox({"default": 1}, 1, 300, "gone-daemon")
    [a] = await relay.lease_outbox({"default": 2}, 1, 300, "living-daemon")
    assert (d.job_id, a.job_id) == (dead, alive)
    async with repo.pool.acquire() as lock:
        await lock.execute(
            "SELECT pg_advisory_lock(dispatcher.liveness_namespace(),"
            " dispatcher.liveness_key('living-daemon'))"
        )
        await repo.rescue(100, ())  # no owner gone: nothing given back
        assert [r["published"] for r in await outbox(repo.pool)] == [True, True, False]
        await repo.rescue(100, ["gone-daemon", "living-daemon"])
        assert [(r["job_id"], r["published"]) for r in await outbox(repo.pool)] == [
            (dead, False),
            (alive, True),
            (other, False),
        ]
        await lock.execute("SELECT pg_advisory_unlock_all()")
    # picked again, by any relay, as the attempt it is still ready after
    again = await relay.lease_outbox({"default": 10}, 100, 300, "r1")
    assert sorted((r.job_id, r.attempt) for r in again) == [(dead, 0), (other, 0)]


async def test_the_sweep_leaves_a_paused_queue_alone(
    repo: JobRepository, relay: RelayRepository
) -> None:
    await enqueue(repo, ["a"])
    await relay.lease_outbox({"default": 10}, 100, 30, "r1")
    await repo.pool.execute("UPDATE dispatcher.outbox SET leased_until = now() - interval '1 s'")
    await repo.set_queue_paused("default", True)
    assert await relay.sweep_unclaimed(60, 100) == {}
    await repo.set_queue_paused("default", False)
    assert await relay.sweep_unclaimed(60, 100) == {"default": (1, 0)}


async def test_a_claim_deletes_the_rows_of_what_it_started_and_keeps_another_attempts(
    repo: JobRepository, relay: RelayRepository
) -> None:
    started, other = await enqueue(repo, ["started", "other"])
    await relay.lease_outbox({"default": 10}, 100, 30, "r1")
    # `other`'s delivery is stale (published after an attempt it is no longer ready after):
    # its row carries the message of the attempt it is ready for now, so it stays
    claimed = await relay.claim_delivered(
        "default", [(started, 0), (other, 7)], CAPABILITIES, "d1", 60
    )
    assert [j.id for j in claimed.jobs] == [started]
    assert claimed.eligible == {started}
    assert [r["job_id"] for r in await outbox(repo.pool)] == [other]


async def test_deliveries_the_limits_hold_back_start_in_the_order_they_came(
    repo: JobRepository, relay: RelayRepository
) -> None:
    """The limits grant fewer starts than were delivered: the first deliveries start, not the
    lowest ids. (By id, a job held back, its delivery put first again, lost to the newer
    deliveries of an older burst every time: over RabbitMQ a tenant's single job waited for
    the whole of another tenant's burst.)"""
    await repo.sync_registry(
        {"default": (3, 3600)}, {"work": ("python", 1)}, limits={"default": (0.001, 2, None)}
    )
    burst = await enqueue(repo, [f"big-{i}" for i in range(4)], tenant="a")
    [single] = await enqueue(repo, ["small"], tenant="b")
    delivered = [(single, 0), *((job, 0) for job in burst)]
    claimed = await relay.claim_delivered("default", delivered, CAPABILITIES, "d1", 60)
    assert {j.id for j in claimed.jobs} == {single, burst[0]}
    assert claimed.eligible == {single, *burst}  # the rest held back, not duplicates


async def test_a_paused_queue_holds_its_deliveries(
    repo: JobRepository, relay: RelayRepository
) -> None:
    [job] = await enqueue(repo, ["a"])
    await repo.set_queue_paused("default", True)
    claimed = await relay.claim_delivered("default", [(job, 0)], CAPABILITIES, "d1", 60)
    assert claimed.jobs == [] and claimed.eligible == {job}  # held, not a duplicate
    assert claimed.wait_s is not None and claimed.wait_s > 0
    await repo.set_queue_paused("default", False)
    claimed = await relay.claim_delivered("default", [(job, 0)], CAPABILITIES, "d1", 60)
    assert [j.id for j in claimed.jobs] == [job]


@pytest.mark.parametrize("relay", [True, False], ids=["rabbitmq", "in-process"])
async def test_migration_017_gives_what_a_relay_published_before_a_published_row(
    empty_db_url: str, relay: bool
) -> None:
    conn = await connect(empty_db_url)
    try:
        await schema.migrate(conn, upto=16)
        # as a daemon of that transport left it (migration 015: outbox rows only for a relay)
        await conn.execute("UPDATE dispatcher.intake_settings SET ready_outbox = $1", relay)
        # two ready jobs as 016's doors wrote them (a release at 016 wrote intents and state rows,
        # and an outbox row while a relay read them); the relay before 017 deleted the row of the
        # job whose message the broker confirmed ('published')
        await conn.execute("""
            INSERT INTO dispatcher.intents (key, request_hash, queue, tenant, handler, target,
                                            payload, max_attempts, max_retry_age_s)
            SELECT k, 'h', 'default', '', 'http', '{"url": "https://example.com/"}', '{}', 10, 60
              FROM unnest(ARRAY['published', 'waiting']) k;
            INSERT INTO dispatcher.job_state (id, queue, tenant, capability, state, due_at,
                                              budget_started_at)
            SELECT id, 'default', '', 'http:1', 'ready', now(), now() FROM dispatcher.intents;
            INSERT INTO dispatcher.outbox (job_id, queue, tenant, capability)
            SELECT id, 'default', '', 'http:1' FROM dispatcher.intents
             WHERE key = 'waiting' AND (SELECT ready_outbox FROM dispatcher.intake_settings)""")
        await schema.migrate(conn)
        rows = await conn.fetch("""
            SELECT j.key, o.published_at IS NOT NULL AS published,
                   o.leased_until IS NOT NULL AS relayed
              FROM dispatcher.outbox o JOIN dispatcher.jobs j ON j.id = o.job_id
             ORDER BY j.key""")
    finally:
        await conn.close()
    if relay:
        assert [tuple(r) for r in rows] == [("published", True, True), ("waiting", False, False)]
    else:  # in process ready jobs have no outbox rows: none written
        assert rows == []


# plans ------------------------------------------------------------------------------------------
ROWS = 30_000


async def leased_window(
    pool: asyncpg.Pool, *, analyze_before_jobs: bool
) -> tuple[asyncpg.Pool, list[int]]:
    """ROWS ready jobs with outbox rows, 4,000 of them leased by a relay (a window), with no
    autovacuum analyze meanwhile; the statistics taken before the jobs arrived (empty tables)
    or after (every row unleased); the pool and the leased rows' job ids."""
    repo = JobRepository(pool)
    await repo.sync_registry({"default": (3, 3600)}, {"work": ("python", 1)})
    for table in ("intents", "job_state", "outbox"):
        await pool.execute(f"ALTER TABLE dispatcher.{table} SET (autovacuum_enabled = false)")
    analyze = "ANALYZE dispatcher.intents, dispatcher.job_state, dispatcher.outbox"
    if analyze_before_jobs:
        await pool.execute(analyze)
    await pool.execute(f"""
        SELECT count(*) FROM dispatcher.enqueue_many(
               (SELECT array_agg('k' || g) FROM generate_series(1, {ROWS}) g),
               array_fill('work'::text, ARRAY[{ROWS}]),
               array_fill('{{}}'::jsonb, ARRAY[{ROWS}]))""")
    await enqueue(repo, [])  # the outbox rows, whatever intake wrote
    if not analyze_before_jobs:
        await pool.execute(analyze)
    leased = await RelayRepository(pool).lease_outbox({"default": 4000}, 4000, 30, "r1")
    return pool, [r.job_id for r in leased]


@pytest.fixture(scope="module")
async def big_outbox(
    module_pools: Callable[[], Awaitable[asyncpg.Pool]],
) -> tuple[asyncpg.Pool, list[int]]:
    """30,000 ready jobs with outbox rows, 4,000 of them leased by a relay (published): enough
    rows to tempt the planner into scanning a whole table instead of probing it per delivery.
    The statistics are those of the empty tables (taken before the jobs arrived, as when a
    burst outruns autovacuum's analyze): what the planner then believes about ready rows is
    wrong. Built once for the module's plan tests, which only plan (EXPLAIN); no autovacuum
    analyze meanwhile."""
    return await leased_window(await module_pools(), analyze_before_jobs=True)


async def plan(pool: asyncpg.Pool, name: str, *args: object) -> str:
    async with pool.acquire() as conn, conn.transaction():
        rows = await conn.fetch("EXPLAIN " + query(name), *args)
        return "\n".join(r[0] for r in rows)


async def test_the_consumers_claim_probes_by_key_at_any_table_size(
    big_outbox: tuple[asyncpg.Pool, list[int]],
) -> None:
    pool, published = big_outbox
    ids = published[:1000]
    text = await plan(
        pool, "claim_delivered", "default", ids, [0] * 1000, "o", 60.0, CAPS, 2**62, True
    )
    for table in ("intents", "job_state", "outbox"):
        assert f"Seq Scan on {table}" not in text, text
    # the relay's rows of the started jobs are reached by job id, not filtered one by one,
    # and the started jobs by primary key, not by walking the index of every ready job
    assert "outbox_relayed" in text, text
    assert "jobs_ready_claim" not in text, text


async def test_the_relay_and_its_sweep_never_scan_the_job_tables(
    big_outbox: tuple[asyncpg.Pool, list[int]],
) -> None:
    pool = big_outbox[0]
    for name, args in (
        ("lease_outbox", (["default"], [8000], 30.0, 500, [None], [None], "r1")),
        ("sweep_unclaimed", (300.0, 500)),
        ("release_outbox", (500,)),
        ("release_gone_relays", (["host:1:gone"],)),
    ):
        text = await plan(pool, name, *args)
        for table in ("intents", "job_state"):
            assert f"Seq Scan on {table}" not in text, (name, text)
    # the sweep walks only the relay's rows (a partial index), never the whole outbox
    assert "Seq Scan on outbox" not in await plan(pool, "sweep_unclaimed", 300.0, 500)
    # the release of run-out leases too: it runs a few times a second (migration 041)
    assert "Seq Scan on outbox" not in await plan(pool, "release_outbox", 500)
    # and of a gone daemon's relay's rows (migration 052)
    text = await plan(pool, "release_gone_relays", ["host:1:gone"])
    assert "Seq Scan on outbox" not in text and "outbox_relayed" in text, text


@pytest.fixture(scope="module")
async def quiet_spell_outbox(
    module_pools: Callable[[], Awaitable[asyncpg.Pool]],
) -> tuple[asyncpg.Pool, list[int]]:
    """The statistics of a quiet spell: taken while 30,000 ready jobs had outbox rows and none
    was leased; then a relay leased 4,000 (a burst's window). With two partial indexes of the
    same predicate, the planner then saw a walk of the queue's relayed rows as cheap as a probe
    by job id, and chose the walk for every delivery (migration 053)."""
    return await leased_window(await module_pools(), analyze_before_jobs=False)


async def test_the_consumers_claim_probes_each_job_after_a_quiet_spell(
    quiet_spell_outbox: tuple[asyncpg.Pool, list[int]],
) -> None:
    pool, published = quiet_spell_outbox
    ids = published[:1000]
    text = await plan(
        pool, "claim_delivered", "default", ids, [0] * 1000, "o", 60.0, CAPS, 2**62, True
    )
    lines = text.splitlines()
    [probe] = [i for i, line in enumerate(lines) if "on outbox x" in line]
    # each delivered job's rows by an index condition on its id, not a filter over a walk
    assert "outbox_relayed" in lines[probe] and "job_id" in lines[probe + 1], text
    assert "Index Cond" in lines[probe + 1], text
