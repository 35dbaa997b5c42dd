"""The SQL door's contracts of issue 23: a key whose job was pruned answers with that job and
creates nothing (the key ledger, migration 029), and each job's payload and target are held to
limits.max_payload_bytes, through `dispatcher.enqueue`, `dispatcher.enqueue_many` and the
daemon's door `enqueue_many_internal`."""

from __future__ import annotations

import json

import asyncpg
import pytest

from dispatcher.config.settings import RetentionSettings
from dispatcher.db.jobs import JobRepository
from dispatcher.engine.pruning import Pruner
from dispatcher.model import ByteGrant, NewJob

MANY = """SELECT r.ord, r.id, r.state, r.outcome, r.due_at FROM dispatcher.enqueue_many(
              $1::text[], $2::text[], $3::text[]::jsonb[]) r ORDER BY r.ord"""


@pytest.fixture(autouse=True)
async def registry(repo: JobRepository) -> None:
    await repo.sync_registry(
        {"default": (10, 86_400)},
        {"report": ("python", 1)},
        due_at_past_tolerance_s=300,
        max_payload_bytes=4096,
    )


async def finish_and_prune(conn: asyncpg.Connection, repo: JobRepository, state: str) -> None:
    """Every job ends `state` long ago, and the pruner runs (as it would weeks later)."""
    await conn.execute(
        "UPDATE dispatcher.job_state SET state = $1, finished_at = now() - interval '40 days'",
        state,
    )
    await Pruner(repo, RetentionSettings()).run_once()
    assert await conn.fetchval("SELECT count(*) FROM dispatcher.jobs") == 0


async def test_enqueue_of_a_pruned_key_returns_the_original_job(
    conn: asyncpg.Connection, repo: JobRepository
) -> None:
    first = await conn.fetchval("SELECT dispatcher.enqueue('k', 'report', '{\"n\": 1}'::jsonb)")
    await finish_and_prune(conn, repo, "succeeded")
    again = await conn.fetchval("SELECT dispatcher.enqueue('k', 'report', '{\"n\": 1}'::jsonb)")
    assert again == first
    assert await conn.fetchval("SELECT count(*) FROM dispatcher.jobs") == 0
    assert await conn.fetchval("SELECT count(*) FROM dispatcher.intents") == 0
    with pytest.raises(asyncpg.UniqueViolationError, match=f"named job {first} .succeeded"):
        await conn.fetchval("SELECT dispatcher.enqueue('k', 'report', '{\"n\": 2}'::jsonb)")


async def test_enqueue_many_answers_pruned_keys_item_by_item(
    conn: asyncpg.Connection, repo: JobRepository
) -> None:
    rows = await conn.fetch(MANY, ["a", "b"], ["report", "report"], ['{"n": 1}', '{"n": 2}'])
    ids = {r["ord"]: r["id"] for r in rows}
    await finish_and_prune(conn, repo, "dead")
    rows = await conn.fetch(
        MANY,
        ["a", "b", "c", "a"],
        ["report"] * 4,
        ['{"n": 1}', '{"n": 9}', '{"n": 3}', '{"n": 1}'],
    )
    got = [(r["ord"], r["outcome"], r["state"]) for r in rows]
    assert got == [
        (1, "pruned", "dead"),
        (2, "conflict", "dead"),
        (3, "created", "ready"),
        (4, "pruned", "dead"),
    ]
    assert rows[0]["id"] == ids[1] and rows[1]["id"] == ids[2] and rows[0]["due_at"] is None
    keys = await conn.fetch("SELECT key FROM dispatcher.jobs")
    assert [k["key"] for k in keys] == ["c"]


async def test_the_daemons_door_answers_pruned(
    conn: asyncpg.Connection, repo: JobRepository
) -> None:
    (created,) = await repo.enqueue_many([NewJob(key="d", handler="report", payload={})])
    await finish_and_prune(conn, repo, "cancelled")
    results = await repo.enqueue_many(
        [
            NewJob(key="d", handler="report", payload={}),
            NewJob(key="e", handler="report", payload={}),
        ]
    )
    first = results[0]
    assert (first.outcome, first.id, first.state) == ("pruned", created.id, "cancelled")
    assert results[1].outcome == "created"
    assert await conn.fetchval("SELECT count(*) FROM dispatcher.jobs") == 1


