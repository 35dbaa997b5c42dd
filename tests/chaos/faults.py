"""The soak's fault injector: at seeded random moments, one fault at a time, each undone before
the next (so every repeat can be attributed to one cause). Every fault is journalled with its
start and end on the soak's monotonic clock."""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field

from tests.chaos.checks import Fault, LimitSpan
from tests.chaos.cluster import EFFECT_QUEUE, LIMITED_QUEUE, PROFILES, Daemons, Database, Slot
from tests.chaos.load import Api, Unanswered
from tests.outage_proxy import OutageProxy

# kind -> weight; broker cuts only on the rabbitmq transport
WEIGHTS = {
    "kill": 22,
    "freeze": 18,
    "pg_restart": 10,
    "broker_cut": 14,
    "pause": 14,
    "limits": 12,
}
FREEZE_S = (2.0, 16.0)  # past the 10 s lease now and then: a lease loss
KILL_DOWN_S = (0.5, 3.0)
PG_DOWN_S = (0.5, 3.0)
BROKER_DOWN_S = (1.0, 6.0)
PAUSE_S = (2.0, 8.0)
GAP_S = (2.0, 6.0)


@dataclass
class Injector:
    daemons: Daemons
    database: Database
    api: Api
    rng: random.Random
    broker: OutageProxy | None
    faults: list[Fault] = field(default_factory=list)
    spans: list[LimitSpan] = field(default_factory=list)
    drain_exits: list[tuple[str, int]] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)  # a fault that could not be undone
    _profile_since: float = field(default_factory=time.monotonic)

    async def run(self, until: float) -> None:
        kinds = [k for k in WEIGHTS if k != "broker_cut" or self.broker is not None]
        loop = asyncio.get_running_loop()
        while loop.time() < until:
            await asyncio.sleep(self.rng.uniform(*GAP_S))
            if loop.time() >= until:
                break
            kind = self.rng.choices(kinds, [WEIGHTS[k] for k in kinds])[0]
            try:
                await getattr(self, f"_{kind}")()
            except Exception as exc:  # the soak reports it and carries on
                self.failures.append(f"{kind}: {exc!r}"[:500])
                await self.heal()

    async def heal(self) -> None:
        """Undo whatever is still broken: the end state the settle phase starts from."""
        for slot in self.daemons.slots:
            if slot.frozen:
                self.daemons.thaw(slot)
        if self.broker is not None and self.broker.is_cut:
            await self.broker.restore()
        for slot in self.daemons.slots:
            if slot.process is None:
                await self.daemons.start(slot)
        for queue in (LIMITED_QUEUE, EFFECT_QUEUE):
            await self._set_paused(queue, paused=False)

    def close_spans(self) -> list[LimitSpan]:
        profile = self.daemons.profile
        return [*self.spans, LimitSpan(self._profile_since, float("inf"), profile)]

    def _pick(self) -> Slot:
        return self.rng.choice(self.daemons.live())

    def _journal(self, kind: str, subject: str, start: float, detail: str = "") -> None:
        self.faults.append(Fault(kind, subject, start, time.monotonic(), detail))

    async def _kill(self) -> None:
        slot, start = self._pick(), time.monotonic()
        await self.daemons.kill(slot)
        await asyncio.sleep(self.rng.uniform(*KILL_DOWN_S))
        await self.daemons.start(slot)
        self._journal("kill", slot.name, start)

    async def _freeze(self) -> None:
        slot, start = self._pick(), time.monotonic()
        held_s = self.rng.uniform(*FREEZE_S)
        self.daemons.freeze(slot)
        await asyncio.sleep(held_s)
        self.daemons.thaw(slot)
        self._journal("freeze", slot.name, start, f"{held_s:.1f} s")

    async def _pg_restart(self) -> None:
        start = time.monotonic()
        await self.database.stop()
        await asyncio.sleep(self.rng.uniform(*PG_DOWN_S))
        await self.database.start()
        self._journal("pg_restart", "postgres", start)

    async def _broker_cut(self) -> None:
        assert self.broker is not None
        start = time.monotonic()
        await self.broker.cut()
        await asyncio.sleep(self.rng.uniform(*BROKER_DOWN_S))
        await self.broker.restore()
        self._journal("broker_cut", "broker", start)

    async def _pause(self) -> None:
        queue, start = self.rng.choice((LIMITED_QUEUE, EFFECT_QUEUE)), time.monotonic()
        await self._set_paused(queue, paused=True)
        await asyncio.sleep(self.rng.uniform(*PAUSE_S))
        await self._set_paused(queue, paused=False)
        self._journal("pause", queue, start)

    async def _set_paused(self, queue: str, *, paused: bool) -> None:
        verb = "pause" if paused else "resume"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                status, _ = await self.api.call("POST", f"/v1/queues/{queue}/{verb}")
            except Unanswered:
                status = 0
            if status == 200:
                return
            await asyncio.sleep(0.5)
        raise RuntimeError(f"could not {verb} queue {queue} within 30 s")

    async def _limits(self) -> None:
        """Restart one daemon (SIGTERM: a graceful drain) with the other limit profile."""
        slot, start = self._pick(), time.monotonic()
        old = self.daemons.profile
        new = next(p for p in PROFILES if p != old)
        self.drain_exits.append((slot.name, await self.daemons.terminate(slot)))
        self.daemons.profile = new
        await self.daemons.start(slot)  # it writes the new limits as it starts
        ready = time.monotonic()
        # either profile may hold from the restart until the new one is written
        self.spans.append(LimitSpan(self._profile_since, ready, old))
        self._profile_since = start
        self._journal("limits", slot.name, start, f"{old.name} -> {new.name}")
