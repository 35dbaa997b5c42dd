"""The soak's job stream: HTTP, Python and SQL jobs, each with its own key, through the HTTP API
and the SQL door (`dispatcher.enqueue`), some due now and some a few seconds ahead; cron
triggers of past periods (and repeats of them); and reads of the API.

A job is *accepted* when the API answered 202 (or 200: the same key again) or the SQL door's
transaction committed. A submission that got no answer (its daemon was killed, the database
restarted) is retried with the same key on another daemon: intake is idempotent.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import aiohttp
import asyncpg

from tests.chaos.cluster import EFFECT_QUEUE, HTTP_TIMEOUT_S, LIMITED_QUEUE, Daemons
from tests.chaos.targets import BEHAVIOURS, ChaosTarget

# The mix of target behaviours of HTTP jobs (weights): mostly well-behaved, every hostile kind.
BEHAVIOUR_WEIGHTS = dict(
    zip(BEHAVIOURS, (40, 10, 10, 4, 10, 3, 3, 3, 5, 3), strict=True)
)  # ok slow flaky fail limited nul gzip huge reset endless
SUBMIT_DEADLINE_S = 30.0  # a submission is retried (same key) this long, then given up
CLIENT_TIMEOUT_S = 10.0
CRON_SCHEDULE = "tick"
SQL_ENQUEUE = "SELECT dispatcher.enqueue($1, $2, $3::jsonb, $4, $5, NULL, $6::jsonb)"


class Unanswered(Exception):
    """No daemon gave an answer (all killed, frozen or unreachable for now)."""


@dataclass
class Api:
    """Calls to whichever daemon is live; every status is tallied (a 500 is a violation)."""

    daemons: Daemons
    session: aiohttp.ClientSession
    rng: random.Random
    statuses: Counter[int] = field(default_factory=Counter)
    server_errors: list[str] = field(default_factory=list)

    async def call(
        self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None
    ) -> tuple[int, Any]:
        live = self.daemons.live()
        if not live:
            raise Unanswered(path)
        slot = self.rng.choice(live)
        url = f"http://127.0.0.1:{slot.port}{path}"
        try:
            async with self.session.request(method, url, json=body, headers=headers) as r:
                text = await r.text()
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise Unanswered(f"{method} {path} at {slot.name}: {exc!r}") from None
        self.statuses[r.status] += 1
        if r.status >= 500 and r.status != 503:  # 503: the database is away; retry (documented)
            self.server_errors.append(f"{method} {path} at {slot.name}: {r.status} {text[:300]}")
        with contextlib.suppress(ValueError):
            return r.status, await r.json(content_type=None)
        return r.status, text


@dataclass
class Load:
    api: Api
    pool: asyncpg.Pool
    target: ChaosTarget
    rng: random.Random
    accepted: dict[str, str] = field(default_factory=dict)  # key -> "door/kind"
    behaviours: dict[str, str] = field(default_factory=dict)  # key -> target behaviour
    ids: list[int] = field(default_factory=list)
    given_up: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    sql_errors: Counter[str] = field(default_factory=Counter)
    triggers: Counter[str] = field(default_factory=Counter)
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)
    _n: int = 0

    async def stream(self, jobs_per_s: float, until: float) -> None:
        loop = asyncio.get_running_loop()
        while loop.time() < until:
            self._n += 1
            task = asyncio.create_task(self._submit(self._n))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            await asyncio.sleep(self.rng.expovariate(jobs_per_s))

    async def drain(self) -> None:
        """Wait for submissions still being retried."""
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    def _job(self, n: int) -> tuple[str, str, str, dict[str, Any], dict[str, Any] | None, str]:
        """(key, kind, handler, payload, target, queue) of the n-th job."""
        roll = self.rng.random()
        if roll < 0.45:
            behaviour = self.rng.choices(*zip(*BEHAVIOUR_WEIGHTS.items(), strict=True))[0]
            key = f"h-{n}"
            self.behaviours[key] = behaviour
            url = self.target.job_url(LIMITED_QUEUE, behaviour, key)
            target = {"url": url, "timeout_s": HTTP_TIMEOUT_S}
            return key, "http", "http", {"n": n}, target, LIMITED_QUEUE
        if roll < 0.75:
            self.behaviours[f"p-{n}"] = "effect"
            return f"p-{n}", "python", "chaos_py", {"n": n}, None, EFFECT_QUEUE
        self.behaviours[f"s-{n}"] = "effect"
        return f"s-{n}", "sql", "chaos_sql", {"k": f"s-{n}"}, None, EFFECT_QUEUE

    async def _submit(self, n: int) -> None:
        key, kind, handler, payload, target, queue = self._job(n)
        # the due time is part of the job: fixed once, so a retried submission is the same job
        due = datetime.now(UTC) + timedelta(seconds=self.rng.uniform(1, 8))
        due_at = due if self.rng.random() < 0.2 else None
        door = "sql" if self.rng.random() < 0.35 else "api"
        loop = asyncio.get_running_loop()
        give_up = loop.time() + SUBMIT_DEADLINE_S
        while loop.time() < give_up:
            if door == "api":
                done = await self._post(key, handler, payload, target, queue, due_at)
            else:
                done = await self._enqueue(key, handler, payload, target, queue, due_at)
            if done:
                self.accepted[key] = f"{door}/{kind}"
                return
            await asyncio.sleep(0.5)
        self.given_up.append(key)

    async def _post(
        self,
        key: str,
        handler: str,
        payload: dict[str, Any],
        target: dict[str, Any] | None,
        queue: str,
        due_at: datetime | None,
    ) -> bool:
        body: dict[str, Any] = {"handler": handler, "payload": payload, "queue": queue}
        if target is not None:
            body["target"] = target
        if due_at is not None:
            body["due_at"] = due_at.isoformat().replace("+00:00", "Z")
        try:
            status, answer = await self.api.call(
                "POST", "/v1/jobs", body, headers={"Idempotency-Key": key}
            )
        except Unanswered:
            return False
        if status in (200, 202):
            self.ids.append(int(answer["id"]))
            return True
        if status != 503 and status < 500:  # a valid job refused (5xx are tallied already)
            self.refused.append(f"POST /v1/jobs {key}: {status} {str(answer)[:300]}")
        return False

    async def _enqueue(
        self,
        key: str,
        handler: str,
        payload: dict[str, Any],
        target: dict[str, Any] | None,
        queue: str,
        due_at: datetime | None,
    ) -> bool:
        try:
            await self.pool.fetchval(
                SQL_ENQUEUE,
                key,
                handler,
                json.dumps(payload),
                due_at,
                queue,
                None if target is None else json.dumps(target),
            )
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            if isinstance(exc, asyncpg.RaiseError | asyncpg.DataError):  # refused a valid job
                self.refused.append(f"dispatcher.enqueue {key}: {exc}")
            self.sql_errors[type(exc).__name__] += 1
            return False
        return True

    async def triggers_loop(self, every_s: float, until: float) -> None:
        """Trigger past minutes of the `tick` schedule, one after another, and now and then one
        already triggered (a retried trigger must converge on the same unit keys)."""
        loop = asyncio.get_running_loop()
        origin = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(minutes=2)
        done: list[datetime] = []
        while loop.time() < until:
            await asyncio.sleep(every_s)
            if done and self.rng.random() < 0.25:
                period = self.rng.choice(done)
            else:
                period = origin - timedelta(minutes=len(done))
                done.append(period)
            body = {"period_start": period.isoformat().replace("+00:00", "Z")}
            try:
                status, _ = await self.api.call(
                    "POST", f"/v1/schedules/{CRON_SCHEDULE}/trigger", body
                )
            except Unanswered:
                continue
            self.triggers[str(status)] += 1

    async def reads_loop(self, every_s: float, until: float) -> None:
        """Operators' reads while everything else happens: a job, the dead letters, queues."""
        loop = asyncio.get_running_loop()
        while loop.time() < until:
            await asyncio.sleep(every_s)
            paths = ["/v1/jobs?state=dead&limit=50", "/v1/queues"]
            if self.ids:
                paths.append(f"/v1/jobs/{self.rng.choice(self.ids)}")
            for path in paths:
                with contextlib.suppress(Unanswered):
                    await self.api.call("GET", path)
