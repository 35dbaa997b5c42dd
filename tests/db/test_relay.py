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
from dispatcher.db.relay import Claimed, OutboxLease, RelayRepository
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
           AND NOT EXISTS (SELECT 1 FROM dispatcher.outbox o WHERE o.job_id = j.id)
         ORDER BY j.id""")
    return [r.id for r in results]


async def to_publish(pool: asyncpg.Pool) -> list[int]:
    """The job ids of the outbox rows a relay may take."""
    rows = await pool.fetch(
        "SELECT job_id FROM dispatcher.outbox WHERE leased_until IS NULL ORDER BY job_id"
    )
    return [r["job_id"] for r in rows]


async def messages(pool: asyncpg.Pool) -> list[tuple[str, list[int], list[int], int]]:
    """Each message recorded: its relay, its jobs, their attempts, how many were handled."""
    rows = await pool.fetch(
        "SELECT relay, job_ids, attempts, handled FROM dispatcher.outbox_messages ORDER BY id"
    )
    return [(r["relay"], list(r["job_ids"]), list(r["attempts"]), r["handled"]) for r in rows]


def lease(
    relay: RelayRepository, window: int, owner: str = "r1", *, batch: int = 100, per: int = 1
) -> Awaitable[list[OutboxLease]]:
    return relay.lease_outbox({"default": window}, {"default": per}, batch, owner)


async def claim(relay: RelayRepository, leased: list[OutboxLease], owner: str = "d1") -> Claimed:
    """Deliver these jobs as their messages carried them."""
    return await relay.claim_delivered(
        "default",
        [(r.job_id, r.attempt) for r in leased],
        CAPABILITIES,
        owner,
        60,
        messages=[r.message for r in leased],
    )


async def test_the_lease_takes_its_rows_and_records_each_message_in_order(
    repo: JobRepository, relay: RelayRepository
) -> None:
    jobs = await enqueue(repo, [f"k{i}" for i in range(5)])
    leased = await lease(relay, 10, per=2)
    assert [r.job_id for r in leased] == jobs
    # slices of the pick's order, two jobs a message, each message named by its record
    assert [
        [r.job_id for r in leased if r.message == m]
        for m in dict.fromkeys(r.message for r in leased)
    ] == [jobs[0:2], jobs[2:4], jobs[4:]]
    assert await messages(repo.pool) == [
        ("r1", jobs[0:2], [0, 0], 0),
        ("r1", jobs[2:4], [0, 0], 0),
        ("r1", jobs[4:], [0], 0),
    ]
    # the rows are gone: the record is what says the message is out
    assert await repo.pool.fetchval("SELECT count(*) FROM dispatcher.outbox") == 0


async def test_the_window_is_one_consumers_for_each_daemon_registered(
    repo: JobRepository, relay: RelayRepository
) -> None:
    """Every daemon consumes a share of the window: three daemons sharing one consumer's window
    claimed ~550 deliveries at a time where one daemon took 1,000 (bench_scaleout), so the
    window is one consumer's for each daemon registered (none registered: one)."""
    await enqueue(repo, [f"k{i}" for i in range(10)])
    assert len(await lease(relay, 2)) == 2  # nobody registered: one consumer's window
    await repo.pool.execute(
        "INSERT INTO dispatcher.instances (owner) VALUES ('d1'), ('d2'), ('d3')"
    )
    assert len(await lease(relay, 2)) == 4  # 2 x 3 in all, 2 of them out already
    await repo.pool.execute("DELETE FROM dispatcher.instances WHERE owner = 'd3'")
    assert await lease(relay, 2) == []  # 2 x 2 = 4 < the 6 out: nothing more


async def test_a_message_carries_the_attempt_its_row_names_else_its_state_s(
    repo: JobRepository, relay: RelayRepository
) -> None:
    """Intake writes the attempt into the row (0), so the lease reads no state row for it; a
    row that names none (an earlier release's, a door that does not know it) is probed."""
    await repo.pool.execute("UPDATE dispatcher.intake_settings SET ready_outbox = true")
    carried, probed = await enqueue(repo, ["carried", "probed"])
    assert (
        await repo.pool.fetchval("SELECT attempt FROM dispatcher.outbox WHERE job_id = $1", carried)
        == 0
    )  # written by intake (ready_outbox)
    # the state moved on without the row (what a test alone can do): the row's word is taken
    await repo.pool.execute("UPDATE dispatcher.outbox SET attempt = 4 WHERE job_id = $1", carried)
    await repo.pool.execute("UPDATE dispatcher.outbox SET attempt = NULL WHERE job_id = $1", probed)
    await repo.pool.execute("UPDATE dispatcher.job_state SET attempt = 2 WHERE id = $1", probed)
    assert sorted((r.job_id, r.attempt) for r in await lease(relay, 10)) == [
        (carried, 4),
        (probed, 2),
    ]


