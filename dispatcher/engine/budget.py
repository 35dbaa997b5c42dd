"""The daemon's memory budget: the payload and target bytes of the jobs it holds in flight.

Without it a claim took up to `claim_batch` jobs whatever their size, and each job in flight
held its payload about 1.5 times (the decoded JSON and the request body): a drain of 3 MB
payloads peaked at 1,221 MB resident, 10 MB payloads at 3,032 MB (issue 20, defect 3).

Every claim loop of the daemon draws on one `PayloadBudget` before it claims: a `ByteGrant` the
claim statement fills with the longest prefix of its candidates that fits (so a claim takes
fewer jobs rather than exceed it), and `settle` turns what it took into bytes held. The bytes
of a job are released when its attempt's effect ends. A claim gets all that is left, or a
quarter of the budget at most while another claim is in flight, so claim loops of several
queues claim side by side. The claim made while the daemon holds nothing may take one job
larger than the whole budget, which then runs alone (no other claim starts until its bytes are
released).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from dispatcher.model import ByteGrant

# Claims that can draw on the budget side by side, each for at most this share of it.
SHARES = 4


class PayloadBudget:
    """Bytes held by running attempts plus bytes granted to claims in flight never exceed
    `limit_bytes`, except by one job larger than the whole budget, granted only when nothing
    else is held or granted, and during which no other grant is made."""

    def __init__(self, limit_bytes: int):
        self.limit_bytes = limit_bytes
        self.held_bytes = 0
        self._granted_bytes = 0
        self._claims = 0
        self._alone = False  # an `alone` grant is out, or the job it took is running
        self._room = asyncio.Event()
        self._short: list[Callable[[], None]] = []

    def grant(self) -> ByteGrant | None:
        """What is left for one claim (a share of it while other claims are in flight), or
        None when nothing is (`wait_for_grant`)."""
        if self._alone:
            return None
        left = self.limit_bytes - self.held_bytes - self._granted_bytes
        if self._claims:
            left = min(left, self.limit_bytes // SHARES)
        if left <= 0:
            self._room.clear()
            return None
        alone = self.held_bytes == 0 and self._claims == 0
        self._granted_bytes += left
        self._claims += 1
        self._alone = alone
        return ByteGrant(left, alone=alone)

    def settle(self, grant: ByteGrant, taken_bytes: int) -> None:
        """The claim made with `grant` took jobs of `taken_bytes` (0 when it failed)."""
        self._granted_bytes -= grant.bytes
        self._claims -= 1
        self.held_bytes += taken_bytes
        if grant.alone and taken_bytes <= grant.bytes:
            self._alone = False  # what it took fits: other claims may share the rest
        self._changed()

    def release(self, size_bytes: int) -> None:
        """A job's effect ended: its bytes are free again."""
        self.held_bytes -= size_bytes
        if self._alone and self._claims == 0 and self.held_bytes <= 0:
            self._alone = False  # the job that ran alone has ended
        self._changed()

    def wake_when_freed(self, wake: Callable[[], None]) -> None:
        """Call `wake` at the next release: a claim loop whose claim the budget cut short."""
        self._short.append(wake)

    def _changed(self) -> None:
        self._room.set()
        if self._short:
            waiting, self._short = self._short, []
            for wake in waiting:
                wake()

    async def wait_for_grant(self, halt: asyncio.Event) -> ByteGrant | None:
        """A grant once the budget has room for one; None when `halt` is set first."""
        while (grant := self.grant()) is None:
            self._room.clear()
            if halt.is_set():
                return None
            waiters = [asyncio.ensure_future(self._room.wait()), asyncio.ensure_future(halt.wait())]
            try:
                await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for waiter in waiters:
                    waiter.cancel()
        return grant
