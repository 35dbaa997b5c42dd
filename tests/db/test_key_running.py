"""Each limited key's count of running jobs (dispatcher.key_state.running_seen, migration 040) on
real PostgreSQL: a claim reads it instead of counting running jobs by index, so every path that
moves a job into or out of `running` must keep it, and a change of the key's limits must have it
counted again. After each path the count equals the truth (the key's running jobs), and the key
starts exactly what its cap leaves it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import asyncpg
import pytest

from dispatcher.db.bulk import BulkStore, Move
from dispatcher.db.jobs import JobRepository
from dispatcher.db.relay import RelayRepository
from dispatcher.model import Job
from tests.db.test_global_limits import CAPABILITIES
from tests.db.test_key_limits import claim, running_by_key, setup

CAP = 3


async def counts(pool: asyncpg.Pool) -> dict[str, tuple[int | None, int]]:
    """Each key's kept count (its starts less its ends) beside its running jobs counted now."""
    rows = await pool.fetch(
        "SELECT k.key, (k.running_seen - coalesce(d.n, 0))::int AS running_seen,"
        "       (SELECT count(*) FROM dispatcher.job_state s WHERE s.queue = k.queue"
        "           AND s.state = 'running' AND s.concurrency_key = k.key)::int AS truth"
        "  FROM dispatcher.key_state k"
        "  LEFT JOIN dispatcher.key_done d ON d.queue = k.queue AND d.key = k.key"
        " ORDER BY k.key"
    )
    return {r["key"]: (r["running_seen"], r["truth"]) for r in rows}


async def assert_kept(pool: asyncpg.Pool) -> None:
    seen = await counts(pool)
    assert seen and all(kept == truth for kept, truth in seen.values()), seen


async def started(repo: JobRepository, n: int, owner: str = "d0") -> list[Job]:
    jobs, *_ = await repo.claim_limited("default", n, CAPABILITIES, owner, 60)
    return jobs


async def fail(repo: JobRepository, job: Job, permanent: bool) -> None:
    await repo.record_failure(job, "d0", permanent=permanent, delay_s=60, error="no", reason=None)


async def snooze(repo: JobRepository, job: Job) -> None:
    await repo.snooze(job, "d0", delay_s=60, until=None, reason="later", max_snoozes=5)


async def expire_lease(repo: JobRepository, job: Job) -> None:
    await repo.pool.execute(
        "UPDATE dispatcher.job_state SET lease_expires_at = now() - interval '1 second'"
        " WHERE id = $1",
        job.id,
    )
    await repo.rescue(100, ())


async def delete(repo: JobRepository, job: Job) -> None:
    await repo.pool.execute("DELETE FROM dispatcher.jobs WHERE id = $1", job.id)


async def bulk(action: str, repo: JobRepository, job: Job) -> None:
    async with BulkStore(repo.pool).walker() as walker, walker.transaction():
        await walker.move(Move(action, [job.id], None, ("running",)))


PATHS: dict[str, Callable[[JobRepository, Job], Awaitable[object]]] = {
    "complete": lambda repo, job: repo.complete([job.id], [job.attempt], [None], "d0"),
    "retry": lambda repo, job: fail(repo, job, permanent=False),
    "dead": lambda repo, job: fail(repo, job, permanent=True),
    "snooze": snooze,
    "drain release": lambda repo, job: repo.release_leases([(job.id, job.attempt)], "d0"),
    "lease expired": expire_lease,
    "owner gone": lambda repo, job: repo.rescue(100, ["d0"]),
    "deleted": delete,
    # a running job cancelled in bulk finishes its attempt (its slot stays taken till then)
    "bulk cancel": lambda repo, job: bulk("cancel", repo, job),
}


@pytest.mark.parametrize("path", PATHS)
async def test_every_path_out_of_running_gives_the_key_its_slot_back(
    repo: JobRepository, path: str
) -> None:
    await setup(repo, (None, None, CAP), {"a": 10, "b": 10})
    first = await started(repo, 20)
    assert len(first) == 2 * CAP
    await assert_kept(repo.pool)
    assert await counts(repo.pool) == {"a": (CAP, CAP), "b": (CAP, CAP)}
    job = next(j for j in first if j.tenant == "a")
    await PATHS[path](repo, job)
    await assert_kept(repo.pool)
    # whichever way the job left, the next claim fills a's cap again, and no more
    await started(repo, 20)
    assert await running_by_key(repo.pool) == {"a": CAP, "b": CAP}
    assert await counts(repo.pool) == {"a": (CAP, CAP), "b": (CAP, CAP)}


async def test_the_rabbitmq_claim_and_its_completion_keep_the_count(repo: JobRepository) -> None:
    await setup(repo, (None, None, CAP), {"a": 6})
    relay = RelayRepository(repo.pool)
    await repo.pool.execute("UPDATE dispatcher.intake_settings SET ready_outbox = true")
    rows = await repo.pool.fetch("SELECT id, attempt FROM dispatcher.jobs ORDER BY id")
    delivered = [(r["id"], r["attempt"]) for r in rows]
    claimed = await relay.claim_delivered("default", delivered, CAPABILITIES, "d0", 60)
    assert len(claimed.jobs) == CAP
    assert await counts(repo.pool) == {"a": (CAP, CAP)}
    job = claimed.jobs[0]
    await repo.complete([job.id], [job.attempt], [None], "d0")
    assert await counts(repo.pool) == {"a": (CAP - 1, CAP - 1)}
    again = await relay.claim_delivered("default", delivered, CAPABILITIES, "d1", 60)
    assert len(again.jobs) == 1
    await assert_kept(repo.pool)