async def test_a_job_with_two_rows_goes_out_once(
    repo: JobRepository, relay: RelayRepository
) -> None:
    (job,) = await enqueue(repo, ["a"])
    await repo.pool.execute(
        "INSERT INTO dispatcher.outbox (job_id, queue, tenant, capability)"
        " SELECT job_id, queue, tenant, capability FROM dispatcher.outbox"
    )
    [leased] = await lease(relay, 10, per=10)
    assert leased.job_id == job
    assert await messages(repo.pool) == [("r1", [job], [0], 0)]
    assert await repo.pool.fetchval("SELECT count(*) FROM dispatcher.outbox") == 0


async def test_the_relay_publishes_at_most_a_window_ahead_of_the_claims(
    repo: JobRepository, relay: RelayRepository
) -> None:
    await enqueue(repo, [f"k{i}" for i in range(10)])
    leased = await lease(relay, 4)
    assert len(leased) == 4
    # published and not yet handled counts against the window, whoever published it
    assert await lease(relay, 4) == []
    assert await lease(relay, 4, "r2") == []
    # two messages handled: their jobs started, their records gone, two more may go out
    claimed = await claim(relay, leased[:2])
    assert len(claimed.jobs) == 2
    assert len(await messages(repo.pool)) == 2
    assert len(await lease(relay, 4)) == 2
    # a queue not named is not published at all (its broker queue may not exist here)
    assert await relay.lease_outbox({"other": 100}, {"other": 1}, 100, "r1") == []


async def test_a_message_leaves_the_window_with_its_last_job_handled(
    repo: JobRepository, relay: RelayRepository
) -> None:
    """A message of three jobs: one started, one a stale delivery (no longer ready for its
    attempt: handled, a duplicate), one held back by the limits (not handled: the consumer
    offers it again). The window frees the two handled; the record goes with the third."""
    await repo.sync_registry(
        {"default": (3, 3600)}, {"work": ("python", 1)}, limits={"default": (0.001, 1, None)}
    )
    *_, last = await enqueue(repo, ["a", "b", "c", "d"])
    first, stale, held = await lease(relay, 3, per=3)
    claimed = await claim(relay, [first, stale._replace(attempt=7), held])
    assert [j.id for j in claimed.jobs] == [first.job_id]
    assert claimed.eligible == {first.job_id, held.job_id}
    assert [m[3] for m in await messages(repo.pool)] == [2]
    # two places free: the last job goes out
    assert [r.job_id for r in await lease(relay, 3, per=3)] == [last]
    # the held job offered again, still held: nothing more counted
    assert (await claim(relay, [held])).jobs == []
    assert [m[3] for m in await messages(repo.pool)] == [2, 0]
    # then no longer ready (cancelled meanwhile): handled, and its message done with
    await repo.pool.execute(
        "UPDATE dispatcher.job_state SET state = 'cancelled' WHERE id = $1", held.job_id
    )
    assert (await claim(relay, [held])).eligible == set()
    assert [m[1] for m in await messages(repo.pool)] == [[last]]


async def test_a_second_delivery_the_consumer_dropped_is_counted_in_its_message(
    repo: JobRepository, relay: RelayRepository
) -> None:
    """A job published twice (a gone daemon's message given back while the broker kept it)
    arrives twice in one claim: the consumer claims one and drops the other, whose message is
    counted handled all the same (uncounted, it held its place in the window until the sweep,
    and a queue of a small window stalled: 1 start in 10 s, tests/e2e/test_limits_change.py)."""
    (job,) = await enqueue(repo, ["a"])
    [first] = await lease(relay, 10)
    second = await repo.pool.fetchval(
        "INSERT INTO dispatcher.outbox_messages (queue, relay, jobs, job_ids, attempts)"
        " VALUES ('default', 'r2', 1, ARRAY[$1::bigint], ARRAY[0]) RETURNING id",
        job,
    )
    claimed = await relay.claim_delivered(
        "default",
        [(job, 0)],
        CAPABILITIES,
        "d1",
        60,
        messages=[first.message],
        duplicates=[second],
    )
    assert [j.id for j in claimed.jobs] == [job]
    assert await messages(repo.pool) == []


