"""limits.max_payload_bytes at the HTTP doors: a single request over it is 413 naming the limit
and the size; in a batch each item is measured on its own and answered on its own (the batch
shares only the body limit)."""

from __future__ import annotations

import asyncpg

from tests.service.intake_app import http_job, problem, serve_api

LIMIT = 4096


def padded(n: int) -> dict[str, str]:
    """A payload whose JSON text, as jsonb renders it, is `n` bytes: {"pad": "xxx"}."""
    return {"pad": "x" * (n - len('{"pad": ""}'))}


async def test_a_job_over_the_limit_is_413_naming_limit_and_size(pool: asyncpg.Pool) -> None:
    async with serve_api(pool, limits={"max_payload_bytes": LIMIT}) as api:
        over = padded(LIMIT + 1)
        doc = await problem(await api.post_job("big", {"handler": "report", "payload": over}), 413)
        assert f"{LIMIT + 1} bytes" in doc["detail"]
        assert f"limits.max_payload_bytes ({LIMIT})" in doc["detail"]
        assert await api.count() == 0
        # exactly at the limit is accepted, and stored with that many bytes of text
        r = await api.post_job("fits", {"handler": "report", "payload": padded(LIMIT)})
        assert r.status == 202, await r.text()
        stored = await api.repo.pool.fetchval(
            "SELECT octet_length(payload::text) FROM dispatcher.jobs WHERE key = 'fits'"
        )
        assert stored == LIMIT
        # the target counts too: an http job's normalized target is stored with its payload
        r = await api.post_job("with-target", http_job(payload=padded(LIMIT - 20)))
        doc = await problem(r, 413)
        assert "payload and target" in doc["detail"]


async def test_a_batch_answers_each_item_against_the_limit(pool: asyncpg.Pool) -> None:
    # the body is far over one item's limit: only the body limit bounds the whole request
    async with serve_api(pool, limits={"max_payload_bytes": LIMIT}) as api:
        items = [
            {"idempotency_key": f"k-{i}", "handler": "report", "payload": padded(size)}
            for i, size in enumerate([3000, LIMIT + 10, 4000, LIMIT, 9000])
        ]
        r = await api.client.post("/v1/jobs/batch", json={"jobs": items})
        assert r.status == 200, await r.text()
        results = (await r.json())["results"]
        assert [x["status"] for x in results] == [
            "accepted",
            "rejected",
            "accepted",
            "accepted",
            "rejected",
        ]
        assert f"{LIMIT + 10} bytes" in results[1]["error"]
        assert "9000 bytes" in results[4]["error"]
        keys = await api.repo.pool.fetch("SELECT key FROM dispatcher.jobs ORDER BY key")
        assert [k["key"] for k in keys] == ["k-0", "k-2", "k-3"]
