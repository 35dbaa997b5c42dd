"""One timer per claim and handler: members still inside at expiry time out, leavers do not."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from dispatcher.engine.deadlines import Member, SharedDeadline


@dataclass(eq=False)
class Attempt:
    job_id: int
    timed_out: bool = False


async def test_only_members_still_inside_at_the_deadline_time_out() -> None:
    expired: list[int] = []
    fired = asyncio.Event()

    def on_expire(member: Member) -> None:
        expired.append(member.job_id)
        fired.set()

    deadline = SharedDeadline(0.05, on_expire)
    stays, leaves = Attempt(1), Attempt(2)
    deadline.join(stays)
    deadline.join(leaves)
    deadline.leave(leaves)
    await asyncio.wait_for(fired.wait(), 5)
    assert expired == [1]
    assert (stays.timed_out, leaves.timed_out) == (True, False)


async def test_the_timer_is_cancelled_when_the_last_member_leaves() -> None:
    expired: list[int] = []
    deadline = SharedDeadline(0.01, lambda m: expired.append(m.job_id))
    member = Attempt(7)
    deadline.join(member)
    deadline.leave(member)
    assert deadline._handle.cancelled()
    assert expired == [] and not member.timed_out
