"""PayloadBudget: what claims may take of the daemon's memory budget, and when it is freed."""

from __future__ import annotations

import asyncio

from dispatcher.engine.budget import PayloadBudget
from dispatcher.model import ByteGrant

LIMIT = 64 * 1024 * 1024


def test_an_idle_daemon_grants_everything_and_one_larger_job_alone() -> None:
    budget = PayloadBudget(LIMIT)
    grant = budget.grant()
    assert grant == ByteGrant(LIMIT, alone=True)
    assert budget.grant() is None  # no other claim while one may take a job alone
    budget.settle(grant, 3 * LIMIT)  # it did: a job three times the budget
    assert budget.grant() is None  # it runs alone
    budget.release(3 * LIMIT)
    assert budget.grant() == ByteGrant(LIMIT, alone=True)


def test_claims_side_by_side_share_what_is_left_and_never_pass_it() -> None:
    budget = PayloadBudget(LIMIT)
    first = budget.grant()
    assert first is not None
    budget.settle(first, LIMIT // 2)  # half the budget runs
    second = budget.grant()
    assert second == ByteGrant(LIMIT // 2)  # all that is left, alone among claims in flight
    third = budget.grant()
    assert third is None  # nothing left while the second is out
    budget.settle(second, LIMIT // 8)
    grants = [budget.grant(), budget.grant(), budget.grant()]
    # what is left (3/8) to the first; a share at most (1/4) while it is out; then nothing
    assert grants == [ByteGrant(3 * LIMIT // 8), None, None]
    budget.settle(grants[0], 0)  # type: ignore[arg-type]
    budget.release(LIMIT // 2)  # now 1/8 held
    first, second = budget.grant(), budget.grant()
    assert first == ByteGrant(7 * LIMIT // 8)
    assert second is None  # nothing left beside it: 1/8 + 7/8
    budget.settle(first, 6 * LIMIT // 8)  # type: ignore[arg-type]
    assert budget.grant() == ByteGrant(LIMIT // 8)  # 7/8 held: what is left
    assert budget.grant() is None


def test_a_release_wakes_the_claim_loops_the_budget_cut_short() -> None:
    budget = PayloadBudget(LIMIT)
    grant = budget.grant()
    assert grant is not None
    budget.settle(grant, LIMIT)
    woken: list[str] = []
    budget.wake_when_freed(lambda: woken.append("q1"))
    budget.release(1)
    assert woken == ["q1"]
    budget.release(1)
    assert woken == ["q1"]  # once per registration


async def test_a_claim_loop_waits_for_room_or_its_halt() -> None:
    budget = PayloadBudget(LIMIT)
    grant = budget.grant()
    assert grant is not None
    budget.settle(grant, LIMIT)
    halt = asyncio.Event()
    waiting = asyncio.create_task(budget.wait_for_grant(halt))
    await asyncio.sleep(0)
    assert not waiting.done()
    budget.release(LIMIT // 4)
    assert await asyncio.wait_for(waiting, 5) == ByteGrant(LIMIT // 4)
    halted = asyncio.create_task(budget.wait_for_grant(halt))
    await asyncio.sleep(0)
    halt.set()
    assert await asyncio.wait_for(halted, 5) is None