async def test_a_payload_over_the_limit_is_refused_at_the_sql_door(
    conn: asyncpg.Connection,
) -> None:
    big = json.dumps({"pad": "x" * 5000})
    with pytest.raises(asyncpg.ProgramLimitExceededError) as caught:
        await conn.fetchval("SELECT dispatcher.enqueue('big', 'report', $1::jsonb)", big)
    assert "key 'big'" in str(caught.value)
    assert "are 5011 bytes of JSON, over limits.max_payload_bytes (4096)" in str(caught.value)
    with pytest.raises(asyncpg.ProgramLimitExceededError, match=r"key 'big' \(item 2\)"):
        await conn.fetch(MANY, ["ok", "big"], ["report", "report"], ["{}", big])
    # escapes count as the text the daemon receives: 800 control characters are 4,800 bytes
    escaped = json.dumps({"c": "\u0001" * 800})
    with pytest.raises(asyncpg.ProgramLimitExceededError, match="4809 bytes"):
        await conn.fetchval("SELECT dispatcher.enqueue('esc', 'report', $1::jsonb)", escaped)
    assert await conn.fetchval("SELECT count(*) FROM dispatcher.jobs") == 0
    fits = json.dumps({"pad": "x" * (4096 - 11)})
    assert await conn.fetchval("SELECT dispatcher.enqueue('fits', 'report', $1::jsonb)", fits)


async def test_the_batch_door_refuses_an_item_over_the_limit_on_every_path_of_its_insert(
    conn: asyncpg.Connection, repo: JobRepository
) -> None:
    """The batch door measures its items as the insert writes them (migration 058); an item over
    the limit is refused, nothing written, whichever way the insert went: every item created, a
    key already taken, or a refusal for another reason due (the size's comes first, as when the
    door measured every item before the insert)."""
    big = json.dumps({"pad": "x" * 5000})
    await conn.fetchval("SELECT dispatcher.enqueue('taken', 'report')")
    # a key taken: the insert creates nothing, the items are looked up one by one
    for keys, payloads, item in (
        (["taken", "big"], ["{}", big], 2),
        (["big", "taken"], [big, "{}"], 1),
    ):
        with pytest.raises(asyncpg.ProgramLimitExceededError, match=rf"'big' \(item {item}\)"):
            await conn.fetch(MANY, keys, ["report", "report"], payloads)
    with pytest.raises(asyncpg.ProgramLimitExceededError, match=r"key 'taken' \(item 1\)"):
        await conn.fetch(MANY, ["taken"], ["report"], [big])
    # a key the door refuses, a due time out of range: the size's refusal first
    with pytest.raises(asyncpg.ProgramLimitExceededError, match=r"key 'big' \(item 1\)"):
        await conn.fetch(MANY, ["big", "caf\u00e9"], ["report", "report"], [big, "{}"])
    with pytest.raises(asyncpg.ProgramLimitExceededError, match=r"key 'big' \(item 2\)"):
        await conn.fetch(
            "SELECT * FROM dispatcher.enqueue_many($1::text[], $2::text[], $3::text[]::jsonb[],"
            " ARRAY['infinity', NULL]::timestamptz[])",
            ["far", "big"],
            ["report", "report"],
            ["{}", big],
        )
    # a limit under the size at which the insert's own measure sends items to be rendered again
    await repo.sync_registry(
        {"default": (10, 86_400)},
        {"report": ("python", 1)},
        due_at_past_tolerance_s=300,
        max_payload_bytes=2048,
    )
    mid = json.dumps({"pad": "x" * 3000})
    with pytest.raises(asyncpg.ProgramLimitExceededError, match=r"key 'mid' \(item 2\)"):
        await conn.fetch(MANY, ["ok", "mid"], ["report", "report"], ["{}", mid])
    assert await conn.fetchval("SELECT count(*) FROM dispatcher.jobs") == 1
    fits = json.dumps({"pad": "x" * (2048 - 11)})
    rows = await conn.fetch(MANY, ["ok", "fits"], ["report", "report"], ["{}", fits])
    assert [r["outcome"] for r in rows] == ["created", "created"]
    # under a large limit, an item long enough to hold a number the daemon cannot read
    await repo.sync_registry(
        {"default": (10, 86_400)},
        {"report": ("python", 1)},
        due_at_past_tolerance_s=300,
        max_payload_bytes=65_536,
    )
    with pytest.raises(asyncpg.NumericValueOutOfRangeError, match=r"'amp' \(item 2\)"):
        await conn.fetch(MANY, ["ok2", "amp"], ["report", "report"], ["{}", '{"n": 1e5000}'])
    assert await conn.fetchval("SELECT count(*) FROM dispatcher.jobs") == 3


