"""A handler's requested retry delay is input too: infinite, NaN, negative or huge delays must
leave the job in a legal state (retried or dead), never fail the outcome's write."""

from __future__ import annotations

import asyncpg
import pytest

from tests.harness import make_settings, running_daemon, wait_until


@pytest.mark.parametrize(
    ("delay", "expected"),
    [
        ("inf", ("dead", "max_retry_age", 1)),
        ("1e300", ("dead", "max_retry_age", 1)),
        ("nan", ("scheduled", None, 1)),  # the queue's backoff (60 s base) instead
        ("-5", ("dead", "max_attempts", 2)),  # retried at once, until attempts run out
    ],
)
async def test_any_requested_delay_ends_in_a_legal_state(
    db_url: str, delay: str, expected: tuple[str, str | None, int]
) -> None:
    handler = {"kind": "python", "function": "tests.badinput.handlers:asks_for_a_delay"}
    settings = make_settings(
        db_url,
        handlers={"delay": {**handler, "transactional": False}},
        queues={"default": {"max_attempts": 2, "backoff_base_s": 60}},
    )
    conn = await asyncpg.connect(db_url)
    try:
        async with running_daemon(settings) as d:
            job = await d.post_job("delay", {"handler": "delay", "payload": {"delay": delay}})

            async def outcome() -> tuple[str, str | None, int]:
                row = await conn.fetchrow(
                    "SELECT state, dead_reason, attempt FROM dispatcher.jobs WHERE id = $1",
                    job["id"],
                )
                return row["state"], row["dead_reason"], row["attempt"]

            async def reached() -> bool:
                return await outcome() == expected

            await wait_until(reached, what=f"{expected} after a retry in {delay} s")
        assert await outcome() == expected  # and it stayed there through the drain
    finally:
        await conn.close()