async def test_the_relay_publishes_fairly_across_tenants(
    repo: JobRepository, relay: RelayRepository
) -> None:
    await enqueue(repo, [f"big{i}" for i in range(200)], tenant="big")
    [small] = await enqueue(repo, ["small"], tenant="small")
    leased = await lease(relay, 4)
    assert len(leased) <= 4
    assert small in {r.job_id for r in leased}


async def age(pool: asyncpg.Pool, seconds: float) -> None:
    """Every message recorded as published `seconds` ago."""
    await pool.execute(
        "UPDATE dispatcher.outbox_messages SET published_at = now() - make_interval(secs => $1)",
        seconds,
    )


async def test_the_sweep_publishes_lost_messages_again_and_forgets_handled_ones(
    repo: JobRepository, relay: RelayRepository
) -> None:
    lost, slow, done = await enqueue(repo, ["lost", "slow", "done"])
    by_job = {r.job_id: r for r in await lease(relay, 10, per=2)}  # [lost, slow], [done]
    # `done` started through another message (published again, say) while this one was out
    await relay.claim_delivered("default", [(done, 0)], CAPABILITIES, "d2", 60)
    await age(repo.pool, 30)
    assert await relay.sweep_unclaimed(60, 100) == {}  # not lost yet
    # `slow`'s was only slow: it started meanwhile, so only `lost` goes out again
    await claim(relay, [by_job[slow]])
    await age(repo.pool, 90)
    assert await relay.sweep_unclaimed(60, 100) == {"default": (1, 2)}
    assert await to_publish(repo.pool) == [lost]
    assert await messages(repo.pool) == []
    # back to the pick: the relay publishes it again, as the attempt it is still ready after
    again = await lease(relay, 10, "r2")
    assert [(r.job_id, r.attempt) for r in again] == [(lost, 0)]
    assert await relay.sweep_unclaimed(60, 100) == {}


async def test_a_message_handled_but_not_counted_leaves_the_window_after_the_confirm_timeout(
    repo: JobRepository, relay: RelayRepository
) -> None:
    """A rolling upgrade: a consumer of an earlier release claims what this release's relay
    published without counting it in the message's record. Its window would stay full until
    republish_after_s; the sweep forgets such a message once it is older than the confirm
    timeout and none of its jobs is still ready for it (one still ready waits: not lost yet)."""
    started, waiting = await enqueue(repo, ["started", "waiting"])
    leased = await lease(relay, 2)
    await relay.claim_delivered("default", [(started, 0)], CAPABILITIES, "old-daemon", 60)
    assert len(await messages(repo.pool)) == 2 and await lease(relay, 2) == []
    await age(repo.pool, 40)
    assert await relay.sweep_unclaimed(300, 100, 60) == {}  # younger than the confirm timeout
    assert await relay.sweep_unclaimed(300, 100, 30) == {"default": (0, 1)}
    assert [m[1] for m in await messages(repo.pool)] == [[waiting]]
    assert [r.job_id for r in leased] == [started, waiting]


async def test_an_earlier_releases_leased_rows_are_swept_after_their_lease(
    repo: JobRepository, relay: RelayRepository
) -> None:
    """A rolling upgrade: a relay before migration 054 leased the rows it published (leased_by,
    migration 052), and before 052 marked them published once confirmed. Neither is released
    nor published again before the sweep's age; then it goes back to the pick. The claim of
    such a message deletes its job's row, as that release's claim did."""
    marked, leased, started = await enqueue(repo, ["marked", "leased", "started"])
    await repo.pool.execute(
        "UPDATE dispatcher.outbox SET leased_until = now() - interval '1 s',"
        " published_at = now() - interval '30 s' WHERE job_id = $1",
        marked,
    )
    await repo.pool.execute(
        "UPDATE dispatcher.outbox SET leased_until = now() + interval '1 h', leased_by = 'old'"
        " WHERE job_id = ANY ($1::bigint[])",
        [leased, started],
    )
    # its message names no record: the claim deletes the row, as that release's claim did
    claimed = await relay.claim_delivered("default", [(started, 0)], CAPABILITIES, "d1", 60)
    assert [j.id for j in claimed.jobs] == [started]
    assert (
        await repo.pool.fetchval(
            "SELECT count(*) FROM dispatcher.outbox WHERE job_id = $1", started
        )
        == 0
    )
    assert await relay.release_outbox(100) == 0
    assert await lease(relay, 10) == []
    assert await relay.sweep_unclaimed(60, 100) == {}
    assert await relay.sweep_unclaimed(20, 100) == {"default": (1, 0)}
    await repo.pool.execute(
        "UPDATE dispatcher.outbox SET leased_until = now() - interval '1 s' WHERE leased_by = 'old'"
    )
    assert await relay.sweep_unclaimed(60, 100) == {"default": (1, 0)}
    assert await to_publish(repo.pool) == [marked, leased]


