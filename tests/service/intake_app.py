"""The HTTP API as the daemon builds it (real `Intake`, real `JobRepository`, the HTTP effect's
target validator), served on a real loopback socket for the API tests."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import asyncpg
from aiohttp import ClientResponse
from aiohttp.test_utils import TestClient, TestServer

from dispatcher.api.app import create_app
from dispatcher.config.settings import Settings
from dispatcher.db.jobs import JobRepository
from dispatcher.effects.http import HttpEffect
from dispatcher.intake.accept import Intake

PROBLEM_JSON = "application/problem+json"
TARGET = {"url": "https://hooks.example.com/grants"}
BASE_SETTINGS: dict[str, Any] = {
    "queues": {"default": {}, "bulk": {"max_attempts": 3, "max_retry_age_s": 600}},
    "handlers": {"report": {"kind": "python", "function": "reports.monthly:run"}},
}


def http_job(**fields: Any) -> dict[str, Any]:
    return {"handler": "http", "target": TARGET, "payload": {"grant": 1}, **fields}


@dataclass
class Api:
    client: TestClient
    repo: JobRepository
    settings: Settings
    wakes: list[int] = field(default_factory=list)
    ready: list[tuple[bool, str]] = field(default_factory=lambda: [(True, "ok")])

    async def post_job(
        self, key: str | None, body: Any, headers: dict[str, str] | None = None
    ) -> ClientResponse:
        sent = dict(headers or {})
        if key is not None:
            sent["Idempotency-Key"] = key
        return await self.client.post("/v1/jobs", json=body, headers=sent)

    async def count(self, table: str = "jobs") -> int:
        return await self.repo.pool.fetchval(f"SELECT count(*) FROM dispatcher.{table}")


async def problem(response: ClientResponse, status: int) -> dict[str, Any]:
    """Assert an RFC 9457 answer with `status`; return its document."""
    text = await response.text()
    assert response.status == status, text
    assert response.content_type == PROBLEM_JSON, text
    doc: dict[str, Any] = await response.json(content_type=PROBLEM_JSON)
    assert doc["status"] == status
    assert doc["title"]
    assert isinstance(doc["detail"], str) and doc["detail"]
    return doc


@asynccontextmanager
async def serve_api(
    pool: asyncpg.Pool,
    *,
    tokens: list[str] | None = None,
    body_limit_bytes: int | None = None,
    ready_outbox: bool = False,
    **overrides: Any,
) -> AsyncIterator[Api]:
    settings = Settings.model_validate({**BASE_SETTINGS, **overrides})
    repo = JobRepository(pool)
    # what the daemon does at start: the SQL door validates against these registries
    await repo.sync_registry(
        {q: (c.max_attempts, c.max_retry_age_s) for q, c in settings.queues.items()},
        {n: (h.kind, h.version) for n, h in settings.handlers.items()},
        ready_outbox=ready_outbox,
    )
    api_holder: list[Api] = []

    def on_accepted(state: str) -> None:
        api_holder[0].wakes.append(state)

    async def readiness() -> tuple[bool, str]:
        return api_holder[0].ready[-1]

    intake = Intake(settings, repo, lambda t: HttpEffect.validate_target(t, settings), on_accepted)
    app = create_app(
        repo=repo,
        intake=intake,
        readiness=readiness,
        tokens=settings.api_token_entries() if tokens is None else tokens,
        body_limit_bytes=body_limit_bytes or settings.body_limit_bytes,
    )
    async with TestServer(app, host="127.0.0.1", port=0) as server, TestClient(server) as client:
        api = Api(client, repo, settings)
        api_holder.append(api)
        yield api