async def test_a_limits_change_has_the_keys_counted_again(repo: JobRepository) -> None:
    # jobs started while the queue limited no key were never counted: when key limits arrive,
    # the next claim counts them, and the cap holds at once
    await setup(repo, (None, None, None), {"a": 10})
    assert len(await claim(repo, 4)) == 4
    await repo.pool.execute("UPDATE dispatcher.queues SET key_max_inflight = 5")
    assert len(await claim(repo, 10)) == 1
    assert await counts(repo.pool) == {"a": (5, 5)}
    # an override changes the key's limits: counted again, from the truth
    await repo.pool.execute(
        "INSERT INTO dispatcher.key_limits (queue, key, max_inflight) VALUES ('default', 'a', 6)"
    )
    assert await counts(repo.pool) == {"a": (None, 5)}
    assert len(await claim(repo, 10)) == 1
    assert await counts(repo.pool) == {"a": (6, 6)}


async def test_a_count_not_known_is_left_alone_by_the_statements_that_move_jobs(
    repo: JobRepository,
) -> None:
    await setup(repo, (None, None, CAP), {"a": 10})
    jobs = await started(repo, 10)
    await repo.pool.execute("UPDATE dispatcher.key_state SET running_seen = NULL")
    await repo.complete([jobs[0].id], [jobs[0].attempt], [None], "d0")
    assert await counts(repo.pool) == {"a": (None, CAP - 1)}
    assert len(await started(repo, 10)) == 1  # counted again under the key's lock
    assert await counts(repo.pool) == {"a": (CAP, CAP)}


async def test_concurrent_claims_and_completions_keep_every_count_and_cap(
    repo: JobRepository,
) -> None:
    # four claimers that each complete what they started, in turns that overlap: the counts
    # are written by claims and completions of other connections at the same time, their key
    # rows locked in key order by both (no deadlock), and no key ever runs more than its cap
    await setup(repo, (None, None, CAP), {f"k{i}": 30 for i in range(6)})

    async def worker(owner: str) -> None:
        for _ in range(15):
            jobs = await started(repo, 10, owner)
            if jobs:
                await repo.complete(
                    [j.id for j in jobs], [j.attempt for j in jobs], [None] * len(jobs), owner
                )

    async def watch() -> None:
        for _ in range(30):
            assert all(n <= CAP for n in (await running_by_key(repo.pool)).values())
            await asyncio.sleep(0)

    await asyncio.gather(*(worker(f"d{i}") for i in range(4)), watch())
    await assert_kept(repo.pool)
    done = "SELECT count(*) FROM dispatcher.jobs WHERE state = 'succeeded'"
    assert await repo.pool.fetchval(done) > 0


async def test_an_end_the_count_missed_is_repaired_by_the_next_recount(
    repo: JobRepository,
) -> None:
    # The drift: key limits arrive while a job of the key finishes. Its completion runs before
    # the key has a row (so it counts no end), and commits after the key's first claim counted
    # it running: the kept count stays one too high, the key starts one job fewer than its cap.
    # A count older than dispatcher.key_recount_after() is counted again at the key's next
    # claim (and keys_at_limit does not skip the key for it), so the drift lasts that long.
    await setup(repo, (None, None, None), {"a": 10})
    first = await started(repo, 2)
    await repo.pool.execute("UPDATE dispatcher.queues SET key_max_inflight = $1", CAP)
    async with repo.pool.acquire() as finishing, finishing.transaction():
        await finishing.execute(
            "UPDATE dispatcher.job_state SET state = 'succeeded', finished_at = now(),"
            "       lease_owner = NULL, lease_expires_at = NULL WHERE id = $1",
            first[0].id,
        )
        # the key's first claim: its count reads the finishing job as running
        assert len(await started(repo, 10)) == CAP - 2
    assert await counts(repo.pool) == {"a": (CAP, CAP - 1)}  # the drift
    assert await started(repo, 10) == []  # one slot lost while the count is young
    await repo.pool.execute(
        "UPDATE dispatcher.key_state SET counted_at = counted_at - dispatcher.key_recount_after()"
    )
    assert len(await started(repo, 10)) == 1
    assert await counts(repo.pool) == {"a": (CAP, CAP)}
    await assert_kept(repo.pool)


async def test_a_job_the_claim_ends_expired_is_not_counted_running(repo: JobRepository) -> None:
    # claim_ready's key_take counts the starts of the jobs it keeps; one of them past its time
    # to live is ended by the same statement instead (dead, expired): the trigger counts it
    # as an end, so the key keeps its whole cap
    await setup(repo, (None, None, CAP), {"a": 10})
    await repo.pool.execute(
        "UPDATE dispatcher.job_state SET expires_at = now() - interval '1 second'"
        " WHERE id = (SELECT min(id) FROM dispatcher.job_state)"
    )
    assert len(await started(repo, CAP)) == CAP - 1
    assert (
        await repo.pool.fetchval(
            "SELECT count(*) FROM dispatcher.jobs WHERE dead_reason = 'expired'"
        )
        == 1
    )
    await assert_kept(repo.pool)
    assert len(await started(repo, 10)) == 1
    assert await counts(repo.pool) == {"a": (CAP, CAP)}