async def test_a_consumers_lease_that_ran_out_is_released(
    repo: JobRepository, relay: RelayRepository
) -> None:
    (job,) = await enqueue(repo, ["a"])
    # a consumer's lease (a refused delivery's row, held until it is due again): nobody's
    await repo.pool.execute("UPDATE dispatcher.outbox SET leased_until = now() + interval '1 h'")
    assert await relay.release_outbox(100) == 0  # its lease still runs
    assert await lease(relay, 10) == []
    await repo.pool.execute("UPDATE dispatcher.outbox SET leased_until = now() - interval '1 s'")
    # the pick reads only rows no relay holds (migration 041): not taken until released
    assert await lease(relay, 10) == []
    assert await relay.release_outbox(100) == 1
    again = await lease(relay, 10)
    assert [(r.job_id, r.attempt) for r in again] == [(job, 0)]


async def test_a_relay_gives_back_only_its_own_unconfirmed_messages(
    repo: JobRepository, relay: RelayRepository
) -> None:
    a, b, c = await enqueue(repo, ["a", "b", "c"])
    [first] = await lease(relay, 1, batch=1)
    # another relay's message: left as it is
    await relay.give_back([first.message], "r2")
    assert (await to_publish(repo.pool), len(await messages(repo.pool))) == ([b, c], 1)
    await relay.give_back([first.message], "r1")
    assert (await to_publish(repo.pool), await messages(repo.pool)) == ([a, b, c], [])
    leased = await lease(relay, 10, "r2", per=3)
    assert sorted(r.job_id for r in leased) == [a, b, c]
    # a job a claim started meanwhile (the message was delivered before its confirm failed) and
    # a job that ended are not published again; the one still ready is
    await claim(relay, [r for r in leased if r.job_id == a])
    await repo.pool.execute("UPDATE dispatcher.job_state SET state = 'cancelled' WHERE id = $1", b)
    await relay.give_back([leased[0].message], "r2")
    assert (await to_publish(repo.pool), await messages(repo.pool)) == ([c], [])


async def test_the_messages_of_a_gone_daemons_relay_go_back_to_the_pick_at_its_rescue(
    repo: JobRepository, relay: RelayRepository
) -> None:
    """A daemon killed between its relay's lease and the broker's confirm leaves messages
    recorded that may never have reached the broker; once its liveness lock is gone, the
    due-scan's rescue gives them back (a daemon whose lock is held keeps its messages, as it
    keeps its running jobs), as it does the rows an earlier release's relay leased."""
    dead, alive, old, other = await enqueue(repo, ["dead", "alive", "old", "other"])
    [d] = await lease(relay, 1, "gone-daemon", batch=1)
    [a] = await lease(relay, 2, "living-daemon", batch=1)
    assert (d.job_id, a.job_id) == (dead, alive)
    await repo.pool.execute(
        "UPDATE dispatcher.outbox SET leased_until = now() + interval '1 h',"
        " leased_by = 'gone-daemon' WHERE job_id = $1",
        old,
    )
    async with repo.pool.acquire() as lock:
        await lock.execute(
            "SELECT pg_advisory_lock(dispatcher.liveness_namespace(),"
            " dispatcher.liveness_key('living-daemon'))"
        )
        await repo.rescue(100, ())  # no owner gone: nothing given back
        assert await to_publish(repo.pool) == [other]
        await repo.rescue(100, ["gone-daemon", "living-daemon"])
        assert await to_publish(repo.pool) == [dead, old, other]
        assert [m[0] for m in await messages(repo.pool)] == ["living-daemon"]
        await lock.execute("SELECT pg_advisory_unlock_all()")
    # picked again, by any relay, as the attempt it is still ready after
    again = await lease(relay, 10)
    assert sorted((r.job_id, r.attempt) for r in again) == [(dead, 0), (old, 0), (other, 0)]