async def test_a_number_written_with_more_digits_than_the_limit_is_refused_at_every_sql_door(
    conn: asyncpg.Connection,
) -> None:
    """1e5000 is stored in a few bytes and written with 5,001 digits, which is what the daemon
    receives: the limit counts the text, in the payload or the target, at the single and the
    batch door (a bound from the stored size had let 10 bytes become 131,072 digits)."""
    assert await conn.fetchval("SELECT pg_column_size('{\"n\": 1e5000}'::jsonb)") < 64
    for payload in ('{"n": 1e5000}', '{"n": -1e-5000}', '{"a": [1e2000, 1e2000, 1e2000]}'):
        with pytest.raises(asyncpg.ProgramLimitExceededError, match="over limits"):
            await conn.fetchval("SELECT dispatcher.enqueue('amp', 'report', $1::jsonb)", payload)
        with pytest.raises(asyncpg.ProgramLimitExceededError, match=r"key 'amp' \(item 2\)"):
            await conn.fetch(MANY, ["ok", "amp"], ["report", "report"], ["{}", payload])
    target = '{"url": "https://example.com/", "n": 1e5000}'
    with pytest.raises(asyncpg.ProgramLimitExceededError, match="over limits"):
        await conn.fetchval(
            "SELECT dispatcher.enqueue('amp', 'http', '{}', target => $1::jsonb)", target
        )
    assert await conn.fetchval("SELECT count(*) FROM dispatcher.jobs") == 0
    # within the limit it is stored, counted as its text for the claim's memory budget
    await conn.fetchval("SELECT dispatcher.enqueue('fits', 'report', '{\"n\": 1e3000}')")
    assert await conn.fetchval("SELECT size_bytes FROM dispatcher.intents") == len(
        '{"n": 1' + "0" * 3000 + "}"
    )


async def test_a_row_holding_such_a_number_stored_directly_is_claimed_with_the_others(
    conn: asyncpg.Connection, repo: JobRepository
) -> None:
    """A row stored past the doors (here: into dispatcher.jobs directly) with a 5,001-digit
    integer: the claim reads it and the job beside it (its decoding had failed the whole batch,
    again at every rescue)."""
    await conn.execute(
        """INSERT INTO dispatcher.jobs (key, request_hash, queue, handler, handler_version,
                                        payload, state, due_at, max_attempts, max_retry_age_s,
                                        budget_started_at)
           VALUES ('long', 'h', 'default', 'report', 1, '{"n": 1e5000}', 'ready', now(), 3,
                   60, now()),
                  ('plain', 'h2', 'default', 'report', 1, '{"n": 1}', 'ready', now(), 3, 60,
                   now())"""
    )
    jobs, _ = await repo.claim("default", 10, ["report:1"], "o", 60)
    assert sorted(j.payload["n"] for j in jobs) == [1, 10**5000]


async def test_rows_over_the_limit_stored_directly_are_claimed_within_the_grant(
    conn: asyncpg.Connection, repo: JobRepository
) -> None:
    """The limit refuses new jobs; rows stored before it (here: inserted into dispatcher.jobs
    directly, 1 MB each against a 4 kB limit) are bounded by the claim's byte grant instead."""
    await conn.execute(
        """INSERT INTO dispatcher.jobs (key, request_hash, queue, handler, handler_version,
                                        payload, state, due_at, max_attempts, max_retry_age_s,
                                        budget_started_at)
           SELECT 'old-' || g, 'h', 'default', 'report', 1,
                  jsonb_build_object('p', repeat('x', 1000000)), 'ready', now(), 3, 60, now()
             FROM generate_series(1, 5) g"""
    )
    caps = ["report:1"]
    jobs, taken = await repo.claim("default", 10, caps, "o", 60, ByteGrant(2_500_000))
    assert taken == len(jobs) == 2  # a third would pass 2.5 MB
    jobs, taken = await repo.claim("default", 10, caps, "o", 60, ByteGrant(500_000))
    assert (jobs, taken) == ([], 0)  # none fits, and the daemon holds others
    jobs, _ = await repo.claim("default", 10, caps, "o", 60, ByteGrant(500_000, True))
    assert len(jobs) == 1  # one larger than the grant runs only alone
