"""The acknowledgements of one consumer channel (in order, in batches) and the deliveries a
process holds."""

from __future__ import annotations

import asyncio
import functools
from collections import deque
from collections.abc import Awaitable, Callable

from aiormq.abc import AbstractChannel

# Acknowledgements wait this long to leave together: a completion batch ends many attempts at
# once, and their deliveries then go in one `multiple` ack.
ACK_DELAY_S = 0.002


class Acks:
    """The acknowledgements of one consumer channel, sent in order and in batches.

    Delivery tags rise on a channel. A tag is open from its delivery until it is settled: acked
    (its attempt ended, or it was a duplicate) or returned (nack, requeue). The settled tags at
    the front of the open ones leave as one `multiple` ack; a settled tag behind an open one (a
    long attempt) is acked alone, so it does not hold a prefetch slot. One flusher at a time
    writes, returns first, so a `multiple` ack never reaches the broker before a return or a
    single ack of a tag it covers (the broker would ack the returned message, or close the
    channel over an unknown tag).

    A message may carry several jobs (messages.py): its tag is settled once each of its jobs
    was acknowledged (its attempt ended, or it was a duplicate or refused), or at once when one
    of them is given back (the drain returns a held job: the whole message goes back, and its
    jobs already running or done are counted duplicates where it is delivered again; a later
    acknowledgement of the returned tag is nothing)."""

    def __init__(self, channel: AbstractChannel):
        self.channel = channel
        self._jobs: dict[int, int] = {}  # open tags -> jobs of their message not yet settled
        self._open: deque[int] = deque()
        self._settled: dict[int, bool] = {}  # settled tags still open here -> already sent
        self._to_ack: list[int] = []
        self._to_return: list[int] = []
        self._flushing: asyncio.Future[None] | None = None

    def received(self, tag: int, jobs: int = 1) -> None:
        """A delivery of a message carrying `jobs` jobs."""
        self._open.append(tag)
        self._jobs[tag] = jobs

    def ack(self, tag: int) -> None:
        """One job of the message was settled: ack the message with its last."""
        left = self._jobs.get(tag)
        if left is None:  # returned already (or its channel closed)
            return
        if left > 1:
            self._jobs[tag] = left - 1
            return
        del self._jobs[tag]
        self._to_ack.append(tag)
        self._schedule()

    def give_back(self, tag: int) -> None:
        """Return the message (nack, requeue) now, whatever its other jobs are doing."""
        if self._jobs.pop(tag, None) is None:
            return
        self._to_return.append(tag)
        self._schedule()

    def _schedule(self) -> None:
        if self._flushing is None:
            self._flushing = asyncio.ensure_future(self._flush())

    async def settled(self) -> None:
        """Wait until what was acked or returned so far has been written."""
        if self._flushing is not None:
            await asyncio.shield(self._flushing)

    async def _flush(self) -> None:
        try:
            await asyncio.sleep(ACK_DELAY_S)
            while self._to_ack or self._to_return:
                await self._write_one_round()
        except Exception:  # the channel closed: the broker redelivers what it had not seen
            self._open.clear()
            self._jobs.clear()
            self._settled.clear()
            self._to_ack.clear()
            self._to_return.clear()
        finally:
            self._flushing = None  # no await since the loop's last check: nothing is left behind

    async def _write_one_round(self) -> None:
        returns, self._to_return = self._to_return, []
        acks, self._to_ack = self._to_ack, []
        for tag in returns:
            self._settled[tag] = True
        for tag in acks:
            self._settled[tag] = False
        # the `multiple` ack names the last unsent tag of the settled front: the broker walks
        # its unacked tags up to that very one (a tag it no longer holds, returned or acked
        # alone, would be an unknown tag to it: a channel error)
        last_unsent = 0
        while self._open and self._open[0] in self._settled:
            tag = self._open.popleft()
            if not self._settled.pop(tag):
                last_unsent = tag
        singles = [tag for tag in acks if tag in self._settled]
        for tag in singles:
            self._settled[tag] = True
        channel = self.channel
        sends: list[Callable[..., Awaitable[None]]] = [
            *(functools.partial(channel.basic_nack, tag, requeue=True) for tag in returns),
            *(
                [functools.partial(channel.basic_ack, last_unsent, multiple=True)]
                * bool(last_unsent)
            ),
            *(functools.partial(channel.basic_ack, tag) for tag in singles),
        ]
        # one after another on the connection's queue; the last waits until it (so all) left
        # for the socket, so `settled` means written (the connection may close right after)
        for send in sends[:-1]:
            await send(wait=False)
        if sends:
            await sends[-1](wait=True)


class Received:
    """One job of a delivery held by this process: where to acknowledge its message, the job
    and attempt it carries (a message of several jobs gives one each, sharing its tag), and the
    record of its message (None: an earlier release's message)."""

    __slots__ = ("acks", "attempt", "job_id", "message", "tag")

    def __init__(self, acks: Acks, tag: int, job_id: int, attempt: int, message: int | None):
        self.acks = acks
        self.tag = tag
        self.job_id = job_id
        self.attempt = attempt
        self.message = message
