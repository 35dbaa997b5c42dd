"""The claims within the daemon's memory budget (migration 020), both transports' statements:
claim_ready (in-process) and claim_delivered (RabbitMQ). A claim takes the longest prefix of
its jobs whose payload and target bytes fit in its grant; a job larger than the grant is taken
only by a claim allowed to take one alone; every door records a job's size at insert, and a
row stored without it (before the migration) is measured by the claim."""

from __future__ import annotations

import asyncpg
import pytest

from dispatcher.db.jobs import JobRepository
from dispatcher.db.relay import RelayRepository
from dispatcher.model import ByteGrant, NewJob

CAPS = ["work:1"]
KB = 1000


@pytest.fixture
async def registered(repo: JobRepository) -> JobRepository:
    await repo.sync_registry({"default": (3, 3600)}, {"work": ("python", 1)})
    return repo


async def enqueue(repo: JobRepository, sizes: list[int], prefix: str = "j") -> list[int]:
    """One ready job per size (its payload: that many characters), in order."""
    results = await repo.enqueue_many(
        [
            NewJob(key=f"{prefix}-{n}", handler="work", payload={"p": "x" * size})
            for n, size in enumerate(sizes)
        ]
    )
    return [r.id for r in results]


async def test_every_door_records_the_size_of_what_it_stores(
    registered: JobRepository, pool: asyncpg.Pool
) -> None:
    await enqueue(registered, [10 * KB], prefix="api")
    await pool.execute(
        "SELECT dispatcher.enqueue('sql', 'work', jsonb_build_object('p', repeat('x', 20000)))"
    )
    await pool.execute(
        "SELECT dispatcher.enqueue_many(ARRAY['many'], ARRAY['work'],"
        " ARRAY[jsonb_build_object('p', repeat('x', 30000))])"
    )
    await pool.execute(
        """INSERT INTO dispatcher.jobs (key, request_hash, queue, handler, target, payload,
                                        state, due_at, max_attempts, max_retry_age_s,
                                        budget_started_at)
           VALUES ('direct', 'h', 'default', 'http', '{"url": "https://example.com/"}',
                   jsonb_build_object('p', repeat('x', 40000)), 'scheduled', now(), 3, 60,
                   now())"""
    )
    rows = await pool.fetch("SELECT key, size_bytes FROM dispatcher.intents ORDER BY id")
    sizes = {r["key"]: r["size_bytes"] for r in rows}
    for key, chars in (("api-0", 10_000), ("sql", 20_000), ("many", 30_000), ("direct", 40_000)):
        assert chars <= sizes[key] < chars + 200, (key, sizes[key])


async def test_a_claim_takes_fewer_jobs_rather_than_exceed_its_grant(
    registered: JobRepository,
) -> None:
    ids = await enqueue(registered, [100 * KB] * 10)
    grant = ByteGrant(350 * KB)
    jobs, taken = await registered.claim("default", 10, CAPS, "o", 60, grant)
    assert len(jobs) == taken == 3  # a fourth would pass 350 kB
    assert sum(j.size_bytes for j in jobs) <= grant.bytes
    assert all(100 * KB <= j.size_bytes < 101 * KB for j in jobs)
    # the rest stays ready for the next claim
    jobs, _ = await registered.claim("default", 10, CAPS, "o", 60, ByteGrant(10_000 * KB))
    assert len(jobs) == 7
    assert {j.id for j in jobs} <= set(ids)


async def test_a_job_larger_than_the_grant_runs_alone_and_only_alone(
    registered: JobRepository,
) -> None:
    [big] = await enqueue(registered, [500 * KB], prefix="big")
    jobs, taken = await registered.claim("default", 10, CAPS, "o", 60, ByteGrant(100 * KB))
    assert (jobs, taken) == ([], 0)  # it does not fit, and the daemon holds other jobs
    await enqueue(registered, [1 * KB] * 3, prefix="small")
    jobs, _ = await registered.claim("default", 10, CAPS, "o", 60, ByteGrant(100 * KB, True))
    # the big job came first (lowest id): alone, nothing else in the claim
    assert [j.id for j in jobs] == [big]


