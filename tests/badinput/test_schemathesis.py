"""Schemathesis against a live daemon's own /openapi.json: for every operation, generated valid
(positive) and invalid (negative) requests get responses that conform to the schema (status
code, content type, body, headers) and are never a 5xx. Examples are bounded per operation and
mode to keep the run short.
"""

from __future__ import annotations

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
def live_schema(live_daemon: DaemonProcess) -> schemathesis.BaseSchema:
    return schemathesis.openapi.from_url(f"{live_daemon.base_url}/openapi.json")


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


@pytest.mark.parametrize(("path", "method", "mode"), CASES)
def test_every_response_conforms_to_the_openapi_document(
    live_schema: schemathesis.BaseSchema,
    live_daemon: DaemonProcess,
    history_job: int,
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
        if mode is GenerationMode.POSITIVE and path == "/v1/jobs/{id}/attempts":
            case.path_parameters = {**(case.path_parameters or {}), "id": str(history_job)}
        case.call_and_validate(base_url=live_daemon.base_url, checks=CHECKS, timeout=10)

    conforms()
