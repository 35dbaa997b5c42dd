"""Overrides of one key's limits through the operator service (dispatcher/operator/key_limits.py)
on real PostgreSQL: the next claim honours them, deleting one goes back to the queue's limits,
and bad input changes nothing, with the fix named (the doors call this, so each inherits it)."""

from __future__ import annotations

import pytest

from dispatcher.db.jobs import JobRepository
from dispatcher.db.key_limits import KeyLimitsRepository
from dispatcher.operator.errors import Invalid, NotFound
from dispatcher.operator.key_limits import KeyLimits, clear_key_limits, set_key_limits
from tests.db.test_key_limits import claim, running_by_key, setup


async def test_an_override_applies_to_the_next_claim_and_deleting_it_goes_back(
    repo: JobRepository,
) -> None:
    await setup(repo, (None, None, 1), {"acct-7": 20, "acct-8": 20})
    keys = KeyLimitsRepository(repo.pool)
    view = await set_key_limits(keys, "default", "acct-7", KeyLimits(max_inflight=3))
    assert (view["key"], view["max_inflight"], view["rate_per_s"]) == ("acct-7", 3, None)
    await claim(repo, 40)
    assert await running_by_key(repo.pool) == {"acct-7": 3, "acct-8": 1}
    assert await clear_key_limits(keys, "default", "acct-7") is True
    assert await clear_key_limits(keys, "default", "acct-7") is False  # nothing left to clear
    # back to the queue's 1: acct-7 runs 3, so it starts nothing until two of them end
    await claim(repo, 40)
    assert await running_by_key(repo.pool) == {"acct-7": 3, "acct-8": 1}
    assert [o.key for o in await KeyLimitsRepository(repo.pool).overrides("default")] == []


async def test_a_rate_override_limits_one_key_per_second(repo: JobRepository) -> None:
    await setup(repo, (None, None, None), {"acct-7": 20, "acct-8": 20})
    keys = KeyLimitsRepository(repo.pool)
    await set_key_limits(keys, "default", "acct-7", KeyLimits(rate_per_s=0.001, burst=2))
    await claim(repo, 40)
    assert await running_by_key(repo.pool) == {"acct-7": 2, "acct-8": 20}


@pytest.mark.parametrize(
    ("key", "limits", "says"),
    [
        ("", KeyLimits(max_inflight=1), "1 to 200 characters"),
        ("k" * 201, KeyLimits(max_inflight=1), "1 to 200 characters"),
        ("acct-7", KeyLimits(), "give at least one of"),
        ("acct-7", KeyLimits(max_inflight=0), "max_inflight: must be between 1"),
        ("acct-7", KeyLimits(rate_per_s=-1), "rate_per_s: must be a positive"),
        ("acct-7", KeyLimits(rate_per_s=float("nan")), "rate_per_s: must be a positive"),
        ("acct-7", KeyLimits(burst=5), "give rate_per_s too"),
    ],
)
async def test_bad_overrides_change_nothing(
    repo: JobRepository, key: str, limits: KeyLimits, says: str
) -> None:
    keys = KeyLimitsRepository(repo.pool)
    with pytest.raises(Invalid, match=says):
        await set_key_limits(keys, "default", key, limits)
    assert await keys.overrides("default") == []


async def test_an_unknown_queue_is_named(repo: JobRepository) -> None:
    with pytest.raises(NotFound, match="no queue 'nope'"):
        await set_key_limits(
            KeyLimitsRepository(repo.pool), "nope", "k", KeyLimits(burst=None, max_inflight=1)
        )
