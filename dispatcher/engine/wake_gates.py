"""The queue wake gates, seen from a claim loop (db/functions/10_wake.sql): a loop about to wait
for work holds its queue's gate, so intake into the queue notifies, and a busy loop (it claims
again anyway) lets it go, so intake into a busy queue commits without a notice and its commits
share WAL flushes again. One per call from 16 clients with a daemon running and draining did
400-620 jobs/s when every enqueue notified (docs/performance/index.md, "The wake gate (one per
call)").

After taking the gate the loop looks once more, once the queue's intake has settled: an enqueue
that probed before the gate was taken sent no notice, and has committed by then."""

from __future__ import annotations

from typing import Protocol

from dispatcher.db.claims import ClaimConnections
from dispatcher.db.notifications import WakeListener


class QueueGate(Protocol):
    async def before_waiting(self, queue: str) -> bool:
        """The loop of `queue` found no more work: hold the gate. True: claim again at once."""

    def busy(self, queue: str) -> None:
        """The loop of `queue` claims again without waiting: intake need not notify it."""


class WakeGates:
    """The gates on the daemon's wake-up listener, and the look after one on its claim
    connections (the in-process transport; a broker's relay takes every ready notice)."""

    def __init__(self, listener: WakeListener, claims: ClaimConnections, capabilities: list[str]):
        self._listener = listener
        self._claims = claims
        self._capabilities = capabilities

    async def before_waiting(self, queue: str) -> bool:
        if not await self._listener.hold_gate(queue):
            return False  # held since the last look (every enqueue after it notifies), or down
        try:
            ready = await self._claims.ready_after_intake(queue, self._capabilities)
        except Exception:  # the next claim says what is wrong; the look comes again after it
            ready = None
        if ready is None:  # an enqueue still open: claim again, then wait for it once more
            self._listener.look_again(queue)
            return True
        return ready

    def busy(self, queue: str) -> None:
        self._listener.let_go(queue)
