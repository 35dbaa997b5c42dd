"""Schemathesis against a live daemon's own /openapi.json: for every operation, generated valid
(positive) and invalid (negative) requests get responses that conform to the schema (status
code, content type, body, headers) and are never a 5xx. Examples are bounded per operation and
mode to keep the run short.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from dispatcher.api.openapi import openapi_document
from tests.badinput.conftest import live_env
from tests.harness import DaemonProcess

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    response_headers_conformance,
]
EXAMPLES = 25
# The schedule the live daemon has (tests/badinput/schedules.toml): valid requests to the schedule
# routes name it, so they reach the handlers behind the 404 of an unknown name.
SCHEDULE = "nightly"
# likewise the queue routes name a queue of the registry (every daemon has "default")
QUEUE = "default"
# the operations the daemon documents, each in both modes (negative only where there is an
# input to break: a parameter or a body)
CASES = [
    pytest.param(path, method, mode, id=f"{method.upper()} {path} {mode.value}")
    for path, item in openapi_document()["paths"].items()
    for method, spec in item.items()
    if method in ("get", "post", "put", "patch", "delete")
    for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
    if mode is GenerationMode.POSITIVE
    or spec.get("parameters")
    or spec.get("requestBody")
    or "{" in path
]


@pytest.fixture(scope="module")
def live_schema(module_daemon: DaemonProcess) -> schemathesis.BaseSchema:
    return schemathesis.openapi.from_url(f"{module_daemon.base_url}/openapi.json")


@pytest.fixture(scope="module")
async def history_job(module_db_url: str) -> int:
    """A waiting job with an attempt history of every shape (an http success with its excerpt,
    a failure, a lease lost with no latency): valid requests for the history name it, so they
    get a full page rather than a 404."""
    conn = await asyncpg.connect(module_db_url)
    try:
        job_id: int = await conn.fetchval(
            "SELECT dispatcher.enqueue('schemathesis-history', 'report', "
            "due_at => now() + interval '1 day')"
        )
        await conn.execute(
            """INSERT INTO dispatcher.attempts (job_id, attempt, owner, started_at, finished_at,
                   outcome, reason, http_status, latency_s, excerpt)
               VALUES ($1, 1, 'host:1:a', now(), now(), 'lease_expired', NULL, NULL, NULL,
                       'lease of host:1:a expired during attempt 1'),
                      ($1, 2, 'host:2:b', NULL, now(), 'retried', 'rate_limited', 429, 0.25,
                       'HTTP 429: slow down'),
                      ($1, 3, 'host:2:b', now(), now(), 'released', NULL, NULL, NULL, NULL)""",
            job_id,
        )
        return job_id
    finally:
        await conn.close()


# Valid requests to the routes of one job name a job in the state the route acts on (a fresh one
# per example while they last), so their 200 answers are checked, not only the 404 of a random id.
JOB_ROUTES = {
    "/v1/jobs/{id}/retry": "dead",
    "/v1/jobs/{id}/discard": "dead",
    "/v1/jobs/{id}/cancel": "scheduled",
    "/v1/jobs/{id}/reschedule": "scheduled",
}


@pytest.fixture(scope="module")
async def waiting_jobs(module_db_url: str) -> dict[str, Iterator[int]]:
    """Per route of JOB_ROUTES, EXAMPLES + 5 jobs in its state, handed out one per example (then
    again from the first: a job already acted on is a 409, which must conform too)."""
    conn = await asyncpg.connect(module_db_url)
    try:
        pools = {}
        for route, state in JOB_ROUTES.items():
            ids = await conn.fetchval(
                """SELECT array_agg(dispatcher.enqueue('schemathesis:' || $1 || ':' || g, 'report',
                                                       due_at => now() + interval '1 day'))
                     FROM generate_series(1, $2) g""",
                route,
                EXAMPLES + 5,
            )
            if state == "dead":
                await conn.execute(
                    "UPDATE dispatcher.jobs SET state = 'dead', attempt = 3, finished_at = now(),"
                    " dead_reason = 'attempts_exhausted', last_error = 'HTTP 503'"
                    " WHERE id = ANY($1)",
                    ids,
                )
            pools[route] = itertools.cycle(ids)
        return pools
    finally:
        await conn.close()


def acceptable(path: str, body: dict[str, Any]) -> dict[str, Any]:
    """What a valid body needs beyond its schema to be accepted rather than refused: a handler
    and queue the daemon has, a due time in range, periods on the schedule's cron (02:00 UTC).
    The rest of the generated body is kept."""
    now = datetime.now(UTC)
    day = now.replace(hour=2, minute=0, second=0, microsecond=0)
    day -= timedelta(days=1) if day > now else timedelta(0)  # the latest period begun
    if path == "/v1/jobs":
        fixed: dict[str, Any] = {"handler": "report", "target": None}
        if "queue" in body:
            fixed["queue"] = QUEUE
        if "due_at" in body:
            fixed["due_at"] = "2031-01-01T00:00:00Z"
        return fixed
    if path == "/v1/schedules/{name}/trigger":
        return {"period_start": (day - timedelta(days=1)).isoformat()}
    if path == "/v1/schedules/{name}/catch-up":
        return {"from": (day - timedelta(days=3)).isoformat(), "to": day.isoformat()}
    return {}


@pytest.mark.parametrize(("path", "method", "mode"), CASES)
def test_every_response_conforms_to_the_openapi_document(
    live_schema: schemathesis.BaseSchema,
    module_daemon: DaemonProcess,
    history_job: int,
    waiting_jobs: dict[str, Iterator[int]],
    path: str,
    method: str,
    mode: GenerationMode,
) -> None:
    operation = live_schema[path][method.upper()]

    @settings(
        max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None
    )
    @given(case=operation.as_strategy(generation_mode=mode))
    def conforms(case: schemathesis.Case) -> None:
        if mode is GenerationMode.POSITIVE and path.startswith("/v1/schedules/{name}"):
            case.path_parameters = {**(case.path_parameters or {}), "name": SCHEDULE}
        if mode is GenerationMode.POSITIVE and path.startswith("/v1/queues/{name}"):
            case.path_parameters = {**(case.path_parameters or {}), "name": QUEUE}
        if mode is GenerationMode.POSITIVE and path in ("/v1/jobs/{id}/attempts", "/v1/jobs/{id}"):
            case.path_parameters = {**(case.path_parameters or {}), "id": str(history_job)}
        if mode is GenerationMode.POSITIVE and path in JOB_ROUTES:
            job = next(waiting_jobs[path])
            case.path_parameters = {**(case.path_parameters or {}), "id": str(job)}
        if mode is GenerationMode.POSITIVE and isinstance(case.body, dict):
            case.body = {**case.body, **acceptable(path, case.body)}
        case.call_and_validate(base_url=module_daemon.base_url, checks=CHECKS, timeout=10)

    conforms()


# refusals: the same operations on a daemon with scoped tokens -----------------------------------
READER = "tok-schemathesis-reader-7d1e"
ENQUEUER = "tok-schemathesis-enqueuer-8c2f"
SECURED = [
    pytest.param(path, method, spec["security"][0]["bearer"][0], id=f"{method.upper()} {path}")
    for path, item in openapi_document()["paths"].items()
    for method, spec in item.items()
    if spec.get("security") != []
]


@pytest.fixture(scope="module")
async def token_daemon(module_db_url: str) -> AsyncIterator[DaemonProcess]:
    """A second daemon on the suite's database, with a read-only and an enqueue-only token."""
    tokens = f"{READER} read # reader;{ENQUEUER} enqueue # enqueuer"
    env = {
        **live_env(module_db_url),
        "DISPATCHER_API_TOKENS": tokens,
        # schemathesis sends its own bearer values, wrong ones, hundreds from one address: the
        # guessing limit (tests/e2e/test_guessing.py) would answer 429 where 401 is checked
        "DISPATCHER_AUTH_FAILURE_LIMIT": "100000",
    }
    daemon = DaemonProcess(env)
    try:
        yield await daemon.start()
    finally:
        await daemon.stop()


@pytest.mark.parametrize(("path", "method", "scope"), SECURED)
def test_refusals_conform_to_the_openapi_document(
    live_schema: schemathesis.BaseSchema,
    token_daemon: DaemonProcess,
    path: str,
    method: str,
    scope: str,
) -> None:
    """Valid requests without a token are 401, with a token lacking the documented scope 403:
    both as the document describes them."""
    operation = live_schema[path][method.upper()]
    lacking = ENQUEUER if scope == "read" else READER

    @settings(max_examples=5, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(case=operation.as_strategy(generation_mode=GenerationMode.POSITIVE))
    def refused(case: schemathesis.Case) -> None:
        for headers, status in (({}, 401), ({"Authorization": f"Bearer {lacking}"}, 403)):
            response = case.call(base_url=token_daemon.base_url, headers=headers, timeout=10)
            assert response.status_code == status, (status, response.text)
            case.validate_response(response, checks=CHECKS)

    refused()