async def test_a_row_stored_without_its_size_is_measured_by_the_claim(
    registered: JobRepository, pool: asyncpg.Pool
) -> None:
    await enqueue(registered, [100 * KB] * 4)
    # as before migration 020 (and the value stored compressed, as an old row's may be)
    for trigger in ("intents_size_bytes", "intents_size_bytes_changed"):
        await pool.execute(f"ALTER TABLE dispatcher.intents DISABLE TRIGGER {trigger}")
    await pool.execute(
        "UPDATE dispatcher.intents SET size_bytes = NULL,"
        " payload = jsonb_build_object('p', repeat('x', 100000))"
    )
    jobs, _ = await registered.claim("default", 10, CAPS, "o", 60, ByteGrant(250 * KB))
    assert len(jobs) == 2
    assert all(100 * KB <= j.size_bytes < 101 * KB for j in jobs)


async def test_a_delivered_claim_holds_back_what_does_not_fit(
    registered: JobRepository, pool: asyncpg.Pool
) -> None:
    ids = await enqueue(registered, [100 * KB] * 5)
    relay = RelayRepository(pool)
    deliveries = [(i, 0) for i in reversed(ids)]  # delivery order, not id order
    claimed = await relay.claim_delivered("default", deliveries, CAPS, "o", 60, ByteGrant(250 * KB))
    # the first two delivered fit; the rest are eligible, held back for the next claim
    assert {j.id for j in claimed.jobs} == {ids[4], ids[3]}
    assert claimed.eligible == set(ids)
    claimed = await relay.claim_delivered(
        "default", deliveries[2:], CAPS, "o", 60, ByteGrant(10 * KB, alone=True)
    )
    assert [j.id for j in claimed.jobs] == [ids[2]]  # one, alone, larger than its grant


async def test_the_size_counts_the_target_too(pool: asyncpg.Pool) -> None:
    target = {"url": "https://example.com/", "headers": {"X-Pad": "v" * 50_000}}
    await pool.execute("SELECT dispatcher.enqueue('t', 'http', '{}', target => $1::jsonb)", target)
    size = await pool.fetchval("SELECT size_bytes FROM dispatcher.intents WHERE key = 't'")
    assert 50_000 <= size < 50_300


async def test_a_number_is_counted_as_the_digits_the_daemon_receives(
    registered: JobRepository, pool: asyncpg.Pool
) -> None:
    """1e-16000 is stored in a few bytes and sent to the daemon as 0.000...1, 16,002
    characters: a claim reserves its text, so five such jobs in a claim of 40 kB take two (had
    the budget read the stored size, all five would have come, 80 kB from a few bytes each)."""
    await pool.execute(
        "SELECT dispatcher.enqueue_many(array_agg('n' || g), array_fill('work'::text, ARRAY[5]),"
        " array_fill('{\"n\": 1e-16000}'::jsonb, ARRAY[5])) FROM generate_series(1, 5) g"
    )
    sizes = [r["size_bytes"] for r in await pool.fetch("SELECT size_bytes FROM dispatcher.intents")]
    assert sizes == [len('{"n": 0.' + "0" * 15999 + "1}")] * 5
    jobs, _ = await registered.claim("default", 10, CAPS, "o", 60, ByteGrant(40 * KB))
    assert len(jobs) == 2


async def test_a_size_is_written_by_the_batch_and_measured_again_when_the_payload_changes(
    pool: asyncpg.Pool,
) -> None:
    """The batch door writes the size in its insert (the insert trigger then does nothing); a
    later change of payload or target is measured by the update trigger."""
    await pool.execute("INSERT INTO dispatcher.handlers (name, kind) VALUES ('work', 'python')")
    await pool.execute(
        "SELECT dispatcher.enqueue_many(ARRAY['a', 'b'], ARRAY['work', 'work'],"
        " ARRAY[jsonb_build_object('p', repeat('x', 5000)), '{}'::jsonb])"
    )
    sizes = dict(await pool.fetch("SELECT key, size_bytes FROM dispatcher.intents"))
    assert 5000 <= sizes["a"] < 5200 and 0 < sizes["b"] < 100, sizes
    await pool.execute(
        "UPDATE dispatcher.intents SET payload = jsonb_build_object('p', repeat('y', 9000))"
        " WHERE key = 'b'"
    )
    size = await pool.fetchval("SELECT size_bytes FROM dispatcher.intents WHERE key = 'b'")
    assert 9000 <= size < 9200, size