async def test_a_confirmed_message_names_no_relay_so_its_daemons_rescue_gives_it_no_second_time(
    repo: JobRepository, relay: RelayRepository
) -> None:
    """The broker's confirm is recorded (record_confirmed: an idle relay's, a stopping one's):
    the message is in the broker, to be claimed by the others; the rescue after its daemon's
    end, a stop or a kill, gives back only the message whose confirm was not recorded (before,
    every message a killed daemon had recorded was published a second time)."""
    confirmed, unconfirmed = await enqueue(repo, ["confirmed", "unconfirmed"])
    [first] = await lease(relay, 1, "dying-daemon", batch=1)
    [second] = await lease(relay, 2, "dying-daemon", batch=1)
    # only its own relay's messages: another relay's word records nothing
    assert await relay.record_confirmed("another-daemon", [first.message]) == 0
    assert await relay.record_confirmed("dying-daemon", [first.message, 10**12]) == 1
    await repo.rescue(100, ["dying-daemon"])
    assert await to_publish(repo.pool) == [unconfirmed]
    assert await messages(repo.pool) == [("", [confirmed], [0], 0)]
    # still the sweep's, should the broker lose it
    await age(repo.pool, 90)
    assert await relay.sweep_unclaimed(60, 100) == {"default": (1, 0)}
    assert (first.job_id, second.job_id) == (confirmed, unconfirmed)


async def test_a_confirm_skips_a_record_a_claim_holds_rather_than_wait_for_it(
    repo: JobRepository, relay: RelayRepository
) -> None:
    """A record a claim holds (counting its jobs) is left naming the relay: a duplicate after
    a kill at worst, where waiting could deadlock with a claim counting records in another
    order."""
    a, b = await enqueue(repo, ["a", "b"])
    [first] = await lease(relay, 1, batch=1)
    [second] = await lease(relay, 2, batch=1)
    async with repo.pool.acquire() as claim_holds, claim_holds.transaction():
        await claim_holds.execute(
            "SELECT 1 FROM dispatcher.outbox_messages WHERE id = $1 FOR UPDATE", second.message
        )
        assert await relay.record_confirmed("r1", [first.message, second.message]) == 1
    assert await messages(repo.pool) == [("", [a], [0], 0), ("r1", [b], [0], 0)]


async def test_the_sweep_leaves_a_paused_queue_alone(
    repo: JobRepository, relay: RelayRepository
) -> None:
    await enqueue(repo, ["a"])
    await lease(relay, 10)
    await age(repo.pool, 90)
    await repo.set_queue_paused("default", True)
    assert await relay.sweep_unclaimed(60, 100) == {}
    await repo.set_queue_paused("default", False)
    assert await relay.sweep_unclaimed(60, 100) == {"default": (1, 0)}


async def test_a_claim_counts_a_stale_delivery_as_handled_and_writes_no_outbox_row(
    repo: JobRepository, relay: RelayRepository
) -> None:
    [started, _] = await enqueue(repo, ["started", "other"])
    leased = await lease(relay, 10, per=2)
    # `other`'s delivery is stale (published after an attempt it is no longer ready after): a
    # duplicate, handled; so its message is done with
    claimed = await claim(relay, [leased[0], leased[1]._replace(attempt=7)])
    assert [j.id for j in claimed.jobs] == [started]
    assert claimed.eligible == {started}
    assert await messages(repo.pool) == []
    assert await repo.pool.fetchval("SELECT count(*) FROM dispatcher.outbox") == 0


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


@pytest.fixture(scope="module")
async def big_outbox(
    module_pools: Callable[[], Awaitable[asyncpg.Pool]],
) -> tuple[asyncpg.Pool, list[OutboxLease]]:
    """30,000 ready jobs with outbox rows, 4,000 of them taken by a relay (published, 40
    messages): enough rows to tempt the planner into scanning a whole table instead of probing
    it per delivery. The statistics are those of the empty tables (taken before the jobs
    arrived, as when a burst outruns autovacuum's analyze): what the planner then believes
    about ready rows is wrong. Built once for the module's plan tests, which only plan
    (EXPLAIN); no autovacuum analyze meanwhile."""
    pool = await module_pools()
    repo = JobRepository(pool)
    await repo.sync_registry({"default": (3, 3600)}, {"work": ("python", 1)})
    for table in ("intents", "job_state", "outbox", "outbox_messages"):
        await pool.execute(f"ALTER TABLE dispatcher.{table} SET (autovacuum_enabled = false)")
    await pool.execute(
        "ANALYZE dispatcher.intents, dispatcher.job_state, dispatcher.outbox,"
        " dispatcher.outbox_messages"
    )
    await pool.execute(f"""
        SELECT count(*) FROM dispatcher.enqueue_many(
               (SELECT array_agg('k' || g) FROM generate_series(1, {ROWS}) g),
               array_fill('work'::text, ARRAY[{ROWS}]),
               array_fill('{{}}'::jsonb, ARRAY[{ROWS}]))""")
    await enqueue(repo, [])  # the outbox rows, whatever intake wrote
    leased = await RelayRepository(pool).lease_outbox(
        {"default": 4000}, {"default": 100}, 4000, "r1"
    )
    return pool, leased


async def plan(pool: asyncpg.Pool, name: str, *args: object) -> str:
    async with pool.acquire() as conn, conn.transaction():
        rows = await conn.fetch("EXPLAIN " + query(name), *args)
        return "\n".join(r[0] for r in rows)


async def test_the_consumers_claim_probes_by_key_at_any_table_size(
    big_outbox: tuple[asyncpg.Pool, list[OutboxLease]],
) -> None:
    pool, published = big_outbox
    delivered = published[:1000]
    text = await plan(
        pool,
        "claim_delivered",
        "default",
        [r.job_id for r in delivered],
        [0] * 1000,
        "o",
        60.0,
        CAPS,
        2**62,
        True,
        [r.message for r in delivered],
        [],
    )
    for table in ("intents", "job_state", "outbox", "outbox_messages"):
        assert f"Seq Scan on {table}" not in text, text
    # the started jobs by primary key, not by walking the index of every ready job
    assert "jobs_ready_claim" not in text, text


async def test_the_relay_and_its_sweep_never_scan_the_job_tables(
    big_outbox: tuple[asyncpg.Pool, list[OutboxLease]],
) -> None:
    pool = big_outbox[0]
    for name, args in (
        ("lease_outbox", (["default"], [8000], [100], 500, [None], [None], "r1")),
        ("sweep_unclaimed", (300.0, 500)),
        ("sweep_lost_messages", (300.0, 500, 30.0)),
        ("give_back_messages", ([1, 2], "r1")),
        ("release_outbox", (500,)),
        ("release_gone_relays", (["host:1:gone"],)),
    ):
        text = await plan(pool, name, *args)
        for table in ("intents", "job_state"):
            assert f"Seq Scan on {table}" not in text, (name, text)
    # the sweep of an earlier release's rows walks only the relayed rows (a partial index),
    # never the whole outbox
    assert "Seq Scan on outbox" not in await plan(pool, "sweep_unclaimed", 300.0, 500)
    # the release of run-out leases too: it runs a few times a second (migration 041)
    assert "Seq Scan on outbox" not in await plan(pool, "release_outbox", 500)
    # the window's count and the sweep of lost messages walk a queue's messages by index
    for name, args in (
        ("lease_outbox", (["default"], [8000], [100], 500, [None], [None], "r1")),
        ("sweep_lost_messages", (300.0, 500, 30.0)),
    ):
        text = await plan(pool, name, *args)
        assert "outbox_messages_queue" in text, (name, text)


async def test_a_daemons_start_gives_an_outbox_row_only_to_ready_jobs_no_message_carries(
    repo: JobRepository, relay: RelayRepository
) -> None:
    """A RabbitMQ daemon's start writes the intake settings, which give each ready job without
    an outbox row one (a switch from the in-process transport). A job a message carries has
    none (the lease deleted it when it made the message) and must get none: each start would
    publish every waiting message's jobs a second time (seen as duplicate deliveries after a
    SIGTERM and a restart). A record of the job's earlier attempt does not carry it."""
    carried, retried, bare = await enqueue(repo, ["carried", "retried", "bare"])
    await lease(relay, 10, "r1")
    assert await to_publish(repo.pool) == []
    # `retried` is ready again for its next attempt: its message is for the one before
    await repo.pool.execute(
        "UPDATE dispatcher.job_state SET attempt = 1 WHERE id = $1", retried
    )  # fmt: skip
    # `bare` became ready without a row (an in-process daemon's due-scan, say)
    await repo.pool.execute("DELETE FROM dispatcher.outbox_messages WHERE $1 = ANY (job_ids)", bare)
    for _ in range(2):  # a start, then a restart
        await repo.sync_registry(
            {"default": (3, 3600)},
            {"work": ("python", 1)},
            due_at_past_tolerance_s=300.0,
            ready_outbox=True,
        )
    assert await to_publish(repo.pool) == [retried, bare]
    assert carried not in await to_publish(repo.pool)
